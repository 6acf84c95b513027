//! The Deserializer: one, generic over its input ([`Read`]): a slice
//! (strings and bin borrowed from it), or a [`Source`] (every read a copy;
//! strings through a scratch buffer).
//!
//! Bounded against a hostile peer: every length is checked against the bytes
//! left before anything is reserved or read, arrays and maps nest at most
//! [`MAX_DEPTH`] deep, and bytes left after the value are an error.

use super::bytes::BytesVisitor;
use super::{CodecError, Source, MAX_DEPTH};
use crate::error::{Error, Result};
use crate::sys::huge_pages;
use serde::de::{self, DeserializeOwned, DeserializeSeed, Visitor};
use std::any::TypeId;
use std::sync::OnceLock;

type Res<T> = std::result::Result<T, CodecError>;

/// Bytes a read hands out: borrowed from the input, or copied into scratch.
pub(super) enum Ref<'de, 's> {
    Borrowed(&'de [u8]),
    Copied(&'s [u8]),
}

/// Bytes for a visitor that wants a buffer of its own (`ByteBuf`,
/// `ferry::Bytes`, `String`): borrowed from the input if it lends them (the
/// visitor copies them, or makes a view), else read once into a new vector
/// the visitor takes as it is.
pub(super) enum Buf<'de> {
    Borrowed(&'de [u8]),
    Owned(Vec<u8>),
}

/// The decoder's input (as serde_json's `SliceRead`/`IoRead`). Callers check
/// `n <= remaining()` before every read.
pub(super) trait Read<'de> {
    fn buf(&mut self, n: usize) -> Buf<'de>;
    fn remaining(&self) -> usize;
    /// Bytes read so far (for errors).
    fn offset(&self) -> usize;
    /// The next `N` bytes (markers, lengths, numbers: the hot path of
    /// small values), `None` past the end.
    fn array<const N: usize>(&mut self) -> Option<[u8; N]>;
    fn append_to(&mut self, n: usize, out: &mut Vec<u8>);
    fn bytes<'s>(&'s mut self, n: usize, scratch: &'s mut Vec<u8>) -> Ref<'de, 's>;
}

/// A slice the decoder may borrow from.
pub(super) struct SliceRead<'de> {
    slice: &'de [u8],
    pos: usize,
}

impl<'de> SliceRead<'de> {
    pub(super) fn new(slice: &'de [u8]) -> Self {
        SliceRead { slice, pos: 0 }
    }

    fn take(&mut self, n: usize) -> &'de [u8] {
        let s = self.slice;
        let out = s.get(self.pos..self.pos + n).unwrap_or_default();
        self.pos += out.len();
        out
    }
}

impl<'de> Read<'de> for SliceRead<'de> {
    fn remaining(&self) -> usize {
        self.slice.len() - self.pos
    }
    fn offset(&self) -> usize {
        self.pos
    }
    #[inline]
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let a: [u8; N] = self.slice.get(self.pos..self.pos.checked_add(N)?)?.try_into().ok()?;
        self.pos += N;
        Some(a)
    }
    fn append_to(&mut self, n: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self.take(n));
    }
    fn bytes<'s>(&'s mut self, n: usize, _: &'s mut Vec<u8>) -> Ref<'de, 's> {
        Ref::Borrowed(self.take(n))
    }
    fn buf(&mut self, n: usize) -> Buf<'de> {
        Buf::Borrowed(self.take(n))
    }
}

/// A [`Source`]: bytes a peer may still write, only ever copied.
pub(super) struct SourceRead<'a, S: Source + ?Sized> {
    src: &'a mut S,
    pos: usize,
}

impl<'a, S: Source + ?Sized> SourceRead<'a, S> {
    pub(super) fn new(src: &'a mut S) -> Self {
        SourceRead { src, pos: 0 }
    }
}

