//! Benchmark harness for ferry.
//!
//! A suite (such as `pingpong`) is a list of [`Case`]s. Each case is a pair of
//! functions: the parent side runs in the calling process and returns one
//! sample per round (ns per round trip) or one per call (a latency case
//! timed call by call: its median and p99 are per call); the child side
//! runs in a separate process, started by re-executing the current binary.
//! Every case gets a fresh child, a shared memory region and a Unix stream
//! socket (see [`Peer`] and [`ChildCtx`]).
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
mod cluster_soak;
pub mod crash;
mod crowd;
mod fdpass;
mod ferry_pingpong;
pub mod ferry_rpc;
pub mod fifo_bench;
pub mod floors;
mod harness;
#[cfg(feature = "iceoryx2")]
pub mod iceoryx2_peer;
pub mod large;
pub mod link_bench;
mod memory;
mod mpi_peer;
pub mod oversub;
pub mod remote_memory;
mod report;
pub mod rpc_peers;
mod rpc_roles;
mod run_dir;
pub mod scale;
mod shm;
pub mod soak;
mod stats;
mod suites;
mod targets;
#[cfg(feature = "tarpc")]
mod tarpc_peer;
pub mod tcp;
mod windows;

pub use child::child_main_if_requested;
pub use harness::{pin_current_thread, run_suite, Case, ChildCtx, Params, Peer};
pub use report::{CaseResult, Report};
pub use shm::ShmRegion;
pub use stats::{Stat, Stats};
pub use suites::{
    all_cases, links as links_suite, memory as memory_suite, pingpong, pingpong_cases, rpc, tcp_suite, BenchArgs,
};

/// A failed check of a bench (not of ferry) as the bench's error: `what`
/// went wrong while doing `context`.
pub(crate) fn failed(context: &'static str, what: impl std::fmt::Display) -> ferry::Error {
    ferry::Error::Io { context, source: std::io::Error::other(what.to_string()) }
}

/// First thing in `main()` of a binary that runs suites: if this process is
/// a benchmark's second process, play that part and exit.
pub fn child_main() {
    crash::team_if_requested();
    large::receiver_if_requested();
    soak::team_if_requested();
    cluster_soak::team_if_requested();
    ferry_rpc::breakdown_child_if_requested();
    crowd_member_if_requested();
    child_main_if_requested(&all_cases());
}

/// If this process is a member of a case's crowd (see `crowd.rs`), plays
/// its role and exits. [`child_main`] calls it; a binary with its own list
/// of cases that runs the many-process ones calls it first thing too.
pub fn crowd_member_if_requested() {
    crowd::member_if_requested(&[&rpc_roles::roles()[..], &oversub::roles()[..]].concat());
}

/// The round-trip floors (and the iceoryx2 peer when the `iceoryx2` feature
/// is on), in the order they are reported. Append ferry's own cases to this
/// list, then hand the whole list to both [`child_main_if_requested`] and
/// [`run_suite`].
pub fn pingpong_floor_cases() -> Vec<Case> {
    #[allow(unused_mut)]
    let mut cases = floors::cases();
    #[cfg(feature = "iceoryx2")]
    cases.extend([iceoryx2_peer::case(), iceoryx2_peer::pubsub_case()]);
    cases
}

/// The peers of the RPC suite, in the order they are reported: `raw.uds.*`
/// always; `iceoryx2.req_resp.arg1024`, `tonic.uds.*` and `zmq.ipc.*` with
/// the features `iceoryx2`, `tonic` and `zmq` (or `peers` for all three).
/// The null iceoryx2 call, `iceoryx2.req_resp`, is in
/// [`pingpong_floor_cases`], not here. See [`rpc_peers`].
pub fn rpc_peer_cases() -> Vec<Case> {
    rpc_peers::cases()
}
