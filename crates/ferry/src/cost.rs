//! Cost accounting (DESIGN "Cost accounting"; URPC Table II, LYNX
//! Figure 3): where a call's time goes, stage by stage, on both sides.
//!
//! Off by default. With the `cost` cargo feature (on by default) each hook
//! is one relaxed load of a flag while switched off; without the feature
//! the hooks compile to nothing. `set_enabled(true)` starts recording
//! process-wide totals; `snapshot()` reads them.

use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// One stage of a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stage {
    /// Client: arguments encoded into a request.
    Encode,
    /// Client: the request written into the channel.
    Send,
    /// Client: waiting for the reply (includes everything at the server).
    Poll,
    /// Client: reply decoded. Server: request taken off the channel into the endpoint's inbox.
    Receive,
    /// Server: from the inbox to the handler starting (accept, decode arguments, task start).
    Dispatch,
    /// Server: the handler itself.
    Handler,
    /// Server: the reply written into the channel.
    Reply,
}

/// Every stage, in the order a call goes through them.
pub const STAGES: [Stage; 7] =
    [Stage::Encode, Stage::Send, Stage::Poll, Stage::Receive, Stage::Dispatch, Stage::Handler, Stage::Reply];

/// Which end of a call a stage ran on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Side {
    /// The caller.
    Client,
    /// The team serving the call.
    Server,
}

static ENABLED: AtomicBool = AtomicBool::new(false);
#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const ROW: [AtomicU64; 7] = [ZERO; 7];
static TOTAL_NS: [[AtomicU64; 7]; 2] = [ROW; 2];
static COUNT: [[AtomicU64; 7]; 2] = [ROW; 2];

/// Whether recording is on (always false without the `cost` feature).
#[inline(always)]
pub fn enabled() -> bool {
    cfg!(feature = "cost") && ENABLED.load(Ordering::Relaxed)
}

/// Switches recording on or off, process-wide (recording nothing without the `cost` feature).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether this build can record at all.
pub const fn compiled_in() -> bool {
    cfg!(feature = "cost")
}

/// Clears the totals recorded so far.
pub fn reset() {
    for side in 0..2 {
        for stage in 0..7 {
            TOTAL_NS[side][stage].store(0, Ordering::Relaxed);
            COUNT[side][stage].store(0, Ordering::Relaxed);
        }
    }
}

/// Starts timing a stage (a no-op when off).
#[inline(always)]
pub(crate) fn start() -> Option<Instant> {
    if enabled() {
        Some(Instant::now())
    } else {
        None
    }
}

/// Ends the stage started at `since` and starts the next one.
#[inline(always)]
pub(crate) fn record(side: Side, stage: Stage, since: Option<Instant>) -> Option<Instant> {
    let t0 = since?;
    let now = Instant::now();
    let (s, i) = (side as usize, stage as usize);
    TOTAL_NS[s][i].fetch_add(now.duration_since(t0).as_nanos() as u64, Ordering::Relaxed);
    COUNT[s][i].fetch_add(1, Ordering::Relaxed);
    Some(now)
}

/// Totals per side and stage.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Breakdown {
    /// (side, stage, count, mean ns)
    pub rows: Vec<(Side, Stage, u64, f64)>,
}

/// The totals recorded so far in this process.
pub fn snapshot() -> Breakdown {
    let mut rows = Vec::new();
    for side in [Side::Client, Side::Server] {
        for stage in STAGES {
            let n = COUNT[side as usize][stage as usize].load(Ordering::Relaxed);
            if n > 0 {
                let total = TOTAL_NS[side as usize][stage as usize].load(Ordering::Relaxed);
                rows.push((side, stage, n, total as f64 / n as f64));
            }
        }
    }
    Breakdown { rows }
}

impl Breakdown {
    /// The rows of one side, merged with another breakdown's (e.g. the
    /// server's, taken in its own process).
    pub fn merge(mut self, other: &Breakdown) -> Breakdown {
        self.rows.extend(other.rows.iter().cloned());
        self
    }

    /// The rows as a text table, one line per side and stage.
    pub fn table(&self) -> String {
        let mut out = String::from("side    stage        calls       mean\n");
        for (side, stage, n, mean) in &self.rows {
            out += &format!("{:7} {:10} {:>8}  {:>7.0} ns\n", format!("{side:?}"), format!("{stage:?}"), n, mean);
        }
        out
    }
}

#[cfg(all(test, feature = "cost"))]
mod tests {
    use super::*;

    #[test]
    fn records_only_when_enabled() {
        reset();
        assert!(record(Side::Client, Stage::Encode, start()).is_none());
        set_enabled(true);
        let t = start();
        std::thread::sleep(std::time::Duration::from_millis(2));
        record(Side::Server, Stage::Handler, t);
        set_enabled(false);
        let b = snapshot();
        assert_eq!(b.rows.len(), 1);
        let (side, stage, n, mean) = b.rows[0];
        assert_eq!((side, stage, n), (Side::Server, Stage::Handler, 1));
        assert!(mean >= 2e6, "{mean}");
        reset();
    }
}
