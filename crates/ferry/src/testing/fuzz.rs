//! The fuzz harnesses: one function per decoder of a peer's bytes, each
//! taking any input. The targets in `fuzz/fuzz_targets/` (run with `cargo
//! +nightly fuzz`, see `scripts/fuzz.sh` and `docs/RELIABILITY.md`) are
//! one-line calls of these; the unit tests below replay the committed
//! corpora and the inputs of fixed bugs through them, and write the seed
//! corpora from ferry's own encoders.
//!
//! Every harness is pure and makes no system call: where the real code
//! reads a socket or maps memory, the harness runs the same parsing code
//! on its input (the sockets' reads and the mappings are factored out of
//! it). A harness returns normally whatever the input; it panics only on a
//! bug: a panic in the code it runs (a peer's bytes must give a typed
//! error, never a panic), or a broken invariant it checks.
//!
//! | harness | the code it runs |
//! |---|---|
//! | [`frame`] | `Header::decode` (every frame of every transport), then what a receiver reads of a Nack's or a Release's payload |
//! | [`codec`] | the payload codec's three inputs (`decode`, `decode_shared`, `decode_from`) and in-place decoding into ferry's and typical user types (byte fields, enums, maps, any value) |
//! | [`rpc`] | the RPC envelopes: `envelope::parse` (requests, batches and their bound), `decode_response`, `decode_oneway_response`, a bind's `ServiceDescriptor` |
//! | [`shm_handshake`] | the shared-memory bind: the acceptor's check of a hello and of the segment header, the connector's of a welcome |
//! | [`shm_ring`] | a shared-memory end's receive (`ShmEnd::try_recv_many`, one frame or a burst: ring consumer, frame headers, payload descriptors, releases) on rings and areas in heap memory that a hostile peer writes at will |
//! | [`shm_area`] | payload-area descriptors (`Range::decode`) and the writer's book (`Allocator`), against a model |
//! | [`tcp_handshake`] | the TCP bind: hello, welcome, proof, verdict (also as a peer that holds the key) |
//! | [`tcp_frames`] | a TCP end's reading side (`Rx`): frames and credit frames split off a stream read in arbitrary pieces, credit checks, frames taken and kept |
//! | [`names_query`] | a name query as a node reads it, an answer (or a refusal) as the asker reads it (also signed) |
//! | [`etcd`] | an etcd answer: HTTP/1.1 status and headers, chunked bodies, the JSON of every request ferry makes, watch streams, endpoint ids as text |
//! | [`handover`] | a TCP bind handed over by another team of the node (`FERRYTHO`), and the hello it carries |
//! | [`region_open`] | a region's opening as the importer reads the owner's answer (status, length, epoch) |
//! | [`region_ops`] | remote memory's served operations: a request as the owner decodes and runs it (on a real region), an answer as the importer reads it |
//! | [`shm_descriptors`] | descriptors handed over after a shared-memory bind, on its socket: asked, unasked, taken, against a peer that sends anything |
//! | [`fifo`] | a fifo: an opening's answer and an enqueue as each side reads them, and a producer's ring as its owner pops it (the ring's memory the input) |
//! | [`link_frames`] | a link's frames and openings as their receiver decodes them, and a stream of frames (any numbers, any bytes) as an end takes them in order within its window |
//! | [`signal`] | a signal's answer as the signaller reads it (a status byte) |
//! | [`call_ids`] | the call ids of a peer's answers as the call slab (`runtime::call_slab`) looks them up, among calls that start and end |
//! | [`settings`] | not a peer's bytes but a user's settings: `TeamBuilder`'s setters and the check `start` makes, then that what it lets through is what the transports take |

use crate::id::{Addr, EndpointId, TeamId};
use crate::names::{etcd as etcd_names, remote};
use crate::rpc::__private::{ByteArray, BytesRef};
use crate::rpc::envelope::{self, Request};
use crate::rpc::{MethodDescriptor, ServiceDescriptor};
use crate::transport::doorbell::{Bell, DoorbellMemory};
use crate::transport::shm::area::{Allocator, Range, PAGE};
use crate::transport::shm::ring::{Consumer, Producer, RingMem, CELL};
use crate::transport::shm::{self, AreaMemory, ShmEnd};
use crate::transport::tcp::{self, handshake, Grant};
use crate::transport::{Body, Detached, Recv, Staged, Transport};
use crate::wire::{codec as wire_codec, flags, Header, Kind, Nack, Route, HEADER_LEN};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A harness: runs the code it covers on one input.
pub type Harness = fn(&[u8]);

/// The fuzz targets, by name, with their harnesses.
pub const TARGETS: &[(&str, Harness)] = &[
    ("frame", frame),
    ("codec", codec),
    ("rpc", rpc),
    ("shm_handshake", shm_handshake),
    ("shm_ring", shm_ring),
    ("shm_area", shm_area),
    ("tcp_handshake", tcp_handshake),
    ("tcp_frames", tcp_frames),
    ("names_query", names_query),
    ("etcd", etcd),
    ("handover", handover),
    ("shm_descriptors", shm_descriptors),
    ("region_open", region_open),
    ("region_ops", region_ops),
    ("fifo", fifo),
    ("signal", signal),
    ("call_ids", call_ids),
    ("link_frames", link_frames),
    ("settings", settings),
];

/// A harness's input read as a program: bytes, integers, and the rest;
/// zeros once it is used up.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Up to `n` bytes (fewer if the input ends).
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    /// Exactly `N` bytes, zero-padded.
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.bytes(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    fn byte(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    fn rest(&mut self) -> &'a [u8] {
        self.bytes(usize::MAX)
    }
}

// ---------------------------------------------------------------------------
// Frames, codec, RPC envelopes

/// `Header::decode` on any bytes (a whole frame); what decodes re-encodes to
/// the same header, and the payload views a receiver takes of it hold.
pub fn frame(data: &[u8]) {
    let h = match Header::decode(data) {
        Ok(h) => h,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let mut again = [0u8; HEADER_LEN];
    h.encode(&mut again);
    assert_eq!(&again[..], &data[..HEADER_LEN], "decode then encode changed the header");
    assert_eq!(h.len as usize, data.len() - HEADER_LEN);
    assert_eq!(h.flags & !flags::KNOWN, 0);
    let _ = (h.checkpoint(), h.detached());
    let payload = &data[HEADER_LEN..];
    match h.kind {
        // What `dispatch::nack_error` reads.
        Kind::Nack => match Nack::parse(payload) {
            Nack::TooLarge { len, max } => {
                assert_eq!(payload.len(), 17);
                assert_eq!(payload[1..], Nack::too_large(len, max));
            }
            Nack::Other(text) => {
                let _ = String::from_utf8_lossy(text);
            }
            Nack::NoSuchEndpoint | Nack::NoReply | Nack::NotServed(_) => {}
        },
        // A shared-memory release or descriptor: a checked range, or none.
        Kind::Release | Kind::Data | Kind::Reply => {
            if let Some(r) = Range::decode(payload, shm::MAX_AREA) {
                assert!(r.len != 0 && r.offset.is_multiple_of(PAGE) && r.offset + r.len <= shm::MAX_AREA);
            }
        }
        Kind::Ack | Kind::Cancel => {}
        // What a routed primitive reads first (links, groups).
        Kind::Served(_) => match Route::split(payload) {
            Ok((route, rest)) => {
                assert_eq!(rest.len() + Route::LEN, payload.len());
                assert_eq!(route.encode()[..], payload[..Route::LEN]);
            }
            Err(e) => assert!(payload.len() < Route::LEN, "{e}"),
        },
    }
}

/// A typical user enum (externally tagged, with every variant shape).
#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
enum Shape {
    Unit,
    New(u32),
    Tuple(i8, String),
    Struct { a: Vec<u8>, b: Option<Box<Shape>> },
}

/// A typical user struct.
#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Record {
    id: EndpointId,
    name: String,
    tags: Vec<String>,
    counts: BTreeMap<String, u64>,
    shape: Shape,
    flag: Option<bool>,
}

/// A user struct with byte fields (bin on the wire).
#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Blob {
    id: u64,
    data: Vec<u8>,
    view: crate::Bytes,
    parts: Vec<crate::Bytes>,
}

/// A `Source` over a slice (shared memory as the codec sees it: only copies).
struct SliceSource<'a>(&'a [u8]);

impl wire_codec::Source for SliceSource<'_> {
    fn remaining(&self) -> usize {
        self.0.len()
    }
    fn read(&mut self, out: &mut [u8]) {
        let (a, b) = self.0.split_at(out.len());
        out.copy_from_slice(a);
        self.0 = b;
    }
    fn append_to(&mut self, n: usize, out: &mut Vec<u8>) {
        let (a, b) = self.0.split_at(n);
        out.extend_from_slice(a);
        self.0 = b;
    }
}

/// Decodes `data` as `T` through the three inputs (a slice, a shared
/// `bytes::Bytes`, a `Source`), which must agree; what decodes re-encodes
/// (`encoded_len` telling its length) and decodes to the same value, also in place.
fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug + Clone>(data: &[u8]) {
    let plain = wire_codec::decode::<T>(data);
    let shared = wire_codec::decode_shared::<T>(&bytes::Bytes::copy_from_slice(data));
    let source = wire_codec::decode_from::<T, _>(&mut SliceSource(data));
    let ok = |r: &Result<T, crate::Error>| r.as_ref().ok().cloned();
    assert_eq!(ok(&shared), ok(&plain), "decode_shared agrees with decode");
    assert_eq!(ok(&source), ok(&plain), "decode_from agrees with decode");
    if let Ok(v) = plain {
        let bytes = wire_codec::encode(&v).expect("a decoded value encodes");
        assert_eq!(wire_codec::encoded_len(&v).expect("a decoded value has a length"), bytes.len());
        assert_eq!(wire_codec::decode::<T>(&bytes).expect("an encoded value decodes"), v);
        let mut place = v.clone();
        wire_codec::decode_in_place(&bytes, &mut place).expect("an encoded value decodes in place");
        assert_eq!(place, v);
        wire_codec::decode_from_in_place(&mut SliceSource(&bytes), &mut place).expect("and from a source");
        assert_eq!(place, v);
    }
}

/// `codec::decode`, `decode_shared`, `decode_from` (a typed port's payload,
/// an RPC's arguments and result) into ferry's own types and typical user types.
pub fn codec(data: &[u8]) {
    round_trip::<ServiceDescriptor>(data);
    round_trip::<Record>(data);
    round_trip::<Shape>(data);
    round_trip::<EndpointId>(data);
    round_trip::<Blob>(data);
    round_trip::<Vec<u8>>(data);
    round_trip::<crate::Bytes>(data);
    round_trip::<serde_json::Value>(data);
    round_trip::<(u32, String, Vec<u8>)>(data);
    round_trip::<Vec<Option<i64>>>(data);
    round_trip::<HashMap<String, Vec<u32>>>(data);
    round_trip::<BTreeMap<String, Shape>>(data);
    round_trip::<(char, bool, u128, i16)>(data);
    let _ = wire_codec::decode::<(f64, f32)>(data);
    let _ = wire_codec::decode::<()>(data);
    let _ = wire_codec::decode::<String>(data);
}

/// The interface a fuzzed bind is compared with.
fn sample_descriptor() -> ServiceDescriptor {
    ServiceDescriptor {
        name: "Calc".into(),
        codec: crate::rpc::CODEC.into(),
        methods: vec![
            MethodDescriptor {
                name: "add".into(),
                args: vec![("a".into(), "i32".into()), ("b".into(), "i32".into())],
                ret: "i32".into(),
            },
            MethodDescriptor { name: "ping".into(), args: vec![], ret: "()".into() },
        ],
    }
}

