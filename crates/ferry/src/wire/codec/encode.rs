//! The Serializer: rmp-serde 1.3's default encoding, byte sequences as bin.
//!
//! Every marker and head is written here, in the shortest form (the one
//! `rmp::encode` picks: the codec's tests compare the bytes with
//! rmp-serde's), as a few bytes put into the sink; the bytes of a str or
//! bin go to the sink as one `put` (a memcpy).

use super::{CodecError, Sink};
use crate::error::{Error, Result};
use serde::ser::{self, Serialize};

type Res = std::result::Result<(), CodecError>;

/// Markers (the MessagePack specification's names).
const FIXARRAY: u8 = 0x90;
const FIXMAP: u8 = 0x80;
const FIXSTR: u8 = 0xa0;
const BIN8: u8 = 0xc4;
const BIN16: u8 = 0xc5;
const BIN32: u8 = 0xc6;
const UINT8: u8 = 0xcc;
const UINT16: u8 = 0xcd;
const UINT32: u8 = 0xce;
const UINT64: u8 = 0xcf;
const INT8: u8 = 0xd0;
const INT16: u8 = 0xd1;
const INT32: u8 = 0xd2;
const INT64: u8 = 0xd3;
const FLOAT32: u8 = 0xca;
const FLOAT64: u8 = 0xcb;
const STR8: u8 = 0xd9;
const STR16: u8 = 0xda;
const STR32: u8 = 0xdb;
const ARRAY16: u8 = 0xdc;
const ARRAY32: u8 = 0xdd;
const MAP16: u8 = 0xde;
const MAP32: u8 = 0xdf;

/// A sink that only counts (`encoded_len`).
pub(super) struct Counter(pub(super) usize);

impl Sink for Counter {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.0 += bytes.len();
        Ok(())
    }
}

pub(super) fn encode<T: Serialize + ?Sized, S: Sink + ?Sized>(value: &T, sink: &mut S) -> Result<()> {
    value.serialize(&mut Serializer { sink }).map_err(Error::from)
}

pub(super) struct Serializer<'a, S: Sink + ?Sized> {
    sink: &'a mut S,
}

fn sink_error(e: Error) -> CodecError {
    match e {
        Error::Codec(s) => CodecError::new(s),
        other => CodecError::new(other.to_string()),
    }
}

fn len32(len: usize) -> std::result::Result<u32, CodecError> {
    u32::try_from(len).map_err(|_| CodecError::new(format!("a length of {len} is over MessagePack's 2^32 - 1")))
}

impl<'a, S: Sink + ?Sized> Serializer<'a, S> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) -> Res {
        self.sink.put(bytes).map_err(sink_error)
    }

    /// The head of a str, bin, array or map of `len` elements or bytes in
    /// its shortest form: one byte `fix | len` below `fix_below` (0: no
    /// such form), else `m8` and one byte of length (`None`: no such
    /// form), else `m16` and two, else `m32` and four (big-endian), as
    /// `rmp::encode`'s `write_*_len` pick them. Written here, not through
    /// `rmp`'s writers: a 256-byte argument's head cost ~60 instructions there.
    #[inline]
    fn len_head(&mut self, len: usize, fix: u8, fix_below: usize, m8: Option<u8>, m16: u8, m32: u8) -> Res {
        if len < fix_below {
            return self.put(&[fix | len as u8]);
        }
        match m8 {
            Some(m) if len <= 0xff => self.put(&[m, len as u8]),
            _ if len <= 0xffff => self.marked(m16, (len as u16).to_be_bytes()),
            _ => self.marked(m32, len32(len)?.to_be_bytes()),
        }
    }

    /// A marker and the `N` (at most 8) big-endian bytes of its value, in one put.
    #[inline]
    fn marked<const N: usize>(&mut self, marker: u8, bytes: [u8; N]) -> Res {
        let mut out = [marker; 9];
        out[1..=N].copy_from_slice(&bytes);
        self.put(&out[..=N])
    }

    fn bin(&mut self, v: &[u8]) -> Res {
        self.len_head(v.len(), 0, 0, Some(BIN8), BIN16, BIN32)?;
        self.put(v)
    }

    fn array_len(&mut self, len: usize) -> Res {
        self.len_head(len, FIXARRAY, 16, None, ARRAY16, ARRAY32)
    }

    fn map_len(&mut self, len: usize) -> Res {
        self.len_head(len, FIXMAP, 16, None, MAP16, MAP32)
    }

    /// A compound: with its length known, written straight; without
    /// (an iterator with no exact size), its elements are buffered and
    /// counted, then the header and the buffer are written (as rmp-serde does).
    fn compound(&mut self, len: Option<usize>, map: bool) -> std::result::Result<Compound<'_, 'a, S>, CodecError> {
        match len {
            Some(n) if map => self.map_len(n)?,
            Some(n) => self.array_len(n)?,
            None => return Ok(Compound { ser: self, buffered: Some((Vec::new(), 0, map)) }),
        }
        Ok(Compound { ser: self, buffered: None })
    }
}

