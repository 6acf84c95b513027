//! What the harness and a team process say to each other: the team's
//! settings (one JSON value in `$FERRY_CRASH_TEAM`), then one JSON object
//! per line: commands on the team's stdin, reports on its stdout.

use crate::crash::traffic::Outcome;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::PathBuf;

/// The variable whose presence makes the binary a team of the matrix.
pub(crate) const SPEC_VAR: &str = "FERRY_CRASH_TEAM";

/// How a team process is set up.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct TeamSpec {
    pub round: usize,
    pub index: usize,
    pub runtime_dir: PathBuf,
    /// Over TCP: this node of the cluster.
    pub cluster: Option<ClusterSpec>,
    /// Names on this etcd (its client address), with this TTL.
    pub etcd: Option<SocketAddr>,
    pub etcd_ttl_ms: u64,
    pub peer_timeout_ms: u64,
    /// Every operation's deadline.
    pub deadline_ms: u64,
    pub seed: u64,
    /// Threads making operations.
    pub workers: usize,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct ClusterSpec {
    pub node: u16,
    pub listen: SocketAddr,
    pub peers: Vec<(u16, SocketAddr)>,
    pub key: Vec<u8>,
}

/// The names a team binds: its port's, its service's, and those of the
/// short-lived ports it opens while traffic runs.
pub(crate) fn port_name(round: usize, index: usize) -> String {
    format!("crash-r{round}-t{index}")
}

pub(crate) fn svc_name(round: usize, index: usize) -> String {
    format!("crash-r{round}-t{index}-svc")
}

pub(crate) fn temp_name(round: usize, index: usize, worker: usize, n: u64) -> String {
    format!("crash-r{round}-t{index}-w{worker}-{n}")
}

/// Another team of the round, as its traffic sees it.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub(crate) struct PeerInfo {
    pub index: usize,
    /// Its port's endpoint id (`node.team.slot#incarnation`).
    pub port: String,
    /// Its service's endpoint id.
    pub svc: String,
}

/// Harness → team.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub(crate) enum Command {
    /// Start the traffic toward these peers.
    Go { peers: Vec<PeerInfo> },
    /// This peer was SIGKILLed at `kill_ns` (CLOCK_MONOTONIC).
    Dead { index: usize, kill_ns: u64 },
    /// Stop the traffic and report what happened ([`Report::Done`]).
    Stop,
    /// Look these names up ([`Report::Looked`]).
    Lookup { names: Vec<String> },
    /// Leave (drop everything, shut the team down) and exit.
    Exit,
}

/// Team → harness.
#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "say", rename_all = "snake_case")]
pub(crate) enum Report {
    Ready {
        team: String,
        pid: u32,
        port: String,
        svc: String,
    },
    Done(Box<Outcome>),
    /// The names that resolved, with what they resolved to.
    Looked {
        resolved: Vec<(String, String)>,
    },
}