/// The RPC envelopes as a server (requests) and a client (responses) read them.
pub fn rpc(data: &[u8]) {
    match envelope::parse(data) {
        Ok(Request::Bind(d)) => {
            assert_eq!(d, &data[1..]);
            // What the server does with a bind.
            if let Ok(client) = wire_codec::decode::<ServiceDescriptor>(d) {
                let _ = sample_descriptor().first_difference(&client);
                let _ = client.first_difference(&sample_descriptor());
                let _ = client.fingerprint();
            }
        }
        Ok(Request::Call { method, args }) => {
            assert_eq!(args, &data[5..]);
            let _ = (method, wire_codec::decode::<(i32, i32)>(args));
            byte_array::<4>(args);
            byte_array::<32>(args);
            let _ = wire_codec::decode::<(ByteArray<0>, Vec<u8>, String)>(args);
        }
        Ok(Request::CallOnce { id, method, args }) => {
            assert_eq!(args, &data[13..]);
            let _ = (id, method, wire_codec::decode::<(i32, i32)>(args));
        }
        Ok(Request::Batch(entries)) => {
            // The server answers the last one: there is one.
            assert!(!entries.is_empty());
            let total: usize = entries.iter().map(|(_, a)| 8 + a.len()).sum();
            assert_eq!(total + 5, data.len(), "a batch's entries do not cover the message");
            assert!(entries.len() <= envelope::max_batch_calls(data.len()), "a batch past its bound");
        }
        Err(envelope::Refusal::Malformed(what)) => assert!(!what.is_empty()),
        Err(r @ envelope::Refusal::TooManyCalls { max }) => {
            // Refused on its count alone, which is past what its size allows.
            assert_eq!(data.first(), Some(&envelope::BATCH));
            assert_eq!(max, envelope::max_batch_calls(data.len()));
            assert!(u32::from_le_bytes(data[1..5].try_into().unwrap()) as usize > max);
            let refused = envelope::decode_response::<(), crate::rpc::Never>(&r.response());
            assert!(matches!(refused, Err(crate::rpc::RpcError::Ferry(crate::Error::LimitReached { .. }))));
        }
    }
    // What the server does with a call: its head, then its arguments decoded
    // where they arrived (as `rpc::Args` does), agreeing with the whole parse.
    if let Some((method, id, at)) = envelope::call_head(&data[..data.len().min(13)]) {
        match envelope::parse(data) {
            Ok(Request::Call { method: m, args }) => assert!(m == method && id.is_none() && args == &data[at..]),
            Ok(Request::CallOnce { id: i, method: m, args }) => {
                assert!(m == method && id == Some(i) && args == &data[at..])
            }
            _ => panic!("call_head read a call that parse does not"),
        }
        let whole = wire_codec::decode::<(Vec<u8>, String)>(&data[at..]).ok();
        let at_place = crate::runtime::payload::Payload::from_slice(data).decode_at::<(Vec<u8>, String)>(at).ok();
        assert_eq!(whole, at_place, "decoding where the arguments arrived differs");
    }
    let _ = envelope::decode_response::<(u32, String), String>(data);
    let _ = envelope::decode_response::<ServiceDescriptor, Shape>(data);
    let _ = envelope::decode_response::<(), crate::rpc::Never>(data);
    let _ = envelope::decode_oneway_response::<Shape>(data);
    let _ = envelope::decode_response::<ByteArray<16>, String>(data);
}

/// A `[u8; N]` argument as the service macro decodes it (bin of exactly N
/// bytes, or N integers); what decodes re-encodes as bin to the same bytes.
fn byte_array<const N: usize>(args: &[u8]) {
    if let Ok((a,)) = wire_codec::decode::<(ByteArray<N>,)>(args) {
        let bytes = wire_codec::encode(&(BytesRef(&a.0),)).expect("a decoded array encodes");
        let (again,) = wire_codec::decode::<(ByteArray<N>,)>(&bytes).expect("an encoded array decodes");
        assert_eq!(again.0, a.0);
    }
}

// ---------------------------------------------------------------------------
// Shared memory

/// This team, as the shared-memory handshake harness sees it.
const ME: TeamId = TeamId { node: 1, team: 100, incarnation: 0xABCD_0001 };
/// The team a connector means to reach.
const PEER: TeamId = TeamId { node: 1, team: 200, incarnation: 0x1234_5678 };
/// The largest ring the harness's acceptor maps.
const MAX_RING: usize = 1 << 20;

/// The shared-memory bind's checks. Input: a mode byte (even: the
/// acceptor's, odd: the connector's), the message as received (up to the 64
/// bytes a receive takes), then, for the acceptor, the segment's header.
pub fn shm_handshake(data: &[u8]) {
    let mut input = Input(data);
    let mode = input.byte();
    let n = input.byte() as usize % 65;
    let msg = input.bytes(n);
    if mode % 2 == 0 {
        match shm::check_hello(msg, ME.node, MAX_RING) {
            Ok((peer, cap, area)) => {
                assert_ne!(peer.incarnation, 0);
                assert!(cap.is_power_of_two() && (shm::MIN_RING..=MAX_RING).contains(&cap));
                assert!(area.is_multiple_of(PAGE) && area <= shm::MAX_AREA);
                let header: [u8; shm::SEGMENT_HEADER] = input.array();
                if shm::segment_header_ok(&header, cap, area) {
                    assert_eq!(header, shm::segment_header(cap, area));
                }
            }
            // A well-formed hello asking for more ring than we map: the limit.
            Err(crate::Error::LimitReached { limit, max }) => {
                assert_eq!((limit, max), (crate::Limit::RingBytes, MAX_RING as u64))
            }
            Err(e) => assert!(matches!(e, crate::Error::Protocol { .. }), "{e:?}"),
        }
    } else {
        match shm::check_welcome(msg, PEER) {
            Ok(()) => assert_eq!(&msg[..8], shm::WELCOME),
            // An acceptor's refusal: one of its limits.
            Err(crate::Error::LimitReached { .. }) => assert_eq!(&msg[..8], shm::REFUSED),
            Err(e) => assert!(matches!(e, crate::Error::Protocol { .. } | crate::Error::NoSuchTeam(_)), "{e:?}"),
        }
    }
}

/// Heap memory, 64-byte aligned and zeroed, written by the harness as a
/// peer would write shared memory (with raw pointers).
struct HeapBytes {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the bytes are only reached through raw copies and atomics, as
// shared memory is; the harness runs on one thread.
unsafe impl Send for HeapBytes {}
unsafe impl Sync for HeapBytes {}

impl HeapBytes {
    fn new(len: usize) -> HeapBytes {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 64).expect("a small layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        HeapBytes { ptr, len }
    }

    /// A peer writes `bytes` at `at` (clipped to the memory).
    fn write(&self, at: usize, bytes: &[u8]) {
        let at = at.min(self.len);
        let n = bytes.len().min(self.len - at);
        // SAFETY: in bounds (clipped above); nothing else accesses the bytes now.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), n) };
    }

    /// A peer stores the aligned word at `at` (rounded down to 8 bytes).
    fn store(&self, at: usize, v: u64) {
        let at = (at % self.len) & !7;
        // SAFETY: 8-aligned (the memory is 64-aligned) and inside it.
        unsafe { (*(self.ptr.add(at) as *const AtomicU64)).store(v, Ordering::Release) };
    }
}

impl Drop for HeapBytes {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), 64).expect("a small layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// The two payload areas of a channel in heap memory: two allocations of
/// exactly their size, so ASan sees an access past either.
struct HeapAreas {
    ours: HeapBytes,
    theirs: HeapBytes,
}

impl AreaMemory for HeapAreas {
    fn file(&self) -> Option<rustix::fd::BorrowedFd<'_>> {
        None
    }
}

/// A ring in heap memory: its cells, its `head` and writer-waiting words.
struct HeapRing {
    cells: HeapBytes,
    words: Box<RingWords>,
}

#[repr(C, align(128))]
struct RingWords {
    head: AtomicU64,
    _pad: [u8; 120],
    waiting: AtomicU32,
}

impl HeapRing {
    fn new(cap: usize, head: u64) -> HeapRing {
        HeapRing {
            cells: HeapBytes::new(cap),
            words: Box::new(RingWords { head: AtomicU64::new(head), _pad: [0; 120], waiting: AtomicU32::new(0) }),
        }
    }

    fn mem(&self) -> RingMem {
        // SAFETY: `cells` is `len` bytes, a power of two of at least a cell,
        // 64-aligned; the words are aligned and apart from them. The ring
        // outlives every user of this RingMem (the harness drops the end,
        // the producer and the reader first).
        unsafe { RingMem::new(self.cells.ptr, self.cells.len, &self.words.head, &self.words.waiting) }
    }
}

/// A doorbell of heap words that rings nobody: the harness has no threads to wake.
#[derive(Default)]
struct QuietBell {
    pollers: AtomicU32,
    sleepers: AtomicU32,
}

impl DoorbellMemory for QuietBell {
    type Word = AtomicU32;
    type Line = ();
    type Sleep = ();

    fn pollers(&self) -> &AtomicU32 {
        &self.pollers
    }

    fn sleepers(&self) -> &AtomicU32 {
        &self.sleepers
    }

    fn ring_one(_: &()) {}

    fn ring_all(_: &(), _: u32) {}

    fn wait(_: &(), _: Duration) -> bool {
        true
    }
}

/// The operations of a [`shm_ring`] program (an op byte modulo their count).
mod ring_op {
    pub const SCRIBBLE_WORD: u8 = 0;
    pub const SCRIBBLE_BYTES: u8 = 1;
    pub const PUSH: u8 = 2;
    pub const RECV: u8 = 3;
    pub const DROP_HELD: u8 = 4;
    pub const TIDY: u8 = 5;
    pub const PROBE: u8 = 6;
    pub const SEND_LARGE: u8 = 7;
    pub const PEER_READS: u8 = 8;
    pub const PEER_RELEASES: u8 = 9;
    pub const SCRIBBLE_AREA: u8 = 10;
    pub const SCRIBBLE_WORDS: u8 = 11;
    pub const SEND_SMALL: u8 = 12;
    pub const CLOSE: u8 = 13;
    pub const STAMP: u8 = 14;
    pub const COUNT: u8 = 15;
}

