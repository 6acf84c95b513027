//! A fifo's served frames (kinds 72–75, `dst` the fifo's slot) and their
//! answers; each side decodes the other's bytes here (fuzz target `fifo`).
//! Numbers are little-endian.
//!
//! | kind | payload | answer (Reply) |
//! |---|---|---|
//! | 72 OPEN | the key (16 bytes) | a status; if `OK`: the producer's ring (u32), the capacity (u64), the element size (u64); over shared memory the ring's memfd and the fifo's control page come with it |
//! | 73 ENQUEUE | the key, the ring (u32), the element | none: the producer sends no more elements than the ring's free slots it was told of (its credit) |
//! | 74 WAKE | nothing | none: the owner's waiting dequeue wakes |
//! | 75 DONE | the key, the ring (u32) | none: the producer is done with its ring |
//! | 76 CREDIT | the key, the ring (u32) | a status; if `OK`, the ring's free slots (u64), counted after every element sent before it |

use crate::error::{Error, Result};
use crate::id::EndpointId;

pub(crate) const OPEN: u8 = 72;
pub(super) const ENQUEUE: u8 = 73;
pub(super) const WAKE: u8 = 74;
pub(super) const DONE: u8 = 75;
pub(super) const CREDIT: u8 = 76;

/// An answer's first byte.
pub(super) mod status {
    pub const OK: u8 = 0;
    pub const NO_FIFO: u8 = 1;
    pub const DENIED: u8 = 2;
    pub const FULL: u8 = 3;
    pub const TOO_MANY_PRODUCERS: u8 = 4;
    pub const TOO_LARGE: u8 = 5;
    pub const CLOSED: u8 = 6;
}

/// What an opening answered: the producer's ring, the capacity, the element size.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Opened {
    pub ring: u32,
    pub capacity: u64,
    pub element_size: u64,
}

impl Opened {
    pub fn encode(&self) -> [u8; 21] {
        let mut a = [0u8; 21];
        a[0] = status::OK;
        a[1..5].copy_from_slice(&self.ring.to_le_bytes());
        a[5..13].copy_from_slice(&self.capacity.to_le_bytes());
        a[13..].copy_from_slice(&self.element_size.to_le_bytes());
        a
    }
}

/// An `OPEN` answer (the owner's bytes), checked against the fifos any
/// owner may make; else the error it says, or `Protocol`.
pub(crate) fn parse_opened(answer: &[u8], fifo: EndpointId) -> Result<Opened> {
    let bad = || Error::Protocol {
        peer: fifo.team_id(),
        violation: crate::Violation::BadRegionAnswer("a fifo's opening answered with no known form".into()),
    };
    match (answer.first(), answer.len()) {
        (Some(&status::OK), 21) => {}
        (Some(&s), 1) => return Err(refusal(s, fifo).ok_or_else(bad)?),
        _ => return Err(bad()),
    }
    let word = |at: usize| u64::from_le_bytes(answer[at..at + 8].try_into().expect("8 bytes"));
    let opened = Opened {
        ring: u32::from_le_bytes(answer[1..5].try_into().expect("4 bytes")),
        capacity: word(5),
        element_size: word(13),
    };
    match super::check_shape(opened.capacity, opened.element_size) {
        Ok(_) => Ok(opened),
        Err(_) => Err(bad()),
    }
}

/// The error a status other than `OK` says, for fifo `fifo`.
pub(super) fn refusal(status: u8, fifo: EndpointId) -> Option<Error> {
    Some(match status {
        status::NO_FIFO => Error::NoSuchEndpoint(fifo),
        status::DENIED => Error::AccessDenied { region: fifo },
        status::FULL => Error::WouldBlock { to: fifo },
        status::TOO_MANY_PRODUCERS => {
            Error::LimitReached { limit: crate::Limit::FifoProducers, max: super::MAX_PRODUCERS as u64 }
        }
        status::TOO_LARGE => Error::InvalidArgument("an element larger than the fifo's element size".into()),
        status::CLOSED => Error::Closed { endpoint: fifo, why: "the fifo's owner closed this producer's ring" },
        _ => return None,
    })
}

/// A `CREDIT` answer: `OK` and the free slots.
pub(crate) fn credit(free: u64) -> [u8; 9] {
    let mut a = [0u8; 9];
    a[1..].copy_from_slice(&free.to_le_bytes());
    a
}

/// A `CREDIT` answer (the owner's bytes): the free slots (at most
/// `capacity`), or the error it says, or `Protocol`.
pub(crate) fn parse_credit(answer: &[u8], capacity: u64, fifo: EndpointId) -> Result<u64> {
    let bad = || Error::Protocol {
        peer: fifo.team_id(),
        violation: crate::Violation::BadRegionAnswer("a fifo's credit of no known form".into()),
    };
    match answer {
        [status::OK, free @ ..] if free.len() == 8 => {
            let free = u64::from_le_bytes(free.try_into().expect("8 bytes"));
            if free <= capacity {
                Ok(free)
            } else {
                Err(bad())
            }
        }
        [s] => Err(refusal(*s, fifo).ok_or_else(bad)?),
        _ => Err(bad()),
    }
}

/// An `ENQUEUE`, `DONE` or `CREDIT` payload: the key, the ring, then the element.
pub(crate) fn enqueue(key: &[u8; 16], ring: u32, element: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(20 + element.len());
    p.extend_from_slice(key);
    p.extend_from_slice(&ring.to_le_bytes());
    p.extend_from_slice(element);
    p
}

/// An `ENQUEUE`, `DONE` or `CREDIT` payload (a producer's bytes): key, ring, element.
pub(crate) fn parse_enqueue(payload: &[u8]) -> Option<(&[u8], u32, &[u8])> {
    let (key, rest) = payload.split_at_checked(16)?;
    let (ring, element) = rest.split_at_checked(4)?;
    Some((key, u32::from_le_bytes(ring.try_into().ok()?), element))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_and_payloads_read_back() {
        let fifo = EndpointId::at(crate::id::Addr::new(1, 2, 3).unwrap(), 4);
        let opened = Opened { ring: 7, capacity: 64, element_size: 8 };
        assert_eq!(parse_opened(&opened.encode(), fifo).unwrap(), opened);
        let mut huge = Opened { capacity: u64::MAX, ..opened }.encode();
        assert!(matches!(parse_opened(&huge, fifo), Err(Error::Protocol { .. })));
        huge[0] = 9;
        assert!(matches!(parse_opened(&huge, fifo), Err(Error::Protocol { .. })));
        assert!(matches!(parse_opened(&[status::DENIED], fifo), Err(Error::AccessDenied { .. })));
        assert!(matches!(parse_opened(&[200], fifo), Err(Error::Protocol { .. })));
        assert!(matches!(parse_opened(&[], fifo), Err(Error::Protocol { .. })));
        let p = enqueue(&[1; 16], 3, b"element");
        assert_eq!(parse_enqueue(&p), Some((&[1u8; 16][..], 3, &b"element"[..])));
        assert_eq!(parse_enqueue(&p[..19]), None);
        assert_eq!(parse_credit(&credit(5), 8, fifo).unwrap(), 5);
        assert!(matches!(parse_credit(&credit(9), 8, fifo), Err(Error::Protocol { .. })));
        assert!(matches!(parse_credit(&[status::CLOSED], 8, fifo), Err(Error::Closed { .. })));
        assert!(matches!(parse_credit(&[0, 1], 8, fifo), Err(Error::Protocol { .. })));
    }
}