impl<'de, S: Source + ?Sized> Read<'de> for SourceRead<'_, S> {
    fn remaining(&self) -> usize {
        self.src.remaining()
    }
    fn offset(&self) -> usize {
        self.pos
    }
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        if self.src.remaining() < N {
            return None;
        }
        let mut a = [0u8; N];
        self.src.read(&mut a);
        self.pos += N;
        Some(a)
    }
    fn append_to(&mut self, n: usize, out: &mut Vec<u8>) {
        self.src.append_to(n, out);
        self.pos += n;
    }
    fn bytes<'s>(&'s mut self, n: usize, scratch: &'s mut Vec<u8>) -> Ref<'de, 's> {
        scratch.clear();
        self.append_to(n, scratch);
        Ref::Copied(scratch)
    }
    fn buf(&mut self, n: usize) -> Buf<'de> {
        let mut v = huge_pages::vec_with_capacity(n);
        self.append_to(n, &mut v);
        Buf::Owned(v)
    }
}

pub(super) fn decode<'de, T: DeserializeOwned, R: Read<'de>>(read: R) -> Result<T> {
    let mut de = Deserializer::new(read);
    let value = T::deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    value.map_err(|e| de.error(e))
}

pub(super) fn decode_in_place<'de, T: DeserializeOwned, R: Read<'de>>(read: R, place: &mut T) -> Result<()> {
    let mut de = Deserializer::new(read);
    let value = T::deserialize_in_place(&mut de, place).and_then(|()| de.end());
    value.map_err(|e| de.error(e))
}

pub(super) struct Deserializer<R> {
    read: R,
    /// A marker read ahead (options, enums, the bin fast paths look before they read).
    peeked: Option<u8>,
    depth: usize,
    /// Strings from a `Source` are copied here before they are visited.
    scratch: Vec<u8>,
}

/// What a marker announces.
enum Head {
    Nil,
    Bool(bool),
    Uint(u64),
    Int(i64),
    F32(f32),
    F64(f64),
    Str(usize),
    Bin(usize),
    Array(usize),
    Map(usize),
}

const BIN8: u8 = 0xc4;
const BIN16: u8 = 0xc5;
const BIN32: u8 = 0xc6;

impl<'de, R: Read<'de>> Deserializer<R> {
    fn new(read: R) -> Self {
        Deserializer { read, peeked: None, depth: 0, scratch: Vec::new() }
    }

    fn offset(&self) -> usize {
        self.read.offset() - usize::from(self.peeked.is_some())
    }

    fn error(&self, e: CodecError) -> Error {
        Error::Codec(format!("{} (at byte {})", e.0, self.offset()))
    }

    fn end(&mut self) -> Res<()> {
        let left = self.read.remaining() + usize::from(self.peeked.is_some());
        if left > 0 {
            return Err(CodecError::new(format!("{left} bytes after the value")));
        }
        Ok(())
    }

    #[inline]
    fn need(&self, n: usize, what: &str) -> Res<()> {
        if n > self.read.remaining() {
            return Err(CodecError::new(format!("{what} of length {n} but only {} bytes left", self.read.remaining())));
        }
        Ok(())
    }

    #[inline]
    fn fixed<const N: usize>(&mut self) -> Res<[u8; N]> {
        match self.read.array() {
            Some(a) => Ok(a),
            None => Err(self.short(N)),
        }
    }

    #[cold]
    fn short(&self, n: usize) -> CodecError {
        CodecError::new(format!("a value of length {n} but only {} bytes left", self.read.remaining()))
    }

    #[inline]
    fn peek(&mut self) -> Res<u8> {
        if let Some(b) = self.peeked {
            return Ok(b);
        }
        let [b] = self.fixed::<1>().map_err(|_| CodecError::new("the input ended where a value was expected"))?;
        self.peeked = Some(b);
        Ok(b)
    }

    #[inline]
    fn head(&mut self) -> Res<Head> {
        let b = self.peek()?;
        self.peeked = None;
        // The one-byte forms of small values, without the general match.
        match b {
            0x00..=0x7f => Ok(Head::Uint(b.into())),
            0x80..=0x8f => Ok(Head::Map(usize::from(b & 0x0f))),
            0x90..=0x9f => Ok(Head::Array(usize::from(b & 0x0f))),
            0xa0..=0xbf => Ok(Head::Str(usize::from(b & 0x1f))),
            0xc0 => Ok(Head::Nil),
            _ => self.long_head(b),
        }
    }

