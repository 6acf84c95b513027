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
//! **Which node.** A connection that claims node N is taken only from N's
//! address in the file, or from a block a `from` on N's line allows (N
//! behind a NAT, say): `peer 2 10.77.0.2:7400 from 192.168.0.0/16 10.9.0.7`.
//! With TLS its certificate must instead be valid for N's address. Without
//! TLS this is best effort: the key is shared, so it cannot prove which
//! node holds it. An unspecified address (`listen 0.0.0.0:7400`, as in
//! containers) is no address to check: only a `from` lets a connection
//! claim that node. A connection claiming this node is always refused (its
//! teams bind over shared memory).
//!
//! **Strangers.** `handshakes-per-source N` bounds the connections from
//! one address still in their handshake (default 8; see
//! [`TeamBuilder::handshakes_per_source`]).
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
//! [`TeamBuilder::handshakes_per_source`]: crate::TeamBuilder::handshakes_per_source

use super::config::{in_range, in_range_as, MAX_THREADS};
use crate::error::{Error, Result};
use crate::transport::tcp::TlsConfig;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
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
    /// Sources besides its `peer` address that a node's connections may
    /// come from (`peer N ADDR from CIDR`: behind a NAT, say).
    pub from: BTreeMap<u16, Vec<Cidr>>,
    /// Most TCP connections from one address whose handshake is under way
    /// (`handshakes-per-source N`); `None`: the team's setting
    /// ([`crate::TeamBuilder::handshakes_per_source`]).
    pub handshakes_per_source: Option<usize>,
}

/// A block of addresses, `ADDR/BITS` (or one address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    /// Its first address.
    pub addr: IpAddr,
    /// How many leading bits of an address must equal `addr`'s.
    pub bits: u8,
}

impl Cidr {
    /// Whether `ip` is in the block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr.to_canonical(), ip.to_canonical()) {
            (IpAddr::V4(a), IpAddr::V4(b)) => prefix_eq(&a.octets(), &b.octets(), self.bits),
            (IpAddr::V6(a), IpAddr::V6(b)) => prefix_eq(&a.octets(), &b.octets(), self.bits),
            _ => false,
        }
    }
}

impl std::str::FromStr for Cidr {
    type Err = ();
    fn from_str(s: &str) -> std::result::Result<Cidr, ()> {
        let (a, bits) = s.split_once('/').unwrap_or((s, ""));
        let addr = a.parse::<IpAddr>().map_err(|_| ())?.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = if bits.is_empty() { max } else { bits.parse::<u8>().map_err(|_| ())? };
        if bits > max {
            return Err(());
        }
        Ok(Cidr { addr, bits })
    }
}

impl Cidr {
    /// The most bits an address of its family has.
    fn max_bits(&self) -> u8 {
        if self.addr.to_canonical().is_ipv4() {
            32
        } else {
            128
        }
    }
}

