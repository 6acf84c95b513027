//! A link's frames (`docs/LINK.md`, "Wire"). Every decoder here reads
//! what a peer sent: it checks every byte it uses and never panics (fuzz
//! target `link_frames`).

use super::route::{Control, Hop, Moved};
use super::stream::Stream;
use super::{Count, LinkId, Side, Window};
use crate::id::TeamId;
use crate::wire::{Checkpoint, Route};

/// Served kind of a link's frames (routed: they start with a [`Route`]).
pub(crate) const FRAME: u8 = 88;
/// Served kind of an opening: a link made by `Team::link_to`, for a listener.
pub(crate) const OPEN: u8 = 89;
/// Served kind of a short frame: a small `Immediate` message between two
/// routers that know each other's handles (see [`Short`]).
pub(crate) const SHORT: u8 = 90;

/// Largest message sent in a short frame. A short frame exists to keep a
/// small message's ring record in one 64-byte line (a second line costs
/// a port's round trip 12 %: `docs/PERFORMANCE.md`); past this size the
/// full frame's 57 bytes of framing matter little.
pub(crate) const SHORT_MAX: usize = 64;

/// A short frame: a message with checkpoint `Immediate`, numbered `seq`,
/// carrying no acknowledgement, from one router to the next. Its
/// header names both routers by their handles (the slots
/// `LINK_SLOTS + handle` of their teams: `src` the sender's, `dst` the
/// receiver's); its payload is `seq` (u64, little-endian), then the
/// message's bytes. The receiver knows the sender's handle from a full
/// frame the sender sent it first (its header's `src`), and so which
/// router sent it: the frame is that router's frame toward the other side.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Short<'a> {
    pub seq: u64,
    pub bytes: &'a [u8],
}

impl<'a> Short<'a> {
    /// The short frame `b` (a payload) holds: its message is at most
    /// `SHORT_MAX` bytes.
    #[inline(always)]
    pub fn decode(b: &'a [u8]) -> Result<Short<'a>, FrameError> {
        let (seq, bytes) = b.split_at_checked(8).ok_or(FrameError::Short(b.len()))?;
        if bytes.len() > SHORT_MAX {
            return Err(FrameError::LongShort(bytes.len()));
        }
        Ok(Short { seq: le64(seq), bytes })
    }

    /// Its payload's bytes before the message's.
    pub fn head(seq: u64) -> [u8; 8] {
        seq.to_le_bytes()
    }
}

/// One frame of a link between two of its routers (`super::route`):
/// the router it goes to and the one it comes from (each a side and an
/// epoch of the team that sent or takes it), then a frame of the ends'
/// own (numbered in its direction) or a routers' message.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    pub link: LinkId,
    pub to: (Side, u32),
    pub from: (Side, u32),
    pub what: What<'a>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum What<'a> {
    /// A frame of the ends' own, going to side `toward`: `data` is its
    /// op, acknowledgement and operands ([`Data::decode`]).
    Data {
        toward: Side,
        seq: u64,
        data: &'a [u8],
    },
    Control(Control),
}

/// An end's frame, as the other end takes it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Data<'a> {
    /// What its sender has consumed of the other direction (its credit,
    /// carried by every frame but a bare message).
    pub ack: Option<Count>,
    pub body: Body<'a>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Body<'a> {
    /// A message; `call` numbers the answer its checkpoint asks for.
    Message { checkpoint: Checkpoint, call: u32, bytes: &'a [u8] },
    /// The answer to the other side's message `call`.
    Answer { call: u32, answer: Answer, bytes: &'a [u8] },
    /// Only the acknowledgement.
    Credit,
    /// "I wait for room": its receiver acknowledges as soon as it
    /// consumes (once, or at once if it has consumed unacknowledged messages).
    Probe,
    /// The last frame of its direction: its side was closed.
    Close,
}

/// What an answer says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The receiver's runtime took the message (`OnReceipt`).
    Receipt = 1,
    /// A receiving task took it (`OnDelivery`).
    Delivery = 2,
    /// Its reply (`OnReturn`); the bytes are the reply.
    Reply = 3,
    /// Dropped without the reply `OnReturn` asked for.
    NoReply = 4,
}

/// Why a link frame was refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FrameError {
    Short(usize),
    Side(u8),
    Class(u8),
    Op(u8),
    Checkpoint(u8),
    Answer(u8),
    Trailing(usize),
    /// A short frame's message of this many bytes, past `SHORT_MAX`.
    LongShort(usize),
    /// A routers' message numbered (only an end's frames are).
    ControlSeq(u64),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Short(n) => write!(f, "a frame of {n} bytes, shorter than its head"),
            FrameError::Side(b) => write!(f, "side byte {b}"),
            FrameError::Class(b) => write!(f, "class byte {b}"),
            FrameError::Op(b) => write!(f, "op byte {b}"),
            FrameError::Checkpoint(b) => write!(f, "checkpoint byte {b}"),
            FrameError::Answer(b) => write!(f, "answer byte {b}"),
            FrameError::Trailing(n) => write!(f, "{n} bytes after a frame that has none"),
            FrameError::LongShort(n) => write!(f, "a short frame's message of {n} bytes, past {SHORT_MAX}"),
            FrameError::ControlSeq(n) => write!(f, "a routers' message numbered {n}"),
        }
    }
}

