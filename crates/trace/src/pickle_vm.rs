//! A small, fast pickle decoder for plain data (dicts, lists, tuples, sets,
//! str, bytes, int, float, bool, None), used to read snapshot pickles.
//!
//! Why not `serde-pickle`'s decoder: on the 21 MB `bert_varlen_infer`
//! snapshot it takes about 6 s in a release build (40 s in a debug build),
//! because it builds a `BTreeMap` per dict and copies every memoized value at
//! each reference; that copying also lets a few kilobytes of crafted pickle
//! expand exponentially, and its conversion to `Value` recurses once per
//! nesting level, so a deeply nested pickle overflows the stack. (This crate
//! still writes pickles with `serde-pickle`, and the tests check this decoder
//! against `serde-pickle`'s on real traces.)
//!
//! This decoder runs the pickle machine like Python's `Unpickler`: objects
//! live in an arena and the stack and memo hold *references* to them
//! ([`Val::Obj`]), so memo references and `DUP` share instead of copying,
//! exactly as in Python. Strings borrow from the input. Nothing recurses:
//! decoding is a loop over opcodes, and readers walk the result along a fixed
//! schema. Memory is linear in the input size; every length field is checked
//! against the bytes that are really there before anything is allocated.
//! Classes and globals (`GLOBAL`, `REDUCE`, `BUILD`, …) are rejected: snapshot
//! pickles never contain them.

use std::collections::HashMap;

/// A decoded value. Containers are arena references.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Val<'a> {
    None,
    Bool(bool),
    Int(i64),
    /// An int that does not fit in i64 but fits in i128 (e.g. u64 values ≥
    /// 2^63): index into `Arena::wides` (keeps `Val` at 24 bytes).
    Wide(u32),
    /// An int wider than 128 bits.
    Huge,
    Float(f64),
    Str(&'a str),
    /// A string that had to be decoded (text opcodes): index into `Arena::texts`.
    Text(u32),
    Bytes(&'a [u8]),
    Obj(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    List,
    Tuple,
    Dict,
    Set,
    FrozenSet,
}

#[derive(Debug)]
pub(crate) struct Obj<'a> {
    pub kind: Kind,
    /// Items; for a dict, keys and values alternate.
    pub items: Vec<Val<'a>>,
}

#[derive(Debug, Default)]
pub(crate) struct Arena<'a> {
    pub objs: Vec<Obj<'a>>,
    pub texts: Vec<String>,
    pub wides: Vec<i128>,
}

#[derive(Debug)]
pub(crate) struct DecodeError {
    pub offset: u64,
    pub message: String,
}

type R<T> = Result<T, DecodeError>;

impl<'a> Arena<'a> {
    /// The string a value holds, if it is a str.
    pub fn str<'s>(&'s self, v: &Val<'a>) -> Option<&'s str> {
        match *v {
            Val::Str(s) => Some(s),
            Val::Text(i) => self.texts.get(i as usize).map(String::as_str),
            _ => None,
        }
    }

    /// The value of an int that fits in i128.
    pub fn int(&self, v: &Val<'a>) -> Option<i128> {
        match *v {
            Val::Int(n) => Some(n as i128),
            Val::Wide(i) => self.wides.get(i as usize).copied(),
            _ => None,
        }
    }

