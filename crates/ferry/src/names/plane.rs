//! The one name plane a team goes through, chosen when it starts (see the
//! guarantees in the module above): [`EmbeddedPlane`] by default,
//! [`EtcdPlane`] when an etcd is configured.
//!
//! Both keep the names of this node's teams in the node's files
//! ([`NodeNames`]): a lookup from this machine needs no network, the
//! reactor answers other nodes' queries from them, and `ferry names`
//! lists them.

use super::etcd::EtcdNames;
use super::{remote, NodeNames, TeamLease};
use crate::error::{Error, Result};
use crate::id::EndpointId;
use crate::runtime::cluster::Cluster;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A node's answer to a name query.
type Answer = (u16, Result<Option<EndpointId>>);

/// Where names are registered and looked up, for one team.
pub(crate) trait NamePlane: Send + Sync {
    /// What the plane is, for logs.
    fn describe(&self) -> String;

    /// Binds `name` to `ep`, an endpoint of `lease`'s team; `NameTaken`
    /// while it is bound within the plane's scope (node or cluster).
    fn register(&self, lease: &TeamLease, name: &str, ep: EndpointId) -> Result<()>;

    /// Unbinds `name` if `lease`'s team bound it.
    fn unregister(&self, lease: &TeamLease, name: &str);

    /// Looks `name` up on this machine only (a few file reads, never the
    /// network): what a caller that must not block looks at first.
    fn lookup_here(&self, name: &str) -> Result<EndpointId>;

    /// Looks `name` up beyond this machine: blocks on the network.
    /// `NameNotFound` if it is not bound there (at once with nowhere to ask).
    fn lookup_elsewhere(&self, name: &str) -> Result<EndpointId>;

    /// How a wait for a name that is not bound yet goes on.
    fn wait(&self) -> Wait;

    /// For [`Wait::Watch`]: blocks until `name` is bound, at most `limit`.
    /// A plane that cannot watch looks once.
    fn watch(&self, name: &str, limit: Duration) -> Result<EndpointId> {
        let _ = limit;
        self.lookup(name)
    }

    /// The team leaves: its names go now, wherever they would otherwise
    /// wait to expire. (Its node files go with its [`TeamLease`].)
    fn leave(&self) {}

    /// Here, then elsewhere.
    fn lookup(&self, name: &str) -> Result<EndpointId> {
        match self.lookup_here(name) {
            Err(Error::NameNotFound(_)) => self.lookup_elsewhere(name),
            found => found,
        }
    }
}

/// How a wait for a name goes on after a first look here found nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Look here again from time to time: there is nowhere else.
    Here,
    /// Look here and elsewhere again from time to time.
    Poll,
    /// [`NamePlane::watch`]: the plane says when the name is bound.
    Watch,
}

/// The embedded plane: this node's files, then the cluster's other nodes,
/// all asked at once (no server anywhere). A name is unique on its node
/// only: the lowest-numbered node holding it wins, among the nodes that
/// answer in time (see `lookup_elsewhere`).
pub(crate) struct EmbeddedPlane {
    node: NodeNames,
    /// The cluster whose other nodes are asked (their addresses, the key
    /// that signs the queries, TLS); `None` for a node alone.
    cluster: Option<Cluster>,
    /// How long a lookup waits for the nodes' answers.
    patience: Duration,
    /// Queries under way, by node (a silent node's outlive their lookup).
    asking: Arc<Mutex<HashMap<u16, usize>>>,
}

/// After a node found the name, how long a lookup still waits for the
/// lower-numbered nodes that have not answered: one that answers by then
/// and holds the name wins; one silent that long is passed over (it may be
/// down, or its link cut).
const PASS_OVER: Duration = Duration::from_millis(200);

/// Most queries under way to one node; past that the node counts as
/// silent for the lookup (only a silent node keeps queries that long).
const MAX_ASKING: usize = 16;

impl EmbeddedPlane {
    pub(crate) fn new(node: NodeNames, cluster: Option<Cluster>, patience: Duration) -> Self {
        EmbeddedPlane { node, cluster, patience, asking: Arc::default() }
    }

