#![doc = include_str!("../../../../docs/LINK.md")]

mod bytes;
mod end;
pub(crate) mod route;
#[cfg(all(test, not(loom)))]
mod route_model;
pub(crate) mod stream;
mod table;
pub(crate) mod wire;

pub use bytes::LinkBytes;
pub use end::{Link, LinkMessage};
#[cfg(all(test, not(loom)))]
pub(crate) use end::{CAUGHT, SHORTS};
pub use table::{LinkListener, LinkRouters};

use crate::runtime::TeamInner;
use std::fmt;
use std::sync::{Arc, Weak};

thread_local! {
    /// The team that took a message on this thread last (see `received_by`).
    static RECEIVER: std::cell::RefCell<Weak<TeamInner>> = const { std::cell::RefCell::new(Weak::new()) };
    /// `RECEIVER`'s address, checked without `RECEIVER`'s costlier access.
    static RECEIVER_ADDR: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Notes that `team` took a message on this thread: a link end decoded
/// from it becomes `team`'s (no atomic operation while it stays the same team).
#[inline(always)]
pub(crate) fn received_by(team: &Arc<TeamInner>) {
    if RECEIVER_ADDR.get() != Arc::as_ptr(team) as usize {
        remember_receiver(team);
    }
}

/// `received_by`'s rare part, kept out of every receive's code.
#[inline(never)]
fn remember_receiver(team: &Arc<TeamInner>) {
    RECEIVER_ADDR.set(Arc::as_ptr(team) as usize);
    RECEIVER.with(|r| *r.borrow_mut() = Arc::downgrade(team));
}

/// The team that took a message on this thread last, if it lives.
fn receiver() -> Option<Arc<TeamInner>> {
    RECEIVER.with(|r| r.borrow().upgrade())
}

/// Links waiting in one listener to be accepted: past them, `link_to`
/// fails with `LimitReached` (`Limit::LinkBacklog`).
pub const BACKLOG: usize = 256;

/// The served kinds links take (`docs/WIRE.md`).
pub(crate) const KINDS: std::ops::RangeInclusive<u8> = 88..=95;

/// A link's id: its origin team (node, number, incarnation) and a counter
/// of that team's, 128 bits — unique for the link's life wherever its ends
/// go. It is not a capability: frames for a link are taken only from the
/// team its protocol set up as the other end's.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkId(pub(crate) u128);

impl LinkId {
    pub(crate) fn new(origin: crate::TeamId, counter: u64) -> LinkId {
        let team = (u128::from(origin.node) << 56) | (u128::from(origin.team) << 32) | u128::from(origin.incarnation);
        LinkId((team << 56) | u128::from(counter & ((1 << 56) - 1)))
    }
}

impl fmt::Display for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let team = self.0 >> 56;
        let (node, number, incarnation) = (team >> 56, (team >> 32) & 0xff_ffff, team & 0xffff_ffff);
        write!(f, "link {node}.{number}#{incarnation:08x}/{}", self.0 & ((1 << 56) - 1))
    }
}

impl fmt::Debug for LinkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Which end of a link: the one that made it (`A`), or the other.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub(crate) enum Side {
    A = 0,
    B = 1,
}

impl Side {
    pub fn other(self) -> Side {
        match self {
            Side::A => Side::B,
            Side::B => Side::A,
        }
    }
}

/// Messages and bytes, counted along one direction of a link.
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub(crate) struct Count {
    pub messages: u64,
    pub bytes: u64,
}

/// How far ahead of its receiver a side may send, and the largest
/// message (or reply) it may send: what every team on the link's route
/// takes of it (see `Links::window`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Window {
    pub messages: u32,
    pub bytes: u32,
    pub largest: u64,
}
