//! The codec against rmp-serde (the encoding it keeps), bytes as bin, the
//! three inputs, in-place decoding and hostile input.

use super::*;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Point {
    x: i32,
    label: String,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Unit;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Newtype(u16);

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Tuple(i8, String);

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Shape {
    Empty,
    Circle(f64),
    Pair(u8, u8),
    Rect { w: u32, h: u32 },
    Nested(Box<Shape>),
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Everything {
    a: u8,
    b: i64,
    c: Option<String>,
    d: Vec<Shape>,
    e: BTreeMap<String, (u32, bool)>,
    f: char,
    g: f32,
    h: Unit,
    i: Newtype,
    j: Tuple,
    k: i128,
    l: u128,
    m: (),
    n: Option<Option<u8>>,
    o: [u16; 3],
}

fn everything() -> Everything {
    Everything {
        a: 255,
        b: i64::MIN,
        c: Some("héllo".into()),
        d: vec![
            Shape::Empty,
            Shape::Circle(1.5),
            Shape::Pair(1, 2),
            Shape::Rect { w: 3, h: 70000 },
            Shape::Nested(Box::new(Shape::Empty)),
        ],
        e: [("k".to_string(), (7, true))].into(),
        f: 'é',
        g: -0.25,
        h: Unit,
        i: Newtype(300),
        j: Tuple(-1, "t".into()),
        k: -(1 << 100),
        l: 1 << 127,
        m: (),
        n: Some(Some(4)), // Some(None) is nil, as None: MessagePack cannot tell them apart
        o: [1, 256, 65535],
    }
}

/// Ours and rmp-serde's bytes are equal, and each decodes the other's.
fn same_as_rmp<T: Serialize + serde::de::DeserializeOwned + PartialEq + Debug>(v: &T) {
    let ours = encode(v).unwrap();
    let theirs = rmp_serde::to_vec(v).unwrap();
    assert_eq!(ours, theirs, "{v:?}");
    assert_eq!(&decode::<T>(&theirs).unwrap(), v);
    assert_eq!(&rmp_serde::from_slice::<T>(&ours).unwrap(), v);
    assert_eq!(encoded_len(v).unwrap(), ours.len());
}

#[test]
fn encoding_is_rmp_serdes_except_bytes() {
    for v in [0u64, 127, 128, 255, 256, 65535, 65536, u32::MAX as u64, u32::MAX as u64 + 1, u64::MAX] {
        same_as_rmp(&v);
    }
    for v in [
        0i64,
        -1,
        -32,
        -33,
        -128,
        -129,
        -32768,
        -32769,
        i32::MIN as i64,
        i32::MIN as i64 - 1,
        i64::MIN,
        127,
        128,
        255,
        256,
        i64::MAX,
    ] {
        same_as_rmp(&v);
    }
    same_as_rmp(&(i8::MIN, i16::MIN, i32::MAX, u8::MAX, u16::MAX, u32::MAX));
    same_as_rmp(&(1.5f32, -2.25f64, f64::INFINITY));
    same_as_rmp(&("".to_string(), "a".repeat(31), "b".repeat(32), "c".repeat(256), "d".repeat(65536)));
    same_as_rmp(&("e".repeat(255), "f".repeat(65535)));
    same_as_rmp(&('x', '€', Some(3u8), None::<u8>));
    same_as_rmp(&everything());
    same_as_rmp(&vec![Shape::Empty, Shape::Pair(3, 4)]);
    same_as_rmp(&(Unit, Newtype(5), Tuple(1, "x".into()), ()));
    same_as_rmp(&HashMap::from([(1u8, "a".to_string())]));
    same_as_rmp(&vec![1u32; 70000]);
    // Around each form of the heads of arrays and maps (written without rmp).
    for n in [15, 16, 65535, 65536] {
        same_as_rmp(&vec![1u16; n]);
        same_as_rmp(&(0..n as u32).map(|k| (k, k)).collect::<std::collections::BTreeMap<_, _>>());
    }
    same_as_rmp(&(i128::MIN, u128::MAX));
    let p = Point { x: -3, label: "a".into() };
    // fixarray of 2: [-3, "a"] — what Python's msgpack.unpackb returns as [-3, 'a'].
    assert_eq!(encode(&p).unwrap(), vec![0x92, 0xfd, 0xa1, b'a']);
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Blob {
    id: u64,
    data: Vec<u8>,
}

#[test]
fn byte_sequences_are_bin() {
    let bin = |n: usize| {
        let mut v = Vec::new();
        rmp::encode::write_bin(&mut v, &vec![7u8; n]).unwrap();
        v
    };
    for n in [0, 1, 255, 256, 65535, 65536] {
        let data = vec![7u8; n];
        assert_eq!(encode(&data).unwrap(), bin(n), "Vec<u8> of {n}");
        assert_eq!(encode(&data[..]).unwrap(), bin(n));
        assert_eq!(encode(&data.clone().into_boxed_slice()).unwrap(), bin(n));
        assert_eq!(encode(&serde_bytes::ByteBuf::from(data.clone())).unwrap(), bin(n));
        assert_eq!(encode(&::bytes::Bytes::from(data.clone())).unwrap(), bin(n));
        assert_eq!(encode(&Bytes::from(data.clone())).unwrap(), bin(n));
        assert_eq!(encoded_len(&data).unwrap(), bin(n).len());
        assert_eq!(decode::<Vec<u8>>(&bin(n)).unwrap(), data);
        assert_eq!(&*decode::<Box<[u8]>>(&bin(n)).unwrap(), &data[..]);
        assert_eq!(&*decode::<Bytes>(&bin(n)).unwrap(), &data[..]);
        assert_eq!(decode::<serde_bytes::ByteBuf>(&bin(n)).unwrap().into_vec(), data);
    }
    // In a struct: [id, bin].
    let b = Blob { id: 1, data: vec![1, 2, 3] };
    assert_eq!(encode(&b).unwrap(), vec![0x92, 0x01, 0xc4, 3, 1, 2, 3]);
    assert_eq!(decode::<Blob>(&encode(&b).unwrap()).unwrap(), b);
    // Sequences of u8 that are not a Vec or slice stay arrays.
    same_as_rmp(&(1u8, 2u8));
    same_as_rmp(&[1u8, 2, 3]);
    same_as_rmp(&std::collections::VecDeque::from(vec![1u8, 2]));
    // rmp-serde's (and Python's) arrays of ints still decode as bytes.
    let old = rmp_serde::to_vec(&b).unwrap();
    assert_eq!(decode::<Blob>(&old).unwrap(), b);
    assert_eq!(&*decode::<Bytes>(&rmp_serde::to_vec(&vec![1u8, 2]).unwrap()).unwrap(), &[1, 2]);
    // Bin where other sequences of u8 are expected.
    assert_eq!(decode::<std::collections::VecDeque<u8>>(&bin(2)).unwrap(), [7, 7]);
    assert_eq!(decode::<[u8; 2]>(&bin(2)).unwrap(), [7, 7]);
    assert_eq!(decode::<(u8, u8)>(&bin(2)).unwrap(), (7, 7));
    assert!(matches!(decode::<[u8; 3]>(&bin(2)), Err(Error::Codec(_))));
}

/// A `Source` over a slice, counting its calls.
struct Src<'a> {
    bytes: &'a [u8],
    appends: usize,
}

impl Source for Src<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len()
    }
    fn read(&mut self, out: &mut [u8]) {
        let (a, b) = self.bytes.split_at(out.len());
        out.copy_from_slice(a);
        self.bytes = b;
    }
    fn append_to(&mut self, n: usize, out: &mut Vec<u8>) {
        self.appends += 1;
        let (a, b) = self.bytes.split_at(n);
        out.extend_from_slice(a);
        self.bytes = b;
    }
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Shared {
    name: String,
    payload: Bytes,
    rest: Vec<Bytes>,
}

#[test]
fn three_inputs_agree_and_shared_bytes_are_views() {
    let v = Shared { name: "n".into(), payload: vec![9u8; 5000].into(), rest: vec![Bytes::from(&b"ab"[..])] };
    let enc = ::bytes::Bytes::from(encode(&v).unwrap());
    let shared: Shared = decode_shared(&enc).unwrap();
    assert_eq!(shared, v);
    let range = enc.as_ptr() as usize..enc.as_ptr() as usize + enc.len();
    assert!(range.contains(&(shared.payload.as_ptr() as usize)), "a view of the received buffer");
    // A small field is copied: a view of it would keep the whole message alive.
    assert!(!range.contains(&(shared.rest[0].as_ptr() as usize)));
    let plain: Shared = decode(&enc).unwrap();
    assert!(!range.contains(&(plain.payload.as_ptr() as usize)), "decode copies");
    let mut src = Src { bytes: &enc, appends: 0 };
    assert_eq!(decode_from::<Shared, _>(&mut src).unwrap(), v);
    // A byte field is one append_to (plus one per string, through scratch).
    let mut src = Src { bytes: &enc, appends: 0 };
    let blob = encode(&Blob { id: 5, data: vec![3; 100_000] }).unwrap();
    src.bytes = &blob;
    assert_eq!(decode_from::<Blob, _>(&mut src).unwrap().data.len(), 100_000);
    assert_eq!(src.appends, 1);
    // Everything through all three.
    let e = encode(&everything()).unwrap();
    assert_eq!(decode_shared::<Everything>(&e.clone().into()).unwrap(), everything());
    assert_eq!(decode_from::<Everything, _>(&mut Src { bytes: &e, appends: 0 }).unwrap(), everything());
    assert!(matches!(
        decode_from::<Everything, _>(&mut Src { bytes: &e[..e.len() - 1], appends: 0 }),
        Err(Error::Codec(_))
    ));
}

/// Large fields (past `HUGE_FROM`) go into fresh buffers of the decoder's
/// own, handed over to their owner, but a `ferry::Bytes` stays a view.
#[test]
fn large_fields_decode_alike_from_every_input() {
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Large {
        buf: serde_bytes::ByteBuf,
        vec: Vec<u8>,
        text: String,
        view: Bytes,
    }
    let n = crate::sys::huge_pages::HUGE_FROM + 3;
    let v = Large {
        buf: serde_bytes::ByteBuf::from(vec![1u8; n]),
        vec: vec![2u8; n],
        text: "é".repeat(n / 2),
        view: vec![4u8; n].into(),
    };
    let enc = ::bytes::Bytes::from(encode(&v).unwrap());
    let shared: Large = decode_shared(&enc).unwrap();
    assert_eq!(shared, v);
    let range = enc.as_ptr() as usize..enc.as_ptr() as usize + enc.len();
    assert!(range.contains(&(shared.view.as_ptr() as usize)), "a large ferry::Bytes is a view");
    assert_eq!(decode::<Large>(&enc).unwrap(), v);
    assert_eq!(decode_from::<Large, _>(&mut Src { bytes: &enc, appends: 0 }).unwrap(), v);
    // A string that is not UTF-8 is refused at this size too.
    let mut bad = encode(&v.text).unwrap();
    let last = bad.len() - 1;
    bad[last] = 0xff;
    assert!(matches!(decode::<String>(&bad), Err(Error::Codec(_))));
}

#[test]
fn in_place_keeps_the_vecs_memory() {
    let mut place: Vec<u8> = Vec::with_capacity(1 << 20);
    place.extend_from_slice(b"old");
    let (ptr, cap) = (place.as_ptr(), place.capacity());
    let enc = encode(&vec![5u8; 1000]).unwrap();
    decode_in_place(&enc, &mut place).unwrap();
    assert_eq!(place, vec![5u8; 1000]);
    assert_eq!((place.as_ptr(), place.capacity()), (ptr, cap));
    let enc = encode(&vec![6u8; 2000]).unwrap();
    let mut src = Src { bytes: &enc, appends: 0 };
    decode_from_in_place(&mut src, &mut place).unwrap();
    assert_eq!(place, vec![6u8; 2000]);
    assert_eq!((place.as_ptr(), place.capacity(), src.appends), (ptr, cap, 1));
    // Other types in place decode as usual.
    let mut p = Point { x: 1, label: "a".into() };
    decode_in_place(&encode(&Point { x: 2, label: "b".into() }).unwrap(), &mut p).unwrap();
    assert_eq!(p, Point { x: 2, label: "b".into() });
}

#[test]
fn python_forms_decode() {
    // A struct as a map keyed by field name; ints in wider forms than needed.
    let mut m = Vec::new();
    rmp::encode::write_map_len(&mut m, 2).unwrap();
    rmp::encode::write_str(&mut m, "label").unwrap();
    rmp::encode::write_str(&mut m, "z").unwrap();
    rmp::encode::write_str(&mut m, "x").unwrap();
    rmp::encode::write_i64(&mut m, 7).unwrap();
    assert_eq!(decode::<Point>(&m).unwrap(), Point { x: 7, label: "z".into() });
    let mut m = Vec::new();
    rmp::encode::write_u64(&mut m, 200).unwrap();
    assert_eq!(decode::<u8>(&m).unwrap(), 200);
    assert_eq!(decode::<i16>(&m).unwrap(), 200);
    assert_eq!(decode::<i128>(&m).unwrap(), 200);
    assert!(matches!(decode::<i8>(&m), Err(Error::Codec(_))));
}

#[test]
fn hostile_input_is_a_codec_error() {
    let err = |bytes: &[u8]| match decode::<serde_json::Value>(bytes) {
        Err(Error::Codec(e)) => e,
        other => panic!("{other:?}"),
    };
    assert!(matches!(decode::<Point>(&[0xc1]), Err(Error::Codec(_))));
    // 100k nested arrays.
    let deep = vec![0x91u8; 100_000];
    assert!(err(&deep).contains("nested deeper than 256"), "{}", err(&deep));
    assert!(matches!(decode::<Shape>(&[0x81u8; 100_000]), Err(Error::Codec(_))));
    // Lengths past the input: nothing reserved for them.
    for bytes in [
        &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
        &[0xdf, 0xff, 0xff, 0xff, 0xff],
        &[0xc6, 0xff, 0xff, 0xff, 0xff],
        &[0xdb, 0xff, 0xff, 0xff, 0xff],
    ] {
        assert!(err(bytes).contains("left"), "{}", err(bytes));
        assert!(matches!(decode::<Vec<u8>>(bytes), Err(Error::Codec(_))));
    }
    // Trailing bytes, with their offset.
    let e = err(&[0x01, 0x02]);
    assert!(e.contains("1 bytes after the value") && e.contains("at byte 1"), "{e}");
    assert!(matches!(decode::<(u8,)>(&[0x92, 1, 2]), Err(Error::Codec(_))));
    assert!(matches!(decode::<String>(&[0xa1, 0xff]), Err(Error::Codec(_))));
}

/// `()` decodes from nil (its fast path) and from nothing else: what
/// follows it, a value of another kind, or no value at all is an error.
#[test]
fn unit_is_nil_only() {
    assert_eq!(encode(&()).unwrap(), [0xc0]);
    decode::<()>(&[0xc0]).unwrap();
    decode::<((), u8)>(&[0x92, 0xc0, 7]).unwrap();
    for bytes in [&[][..], &[0xc0, 0xc0], &[0x90], &[0x01], &[0xc1]] {
        assert!(matches!(decode::<()>(bytes), Err(Error::Codec(_))), "{bytes:?}");
    }
}

/// A value nested to the limit decodes on a test thread's stack.
#[test]
fn nesting_up_to_the_limit_decodes() {
    let mut bytes = vec![0x91u8; MAX_DEPTH - 1];
    bytes.push(0x90);
    assert!(decode::<serde_json::Value>(&bytes).is_ok());
    let mut bytes = [0x81u8, 0xa6, b'N', b'e', b's', b't', b'e', b'd'].repeat(MAX_DEPTH - 1);
    bytes.extend_from_slice(&[0xa5, b'E', b'm', b'p', b't', b'y']);
    assert!(decode::<Shape>(&bytes).is_ok());
}

/// Encode and decode speed of a 64 MiB byte field against serde_bytes and a
/// memcpy: `cargo test -p ferry --release --lib codec_speed -- --ignored --nocapture`.
/// At f988671 (2 shared cores, best of 5): memcpy warm 19.8 GB/s, fresh copy 2.15;
/// encode warm Vec<u8> 21.9, ByteBuf 21.4, {id, Vec<u8>} 22.5, (id, ByteBuf) 22.9;
/// decode Vec<u8> 2.45, ByteBuf 2.45, {id, Vec<u8>} 2.46, (id, ByteBuf) 2.45 (fresh
/// memory each time), in place 20.6.
#[test]
#[ignore]
fn codec_speed() {
    const N: usize = 64 << 20;
    let data = vec![0xa5u8; N];
    let gbs = |d: std::time::Duration| N as f64 / d.as_secs_f64() / 1e9;
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed()
            })
            .min()
            .unwrap()
    };
    let mut out = vec![0u8; N];
    let memcpy = best(&mut || {
        out.copy_from_slice(std::hint::black_box(&data));
        std::hint::black_box(&mut out);
    });
    let fresh = best(&mut || drop(std::hint::black_box(data.to_vec())));
    println!("memcpy warm {:.2} GB/s, copy into fresh memory {:.2} GB/s", gbs(memcpy), gbs(fresh));
    let blob = Blob { id: 1, data: data.clone() };
    let bb = (1u64, serde_bytes::ByteBuf::from(data.clone()));
    let mut buf = Vec::with_capacity(N + 16);
    for (name, t) in [
        (
            "encode Vec<u8> (warm out)",
            best(&mut || {
                buf.clear();
                encode_into(&data, &mut buf).unwrap()
            }),
        ),
        (
            "encode ByteBuf (warm out)",
            best(&mut || {
                buf.clear();
                encode_into(&bb.1, &mut buf).unwrap()
            }),
        ),
        (
            "encode {id, Vec<u8>} (warm out)",
            best(&mut || {
                buf.clear();
                encode_into(&blob, &mut buf).unwrap()
            }),
        ),
        (
            "encode (id, ByteBuf) (warm out)",
            best(&mut || {
                buf.clear();
                encode_into(&bb, &mut buf).unwrap()
            }),
        ),
        ("encode Vec<u8> (fresh)", best(&mut || drop(encode(&data).unwrap()))),
    ] {
        println!("{name}: {:.2} GB/s", gbs(t));
    }
    let v = encode(&data).unwrap();
    let s = encode(&blob).unwrap();
    let sb = encode(&bb).unwrap();
    let mut place: Vec<u8> = Vec::with_capacity(N);
    for (name, t) in [
        ("decode Vec<u8>", best(&mut || drop(decode::<Vec<u8>>(&v).unwrap()))),
        ("decode ByteBuf", best(&mut || drop(decode::<serde_bytes::ByteBuf>(&v).unwrap()))),
        ("decode {id, Vec<u8>}", best(&mut || drop(decode::<Blob>(&s).unwrap()))),
        ("decode (id, ByteBuf)", best(&mut || drop(decode::<(u64, serde_bytes::ByteBuf)>(&sb).unwrap()))),
        ("decode Vec<u8> in place (warm)", best(&mut || decode_in_place(&v, &mut place).unwrap())),
    ] {
        println!("{name}: {:.2} GB/s", gbs(t));
    }
}