    /// Asks node `node` at `addr` for `name` on a thread of its own; its
    /// answer goes to `answers`. False if `MAX_ASKING` queries to it are
    /// under way or no thread could start.
    fn ask(&self, cluster: &Cluster, node: u16, addr: SocketAddr, name: &str, answers: &Sender<Answer>) -> bool {
        {
            let mut asking = self.asking.lock();
            let n = asking.entry(node).or_default();
            if *n >= MAX_ASKING {
                return false;
            }
            *n += 1;
        }
        let (cluster, name, patience, asking) = (cluster.clone(), name.to_string(), self.patience, self.asking.clone());
        let answers = answers.clone();
        let done = move |asking: &Mutex<HashMap<u16, usize>>| {
            let mut a = asking.lock();
            if let Some(n) = a.get_mut(&node) {
                *n -= 1;
                if *n == 0 {
                    a.remove(&node);
                }
            }
        };
        let started = std::thread::Builder::new().name("ferry-name-query".into()).spawn({
            let asking = asking.clone();
            move || {
                let got = remote::ask(addr, node, &cluster, &name, patience);
                done(&asking);
                let _ = answers.send((node, got));
            }
        });
        if let Err(e) = started {
            tracing::warn!(node, error = %e, "cannot start a name query");
            done(&asking);
            return false;
        }
        true
    }

    /// The other nodes, in the order of their numbers.
    fn peers(&self) -> impl Iterator<Item = (u16, SocketAddr)> + '_ {
        self.cluster.iter().flat_map(|c| c.peers.iter().map(|(&n, &a)| (n, a)))
    }
}

impl NamePlane for EmbeddedPlane {
    fn describe(&self) -> String {
        format!("embedded ({} and {} other nodes)", self.node.dir().path().display(), self.peers().count())
    }

    fn register(&self, lease: &TeamLease, name: &str, ep: EndpointId) -> Result<()> {
        self.node.register(lease, name, ep)
    }

    fn unregister(&self, lease: &TeamLease, name: &str) {
        let _ = self.node.unregister(lease, name);
    }

    fn lookup_here(&self, name: &str) -> Result<EndpointId> {
        self.node.lookup(name)
    }

    /// Asks every other node at once, and waits at most `patience` in
    /// all: the lowest-numbered node that holds the name and answers in
    /// time wins (a lower one silent `PASS_OVER` after a higher one found
    /// it is passed over). `Unauthenticated` naming the node if every
    /// answer was a refusal (the keys differ); else `NameNotFound`.
    fn lookup_elsewhere(&self, name: &str) -> Result<EndpointId> {
        let Some(cluster) = &self.cluster else { return Err(Error::NameNotFound(name.to_string())) };
        crate::names::validate_name(name)?;
        let deadline = Instant::now() + self.patience;
        let (tx, rx) = std::sync::mpsc::channel::<Answer>();
        let asked: Vec<u16> =
            self.peers().filter(|&(node, addr)| self.ask(cluster, node, addr, name, &tx)).map(|(n, _)| n).collect();
        drop(tx);
        let mut answers: BTreeMap<u16, Result<Option<EndpointId>>> = BTreeMap::new();
        let mut pass_over_at = None;
        while answers.len() < asked.len() {
            if let Some((&winner, _)) = answers.iter().find(|(_, a)| matches!(a, Ok(Some(_)))) {
                if asked.iter().all(|n| *n >= winner || answers.contains_key(n)) {
                    break;
                }
                pass_over_at.get_or_insert(Instant::now() + PASS_OVER);
            }
            let until = pass_over_at.map_or(deadline, |p: Instant| p.min(deadline));
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok((node, got)) => {
                    answers.insert(node, got);
                }
                Err(_) => break,
            }
        }
        if let Some(ep) = answers.values().find_map(|a| a.as_ref().ok().copied().flatten()) {
            return Ok(ep);
        }
        let mut refusal = None;
        let mut not_found = false;
        for (node, a) in answers {
            match a {
                Ok(_) => not_found = true,
                Err(e @ Error::Unauthenticated { .. }) => {
                    tracing::warn!(node, error = %e, "a node refused a name query");
                    refusal.get_or_insert(e);
                }
                // A node that is down must not hide the others' names.
                Err(e) => tracing::debug!(node, error = %e, "a node did not answer a name query"),
            }
        }
        match refusal {
            Some(e) if !not_found => Err(e),
            _ => Err(Error::NameNotFound(name.to_string())),
        }
    }

    fn wait(&self) -> Wait {
        if self.peers().next().is_none() {
            Wait::Here
        } else {
            Wait::Poll
        }
    }
}

