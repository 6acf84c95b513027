//! Deadlines on the wire: an absolute wall-clock time in a frame, a local
//! `Instant` everywhere else.

use crate::wire::Header;
use std::time::{Duration, Instant, SystemTime};

/// Turns a frame's wall-clock deadline into a local instant.
pub(crate) fn deadline_of(h: &Header) -> Option<Instant> {
    if h.deadline_ns == 0 {
        return None;
    }
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    Some(Instant::now() + Duration::from_nanos(h.deadline_ns.saturating_sub(now)))
}

/// Turns a local deadline into the frame's wall-clock form (never 0, which means none).
pub(crate) fn deadline_to_wall_ns(d: Instant) -> u64 {
    let left = d.saturating_duration_since(Instant::now());
    (SystemTime::now() + left).duration_since(SystemTime::UNIX_EPOCH).map_or(1, |t| t.as_nanos() as u64).max(1)
}