/// A type that nests itself through an option reads no marker per level:
/// each `Some` (and newtype) still counts towards the nesting limit, so one
/// non-nil byte cannot recurse until the stack overflows.
#[test]
fn options_nesting_themselves_are_bounded() {
    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Chain(Option<Box<Chain>>);
    match decode::<Chain>(&[0x01]) {
        Err(Error::Codec(e)) => assert!(e.contains("nested deeper than"), "{e}"),
        other => panic!("{other:?}"),
    }
    // A short chain still decodes.
    assert!(decode::<Chain>(&[0xc0]).is_ok());
}

/// The fast paths' type identities were found: without them every `Vec<u8>`
/// would still decode, one byte at a time, and no other test would notice.
#[test]
fn the_vec_u8_visitors_are_recognized() {
    let (by_value, in_place) = super::decode::vec_u8_visitors();
    assert!(by_value.is_some(), "serde's VecVisitor<u8>");
    assert!(in_place.is_some(), "serde's VecInPlaceVisitor<u8>, one word holding the place");
}

/// Small values through this codec and through rmp-serde (the encoding it
/// replaced), ns per encode and decode: `cargo test -p ferry --release --lib
/// small_values_speed -- --ignored --nocapture`.
#[test]
#[ignore]
fn small_values_speed() {
    fn time(what: &str, n: usize, mut f: impl FnMut()) {
        let t = std::time::Instant::now();
        for _ in 0..n {
            f();
        }
        eprintln!("{what:40} {:7.1} ns", t.elapsed().as_nanos() as f64 / n as f64);
    }
    let n = 2_000_000;
    let unit = ();
    let buf4 = (serde_bytes::ByteBuf::from(vec![5u8; 4]),);
    let buf1000 = (serde_bytes::ByteBuf::from(vec![5u8; 1000]),);
    let mut out = Vec::with_capacity(2048);
    macro_rules! both {
        ($name:literal, $v:expr, $t:ty) => {{
            time(concat!("ours encode ", $name), n, || {
                out.clear();
                encode_into(std::hint::black_box(&$v), &mut out).unwrap();
            });
            time(concat!("rmp  encode ", $name), n, || {
                out.clear();
                rmp_serde::encode::write(&mut out, std::hint::black_box(&$v)).unwrap();
            });
            let bytes = encode(&$v).unwrap();
            time(concat!("ours decode ", $name), n, || {
                std::hint::black_box(decode::<$t>(std::hint::black_box(&bytes)).unwrap());
            });
            let rmp = rmp_serde::to_vec(&$v).unwrap();
            time(concat!("rmp  decode ", $name), n, || {
                std::hint::black_box(rmp_serde::from_slice::<$t>(std::hint::black_box(&rmp)).unwrap());
            });
        }};
    }
    both!("()", unit, ());
    both!("(u64,)", (7u64,), (u64,));
    both!("(ByteBuf 4,)", buf4, (serde_bytes::ByteBuf,));
    both!("(ByteBuf 1000,)", buf1000, (serde_bytes::ByteBuf,));
    both!("u64", 123456u64, u64);
    both!("(i64, f64)", (-1234567i64, 2.5f64), (i64, f64));
}