/// The etcd plane: names in etcd under the team's lease, unique in the
/// cluster; copied into this node's files, so that lookups from this
/// machine stay local.
pub(crate) struct EtcdPlane {
    node: NodeNames,
    etcd: EtcdNames,
}

impl EtcdPlane {
    pub(crate) fn new(node: NodeNames, etcd: EtcdNames) -> Self {
        EtcdPlane { node, etcd }
    }
}

impl NamePlane for EtcdPlane {
    fn describe(&self) -> String {
        format!("etcd ({})", self.etcd.describe())
    }

    fn register(&self, lease: &TeamLease, name: &str, ep: EndpointId) -> Result<()> {
        // etcd first: it decides who holds the name in the cluster; the
        // node copy then cannot name an endpoint etcd refused.
        self.etcd.register(name, ep)?;
        // Fails if a team of this node that is not on etcd holds the name.
        self.node.register(lease, name, ep).inspect_err(|_| {
            let _ = self.etcd.unregister(name);
        })
    }

    fn unregister(&self, lease: &TeamLease, name: &str) {
        let _ = self.node.unregister(lease, name);
        let _ = self.etcd.unregister(name);
    }

    fn lookup_here(&self, name: &str) -> Result<EndpointId> {
        self.node.lookup(name)
    }

    fn lookup_elsewhere(&self, name: &str) -> Result<EndpointId> {
        self.etcd.lookup(name)
    }

    fn wait(&self) -> Wait {
        Wait::Watch
    }

    fn watch(&self, name: &str, limit: Duration) -> Result<EndpointId> {
        self.etcd.wait_for(name, limit)
    }

    fn leave(&self) {
        self.etcd.revoke();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::RuntimeDir;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn ep(team: u32, slot: u32) -> EndpointId {
        crate::id::TeamId { node: 0, team, incarnation: 1 }.endpoint(slot).unwrap()
    }

    /// Alone, the embedded plane is the node's files: nowhere else to ask,
    /// a wait looks here only.
    #[test]
    fn the_embedded_plane_alone_is_the_nodes_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RuntimeDir::at(tmp.path().join("rt")).unwrap();
        let node = NodeNames::new(dir.clone());
        let plane = EmbeddedPlane::new(node.clone(), None, Duration::from_secs(1));
        let lease = TeamLease::acquire(&dir, 3).unwrap();
        plane.register(&lease, "svc", ep(3, 1)).unwrap();
        assert_eq!(node.lookup("svc").unwrap(), ep(3, 1));
        assert_eq!(plane.lookup("svc").unwrap(), ep(3, 1));
        assert!(matches!(plane.register(&lease, "svc", ep(3, 2)), Err(Error::NameTaken { .. })));
        assert!(matches!(plane.lookup_elsewhere("svc"), Err(Error::NameNotFound(_))));
        assert_eq!(plane.wait(), Wait::Here);
        plane.unregister(&lease, "svc");
        assert!(matches!(plane.lookup("svc"), Err(Error::NameNotFound(_))));
    }

    /// In a cluster, a node that does not answer is passed over (and the
    /// lookup ends `NameNotFound`, not with its error); a wait polls.
    #[test]
    fn the_embedded_plane_passes_over_a_node_that_does_not_answer() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RuntimeDir::at(tmp.path().join("rt")).unwrap();
        // Bound and released: nobody listens there.
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let cluster = Cluster {
            node: 1,
            listen: "127.0.0.1:1".parse().unwrap(),
            peers: BTreeMap::from([(2, dead)]),
            key: Arc::from(&b"0123456789abcdef"[..]),
            tls: None,
            from: Default::default(),
            handshakes_per_source: None,
        };
        let plane = EmbeddedPlane::new(NodeNames::new(dir), Some(cluster), Duration::from_secs(1));
        assert!(matches!(plane.lookup("svc"), Err(Error::NameNotFound(_))));
        assert_eq!(plane.wait(), Wait::Poll);
    }
}
