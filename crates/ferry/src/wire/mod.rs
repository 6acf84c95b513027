//! Wire format: the frame every transport carries. See `docs/WIRE.md`.
//!
//! A frame is a fixed 40-byte header (little-endian) followed by `len` payload
//! bytes. The header is decoded from a private copy and validated before any
//! field is used: a peer can send anything.

pub mod codec;

use crate::id::Addr;

/// Version of the frame layout; a frame with another version is a protocol error.
pub const VERSION: u8 = 3;
/// Size of the encoded header in bytes.
pub const HEADER_LEN: usize = 40;

/// Kind bytes of served frames: each primitive built on the core (remote
/// memory, fifos, signals, links, ...) takes a range of them and registers a
/// handler for it (`crate::extend`). Below them are the core's own kinds.
pub const SERVED_KINDS: std::ops::RangeInclusive<u8> = 64..=255;

/// What a frame is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A message for the port `dst`.
    Data,
    /// "Checkpoint reached" for the send with `call_id` (flags say which checkpoint).
    Ack,
    /// The reply to the `OnReturn` send with `call_id`; payload is the reply.
    Reply,
    /// The send with `call_id` failed at the receiver; payload is a `NackReason` byte then UTF-8 text.
    Nack,
    /// The sender of `call_id` gave up waiting: stop working on it (no answer is read).
    Cancel,
    /// Gives a range of the payload area back to its writer (a transport's
    /// own frame: payload `{offset u64, len u64}`; never reaches the runtime).
    Release,
    /// A frame of a primitive's own (a byte of [`SERVED_KINDS`]): its
    /// handler runs it in the receiving team's progress loop, and answers
    /// it as a Data frame is answered (Ack, Reply, Nack with its `call_id`).
    Served(u8),
}

impl Kind {
    /// Whether a frame of this kind is a request (a port's message, a
    /// primitive's frame) rather than an answer or a transport's own frame.
    pub fn is_request(self) -> bool {
        matches!(self, Kind::Data | Kind::Served(_))
    }

    /// The kind of a header's kind byte; `None` if no kind has it.
    pub fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Ack,
            3 => Kind::Reply,
            4 => Kind::Nack,
            6 => Kind::Cancel,
            7 => Kind::Release,
            v if SERVED_KINDS.contains(&v) => Kind::Served(v),
            _ => return None,
        })
    }

    /// The kind byte.
    pub fn to_u8(self) -> u8 {
        match self {
            Kind::Data => 1,
            Kind::Ack => 2,
            Kind::Reply => 3,
            Kind::Nack => 4,
            Kind::Cancel => 6,
            Kind::Release => 7,
            Kind::Served(v) => v,
        }
    }
}

/// The first bytes of a *routed* frame's payload: the route it travels on
/// (a link, a group) and its number there. Routed kinds are served kinds
/// whose primitive says so; the prefix is decoded here, once, for all of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// The link's or group's id (its primitive's name space): 128 bits,
    /// so an id made from its origin team's incarnation and a counter is
    /// unique for the route's life wherever its ends go.
    pub id: u128,
    /// The frame's sequence number on that route, in each direction.
    pub seq: u64,
}

impl Route {
    /// Bytes of the prefix.
    pub const LEN: usize = 24;

    /// The route at the start of `payload`, and the bytes after it.
    pub fn split(payload: &[u8]) -> Result<(Route, &[u8]), HeaderError> {
        let (head, rest) = payload.split_at_checked(Route::LEN).ok_or(HeaderError::Route(payload.len()))?;
        let id = u128::from_le_bytes(head[..16].try_into().expect("16 bytes"));
        let seq = u64::from_le_bytes(head[16..].try_into().expect("8 bytes"));
        Ok((Route { id, seq }, rest))
    }

    /// The prefix's bytes.
    pub fn encode(&self) -> [u8; Route::LEN] {
        let mut b = [0u8; Route::LEN];
        b[..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..].copy_from_slice(&self.seq.to_le_bytes());
        b
    }
}

/// Header flags.
pub mod flags {
    /// The payload is out of band: the frame carries a descriptor of it
    /// (shared memory: `{offset u64, len u64}` in the sender's payload area).
    pub const DETACHED: u16 = 1 << 0;
    /// Bits 1..=2: the completion checkpoint the sender asked for (see [`super::Checkpoint`]).
    pub const CHECKPOINT_SHIFT: u16 = 1;
    /// The bits of the checkpoint.
    pub const CHECKPOINT_MASK: u16 = 0b11 << CHECKPOINT_SHIFT;
    /// Descriptors (shared-memory segments handed over after the bind, on
    /// the shared-memory bind socket): on a served frame, the sender takes
    /// them in the answer; on a Reply, they were sent before it, tagged with
    /// its `call_id`.
    pub const HANDOVER: u16 = 1 << 3;
    /// Every other bit must be zero in version 3.
    pub const KNOWN: u16 = DETACHED | CHECKPOINT_MASK | HANDOVER;
}

