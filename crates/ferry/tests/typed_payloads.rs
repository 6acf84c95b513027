//! Typed payloads as a user writes them, on every placement of client and
//! server (`common::pair`; two nodes under `scripts/netns-test.sh`):
//!
//! - the byte types the service macro takes as arguments and results
//!   (`Vec<u8>`, `&[u8]`, `[u8; N]`, `&[u8; N]`, `bytes::Bytes`,
//!   `serde_bytes::ByteBuf`, `&str`, `&T`) come back unchanged; the
//!   handlers of `&[u8]`, `&str` and `&T` borrow their argument (that they
//!   compile is the compile test);
//! - large typed values (8 MiB of `ByteBuf`, of `Vec<u8>`, and a struct
//!   with a byte field) and small ones (empty included) round-trip byte for
//!   byte.

mod common;

use common::pair::{pair, Placement, Side};
use common::typed::Flaky;
use ferry::rpc::RpcError;
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    id: u64,
    name: String,
    data: Vec<u8>,
}

#[ferry::service]
pub trait Payloads {
    async fn vec(&self, data: Vec<u8>) -> Vec<u8>;
    async fn buf(&self, data: ByteBuf) -> ByteBuf;
    async fn record(&self, r: Record) -> Record;
    async fn bytes(&self, b: bytes::Bytes) -> bytes::Bytes;
    async fn fbytes(&self, b: ferry::Bytes) -> ferry::Bytes;
    /// A large result whose encoding grows (or shrinks) between the size
    /// pass and the encode.
    async fn flaky(&self, grow: bool) -> Flaky;
    /// Borrows its argument: answers a copy and a checksum.
    async fn slice(&self, data: &[u8]) -> (Vec<u8>, u64);
    async fn text(&self, s: &str) -> String;
    async fn record_ref(&self, r: &Record) -> Record;
    async fn array(&self, a: [u8; 32]) -> [u8; 32];
    /// `Err` when the first byte is zero (the array inside `Result`).
    async fn array_ref(&self, a: &[u8; 5]) -> Result<[u8; 5], String>;
}

struct PayloadsImpl;

/// A checksum that sees every byte and its place.
fn sum(data: &[u8]) -> u64 {
    data.iter().enumerate().fold(0u64, |s, (i, &b)| s.wrapping_mul(31).wrapping_add(b as u64 ^ i as u64))
}

impl Payloads for PayloadsImpl {
    async fn vec(&self, data: Vec<u8>) -> Vec<u8> {
        data
    }
    async fn buf(&self, data: ByteBuf) -> ByteBuf {
        data
    }
    async fn record(&self, r: Record) -> Record {
        r
    }
    async fn bytes(&self, b: bytes::Bytes) -> bytes::Bytes {
        b
    }
    async fn fbytes(&self, b: ferry::Bytes) -> ferry::Bytes {
        b
    }
    async fn flaky(&self, grow: bool) -> Flaky {
        Flaky::new(grow)
    }
    async fn slice(&self, data: &[u8]) -> (Vec<u8>, u64) {
        (data.to_vec(), sum(data))
    }
    async fn text(&self, s: &str) -> String {
        s.to_uppercase()
    }
    async fn record_ref(&self, r: &Record) -> Record {
        Record { id: r.id + 1, name: r.name.clone(), data: r.data.clone() }
    }
    async fn array(&self, a: [u8; 32]) -> [u8; 32] {
        a
    }
    async fn array_ref(&self, a: &[u8; 5]) -> Result<[u8; 5], String> {
        if a[0] == 0 {
            Err("zero".into())
        } else {
            Ok(*a)
        }
    }
}

/// `len` bytes that differ from place to place (a lost or moved byte shows).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed).collect()
}

/// Serves `Payloads` as "payloads" on side A while side B runs `client`.
fn with_server(p: Placement, client: impl FnOnce(&PayloadsClient) + Send) {
    pair(p).run(
        |srv: &Side| {
            let _serving = PayloadsServer::serve(&srv.team, "payloads", PayloadsImpl).unwrap();
            srv.put("serving", "");
            srv.get_within::<String>("done", Duration::from_secs(120));
        },
        |cli: &Side| {
            cli.get::<String>("serving");
            let c = PayloadsClient::bind(&cli.team, "payloads").unwrap();
            client(&c);
            cli.put("done", "");
        },
    );
}

/// Compares without printing megabytes when they differ.
fn same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: byte {i} is {:#x}, sent {:#x}", got[i], want[i]);
    }
}

