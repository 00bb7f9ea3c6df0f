//! A small, fast pickle decoder for plain data (dicts, lists, tuples, sets,
//! str, bytes, int, float, bool, None), used to read snapshot pickles.
//!
//! Why not `serde-pickle`'s decoder: it is slow on real snapshots, because it
//! builds a `BTreeMap` per dict and copies every memoized value at
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

mod scalars;
#[cfg(test)]
mod tests;
mod value;

use scalars::{int_from_le, int_from_text, unescape, Num};
use value::R;
pub(crate) use value::{Arena, DecodeError, Kind, Obj, Val};

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
