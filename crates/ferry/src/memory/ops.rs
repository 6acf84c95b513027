//! Operations served by a region's owner (across machines): the request an
//! importer sends in a served frame of kind [`OP`](super::OP), and the
//! answer. Each side decodes the other's bytes here, and nowhere else
//! (fuzz target `region_ops`). Numbers are little-endian.
//!
//! A request: the op (u8), the region's key (16 bytes), the epoch the
//! importer opened (u64), the offset (u64), then by op:
//!
//! | op | then |
//! |---|---|
//! | `GET` | the length (u64) |
//! | `PUT` | the bytes (the rest of the payload) |
//! | `SWAP`, `FETCH_ADD` | the value (u64) |
//! | `CAS` | the current value, the new one (u64 each) |
//! | `PATH` | the length (u64), the step count (u8, at most 64), each step: a tag (u8: 0 field, 1 index, 2 indirect) and its numbers (field: k; index: index, size; indirect: none) |
//!
//! An answer: a status (u8), then: if `OK`, a get's or path's bytes, an
//! atomic's old value (u64), nothing for a put; if `OUT_OF_BOUNDS`, the
//! offset and length refused (u64 each); if `MISALIGNED`, the offset
//! (u64); else nothing.

use super::path::{Step, MAX_PATH_STEPS};
use super::MAX_SERVED_BYTES;
use crate::error::{Error, Result};
use crate::id::EndpointId;

pub(super) const GET: u8 = 1;
pub(super) const PUT: u8 = 2;
pub(super) const SWAP: u8 = 3;
pub(super) const FETCH_ADD: u8 = 4;
pub(super) const CAS: u8 = 5;
pub(super) const PATH: u8 = 6;

/// An answer's status (also an `OPEN` answer's first byte).
pub(super) mod status {
    pub const OK: u8 = 0;
    pub const NO_REGION: u8 = 1;
    pub const DENIED: u8 = 2;
    pub const REVOKED: u8 = 3;
    pub const OUT_OF_BOUNDS: u8 = 4;
    pub const MISALIGNED: u8 = 5;
}

/// What a request asks.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Op<'a> {
    Get { len: u64 },
    Put(&'a [u8]),
    Swap(u64),
    FetchAdd(u64),
    Cas { current: u64, new: u64 },
    Path { steps: Vec<Step>, len: u64 },
}

/// A request, as its owner reads it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Request<'a> {
    pub key: &'a [u8],
    pub epoch: u64,
    pub offset: u64,
    pub op: Op<'a>,
}

/// Bytes before a request's op-specific part.
const HEAD: usize = 1 + 16 + 8 + 8;

impl Request<'_> {
    /// Its bytes.
    pub fn encode(&self) -> Vec<u8> {
        let extra = match &self.op {
            Op::Put(bytes) => bytes.len(),
            Op::Path { steps, .. } => 9 + 17 * steps.len(),
            _ => 16,
        };
        let mut out = Vec::with_capacity(HEAD + extra);
        let code = match &self.op {
            Op::Get { .. } => GET,
            Op::Put(_) => PUT,
            Op::Swap(_) => SWAP,
            Op::FetchAdd(_) => FETCH_ADD,
            Op::Cas { .. } => CAS,
            Op::Path { .. } => PATH,
        };
        out.push(code);
        out.extend_from_slice(self.key);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        let mut word = |w: u64| out.extend_from_slice(&w.to_le_bytes());
        match &self.op {
            Op::Get { len } => word(*len),
            Op::Swap(v) | Op::FetchAdd(v) => word(*v),
            Op::Cas { current, new } => {
                word(*current);
                word(*new);
            }
            Op::Put(bytes) => out.extend_from_slice(bytes),
            Op::Path { steps, len } => {
                word(*len);
                out.push(steps.len() as u8);
                for step in steps {
                    match *step {
                        Step::Field(k) => {
                            out.push(0);
                            out.extend_from_slice(&k.to_le_bytes());
                        }
                        Step::Index { index, size } => {
                            out.push(1);
                            out.extend_from_slice(&index.to_le_bytes());
                            out.extend_from_slice(&size.to_le_bytes());
                        }
                        Step::Indirect => out.push(2),
                    }
                }
            }
        }
        out
    }
}

/// Reads little-endian words off the front of a peer's bytes.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }

    /// `Some(())` if nothing is left.
    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

/// A request (an importer's bytes), or `None` if it has no known form or
/// asks to read more than [`MAX_SERVED_BYTES`] (importers split larger reads).
pub(crate) fn decode_request(bytes: &[u8]) -> Option<Request<'_>> {
    let mut r = Reader(bytes);
    let code = r.u8()?;
    let key = r.bytes(16)?;
    let (epoch, offset) = (r.u64()?, r.u64()?);
    let op = match code {
        GET => Op::Get { len: r.u64().filter(|&l| l <= MAX_SERVED_BYTES as u64)? },
        PUT => Op::Put(std::mem::take(&mut r.0)),
        SWAP => Op::Swap(r.u64()?),
        FETCH_ADD => Op::FetchAdd(r.u64()?),
        CAS => Op::Cas { current: r.u64()?, new: r.u64()? },
        PATH => {
            let len = r.u64().filter(|&l| l <= MAX_SERVED_BYTES as u64)?;
            let n = usize::from(r.u8()?);
            if n > MAX_PATH_STEPS {
                return None;
            }
            let mut steps = Vec::with_capacity(n);
            for _ in 0..n {
                steps.push(match r.u8()? {
                    0 => Step::Field(r.u64()?),
                    1 => Step::Index { index: r.u64()?, size: r.u64()? },
                    2 => Step::Indirect,
                    _ => return None,
                });
            }
            Op::Path { steps, len }
        }
        _ => return None,
    };
    r.end()?;
    Some(Request { key, epoch, offset, op })
}

