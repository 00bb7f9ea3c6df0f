//! # Serde values as Python objects: the snapshot dict from the pickle writer's schema
//!
//! PyTorch's snapshot schema is written once, as the serde `Serialize` impls of
//! `cudamem_trace::pickle` (`snapshot_schema`): serde_pickle turns them into the pickle bytes of
//! `_snapshot_pickle` and `cudamem dump`, and [`to_py`] here turns them into the Python objects
//! of `cudamem.snapshot()`. So the two cannot disagree on a key, an order or a type.
//!
//! What a pickle gets from Python's memo, the objects get from caches, as PyTorch's own snapshot
//! has them: one list per recorded stack (the schema tags each `frames` list with its stack's
//! id, `cudamem_trace::pickle::STACK_TAG`), one dict per distinct frame, and one string object
//! per distinct text, so that `pickle.dump` of the dict writes each frame once.
//!
//! Mapping: maps and structs are dicts, sequences lists, tuples tuples, integers ints, floats
//! floats, strings strs, `None` and unit `None`; a newtype is its value. Enum variants other
//! than the stack tag are `{variant: value}` (serde's external tagging); the schema has none.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};
use serde::ser::{self, Impossible, Serialize};

use cudamem_trace::pickle::STACK_TAG;

/// `value` as Python objects (see the module documentation).
pub fn to_py<'py, T: Serialize + ?Sized>(py: Python<'py>, value: &T) -> PyResult<Bound<'py, PyAny>> {
    let cache = Cache::default();
    let ser = PySer {
        py,
        cache: &cache,
        frame_list: false,
    };
    value.serialize(ser).map_err(|e| e.0)
}

/// The objects shared within one conversion.
#[derive(Default)]
struct Cache<'py> {
    /// Every text is looked up here (keys and values alike), so a quick hash matters.
    strings: RefCell<HashMap<Box<str>, Bound<'py, PyString>, BuildHasherDefault<QuickHash>>>,
    stacks: RefCell<HashMap<u32, Bound<'py, PyList>>>,
    /// Frames by their JSON text (only built when a stack is first seen).
    frames: RefCell<HashMap<String, Bound<'py, PyAny>>>,
}

/// FxHash's mixing (a multiply and a rotate per word): enough for short texts of one
/// conversion, several times quicker than the default SipHash.
#[derive(Default)]
struct QuickHash(u64);

impl Hasher for QuickHash {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            self.add(u64::from_le_bytes(c.try_into().unwrap_or_default()));
        }
        for &b in chunks.remainder() {
            self.add(u64::from(b));
        }
    }
    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl QuickHash {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// A Python exception carried through serde.
#[derive(Debug)]
pub struct Error(PyErr);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error(PyValueError::new_err(msg.to_string()))
    }
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Error(e)
    }
}

#[derive(Clone, Copy)]
struct PySer<'a, 'py> {
    py: Python<'py>,
    cache: &'a Cache<'py>,
    /// The value is a stack's frame list: its elements are shared by content.
    frame_list: bool,
}

impl<'py> PySer<'_, 'py> {
    fn int(self, v: i64) -> Result<Bound<'py, PyAny>, Error> {
        Ok(v.into_pyobject(self.py).unwrap_or_else(|e| match e {}).into_any())
    }

    fn uint(self, v: u64) -> Result<Bound<'py, PyAny>, Error> {
        Ok(v.into_pyobject(self.py).unwrap_or_else(|e| match e {}).into_any())
    }

    /// One stack's frames: the list shared by every entry of that stack.
    fn stack<T: Serialize + ?Sized>(self, id: u32, frames: &T) -> Result<Bound<'py, PyAny>, Error> {
        if let Some(l) = self.cache.stacks.borrow().get(&id) {
            return Ok(l.clone().into_any());
        }
        let list = frames
            .serialize(PySer {
                frame_list: true,
                ..self
            })?
            .downcast_into::<PyList>()
            .map_err(|_| <Error as ser::Error>::custom("a stack's frames must be a list"))?;
        self.cache.stacks.borrow_mut().insert(id, list.clone());
        Ok(list.into_any())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SeqKind {
    List,
    Tuple,
    /// A stack's frames: a list whose elements are shared by content.
    Frames,
}

struct Seq<'a, 'py> {
    ser: PySer<'a, 'py>,
    items: Vec<Bound<'py, PyAny>>,
    kind: SeqKind,
}

impl<'a, 'py> Seq<'a, 'py> {
    fn new(ser: PySer<'a, 'py>, len: Option<usize>, kind: SeqKind) -> Self {
        Seq {
            ser: PySer {
                frame_list: false,
                ..ser
            },
            items: Vec::with_capacity(len.unwrap_or(0).min(1 << 16)),
            kind,
        }
    }

    fn push<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        let item = if self.kind == SeqKind::Frames {
            let key = serde_json::to_string(v).map_err(<Error as ser::Error>::custom)?;
            let known = self.ser.cache.frames.borrow().get(&key).cloned();
            match known {
                Some(d) => d,
                None => {
                    let d = v.serialize(self.ser)?;
                    self.ser.cache.frames.borrow_mut().insert(key, d.clone());
                    d
                }
            }
        } else {
            v.serialize(self.ser)?
        };
        self.items.push(item);
        Ok(())
    }

    fn finish(self) -> Result<Bound<'py, PyAny>, Error> {
        let py = self.ser.py;
        Ok(match self.kind {
            SeqKind::Tuple => PyTuple::new(py, self.items)?.into_any(),
            SeqKind::List | SeqKind::Frames => PyList::new(py, self.items)?.into_any(),
        })
    }
}