/// When a send counts as complete (DESIGN §1, StarMod §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Checkpoint {
    /// Buffered locally (in the channel); the sender learns nothing more.
    Immediate = 0,
    /// The receiving team's runtime has taken it off the channel into the port.
    OnReceipt = 1,
    /// A receiving task has taken it from the port.
    OnDelivery = 2,
    /// The receiving task replied; the completion carries the reply.
    OnReturn = 3,
}

impl Checkpoint {
    fn from_bits(b: u16) -> Checkpoint {
        match b & 0b11 {
            0 => Checkpoint::Immediate,
            1 => Checkpoint::OnReceipt,
            2 => Checkpoint::OnDelivery,
            _ => Checkpoint::OnReturn,
        }
    }
}

/// Why a receiver refused a send (first payload byte of a `Nack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NackReason {
    NoSuchEndpoint = 1,
    /// The message was dropped without the reply `OnReturn` asked for.
    NoReply = 2,
    TooLarge = 3,
    /// A served frame of a kind no handler serves here.
    NotServed = 4,
    Other = 255,
}

impl NackReason {
    pub fn from_u8(v: u8) -> NackReason {
        match v {
            1 => NackReason::NoSuchEndpoint,
            2 => NackReason::NoReply,
            3 => NackReason::TooLarge,
            4 => NackReason::NotServed,
            _ => NackReason::Other,
        }
    }
}

/// What a `Nack`'s payload (a peer's bytes) says: its reason byte, then
/// for `TooLarge` the message's size and the receiver's `max_message`
/// (u64 LE each), for `NotServed` the kind byte, for the other reasons UTF-8 text (`Other`: the peer's
/// only account of why; the others' text is not read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Nack<'a> {
    NoSuchEndpoint,
    NoReply,
    /// No handler for the frame's kind (the byte after the reason).
    NotServed(u8),
    TooLarge {
        len: u64,
        max: u64,
    },
    /// An unknown reason (or a `TooLarge` without its numbers): the text after the reason byte.
    Other(&'a [u8]),
}

impl<'a> Nack<'a> {
    /// Reads a nack's payload.
    pub fn parse(p: &'a [u8]) -> Nack<'a> {
        let body = p.get(1..).unwrap_or_default();
        match p.first().map(|b| NackReason::from_u8(*b)) {
            Some(NackReason::NoSuchEndpoint) => Nack::NoSuchEndpoint,
            Some(NackReason::NoReply) => Nack::NoReply,
            Some(NackReason::NotServed) if !body.is_empty() => Nack::NotServed(body[0]),
            Some(NackReason::TooLarge) if body.len() == 16 => Nack::TooLarge {
                len: u64::from_le_bytes(body[..8].try_into().expect("8 bytes")),
                max: u64::from_le_bytes(body[8..].try_into().expect("8 bytes")),
            },
            _ => Nack::Other(body),
        }
    }

    /// What follows the reason byte of a `TooLarge` nack.
    pub fn too_large(len: u64, max: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&len.to_le_bytes());
        b[8..].copy_from_slice(&max.to_le_bytes());
        b
    }
}

/// A decoded, validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// What the frame is for.
    pub kind: Kind,
    /// Bits of [`flags`].
    pub flags: u16,
    /// Payload bytes that follow this header in this frame.
    pub len: u32,
    /// The sending endpoint; its node and team must be the channel's peer.
    pub src: Addr,
    /// The receiving endpoint; its node and team must be the receiving team.
    pub dst: Addr,
    /// Names the send this frame belongs to; 0 when the sender wants no answer.
    pub call_id: u64,
    /// Time left to the sender's deadline when the frame was sent, in ns; 0 = none.
    pub budget_ns: u64,
}