const MESSAGE: u8 = 1;
const ANSWER: u8 = 2;
const CREDIT: u8 = 3;
const CLOSE: u8 = 4;
const PROBE: u8 = 5;
/// A message `Immediate` without an acknowledgement (a short frame's,
/// when a router passes it on or keeps it for its turn): the op, then
/// the bytes.
const BARE: u8 = 6;

/// The routers' messages' op bytes.
const ADOPT: u8 = 1;
const BYPASSING: u8 = 2;
const BYPASS_READY: u8 = 3;
const BYPASS: u8 = 4;
const BYPASS_REFUSED: u8 = 5;
const BYPASS_CANCELLED: u8 = 6;
const STOP_FORWARDING: u8 = 7;
const ACCEPTED: u8 = 8;
const DONE: u8 = 9;
const PROXY_GONE: u8 = 10;
const GONE: u8 = 11;

/// Bytes of a frame's head: route, the two routers, the class.
pub(crate) const HEAD: usize = Route::LEN + 5 + 5 + 1;

/// Bytes of a message's (or an answer's) data before its bytes: the op,
/// the acknowledgement, the checkpoint (or answer) and the call.
pub(crate) const DATA_HEAD: usize = 1 + 16 + 1 + 4;

/// Bytes a message's (or an answer's) frame adds to it: the head, then
/// its data's.
pub(crate) const FRAMING: usize = HEAD + DATA_HEAD;

fn side(b: u8) -> Result<Side, FrameError> {
    match b {
        0 => Ok(Side::A),
        1 => Ok(Side::B),
        s => Err(FrameError::Side(s)),
    }
}

impl Frame<'_> {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD + 32);
        self.encode_into(&mut out);
        out
    }

    /// Appends its bytes to `out` (a data frame's bytes come last: a frame
    /// with empty `data` followed by [`Data::encode_head`]'s pieces is the frame
    /// with that data, encoded once).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        let (seq, class) = match self.what {
            What::Data { toward, seq, .. } => (seq, Some(toward)),
            What::Control(_) => (0, None),
        };
        // The head in one piece (one copy into `out`).
        out.extend_from_slice(&head(self.link, self.to, self.from, class, seq));
        match &self.what {
            What::Data { data, .. } => out.extend_from_slice(data),
            What::Control(c) => encode_control(c, out),
        }
    }

    /// The frame `b` holds (a data frame's own bytes are checked by [`Data::decode`]).
    #[inline]
    pub fn decode(b: &[u8]) -> Result<Frame<'_>, FrameError> {
        let short = || FrameError::Short(b.len());
        let (route, rest) = Route::split(b).map_err(|_| short())?;
        let (head, rest) = rest.split_at_checked(11).ok_or_else(short)?;
        let to = (side(head[0])?, le32(&head[1..5]));
        let from = (side(head[5])?, le32(&head[6..10]));
        let what = match head[10] {
            0 if route.seq != 0 => return Err(FrameError::ControlSeq(route.seq)),
            0 => What::Control(decode_control(rest)?),
            c @ (1 | 2) => What::Data { toward: side(c - 1)?, seq: route.seq, data: rest },
            c => return Err(FrameError::Class(c)),
        };
        Ok(Frame { link: LinkId(route.id), to, from, what })
    }
}

