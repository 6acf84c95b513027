//! ferry: one family of communication primitives — ports, RPC, links,
//! groups, remote memory, fifos, signals, bulk transfer, remote activation,
//! names — each carried by the cheapest mechanism the placement of its two
//! ends allows: task hand-off in one process, shared memory between
//! processes of one machine, TCP between machines.
//!
//! Layers, bottom up: [`wire`] (frames and codec) → [`transport`] (frame
//! pipes: inproc, shm) → [`runtime`] (teams, tasks, progress) → primitives
//! ([`port`]) and [`names`].

pub mod cost;
pub mod error;
pub mod id;
#[cfg(all(test, loom))]
mod loom_models;
pub mod names;
pub mod port;
pub mod rpc;
pub mod runtime;
pub mod sync;
pub(crate) mod sys;
#[cfg(test)]
pub(crate) mod testing;
pub mod transport;
pub mod wire;

pub use error::{Error, Result};
pub use id::{EndpointId, TeamId};
pub use port::{Message, Port, RawMessage, RawPort, RawSender, Responder, Select, Sender};
pub use runtime::{AbortHandle, Config, Delivery, JoinHandle, Sleep, Team, TeamBuilder};
pub use wire::Checkpoint;

/// Makes a trait a ferry RPC service (see [`rpc`]).
pub use ferry_macros::service;