    /// `head` for markers followed by a length or a value.
    #[inline(never)]
    fn long_head(&mut self, b: u8) -> Res<Head> {
        use rmp::Marker as M;
        Ok(match M::from_u8(b) {
            M::FixPos(v) => Head::Uint(v.into()),
            M::FixNeg(v) => Head::Int(v.into()),
            M::Null => Head::Nil,
            M::True => Head::Bool(true),
            M::False => Head::Bool(false),
            M::U8 => Head::Uint(u8::from_be_bytes(self.fixed()?).into()),
            M::U16 => Head::Uint(u16::from_be_bytes(self.fixed()?).into()),
            M::U32 => Head::Uint(u32::from_be_bytes(self.fixed()?).into()),
            M::U64 => Head::Uint(u64::from_be_bytes(self.fixed()?)),
            M::I8 => Head::Int(i8::from_be_bytes(self.fixed()?).into()),
            M::I16 => Head::Int(i16::from_be_bytes(self.fixed()?).into()),
            M::I32 => Head::Int(i32::from_be_bytes(self.fixed()?).into()),
            M::I64 => Head::Int(i64::from_be_bytes(self.fixed()?)),
            M::F32 => Head::F32(f32::from_be_bytes(self.fixed()?)),
            M::F64 => Head::F64(f64::from_be_bytes(self.fixed()?)),
            M::FixStr(n) => Head::Str(n.into()),
            M::Str8 => Head::Str(self.len8()?),
            M::Str16 => Head::Str(self.len16()?),
            M::Str32 => Head::Str(self.len32()?),
            M::Bin8 => Head::Bin(self.len8()?),
            M::Bin16 => Head::Bin(self.len16()?),
            M::Bin32 => Head::Bin(self.len32()?),
            M::FixArray(n) => Head::Array(n.into()),
            M::Array16 => Head::Array(self.len16()?),
            M::Array32 => Head::Array(self.len32()?),
            M::FixMap(n) => Head::Map(n.into()),
            M::Map16 => Head::Map(self.len16()?),
            M::Map32 => Head::Map(self.len32()?),
            M::Reserved => return Err(CodecError::new(format!("0x{b:02x} is not a MessagePack marker"))),
            _ => return Err(CodecError::new(format!("an ext value (marker 0x{b:02x}) is not supported"))),
        })
    }

    #[inline]
    fn len8(&mut self) -> Res<usize> {
        Ok(u8::from_be_bytes(self.fixed()?).into())
    }
    #[inline]
    fn len16(&mut self) -> Res<usize> {
        Ok(u16::from_be_bytes(self.fixed()?).into())
    }
    #[inline]
    fn len32(&mut self) -> Res<usize> {
        usize::try_from(u32::from_be_bytes(self.fixed()?)).map_err(|_| CodecError::new("a length over usize"))
    }

    /// If the next value is bin, reads its header and returns its length.
    fn bin_head(&mut self) -> Res<Option<usize>> {
        let n = match self.peek()? {
            BIN8 => {
                self.peeked = None;
                self.len8()?
            }
            BIN16 => {
                self.peeked = None;
                self.len16()?
            }
            BIN32 => {
                self.peeked = None;
                self.len32()?
            }
            _ => return Ok(None),
        };
        self.need(n, "bin").map(|()| Some(n))
    }