/// A shared-memory end's receive path on memory a hostile peer writes at
/// will. The rings and payload areas are heap memory built from the input;
/// the harness plays the peer: it writes any word or byte of the ring it
/// sends on (also stamps on the lap where the end reads next, with any
/// length), of its payload area and of the `head` of the ring it reads,
/// publishes records through the real producer (headers and payloads as
/// the input says), reads what the end sends back and gives ranges back.
/// The end runs its real code: `try_recv_many` (the ring consumer, header
/// decoding, payload descriptors, releases), `tidy`, its sends.
///
/// Input: ring size (256 << (b % 5) bytes), area size (1 + b % 4 pages),
/// the reader's start position (u64: any lap), then operations
/// ([`ring_op`], each an op byte and its operands) until the input ends.
/// The end must never panic, read outside the rings and areas (the heap
/// memory is exactly their size: ASan reports any access past it), loop
/// (libFuzzer's timeout) or allocate without bound (its memory limits).
pub fn shm_ring(data: &[u8]) {
    let mut input = Input(data);
    let cap = 256usize << (input.byte() % 5);
    let area = PAGE * (1 + input.byte() as u64 % 4);
    // Any position a long-lived channel reaches (laps wrap at 2^32).
    let start = input.u64() & ((1 << 48) - 1) & !(CELL as u64 - 1);
    let rx_ring = HeapRing::new(cap, start);
    let tx_ring = HeapRing::new(cap, 0);
    let areas = Arc::new(HeapAreas { ours: HeapBytes::new(area as usize), theirs: HeapBytes::new(area as usize) });
    let (ours, theirs) = (areas.ours.ptr, areas.theirs.ptr as *const u8);
    let mut end =
        ShmEnd::from_parts(tx_ring.mem(), rx_ring.mem(), Bell::on(QuietBell::default(), ()), None).reading_from(start);
    // SAFETY: both areas are `area` bytes of `areas`, which the end holds;
    // only the end writes its own.
    unsafe { end.set_areas(areas.clone(), (ours, 0), theirs, area, area) };
    // The peer: its producer on the ring it sends on, its reader of ours.
    let mut peer = Producer::starting_at(rx_ring.mem(), start);
    let mut peer_reader = Consumer::new(tx_ring.mem());
    // Ranges of the peer's area the end holds (taken, not dropped yet).
    let mut held: Vec<Detached> = Vec::new();
    // Ranges of our area the end lent the peer (as the peer read them).
    let mut lent_to_peer: Vec<[u8; 16]> = Vec::new();
    // Whether the peer reads the end's ring as it should: once it has
    // scribbled that ring's `head`, the end may write over records the
    // peer has not read, and what the peer reads there is no longer checked.
    let mut reader_honest = true;
    let max_body = RingMem::max_body(cap);
    // A header from the input: any kind and flags for the peer's frames;
    // for the end's own sends, one the runtime would give it.
    let header = |input: &mut Input<'_>, len: usize, ours: bool| {
        let mut h = Header::new(
            Kind::from_u8(match input.byte() {
                b @ 0..=63 => b % 8,
                b => b,
            })
            .unwrap_or(Kind::Data),
            Addr::from_bits(input.u64()),
            Addr::from_bits(input.u64()),
            input.u64(),
        );
        h.flags = input.u16();
        h.len = len as u32;
        if ours {
            h.flags &= flags::KNOWN;
            if h.kind == Kind::Release {
                h.kind = Kind::Data;
            }
        }
        h
    };
    while !input.is_empty() {
        match input.byte() % ring_op::COUNT {
            ring_op::SCRIBBLE_WORD => rx_ring.cells.store(input.u16() as usize * 8, input.u64()),
            ring_op::SCRIBBLE_BYTES => {
                let at = input.u16() as usize % cap;
                let n = input.byte() as usize;
                rx_ring.cells.write(at, input.bytes(n));
            }
            ring_op::PUSH => {
                let n = input.u16() as usize % (max_body - HEADER_LEN + 1);
                let mut h = header(&mut input, n, false);
                if input.byte() % 4 == 0 {
                    // A length that lies about the payload.
                    h.len = input.u32();
                }
                let mut head = [0u8; HEADER_LEN];
                h.encode(&mut head);
                // Bypasses `Header` for the first bytes: versions and kinds it would not write.
                if input.byte() % 8 == 0 {
                    head[..2].copy_from_slice(&input.array::<2>());
                }
                let payload = input.bytes(n);
                let _ = peer.push(&head, [payload]);
            }
            ring_op::RECV => {
                let policy = input.byte();
                // One frame (`try_recv`'s path) or a burst of up to 8 (a drain's).
                let max = 1 + (policy >> 2) as usize % 8;
                let mut scratch = Vec::new();
                let got = end.try_recv_many(max, &mut |h, body| {
                    assert_ne!(h.kind, Kind::Release, "a release reached the receiver");
                    match body {
                        Body::Inline(p) => {
                            assert!(p.len() <= end.max_payload() && p.len() == h.len as usize);
                            assert!(!h.detached());
                        }
                        Body::Detached(slot) => {
                            assert!(h.detached());
                            if policy & 1 != 0 {
                                return false;
                            }
                            let d = slot.take().expect("a detached payload is offered whole");
                            // Read first: a range past the area is ASan's to report.
                            d.read_into(&mut scratch);
                            assert_eq!(scratch.len(), d.len());
                            assert!(d.len() as u64 <= area && !d.is_empty());
                            if policy & 2 != 0 && held.len() < 8 {
                                held.push(d);
                            }
                            return true;
                        }
                    }
                    policy & 1 == 0
                });
                match got {
                    Ok((taken, Recv::Consumed | Recv::Empty | Recv::Kept | Recv::PeerGone)) => assert!(taken <= max),
                    Err(e) => assert!(!e.to_string().is_empty()),
                }
            }
            ring_op::DROP_HELD => {
                if !held.is_empty() {
                    held.remove(input.byte() as usize % held.len());
                }
            }
            ring_op::TIDY => end.tidy(),
            ring_op::PROBE => {
                let _ = (end.has_frame(), end.needs_tidy(), end.wants_space(), end.is_closed());
            }
            ring_op::SEND_LARGE => {
                let n = 1 + input.u16() as usize % area as usize;
                let h = header(&mut input, 0, true);
                if let Ok(staged) = end.stage(&vec![0x5A; n]) {
                    assert!(matches!(staged, Staged::Shm(_)));
                    let _ = end.try_send_staged(&h, &mut Some(staged));
                }
            }
            ring_op::PEER_READS => {
                let _ = peer_reader.pop(&mut |body| {
                    if !reader_honest {
                        return true;
                    }
                    // The end writes only frames it could decode itself.
                    let h = Header::decode(body).expect("the end wrote a bad frame");
                    let payload = &body[HEADER_LEN..];
                    if h.kind == Kind::Release {
                        // It gives back ranges of the peer's area it was lent, checked.
                        assert!(Range::decode(payload, area).is_some(), "the end released {payload:?}");
                    } else if h.detached() {
                        let r = Range::decode(payload, area).expect("the end lent a range outside its area");
                        if lent_to_peer.len() < 64 {
                            lent_to_peer.push(r.encode());
                        }
                    } else {
                        assert!(payload.len() <= end.max_payload());
                    }
                    true
                });
                peer_reader.release();
            }
            ring_op::PEER_RELEASES => {
                let descriptor = if input.byte() % 2 == 0 && !lent_to_peer.is_empty() {
                    lent_to_peer.swap_remove(input.byte() as usize % lent_to_peer.len())
                } else {
                    input.array()
                };
                let mut h = Header::new(Kind::Release, Addr::NONE, Addr::NONE, 0);
                h.len = descriptor.len() as u32;
                let mut head = [0u8; HEADER_LEN];
                h.encode(&mut head);
                let _ = peer.push(&head, [&descriptor]);
            }
            ring_op::SCRIBBLE_AREA => {
                let at = input.u16() as usize * 16 % area as usize;
                let n = input.byte() as usize;
                areas.theirs.write(at, input.bytes(n));
            }
            ring_op::SCRIBBLE_WORDS => {
                // The `head` of the ring the end writes (its producer checks it)
                // and the writer-waiting word of the one it reads.
                tx_ring.words.head.store(input.u64(), Ordering::Release);
                reader_honest = false;
                rx_ring.words.waiting.store(input.u32(), Ordering::Release);
            }
            ring_op::SEND_SMALL => {
                let n = input.byte() as usize;
                let h = header(&mut input, n, true);
                let _ = end.try_send(&h, input.bytes(n));
            }
            ring_op::CLOSE => end.close(),
            ring_op::STAMP => {
                // A stamp where the end reads next (or a few cells on), on the
                // right lap (or a lap off by the input's delta), with any
                // length and padding flag: what a peer that knows the ring
                // writes to mislead it.
                let pos = rx_ring.words.head.load(Ordering::Acquire) + (input.byte() as u64 % 4) * CELL as u64;
                let low = input.u32() as u64;
                let lap = (pos / cap as u64 + input.byte() as u64 % 3) & 0xFFFF_FFFF;
                rx_ring.cells.store(pos as usize % cap, lap << 32 | low);
            }
            _ => unreachable!(),
        }
    }
    // The end goes first, then what it points into.
    drop(held);
    drop(end);
}

/// The operations of a [`shm_area`] program.
mod area_op {
    pub const LEND: u8 = 0;
    pub const RELEASE_LENT: u8 = 1;
    pub const RELEASE_RAW: u8 = 2;
    pub const COOL: u8 = 3;
    pub const COUNT: u8 = 4;
}

/// Payload-area descriptors (a peer's `{offset, len}`: what a receiver
/// reads and a writer takes back) and the writer's book of its area,
/// checked against a model: a release is taken iff it names a range lent
/// and not yet given back, exactly; the book's ranges always tile the area.
///
/// Input: the area's size (a mode byte: odd for areas past the warm part,
/// then its pages), then operations ([`area_op`]) until the input ends.
pub fn shm_area(data: &[u8]) {
    let mut input = Input(data);
    let big = input.byte() % 2 == 1;
    let pages = if big { 1 + input.u32() as u64 % (shm::MAX_AREA / PAGE) } else { 1 + input.byte() as u64 % 32 };
    let size = pages * PAGE;
    let mut book = Allocator::new(size);
    // The model: what is lent, by offset.
    let mut lent: BTreeMap<u64, u64> = BTreeMap::new();
    let mut ops = 0u64;
    let now = std::time::Instant::now();
    let release = |book: &mut Allocator, lent: &mut BTreeMap<u64, u64>, r: Range| {
        let expected = lent.get(&r.offset) == Some(&r.len);
        assert_eq!(book.release(r).is_ok(), expected, "release of {r:?} with {lent:?} lent");
        if expected {
            lent.remove(&r.offset);
        }
    };
    while !input.is_empty() {
        match input.byte() % area_op::COUNT {
            area_op::LEND => {
                let len = if big { input.u64() % (size + PAGE) } else { input.u32() as u64 % (size + PAGE) };
                if let Some(r) = book.lend(len) {
                    assert_eq!(r.len, len);
                    assert_eq!(Range::decode(&r.encode(), size), Some(r), "a lent range is not a valid descriptor");
                    assert!(lent.insert(r.offset, r.len).is_none(), "lent twice at {}", r.offset);
                } else {
                    assert!(len == 0 || len > size || !lent.is_empty(), "an empty area refused {len} bytes");
                }
            }
            area_op::RELEASE_LENT => {
                if let Some((&offset, &len)) = lent.iter().nth(input.byte() as usize % lent.len().max(1)) {
                    release(&mut book, &mut lent, Range { offset, len });
                }
            }
            area_op::RELEASE_RAW => {
                let b: [u8; 16] = input.array();
                if let Some(r) = Range::decode(&b, size) {
                    assert!(r.len != 0 && r.offset.is_multiple_of(PAGE) && r.offset + r.len <= size);
                    release(&mut book, &mut lent, r);
                }
                let cut = input.byte() as usize % 16;
                assert_eq!(Range::decode(&b[..cut], size), None, "a descriptor of {cut} bytes");
            }
            area_op::COOL => {
                let later = now + Duration::from_millis(input.u16() as u64 * 64);
                if let Some(r) = book.cool(later) {
                    // Pages to punch out: free (above every lent range), above the warm part.
                    assert!(r.offset >= crate::transport::shm::area::WARM_BYTES && r.len > 0, "{r:?}");
                    assert!(r.offset.is_multiple_of(PAGE) && r.len.is_multiple_of(PAGE) && r.offset + r.len <= size);
                    assert!(lent.iter().all(|(&at, &len)| at + len <= r.offset), "gave back {r:?} with {lent:?} lent");
                }
            }
            _ => unreachable!(),
        }
        // After every operation while the book is small (at most 17
        // ranges: free ones lie between lent ones); then every 32nd (a
        // broken book stays broken) and at the end.
        ops += 1;
        if lent.len() <= 8 || ops.is_multiple_of(32) {
            book.check();
        }
    }
    book.check();
}

// ---------------------------------------------------------------------------
// TCP

