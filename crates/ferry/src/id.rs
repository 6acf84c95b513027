//! Identity: which team, which endpoint.
//!
//! A team is named by `{node, team, incarnation}`: the node (machine), the
//! team's number on it (a process id, or a number above every pid for a
//! second team of one process) and an *incarnation*, a random 32-bit value
//! drawn when the team starts. Team numbers are reused (pids are), so the
//! number alone cannot tell a team from a later process that got the same
//! pid; the incarnation can. It is exchanged and checked in the bind
//! handshake, so a channel is bound to one incarnation of its peer, and an
//! id that names a dead incarnation fails with `NoSuchTeam` instead of
//! reaching whoever holds the number now.
//!
//! An [`EndpointId`] is a team id plus a slot, printed
//! `node.team.slot#incarnation` (incarnation in hex). On the wire a frame
//! carries only the 64-bit [`Addr`] `{node: 16, team: 24, slot: 24}`: the
//! incarnations of both ends are those of the channel the frame travels on,
//! and the runtime checks that a frame's addresses name the channel's two
//! teams.
//!
//! Slots below [`LINK_SLOTS`] name endpoints; the upper half names a
//! link's routers in their frames' headers (`LINK_SLOTS + handle`, see
//! `docs/LINK.md`, "Wire"). A link's id is 128 bits of its own, carried
//! in its full frames' route: `crate::link::LinkId`.

use std::fmt;
use std::str::FromStr;

/// Largest team number (24 bits).
pub const MAX_TEAM: u32 = (1 << 24) - 1;
/// Largest slot number (24 bits).
pub const MAX_SLOT: u32 = (1 << 24) - 1;
/// First slot of the range that names link routers; endpoints use `1..LINK_SLOTS`.
pub const LINK_SLOTS: u32 = 1 << 23;

/// One incarnation of one process: which node, which team number on it, which run.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug, serde::Serialize, serde::Deserialize)]
pub struct TeamId {
    /// The machine.
    pub node: u16,
    /// The team's number on its node (24 bits): its process id, or a number
    /// above every pid for a further team of one process.
    pub team: u32,
    /// Drawn at random when the team starts; never 0.
    pub incarnation: u32,
}

impl TeamId {
    /// The id of this team's endpoint `slot`; `None` if the slot does not fit in 24 bits.
    pub fn endpoint(self, slot: u32) -> Option<EndpointId> {
        Some(EndpointId { addr: Addr::new(self.node, self.team, slot)?, incarnation: self.incarnation })
    }

    /// Whether `addr` names an endpoint of this team (incarnations aside).
    pub fn owns(self, addr: Addr) -> bool {
        addr.node() == self.node && addr.team() == self.team
    }
}

impl fmt::Display for TeamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}#{:08x}", self.node, self.team, self.incarnation)
    }
}

/// The wire form of an endpoint's address: `{node: 16, team: 24, slot: 24}`
/// in 64 bits, printed `node.team.slot`. It carries no incarnation: the
/// channel a frame travels on fixes those of both ends.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Addr(u64);

impl Addr {
    /// The address that names nothing.
    pub const NONE: Addr = Addr(0);

    /// Builds an address; `None` if `team` or `slot` does not fit in 24 bits.
    pub fn new(node: u16, team: u32, slot: u32) -> Option<Addr> {
        if team > MAX_TEAM || slot > MAX_SLOT {
            return None;
        }
        Some(Addr(((node as u64) << 48) | ((team as u64) << 24) | slot as u64))
    }
    /// The address whose wire form is `bits` (every value is one).
    pub const fn from_bits(bits: u64) -> Addr {
        Addr(bits)
    }
    /// The 64-bit wire form.
    pub const fn bits(self) -> u64 {
        self.0
    }
    /// The node part.
    pub const fn node(self) -> u16 {
        (self.0 >> 48) as u16
    }
    /// The team part (24 bits).
    pub const fn team(self) -> u32 {
        ((self.0 >> 24) & MAX_TEAM as u64) as u32
    }
    /// The slot part (24 bits).
    pub const fn slot(self) -> u32 {
        (self.0 & MAX_SLOT as u64) as u32
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.node(), self.team(), self.slot())
    }
}

impl fmt::Debug for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The id of one endpoint (a port, a service, ...) of one team incarnation.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize)]
pub struct EndpointId {
    #[serde(with = "addr_bits")]
    addr: Addr,
    incarnation: u32,
}

