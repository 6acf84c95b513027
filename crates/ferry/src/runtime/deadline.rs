//! Deadlines on the wire travel as a remaining budget (ns left when the
//! frame was sent), not a wall-clock time: two machines whose clocks differ
//! still agree on how long a call may take. The receiver turns the budget
//! into a local `Instant` when the message arrives; the time the frame spent
//! in flight is not subtracted (on one node it is well under a microsecond;
//! across machines it errs on the side of letting the handler finish).

use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// An instant in 8 bytes (an `Instant` takes 16): ns since this process's
/// first use of it; 0 means none.
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub(crate) struct LocalTime(u64);

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

impl LocalTime {
    pub fn new(at: Option<Instant>) -> LocalTime {
        let Some(at) = at else { return LocalTime(0) };
        LocalTime(u64::try_from(at.saturating_duration_since(*EPOCH).as_nanos()).unwrap_or(u64::MAX).max(1))
    }

    pub fn get(self) -> Option<Instant> {
        (self.0 != 0).then(|| *EPOCH + Duration::from_nanos(self.0))
    }
}

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

    #[test]
    fn local_times_round_trip_to_the_nanosecond() {
        assert_eq!(LocalTime::new(None).get(), None);
        let t = Instant::now() + Duration::from_millis(3);
        assert_eq!(LocalTime::new(Some(t)).get(), Some(t));
        assert!(LocalTime::new(Some(*EPOCH)).get().is_some(), "the epoch itself is not 'none'");
    }
}