/// The cluster key of the harnesses (a peer "holding the key" signs with it).
const KEY: &[u8] = b"ferry fuzzing cluster key";
const OUR_GRANT: Grant = Grant { frames: 1 << 20, detached: 1 << 30 };

/// The TCP bind's checks. Input: a mode byte (bit 0: the connector's side,
/// else the acceptor's; bit 1: the peer holds the cluster key and signs
/// what it sends), then what the peer sends: the acceptor reads a hello
/// (60 bytes) and a proof (32), the connector a welcome (80) and a verdict (8).
pub fn tcp_handshake(data: &[u8]) {
    let mut input = Input(data);
    let mode = input.byte();
    let signed = mode & 2 != 0;
    let nonce = [7u8; 16];
    if mode & 1 == 0 {
        let hello: [u8; handshake::HELLO_LEN] = input.array();
        if let Ok(to) = handshake::hello_target(&hello) {
            assert_eq!(to, handshake::get_id(&hello[20..32]));
        }
        let (peer, grant) = match handshake::check_hello(&hello) {
            Ok(ok) => ok,
            Err(e) => return assert!(matches!(e, crate::Error::Protocol { .. }), "{e:?}"),
        };
        assert!(peer.incarnation != 0 && grant.frames >= handshake::MIN_GRANT);
        let welcome = handshake::welcome_bytes(KEY, &hello, handshake::WELCOME, ME, OUR_GRANT, &nonce);
        assert!(handshake::check_welcome(KEY, &hello, &welcome, ME).is_ok(), "our own welcome is refused");
        let proof = if signed { handshake::proof_bytes(KEY, &hello, &welcome) } else { input.array() };
        assert_eq!(
            handshake::proof_ok(KEY, &hello, &welcome, &proof),
            signed || proof == handshake::proof_bytes(KEY, &hello, &welcome)
        );
    } else {
        let grant = Grant { frames: handshake::MIN_GRANT, detached: 0 };
        let hello = handshake::hello_bytes(handshake::HELLO, ME, PEER, grant, &nonce);
        let mut welcome: [u8; handshake::WELCOME_LEN] = input.array();
        if signed {
            let tag = handshake::mac(KEY, b"ferry-tcp-1 welcome", &[&hello, &welcome[..48]]);
            use hmac::Mac;
            welcome[48..].copy_from_slice(&tag.finalize().into_bytes());
        }
        match handshake::check_welcome(KEY, &hello, &welcome, PEER) {
            Ok(theirs) => {
                assert_eq!(&welcome[..8], handshake::WELCOME);
                assert_eq!(handshake::get_id(&welcome[8..20]), PEER);
                assert!((handshake::MIN_GRANT..=1 << 30).contains(&theirs.frames) && theirs.detached <= 1 << 36);
                let verdict: [u8; 8] = input.array();
                match handshake::check_verdict(&verdict, PEER) {
                    Ok(()) => assert_eq!(&verdict, handshake::ACCEPTED),
                    Err(e) => {
                        assert!(matches!(e, crate::Error::Protocol { .. } | crate::Error::Unauthenticated { .. }))
                    }
                }
            }
            Err(crate::Error::Unauthenticated { .. }) => assert!(!signed, "a signed welcome is refused as unsigned"),
            Err(e) => assert!(matches!(e, crate::Error::Protocol { .. } | crate::Error::NoSuchTeam(_)), "{e:?}"),
        }
    }
}

/// The operations of a [`tcp_frames`] program.
mod tcp_op {
    pub const READ: u8 = 0;
    pub const TAKE: u8 = 1;
    pub const KEEP: u8 = 2;
    pub const RETURN_CREDIT: u8 = 3;
    pub const COUNT: u8 = 4;
}

/// A TCP end's reading side on a stream the peer writes: what the end
/// reads arrives in pieces of any size (`Rx::room`, as the socket reads
/// them), is split into frames (`Rx::split`: credit checks before a frame
/// is buffered whole, credit frames summed), and taken (`Rx::front`, which
/// `try_recv` reads, `Rx::pop_front`) or kept. Checked: the bookkeeping's
/// invariants, and that the frames queued and taken never exceed the
/// credit granted (and returned).
///
/// Input: the grant (frames: 4096 << (b % 6) bytes; large payloads: 0 or
/// 1 << (b % 24)), then operations ([`tcp_op`]) until the input ends or
/// the end finds a violation (it closes then).
pub fn tcp_frames(data: &[u8]) {
    let mut input = Input(data);
    let frames = handshake::MIN_GRANT << (input.byte() % 6);
    let b = input.byte();
    let detached = if b < 128 { 0 } else { 1usize << (b % 24) };
    let mut rx = tcp::Rx::new(Grant { frames, detached });
    // Credit granted in all (the grant and what was returned since), taken
    // by frames consumed, and owed back for them.
    let (mut granted, mut consumed, mut owed) = ((frames, detached), (0usize, 0usize), (0usize, 0usize));
    while !input.is_empty() {
        match input.byte() % tcp_op::COUNT {
            tcp_op::READ => {
                // `TcpEnd::pump`: compact, read (splitting after each read, so
                // a large payload goes to its own buffer) until the kernel is
                // drained or the cap is reached (`pump` says `capped` then).
                let n = input.u16() as usize;
                let mut chunk = input.bytes(n);
                rx.compact();
                loop {
                    let n = rx.read(chunk);
                    chunk = &chunk[n..];
                    if let Err(e) = rx.split() {
                        // The end aborts the channel: nothing more is read.
                        assert!(!e.to_string().is_empty());
                        return;
                    }
                    if n == 0 || chunk.is_empty() {
                        break;
                    }
                }
            }
            op @ (tcp_op::TAKE | tcp_op::KEEP) => {
                let take = op == tcp_op::TAKE;
                if let Some(h) = rx.front() {
                    assert_ne!(h.kind, Kind::Release, "a credit frame was queued");
                    assert_eq!(rx.front_payload().len(), h.len as usize);
                    rx.check();
                    // What `try_recv` hands out, and takes back if refused.
                    let payload = rx.take_front();
                    assert_eq!(payload.len(), h.len as usize);
                    if !take {
                        rx.put_back(payload);
                        assert_eq!(rx.front_payload().len(), h.len as usize);
                    }
                    if take {
                        let (f, d) = tcp::TcpEnd::cost(&h);
                        consumed = (consumed.0 + f, consumed.1 + d);
                        owed = (owed.0 + f, owed.1 + d);
                        rx.pop_front();
                    }
                }
            }
            tcp_op::RETURN_CREDIT => {
                rx.regrant(owed.0, owed.1);
                granted = (granted.0 + owed.0, granted.1 + owed.1);
                owed = (0, 0);
            }
            _ => unreachable!(),
        }
        rx.check();
        let q = rx.queued();
        assert!(
            q.0 + consumed.0 <= granted.0,
            "frames past the credit: {q:?} queued, {consumed:?} taken, {granted:?} granted"
        );
        assert!(q.1 + consumed.1 <= granted.1, "large payloads past the credit: {q:?} queued, {consumed:?} taken");
    }
}

// ---------------------------------------------------------------------------
// Names

/// A name query as a node reads it (after its magic) and an answer as the
/// asker checks it. Input: a mode byte (bit 0: the answer, else the query;
/// bit 1: the peer holds the key and signs), then the peer's bytes.
pub fn names_query(data: &[u8]) {
    use hmac::Mac;
    let mut input = Input(data);
    let mode = input.byte();
    let signed = mode & 2 != 0;
    if mode & 1 == 0 {
        let got = if signed {
            // A key holder's query: head (nonce, length), name, its MAC.
            let head: [u8; 18] = input.array();
            let len = u16::from_le_bytes([head[16], head[17]]) as usize;
            let name = input.bytes(len.min(crate::names::MAX_NAME_LEN));
            let mut query = remote::QUERY.to_vec();
            query.extend_from_slice(&head);
            query.extend_from_slice(name);
            let tag = handshake::mac(KEY, b"ferry-names-1 query", &[&query]).finalize().into_bytes();
            let mut stream = query[8..].to_vec();
            stream.extend_from_slice(&tag);
            let got = remote::read_query(&mut &stream[..], KEY);
            if let Err(crate::Error::Unauthenticated { .. }) = got {
                // Only a name shorter than its length says (the input ended) fails the MAC.
                assert!(name.len() < len, "a signed query is refused as unsigned");
            }
            got
        } else {
            remote::read_query(&mut input.rest(), KEY)
        };
        match got {
            Ok((query, name)) => {
                assert!(!name.is_empty() && name.len() <= crate::names::MAX_NAME_LEN);
                assert!(query.ends_with(name.as_bytes()));
                // What a node then does with the name (its plane refuses a bad one).
                let _ = crate::names::validate_name(&name);
                let answer = remote::answer_bytes(KEY, &query, None);
                assert_eq!(remote::check_answer(KEY, &query, &answer, 0).ok(), Some(None));
            }
            Err(e) => assert!(
                matches!(
                    e,
                    crate::Error::InvalidName(_) | crate::Error::Unauthenticated { .. } | crate::Error::Io { .. }
                ),
                "{e:?}"
            ),
        }
    } else {
        let query = remote::query_bytes(KEY, &[3; 16], "echo");
        let query = &query[..query.len() - remote::MAC_LEN];
        // A signed answer whose first 8 bytes are a refusal's is a refusal
        // (which no key signs): read as one, `Unauthenticated`.
        let mut refusal = false;
        let got = if signed {
            let mut answer: [u8; remote::ANSWER_LEN] = input.array();
            let body = remote::ANSWER_LEN - remote::MAC_LEN;
            let tag = handshake::mac(KEY, b"ferry-names-1 answer", &[query, &answer[..body]]).finalize().into_bytes();
            answer[body..].copy_from_slice(&tag);
            refusal = &answer[..8] == remote::REFUSED;
            remote::read_answer(&mut &answer[..], KEY, query, 2)
        } else {
            // The peer's bytes as they come: an answer, a refusal, a TLS node's word, or less.
            remote::read_answer(&mut input.rest(), KEY, query, 2)
        };
        match got {
            Ok(Some(ep)) => {
                // An endpoint from the wire prints and parses back (names files and etcd keep it as text).
                assert_eq!(ep.to_string().parse::<EndpointId>(), Ok(ep));
            }
            Ok(None) => {}
            Err(crate::Error::Unauthenticated { peer, .. }) => assert!((!signed || refusal) && peer.node == 2),
            Err(e) => assert!(
                matches!(
                    e,
                    crate::Error::Protocol { .. }
                        | crate::Error::Tls { .. }
                        | crate::Error::Io { .. }
                        | crate::Error::LimitReached { .. }
                        // A refusal cut short: the node hung up (as a bind reads it).
                        | crate::Error::NoSuchTeam(_)
                ),
                "{e:?}"
            ),
        }
    }
}

/// An etcd member's answer as the etcd name plane reads it. Input: a mode
/// byte (0: a unary answer, read with every interpretation ferry makes of
/// one; 1: a watch stream; 2: an endpoint id as text), then the bytes.
pub fn etcd(data: &[u8]) {
    let mut input = Input(data);
    let mode = input.byte() % 3;
    let bytes = input.rest();
    if mode == 2 {
        if let Ok(ep) = std::str::from_utf8(bytes).unwrap_or_default().parse::<EndpointId>() {
            assert_eq!(ep.to_string().parse::<EndpointId>(), Ok(ep));
        }
        return;
    }
    let body = match etcd_names::response(bytes, "/v3/kv/range") {
        Ok(body) => body,
        Err(e) => return assert!(matches!(e, crate::Error::Io { .. })),
    };
    if mode == 0 {
        let Ok(v) = serde_json::from_reader::<_, serde_json::Value>(body) else { return };
        let _ = etcd_names::lease_id(&v);
        let _ = etcd_names::lease_lost(&v);
        let _ = etcd_names::txn_owner(&v);
        let _ = etcd_names::range_answer(&v);
        let _ = etcd_names::watch_message(&v);
    } else {
        // A wait reads messages until one settles it; at most as many as the bytes.
        for (i, msg) in etcd_names::watch_messages(body).enumerate() {
            assert!(i <= bytes.len());
            if !matches!(msg, etcd_names::Watched::Nothing) {
                break;
            }
        }
    }
}