impl EndpointId {
    /// The id that names nothing.
    pub const NONE: EndpointId = EndpointId { addr: Addr::NONE, incarnation: 0 };

    /// The endpoint at `addr` of the team incarnation `incarnation`.
    pub const fn at(addr: Addr, incarnation: u32) -> EndpointId {
        EndpointId { addr, incarnation }
    }
    /// The wire address (without the incarnation).
    pub const fn addr(self) -> Addr {
        self.addr
    }
    /// The owning team's node.
    pub const fn node(self) -> u16 {
        self.addr.node()
    }
    /// The owning team's number on its node.
    pub const fn team(self) -> u32 {
        self.addr.team()
    }
    /// The endpoint's slot in its team.
    pub const fn slot(self) -> u32 {
        self.addr.slot()
    }
    /// The owning team's incarnation.
    pub const fn incarnation(self) -> u32 {
        self.incarnation
    }
    /// The owning team.
    pub const fn team_id(self) -> TeamId {
        TeamId { node: self.addr.node(), team: self.addr.team(), incarnation: self.incarnation }
    }
}

mod addr_bits {
    use super::Addr;
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(a: &Addr, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(a.bits())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Addr, D::Error> {
        u64::deserialize(d).map(Addr::from_bits)
    }
}

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{:08x}", self.addr, self.incarnation)
    }
}

impl fmt::Debug for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Error of parsing `node.team.slot#incarnation`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not an endpoint id (want node.team.slot#incarnation with node < 2^16, team and slot < 2^24, \
     incarnation 8 hex digits): {0:?}"
)]
pub struct ParseEndpointIdError(String);

impl FromStr for EndpointId {
    type Err = ParseEndpointIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseEndpointIdError(s.to_string());
        let (addr, inc) = s.split_once('#').ok_or_else(bad)?;
        let mut it = addr.split('.');
        let (Some(n), Some(t), Some(sl), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(bad());
        };
        let node: u16 = n.parse().map_err(|_| bad())?;
        let team: u32 = t.parse().map_err(|_| bad())?;
        let slot: u32 = sl.parse().map_err(|_| bad())?;
        if inc.len() != 8 {
            return Err(bad());
        }
        let incarnation = u32::from_str_radix(inc, 16).map_err(|_| bad())?;
        Ok(EndpointId { addr: Addr::new(node, team, slot).ok_or_else(bad)?, incarnation })
    }
}

/// A fresh incarnation: random, never 0 (which names nothing).
pub(crate) fn new_incarnation() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's randomness once per process and
    // then per instance; mixing in the time keeps two teams of one process apart.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    (h.finish() as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_bits_and_text() {
        let team = TeamId { node: 7, team: 0xAB_CDEF, incarnation: 0x0102_0304 };
        let id = team.endpoint(0x12_3456).unwrap();
        assert_eq!((id.node(), id.team(), id.slot(), id.incarnation()), (7, 0xAB_CDEF, 0x12_3456, 0x0102_0304));
        assert_eq!(id.team_id(), team);
        assert_eq!(Addr::from_bits(id.addr().bits()), id.addr());
        let text = id.to_string();
        assert_eq!(text, format!("7.{}.{}#01020304", 0xAB_CDEF, 0x12_3456));
        assert_eq!(text.parse::<EndpointId>().unwrap(), id);
        let bytes = rmp_serde::to_vec(&id).unwrap();
        assert_eq!(rmp_serde::from_slice::<EndpointId>(&bytes).unwrap(), id);
    }

    #[test]
    fn rejects_out_of_range_parts() {
        assert!(Addr::new(0, MAX_TEAM + 1, 0).is_none());
        assert!(Addr::new(0, 0, MAX_SLOT + 1).is_none());
        for bad in
            ["1.2#00000001", "1.2.3.4#00000001", "70000.1.1#00000001", "1.16777216.1#00000001", "1.2.3", "1.2.3#1"]
        {
            assert!(bad.parse::<EndpointId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn incarnations_differ_and_are_never_zero() {
        let a: Vec<u32> = (0..64).map(|_| new_incarnation()).collect();
        assert!(a.iter().all(|&i| i != 0));
        let mut b = a.clone();
        b.sort();
        b.dedup();
        assert_eq!(a.len(), b.len());
    }
}
