//! The service every team serves: each call names its caller and a
//! request id unique for that caller, and the server counts how many times
//! it ran each (client, id). A count above one is a call executed twice.

use ferry::Team;
use serde_bytes::ByteBuf;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[ferry::service]
pub trait Crash {
    /// Counts one execution of (`client`, `id`), holds `hold_ms` (so calls
    /// are in flight when a team is killed), returns the padding's length.
    async fn exec(&self, client: String, id: u64, hold_ms: u32, pad: ByteBuf) -> u64;
}

/// Executions per (client, request id).
#[derive(Clone, Default)]
pub(crate) struct Executions(Arc<Mutex<HashMap<(String, u64), u32>>>);

impl Executions {
    /// (calls executed, executions beyond the first of a call).
    pub fn summary(&self) -> (u64, u64) {
        let map = self.0.lock().unwrap();
        let extra = map.values().map(|&n| u64::from(n.saturating_sub(1))).sum();
        (map.len() as u64, extra)
    }
}

pub(crate) struct CrashImpl {
    /// To sleep on the team's timers (a `Team` handle: dropped with the `Serving`).
    pub team: Team,
    pub executions: Executions,
}

impl Crash for CrashImpl {
    async fn exec(&self, client: String, id: u64, hold_ms: u32, pad: ByteBuf) -> u64 {
        *self.executions.0.lock().unwrap().entry((client, id)).or_insert(0) += 1;
        if hold_ms > 0 {
            self.team.sleep(Duration::from_millis(hold_ms.into())).await;
        }
        pad.len() as u64
    }
}