/// Why a header was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Fewer bytes than a header (how many).
    #[error("frame too short ({0} bytes)")]
    Short(usize),
    /// A version other than this build's (`VERSION`).
    #[error("unknown frame version {0}")]
    Version(u8),
    /// A kind byte no [`Kind`] has.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A routed frame's payload shorter than its [`Route`] (its length).
    #[error("a routed frame's payload of {0} bytes has no room for its route")]
    Route(usize),
    /// Flag bits outside [`flags::KNOWN`] (the whole flags word).
    #[error("unknown flags {0:#x}")]
    Flags(u16),
    /// The header's length is not that of the payload that follows it.
    #[error("frame length {len} does not match the {avail} bytes carried")]
    Length {
        /// The length the header says.
        len: u32,
        /// The bytes after the header.
        avail: usize,
    },
}

impl Header {
    /// A header of `kind` from `src` to `dst`: no flags (checkpoint
    /// `Immediate`), no payload, no deadline.
    pub fn new(kind: Kind, src: Addr, dst: Addr, call_id: u64) -> Header {
        Header { kind, flags: 0, len: 0, src, dst, call_id, budget_ns: 0 }
    }

    /// The checkpoint in the flags.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint::from_bits(self.flags >> flags::CHECKPOINT_SHIFT)
    }

    /// The same header asking for checkpoint `c`.
    pub fn with_checkpoint(mut self, c: Checkpoint) -> Header {
        self.flags = (self.flags & !flags::CHECKPOINT_MASK) | ((c as u16) << flags::CHECKPOINT_SHIFT);
        self
    }

    /// Whether the frame may be answered (an ack, a reply, a nack): it
    /// names a call, or asks for a checkpoint past `Immediate`.
    pub fn may_need_answer(&self) -> bool {
        self.call_id != 0 || self.checkpoint() != Checkpoint::Immediate
    }

    /// Whether the payload is out of band (see [`flags::DETACHED`]).
    pub fn detached(&self) -> bool {
        self.flags & flags::DETACHED != 0
    }

    /// Encodes into the first `HEADER_LEN` bytes of `out`.
    pub fn encode(&self, out: &mut [u8; HEADER_LEN]) {
        out[0] = VERSION;
        out[1] = self.kind.to_u8();
        out[2..4].copy_from_slice(&self.flags.to_le_bytes());
        out[4..8].copy_from_slice(&self.len.to_le_bytes());
        out[8..16].copy_from_slice(&self.src.bits().to_le_bytes());
        out[16..24].copy_from_slice(&self.dst.bits().to_le_bytes());
        out[24..32].copy_from_slice(&self.call_id.to_le_bytes());
        out[32..40].copy_from_slice(&self.budget_ns.to_le_bytes());
    }

    /// Decodes and validates a header; `frame` is the whole frame (header and payload).
    pub fn decode(frame: &[u8]) -> Result<Header, HeaderError> {
        let h = Header::decode_head(frame)?;
        let avail = frame.len() - HEADER_LEN;
        if h.len as usize != avail {
            return Err(HeaderError::Length { len: h.len, avail });
        }
        Ok(h)
    }

    /// Decodes and validates a header from the frame's first `HEADER_LEN`
    /// bytes, its payload not there yet (a TCP reader reads a large one
    /// straight into a buffer of its own); the bytes past them are ignored.
    pub fn decode_head(frame: &[u8]) -> Result<Header, HeaderError> {
        if frame.len() < HEADER_LEN {
            return Err(HeaderError::Short(frame.len()));
        }
        let u16_at = |i: usize| u16::from_le_bytes([frame[i], frame[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(frame[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(frame[i..i + 8].try_into().unwrap());
        if frame[0] != VERSION {
            return Err(HeaderError::Version(frame[0]));
        }
        let kind = Kind::from_u8(frame[1]).ok_or(HeaderError::Kind(frame[1]))?;
        let flags = u16_at(2);
        if flags & !flags::KNOWN != 0 {
            return Err(HeaderError::Flags(flags));
        }
        let len = u32_at(4);
        Ok(Header {
            kind,
            flags,
            len,
            src: Addr::from_bits(u64_at(8)),
            dst: Addr::from_bits(u64_at(16)),
            call_id: u64_at(24),
            budget_ns: u64_at(32),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A too-large nack carries the numbers, and the sender reads them
    /// back (it used to carry them as text, read as `Refused`); without
    /// its 16 bytes it is read as the peer's words.
    #[test]
    fn nacks_read_back_their_reason() {
        let mut p = vec![NackReason::TooLarge as u8];
        p.extend_from_slice(&Nack::too_large(200_000, 100_000));
        assert_eq!(Nack::parse(&p), Nack::TooLarge { len: 200_000, max: 100_000 });
        assert_eq!(Nack::parse(&p[..10]), Nack::Other(&p[1..10]));
        assert_eq!(Nack::parse(&[NackReason::NoReply as u8, b'x']), Nack::NoReply);
        assert_eq!(Nack::parse(&[NackReason::NoSuchEndpoint as u8]), Nack::NoSuchEndpoint);
        assert_eq!(Nack::parse(b"\x09why"), Nack::Other(b"why"));
        assert_eq!(Nack::parse(b""), Nack::Other(b""));
        assert_eq!(Nack::parse(&[NackReason::NotServed as u8, 200]), Nack::NotServed(200));
        assert_eq!(Nack::parse(&[NackReason::NotServed as u8]), Nack::Other(b""));
    }

    fn frame(h: &Header, payload: &[u8]) -> Vec<u8> {
        let mut head = [0u8; HEADER_LEN];
        h.encode(&mut head);
        let mut v = head.to_vec();
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn header_round_trips() {
        let mut h = Header::new(Kind::Data, Addr::new(1, 2, 3).unwrap(), Addr::new(4, 5, 6).unwrap(), 99)
            .with_checkpoint(Checkpoint::OnDelivery);
        h.len = 3;
        h.budget_ns = 1234;
        h.flags |= flags::DETACHED;
        let f = frame(&h, b"abc");
        let d = Header::decode(&f).unwrap();
        assert_eq!(d, h);
        assert_eq!(d.checkpoint(), Checkpoint::OnDelivery);
        assert!(d.detached());
    }

    /// Peer input: random and nearly valid frames never panic, and whatever
    /// decodes re-encodes to the same bytes.
    #[test]
    fn decode_survives_random_and_mutated_frames() {
        let mut rng = crate::testing::Rng::new(1);
        let valid = frame(&Header::new(Kind::Data, Addr::new(1, 2, 3).unwrap(), Addr::NONE, 7), b"xyz");
        for i in 0..200_000 {
            let input = if i % 2 == 0 { rng.bytes(64) } else { rng.mutate(&valid) };
            if let Ok(h) = Header::decode(&input) {
                let mut again = [0u8; HEADER_LEN];
                h.encode(&mut again);
                assert_eq!(&again[..], &input[..HEADER_LEN], "decode/encode changed a header");
                assert_eq!(h.len as usize, input.len() - HEADER_LEN);
            }
        }
    }

    /// Kinds 64..=255 are served kinds, and round-trip; the core's gaps are refused.
    #[test]
    fn served_kinds_round_trip_and_gaps_are_refused() {
        for b in 0..=255u8 {
            match Kind::from_u8(b) {
                Some(k) => assert_eq!(k.to_u8(), b),
                None => assert!(matches!(b, 0 | 5 | 8..=63), "kind {b} refused"),
            }
        }
        assert_eq!(Kind::from_u8(64), Some(Kind::Served(64)));
        let h = Header::new(Kind::Served(200), Addr::new(1, 2, 0).unwrap(), Addr::new(3, 4, 0).unwrap(), 5);
        assert_eq!(Header::decode(&frame(&h, b"")).unwrap(), h);
    }

    #[test]
    fn routes_split_off_their_payload() {
        let route = Route { id: 0x0102_0304_0506_0708_1112_1314_1516_1718, seq: 9 };
        let mut p = route.encode().to_vec();
        p.extend_from_slice(b"rest");
        assert_eq!(Route::split(&p).unwrap(), (route, &b"rest"[..]));
        assert_eq!(Route::split(&p[..Route::LEN]).unwrap(), (route, &b""[..]));
        assert_eq!(Route::split(&p[..23]), Err(HeaderError::Route(23)));
    }

    #[test]
    fn header_rejects_garbage() {
        let h = Header::new(Kind::Ack, Addr::NONE, Addr::NONE, 1);
        let good = frame(&h, b"");
        assert_eq!(Header::decode(&good[..10]), Err(HeaderError::Short(10)));
        let mut bad = good.clone();
        bad[0] = 9;
        assert_eq!(Header::decode(&bad), Err(HeaderError::Version(9)));
        let mut bad = good.clone();
        bad[1] = 37;
        assert_eq!(Header::decode(&bad), Err(HeaderError::Kind(37)));
        let mut bad = good.clone();
        bad[3] = 0x80;
        assert!(matches!(Header::decode(&bad), Err(HeaderError::Flags(_))));
        let mut bad = good.clone();
        bad[4] = 5;
        assert_eq!(Header::decode(&bad), Err(HeaderError::Length { len: 5, avail: 0 }));
    }
}
