//! A link's frames (`docs/LINK.md`, "Wire"). Every decoder here reads
//! what a peer sent: it checks every byte it uses and never panics (fuzz
//! target `link_frames`).

use super::{Count, LinkId, Side, Window};
use crate::wire::{Checkpoint, Route};

/// Served kind of a link's frames (routed: they start with a [`Route`]).
pub(crate) const FRAME: u8 = 88;
/// Served kind of an opening: a link made by `Team::link_to`, for a listener.
pub(crate) const OPEN: u8 = 89;

/// Bytes before a frame's own: the route, the side it goes to, its op,
/// and the acknowledgement every frame carries.
pub(crate) const HEAD: usize = Route::LEN + 2 + 16;

/// One frame of a link, as it travels from one side to the other.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Frame<'a> {
    pub link: LinkId,
    /// Its number in its direction (every frame has one).
    pub seq: u64,
    /// The side it goes to.
    pub to: Side,
    /// What its sender has consumed of the other direction (its credit,
    /// carried by every frame).
    pub ack: Count,
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
    Op(u8),
    Checkpoint(u8),
    Answer(u8),
    Trailing(usize),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Short(n) => write!(f, "a frame of {n} bytes, shorter than its head"),
            FrameError::Side(b) => write!(f, "side byte {b}"),
            FrameError::Op(b) => write!(f, "op byte {b}"),
            FrameError::Checkpoint(b) => write!(f, "checkpoint byte {b}"),
            FrameError::Answer(b) => write!(f, "answer byte {b}"),
            FrameError::Trailing(n) => write!(f, "{n} bytes after a frame that has none"),
        }
    }
}

const MESSAGE: u8 = 1;
const ANSWER: u8 = 2;
const CREDIT: u8 = 3;
const CLOSE: u8 = 4;
const PROBE: u8 = 5;

impl Frame<'_> {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let extra = match &self.body {
            Body::Message { bytes, .. } | Body::Answer { bytes, .. } => 5 + bytes.len(),
            Body::Credit | Body::Probe | Body::Close => 0,
        };
        let mut out = Vec::with_capacity(HEAD + extra);
        out.extend_from_slice(&Route { id: self.link.0, seq: self.seq }.encode());
        let op = match self.body {
            Body::Message { .. } => MESSAGE,
            Body::Answer { .. } => ANSWER,
            Body::Credit => CREDIT,
            Body::Probe => PROBE,
            Body::Close => CLOSE,
        };
        out.extend_from_slice(&[self.to as u8, op]);
        out.extend_from_slice(&self.ack.messages.to_le_bytes());
        out.extend_from_slice(&self.ack.bytes.to_le_bytes());
        match &self.body {
            Body::Message { checkpoint, call, bytes } => {
                out.push(*checkpoint as u8);
                out.extend_from_slice(&call.to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Body::Answer { call, answer, bytes } => {
                out.push(*answer as u8);
                out.extend_from_slice(&call.to_le_bytes());
                out.extend_from_slice(bytes);
            }
            Body::Credit | Body::Probe | Body::Close => {}
        }
        out
    }

    /// The frame `b` holds.
    pub fn decode(b: &[u8]) -> Result<Frame<'_>, FrameError> {
        let short = || FrameError::Short(b.len());
        let (route, rest) = Route::split(b).map_err(|_| short())?;
        let (head, rest) = rest.split_at_checked(18).ok_or_else(short)?;
        let to = match head[0] {
            0 => Side::A,
            1 => Side::B,
            s => return Err(FrameError::Side(s)),
        };
        let ack = Count { messages: le64(&head[2..10]), bytes: le64(&head[10..18]) };
        let tagged = |rest: &'_ [u8]| -> Result<(u8, u32), FrameError> {
            let (t, _) = rest.split_first().ok_or_else(short)?;
            let call = rest.get(1..5).ok_or_else(short)?;
            Ok((*t, u32::from_le_bytes(call.try_into().expect("4 bytes"))))
        };
        let body = match head[1] {
            MESSAGE => {
                let (c, call) = tagged(rest)?;
                let checkpoint = match c {
                    0 => Checkpoint::Immediate,
                    1 => Checkpoint::OnReceipt,
                    2 => Checkpoint::OnDelivery,
                    3 => Checkpoint::OnReturn,
                    c => return Err(FrameError::Checkpoint(c)),
                };
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
        Ok(Frame { link: LinkId(route.id), seq: route.seq, to, ack, body })
    }
}

fn le64(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().expect("8 bytes"))
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes(b.try_into().expect("4 bytes"))
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
    pub const LEN: usize = 24;

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

/// A window's 8 bytes: messages, then bytes (u32 each).
pub(crate) fn encode_window(w: Window) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&w.messages.to_le_bytes());
    b[4..].copy_from_slice(&w.bytes.to_le_bytes());
    b
}

/// The window in `b` (8 bytes); `None` if it is not, or grants nothing.
pub(crate) fn decode_window(b: &[u8]) -> Option<Window> {
    if b.len() != 8 {
        return None;
    }
    let w = Window { messages: le32(&b[..4]), bytes: le32(&b[4..]) };
    (w.messages > 0 && w.bytes > 0).then_some(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(body: Body<'_>) {
        let f = Frame { link: LinkId(7 << 100 | 9), seq: 42, to: Side::B, ack: Count { messages: 3, bytes: 99 }, body };
        let bytes = f.encode();
        assert_eq!(Frame::decode(&bytes).unwrap(), f);
        for n in 0..HEAD {
            assert!(Frame::decode(&bytes[..n]).is_err(), "a {n}-byte prefix decoded");
        }
    }

    #[test]
    fn frames_round_trip_and_prefixes_are_refused() {
        round_trip(Body::Message { checkpoint: Checkpoint::OnReturn, call: 5, bytes: b"hello" });
        round_trip(Body::Answer { call: 5, answer: Answer::Reply, bytes: b"" });
        round_trip(Body::Credit);
        round_trip(Body::Probe);
        round_trip(Body::Close);
    }

    #[test]
    fn bad_bytes_are_refused() {
        let f = Frame { link: LinkId(1), seq: 0, to: Side::A, ack: Count::default(), body: Body::Close };
        let mut b = f.encode();
        b.push(0);
        assert_eq!(Frame::decode(&b), Err(FrameError::Trailing(1)));
        b.pop();
        b[Route::LEN] = 2;
        assert_eq!(Frame::decode(&b), Err(FrameError::Side(2)));
        b[Route::LEN] = 0;
        b[Route::LEN + 1] = 9;
        assert_eq!(Frame::decode(&b), Err(FrameError::Op(9)));
        let open = Open { link: LinkId(3), window: Window { messages: 4, bytes: 4096 } };
        assert_eq!(Open::decode(&open.encode()), Some(open));
        assert_eq!(decode_window(&[0; 8]), None);
    }
}
