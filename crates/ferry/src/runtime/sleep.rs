//! `Sleep`: a future that completes at a point in time, driven by the team's timers.

use super::team::TeamInner;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// A future that completes at a point in time (see [`Team::sleep`](crate::Team::sleep)).
pub struct Sleep {
    team: Arc<TeamInner>,
    /// `None`: never (a duration too long to represent).
    at: Option<Instant>,
    id: Option<u64>,
}

impl Sleep {
    pub(crate) fn new(team: &Arc<TeamInner>, d: Duration) -> Sleep {
        Sleep { team: team.clone(), at: super::deadline_after(d), id: None }
    }
    pub(crate) fn until(team: &Arc<TeamInner>, at: Instant) -> Sleep {
        Sleep { team: team.clone(), at: Some(at), id: None }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(at) = self.at else { return Poll::Pending };
        if Instant::now() >= at {
            return Poll::Ready(());
        }
        let id = self.id;
        self.id = Some(self.team.register_timer(id, at, cx.waker()));
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.team.timers.cancel(id);
        }
    }
}