/// A frame's head: its route (the link and `seq`), the router it goes to
/// and the one it comes from, its class (a data frame's: the side it goes
/// toward; a routers' message: none).
pub(crate) fn head(link: LinkId, to: (Side, u32), from: (Side, u32), class: Option<Side>, seq: u64) -> [u8; HEAD] {
    let mut head = [0u8; HEAD];
    head[..Route::LEN].copy_from_slice(&Route { id: link.0, seq }.encode());
    for (at, (side, epoch)) in [(Route::LEN, to), (Route::LEN + 5, from)] {
        head[at] = side as u8;
        head[at + 1..at + 5].copy_from_slice(&epoch.to_le_bytes());
    }
    head[HEAD - 1] = class.map_or(0, |toward| 1 + toward as u8);
    head
}

/// Sets the number in the head of a data frame's `prefix`.
pub(crate) fn number(prefix: &mut [u8; FRAMING], seq: u64) {
    prefix[16..Route::LEN].copy_from_slice(&seq.to_le_bytes());
}

/// A router's 15 bytes: node u16, team u32, incarnation u32, side u8, epoch u32.
fn encode_hop(out: &mut Vec<u8>, h: &Hop) {
    out.extend_from_slice(&h.team.node.to_le_bytes());
    out.extend_from_slice(&h.team.team.to_le_bytes());
    out.extend_from_slice(&h.team.incarnation.to_le_bytes());
    out.push(h.side as u8);
    out.extend_from_slice(&h.epoch.to_le_bytes());
}

/// A checkpoint's byte.
fn checkpoint(b: u8) -> Option<Checkpoint> {
    Some(match b {
        0 => Checkpoint::Immediate,
        1 => Checkpoint::OnReceipt,
        2 => Checkpoint::OnDelivery,
        3 => Checkpoint::OnReturn,
        _ => return None,
    })
}

fn encode_control(c: &Control, out: &mut Vec<u8>) {
    match c {
        Control::Adopt { token } => {
            out.push(ADOPT);
            out.extend_from_slice(&token.to_le_bytes());
        }
        Control::Bypassing { x } => {
            out.push(BYPASSING);
            encode_hop(out, x);
        }
        Control::Bypass { z } => {
            out.push(BYPASS);
            encode_hop(out, z);
        }
        Control::BypassReady => out.push(BYPASS_READY),
        Control::BypassRefused => out.push(BYPASS_REFUSED),
        Control::BypassCancelled => out.push(BYPASS_CANCELLED),
        Control::StopForwarding => out.push(STOP_FORWARDING),
        Control::Accepted => out.push(ACCEPTED),
        Control::Done => out.push(DONE),
        Control::ProxyGone => out.push(PROXY_GONE),
        Control::Gone => out.push(GONE),
    }
}

fn decode_control(b: &[u8]) -> Result<Control, FrameError> {
    let (&op, rest) = b.split_first().ok_or(FrameError::Short(b.len()))?;
    let exact = |n: usize| match rest.len().cmp(&n) {
        std::cmp::Ordering::Less => Err(FrameError::Short(b.len())),
        std::cmp::Ordering::Greater => Err(FrameError::Trailing(rest.len() - n)),
        std::cmp::Ordering::Equal => Ok(rest),
    };
    // 15 bytes exactly: the reader cannot run out, only find a bad side.
    let hop = |b: &[u8]| Reader(b).hop().ok_or(FrameError::Side(b[10]));
    Ok(match op {
        ADOPT => Control::Adopt { token: le64(exact(8)?) },
        BYPASSING => Control::Bypassing { x: hop(exact(15)?)? },
        BYPASS => Control::Bypass { z: hop(exact(15)?)? },
        BYPASS_READY => exact(0).map(|_| Control::BypassReady)?,
        BYPASS_REFUSED => exact(0).map(|_| Control::BypassRefused)?,
        BYPASS_CANCELLED => exact(0).map(|_| Control::BypassCancelled)?,
        STOP_FORWARDING => exact(0).map(|_| Control::StopForwarding)?,
        ACCEPTED => exact(0).map(|_| Control::Accepted)?,
        DONE => exact(0).map(|_| Control::Done)?,
        PROXY_GONE => exact(0).map(|_| Control::ProxyGone)?,
        GONE => exact(0).map(|_| Control::Gone)?,
        op => return Err(FrameError::Op(op)),
    })
}

impl<'a> Data<'a> {
    /// Its bytes (a data frame's `data`; the runtime writes them in place
    /// with [`Data::encode_head`]).
    #[cfg(any(test, feature = "testing"))]
    pub fn encode(&self) -> Vec<u8> {
        let (head, len, bytes) = self.encode_head();
        [&head[..len], bytes].concat()
    }

