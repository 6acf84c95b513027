//! Deadlines on the wire travel as a remaining budget (ns left when the
//! frame was sent), not a wall-clock time: two machines whose clocks differ
//! still agree on how long a call may take. The receiver turns the budget
//! into a local `Instant` when the message arrives; the time the frame spent
//! in flight is not subtracted (on one node it is well under a microsecond;
//! across machines it errs on the side of letting the handler finish).

use std::time::{Duration, Instant};

/// The instant `limit` from now; `None` (no deadline) for a limit too far
/// to end, so `Duration::MAX` means "no limit" instead of overflowing
/// `Instant`. Past ~100 years counts as none too.
pub(crate) fn deadline_after(limit: Duration) -> Option<Instant> {
    const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    if limit >= FOREVER {
        return None;
    }
    Instant::now().checked_add(limit)
}

/// The budget a frame carries for `deadline` (never 0, which means none;
/// a deadline already past becomes 1 ns: expired on arrival).
pub(crate) fn budget_ns(deadline: Instant) -> u64 {
    let left = deadline.saturating_duration_since(Instant::now()).as_nanos();
    u64::try_from(left).unwrap_or(u64::MAX).max(1)
}

/// The local deadline of a frame that arrived now carrying `budget_ns`.
pub(crate) fn deadline_on_arrival(budget_ns: u64) -> Option<Instant> {
    if budget_ns == 0 {
        return None;
    }
    // A budget too far out to represent is no deadline at all.
    Instant::now().checked_add(Duration::from_nanos(budget_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_round_trips_to_about_the_same_deadline() {
        let d = Instant::now() + Duration::from_millis(250);
        let back = deadline_on_arrival(budget_ns(d)).unwrap();
        assert!(back >= d && back - d < Duration::from_millis(50));
        assert_eq!(deadline_on_arrival(0), None);
        assert_eq!(budget_ns(Instant::now() - Duration::from_secs(1)), 1, "past: expires on arrival");
        assert!(deadline_on_arrival(u64::MAX).is_some_and(|d| d > Instant::now() + Duration::from_secs(1 << 30)));
    }
}