    /// Runs `f` one level deeper: an array, a map, an enum's map, a `Some`
    /// or a newtype of the receiving type (the last two read no marker, so
    /// without counting them `struct A(Option<Box<A>>)` recursed on one byte).
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Res<T>) -> Res<T> {
        if self.depth >= MAX_DEPTH {
            return Err(CodecError::new(format!("a value nested deeper than {MAX_DEPTH} levels")));
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }

    fn visit<V: Visitor<'de>>(&mut self, head: Head, visitor: V) -> Res<V::Value> {
        match head {
            Head::Nil => visitor.visit_unit(),
            Head::Bool(b) => visitor.visit_bool(b),
            Head::Uint(v) => visitor.visit_u64(v),
            Head::Int(v) => visitor.visit_i64(v),
            Head::F32(v) => visitor.visit_f32(v),
            Head::F64(v) => visitor.visit_f64(v),
            Head::Str(n) => {
                self.need(n, "a string")?;
                let not_utf8 = |_| CodecError::new("a string that is not UTF-8");
                match self.read.bytes(n, &mut self.scratch) {
                    Ref::Borrowed(b) => visitor.visit_borrowed_str(std::str::from_utf8(b).map_err(not_utf8)?),
                    Ref::Copied(b) => visitor.visit_str(std::str::from_utf8(b).map_err(not_utf8)?),
                }
            }
            Head::Bin(n) => {
                self.need(n, "bin")?;
                match self.read.bytes(n, &mut self.scratch) {
                    Ref::Borrowed(b) => visitor.visit_borrowed_bytes(b),
                    Ref::Copied(b) => visitor.visit_bytes(b),
                }
            }
            Head::Array(n) => {
                self.need(n, "an array")?;
                let (value, left) = self.nested(|de| {
                    let mut seq = Seq { de, left: n };
                    visitor.visit_seq(&mut seq).map(|v| (v, seq.left))
                })?;
                if left > 0 {
                    return Err(CodecError::new(format!("an array of {n} elements where {} were expected", n - left)));
                }
                Ok(value)
            }
            Head::Map(n) => {
                if n > self.read.remaining() / 2 {
                    return Err(CodecError::new(format!(
                        "a map of {n} entries but only {} bytes left",
                        self.read.remaining()
                    )));
                }
                let (value, left) = self.nested(|de| {
                    let mut map = Seq { de, left: n };
                    visitor.visit_map(&mut map).map(|v| (v, map.left))
                })?;
                if left > 0 {
                    return Err(CodecError::new(format!("a map of {n} entries where {} were expected", n - left)));
                }
                Ok(value)
            }
        }
    }

    /// The next `n` bytes (checked to be there) in a fresh buffer of their own.
    fn fresh(&mut self, n: usize) -> Vec<u8> {
        let mut v = huge_pages::vec_with_capacity(n);
        self.read.append_to(n, &mut v);
        v
    }

    /// Bin where a sequence is expected, for a visitor other than `Vec<u8>`'s:
    /// its bytes as a sequence of u8 (a `VecDeque<u8>`, a `[u8; N]`, a tuple).
    fn bin_as_seq<V: Visitor<'de>>(&mut self, n: usize, visitor: V) -> Res<V::Value> {
        let mut bytes = Vec::with_capacity(n);
        self.read.append_to(n, &mut bytes);
        let mut seq = de::value::SeqDeserializer::<_, CodecError>::new(bytes.into_iter());
        let value = visitor.visit_seq(&mut seq)?;
        seq.end()?;
        Ok(value)
    }
}

/// Elements of an array (or entries of a map) still to read.
struct Seq<'a, R> {
    de: &'a mut Deserializer<R>,
    left: usize,
}

impl<'de, R: Read<'de>> de::SeqAccess<'de> for Seq<'_, R> {
    type Error = CodecError;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Res<Option<T::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

impl<'de, R: Read<'de>> de::MapAccess<'de> for Seq<'_, R> {
    type Error = CodecError;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Res<Option<K::Value>> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Res<V::Value> {
        seed.deserialize(&mut *self.de)
    }
    fn size_hint(&self) -> Option<usize> {
        Some(self.left)
    }
}

/// An enum: a string (a unit variant) or a 1-entry map `{variant: value}`.
struct Enum<'a, R> {
    de: &'a mut Deserializer<R>,
    map: bool,
}

impl<'de, R: Read<'de>> de::EnumAccess<'de> for Enum<'_, R> {
    type Error = CodecError;
    type Variant = Self;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Res<(V::Value, Self)> {
        let v = seed.deserialize(&mut *self.de)?;
        Ok((v, self))
    }
}

impl<'de, R: Read<'de>> de::VariantAccess<'de> for Enum<'_, R> {
    type Error = CodecError;
    fn unit_variant(self) -> Res<()> {
        if self.map {
            de::Deserialize::deserialize(&mut *self.de)
        } else {
            Ok(())
        }
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Res<T::Value> {
        self.value()?;
        seed.deserialize(&mut *self.de)
    }
    fn tuple_variant<V: Visitor<'de>>(self, _: usize, visitor: V) -> Res<V::Value> {
        self.value()?;
        de::Deserializer::deserialize_any(&mut *self.de, visitor)
    }
    fn struct_variant<V: Visitor<'de>>(self, _: &'static [&'static str], visitor: V) -> Res<V::Value> {
        self.value()?;
        de::Deserializer::deserialize_any(&mut *self.de, visitor)
    }
}