/// A TCP bind handed over by another team of this node (`FERRYTHO`): the
/// message as received (its first byte: how many descriptors came with it),
/// then the checks of the hello it carries.
pub fn handover(data: &[u8]) {
    let mut input = Input(data);
    let fds = input.byte() as usize % 3;
    let msg = input.rest();
    if let Some(crate::runtime::reactor::Handed::Hello(hello)) = crate::runtime::reactor::handed_over(msg, fds) {
        assert_eq!(&msg[8..], &hello[..]);
        let _ = handshake::hello_target(&hello);
        if let Ok((peer, grant)) = handshake::check_hello(&hello) {
            assert!(peer.incarnation != 0 && grant.frames >= handshake::MIN_GRANT);
        }
    }
}

/// Descriptors after the bind (`transport::shm::handover`) against a peer
/// that writes anything on the bind socket: a program of our asks, unasks
/// and takes, and the peer's messages (any bytes, 0..=6 descriptors).
/// What is taken is what was asked, and never more than was asked waits.
pub fn shm_descriptors(data: &[u8]) {
    use crate::transport::shm::handover::{Handovers, MAX_ASKED};
    use rustix::fd::AsFd;
    let mut input = Input(data);
    let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
    theirs.set_nonblocking(true).expect("non-blocking");
    let memfd = rustix::fs::memfd_create("ferry-fuzz", rustix::fs::MemfdFlags::CLOEXEC).expect("a memfd");
    let handovers = Handovers::default();
    while !input.is_empty() {
        let tag = u64::from(input.byte() % 8);
        match input.byte() % 5 {
            0 => {
                let _ = handovers.ask(tag);
            }
            1 => handovers.unask(tag),
            2 => {
                let n = input.byte() as usize % 13;
                let bytes = input.bytes(n).to_vec();
                let fds = vec![memfd.as_fd(); input.byte() as usize % 7];
                let _ = crate::sys::fdpass::send(theirs.as_fd(), &bytes, &fds);
            }
            3 => {
                if handovers.receive(&ours).is_err() {
                    return; // The channel would close.
                }
            }
            _ => match handovers.take(tag, &ours) {
                Ok(fds) => assert!(!fds.is_empty() && fds.len() <= crate::sys::fdpass::MAX_FDS),
                Err(_) => return,
            },
        }
        let (asked, got) = handovers.counts();
        assert!(got <= asked && asked <= MAX_ASKED);
    }
}

/// The owner's answer to a region's opening, as the importer reads it: a
/// length it accepts is one it may map.
pub fn region_open(data: &[u8]) {
    if let Ok((len, _epoch)) = crate::memory::import::parse_open_answer(data) {
        assert!((1..=crate::memory::MAX_REGION_BYTES).contains(&len) && data.len() == 17);
    }
}

/// Remote memory's served operations. The first byte picks the side: even,
/// the owner's — the rest is a request, decoded and (if it decodes) run on
/// a region of 4 KiB whose key and epoch it carries; its answer must read
/// back as an answer, no larger than one served read — and odd, the
/// importer's: the rest is an answer, read for a region of 4 KiB.
pub fn region_ops(data: &[u8]) {
    use crate::memory::ops::{decode_request, parse_answer, Request};
    use crate::memory::regions::{serve_op, RegionMemory};
    static MEMORY: std::sync::LazyLock<RegionMemory> =
        std::sync::LazyLock::new(|| RegionMemory::create("fuzz", 4096, 1).expect("a region's memory"));
    let Some((&side, bytes)) = data.split_first() else { return };
    let region = EndpointId::at(Addr::new(1, 2, 4).expect("an address"), 3);
    if side % 2 == 1 {
        let _ = parse_answer(bytes, region, 4096);
        return;
    }
    if let Some(req) = decode_request(bytes) {
        // Encoding what was decoded gives the same bytes: one reading per request.
        assert_eq!(Request { ..req }.encode(), bytes);
        let req = decode_request(bytes).expect("decoded once");
        let answer = serve_op(&MEMORY, req);
        assert!(answer.len() <= 1 + (1 << 20));
        if let Err(e) = parse_answer(&answer, region, 4096) {
            assert!(matches!(e, crate::Error::OutOfBounds { .. } | crate::Error::Misaligned { .. }), "{e}");
        }
    }
}

/// A fifo. The first byte picks: 0, an `OPEN` answer as a producer reads
/// it; 1, an `ENQUEUE` payload as the owner reads it; 3, a `CREDIT` answer
/// (for a ring of 64) as a producer reads it; else a producer's
/// ring of 4 elements of at most 16 bytes whose memory is the rest (its
/// tail word first, then its slots), which the owner pops until it is
/// empty or found corrupt: what it takes is never longer than an element.
pub fn fifo(data: &[u8]) {
    use crate::fifo::ring::{Consuming, Ring, Shape};
    let Some((&side, bytes)) = data.split_first() else { return };
    match side {
        0 => {
            let fifo = EndpointId::at(Addr::new(1, 2, 4).expect("an address"), 3);
            let _ = crate::fifo::wire::parse_opened(bytes, fifo);
        }
        1 => {
            if let Some((key, _, element)) = crate::fifo::wire::parse_enqueue(bytes) {
                assert_eq!(key.len() + 4 + element.len(), bytes.len());
            }
        }
        3 => {
            let fifo = EndpointId::at(Addr::new(1, 2, 4).expect("an address"), 3);
            if let Ok(free) = crate::fifo::wire::parse_credit(bytes, 64, fifo) {
                assert!(free <= 64);
            }
        }
        _ => {
            let shape = Shape { capacity: 4, element_size: 16 };
            let mut memory = vec![0u64; shape.bytes() / 8];
            let words: &mut [u8] = bytemuck_bytes(&mut memory);
            // The tail word (offset 0), then the slots (from 4096).
            let (tail, slots) = bytes.split_at(bytes.len().min(8));
            words[..tail.len()].copy_from_slice(tail);
            let n = slots.len().min(words.len() - 4096);
            words[4096..4096 + n].copy_from_slice(&slots[..n]);
            // SAFETY: `memory` is `shape.bytes()` bytes, 8-aligned, alive while the ring is used.
            let ring = unsafe { Ring::new(memory.as_mut_ptr().cast(), shape) };
            let (mut at, mut out) = (Consuming::default(), Vec::new());
            for _ in 0..8 {
                match ring.pop(&mut at, &mut out) {
                    Ok(true) => assert!(out.len() <= 16),
                    Ok(false) | Err(_) => break,
                }
            }
        }
    }
}

/// A signal's answer as the signaller reads it: accepted, a typed error,
/// or (anything else) `Refused` — never a panic.
pub fn signal(data: &[u8]) {
    let to = EndpointId::at(Addr::new(1, 2, 4).expect("an address"), 3);
    let r = crate::signal::handlers::status_of(data, to);
    assert!(r.is_ok() == (data == [0]));
}

/// The call ids of a peer's answers, looked up in the call slab among
/// calls that start and end (a program: each byte picks start, end, an
/// answer with any id, or one with a live call's id bent): an answer
/// reaches exactly the call whose id it names, from that call's channel,
/// once; every call ends with the answer it got; nothing panics.
pub fn call_ids(data: &[u8]) {
    use crate::runtime::call_slab::CallSlab;
    use crate::runtime::payload::Payload;
    use std::task::{Context, Poll, Waker};
    let slab = CallSlab::new(16);
    // (id, channel, answered)
    let mut live: Vec<(u64, u64, bool)> = Vec::new();
    let mut input = Input(data);
    let answer = |live: &mut Vec<(u64, u64, bool)>, channel: u64, id: u64| {
        let expect = live.iter().position(|&(i, c, answered)| i == id && c == channel && !answered);
        match slab.answer(channel, id) {
            Some(a) => {
                let at = expect.expect("an answer reached a call it does not name");
                a.finish(Ok(Payload::from_slice(&id.to_le_bytes())));
                live[at].2 = true;
            }
            None => assert!(expect.is_none(), "an answer missed its call"),
        }
    };
    while !input.is_empty() {
        let op = input.byte();
        match op % 4 {
            0 => match slab.start(u64::from(op >> 6)) {
                Ok(id) => live.push((id, u64::from(op >> 6), false)),
                Err(e) => assert!(live.len() == 16, "refused below the bound: {e}"),
            },
            1 if !live.is_empty() => {
                let (id, _, answered) = live.swap_remove(usize::from(op >> 2) % live.len());
                match slab.poll(id, &mut Context::from_waker(Waker::noop())) {
                    Poll::Ready(Ok(p)) => assert!(answered && p.into_vec() == id.to_le_bytes()),
                    Poll::Ready(Err(e)) => panic!("{e}"),
                    Poll::Pending => assert!(!answered && slab.forget(id)),
                }
            }
            2 => {
                let id = input.u64();
                answer(&mut live, u64::from(op >> 6), id);
            }
            _ if !live.is_empty() => {
                let (id, channel, _) = live[usize::from(op >> 2) % live.len()];
                let bent = id ^ input.u64() >> (input.byte() % 65).min(63);
                answer(&mut live, channel, bent);
            }
            _ => {}
        }
    }
    for (id, ..) in live {
        slab.forget(id);
    }
    assert_eq!(slab.in_flight(), 0);
}

/// A link's frames. The first byte picks: 0, the rest decoded as a
/// frame, an end's own frame, a moving end, an opening and a window (what
/// decodes encodes back to its bytes); else a program of an end's frames
/// arriving at an end, each a number (u16), a length (u8) and that many
/// bytes, which the end takes in order as it would: acknowledgements,
/// messages within its window, consumed at once.
pub fn link_frames(data: &[u8]) {
    use crate::link::stream::Stream;
    use crate::link::wire::{decode_window, Body, Carried, Data, Frame, Open, Short};
    use crate::link::Window;
    let mut input = Input(data);
    if input.byte() == 0 {
        let rest = input.rest();
        if let Ok(f) = Frame::decode(rest) {
            assert_eq!(f.encode(), rest, "a frame decodes one way only");
        }
        if let Ok(d) = Data::decode(rest) {
            assert_eq!(d.encode(), rest, "an end's frame decodes one way only");
        }
        if let Ok(f) = Short::decode(rest) {
            assert_eq!([&Short::head(f.seq)[..], f.bytes].concat(), rest, "a short frame decodes one way only");
        }
        if let Some(c) = Carried::decode(rest) {
            assert_eq!(c.encode(), rest, "a moving end decodes one way only");
        }
        if let Some(o) = Open::decode(rest) {
            assert_eq!(o.encode()[..], rest[..]);
        }
        if let Some(w) = decode_window(rest) {
            assert!(w.messages > 0 && w.bytes > 0);
        }
        return;
    }
    let window = Window { messages: 8, bytes: 4096, largest: 4096 };
    let mut stream = Stream::new(window, window);
    while !input.is_empty() {
        let seq = u64::from(input.u16());
        let len = usize::from(input.byte());
        let frame = input.bytes(len);
        let Ok(now) = stream.arrive(seq, frame) else { return };
        let mut due: Vec<Vec<u8>> = if now { vec![frame.to_vec()] } else { Vec::new() };
        due.extend(std::iter::from_fn(|| stream.next_due()));
        for bytes in due {
            let Ok(d) = Data::decode(&bytes) else { return };
            if stream.took_ack(d.ack).is_err() {
                return;
            }
            if let Body::Message { bytes, .. } = d.body {
                if stream.received(bytes.len()).is_err() {
                    return;
                }
                stream.consumed(bytes.len(), false);
            }
        }
    }
}