/// The sequence traits serde asks of a serializer differ only in the name of their element
/// method: each pushes the element and ends with the sequence's Python object.
macro_rules! seq_trait {
    ($trait:ident, $element:ident) => {
        impl<'py> ser::$trait for Seq<'_, 'py> {
            type Ok = Bound<'py, PyAny>;
            type Error = Error;
            fn $element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
                self.push(v)
            }
            fn end(self) -> Result<Self::Ok, Error> {
                self.finish()
            }
        }
    };
}
seq_trait!(SerializeSeq, serialize_element);
seq_trait!(SerializeTuple, serialize_element);
seq_trait!(SerializeTupleStruct, serialize_field);

struct Map<'a, 'py> {
    ser: PySer<'a, 'py>,
    dict: Bound<'py, PyDict>,
    key: Option<Bound<'py, PyAny>>,
}

impl<'py> ser::SerializeMap for Map<'_, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Result<(), Error> {
        self.key = Some(k.serialize(self.ser)?);
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Error> {
        let k = self
            .key
            .take()
            .ok_or_else(|| <Error as ser::Error>::custom("a map value without its key"))?;
        self.dict.set_item(k, v.serialize(self.ser)?)?;
        Ok(())
    }
    fn end(self) -> Result<Self::Ok, Error> {
        Ok(self.dict.into_any())
    }
}

impl<'py> ser::SerializeStruct for Map<'_, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Error;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, k: &'static str, v: &T) -> Result<(), Error> {
        self.dict
            .set_item(PyString::intern(self.ser.py, k), v.serialize(self.ser)?)?;
        Ok(())
    }
    fn end(self) -> Result<Self::Ok, Error> {
        Ok(self.dict.into_any())
    }
}

impl<'a, 'py> ser::Serializer for PySer<'a, 'py> {
    type Ok = Bound<'py, PyAny>;
    type Error = Error;
    type SerializeSeq = Seq<'a, 'py>;
    type SerializeTuple = Seq<'a, 'py>;
    type SerializeTupleStruct = Seq<'a, 'py>;
    type SerializeTupleVariant = Impossible<Self::Ok, Error>;
    type SerializeMap = Map<'a, 'py>;
    type SerializeStruct = Map<'a, 'py>;
    type SerializeStructVariant = Impossible<Self::Ok, Error>;

    fn serialize_bool(self, v: bool) -> Result<Self::Ok, Error> {
        Ok(PyBool::new(self.py, v).to_owned().into_any())
    }
    fn serialize_i8(self, v: i8) -> Result<Self::Ok, Error> {
        self.int(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<Self::Ok, Error> {
        self.int(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<Self::Ok, Error> {
        self.int(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<Self::Ok, Error> {
        self.int(v)
    }
    fn serialize_u8(self, v: u8) -> Result<Self::Ok, Error> {
        self.uint(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<Self::Ok, Error> {
        self.uint(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<Self::Ok, Error> {
        self.uint(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<Self::Ok, Error> {
        self.uint(v)
    }
    fn serialize_f32(self, v: f32) -> Result<Self::Ok, Error> {
        Ok(PyFloat::new(self.py, f64::from(v)).into_any())
    }
    fn serialize_f64(self, v: f64) -> Result<Self::Ok, Error> {
        Ok(PyFloat::new(self.py, v).into_any())
    }
    fn serialize_char(self, v: char) -> Result<Self::Ok, Error> {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<Self::Ok, Error> {
        if let Some(s) = self.cache.strings.borrow().get(v) {
            return Ok(s.clone().into_any());
        }
        let s = PyString::new(self.py, v);
        self.cache.strings.borrow_mut().insert(v.into(), s.clone());
        Ok(s.into_any())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<Self::Ok, Error> {
        Ok(PyBytes::new(self.py, v).into_any())
    }
    fn serialize_none(self) -> Result<Self::Ok, Error> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Result<Self::Ok, Error> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<Self::Ok, Error> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<Self::Ok, Error> {
        self.serialize_none()
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<Self::Ok, Error> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> Result<Self::Ok, Error> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        v: &T,
    ) -> Result<Self::Ok, Error> {
        if name == STACK_TAG {
            return self.stack(index, v);
        }
        let d = PyDict::new(self.py);
        d.set_item(PyString::intern(self.py, variant), v.serialize(self)?)?;
        Ok(d.into_any())
    }
    fn serialize_seq(self, len: Option<usize>) -> Result<Self::SerializeSeq, Error> {
        let kind = if self.frame_list {
            SeqKind::Frames
        } else {
            SeqKind::List
        };
        Ok(Seq::new(self, len, kind))
    }
    fn serialize_tuple(self, len: usize) -> Result<Self::SerializeTuple, Error> {
        Ok(Seq::new(self, Some(len), SeqKind::Tuple))
    }
    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Self::SerializeTupleStruct, Error> {
        Ok(Seq::new(self, Some(len), SeqKind::Tuple))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, Error> {
        Err(ser::Error::custom("tuple variants have no Python form here"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, Error> {
        Ok(Map {
            ser: PySer {
                frame_list: false,
                ..self
            },
            dict: PyDict::new(self.py),
            key: None,
        })
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, Error> {
        self.serialize_map(None)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, Error> {
        Err(ser::Error::custom("struct variants have no Python form here"))
    }
}
