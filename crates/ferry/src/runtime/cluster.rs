//! A team's place in a cluster of nodes (machines): this node's number and
//! address, the other nodes' addresses, and the key they share.
//!
//! **Placement.** A node's number is configured, unique in its cluster; a
//! team id `{node, team}` routes to its node. Every team of a node listens
//! on the node's one TCP address (`SO_REUSEPORT`: the kernel spreads the
//! connections over them, and any one will do). Whichever team accepts a
//! bind reads the hello, which names the team the connector means, and
//! hands the connection to that team over its Unix socket (`SCM_RIGHTS`),
//! which goes on with the handshake; a team of this node is reached over
//! shared memory, one of another node over TCP. So the program does not
//! change when its teams move: only the cluster file does.
//!
//! **The cluster file** (`$FERRY_CLUSTER`, or [`TeamBuilder::cluster`]):
//!
//! ```text
//! # this node
//! node 1
//! listen 10.77.0.1:7400
//! key-file /etc/ferry/cluster.key
//! # the others
//! peer 2 10.77.0.2:7400
//! peer 3 10.77.0.3:7400
//! ```
//!
//! The key file's bytes (at least 16) are the key; every connection
//! between nodes proves it holds it (see `transport::tcp::handshake`).
//!
//! **TLS** (optional; cargo feature `tls`, on by default): with these three
//! lines every TCP connection of the node — binds and name queries, made
//! or taken — runs in mutual TLS 1.3, the key's proof inside it:
//!
//! ```text
//! tls-cert /etc/ferry/node1.pem     # this node's certificate chain, its own first
//! tls-key /etc/ferry/node1.key      # its private key
//! tls-ca /etc/ferry/ca.pem          # the authority the other nodes' certificates come from
//! ```
//!
//! All PEM. Each node's certificate must be valid for the IP address the
//! others reach it at (its `peer` line there), as TLS server and client.
//! The nodes of a cluster all use TLS or none does: a node with TLS and a
//! node without refuse each other with `Error::Tls` (see
//! `transport::tcp::tls`).
//!
//! [`TeamBuilder::cluster`]: crate::TeamBuilder::cluster

use crate::error::{Error, Result};
use crate::transport::tcp::TlsConfig;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

/// Shortest cluster key accepted, in bytes.
pub const MIN_KEY_LEN: usize = 16;