/// A vector of words as its bytes.
fn bytemuck_bytes(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: any bytes are a valid u8; the length covers exactly the words.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

/// The seed corpora, made by ferry's own encoders (and, for the harnesses
/// that read a program, programs of honest exchanges): what
/// `write_seed_corpora` writes into `fuzz/corpus/<target>/`.
#[cfg(test)]
pub(crate) fn seeds() -> Vec<(&'static str, String, Vec<u8>)> {
    use crate::rpc::envelope as env;
    use crate::wire::Checkpoint;
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let mut add = |target: &'static str, name: &str, bytes: Vec<u8>| out.push((target, name.to_string(), bytes));
    let ep = |team, slot| Addr::new(1, team, slot).unwrap();
    let frame_bytes = |h: Header, payload: &[u8]| {
        let mut h = h;
        h.len = payload.len() as u32;
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        let mut v = head.to_vec();
        v.extend_from_slice(payload);
        v
    };
    let descriptor = Range { offset: PAGE, len: 100 }.encode();

    // frame
    let data = Header::new(Kind::Data, ep(7, 1), ep(9, 2), 42).with_checkpoint(Checkpoint::OnReturn);
    add("frame", "data", frame_bytes(data, b"hello"));
    add("frame", "data-immediate", frame_bytes(Header::new(Kind::Data, ep(7, 1), ep(9, 2), 0), b""));
    let mut budget = data.with_checkpoint(Checkpoint::OnDelivery);
    budget.budget_ns = 250_000_000;
    add("frame", "data-deadline", frame_bytes(budget, &[0x92, 1, 2]));
    let mut detached = data;
    detached.flags |= flags::DETACHED;
    add("frame", "data-detached", frame_bytes(detached, &descriptor));
    add(
        "frame",
        "ack",
        frame_bytes(Header::new(Kind::Ack, ep(9, 2), ep(7, 1), 42).with_checkpoint(Checkpoint::OnReceipt), b""),
    );
    add("frame", "reply", frame_bytes(Header::new(Kind::Reply, ep(9, 2), ep(7, 1), 42), &env::ok(&3u32)));
    let mut nack = vec![crate::wire::NackReason::NoSuchEndpoint as u8];
    nack.extend_from_slice(b"no endpoint 1.9.2");
    add("frame", "nack", frame_bytes(Header::new(Kind::Nack, ep(9, 2), ep(7, 1), 42), &nack));
    let mut too_large = vec![crate::wire::NackReason::TooLarge as u8];
    too_large.extend_from_slice(&Nack::too_large(200_000, 100_000));
    add("frame", "nack-too-large", frame_bytes(Header::new(Kind::Nack, ep(9, 2), ep(7, 1), 42), &too_large));
    add("frame", "cancel", frame_bytes(Header::new(Kind::Cancel, ep(7, 1), ep(9, 2), 42), b""));
    add("frame", "release", frame_bytes(Header::new(Kind::Release, Addr::NONE, Addr::NONE, 0), &descriptor));
    add("frame", "tcp-credit", tcp::credit_frame(4096, 1 << 20));
    // shm_descriptors: (tag, op) pairs; ask 1, the peer hands 1 over, take 1.
    let mut opened = vec![0u8];
    opened.extend_from_slice(&4096u64.to_le_bytes());
    opened.extend_from_slice(&1u64.to_le_bytes());
    add("region_open", "opened", opened);
    add("region_open", "denied", vec![2]);
    {
        use crate::memory::ops::{Op, Request};
        use crate::memory::Step;
        let key = [7u8; 16];
        let steps = vec![Step::Index { index: 1, size: 16 }, Step::Field(8), Step::Indirect];
        let ops = [
            ("get", Op::Get { len: 8 }),
            ("put", Op::Put(b"hello")),
            ("swap", Op::Swap(5)),
            ("fetch-add", Op::FetchAdd(1)),
            ("cas", Op::Cas { current: 0, new: 1 }),
            ("path", Op::Path { steps, len: 8 }),
        ];
        for (name, op) in ops {
            let req = Request { key: &key, epoch: 1, offset: 64, op };
            add("region_ops", name, [&[0u8][..], &req.encode()].concat());
        }
        add("region_ops", "answer-word", [&[1u8, 0][..], &7u64.to_le_bytes()].concat());
        add("region_ops", "answer-out-of-bounds", [&[1u8, 4][..], &[0; 16]].concat());
    }
    {
        let opened = crate::fifo::wire::Opened { ring: 1, capacity: 64, element_size: 16 };
        add("fifo", "opened", [&[0u8][..], &opened.encode()].concat());
        add("fifo", "enqueue", [&[1u8][..], &crate::fifo::wire::enqueue(&[7; 16], 1, b"element")].concat());
        // A ring with two elements: tail 2, slot 0 "ab", slot 1 "cde".
        let mut ring = vec![2u8];
        ring.extend_from_slice(&2u64.to_le_bytes());
        ring.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]);
        ring.extend_from_slice(b"ab\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        ring.extend_from_slice(&[3, 0, 0, 0, 0, 0, 0, 0]);
        ring.extend_from_slice(b"cde");
        add("fifo", "ring", ring);
        add("fifo", "credit", [&[3u8][..], &crate::fifo::wire::credit(7)].concat());
        add("signal", "accepted", vec![0]);
        // Two calls on channels 0 and 1, each answered with its own id
        // bent by nothing, a forged answer, then both ended.
        add(
            "call_ids",
            "answered",
            vec![
                0, 0x40, 3, 0, 0, 0, 0, 0, 0, 0, 0, 64, 7, 0, 0, 0, 0, 0, 0, 0, 0, 64, 2, 9, 9, 9, 9, 9, 9, 9, 9, 1, 1,
            ],
        );
        {
            use crate::link::route::{Control, Hop, Moved};
            use crate::link::stream::Stream;
            use crate::link::wire::{Answer, Body, Carried, Data, Frame, Open, Queued, What};
            use crate::link::{Count, LinkId, Side, Window};
            let link = LinkId(9 << 64 | 1);
            let data = |body| Data { ack: Some(Count::default()), body }.encode();
            let frame = |what| Frame { link, to: (Side::B, 1), from: (Side::A, 0), what }.encode();
            let message = data(Body::Message { checkpoint: Checkpoint::OnReturn, call: 1, bytes: b"hello" });
            add(
                "link_frames",
                "message",
                [&[0u8][..], &frame(What::Data { toward: Side::B, seq: 3, data: &message })].concat(),
            );
            let answer = data(Body::Answer { call: 1, answer: Answer::Reply, bytes: b"hi" });
            add("link_frames", "answer", [&[0u8][..], &answer].concat());
            let bare = Data::bare(b"8 bytes!").encode();
            add("link_frames", "bare", [&[0u8][..], &bare].concat());
            let short = [&crate::link::wire::Short::head(3)[..], b"8 bytes!"].concat();
            add("link_frames", "short", [&[0u8][..], &short].concat());
            let hop = Hop { team: TeamId { node: 1, team: 2, incarnation: 3 }, side: Side::A, epoch: 0 };
            add("link_frames", "bypass", [&[0u8][..], &frame(What::Control(Control::Bypass { z: hop }))].concat());
            let window = Window { messages: 64, bytes: 1 << 20, largest: 1 << 20 };
            let open = Open { link: LinkId(5), window };
            add("link_frames", "open", [&[0u8][..], &open.encode()].concat());
            let mut stream = Stream::new(window, window);
            stream.arrive(0, &message).unwrap();
            stream.received(5).unwrap();
            let moved = Moved { proxy: hop, epoch: 1, token: 77 };
            let queue = vec![Queued { checkpoint: Checkpoint::OnReturn, call: 1, bytes: b"hello".to_vec() }];
            let carried = Carried { link, side: Side::A, moved, stream, queue };
            add("link_frames", "carried", [&[0u8][..], &carried.encode()].concat());
            // A program: frames 1 then 0 (out of order), then a close.
            let mut program = vec![1u8];
            let message = data(Body::Message { checkpoint: Checkpoint::Immediate, call: 0, bytes: b"x" });
            for (seq, d) in [(1u16, data(Body::Credit)), (0, message), (2, data(Body::Close))] {
                program.extend_from_slice(&seq.to_le_bytes());
                program.push(d.len() as u8);
                program.extend_from_slice(&d);
            }
            add("link_frames", "stream", program);
        }
        add("signal", "latched", vec![2]);
    }
    add("shm_descriptors", "asked", vec![1, 0, 1, 2, 8, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 3, 1, 4]);
    add("shm_descriptors", "unasked", vec![2, 2, 8, 5, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]);
    let served = Header::new(Kind::Served(200), ep(7, 0), ep(9, 0), 43).with_checkpoint(Checkpoint::OnReturn);
    add("frame", "served", frame_bytes(served, b"abc"));
    let mut routed = Route { id: 0x0001_0002_0080_0001, seq: 17 }.encode().to_vec();
    routed.extend_from_slice(b"on a link");
    add("frame", "served-routed", frame_bytes(Header::new(Kind::Served(128), ep(7, 0), ep(9, 0), 0), &routed));
    let not_served = [crate::wire::NackReason::NotServed as u8, 200];
    add("frame", "nack-not-served", frame_bytes(Header::new(Kind::Nack, ep(9, 0), ep(7, 0), 43), &not_served));

    // codec
    let record = Record {
        id: EndpointId::at(ep(7, 3), 0xabcd),
        name: "x".into(),
        tags: vec!["a".into(), "bc".into()],
        counts: [("k".to_string(), 7u64)].into_iter().collect(),
        shape: Shape::Struct { a: vec![1, 2], b: Some(Box::new(Shape::Tuple(-1, "t".into()))) },
        flag: Some(true),
    };
    let enc = |v: &dyn erased::Encode| v.encode();
    add("codec", "descriptor", enc(&sample_descriptor()));
    add("codec", "record", enc(&record));
    add("codec", "shape-unit", enc(&Shape::Unit));
    add("codec", "shape-new", enc(&Shape::New(7)));
    add("codec", "endpoint", enc(&EndpointId::at(ep(7, 3), 1)));
    add("codec", "tuple", enc(&(1u32, "two".to_string(), vec![3u8, 4])));
    add("codec", "options", enc(&vec![Some(-1i64), None, Some(1 << 40)]));
    add("codec", "map", enc(&[("a".to_string(), vec![1u32, 2])].into_iter().collect::<HashMap<_, _>>()));
    add("codec", "scalars", enc(&('é', true, u128::MAX, -2i16)));
    add("codec", "floats", enc(&(1.5f64, -0.25f32)));
    let blob = Blob { id: 9, data: vec![1, 2, 3], view: vec![4u8; 300].into(), parts: vec![(&b"ab"[..]).into()] };
    add("codec", "blob", enc(&blob));
    add("codec", "bin", enc(&vec![7u8; 40]));
    add("codec", "value", enc(&serde_json::json!({"a": [1, -2, 3.5, null, true], "b": {"c": "d"}})));

    // rpc
    add("rpc", "call", env::call(0, &(1i32, 2i32)).unwrap());
    add("rpc", "call-byte-array", env::call(0, &(BytesRef(&[1, 2, 3, 4]),)).unwrap());
    let mut once = Vec::new();
    env::call_once_into(9, 0, &(3i32, 4i32), &mut once).unwrap();
    add("rpc", "call-once", once);
    let (mut batch, mut n) = (Vec::new(), 0);
    env::push_batch_entry(&mut batch, &mut n, 0, &wire_codec::encode(&(1i32, 2i32)).unwrap());
    env::push_batch_entry(&mut batch, &mut n, 1, &wire_codec::encode(&()).unwrap());
    env::push_batch_entry(&mut batch, &mut n, env::FLUSH, &[]);
    add("rpc", "batch", batch);
    let mut bind = vec![env::BIND];
    wire_codec::encode_into(&sample_descriptor(), &mut bind).unwrap();
    add("rpc", "bind", bind);
    add("rpc", "ok", env::ok(&(7u32, "seven")));
    add("rpc", "remote", env::encoded(env::REMOTE, &Shape::New(3), "error"));
    for (name, code) in [
        ("panicked", env::PANICKED),
        ("cancelled", env::CANCELLED),
        ("deadline", env::DEADLINE),
        ("refused", env::REFUSED),
        ("codec-error", env::CODEC),
        ("mismatch", env::MISMATCH),
    ] {
        add("rpc", name, env::status(code, "why"));
    }
    add("rpc", "no-method", env::no_such_method(7));
    add("rpc", "limit", env::limit(crate::Limit::BatchCalls, 13_107));
    // A batch that counts more calls than its size allows.
    let mut many = vec![env::BATCH];
    many.extend_from_slice(&u32::MAX.to_le_bytes());
    many.extend_from_slice(&[0u8; 16]);
    add("rpc", "batch-too-many", many);

    // shm_handshake
    let hello = shm::hello_bytes(shm::HELLO, PEER, 4096, 16 * PAGE);
    let mut acceptor = vec![0, hello.len() as u8];
    acceptor.extend_from_slice(&hello);
    acceptor.extend_from_slice(&shm::segment_header(4096, 16 * PAGE));
    add("shm_handshake", "hello", acceptor);
    let big = shm::hello_bytes(shm::HELLO, PEER, MAX_RING as u32, shm::MAX_AREA);
    let mut acceptor = vec![0, big.len() as u8];
    acceptor.extend_from_slice(&big);
    acceptor.extend_from_slice(&shm::segment_header(MAX_RING, shm::MAX_AREA));
    add("shm_handshake", "hello-largest", acceptor);
    let welcome = shm::hello_bytes(shm::WELCOME, PEER, 4096, 16 * PAGE);
    let mut connector = vec![1, welcome.len() as u8];
    connector.extend_from_slice(&welcome);
    add("shm_handshake", "welcome", connector);

    // shm_ring: programs of honest exchanges.
    let push = |p: &mut Vec<u8>, kind: Kind, fl: u16, payload: &[u8]| {
        p.push(ring_op::PUSH);
        p.extend_from_slice(&(payload.len() as u16).to_le_bytes());
        p.push(kind.to_u8());
        p.extend_from_slice(&ep(7, 1).bits().to_le_bytes());
        p.extend_from_slice(&ep(9, 2).bits().to_le_bytes());
        p.extend_from_slice(&42u64.to_le_bytes());
        p.extend_from_slice(&fl.to_le_bytes());
        p.extend_from_slice(&[1, 1]);
        p.extend_from_slice(payload);
    };
    let program = |cap_sel: u8, pages: u8, start: u64| {
        let mut p = vec![cap_sel, pages];
        p.extend_from_slice(&start.to_le_bytes());
        p
    };
    let mut p = program(4, 1, 0);
    push(&mut p, Kind::Data, 0, b"hello");
    p.extend_from_slice(&[ring_op::RECV, 0, ring_op::TIDY, ring_op::RECV, 0]);
    add("shm_ring", "one-frame", p);
    // Records across the end of the ring (padding), on a lap far from 0.
    let mut p = program(0, 1, (0xFFFF_FFFFu64 << 8) + 3 * 64);
    for i in 0..6u8 {
        push(&mut p, Kind::Data, (Checkpoint::OnReceipt as u16) << flags::CHECKPOINT_SHIFT, &[i; 12]);
        p.extend_from_slice(&[ring_op::RECV, 0]);
    }
    add("shm_ring", "wrap", p);
    // A large payload from the peer: taken, held, given back, the release read.
    let mut p = program(2, 2, 0);
    p.extend_from_slice(&[ring_op::SCRIBBLE_AREA, 0, 0, 8]);
    p.extend_from_slice(b"payload!");
    push(&mut p, Kind::Data, flags::DETACHED, &Range { offset: 0, len: 8 }.encode());
    push(&mut p, Kind::Data, flags::DETACHED, &Range { offset: PAGE, len: 5000 }.encode());
    p.extend_from_slice(&[ring_op::RECV, 2, ring_op::RECV, 0, ring_op::DROP_HELD, 0, ring_op::TIDY]);
    p.extend_from_slice(&[ring_op::PEER_READS, ring_op::PEER_READS, ring_op::RECV, 0]);
    add("shm_ring", "detached", p);
    // A large payload from the end: lent, read by the peer, given back.
    let mut p = program(3, 3, 0);
    p.extend_from_slice(&[ring_op::SEND_LARGE, 0x10, 0x20, Kind::Data.to_u8()]);
    p.extend_from_slice(&[0; 26]);
    p.extend_from_slice(&[ring_op::SEND_SMALL, 3, Kind::Reply.to_u8()]);
    p.extend_from_slice(&[0; 26]);
    p.extend_from_slice(b"abc");
    p.extend_from_slice(&[ring_op::PEER_READS, ring_op::PEER_READS, ring_op::PEER_RELEASES, 0, 0]);
    p.extend_from_slice(&[ring_op::RECV, 0, ring_op::PROBE, ring_op::SEND_LARGE, 0, 0x30, 1]);
    p.extend_from_slice(&[0; 26]);
    add("shm_ring", "lend-and-release", p);
    let mut p = program(1, 1, 64);
    push(&mut p, Kind::Ack, 0, b"");
    p.extend_from_slice(&[ring_op::SCRIBBLE_WORD, 2, 0]);
    p.extend_from_slice(&(1u64 << 32 | 64).to_le_bytes());
    p.extend_from_slice(&[ring_op::RECV, 0, ring_op::RECV, 0, ring_op::CLOSE, ring_op::RECV, 0]);
    add("shm_ring", "scribbled-stamp", p);
    // A stamp on the right lap whose record would run past the end of the ring.
    let mut p = program(1, 1, 448);
    p.extend_from_slice(&[ring_op::STAMP, 0]);
    p.extend_from_slice(&128u32.to_le_bytes());
    p.extend_from_slice(&[0, ring_op::RECV, 0]);
    add("shm_ring", "stamp-past-the-end", p);

    // shm_area
    let mut p = vec![0, 7, area_op::LEND];
    p.extend_from_slice(&100u32.to_le_bytes());
    p.push(area_op::LEND);
    p.extend_from_slice(&(2 * PAGE as u32 + 1).to_le_bytes());
    p.extend_from_slice(&[area_op::RELEASE_LENT, 0, area_op::RELEASE_RAW]);
    p.extend_from_slice(&Range { offset: PAGE, len: 2 * PAGE + 1 }.encode());
    p.extend_from_slice(&[8, area_op::COOL, 20, 0]);
    add("shm_area", "lend-release", p);
    let mut p = vec![1];
    p.extend_from_slice(&(20_000u32).to_le_bytes());
    p.push(area_op::LEND);
    p.extend_from_slice(&(70u64 << 20).to_le_bytes());
    p.extend_from_slice(&[area_op::RELEASE_LENT, 0, area_op::COOL, 20, 0]);
    add("shm_area", "cool", p);

    // tcp_handshake
    let nonce = [7u8; 16];
    let grant = Grant { frames: 1 << 16, detached: 1 << 30 };
    let hello = handshake::hello_bytes(handshake::HELLO, PEER, ME, grant, &[9; 16]);
    let welcome = handshake::welcome_bytes(KEY, &hello, handshake::WELCOME, ME, OUR_GRANT, &nonce);
    let mut acceptor = vec![0];
    acceptor.extend_from_slice(&hello);
    acceptor.extend_from_slice(&handshake::proof_bytes(KEY, &hello, &welcome));
    add("tcp_handshake", "acceptor", acceptor);
    let mut signed = vec![2];
    signed.extend_from_slice(&hello);
    add("tcp_handshake", "acceptor-signed", signed);
    let ours =
        handshake::hello_bytes(handshake::HELLO, ME, PEER, Grant { frames: handshake::MIN_GRANT, detached: 0 }, &nonce);
    let theirs = handshake::welcome_bytes(KEY, &ours, handshake::WELCOME, PEER, grant, &[5; 16]);
    for (name, mode, verdict) in [
        ("connector", 1u8, handshake::ACCEPTED),
        ("connector-refused", 1, handshake::NOT_AUTHENTICATED),
        ("connector-signed", 3, handshake::ACCEPTED),
    ] {
        let mut c = vec![mode];
        c.extend_from_slice(&theirs);
        c.extend_from_slice(verdict);
        add("tcp_handshake", name, c);
    }

    // tcp_frames: a stream as a TCP end writes it, read in two pieces.
    let mut stream = frame_bytes(data, b"hello");
    stream.extend_from_slice(&tcp::credit_frame(1000, 0));
    stream.extend_from_slice(&frame_bytes(detached, &[0xAB; 300]));
    stream.extend_from_slice(&tcp::credit_frame(0, 0));
    stream.extend_from_slice(&frame_bytes(Header::new(Kind::Ack, ep(9, 2), ep(7, 1), 42), b""));
    let read = |p: &mut Vec<u8>, bytes: &[u8]| {
        p.push(tcp_op::READ);
        p.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        p.extend_from_slice(bytes);
    };
    let mut p = vec![0, 128 + 12];
    read(&mut p, &stream[..70]);
    p.extend_from_slice(&[tcp_op::KEEP, tcp_op::TAKE]);
    read(&mut p, &stream[70..]);
    p.extend_from_slice(&[tcp_op::TAKE, tcp_op::RETURN_CREDIT, tcp_op::TAKE, tcp_op::TAKE]);
    add("tcp_frames", "stream", p);
    let mut p = vec![0, 0];
    let small = frame_bytes(data, &[1; 1000]);
    for _ in 0..5 {
        read(&mut p, &small);
        p.push(tcp_op::TAKE);
    }
    p.push(tcp_op::RETURN_CREDIT);
    read(&mut p, &small);
    add("tcp_frames", "credit", p);
    // A large payload (past `OWN_BUFFER`) read into its own buffer, in
    // pieces, a small frame after it; kept once, then taken.
    let mut big = frame_bytes(detached, &[0xCD; 100_000]);
    big.extend_from_slice(&frame_bytes(data, b"after"));
    let mut p = vec![0, 128 + 20];
    for piece in big.chunks(60_000) {
        read(&mut p, piece);
    }
    p.extend_from_slice(&[tcp_op::KEEP, tcp_op::TAKE, tcp_op::TAKE, tcp_op::RETURN_CREDIT]);
    add("tcp_frames", "large", p);

    // names_query
    let query = remote::query_bytes(KEY, &[1; 16], "echo");
    let mut q = vec![0];
    q.extend_from_slice(&query[8..]);
    add("names_query", "query", q);
    let mut q = vec![2];
    q.extend_from_slice(&query[8..query.len() - remote::MAC_LEN]);
    add("names_query", "query-signed", q);
    let asked = remote::query_bytes(KEY, &[3; 16], "echo");
    let asked = &asked[..asked.len() - remote::MAC_LEN];
    for (name, mode, found) in [
        ("answer", 1u8, Some(EndpointId::at(ep(7, 3), 0xabcd))),
        ("answer-not-found", 1, None),
        ("answer-signed", 3, Some(EndpointId::at(ep(7, 3), 0xabcd))),
    ] {
        let mut a = vec![mode];
        a.extend_from_slice(&remote::answer_bytes(KEY, asked, found));
        add("names_query", name, a);
    }
    let mut a = vec![1];
    a.extend_from_slice(remote::REFUSED);
    add("names_query", "answer-refused", a);
    let mut a = vec![1];
    a.extend_from_slice(&crate::Limit::Handshakes.refusal(handshake::REFUSED, 8));
    add("names_query", "answer-limit", a);

    // etcd: answers in the JSON gateway's format (captured ones from a real
    // etcd sit beside them in the corpus, named `etcd-3.4-*`).
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    let value = b64("1.4242.7#0000abcd");
    let http = |mode: u8, body: &str| {
        let mut v = vec![mode];
        v.extend_from_slice(
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len())
                .as_bytes(),
        );
        v
    };
    let header = r#"{"cluster_id":"1","member_id":"2","revision":"5","raft_term":"2"}"#;
    add("etcd", "lease-grant", http(0, &format!(r#"{{"header":{header},"ID":"7587862","TTL":"10"}}"#)));
    add("etcd", "keepalive", http(0, &format!(r#"{{"result":{{"header":{header},"ID":"7587862","TTL":"10"}}}}"#)));
    add(
        "etcd",
        "txn-taken",
        http(
            0,
            &format!(
                r#"{{"header":{header},"responses":[{{"response_range":{{"header":{header},"kvs":[{{"key":"{}","create_revision":"4","mod_revision":"4","version":"1","value":"{value}","lease":"7587862"}}],"count":"1"}}}}]}}"#,
                b64("/ferry/names/echo")
            ),
        ),
    );
    add(
        "etcd",
        "txn-ok",
        http(
            0,
            &format!(
                r#"{{"header":{header},"succeeded":true,"responses":[{{"response_put":{{"header":{header}}}}}]}}"#
            ),
        ),
    );
    add(
        "etcd",
        "range",
        http(0, &format!(r#"{{"header":{header},"kvs":[{{"key":"a2V5","value":"{value}"}}],"count":"1"}}"#)),
    );
    add("etcd", "refused", b"\0HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n".to_vec());
    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n", s.len());
    let watch = format!(
        "\x01HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{}{}{}0\r\n\r\n",
        chunk(&format!(r#"{{"result":{{"header":{header},"created":true}}}}"#)),
        chunk(&format!(r#"{{"result":{{"header":{header},"events":[{{"type":"DELETE","kv":{{"key":"a2V5"}}}}]}}}}"#)),
        chunk(&format!(r#"{{"result":{{"header":{header},"events":[{{"kv":{{"key":"a2V5","value":"{value}"}}}}]}}}}"#)),
    );
    add("etcd", "watch", watch.into_bytes());
    let compacted = format!(
        "\x01HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{}",
        chunk(&format!(r#"{{"result":{{"header":{header},"canceled":true,"compact_revision":"9"}}}}"#)),
    );
    add("etcd", "watch-compacted", compacted.into_bytes());
    add("etcd", "endpoint-id", b"\x021.4242.7#0000abcd".to_vec());

    // handover
    let hello = handshake::hello_bytes(handshake::HELLO, PEER, ME, grant, &[9; 16]);
    let mut h = vec![1];
    h.extend_from_slice(&crate::runtime::reactor::handed_over_bytes(&crate::runtime::reactor::Handed::Hello(hello)));
    add("handover", "hello", h);
    let mut h = vec![1];
    h.extend_from_slice(&crate::runtime::reactor::handed_over_bytes(&crate::runtime::reactor::Handed::Tls(ME)));
    add("handover", "tls", h);

    // settings: the defaults (all zeros but the selectors), the largest
    // allowed, and past them.
    add("settings", "zeros", vec![0; 160]);
    // Each field in the harness's order: a u64, or a duration as a
    // selector byte (0: nanoseconds) and a u64.
    let (n, d) = (|v: u64| v.to_le_bytes().to_vec(), |ns: u64| [vec![0], ns.to_le_bytes().to_vec()].concat());
    let largest = [
        n(1024),
        d(1_000_000_000),
        d(60_000_000_000),
        n(1 << 30),
        n(1 << 30),
        n(u64::MAX),
        n(u64::MAX),
        n(u64::MAX),
        n(u64::MAX),
        n(1 << 36),
        d(u64::MAX),
        n(1024),
        d(86_400_000_000_000),
        d(86_400_000_000_000),
        n(u64::MAX),
        n(u64::MAX),
        n(1 << 20),
        n(1024),
        vec![1],
        d(86_400_000_000_000),
    ];
    let large = largest.concat();
    add("settings", "largest", large.clone());
    // A cluster built in code: a `from` block of 24 bits, then of 200
    // (more than an IPv4 address has: it indexed past the address).
    for (name, bits) in [("cluster", 24), ("cluster-long-block", 200)] {
        add("settings", name, [large.clone(), vec![1, bits, 1], n(8), vec![1]].concat());
    }
    add("settings", "ones", vec![0xff; 160]);
    out
}

// ---------------------------------------------------------------------------
// Settings

/// A duration of any size, `Duration::MAX` included.
fn any_duration(input: &mut Input) -> Duration {
    match input.byte() % 3 {
        0 => Duration::from_nanos(input.u64()),
        1 => Duration::from_millis(input.u32() as u64),
        _ => Duration::new(input.u64(), input.u32() % 1_000_000_000),
    }
}

/// Every `TeamBuilder` setting from the input, then the check
/// `TeamBuilder::start` makes: it must not panic (no overflow, no assert),
/// and settings it lets through must be ones the transports and timers
/// take (they asserted on some, or overflowed, at the first connect).
pub fn settings(data: &[u8]) {
    let mut input = Input(data);
    let b = crate::TeamBuilder::default()
        .processors(input.u64() as usize)
        .spin(any_duration(&mut input))
        .park_timeout(any_duration(&mut input))
        .ring_bytes(input.u64() as usize)
        .max_ring_bytes(input.u64() as usize)
        .inbox_capacity(input.u64() as usize)
        .inbox_bytes(input.u64() as usize)
        .hold_capacity(input.u64() as usize)
        .hold_bytes(input.u64() as usize)
        .max_message(input.u64() as usize)
        .shutdown_grace(any_duration(&mut input))
        .blocking_threads(input.u64() as usize)
        .blocking_idle(any_duration(&mut input))
        .peer_timeout(any_duration(&mut input))
        .max_names(input.u64() as usize)
        .max_channels(input.u64() as usize)
        .max_running_calls(input.u64() as usize)
        .handshakes_per_source(input.u64() as usize)
        .handoff_after(any_duration(&mut input))
        .max_replacements(input.u64() as usize);
    let b = if input.byte() & 1 == 1 { b.etcd(([127, 0, 0, 1], 2379).into(), any_duration(&mut input)) } else { b };
    // A cluster built in code, with a `from` block of any bits (a public
    // field): a block never panics, whatever it is asked.
    let (v4, v6) = (std::net::IpAddr::from([10, 0, 0, 1]), std::net::IpAddr::from([0xfe80, 0, 0, 0, 0, 0, 0, 1]));
    let block = crate::Cidr { addr: if input.byte() & 1 == 1 { v4 } else { v6 }, bits: input.byte() };
    let _ = (block.contains(v4), block.contains(v6));
    let b = match input.byte() & 1 {
        1 => b.cluster(crate::Cluster {
            node: 1,
            listen: ([127, 0, 0, 1], 1).into(),
            peers: [(2, ([127, 0, 0, 2], 1).into())].into(),
            key: std::sync::Arc::from(&[7u8; 32][..]),
            tls: None,
            from: [(2, vec![block])].into(),
            handshakes_per_source: Some(input.u64() as usize).filter(|_| input.byte() & 1 == 1),
        }),
        _ => b,
    };
    let Ok(cfg) = b.checked() else { return };
    if let Some(c) = &cfg.cluster {
        assert!(c.from.values().flatten().all(|b| b.bits <= if b.addr.to_canonical().is_ipv4() { 32 } else { 128 }));
        assert!(c.handshakes_per_source.is_none_or(|n| (1..=crate::runtime::MAX_THREADS).contains(&n)));
    }
    // A shared-memory bind maps what it asks for; a TCP peer takes the grant.
    let area = shm::area_for(cfg.max_message);
    assert!(shm::layout_ok(cfg.ring_bytes, area), "ring {} area {area}", cfg.ring_bytes);
    assert!(shm::layout_ok(cfg.max_ring_bytes.next_power_of_two(), 0), "max ring {}", cfg.max_ring_bytes);
    let _ = shm::segment_len(cfg.ring_bytes, area);
    assert!(handshake::grant_ok(Grant { frames: cfg.ring_bytes, detached: cfg.max_message }));
    // The heartbeat timer, the etcd lease and the deadlines made of them.
    assert!(rustix::time::Timespec::try_from(cfg.peer_timeout / 4).is_ok());
    assert!(i64::try_from(cfg.names_ttl.as_secs()).is_ok());
    let now = std::time::Instant::now();
    for d in [cfg.spin, cfg.park_timeout, cfg.blocking_idle, cfg.peer_timeout, cfg.handoff_after] {
        assert!(now.checked_add(d).is_some(), "{d:?}");
    }
}

/// Encoding a value of any type into the codec's bytes (for the seeds).
#[cfg(test)]
mod erased {
    pub trait Encode {
        fn encode(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encode(&self) -> Vec<u8> {
            crate::wire::codec::encode(self).expect("a seed encodes")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// `fuzz/` at the repository's root.
    fn fuzz_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
    }

    fn harness(target: &str) -> Harness {
        TARGETS.iter().find(|(t, _)| *t == target).unwrap_or_else(|| panic!("no harness {target}")).1
    }

    /// Writes the seed corpora into `fuzz/corpus/<target>/` (run it after a
    /// change to an encoder or a harness's input format, and commit them):
    /// `cargo test -p ferry --lib write_seed_corpora -- --ignored`.
    #[test]
    #[ignore]
    fn write_seed_corpora() {
        for (target, name, bytes) in seeds() {
            let dir = fuzz_dir().join("corpus").join(target);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
        }
    }

    /// Every seed, every committed corpus file and every input of a fixed
    /// bug (`fuzz/regressions/<target>/`) passes its harness.
    #[test]
    fn seeds_corpora_and_regressions_pass_the_harnesses() {
        let seeds = seeds();
        for (target, _) in TARGETS {
            assert!(seeds.iter().any(|(t, ..)| t == target), "no seed for {target}");
        }
        for (target, name, bytes) in &seeds {
            let run = harness(target);
            run(bytes);
            let committed = fuzz_dir().join("corpus").join(target).join(format!("seed-{name}"));
            assert_eq!(
                std::fs::read(&committed).ok().as_ref(),
                Some(bytes),
                "{} is not the seed ferry's encoders make now: run write_seed_corpora",
                committed.display()
            );
        }
        let mut files = 0;
        for kind in ["corpus", "regressions"] {
            for (target, run) in TARGETS {
                let Ok(dir) = std::fs::read_dir(fuzz_dir().join(kind).join(target)) else { continue };
                for f in dir {
                    let path = f.unwrap().path();
                    run(&std::fs::read(&path).unwrap());
                    files += 1;
                }
            }
        }
        assert!(files >= seeds.len());
    }

    /// The shared-memory harness really reaches the end's receive path: an
    /// honest frame comes out whole.
    #[test]
    fn the_ring_harness_delivers_an_honest_frame() {
        let seeds = seeds();
        let (.., one) = seeds.iter().find(|(t, n, _)| *t == "shm_ring" && n == "one-frame").unwrap();
        shm_ring(one);
    }
}
