//! A primitive's own state in each team of this process that uses it (see
//! [`PerTeam`]).

use super::served::{FrameHandler, ServedKinds};
use crate::error::Result;
use crate::id::TeamId;
use crate::runtime::TeamInner;
use crate::Team;
use parking_lot::Mutex;
use std::ops::RangeInclusive;
use std::sync::{Arc, Weak};

/// A primitive's state in each team of this process that uses it: made on
/// a team's first use and registered as that team's handler of the
/// primitive's kinds, found again by team id (a user of the primitive in
/// another team of the process reaches it directly, without frames). It
/// lives while the team serves it: the team drops its handlers when it
/// shuts down, and the registration goes with the state.
///
/// A `static` of the primitive's: `static REGIONS: PerTeam<Regions> = PerTeam::new(64..=71);`.
pub struct PerTeam<T> {
    kinds: RangeInclusive<u8>,
    teams: Mutex<Vec<(TeamId, Weak<T>, ServedKinds)>>,
}

impl<T: FrameHandler> PerTeam<T> {
    /// The states of a primitive whose frames are of `kinds`.
    pub const fn new(kinds: RangeInclusive<u8>) -> PerTeam<T> {
        PerTeam { kinds, teams: Mutex::new(Vec::new()) }
    }

    /// `team`'s state, made by `make` (and registered for the kinds) on first use.
    pub fn of(&self, team: &Team, make: impl FnOnce(&Team) -> T) -> Result<Arc<T>> {
        self.of_inner(&team.inner, || make(team))
    }

    /// [`PerTeam::of`] for the runtime's own reference to a team (a
    /// primitive's object that arrives in a team, as a link end does).
    pub(crate) fn of_inner(&self, team: &Arc<TeamInner>, make: impl FnOnce() -> T) -> Result<Arc<T>> {
        let mut teams = self.teams.lock();
        if let Some(state) = teams.iter().find(|(id, ..)| *id == team.id).and_then(|(_, s, _)| s.upgrade()) {
            return Ok(state);
        }
        // The entries of states gone (their teams shut down), before this
        // one's registration, which an old one's of the same team would undo.
        teams.retain(|(_, s, _)| s.strong_count() > 0);
        let state = Arc::new(make());
        let serving = team.serve_frames(self.kinds.clone(), state.clone())?;
        teams.push((team.id, Arc::downgrade(&state), serving));
        Ok(state)
    }

    /// The state of `team` (a team of this process), if it has one.
    pub fn find(&self, team: TeamId) -> Option<Arc<T>> {
        self.teams.lock().iter().find(|(id, ..)| *id == team).and_then(|(_, s, _)| s.upgrade())
    }
}
