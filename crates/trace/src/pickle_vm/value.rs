//! What the pickle machine produces: values, the arena of containers they refer to, and the
//! decode error.

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

pub(crate) type R<T> = Result<T, DecodeError>;

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
