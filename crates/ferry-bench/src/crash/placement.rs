//! Where a round's teams run. Over shared memory: processes of this
//! machine sharing one runtime directory. Over TCP: each team a node of a
//! cluster (its own runtime directory, its address, the cluster's key),
//! in a network namespace of its own when `scripts/crash.sh` made them
//! (`$FERRY_CRASH_NETNS`: the prefix; this harness runs in `PREFIX-1` at
//! 10.77.0.1 with the etcd, team i in `PREFIX-(i+2)` at 10.77.0.(i+2)),
//! else on loopback addresses of this namespace.

use crate::crash::etcd::Etcd;
use crate::crash::protocol::{ClusterSpec, TeamSpec};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Transport {
    Shm,
    Tcp,
    Both,
}

impl Transport {
    pub(crate) fn list(self) -> Vec<Transport> {
        match self {
            Transport::Both => vec![Transport::Shm, Transport::Tcp],
            t => vec![t],
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::Shm => "shm",
            Transport::Tcp => "tcp",
            Transport::Both => "both",
        }
    }
}

/// The port every node listens on inside its namespace.
const NODE_PORT: u16 = 7400;
/// The etcd's TTL for names (the teams' leases).
pub(crate) const ETCD_TTL: Duration = Duration::from_secs(2);

pub(crate) struct Placement {
    pub transport: Transport,
    pub teams: usize,
    dir: PathBuf,
    /// TCP across namespaces: their prefix.
    pub netns: Option<String>,
    key: Vec<u8>,
    pub peer_timeout: Duration,
    pub deadline: Duration,
    /// TCP: names on this etcd in every other round.
    pub etcd: Option<Etcd>,
}

impl Placement {
    /// `dir`: where this transport's runtime directories go.
    pub fn new(
        transport: Transport,
        teams: usize,
        dir: &Path,
        peer_timeout: Duration,
        etcd: bool,
    ) -> Result<Placement, String> {
        let dir = dir.join(transport.name());
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut p = Placement {
            transport,
            teams,
            dir,
            netns: None,
            key: cluster_key()?,
            // A killed team on this node is known gone at once (its socket
            // hangs up); the peer timeout is for silent nodes.
            peer_timeout: if transport == Transport::Tcp { peer_timeout } else { Duration::from_secs(10) },
            deadline: Duration::from_secs(5),
            etcd: None,
        };
        if transport == Transport::Tcp {
            if let Ok(prefix) = std::env::var("FERRY_CRASH_NETNS") {
                let nodes: usize = std::env::var("FERRY_CRASH_NODES").ok().and_then(|n| n.parse().ok()).unwrap_or(0);
                if nodes < teams {
                    return Err(format!("{teams} teams need {teams} namespaces; $FERRY_CRASH_NODES is {nodes}"));
                }
                p.netns = Some(prefix);
            }
            if etcd {
                p.etcd = Some(Etcd::start(p.harness_ip(), &p.dir)?);
            }
        }
        Ok(p)
    }

    fn harness_ip(&self) -> IpAddr {
        match self.netns {
            Some(_) => IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)),
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// Team `i`'s runtime directory: the node's.
    pub fn runtime_dir(&self, i: usize) -> PathBuf {
        match self.transport {
            Transport::Tcp => self.dir.join(format!("node{}", i + 1)),
            _ => self.dir.join("node"),
        }
    }

    /// Every runtime directory of the transport.
    pub fn runtime_dirs(&self) -> Vec<PathBuf> {
        match self.transport {
            Transport::Tcp => (0..self.teams).map(|i| self.runtime_dir(i)).collect(),
            _ => vec![self.runtime_dir(0)],
        }
    }

    /// Team `i`'s network namespace, if the teams have their own.
    pub fn namespace(&self, i: usize) -> Option<String> {
        self.netns.as_ref().map(|p| format!("{p}-{}", i + 2))
    }

    /// The round's node addresses (TCP): in namespaces, one address per
    /// node; on loopback, a free port per node.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        (0..self.teams)
            .map(|i| match self.netns {
                Some(_) => SocketAddr::from((Ipv4Addr::new(10, 77, 0, i as u8 + 2), NODE_PORT)),
                None => TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free loopback port"),
            })
            .collect()
    }

    /// Team `i`'s settings for a round.
    pub fn spec(&self, round: usize, i: usize, addrs: &[SocketAddr], seed: u64, etcd: bool) -> TeamSpec {
        let cluster = (self.transport == Transport::Tcp).then(|| ClusterSpec {
            node: i as u16 + 1,
            listen: addrs[i],
            peers: (0..self.teams).filter(|&j| j != i).map(|j| (j as u16 + 1, addrs[j])).collect(),
            key: self.key.clone(),
        });
        TeamSpec {
            round,
            index: i,
            runtime_dir: self.runtime_dir(i),
            cluster,
            etcd: if etcd { self.etcd.as_ref().map(|e| e.addr) } else { None },
            etcd_ttl_ms: ETCD_TTL.as_millis() as u64,
            peer_timeout_ms: self.peer_timeout.as_millis() as u64,
            deadline_ms: self.deadline.as_millis() as u64,
            seed,
            workers: 3,
        }
    }

    /// Where this transport's processes are, for the report.
    pub fn describe(&self) -> String {
        match (self.transport, &self.netns) {
            (Transport::Tcp, Some(p)) => {
                format!("{} nodes in network namespaces {p}-2.. joined by a bridge", self.teams)
            }
            (Transport::Tcp, None) => {
                format!("{} nodes on loopback addresses (no namespaces: run scripts/crash.sh)", self.teams)
            }
            _ => format!("{} teams on this machine, one runtime directory", self.teams),
        }
    }
}

/// 32 random bytes: the cluster's key for this run.
fn cluster_key() -> Result<Vec<u8>, String> {
    use std::io::Read;
    let mut key = vec![0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(key)
}