    /// The container a value refers to.
    pub fn obj(&self, v: &Val<'a>) -> Option<&Obj<'a>> {
        match *v {
            Val::Obj(i) => self.objs.get(i as usize),
            _ => None,
        }
    }

    /// Python's name of a value's type.
    pub fn type_name(&self, v: &Val<'a>) -> &'static str {
        match v {
            Val::None => "None",
            Val::Bool(_) => "bool",
            Val::Int(_) | Val::Wide(_) | Val::Huge => "int",
            Val::Float(_) => "float",
            Val::Str(_) | Val::Text(_) => "str",
            Val::Bytes(_) => "bytes",
            Val::Obj(_) => match self.obj(v).map(|o| o.kind) {
                Some(Kind::List) => "list",
                Some(Kind::Tuple) => "tuple",
                Some(Kind::Dict) => "dict",
                Some(Kind::Set) => "set",
                Some(Kind::FrozenSet) => "frozenset",
                None => "object",
            },
        }
    }
}

struct Vm<'a> {
    data: &'a [u8],
    pos: usize,
    stack: Vec<Val<'a>>,
    marks: Vec<usize>,
    /// The memo. Python numbers memo slots 0, 1, 2, …, so slots below the
    /// input length live in a vector; any others in a map.
    memo: Vec<Option<Val<'a>>>,
    memo_sparse: HashMap<u32, Val<'a>, crate::FastHash>,
    memo_len: usize,
    arena: Arena<'a>,
}

/// Decode one pickle occupying all of `data`.
pub(crate) fn decode(data: &[u8]) -> R<(Arena<'_>, Val<'_>)> {
    let mut vm = Vm {
        data,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: Vec::new(),
        memo_sparse: HashMap::default(),
        memo_len: 0,
        arena: Arena::default(),
    };
    let root = vm.run()?;
    if vm.pos != data.len() {
        return Err(DecodeError {
            offset: vm.pos as u64,
            message: format!("{} bytes after the pickle's STOP opcode", data.len() - vm.pos),
        });
    }
    Ok((vm.arena, root))
}

/// A decoded integer, before it is placed in the arena.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Small(i64),
    Wide(i128),
    Huge,
    Bool(bool),
}

