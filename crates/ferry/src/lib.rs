//! ferry: one family of communication primitives — ports, RPC, links,
//! groups, remote memory, fifos, signals, bulk transfer, remote activation,
//! names — each carried by the cheapest mechanism the placement of its two
//! ends allows: task hand-off in one process, shared memory between
//! processes of one machine, TCP between machines.
//!
//! The public surface: a [`Team`] (this process's presence, started by a
//! [`TeamBuilder`]; see [`runtime`]) opens [`port`]s, serves or calls
//! [`rpc`] services, exports and opens regions of [`memory`], reaches other teams' endpoints by [`id`] or by name
//! ([`names`]), and reports failures as [`Error`]s. [`codec`] is the
//! payload encoding of typed messages, [`cost`] the optional accounting
//! of where a call's time goes. [`extend`] is the extension point a
//! primitive plugs into the core by (its own frame kinds, served in the
//! progress loop).
//!
//! Inside, bottom up: the wire format (frames) → transports (frame pipes:
//! in process, shared memory) → the runtime (teams, tasks, progress) → the
//! primitives. None of those layers is public; the `testing` feature opens
//! the pieces ferry's own tests and benchmarks need (`ferry::testing`).

#![deny(missing_docs)]

pub mod cost;
pub mod error;
pub mod extend;
pub mod fifo;
pub mod id;
pub mod link;
#[cfg(all(test, loom))]
mod loom_models;
pub mod memory;
pub mod names;
pub mod port;
pub mod rpc;
pub mod runtime;
pub mod signal;
pub(crate) mod sync;
pub(crate) mod sys;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub(crate) mod transport;
pub(crate) mod wire;

pub use error::{Error, Limit, Refusal, Result, Violation};
pub use id::{EndpointId, TeamId};
pub use port::{Message, Port, RawMessage, RawPort, RawSender, Responder, Select, Sender};
pub use runtime::{AbortHandle, Cidr, Cluster, Config, Delivery, JoinHandle, Sleep, Team, TeamBuilder};
pub use transport::tcp::TlsConfig;
pub use wire::codec;
pub use wire::codec::Bytes;
pub use wire::Checkpoint;

/// Makes a trait a ferry RPC service (see [`rpc`]).
pub use ferry_macros::service;

/// The README's examples, compiled (and run, unless marked `no_run`) as
/// doc-tests, so that they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeExamples;