fn byte_types_round_trip(p: Placement) {
    with_server(p, |c| {
        for len in [0, 1, 255, 70_000] {
            let data = pattern(len, 1);
            same("Vec<u8>", &c.vec_blocking(data.clone()).unwrap(), &data);
            same("ByteBuf", &c.buf_blocking(ByteBuf::from(data.clone())).unwrap(), &data);
            same("Bytes", &c.bytes_blocking(bytes::Bytes::from(data.clone())).unwrap(), &data);
            same("ferry::Bytes", &c.fbytes_blocking(ferry::Bytes::from(data.clone())).unwrap(), &data);
            let (copy, s) = c.slice_blocking(&data).unwrap();
            same("&[u8]", &copy, &data);
            assert_eq!(s, sum(&data));
            // the asynchronous stub takes the reference too
            same("&[u8] async", &c.slice(&data[..]).wait().unwrap().0, &data);
        }
        assert_eq!(c.text_blocking("ünïcode and ascii").unwrap(), "ÜNÏCODE AND ASCII");
        assert_eq!(c.text_blocking("").unwrap(), "");
        let r = Record { id: 7, name: "seven".into(), data: pattern(1000, 2) };
        assert_eq!(c.record_ref_blocking(&r).unwrap(), Record { id: 8, ..r.clone() });
        let a: [u8; 32] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(c.array_blocking(a).unwrap(), a);
        assert_eq!(c.array(a).wait().unwrap(), a);
        assert_eq!(c.array_ref_blocking(&[1, 2, 3, 4, 5]).unwrap(), [1, 2, 3, 4, 5]);
        assert!(matches!(c.array_ref_blocking(&[0, 2, 3, 4, 5]), Err(RpcError::Remote(e)) if e == "zero"));
        // A result that does not encode as counted is answered CODEC, not lost.
        for grow in [true, false] {
            assert!(matches!(c.flaky_blocking(grow), Err(RpcError::Codec(_))), "grow {grow}");
        }
        assert_eq!(c.text_blocking("after").unwrap(), "AFTER");
    });
}

fn large_and_small_values_round_trip(p: Placement) {
    with_server(p, |c| {
        for len in [0, 1, 100, 8 << 20] {
            let data = pattern(len, 3);
            same("ByteBuf", &c.buf_blocking(ByteBuf::from(data.clone())).unwrap(), &data);
            same("Vec<u8>", &c.vec_blocking(data.clone()).unwrap(), &data);
            same("ferry::Bytes", &c.fbytes_blocking(ferry::Bytes::from(data.clone())).unwrap(), &data);
            let r = Record { id: u64::MAX - len as u64, name: format!("record of {len} bytes"), data: data.clone() };
            let back = c.record_blocking(r.clone()).unwrap();
            assert_eq!((back.id, &back.name), (r.id, &r.name));
            same("Record::data", &back.data, &data);
        }
    });
}

placements!(byte_types_round_trip, large_and_small_values_round_trip);

/// The `[u8; N]` wrapper takes exactly N bytes (or N integers, as serde
/// writes an array); any other length is a codec error, not a panic.
#[test]
fn byte_arrays_decode_exactly_n() {
    use ferry::rpc::__private::{ByteArray, BytesRef};
    let as_bin = ferry::codec::encode(&BytesRef(&[1, 2, 3])).unwrap();
    let as_ints = ferry::codec::encode(&[1u8, 2, 3]).unwrap();
    for bytes in [&as_bin, &as_ints] {
        assert_eq!(ferry::codec::decode::<ByteArray<3>>(bytes).unwrap().0, [1, 2, 3]);
        assert!(ferry::codec::decode::<ByteArray<2>>(bytes).is_err());
        assert!(ferry::codec::decode::<ByteArray<4>>(bytes).is_err());
    }
    assert_eq!(as_bin[0], 0xc4, "bin 8");
}

/// On the wire a `[u8; N]` argument is MessagePack bin (not N integers),
/// and explicit receipt hands the owned forms to the request enum: the
/// array itself, `Vec<u8>` for `&[u8]`, `String` for `&str`.
#[test]
fn explicit_receipt_sees_bin_and_owned_forms() {
    let dir = tempfile::tempdir().unwrap();
    let team = ferry::Team::builder().runtime_dir(dir.path()).start().unwrap();
    let endpoint = ferry::rpc::ServiceEndpoint::open_unnamed(&team, PayloadsClient::descriptor()).unwrap();
    let id = endpoint.id();
    let server = std::thread::spawn(move || {
        for _ in 0..3 {
            let call = endpoint.accept_blocking().unwrap();
            if call.method_name() == "array" {
                // a one-element tuple (fixarray 1), then bin 8 of 32 bytes
                assert_eq!(call.args()[..3], [0x91, 0xc4, 32], "{:x?}", call.args());
            }
            match PayloadsRequest::from_call(call).unwrap() {
                PayloadsRequest::Array { a, reply } => reply.ok(&a).unwrap(),
                PayloadsRequest::Slice { data, reply } => {
                    let data: Vec<u8> = data;
                    let s = sum(&data);
                    reply.ok(&(data, s)).unwrap()
                }
                PayloadsRequest::Text { s, reply } => {
                    let s: String = s;
                    reply.ok(&s.to_uppercase()).unwrap()
                }
                _ => panic!("another method"),
            }
        }
    });
    let c = PayloadsClient::bind_to(&team, id).unwrap();
    let a = [9u8; 32];
    assert_eq!(c.array_blocking(a).unwrap(), a);
    assert_eq!(c.slice_blocking(&[1, 2, 3]).unwrap(), (vec![1, 2, 3], sum(&[1, 2, 3])));
    assert_eq!(c.text_blocking("abc").unwrap(), "ABC");
    server.join().unwrap();
}
