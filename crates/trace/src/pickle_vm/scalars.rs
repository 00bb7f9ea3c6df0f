//! The scalar decoders of the pickle machine: little-endian and decimal integers (to i64,
//! i128 or "wider"), and the escapes of the text opcodes' strings.

/// A decoded integer, before it is placed in the arena.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Num {
    Small(i64),
    Wide(i128),
    Huge,
    Bool(bool),
}

pub(super) fn int_from_le(b: &[u8]) -> Num {
    if b.is_empty() {
        return Num::Small(0);
    }
    if b.len() > 16 {
        // Could still be small with redundant sign bytes; normalize.
        let neg = b[b.len() - 1] & 0x80 != 0;
        let fill = if neg { 0xff } else { 0 };
        let sig = b.iter().rposition(|&x| x != fill).map_or(0, |p| p + 1);
        // Keep one byte for the sign.
        if sig >= 16 {
            return Num::Huge;
        }
        return int_from_le(&b[..16]);
    }
    let neg = b[b.len() - 1] & 0x80 != 0;
    let mut buf = if neg { [0xffu8; 16] } else { [0u8; 16] };
    buf[..b.len()].copy_from_slice(b);
    let v = i128::from_le_bytes(buf);
    match i64::try_from(v) {
        Ok(i) => Num::Small(i),
        Err(_) => Num::Wide(v),
    }
}

pub(super) fn int_from_text(s: &str) -> Option<Num> {
    let s = s.trim().trim_end_matches('L');
    match s {
        "00" => return Some(Num::Bool(false)),
        "01" => return Some(Num::Bool(true)),
        _ => {}
    }
    match s.parse::<i128>() {
        Ok(v) => Some(match i64::try_from(v) {
            Ok(i) => Num::Small(i),
            Err(_) => Num::Wide(v),
        }),
        Err(_) if !s.is_empty() && s.trim_start_matches(['-', '+']).bytes().all(|c| c.is_ascii_digit()) => {
            Some(Num::Huge)
        }
        Err(_) => None,
    }
}

/// Decode Python's string-literal escapes (`STRING` opcode: a repr) or
/// raw-unicode-escape (`UNICODE` opcode).
pub(super) fn unescape(s: &[u8], raw_unicode: bool) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let text = std::str::from_utf8(s)
        .ok()
        .map(str::to_string)
        .unwrap_or_else(|| s.iter().map(|&b| b as char).collect());
    let mut it = text.chars().peekable();
    let hex = |it: &mut std::iter::Peekable<std::str::Chars<'_>>, n: usize| -> Option<u32> {
        let mut v = 0u32;
        for _ in 0..n {
            v = v.checked_mul(16)?.checked_add(it.next()?.to_digit(16)?)?;
        }
        Some(v)
    };
    while let Some(c) = it.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some('u') if raw_unicode => out.push(char::from_u32(hex(&mut it, 4)?)?),
            Some('U') if raw_unicode => out.push(char::from_u32(hex(&mut it, 8)?)?),
            Some(d) if raw_unicode => {
                out.push('\\');
                out.push(d);
            }
            None if raw_unicode => out.push('\\'),
            Some('\\') => out.push('\\'),
            Some('\'') => out.push('\''),
            Some('"') => out.push('"'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('t') => out.push('\t'),
            Some('x') => out.push(char::from_u32(hex(&mut it, 2)?)?),
            _ => return None,
        }
    }
    Some(out)
}
