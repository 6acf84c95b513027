//! Benchmark harness for ferry.
//!
//! A suite (such as `pingpong`) is a list of [`Case`]s. Each case is a pair of
//! functions: the parent side runs in the calling process and returns one
//! sample per round (ns per round trip); the child side runs in a separate
//! process, started by re-executing the current binary. Every case gets a
//! fresh child, a shared memory region and a Unix stream socket (see
//! [`Peer`] and [`ChildCtx`]).
//!
//! A binary that runs suites must call [`child_main_if_requested`] first
//! thing in `main()`, with the same list of cases it will run:
//!
//! ```no_run
//! // first thing in main():
//! let cases = ferry_bench::pingpong_floor_cases(); // plus the binary's own cases
//! ferry_bench::child_main_if_requested(&cases);
//! // ...
//! let report = ferry_bench::run_suite("pingpong", &cases, &ferry_bench::Params::default());
//! report.print_table("floor.spin.two_line");
//! ```
//!
//! Case names are dotted `system.transport.variant` and keep their meaning
//! forever, so that figures from different runs stay comparable.

mod child;
mod fdpass;
pub mod floors;
mod harness;
#[cfg(feature = "iceoryx2")]
pub mod iceoryx2_peer;
mod report;
mod shm;
mod stats;

pub use child::child_main_if_requested;
pub use harness::{run_suite, Case, ChildCtx, Params, Peer};
pub use report::{CaseResult, Report};
pub use shm::ShmRegion;
pub use stats::Stats;

/// The round-trip floors (and the iceoryx2 peer when the `iceoryx2` feature
/// is on), in the order they are reported. Append ferry's own cases to this
/// list, then hand the whole list to both [`child_main_if_requested`] and
/// [`run_suite`].
pub fn pingpong_floor_cases() -> Vec<Case> {
    #[allow(unused_mut)]
    let mut cases = floors::cases();
    #[cfg(feature = "iceoryx2")]
    cases.push(iceoryx2_peer::case());
    cases
}
