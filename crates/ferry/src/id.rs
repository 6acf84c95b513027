//! Endpoint identity: 64 bits `{node: 16, team: 24, slot: 24}`, printed `node.team.slot`.
//!
//! An id fits in a register and locates its owner directly: the node picks the
//! machine, the team the process on it, the slot the endpoint in that process.

use std::fmt;
use std::str::FromStr;

/// Largest team number (24 bits).
pub const MAX_TEAM: u32 = (1 << 24) - 1;
/// Largest slot number (24 bits).
pub const MAX_SLOT: u32 = (1 << 24) - 1;

/// The address of one process: which node, which team on it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct TeamId {
    pub node: u16,
    pub team: u32,
}

/// The address of one endpoint (a port, a service, ...).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct EndpointId(u64);

impl EndpointId {
    /// The id that names nothing (used as "no source" on the wire).
    pub const NONE: EndpointId = EndpointId(0);

    /// Builds an id; `None` if `team` or `slot` does not fit in 24 bits.
    pub fn new(node: u16, team: u32, slot: u32) -> Option<EndpointId> {
        if team > MAX_TEAM || slot > MAX_SLOT {
            return None;
        }
        Some(EndpointId(((node as u64) << 48) | ((team as u64) << 24) | slot as u64))
    }
    pub const fn from_bits(bits: u64) -> EndpointId {
        EndpointId(bits)
    }
    pub const fn bits(self) -> u64 {
        self.0
    }
    pub const fn node(self) -> u16 {
        (self.0 >> 48) as u16
    }
    pub const fn team(self) -> u32 {
        ((self.0 >> 24) & MAX_TEAM as u64) as u32
    }
    pub const fn slot(self) -> u32 {
        (self.0 & MAX_SLOT as u64) as u32
    }
    pub const fn team_id(self) -> TeamId {
        TeamId { node: self.node(), team: self.team() }
    }
}

impl TeamId {
    pub fn endpoint(self, slot: u32) -> Option<EndpointId> {
        EndpointId::new(self.node, self.team, slot)
    }
}

impl fmt::Display for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.node(), self.team(), self.slot())
    }
}

impl fmt::Debug for EndpointId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for TeamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.node, self.team)
    }
}

/// Error of parsing `node.team.slot`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not an endpoint id (want node.team.slot with node < 2^16, team and slot < 2^24): {0:?}")]
pub struct ParseEndpointIdError(String);

impl FromStr for EndpointId {
    type Err = ParseEndpointIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseEndpointIdError(s.to_string());
        let mut it = s.split('.');
        let (Some(n), Some(t), Some(sl), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(bad());
        };
        let node: u16 = n.parse().map_err(|_| bad())?;
        let team: u32 = t.parse().map_err(|_| bad())?;
        let slot: u32 = sl.parse().map_err(|_| bad())?;
        EndpointId::new(node, team, slot).ok_or_else(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_bits_and_text() {
        let id = EndpointId::new(7, 0xAB_CDEF, 0x12_3456).unwrap();
        assert_eq!((id.node(), id.team(), id.slot()), (7, 0xAB_CDEF, 0x12_3456));
        assert_eq!(EndpointId::from_bits(id.bits()), id);
        let text = id.to_string();
        assert_eq!(text, format!("7.{}.{}", 0xAB_CDEF, 0x12_3456));
        assert_eq!(text.parse::<EndpointId>().unwrap(), id);
    }

    #[test]
    fn rejects_out_of_range_parts() {
        assert!(EndpointId::new(0, MAX_TEAM + 1, 0).is_none());
        assert!(EndpointId::new(0, 0, MAX_SLOT + 1).is_none());
        assert!("1.2".parse::<EndpointId>().is_err());
        assert!("1.2.3.4".parse::<EndpointId>().is_err());
        assert!("70000.1.1".parse::<EndpointId>().is_err());
        assert!("1.16777216.1".parse::<EndpointId>().is_err());
    }
}