impl<'s, 'a, S: Sink + ?Sized> ser::Serializer for &'s mut Serializer<'a, S> {
    type Ok = ();
    type Error = CodecError;
    type SerializeSeq = Compound<'s, 'a, S>;
    type SerializeTuple = Compound<'s, 'a, S>;
    type SerializeTupleStruct = Compound<'s, 'a, S>;
    type SerializeTupleVariant = Compound<'s, 'a, S>;
    type SerializeMap = Compound<'s, 'a, S>;
    type SerializeStruct = Compound<'s, 'a, S>;
    type SerializeStructVariant = Compound<'s, 'a, S>;

    fn is_human_readable(&self) -> bool {
        false
    }

    fn serialize_bool(self, v: bool) -> Res {
        self.put(&[if v { 0xc3 } else { 0xc2 }])
    }
    fn serialize_i8(self, v: i8) -> Res {
        self.serialize_i64(v.into())
    }
    fn serialize_i16(self, v: i16) -> Res {
        self.serialize_i64(v.into())
    }
    fn serialize_i32(self, v: i32) -> Res {
        self.serialize_i64(v.into())
    }
    fn serialize_i64(self, v: i64) -> Res {
        // The shortest form, as `rmp::encode::write_sint` picks it: a
        // value of 0 or more as an unsigned one.
        match v {
            0.. => self.serialize_u64(v as u64),
            -32..=-1 => self.put(&[v as u8]),
            -0x80..=-33 => self.put(&[INT8, v as u8]),
            -0x8000..=-0x81 => self.marked(INT16, (v as i16).to_be_bytes()),
            -0x8000_0000..=-0x8001 => self.marked(INT32, (v as i32).to_be_bytes()),
            _ => self.marked(INT64, v.to_be_bytes()),
        }
    }
    fn serialize_i128(self, v: i128) -> Res {
        self.bin(&v.to_be_bytes())
    }
    fn serialize_u8(self, v: u8) -> Res {
        self.serialize_u64(v.into())
    }
    fn serialize_u16(self, v: u16) -> Res {
        self.serialize_u64(v.into())
    }
    fn serialize_u32(self, v: u32) -> Res {
        self.serialize_u64(v.into())
    }
    fn serialize_u64(self, v: u64) -> Res {
        // The shortest form, as `rmp::encode::write_uint` picks it.
        match v {
            0..=0x7f => self.put(&[v as u8]),
            0x80..=0xff => self.put(&[UINT8, v as u8]),
            0x100..=0xffff => self.marked(UINT16, (v as u16).to_be_bytes()),
            0x1_0000..=0xffff_ffff => self.marked(UINT32, (v as u32).to_be_bytes()),
            _ => self.marked(UINT64, v.to_be_bytes()),
        }
    }
    fn serialize_u128(self, v: u128) -> Res {
        self.bin(&v.to_be_bytes())
    }
    fn serialize_f32(self, v: f32) -> Res {
        self.marked(FLOAT32, v.to_be_bytes())
    }
    fn serialize_f64(self, v: f64) -> Res {
        self.marked(FLOAT64, v.to_be_bytes())
    }
    fn serialize_char(self, v: char) -> Res {
        self.serialize_str(v.encode_utf8(&mut [0; 4]))
    }
    fn serialize_str(self, v: &str) -> Res {
        self.len_head(v.len(), FIXSTR, 32, Some(STR8), STR16, STR32)?;
        self.put(v.as_bytes())
    }
    fn serialize_bytes(self, v: &[u8]) -> Res {
        self.bin(v)
    }
    fn serialize_none(self) -> Res {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, v: &T) -> Res {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Res {
        self.put(&[0xc0])
    }
    fn serialize_unit_struct(self, _: &'static str) -> Res {
        self.array_len(0)
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Res {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _: &'static str, v: &T) -> Res {
        v.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        v: &T,
    ) -> Res {
        self.map_len(1)?;
        self.serialize_str(variant)?;
        v.serialize(self)
    }
    fn serialize_seq(self, len: Option<usize>) -> std::result::Result<Compound<'s, 'a, S>, CodecError> {
        self.compound(len, false)
    }
    fn serialize_tuple(self, len: usize) -> std::result::Result<Compound<'s, 'a, S>, CodecError> {
        self.compound(Some(len), false)
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        len: usize,
    ) -> std::result::Result<Compound<'s, 'a, S>, CodecError> {
        self.compound(Some(len), false)
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> std::result::Result<Compound<'s, 'a, S>, CodecError> {
        self.map_len(1)?;
        self.serialize_str(variant)?;
        self.compound(Some(len), false)
    }
    fn serialize_map(self, len: Option<usize>) -> std::result::Result<Compound<'s, 'a, S>, CodecError> {
        self.compound(len, true)
    }
    fn serialize_struct(self, _: &'static str, len: usize) -> std::result::Result<Compound<'s, 'a, S>, CodecError> {
        self.compound(Some(len), false)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        variant: &'static str,
        len: usize,
    ) -> std::result::Result<Compound<'s, 'a, S>, CodecError> {
        self.map_len(1)?;
        self.serialize_str(variant)?;
        self.compound(Some(len), false)
    }

    /// serde's `Vec<T>` and `[T]` call this with `I` = `&Vec<T>` / `&[T]`:
    /// for `T` = `u8` the sequence is written as bin, one memcpy.
    fn collect_seq<I>(self, iter: I) -> Res
    where
        I: IntoIterator,
        I::Item: Serialize,
    {
        if typeid::of::<I>() == typeid::of::<&Vec<u8>>() {
            // SAFETY: `I` is `&Vec<u8>` (type identity up to lifetimes, which
            // do not change layout); the reference is used only in this call,
            // while `iter` (which it was copied from) is alive.
            let v: &Vec<u8> = unsafe { std::mem::transmute_copy::<I, &Vec<u8>>(&iter) };
            return self.bin(v);
        }
        if typeid::of::<I>() == typeid::of::<&[u8]>() {
            // SAFETY: as above, `I` is `&[u8]` (a fat reference, same layout).
            let v: &[u8] = unsafe { std::mem::transmute_copy::<I, &[u8]>(&iter) };
            return self.bin(v);
        }
        let iter = iter.into_iter();
        let len = match iter.size_hint() {
            (lo, Some(hi)) if lo == hi => Some(lo),
            _ => None,
        };
        let mut seq = ser::Serializer::serialize_seq(self, len)?;
        for item in iter {
            ser::SerializeSeq::serialize_element(&mut seq, &item)?;
        }
        ser::SerializeSeq::end(seq)
    }
}

/// An array or map being written; `buffered` holds (bytes, count, is a map)
/// when its length was not known up front.
pub(super) struct Compound<'s, 'a, S: Sink + ?Sized> {
    ser: &'s mut Serializer<'a, S>,
    buffered: Option<(Vec<u8>, usize, bool)>,
}

impl<S: Sink + ?Sized> Compound<'_, '_, S> {
    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Res {
        match &mut self.buffered {
            None => v.serialize(&mut *self.ser),
            Some((buf, count, _)) => {
                *count += 1;
                v.serialize(&mut Serializer { sink: buf })
            }
        }
    }

    fn finish(self) -> Res {
        if let Some((buf, count, map)) = self.buffered {
            if map {
                self.ser.map_len(count / 2)?;
            } else {
                self.ser.array_len(count)?;
            }
            self.ser.put(&buf)?;
        }
        Ok(())
    }
}

macro_rules! compound_impl {
    ($trait:ident, $f:ident $(, $key:ident)?) => {
        impl<S: Sink + ?Sized> ser::$trait for Compound<'_, '_, S> {
            type Ok = ();
            type Error = CodecError;
            fn $f<T: Serialize + ?Sized>(&mut self, $($key: &'static str,)? v: &T) -> Res {
                $(let _ = $key;)?
                self.element(v)
            }
            fn end(self) -> Res {
                self.finish()
            }
        }
    };
}

compound_impl!(SerializeSeq, serialize_element);
compound_impl!(SerializeTuple, serialize_element);
compound_impl!(SerializeTupleStruct, serialize_field);
compound_impl!(SerializeTupleVariant, serialize_field);
compound_impl!(SerializeStruct, serialize_field, key);
compound_impl!(SerializeStructVariant, serialize_field, key);

impl<S: Sink + ?Sized> ser::SerializeMap for Compound<'_, '_, S> {
    type Ok = ();
    type Error = CodecError;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, k: &T) -> Res {
        self.element(k)
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Res {
        self.element(v)
    }
    fn end(self) -> Res {
        self.finish()
    }
}