/// A node's view of its cluster (see the module's documentation).
#[derive(Clone)]
pub struct Cluster {
    /// This node's number.
    pub node: u16,
    /// The address every team of this node listens on.
    pub listen: SocketAddr,
    /// The other nodes' addresses, by number.
    pub peers: BTreeMap<u16, SocketAddr>,
    /// The key the nodes share.
    pub key: Arc<[u8]>,
    /// TLS on every connection between nodes, if set (`None`: in the clear).
    pub tls: Option<TlsConfig>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Cluster")
            .field("node", &self.node)
            .field("listen", &self.listen)
            .field("peers", &self.peers)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Cluster {
    /// Reads a cluster file (see the module's documentation).
    pub fn from_file(path: &Path) -> Result<Cluster> {
        let text = std::fs::read_to_string(path).map_err(Error::io("read cluster file"))?;
        Cluster::parse(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Parses a cluster file's text; relative key, certificate and CA
    /// files are taken from `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<Cluster> {
        let bad = |line: usize, what: &str| Error::InvalidArgument(format!("cluster file, line {line}: {what}"));
        let (mut node, mut listen, mut key, mut peers) = (None, None, None, BTreeMap::new());
        // TLS: the certificate, key and CA files, and the line of each.
        let mut tls: [Option<(usize, std::path::PathBuf)>; 3] = Default::default();
        for (i, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let addr = |s: &str| s.parse::<SocketAddr>().map_err(|_| bad(i, &format!("{s:?} is not an address")));
            let number = |s: &str| s.parse::<u16>().map_err(|_| bad(i, &format!("{s:?} is not a node number")));
            match words.as_slice() {
                ["node", n] => node = Some(number(n)?),
                ["listen", a] => listen = Some(addr(a)?),
                ["key-file", f] => {
                    let bytes = std::fs::read(dir.join(f)).map_err(Error::io("read cluster key file"))?;
                    key = Some(bytes);
                }
                [word @ ("tls-cert" | "tls-key" | "tls-ca"), f] => {
                    let at = ["tls-cert", "tls-key", "tls-ca"].iter().position(|w| w == word).expect("one of them");
                    if tls[at].replace((i, dir.join(f))).is_some() {
                        return Err(bad(i, &format!("a second `{word}` line")));
                    }
                }
                ["peer", n, a] => {
                    if peers.insert(number(n)?, addr(a)?).is_some() {
                        return Err(bad(i, &format!("node {n} listed twice")));
                    }
                }
                _ => return Err(bad(i, &format!("{line:?}: want node N, listen ADDR, key-file PATH, peer N ADDR, or tls-cert, tls-key, tls-ca PATH"))),
            }
        }
        let node = node.ok_or_else(|| bad(0, "no `node` line"))?;
        let listen = listen.ok_or_else(|| bad(0, "no `listen` line"))?;
        let key = key.ok_or_else(|| bad(0, "no `key-file` line"))?;
        if key.len() < MIN_KEY_LEN {
            return Err(bad(0, &format!("the key has {} bytes, want at least {MIN_KEY_LEN}", key.len())));
        }
        if peers.contains_key(&node) {
            return Err(bad(0, &format!("node {node} is this node, not a peer")));
        }
        let tls = match tls {
            [None, None, None] => None,
            [Some((i, cert)), Some((_, key)), Some((_, ca))] => {
                let loaded = TlsConfig::from_files(&cert, &key, &ca);
                Some(loaded.map_err(|e| match e {
                    Error::InvalidArgument(what) => bad(i, &what),
                    e => bad(i, &e.to_string()),
                })?)
            }
            _ => return Err(bad(0, "TLS wants all three of tls-cert, tls-key and tls-ca")),
        };
        Ok(Cluster { node, listen, peers, key: key.into(), tls })
    }

    /// The address of node `node`'s teams, if it is in the cluster.
    pub fn address_of(&self, node: u16) -> Option<SocketAddr> {
        if node == self.node {
            Some(self.listen)
        } else {
            self.peers.get(&node).copied()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_file_parses_and_its_mistakes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("k"), [7u8; 32]).unwrap();
        let text = "# node one\nnode 1\nlisten 10.0.0.1:7400\nkey-file k\npeer 2 10.0.0.2:7400\n\npeer 3 [::1]:9\n";
        let c = Cluster::parse(text, dir.path()).unwrap();
        assert_eq!((c.node, c.listen.port(), c.peers.len(), c.key.len()), (1, 7400, 2, 32));
        assert_eq!(c.address_of(3), Some("[::1]:9".parse().unwrap()));
        assert_eq!(c.address_of(4), None);
        assert!(!format!("{c:?}").contains("7, 7"), "Debug must not show the key");
        for (text, says) in [
            ("node 1\nlisten 10.0.0.1:1\n", "key-file"),
            ("node x\n", "not a node number"),
            ("node 1\nlisten nowhere\n", "not an address"),
            ("node 1\nlisten 1.2.3.4:5\nkey-file k\npeer 1 1.2.3.4:6\n", "this node"),
            ("node 1\nlisten 1.2.3.4:5\nkey-file k\npeer 2 1.2.3.4:6\npeer 2 1.2.3.4:7\n", "twice"),
            ("nodes 1\n", "want node N"),
            ("node 1\nlisten 1.2.3.4:5\nkey-file k\ntls-cert c\ntls-key k\n", "all three"),
            ("node 1\nlisten 1.2.3.4:5\nkey-file k\ntls-ca c\ntls-ca d\n", "second `tls-ca`"),
            ("node 1\nlisten 1.2.3.4:5\nkey-file k\ntls-cert nope\ntls-key k\ntls-ca nope\n", "line 4: TLS"),
        ] {
            match Cluster::parse(text, dir.path()) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(says), "{text:?}: {m}"),
                Err(e) => panic!("{text:?}: {e}"),
                Ok(_) => panic!("{text:?} parsed"),
            }
        }
        std::fs::write(dir.path().join("short"), [1u8; 8]).unwrap();
        let short = "node 1\nlisten 1.2.3.4:5\nkey-file short\n";
        assert!(matches!(Cluster::parse(short, dir.path()), Err(Error::InvalidArgument(m)) if m.contains("at least")));
    }
}