impl<R> Enum<'_, R> {
    fn value(&self) -> Res<()> {
        if self.map {
            Ok(())
        } else {
            Err(CodecError::new("a variant with data sent as a plain string (expected {variant: value})"))
        }
    }
}

/// The TypeIds of serde's visitors for `Vec<u8>` (by value and in place),
/// found once by a probe Deserializer that records what `deserialize_seq` is
/// given. The in-place one counts only if it is, as the fast path assumes,
/// one pointer: the `&mut Vec<u8>` to fill (else that path stays off).
pub(super) fn vec_u8_visitors() -> (Option<TypeId>, Option<TypeId>) {
    static IDS: OnceLock<(Option<TypeId>, Option<TypeId>)> = OnceLock::new();
    *IDS.get_or_init(|| {
        let mut probe = Probe { seen: None, place: 0 };
        let _ = <Vec<u8> as de::Deserialize>::deserialize(&mut probe);
        let by_value = probe.seen.take();
        let mut place = Vec::new();
        probe.place = &place as *const Vec<u8> as usize;
        let _ = <Vec<u8> as de::Deserialize>::deserialize_in_place(&mut probe, &mut place);
        (by_value, probe.seen)
    })
}

struct Probe {
    seen: Option<TypeId>,
    /// The address of the Vec given to `deserialize_in_place` (0: by value).
    place: usize,
}

impl<'de> de::Deserializer<'de> for &mut Probe {
    type Error = CodecError;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Res<V::Value> {
        Err(CodecError::new("probe"))
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        let one_word = std::mem::size_of::<V>() == std::mem::size_of::<usize>()
            && std::mem::align_of::<V>() == std::mem::align_of::<usize>();
        // SAFETY: `V` is exactly one word (checked): its bits are read as an
        // integer, only to compare with the Vec's address.
        let holds_place = one_word && unsafe { std::mem::transmute_copy::<V, usize>(&visitor) } == self.place;
        if self.place == 0 || holds_place {
            self.seen = Some(typeid::of::<V>());
        }
        Err(CodecError::new("probe"))
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct tuple
        tuple_struct map struct enum identifier ignored_any
    }
}

