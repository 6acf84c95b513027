//! The runtime of one team: processors running tasks, the progress loop that
//! drains channels into inboxes, the send path, and peer-death handling.
//!
//! Communication and scheduling are one piece (the lesson of URPC and LYNX):
//! a thread with nothing to run polls the channels itself, spins a bounded
//! time, and only then sleeps, so while both sides are busy a round trip
//! makes no system call.
//!
//! One concern per file; each component owns its locks:
//!
//! | file | what |
//! |---|---|
//! | `config` | settings and the builder |
//! | `cluster` | the node's place in a cluster: addresses, key, placement |
//! | `team` | `Team`/`TeamInner`: start, shutdown, names, timers |
//! | `endpoints` | slots and the inbox behind each |
//! | `calls`, `call_slab` | our sends waiting for answers (a slab by call id); hooks for peers' cancels |
//! | `delivery` | the future of one send |
//! | `peers` | the channel to each peer team: bind (shared memory on this node, TCP to another), reclaim |
//! | `send` | one message onto a channel; acks, replies, nacks |
//! | `served` | the extension point: primitives' handlers of their frame kinds |
//! | `dispatch` | the progress loop's receive path |
//! | `direct_receive` | a blocked port's, link end's or caller's receive straight from a channel |
//! | `readiness` | which channels a spinning thread looks at each turn |
//! | `outbox` | async sends waiting for room, sent in order |
//! | `channel`, `channel_list`, `inbox`, `payload` | the data structures they share |
//! | `idle`, `executor`, `timer`, `sleep`, `reactor` | threads, tasks, time, sockets |
//! | `blocking` | the pool of threads for blocking jobs (`spawn_blocking`) |
//!
//! Lock order (a thread holding one may take those after it, never before):
//! `peers.binding` → a bind's state → channel `rx` → outbox `flushing` →
//! outbox queue → a queued send's slot → channel `backlog` → channel `tx` →
//! inbox state → `calls.cancels` → `calls.early_cancels`; a call slab
//! entry's lock, `peers.map`, the endpoint table and the channel list are leaves. (The
//! reactor holds a channel's `rx` while it records the peer's hang-up and
//! sweeps the dead team's files: file locks and a directory, no runtime lock.)

mod blocking;
#[cfg(test)]
mod bounds_tests;
pub(crate) mod call_slab;
pub(crate) mod calls;
pub(crate) mod channel;
mod channel_list;
pub mod cluster;
mod config;
mod deadline;
mod delivery;
mod direct_receive;
mod dispatch;
mod endpoints;
mod executor;
pub(crate) mod handoff;
mod handshakes;
pub(crate) mod idle;
pub(crate) mod inbox;
pub(crate) mod out;
mod outbox;
pub(crate) mod payload;
mod peers;
pub(crate) mod per_team;
pub(crate) mod reactor;
mod readiness;
mod send;
pub(crate) mod served;
mod sleep;
mod team;
mod timer;

pub(crate) use calls::CancelGuard;
pub use channel::CONTROL_BACKLOG;
pub use cluster::{Cidr, Cluster};
#[cfg(any(test, feature = "testing"))]
pub(crate) use config::MAX_THREADS;
pub use config::{Config, TeamBuilder, MESSAGE_OVERHEAD};
pub(crate) use deadline::deadline_after;
pub use delivery::Delivery;
pub(crate) use endpoints::EndpointInbox;
pub(crate) use executor::{panic_message, CatchUnwind};
pub use executor::{AbortHandle, JoinHandle};
pub(crate) use peers::{Binding, Route};
pub(crate) use send::Form;
pub use sleep::Sleep;
pub use team::Team;
pub(crate) use team::TeamInner;