/// The answer that reports `e` (an error of a served operation).
pub(super) fn error_answer(e: &Error) -> Vec<u8> {
    let mut out = Vec::with_capacity(17);
    match *e {
        Error::OutOfBounds { offset, len, .. } => {
            out.push(status::OUT_OF_BOUNDS);
            out.extend_from_slice(&offset.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        Error::Misaligned { offset } => {
            out.push(status::MISALIGNED);
            out.extend_from_slice(&offset.to_le_bytes());
        }
        Error::AccessDenied { .. } => out.push(status::DENIED),
        Error::Revoked { .. } => out.push(status::REVOKED),
        _ => out.push(status::NO_REGION),
    }
    out
}

/// What an answer (the owner's bytes) to an operation on `region` (of
/// `region_len` bytes) says: the bytes after an `OK`, or the error it
/// reports, or `Err(Protocol)` if it has no known form.
pub(crate) fn parse_answer(answer: &[u8], region: EndpointId, region_len: u64) -> Result<&[u8]> {
    let bad = || Error::Protocol {
        peer: region.team_id(),
        violation: crate::Violation::BadRegionAnswer("an operation's answer of no known form".into()),
    };
    let mut r = Reader(answer);
    let e = match r.u8().ok_or_else(bad)? {
        status::OK => return Ok(r.0),
        status::NO_REGION => Error::NoSuchEndpoint(region),
        status::DENIED => Error::AccessDenied { region },
        status::REVOKED => Error::Revoked { region },
        status::OUT_OF_BOUNDS => {
            Error::OutOfBounds { offset: r.u64().ok_or_else(bad)?, len: r.u64().ok_or_else(bad)?, region_len }
        }
        status::MISALIGNED => Error::Misaligned { offset: r.u64().ok_or_else(bad)? },
        _ => return Err(bad()),
    };
    r.end().ok_or_else(bad)?;
    Err(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_malformed_ones_are_refused() {
        let key = [7u8; 16];
        let steps = vec![Step::Field(3), Step::Index { index: 2, size: 16 }, Step::Indirect];
        for op in [
            Op::Get { len: 8 },
            Op::Put(b"hello"),
            Op::Put(b""),
            Op::Swap(1),
            Op::FetchAdd(2),
            Op::Cas { current: 3, new: 4 },
            Op::Path { steps, len: 8 },
        ] {
            let req = Request { key: &key, epoch: 9, offset: 24, op };
            let bytes = req.encode();
            assert_eq!(decode_request(&bytes).as_ref(), Some(&req));
            if !matches!(req.op, Op::Put(_)) {
                assert_eq!(decode_request(&[&bytes[..], &[0]].concat()), None, "a byte too many");
            }
            assert_eq!(decode_request(&bytes[..bytes.len() - 1]).filter(|_| !matches!(req.op, Op::Put(_))), None);
        }
        let mut too_long = Request { key: &key, epoch: 1, offset: 0, op: Op::Path { steps: vec![], len: 1 } }.encode();
        *too_long.last_mut().unwrap() = (MAX_PATH_STEPS + 1) as u8;
        too_long.extend(std::iter::repeat_n(2, MAX_PATH_STEPS + 1));
        assert_eq!(decode_request(&too_long), None);
        assert_eq!(decode_request(&[99; 40]), None);
        let huge = Request { key: &key, epoch: 1, offset: 0, op: Op::Get { len: MAX_SERVED_BYTES as u64 + 1 } };
        assert_eq!(decode_request(&huge.encode()), None, "a read larger than one answer");
    }

    #[test]
    fn answers_say_what_went_wrong() {
        let region = EndpointId::at(crate::id::Addr::new(1, 2, 4).unwrap(), 3);
        let oob = Error::OutOfBounds { offset: 5, len: 6, region_len: 0 };
        assert!(matches!(
            parse_answer(&error_answer(&oob), region, 100),
            Err(Error::OutOfBounds { offset: 5, len: 6, region_len: 100 })
        ));
        assert!(matches!(
            parse_answer(&error_answer(&Error::Revoked { region }), region, 1),
            Err(Error::Revoked { .. })
        ));
        assert_eq!(parse_answer(&[status::OK, 1, 2], region, 1).unwrap(), &[1, 2]);
        assert!(matches!(parse_answer(&[], region, 1), Err(Error::Protocol { .. })));
        assert!(matches!(parse_answer(&[status::MISALIGNED, 1], region, 1), Err(Error::Protocol { .. })));
        assert!(matches!(parse_answer(&[status::DENIED, 1], region, 1), Err(Error::Protocol { .. })));
        assert!(matches!(parse_answer(&[200], region, 1), Err(Error::Protocol { .. })));
    }
}