    /// Its bytes in two pieces: the first `len` bytes of `head` (the op,
    /// the acknowledgement and, for a message or an answer, its tag and
    /// call number), then the message's (or answer's) bytes.
    #[cfg(any(test, feature = "testing"))]
    pub fn encode_head(&self) -> ([u8; DATA_HEAD], usize, &'a [u8]) {
        let mut head = [0u8; DATA_HEAD];
        let (len, bytes) = self.encode_head_into(&mut head);
        (head, len, bytes)
    }

    /// [`Data::encode_head`] into `head`: returns how many of its bytes
    /// it wrote, and the bytes that follow them.
    #[inline]
    pub fn encode_head_into(&self, head: &mut [u8; DATA_HEAD]) -> (usize, &'a [u8]) {
        let Some(ack) = self.ack else {
            // Only a message `Immediate` goes bare (`Data::bare`).
            head[0] = BARE;
            return (1, if let Body::Message { bytes, .. } = self.body { bytes } else { &[] });
        };
        let (op, tagged) = match self.body {
            Body::Message { checkpoint, call, bytes } => (MESSAGE, Some((checkpoint as u8, call, bytes))),
            Body::Answer { call, answer, bytes } => (ANSWER, Some((answer as u8, call, bytes))),
            Body::Credit => (CREDIT, None),
            Body::Probe => (PROBE, None),
            Body::Close => (CLOSE, None),
        };
        head[0] = op;
        head[1..9].copy_from_slice(&ack.messages.to_le_bytes());
        head[9..17].copy_from_slice(&ack.bytes.to_le_bytes());
        match tagged {
            Some((tag, call, bytes)) => {
                head[17] = tag;
                head[18..22].copy_from_slice(&call.to_le_bytes());
                (DATA_HEAD, bytes)
            }
            None => (17, &[]),
        }
    }

    /// The end's frame `b` holds.
    #[inline(always)]
    pub fn decode(b: &[u8]) -> Result<Data<'_>, FrameError> {
        let short = || FrameError::Short(b.len());
        if let [BARE, bytes @ ..] = b {
            return Ok(Data::bare(bytes));
        }
        let (head, rest) = b.split_at_checked(17).ok_or_else(short)?;
        let ack = Count { messages: le64(&head[1..9]), bytes: le64(&head[9..17]) };
        let tagged = |rest: &'_ [u8]| -> Result<(u8, u32), FrameError> {
            let (t, _) = rest.split_first().ok_or_else(short)?;
            let call = rest.get(1..5).ok_or_else(short)?;
            Ok((*t, u32::from_le_bytes(call.try_into().expect("4 bytes"))))
        };
        let body = match head[0] {
            MESSAGE => {
                let (c, call) = tagged(rest)?;
                let checkpoint = checkpoint(c).ok_or(FrameError::Checkpoint(c))?;
                Body::Message { checkpoint, call, bytes: &rest[5..] }
            }
            ANSWER => {
                let (a, call) = tagged(rest)?;
                let answer = match a {
                    1 => Answer::Receipt,
                    2 => Answer::Delivery,
                    3 => Answer::Reply,
                    4 => Answer::NoReply,
                    a => return Err(FrameError::Answer(a)),
                };
                Body::Answer { call, answer, bytes: &rest[5..] }
            }
            op @ (CREDIT | PROBE | CLOSE) => {
                if !rest.is_empty() {
                    return Err(FrameError::Trailing(rest.len()));
                }
                match op {
                    CREDIT => Body::Credit,
                    PROBE => Body::Probe,
                    _ => Body::Close,
                }
            }
            op => return Err(FrameError::Op(op)),
        };
        Ok(Data { ack: Some(ack), body })
    }

    /// A message `Immediate` without an acknowledgement: a short frame's.
    pub fn bare(bytes: &'a [u8]) -> Data<'a> {
        Data { ack: None, body: Body::Message { checkpoint: Checkpoint::Immediate, call: 0, bytes } }
    }
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
}

/// Writes a bare message's data (`Data::bare(bytes)`) into `out`, which
/// holds it; returns its length.
pub(crate) fn bare_into(out: &mut [u8], bytes: &[u8]) -> usize {
    out[0] = BARE;
    out[1..=bytes.len()].copy_from_slice(bytes);
    1 + bytes.len()
}