/// Whether the first `bits` bits of `a` and `b` are equal (never, if
/// `bits` is more than they have: `Cidr::bits` is a public field).
fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    let (Some(x), Some(y)) = (a.get(..whole), b.get(..whole)) else { return false };
    x == y
        && (rest == 0
            || match (a.get(whole), b.get(whole)) {
                (Some(x), Some(y)) => (x ^ y) >> (8 - rest) == 0,
                _ => false,
            })
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
        let (mut from, mut handshakes_per_source) = (BTreeMap::<u16, Vec<Cidr>>::new(), None);
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
                ["peer", n, a, rest @ ..] => {
                    if peers.insert(number(n)?, addr(a)?).is_some() {
                        return Err(bad(i, &format!("node {n} listed twice")));
                    }
                    match rest {
                        [] => {}
                        ["from", blocks @ ..] if !blocks.is_empty() => {
                            let cidr = |s: &&str| s.parse().map_err(|()| bad(i, &format!("{s:?} is not ADDR/BITS")));
                            from.insert(number(n)?, blocks.iter().map(cidr).collect::<Result<_>>()?);
                        }
                        _ => return Err(bad(i, &format!("{line:?}: want peer N ADDR [from CIDR...]"))),
                    }
                }
                ["handshakes-per-source", n] => {
                    let n = n.parse::<usize>().ok().filter(|n| (1..=MAX_THREADS).contains(n));
                    let wants = format!("handshakes-per-source wants a number from 1 to {MAX_THREADS}");
                    handshakes_per_source = Some(n.ok_or_else(|| bad(i, &wants))?);
                }
                _ => return Err(bad(i, &format!("{line:?}: want node N, listen ADDR, key-file PATH, peer N ADDR [from CIDR...], handshakes-per-source N, or tls-cert, tls-key, tls-ca PATH"))),
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
        Ok(Cluster { node, listen, peers, key: key.into(), tls, from, handshakes_per_source })
    }

    /// `InvalidSetting` for what a `Cluster` built in code may get wrong (a
    /// file's parse refuses the same): a `from` block of more bits than its
    /// address has, `handshakes_per_source` outside 1 to `MAX_THREADS`.
    pub(crate) fn check(&self) -> Result<()> {
        for b in self.from.values().flatten() {
            let value = format!("{}/{}", b.addr, b.bits);
            in_range_as("cluster (from)", b.bits, 0..=b.max_bits(), value)?;
        }
        if let Some(n) = self.handshakes_per_source {
            in_range("cluster (handshakes_per_source)", n, 1..=MAX_THREADS)?;
        }
        Ok(())
    }

    /// Whether a connection from `source` may be node `node`'s: its
    /// address's, or one its `from` allows. Best effort: a node that holds
    /// the key and sends from another's address passes (the key is shared).
    /// An unspecified address (`0.0.0.0`, `::`) is no address to check:
    /// only its `from` blocks allow a source then.
    pub fn may_come_from(&self, node: u16, source: IpAddr) -> bool {
        let Some(addr) = self.address_of(node) else { return false };
        (!addr.ip().is_unspecified() && addr.ip().to_canonical() == source.to_canonical())
            || self.from.get(&node).is_some_and(|blocks| blocks.iter().any(|b| b.contains(source)))
    }

    /// The addresses the cluster's nodes connect from (as far as it says).
    pub(crate) fn sources(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let addrs = self.peers.values().chain([&self.listen]).map(|a| a.ip());
        let blocks = self.from.values().flatten().filter(|b| b.bits == b.max_bits());
        addrs.chain(blocks.map(|b| b.addr))
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

/// Nodes 1 and 2 of a cluster on loopback, each the other's peer, on
/// ports free when made, sharing a test key (for the runtime's tests).
#[cfg(test)]
pub(crate) fn loopback_pair() -> [Cluster; 2] {
    let key: Arc<[u8]> = Arc::from(&b"a cluster key of more than 16 bytes"[..]);
    let addrs = [crate::testing::free_loopback_addr(), crate::testing::free_loopback_addr()];
    [1u16, 2].map(|node| Cluster {
        node,
        listen: addrs[node as usize - 1],
        peers: BTreeMap::from([(3 - node, addrs[2 - node as usize])]),
        key: key.clone(),
        tls: None,
        from: BTreeMap::new(),
        handshakes_per_source: None,
    })
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
        let text = "node 1\nlisten 10.0.0.1:1\nkey-file k\npeer 2 10.0.0.2:1 from 192.168.0.0/16 10.9.9.9\nhandshakes-per-source 3\n";
        let c = Cluster::parse(text, dir.path()).unwrap();
        assert_eq!(c.handshakes_per_source, Some(3));
        for (ip, ok) in [("10.0.0.2", true), ("192.168.7.1", true), ("10.9.9.9", true), ("10.9.9.8", false)] {
            assert_eq!(c.may_come_from(2, ip.parse().unwrap()), ok, "{ip}");
        }
        assert!(!c.may_come_from(3, "10.0.0.2".parse().unwrap()), "a node not in the file");
        assert!(c.may_come_from(1, "10.0.0.1".parse().unwrap()));
        // An unspecified address (a container's `listen 0.0.0.0:7400`) is no
        // address to check: only a `from` block lets a source in.
        let text = "node 1\nlisten 0.0.0.0:1\nkey-file k\npeer 2 0.0.0.0:1\npeer 3 [::]:1 from 10.7.0.0/16\n";
        let c = Cluster::parse(text, dir.path()).unwrap();
        for (node, ip, ok) in [(1, "10.0.0.1", false), (2, "10.0.0.2", false), (3, "::1", false), (3, "10.7.1.1", true)]
        {
            assert_eq!(c.may_come_from(node, ip.parse().unwrap()), ok, "node {node} from {ip}");
        }
        // A block built in code with more bits than its address has (a
        // public field) contains nothing; it indexed past the address.
        for bits in [33, 40, 129, 255] {
            assert!(!Cidr { addr: [10, 0, 0, 1].into(), bits }.contains("10.0.0.1".parse().unwrap()), "{bits}");
        }
        assert!(!Cidr { addr: "::1".parse().unwrap(), bits: 129 }.contains("::1".parse().unwrap()));
        let block: Cidr = "10.1.0.0/15".parse().unwrap();
        assert!(block.contains("10.0.255.1".parse().unwrap()) && !block.contains("10.2.0.1".parse().unwrap()));
        for bad in [
            "peer 2 10.0.0.2:1 from",
            "peer 2 10.0.0.2:1 from 10.0.0.0/33",
            "peer 2 10.0.0.2:1 to x",
            "handshakes-per-source 0",
            "handshakes-per-source 1025",
        ] {
            let text = format!("node 1\nlisten 10.0.0.1:1\nkey-file k\n{bad}\n");
            assert!(matches!(Cluster::parse(&text, dir.path()), Err(Error::InvalidArgument(_))), "{bad}");
        }
        std::fs::write(dir.path().join("short"), [1u8; 8]).unwrap();
        let short = "node 1\nlisten 1.2.3.4:5\nkey-file short\n";
        assert!(matches!(Cluster::parse(short, dir.path()), Err(Error::InvalidArgument(m)) if m.contains("at least")));
    }
}