impl<'de, R: Read<'de>> de::Deserializer<'de> for &mut Deserializer<R> {
    type Error = CodecError;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        let head = self.head()?;
        self.visit(head, visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        if self.peek()? == 0xc0 {
            self.peeked = None;
            visitor.visit_none()
        } else {
            self.nested(|de| visitor.visit_some(de))
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        // `()` (the arguments of a method that takes none, the result of
        // one that returns nothing): nil, read without the general head.
        if self.peek()? == 0xc0 {
            self.peeked = None;
            return visitor.visit_unit();
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Res<V::Value> {
        // Written as an empty array (as rmp-serde does); nil is accepted too.
        if self.peek()? == 0x90 {
            self.peeked = None;
            return visitor.visit_unit();
        }
        self.deserialize_any(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Res<V::Value> {
        self.nested(|de| visitor.visit_newtype_struct(de))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Res<V::Value> {
        match rmp::Marker::from_u8(self.peek()?) {
            rmp::Marker::FixStr(_) | rmp::Marker::Str8 | rmp::Marker::Str16 | rmp::Marker::Str32 => {
                visitor.visit_enum(Enum { de: self, map: false })
            }
            rmp::Marker::FixMap(_) | rmp::Marker::Map16 | rmp::Marker::Map32 => {
                let Head::Map(n) = self.head()? else {
                    return Err(CodecError::new("a map marker without a map"));
                };
                if n != 1 {
                    return Err(CodecError::new(format!("an enum as a map of {n} entries (expected 1)")));
                }
                self.nested(|de| visitor.visit_enum(Enum { de, map: true }))
            }
            _ => Err(CodecError::new("an enum that is neither a string nor a 1-entry map")),
        }
    }

    fn deserialize_i128<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        match self.bin_head()? {
            Some(16) => visitor.visit_i128(i128::from_be_bytes(self.fixed()?)),
            Some(n) => Err(CodecError::new(format!("an i128 as bin of {n} bytes (expected 16)"))),
            None => self.deserialize_any(visitor),
        }
    }

    fn deserialize_u128<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        match self.bin_head()? {
            Some(16) => visitor.visit_u128(u128::from_be_bytes(self.fixed()?)),
            Some(n) => Err(CodecError::new(format!("a u128 as bin of {n} bytes (expected 16)"))),
            None => self.deserialize_any(visitor),
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        let Some(n) = self.bin_head()? else {
            return self.deserialize_any(visitor);
        };
        let (by_value, in_place) = vec_u8_visitors();
        let id = Some(typeid::of::<V>());
        if id == by_value && typeid::of::<V::Value>() == typeid::of::<Vec<u8>>() {
            let bytes = std::mem::ManuallyDrop::new(self.fresh(n));
            // SAFETY: `V::Value` is `Vec<u8>` (checked just above by type
            // identity), so this moves `bytes` out unchanged; it is not dropped
            // here (ManuallyDrop).
            return Ok(unsafe { std::mem::transmute_copy::<Vec<u8>, V::Value>(&bytes) });
        }
        if id == in_place
            && typeid::of::<V::Value>() == typeid::of::<()>()
            && std::mem::size_of::<V>() == std::mem::size_of::<&mut Vec<u8>>()
        {
            let visitor = std::mem::ManuallyDrop::new(visitor);
            // SAFETY: `V` is serde's `VecInPlaceVisitor<'a, u8>` (the type the
            // probe recorded for `Vec<u8>::deserialize_in_place`), which the
            // probe saw to be one word holding the address of the Vec to fill:
            // its only field, the `&'a mut Vec<u8>`. The visitor is not used
            // again, so this is the only live use of that reference.
            let place: &mut Vec<u8> = unsafe { std::mem::transmute_copy::<V, &mut Vec<u8>>(&visitor) };
            place.clear();
            if place.capacity() < n {
                *place = huge_pages::vec_with_capacity(n);
            }
            self.read.append_to(n, place);
            // SAFETY: `V::Value` is `()` (checked above); a zero-sized copy.
            return Ok(unsafe { std::mem::transmute_copy::<(), V::Value>(&()) });
        }
        self.bin_as_seq(n, visitor)
    }

    /// Bin read once into the visitor's own buffer (out of a `Source`, not
    /// through scratch then a copy of it).
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        match self.bin_head()? {
            // A large bin for an owner (`ByteBuf`, `bytes::Bytes`) is copied
            // into a fresh buffer on huge pages and handed over, rather than
            // borrowed for the visitor to copy into one of its own; a
            // `ferry::Bytes` borrows it (a view where it can have one).
            Some(n) if n >= huge_pages::HUGE_FROM && typeid::of::<V>() != typeid::of::<BytesVisitor>() => {
                visitor.visit_byte_buf(self.fresh(n))
            }
            Some(n) => match self.read.buf(n) {
                Buf::Borrowed(b) => visitor.visit_borrowed_bytes(b),
                Buf::Owned(v) => visitor.visit_byte_buf(v),
            },
            None => self.deserialize_any(visitor),
        }
    }

    /// A string read once into the `String`'s own buffer, as bin above.
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Res<V::Value> {
        let n = match rmp::Marker::from_u8(self.peek()?) {
            rmp::Marker::FixStr(_) | rmp::Marker::Str8 | rmp::Marker::Str16 | rmp::Marker::Str32 => {
                match self.head()? {
                    Head::Str(n) => n,
                    _ => unreachable!("a str marker was peeked"),
                }
            }
            _ => return self.deserialize_any(visitor),
        };
        self.need(n, "a string")?;
        let not_utf8 = || CodecError::new("a string that is not UTF-8");
        if n >= huge_pages::HUGE_FROM {
            return visitor.visit_string(String::from_utf8(self.fresh(n)).map_err(|_| not_utf8())?);
        }
        match self.read.buf(n) {
            Buf::Borrowed(b) => visitor.visit_borrowed_str(std::str::from_utf8(b).map_err(|_| not_utf8())?),
            Buf::Owned(v) => visitor.visit_string(String::from_utf8(v).map_err(|_| not_utf8())?),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _: usize, visitor: V) -> Res<V::Value> {
        match self.bin_head()? {
            Some(n) => self.bin_as_seq(n, visitor),
            None => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 u8 u16 u32 u64 f32 f64 char str
        bytes tuple_struct map struct identifier ignored_any
    }
}