/// A reader of bytes a peer sent: `None` once they run out.
pub(crate) struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    pub fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(le32(self.bytes(4)?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(le64(self.bytes(8)?))
    }
    pub fn u128(&mut self) -> Option<u128> {
        Some(u128::from_le_bytes(self.bytes(16)?.try_into().expect("16 bytes")))
    }
    fn hop(&mut self) -> Option<Hop> {
        let team = TeamId {
            node: u16::from_le_bytes(self.bytes(2)?.try_into().ok()?),
            team: self.u32()?,
            incarnation: self.u32()?,
        };
        Some(Hop { team, side: side(self.u8()?).ok()?, epoch: self.u32()? })
    }
}

/// A message waiting in an end's queue, as it travels with the end.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Queued {
    pub checkpoint: Checkpoint,
    pub call: u32,
    pub bytes: Vec<u8>,
}

/// A moving end, inside the message that carries it: its link and side,
/// where it left its proxy and the proof of its adoption, its stream and
/// the messages it had received and not consumed.
pub(crate) struct Carried {
    pub link: LinkId,
    pub side: Side,
    pub moved: Moved,
    pub stream: Stream,
    pub queue: Vec<Queued>,
}

impl Carried {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&self.link.0.to_le_bytes());
        out.push(self.side as u8);
        encode_hop(&mut out, &self.moved.proxy);
        out.extend_from_slice(&self.moved.epoch.to_le_bytes());
        out.extend_from_slice(&self.moved.token.to_le_bytes());
        self.stream.encode(&mut out);
        out.extend_from_slice(&(self.queue.len() as u32).to_le_bytes());
        for q in &self.queue {
            out.push(q.checkpoint as u8);
            out.extend_from_slice(&q.call.to_le_bytes());
            out.extend_from_slice(&(q.bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(&q.bytes);
        }
        out
    }

    /// The end `b` carries; `None` unless it is one an end could be.
    pub fn decode(b: &[u8]) -> Option<Carried> {
        let mut r = Reader(b);
        let link = LinkId(r.u128()?);
        let side = side(r.u8()?).ok()?;
        let proxy = r.hop()?;
        let (epoch, token) = (r.u32()?, r.u64()?);
        if proxy.side != side || proxy.epoch.checked_add(1) != Some(epoch) {
            return None;
        }
        let stream = Stream::decode(&mut r)?;
        let n = u64::from(r.u32()?);
        if n != stream.unconsumed() {
            return None;
        }
        let mut queue = Vec::new();
        for _ in 0..n {
            let checkpoint = checkpoint(r.u8()?)?;
            let call = r.u32()?;
            let len = r.u32()? as usize;
            queue.push(Queued { checkpoint, call, bytes: r.bytes(len)?.to_vec() });
        }
        if !r.0.is_empty() {
            return None;
        }
        Some(Carried { link, side, moved: Moved { proxy, epoch, token }, stream, queue })
    }
}

/// An opening (`OPEN`'s payload): the new link, and the window its maker
/// grants the listener's side.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Open {
    pub link: LinkId,
    pub window: Window,
}

/// An opening's answer: a status byte, then (opened) the listener's window.
pub(crate) mod status {
    pub const OPENED: u8 = 0;
    pub const NO_LISTENER: u8 = 1;
    pub const BACKLOG_FULL: u8 = 2;
    pub const TOO_MANY_LINKS: u8 = 3;
}

impl Open {
    pub const LEN: usize = 16 + WINDOW_LEN;

    pub fn encode(&self) -> [u8; Open::LEN] {
        let mut b = [0u8; Open::LEN];
        b[..16].copy_from_slice(&self.link.0.to_le_bytes());
        b[16..].copy_from_slice(&encode_window(self.window));
        b
    }

    pub fn decode(b: &[u8]) -> Option<Open> {
        if b.len() != Open::LEN {
            return None;
        }
        let link = LinkId(u128::from_le_bytes(b[..16].try_into().expect("16 bytes")));
        Some(Open { link, window: decode_window(&b[16..])? })
    }
}

/// Bytes of a window.
pub(crate) const WINDOW_LEN: usize = 16;

/// A window's bytes: messages, bytes (u32 each), then the largest message (u64).
pub(crate) fn encode_window(w: Window) -> [u8; WINDOW_LEN] {
    let mut b = [0u8; WINDOW_LEN];
    b[..4].copy_from_slice(&w.messages.to_le_bytes());
    b[4..8].copy_from_slice(&w.bytes.to_le_bytes());
    b[8..].copy_from_slice(&w.largest.to_le_bytes());
    b
}