fn int_from_le(b: &[u8]) -> Num {
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

fn int_from_text(s: &str) -> Option<Num> {
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
fn unescape(s: &[u8], raw_unicode: bool) -> Option<String> {
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

impl<'a> Vm<'a> {
    fn err<T>(&self, at: usize, msg: impl Into<String>) -> R<T> {
        Err(DecodeError {
            offset: at as u64,
            message: msg.into(),
        })
    }

    fn take(&mut self, n: u64, at: usize) -> R<&'a [u8]> {
        let left = (self.data.len() - self.pos) as u64;
        if n > left {
            return self.err(
                at,
                format!(
                    "pickle truncated: opcode needs {n} bytes, {left} left of {} total",
                    self.data.len()
                ),
            );
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn fixed<const N: usize>(&mut self, at: usize) -> R<[u8; N]> {
        let s = self.take(N as u64, at)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn line(&mut self, at: usize) -> R<&'a [u8]> {
        let rest = &self.data[self.pos..];
        match rest.iter().position(|&c| c == b'\n') {
            Some(p) => {
                self.pos += p + 1;
                let l = &rest[..p];
                Ok(l.strip_suffix(b"\r").unwrap_or(l))
            }
            None => self.err(at, "pickle truncated: text argument without newline"),
        }
    }

    fn ascii_line(&mut self, at: usize) -> R<&'a str> {
        let l = self.line(at)?;
        match std::str::from_utf8(l) {
            Ok(s) => Ok(s),
            Err(_) => self.err(at, "non-ASCII text argument"),
        }
    }

    fn utf8(&mut self, b: &'a [u8], at: usize) -> R<Val<'a>> {
        match std::str::from_utf8(b) {
            Ok(s) => Ok(Val::Str(s)),
            Err(_) => self.err(at, "string is not valid UTF-8"),
        }
    }

    fn text(&mut self, s: String) -> Val<'a> {
        self.arena.texts.push(s);
        Val::Text((self.arena.texts.len() - 1) as u32)
    }

    fn push_num(&mut self, n: Num) {
        let v = match n {
            Num::Small(i) => Val::Int(i),
            Num::Bool(b) => Val::Bool(b),
            Num::Huge => Val::Huge,
            Num::Wide(w) => {
                self.arena.wides.push(w);
                Val::Wide((self.arena.wides.len() - 1) as u32)
            }
        };
        self.stack.push(v);
    }

    fn new_obj(&mut self, kind: Kind, items: Vec<Val<'a>>) -> Val<'a> {
        self.arena.objs.push(Obj { kind, items });
        Val::Obj((self.arena.objs.len() - 1) as u32)
    }

    /// Append `items` to container `i` (moving the vector when it is empty,
    /// the common case: Python builds containers with one APPENDS/SETITEMS).
    fn extend(&mut self, i: usize, items: Vec<Val<'a>>) {
        let dst = &mut self.arena.objs[i].items;
        if dst.is_empty() {
            *dst = items;
        } else {
            dst.extend(items);
        }
    }

    fn frame_start(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self, at: usize) -> R<Val<'a>> {
        if self.stack.len() <= self.frame_start() {
            return self.err(at, "pickle stack underflow");
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn pop_mark(&mut self, at: usize) -> R<Vec<Val<'a>>> {
        match self.marks.pop() {
            Some(m) => Ok(self.stack.split_off(m)),
            None => self.err(at, "pickle stack underflow (no MARK)"),
        }
    }

    /// The container on top of the stack, which must be of one of `kinds`.
    fn top_obj(&mut self, at: usize, kinds: &[Kind], op: &str) -> R<usize> {
        if self.stack.len() <= self.frame_start() {
            return self.err(at, "pickle stack underflow");
        }
        let top = self.stack[self.stack.len() - 1];
        match top {
            Val::Obj(i) if kinds.contains(&self.arena.objs[i as usize].kind) => Ok(i as usize),
            other => {
                let t = self.arena.type_name(&other);
                self.err(at, format!("{op} applied to a {t}"))
            }
        }
    }

    fn memo_put(&mut self, id: u32, at: usize) -> R<()> {
        if self.stack.len() <= self.frame_start() {
            return self.err(at, "pickle stack underflow (memoize)");
        }
        let top = self.stack[self.stack.len() - 1];
        let i = id as usize;
        let old = if i < self.memo.len() {
            self.memo[i].replace(top)
        } else if i <= self.data.len() {
            // Bounded by the input size: memory stays linear in the input.
            self.memo.resize(i + 1, None);
            self.memo[i].replace(top)
        } else {
            self.memo_sparse.insert(id, top)
        };
        if old.is_none() {
            self.memo_len += 1;
        }
        Ok(())
    }

    fn memo_get(&mut self, id: u32, at: usize) -> R<()> {
        let v = match self.memo.get(id as usize) {
            Some(v) => *v,
            None => self.memo_sparse.get(&id).copied(),
        };
        match v {
            Some(v) => {
                self.stack.push(v);
                Ok(())
            }
            None => self.err(at, format!("memo id {id} used before it was stored")),
        }
    }

    fn memo_id_line(&mut self, at: usize) -> R<u32> {
        let l = self.ascii_line(at)?;
        match l.trim().parse::<u32>() {
            Ok(v) => Ok(v),
            Err(_) => self.err(at, format!("bad memo id '{l}'")),
        }
    }

    fn run(&mut self) -> R<Val<'a>> {
        loop {
            let at = self.pos;
            let Some(&op) = self.data.get(self.pos) else {
                return self.err(
                    at,
                    format!("pickle truncated: no STOP opcode in its {} bytes", self.data.len()),
                );
            };
            self.pos += 1;
            match op {
                0x80 => {
                    let [p] = self.fixed::<1>(at)?;
                    if p > 5 {
                        return self.err(at, format!("unsupported pickle protocol {p}"));
                    }
                }
                0x95 => {
                    self.fixed::<8>(at)?; // FRAME: framing is only a read-ahead hint
                }
                b'.' => {
                    let v = self.pop(at)?;
                    return Ok(v);
                }
                b'(' => self.marks.push(self.stack.len()),
                b'0' => {
                    if self.stack.len() > self.frame_start() {
                        self.stack.pop();
                    } else {
                        self.pop_mark(at)?;
                    }
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let v = self.pop(at)?;
                    self.stack.push(v);
                    self.stack.push(v);
                }
                // memo
                b'p' => {
                    let id = self.memo_id_line(at)?;
                    self.memo_put(id, at)?;
                }
                b'q' => {
                    let [id] = self.fixed::<1>(at)?;
                    self.memo_put(id as u32, at)?;
                }
                b'r' => {
                    let id = u32::from_le_bytes(self.fixed(at)?);
                    self.memo_put(id, at)?;
                }
                0x94 => {
                    let id = self.memo_len as u32;
                    self.memo_put(id, at)?;
                }
                b'g' => {
                    let id = self.memo_id_line(at)?;
                    self.memo_get(id, at)?;
                }
                b'h' => {
                    let [id] = self.fixed::<1>(at)?;
                    self.memo_get(id as u32, at)?;
                }
                b'j' => {
                    let id = u32::from_le_bytes(self.fixed(at)?);
                    self.memo_get(id, at)?;
                }
                // constants and numbers
                b'N' => self.stack.push(Val::None),
                0x88 => self.stack.push(Val::Bool(true)),
                0x89 => self.stack.push(Val::Bool(false)),
                b'I' | b'L' => {
                    let l = self.ascii_line(at)?;
                    match int_from_text(l) {
                        Some(n) => self.push_num(n),
                        None => return self.err(at, format!("bad integer '{l}'")),
                    }
                }
                b'F' => {
                    let l = self.ascii_line(at)?;
                    match l.trim().parse::<f64>() {
                        Ok(x) => self.stack.push(Val::Float(x)),
                        Err(_) => return self.err(at, format!("bad float '{l}'")),
                    }
                }
                b'G' => {
                    let x = f64::from_be_bytes(self.fixed(at)?);
                    self.stack.push(Val::Float(x));
                }
                b'J' => {
                    let x = i32::from_le_bytes(self.fixed(at)?);
                    self.stack.push(Val::Int(x as i64));
                }
                b'K' => {
                    let [x] = self.fixed::<1>(at)?;
                    self.stack.push(Val::Int(x as i64));
                }
                b'M' => {
                    let x = u16::from_le_bytes(self.fixed(at)?);
                    self.stack.push(Val::Int(x as i64));
                }
                0x8a => {
                    let [n] = self.fixed::<1>(at)?;
                    let b = self.take(n as u64, at)?;
                    self.push_num(int_from_le(b));
                }
                0x8b => {
                    let n = i32::from_le_bytes(self.fixed(at)?);
                    if n < 0 {
                        return self.err(at, "negative length in LONG4");
                    }
                    let b = self.take(n as u64, at)?;
                    self.push_num(int_from_le(b));
                }
                // strings and bytes
                b'S' => {
                    let l = self.line(at)?;
                    let inner = match l {
                        [q @ (b'\'' | b'"'), body @ .., e] if e == q => body,
                        _ => return self.err(at, "STRING argument is not quoted"),
                    };
                    match unescape(inner, false) {
                        Some(s) => {
                            let v = self.text(s);
                            self.stack.push(v);
                        }
                        None => return self.err(at, "bad escape in STRING argument"),
                    }
                }
                b'V' => {
                    let l = self.line(at)?;
                    match unescape(l, true) {
                        Some(s) => {
                            let v = self.text(s);
                            self.stack.push(v);
                        }
                        None => return self.err(at, "bad escape in UNICODE argument"),
                    }
                }
                0x8c => {
                    let [n] = self.fixed::<1>(at)?;
                    let b = self.take(n as u64, at)?;
                    let v = self.utf8(b, at)?;
                    self.stack.push(v);
                }
                b'X' => {
                    let n = u32::from_le_bytes(self.fixed(at)?);
                    let b = self.take(n as u64, at)?;
                    let v = self.utf8(b, at)?;
                    self.stack.push(v);
                }
                0x8d => {
                    let n = u64::from_le_bytes(self.fixed(at)?);
                    let b = self.take(n, at)?;
                    let v = self.utf8(b, at)?;
                    self.stack.push(v);
                }
                // Python 2 str (protocols 0-2): text if it is UTF-8.
                b'U' | b'T' => {
                    let n = if op == b'U' {
                        self.fixed::<1>(at)?[0] as u64
                    } else {
                        let n = i32::from_le_bytes(self.fixed(at)?);
                        if n < 0 {
                            return self.err(at, "negative length in BINSTRING");
                        }
                        n as u64
                    };
                    let b = self.take(n, at)?;
                    self.stack.push(std::str::from_utf8(b).map_or(Val::Bytes(b), Val::Str));
                }
                b'C' => {
                    let [n] = self.fixed::<1>(at)?;
                    let b = self.take(n as u64, at)?;
                    self.stack.push(Val::Bytes(b));
                }
                b'B' => {
                    let n = u32::from_le_bytes(self.fixed(at)?);
                    let b = self.take(n as u64, at)?;
                    self.stack.push(Val::Bytes(b));
                }
                0x8e | 0x96 => {
                    let n = u64::from_le_bytes(self.fixed(at)?);
                    let b = self.take(n, at)?;
                    self.stack.push(Val::Bytes(b));
                }
                // containers
                b')' => {
                    let v = self.new_obj(Kind::Tuple, Vec::new());
                    self.stack.push(v);
                }
                b']' => {
                    let v = self.new_obj(Kind::List, Vec::new());
                    self.stack.push(v);
                }
                b'}' => {
                    let v = self.new_obj(Kind::Dict, Vec::new());
                    self.stack.push(v);
                }
                0x8f => {
                    let v = self.new_obj(Kind::Set, Vec::new());
                    self.stack.push(v);
                }
                0x85..=0x87 => {
                    let n = (op - 0x84) as usize;
                    if self.stack.len() < self.frame_start() + n {
                        return self.err(at, "pickle stack underflow");
                    }
                    let items = self.stack.split_off(self.stack.len() - n);
                    let v = self.new_obj(Kind::Tuple, items);
                    self.stack.push(v);
                }
                b't' | b'l' | 0x91 => {
                    let items = self.pop_mark(at)?;
                    let kind = match op {
                        b't' => Kind::Tuple,
                        b'l' => Kind::List,
                        _ => Kind::FrozenSet,
                    };
                    let v = self.new_obj(kind, items);
                    self.stack.push(v);
                }
                b'd' => {
                    let items = self.pop_mark(at)?;
                    if items.len() % 2 != 0 {
                        return self.err(at, "DICT with an odd number of items");
                    }
                    let v = self.new_obj(Kind::Dict, items);
                    self.stack.push(v);
                }
                b'a' => {
                    let v = self.pop(at)?;
                    let i = self.top_obj(at, &[Kind::List], "APPEND")?;
                    self.arena.objs[i].items.push(v);
                }
                b'e' => {
                    let items = self.pop_mark(at)?;
                    let i = self.top_obj(at, &[Kind::List], "APPENDS")?;
                    self.extend(i, items);
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    let i = self.top_obj(at, &[Kind::Dict], "SETITEM")?;
                    self.arena.objs[i].items.extend([k, v]);
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    if items.len() % 2 != 0 {
                        return self.err(at, "SETITEMS with an odd number of items");
                    }
                    let i = self.top_obj(at, &[Kind::Dict], "SETITEMS")?;
                    self.extend(i, items);
                }
                0x90 => {
                    let items = self.pop_mark(at)?;
                    let i = self.top_obj(at, &[Kind::Set], "ADDITEMS")?;
                    self.extend(i, items);
                }
                b'c' | 0x93 | b'R' | b'i' | b'o' | 0x81 | 0x92 | b'b' | b'P' | b'Q' | 0x82..=0x84 | 0x97 | 0x98 => {
                    return self.err(
                        at,
                        format!(
                            "pickle uses classes, globals or buffers (opcode 0x{op:02x}); snapshot pickles hold \
                             only dicts, lists, tuples, str, int, float, bool and None"
                        ),
                    );
                }
                _ => return self.err(at, format!("unknown pickle opcode 0x{op:02x}")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_small_protocol_4_pickle() {
        // pickle.dumps({'a': [1, 2], 'b': (None, True)}, protocol=4)
        let p = b"\x80\x04\x95\x17\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01K\x02e\x8c\x01b\x94N\x88\x86\x94u.";
        let (a, root) = decode(p).unwrap();
        let d = a.obj(&root).unwrap();
        assert_eq!(d.kind, Kind::Dict);
        assert_eq!(d.items.len(), 4);
        assert_eq!(a.str(&d.items[0]), Some("a"));
        assert_eq!(a.obj(&d.items[1]).unwrap().items, vec![Val::Int(1), Val::Int(2)]);
        assert_eq!(a.obj(&d.items[3]).unwrap().items, vec![Val::None, Val::Bool(true)]);
    }

    #[test]
    fn ints() {
        assert_eq!(int_from_le(&[]), Num::Small(0));
        assert_eq!(int_from_le(&[0xff]), Num::Small(-1));
        assert_eq!(int_from_le(&[0, 0, 0, 0, 0, 0, 0, 0x80, 0]), Num::Wide(1i128 << 63));
        assert_eq!(int_from_le(&[0x01; 17]), Num::Huge);
        let mut redundant = vec![5u8];
        redundant.extend([0u8; 30]);
        assert_eq!(int_from_le(&redundant), Num::Small(5));
        assert_eq!(int_from_text("01"), Some(Num::Bool(true)));
        assert_eq!(int_from_text("123L"), Some(Num::Small(123)));
        assert_eq!(
            int_from_text("99999999999999999999999999999999999999999"),
            Some(Num::Huge)
        );
        assert_eq!(int_from_text("x"), None);
        assert_eq!(std::mem::size_of::<Val<'static>>(), 24);
    }

    #[test]
    fn sharing_not_copying() {
        // x = [1]; l0 = [x, x]; l1 = [l0, l0]; … 200 levels: linear work.
        let mut p = vec![0x80, 4, b']', 0x94, b'K', 1, b'a'];
        for i in 0..200u32 {
            p.push(b'(');
            p.push(b'j');
            p.extend_from_slice(&i.to_le_bytes());
            p.push(b'j');
            p.extend_from_slice(&i.to_le_bytes());
            p.push(b'l');
            p.push(0x94);
        }
        p.push(b'.');
        let (a, _) = decode(&p).unwrap();
        assert_eq!(a.objs.len(), 201);
    }

    #[test]
    fn recursive_and_deep_structures_are_fine() {
        // l = []; l.append(l)
        let (a, root) = decode(b"\x80\x04]\x94h\x00a.").unwrap();
        assert_eq!(a.obj(&root).unwrap().items[0], root);
        let mut p = vec![0x80, 4];
        p.resize(p.len() + 1_000_000, b']');
        p.resize(p.len() + 999_999, b'a');
        p.push(b'.');
        assert!(decode(&p).is_ok());
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            &b""[..],
            b"\x80\x04",
            b"\x80\x04X\xff\xff\xff\xff",
            b"\x80\x04\x8c\x08builtins\x8c\x03set\x93.",
            b"\x80\x04a.",
            b"\x80\x04K\x01a.",
            b"\x80\x04h\x05.",
            b"\x80\x04N.extra",
            b"\x80\x04(K\x01d.",
            b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffab.",
            b"\x80\x04\x8c\x02\xff\xfe.",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn text_opcodes() {
        // Protocol 0: pickle.dumps({'k': 'v\u20ac', 'n': 5, 'f': 1.5}, protocol=0)
        let p = b"(dp0\nVk\np1\nVv\\u20ac\np2\nsVn\np3\nI5\nsVf\np4\nF1.5\ns.";
        let (a, root) = decode(p).unwrap();
        let d = a.obj(&root).unwrap();
        assert_eq!(a.str(&d.items[1]), Some("v\u{20ac}"));
        assert_eq!(d.items[3], Val::Int(5));
        assert_eq!(d.items[5], Val::Float(1.5));
        let (a, root) = decode(b"S'it\\'s'\np0\n.").unwrap();
        assert_eq!(a.str(&root), Some("it's"));
    }

    /// Structural equality of our decoding and serde-pickle's.
    fn same(a: &Arena<'_>, v: &Val<'_>, s: &serde_pickle::Value, depth: u32) -> bool {
        use serde_pickle::{HashableValue as H, Value as S};
        assert!(depth < 32, "unexpectedly deep");
        let key = |k: &Val<'_>| -> Option<H> {
            Some(match *k {
                Val::None => H::None,
                Val::Bool(b) => H::Bool(b),
                Val::Int(n) => H::I64(n),
                Val::Float(x) => H::F64(x),
                _ => H::String(a.str(k)?.to_string()),
            })
        };
        match (v, s) {
            (Val::None, S::None) => true,
            (Val::Bool(x), S::Bool(y)) => x == y,
            (Val::Int(x), S::I64(y)) => x == y,
            (Val::Wide(_), S::Int(b)) => a.int(v).map(|i| i.to_string()) == Some(b.to_string()),
            (Val::Float(x), S::F64(y)) => x.to_bits() == y.to_bits(),
            (Val::Str(_) | Val::Text(_), S::String(y)) => a.str(v) == Some(y.as_str()),
            (Val::Bytes(x), S::Bytes(y)) => x == y,
            (Val::Obj(_), S::List(ys)) | (Val::Obj(_), S::Tuple(ys)) => {
                let o = a.obj(v).unwrap();
                let kind_ok = matches!((o.kind, s), (Kind::List, S::List(_)) | (Kind::Tuple, S::Tuple(_)));
                kind_ok && o.items.len() == ys.len() && o.items.iter().zip(ys).all(|(x, y)| same(a, x, y, depth + 1))
            }
            (Val::Obj(_), S::Dict(m)) => {
                let o = a.obj(v).unwrap();
                o.kind == Kind::Dict
                    && o.items.len() == 2 * m.len()
                    && o.items.chunks_exact(2).all(|kv| {
                        key(&kv[0])
                            .and_then(|k| m.get(&k))
                            .is_some_and(|y| same(a, &kv[1], y, depth + 1))
                    })
            }
            _ => false,
        }
    }

    #[test]
    fn agrees_with_serde_pickle_on_shared_traces() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data");
        for name in ["seed_example", "resnet50_train", "gpt2_train"] {
            let gz = std::fs::read(dir.join(format!("{name}.pickle.gz"))).unwrap();
            let raw = crate::gunzip(&gz, name).unwrap();
            let (a, root) = decode(&raw).unwrap();
            let reference = serde_pickle::value_from_slice(&raw, serde_pickle::DeOptions::new()).unwrap();
            assert!(same(&a, &root, &reference, 0), "{name}");
            // And on what our writer produces.
            let t = crate::read_pickle(&raw, name).unwrap();
            let mut out = Vec::new();
            crate::write_snapshot_pickle(&t, &mut out).unwrap();
            let (a, root) = decode(&out).unwrap();
            let reference = serde_pickle::value_from_slice(&out, serde_pickle::DeOptions::new()).unwrap();
            assert!(same(&a, &root, &reference, 0), "{name} rewritten");
        }
    }
}