/// The window in `b`; `None` if it is not one, or grants nothing.
pub(crate) fn decode_window(b: &[u8]) -> Option<Window> {
    let mut r = Reader(b);
    let w = Window { messages: r.u32()?, bytes: r.u32()?, largest: r.u64()? };
    (r.0.is_empty() && w.messages > 0 && w.bytes > 0).then_some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(what: What<'_>) {
        let f = Frame { link: LinkId(7 << 100 | 9), to: (Side::B, 3), from: (Side::A, 0), what };
        let bytes = f.encode();
        assert_eq!(Frame::decode(&bytes).unwrap(), f);
        for n in 0..HEAD {
            assert!(Frame::decode(&bytes[..n]).is_err(), "a {n}-byte prefix decoded");
        }
    }

    fn data(body: Body<'_>) -> Vec<u8> {
        let d = Data { ack: Some(Count { messages: 3, bytes: 99 }), body };
        let bytes = d.encode();
        assert_eq!(Data::decode(&bytes).unwrap(), d);
        bytes
    }

    #[test]
    fn frames_round_trip_and_prefixes_are_refused() {
        let hop = Hop { team: TeamId { node: 1, team: 2, incarnation: 3 }, side: Side::A, epoch: 4 };
        for body in [
            Body::Message { checkpoint: Checkpoint::OnReturn, call: 5, bytes: b"hello" },
            Body::Answer { call: 5, answer: Answer::Reply, bytes: b"" },
            Body::Credit,
            Body::Probe,
            Body::Close,
        ] {
            round_trip(What::Data { toward: Side::B, seq: 42, data: &data(body) });
        }
        for c in [
            Control::Adopt { token: 77 },
            Control::Bypassing { x: hop },
            Control::Bypass { z: hop },
            Control::BypassReady,
            Control::BypassRefused,
            Control::BypassCancelled,
            Control::StopForwarding,
            Control::Accepted,
            Control::Done,
            Control::ProxyGone,
            Control::Gone,
        ] {
            round_trip(What::Control(c));
        }
    }

    /// A short frame's message goes on as a bare one (no
    /// acknowledgement): the op, then the bytes.
    #[test]
    fn bare_messages_and_short_frames_round_trip() {
        let d = Data::bare(b"8 bytes!");
        let bytes = d.encode();
        assert_eq!(bytes, [&[BARE][..], b"8 bytes!"].concat());
        assert_eq!(Data::decode(&bytes).unwrap(), d);
        round_trip(What::Data { toward: Side::A, seq: 7, data: &bytes });
        let payload = [&Short::head(1 << 40)[..], b"hi"].concat();
        assert_eq!(Short::decode(&payload).unwrap(), Short { seq: 1 << 40, bytes: b"hi" });
        for n in 0..8 {
            assert_eq!(Short::decode(&payload[..n]), Err(FrameError::Short(n)));
        }
        let long = [&Short::head(1)[..], &[0; SHORT_MAX + 1]].concat();
        assert_eq!(Short::decode(&long), Err(FrameError::LongShort(SHORT_MAX + 1)));
        assert!(Short::decode(&long[..8 + SHORT_MAX]).is_ok());
    }

    #[test]
    fn bad_bytes_are_refused() {
        let f = Frame { link: LinkId(1), to: (Side::A, 0), from: (Side::B, 0), what: What::Control(Control::Done) };
        let mut b = f.encode();
        b.push(0);
        assert_eq!(Frame::decode(&b), Err(FrameError::Trailing(1)));
        b.pop();
        b[Route::LEN] = 2;
        assert_eq!(Frame::decode(&b), Err(FrameError::Side(2)));
        b[Route::LEN] = 0;
        b[HEAD - 1] = 9;
        assert_eq!(Frame::decode(&b), Err(FrameError::Class(9)));
        let mut d = Data { ack: Some(Count::default()), body: Body::Close }.encode();
        d[0] = 9;
        assert_eq!(Data::decode(&d), Err(FrameError::Op(9)));
        let open = Open { link: LinkId(3), window: Window { messages: 4, bytes: 4096, largest: 1 << 20 } };
        assert_eq!(Open::decode(&open.encode()), Some(open));
        assert_eq!(decode_window(&[0; WINDOW_LEN]), None);
        assert_eq!(
            decode_window(&encode_window(Window { messages: 4, bytes: 4096, largest: 1 })[..8]),
            None,
            "8 bytes decoded"
        );
    }
}
