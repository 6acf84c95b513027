//! A team's settings and the builder that starts a team with them.

use super::cluster::Cluster;
use super::team::{Team, TeamInner};
use crate::error::{Error, Result};
use crate::transport::shm;
use crate::transport::tcp;
use std::fmt::Debug;
use std::net::SocketAddr;
use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

/// Default largest message: 1 GiB of data plus room for its encoding
/// (a typed message's MessagePack header, an RPC envelope).
pub const DEFAULT_MAX_MESSAGE: usize = (1 << 30) + (1 << 20);

/// Largest `ring_bytes` and `max_ring_bytes`: the most a TCP peer may be
/// granted in flight (a shared-memory hello carries it in 32 bits too).
pub const MAX_RING_BYTES: usize = tcp::handshake::MAX_GRANT;
/// Largest `max_message`: the largest payload area a peer maps (64 GiB).
pub const MAX_MESSAGE: usize = shm::MAX_AREA as usize;
/// Most processors, and most blocking threads, a team starts.
pub const MAX_THREADS: usize = 1024;
/// Shortest `park_timeout` (smaller values are raised to it).
const MIN_PARK: Duration = Duration::from_micros(100);
/// Longest `park_timeout`: it bounds how late a lost wake-up is noticed
/// (see `TeamBuilder::park_timeout`).
const MAX_PARK: Duration = Duration::from_secs(60);
/// Shortest `peer_timeout` (smaller values are raised to it).
const MIN_PEER_TIMEOUT: Duration = Duration::from_millis(4);
/// Longest `spin` (a benchmark spins for seconds: as good as for ever),
/// `blocking_idle`, `peer_timeout` and `names_ttl` (etcd's lease TTL).
const A_DAY: Duration = Duration::from_secs(24 * 3600);

/// What one queued message counts against a byte bound (`inbox_bytes`,
/// `hold_bytes`) besides its payload: its bookkeeping, so that a flood of
/// empty messages is bounded too.
pub const MESSAGE_OVERHEAD: usize = 64;

/// What a message of `len` payload bytes counts against a byte bound.
#[inline]
pub(crate) fn message_cost(len: usize) -> usize {
    len.saturating_add(MESSAGE_OVERHEAD)
}

/// Settings of a team. Build with [`Team::builder`]; the [`TeamBuilder`]
/// method of the same name says what each does, and
/// [`TeamBuilder::start`] checks each against its allowed range.
#[derive(Clone, Debug)]
pub struct Config {
    /// This machine's node number.
    pub node: u16,
    /// OS threads that run tasks.
    pub processors: usize,
    /// How long a processor may stay in user code while work waits before
    /// a replacement takes its place.
    pub handoff_after: Duration,
    /// Most replacement processors running at once (0: no hand-off).
    pub max_replacements: usize,
    /// How long an idle thread polls before it sleeps.
    pub spin: Duration,
    /// Longest sleep without looking around.
    pub park_timeout: Duration,
    /// Bytes of each ring of a shared-memory channel this team opens.
    pub ring_bytes: usize,
    /// Largest ring a connecting peer may ask this team to map (default 64 MiB).
    pub max_ring_bytes: usize,
    /// Messages an endpoint queues before the sender is pushed back.
    pub inbox_capacity: usize,
    /// Bytes an endpoint queues before the sender is pushed back.
    pub inbox_bytes: usize,
    /// Messages a channel sets aside while their endpoint's inbox is full.
    pub hold_capacity: usize,
    /// Bytes a channel sets aside while their endpoint's inbox is full.
    pub hold_bytes: usize,
    /// Largest message sent or accepted.
    pub max_message: usize,
    /// Directory of the node name plane; `None`: from the environment.
    pub runtime_dir: Option<PathBuf>,
    /// How long shutdown waits for the team's threads to stop.
    pub shutdown_grace: Duration,
    /// Most threads running blocking jobs at once.
    pub blocking_threads: usize,
    /// How long a blocking thread waits for another job before it ends.
    pub blocking_idle: Duration,
    /// This node's cluster; `None`: `$FERRY_CLUSTER`'s, if set, else a node alone.
    pub cluster: Option<Cluster>,
    /// A peer over the network silent this long is gone.
    pub peer_timeout: Duration,
    /// Threads waiting for an answer never park (they spin).
    pub busy_poll: bool,
    /// Spinning threads give way when CPUs are short (`TeamBuilder::share_cpu`).
    pub share_cpu: bool,
    /// Client addresses of the etcd of the cluster name plane (the members
    /// of one etcd cluster); empty: `$FERRY_ETCD`'s, if set, else the
    /// embedded plane.
    pub etcd: Vec<SocketAddr>,
    /// The TTL of this team's names in etcd.
    pub names_ttl: Duration,
    /// Most names this team binds at once.
    pub max_names: usize,
    /// Most channels (peer teams) this team keeps at once.
    pub max_channels: usize,
    /// Most calls each service served implicitly runs at once.
    pub max_running_calls: usize,
    /// Most regions this team exports at once.
    pub max_regions: usize,
    /// Most bytes this team exports in all its regions (whole pages).
    pub max_exported_bytes: u64,
    /// Most regions this team has open at once as an importer.
    pub max_imported_regions: usize,
    /// Most link ends this team holds at once.
    pub max_links: usize,
    /// Most sends and calls of this team waiting for their answer at once.
    pub max_calls_in_flight: usize,
    /// How many messages, and bytes, one end of a link lets its peer send
    /// ahead of what it has received.
    pub link_window: (u32, u32),
    /// How long a proxy left by a moved link end may wait to be bypassed.
    pub link_proxy_lifetime: Duration,
    /// Most TCP connections from one address whose handshake is under way
    /// (the cluster file's `handshakes-per-source` replaces it).
    pub handshakes_per_source: usize,
}

/// The range of `handoff_after`.
pub const MIN_HANDOFF_AFTER: Duration = Duration::from_micros(100);
pub const MAX_HANDOFF_AFTER: Duration = Duration::from_secs(60);

/// The largest `max_regions` and `max_imported_regions`.
pub const MAX_REGIONS: usize = 1 << 20;
/// The largest `max_exported_bytes` (256 TiB).
pub const MAX_EXPORTED_BYTES: u64 = 1 << 48;

pub(crate) use super::call_slab::MAX_CALLS_IN_FLIGHT;

/// The largest `max_running_calls`.
pub const MAX_RUNNING_CALLS: usize = 1 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            node: std::env::var("FERRY_NODE").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
            processors: 1,
            handoff_after: Duration::from_millis(2),
            max_replacements: 4,
            spin: Duration::from_micros(20),
            park_timeout: Duration::from_millis(50),
            ring_bytes: 64 * 1024,
            max_ring_bytes: 64 * 1024 * 1024,
            inbox_capacity: 1024,
            inbox_bytes: 64 << 20,
            hold_capacity: 1024,
            hold_bytes: 64 << 20,
            max_message: DEFAULT_MAX_MESSAGE,
            runtime_dir: None,
            shutdown_grace: Duration::from_secs(1),
            blocking_threads: 16,
            blocking_idle: Duration::from_secs(10),
            cluster: None,
            peer_timeout: Duration::from_secs(10),
            busy_poll: false,
            share_cpu: true,
            etcd: Vec::new(),
            names_ttl: Duration::from_secs(10),
            max_names: 4096,
            max_channels: 1024,
            max_running_calls: 1024,
            max_regions: 1024,
            max_exported_bytes: 1 << 40,
            max_imported_regions: 1024,
            max_links: 4096,
            max_calls_in_flight: 1 << 20,
            link_window: (64, 1 << 20),
            link_proxy_lifetime: Duration::from_secs(10),
            handshakes_per_source: 8,
        }
    }
}

/// Builds a [`Team`].
#[derive(Clone, Debug, Default)]
pub struct TeamBuilder {
    cfg: Config,
}

impl TeamBuilder {
    /// This machine's node number (default: `$FERRY_NODE`, else 0).
    pub fn node(mut self, node: u16) -> Self {
        self.cfg.node = node;
        self
    }
    /// OS threads that run tasks (default 1). With 0, threads blocked in
    /// ferry's blocking calls drive the team's channels and run its tasks;
    /// futures awaited from another executor then make progress only while
    /// some thread is in such a call.
    pub fn processors(mut self, n: usize) -> Self {
        self.cfg.processors = n;
        self
    }
    /// How long a processor may stay inside one handler or task while
    /// other work for the team waits before a replacement processor is
    /// started to do that work (default 2 ms; 100 µs to 1 min). A handler
    /// that blocks (a `std::thread::sleep`, a synchronous file read) then
    /// delays the team's other calls by this much to five times as much
    /// (the watcher looks every `handoff_after` while a processor is
    /// inside user code, four times as seldom while none is), not by its
    /// own length; it should still use [`Team::spawn_blocking`](crate::Team::spawn_blocking).
    pub fn handoff_after(mut self, d: Duration) -> Self {
        self.cfg.handoff_after = d;
        self
    }
    /// Most replacement processors running at once (default 4; 0 turns
    /// hand-off off). A replacement retires once the processor it stood in
    /// for is back; a handler blocked for good holds one for good.
    pub fn max_replacements(mut self, n: usize) -> Self {
        self.cfg.max_replacements = n;
        self
    }
    /// How long an idle thread polls before it sleeps (default 20 µs).
    pub fn spin(mut self, d: Duration) -> Self {
        self.cfg.spin = d;
        self
    }
    /// Busy-poll mode, for latency-critical teams (off by default): a
    /// thread waiting for an answer (a call's reply, a message it
    /// receives) never parks while it waits; it polls its channels (for a
    /// TCP channel: the socket, a system call per turn) until the answer
    /// comes or its deadline passes. It saves the wake-up (tens of µs on
    /// a VM) at the price of a core per waiting thread. Processors idle as
    /// usual ([`TeamBuilder::spin`] bounds their spinning).
    pub fn busy_poll(mut self) -> Self {
        self.cfg.busy_poll = true;
        self
    }
    /// Whether the team's spinning threads give way when CPUs are short
    /// (default on; URPC's processor reallocation, as far as a process can
    /// do it). With it, a spinning thread that just woke a thread lets
    /// that thread have its CPU first (`sched_yield`: a system call, about
    /// a microsecond in a virtual machine even when nobody waits); one that
    /// has waited a few microseconds yields once, and again at each look at
    /// the clock while its yields run other threads; and a thread waiting for an answer
    /// from a team on this machine sleeps at once when that team has no
    /// thread on a CPU (its pollers do not turn, or it sleeps while CPUs
    /// are short). Off, threads spin their whole [`TeamBuilder::spin`]
    /// whatever happens (as ferry did before it had this setting): with
    /// more busy threads than CPUs a call may then cost a scheduler time slice.
    pub fn share_cpu(mut self, on: bool) -> Self {
        self.cfg.share_cpu = on;
        self
    }
    /// Puts the team's names in etcd (`addr`: its client address,
    /// `host:port`) instead of the embedded plane (default
    /// `$FERRY_ETCD`, else none); see [`crate::names`] for what each
    /// plane guarantees. A name is then unique in the cluster; it is put
    /// under a lease of `ttl` (whole seconds, at least 1, at most a day) kept alive while the team lives: a team that
    /// dies loses its names after `ttl`, one that leaves at once. Lookups
    /// this node cannot answer ask etcd, and waits for a name watch it.
    pub fn etcd(self, addr: SocketAddr, ttl: Duration) -> Self {
        self.etcd_endpoints([addr], ttl)
    }
    /// [`TeamBuilder::etcd`] with the client addresses of several members
    /// of one etcd cluster (`$FERRY_ETCD`: comma-separated): a request
    /// goes to the member that answered last, and on to the next while
    /// one fails.
    pub fn etcd_endpoints(mut self, addrs: impl IntoIterator<Item = SocketAddr>, ttl: Duration) -> Self {
        self.cfg.etcd = addrs.into_iter().collect();
        self.cfg.names_ttl = ttl;
        self
    }
    /// Most names the team binds at once (default 4096): past it, binding
    /// one more is `Error::LimitReached` (`Limit::Names`). Each name is a
    /// file of the node's plane (and a key in etcd's).
    pub fn max_names(mut self, n: usize) -> Self {
        self.cfg.max_names = n;
        self
    }
    /// Most channels the team keeps at once, one per peer team it talks
    /// with (default 1024): past it, a bind this team starts fails with
    /// `Error::LimitReached` (`Limit::Channels`), and one a peer starts is
    /// refused (the peer gets that error). A channel holds a few descriptors
    /// and, over shared memory, two rings and two payload areas.
    pub fn max_channels(mut self, n: usize) -> Self {
        self.cfg.max_channels = n;
        self
    }
    /// Most regions the team exports at once (default 1024): past it,
    /// `Team::export` fails with `Error::LimitReached` (`Limit::Regions`).
    pub fn max_regions(mut self, n: usize) -> Self {
        self.cfg.max_regions = n;
        self
    }
    /// Most bytes the team exports in all its regions, counted in whole
    /// pages (default 1 TiB, also the most one region has): past it,
    /// `Team::export` fails with `Error::LimitReached`
    /// (`Limit::ExportedBytes`). Memory is used only as it is written.
    pub fn max_exported_bytes(mut self, n: u64) -> Self {
        self.cfg.max_exported_bytes = n;
        self
    }
    /// Most regions the team has open at once as an importer (default
    /// 1024): past it, `Team::open_region` fails with
    /// `Error::LimitReached` (`Limit::ImportedRegions`). On one machine each
    /// is a mapping (two, with its control page) and two descriptors.
    pub fn max_imported_regions(mut self, n: usize) -> Self {
        self.cfg.max_imported_regions = n;
        self
    }
    /// Most link ends the team holds at once (default 4096, at most
    /// 2^20): past it, making or receiving one fails with
    /// `Error::LimitReached` (`Limit::Links`).
    pub fn max_links(mut self, n: usize) -> Self {
        self.cfg.max_links = n;
        self
    }
    /// Most sends and calls the team has waiting for their answer (or
    /// checkpoint) at once (default 2^20, at most 2^30): past it, one more
    /// fails with `Error::LimitReached` (`Limit::CallsInFlight`). Each takes
    /// an entry of 160 bytes, allocated as they are first needed and
    /// reused after.
    pub fn max_calls_in_flight(mut self, n: usize) -> Self {
        self.cfg.max_calls_in_flight = n;
        self
    }
    /// How far ahead a link's peer may send: each end of a link this team
    /// holds takes at most `messages` messages and `bytes` bytes it has not
    /// received yet (default 64 and 1 MiB; 1..=65,536 messages, 4 KiB..=
    /// 256 MiB; one message larger than `bytes` goes alone). A sender past
    /// it waits (or gets `WouldBlock` for an `Immediate` send).
    pub fn link_window(mut self, messages: u32, bytes: u32) -> Self {
        self.cfg.link_window = (messages, bytes);
        self
    }
    /// How long a proxy that a link end moving away leaves in this team
    /// may forward before the route is repaired behind the end (default
    /// 10 s, 10 ms..=1 h): past it (an end never adopted — its message was
    /// dropped unread —, a team on the route that never answers) the route
    /// is given up, and both ends fail with `PeerGone`.
    pub fn link_proxy_lifetime(mut self, d: Duration) -> Self {
        self.cfg.link_proxy_lifetime = d;
        self
    }
    /// Most calls each service this team serves implicitly
    /// ([`ServiceEndpoint::serve`](crate::rpc::ServiceEndpoint::serve))
    /// runs at once (default 1024, at most 2^20): handlers that wait, and
    /// a batch of n calls as n (as this bound if n is larger) until it has
    /// run to its end. Calls past it stay in the
    /// endpoint's inbox, whose bounds (`inbox_capacity`, `inbox_bytes`)
    /// then push back on the callers; they run as running calls end.
    /// [`Serving::running`](crate::rpc::Serving::running) counts them.
    pub fn max_running_calls(mut self, n: usize) -> Self {
        self.cfg.max_running_calls = n;
        self
    }
    /// Pure blocking mode for machines with few cores: never spin, sleep at once.
    pub fn blocking(self) -> Self {
        self.spin(Duration::ZERO)
    }
    /// Longest sleep without looking around (default 50 ms). A sleeper then
    /// looks at the next 4 of its channels for a frame whose wake-up was
    /// lost (and sleeps again): such a frame waits at most `park_timeout` ×
    /// channels / 4. Everything else that needs a sleeper wakes it (frames,
    /// timers, a dead peer, memory given back).
    pub fn park_timeout(mut self, d: Duration) -> Self {
        self.cfg.park_timeout = d.max(MIN_PARK);
        self
    }
    /// Bytes of each ring (one per direction) of a shared-memory channel this
    /// team opens, and what it lets a TCP peer have in flight; rounded up to
    /// a power of two, at least 4 KiB, at most [`MAX_RING_BYTES`] (1 GiB;
    /// default 64 KiB: a channel pair costs 132 KiB of shared memory).
    pub fn ring_bytes(mut self, n: usize) -> Self {
        // Rounded by `start`, once it is known not to overflow.
        self.cfg.ring_bytes = n;
        self
    }
    /// Largest ring a peer may ask this team to map for a channel it
    /// opens (default 64 MiB, from 4 KiB to [`MAX_RING_BYTES`]): a peer
    /// asking more is refused with `Error::LimitReached` (`Limit::RingBytes`).
    pub fn max_ring_bytes(mut self, n: usize) -> Self {
        self.cfg.max_ring_bytes = n;
        self
    }
    /// Messages an endpoint queues before the sender is pushed back (default 1024).
    ///
    /// Flow control is per endpoint and per channel: each endpoint's inbox
    /// is bounded (`inbox_capacity` messages, `inbox_bytes` bytes); a message
    /// its full inbox refuses waits in its channel's hold queue (bounded by
    /// `hold_capacity` and `hold_bytes`); with that full too, frames stay in
    /// the channel's ring (and large payloads in the sender's payload area,
    /// one of each per direction of each channel), and the sender finds the
    /// channel full: `WouldBlock` for `Immediate`, a wait bounded by its
    /// deadline otherwise.
    pub fn inbox_capacity(mut self, n: usize) -> Self {
        self.cfg.inbox_capacity = n.max(1);
        self
    }
    /// Bytes an endpoint queues before the sender is pushed back (default
    /// 64 MiB). A message counts its payload, out-of-band ones included,
    /// plus [`MESSAGE_OVERHEAD`] (64) bytes. An empty inbox takes one
    /// message whatever its size, so a message larger than the bound still
    /// gets through, alone.
    pub fn inbox_bytes(mut self, n: usize) -> Self {
        self.cfg.inbox_bytes = n;
        self
    }
    /// Messages a channel sets aside when their endpoint's inbox is full
    /// (default 1024, at least 1), so that traffic behind them (replies,
    /// acks, other endpoints) keeps flowing; past that the channel pushes
    /// back on the sender.
    pub fn hold_capacity(mut self, n: usize) -> Self {
        self.cfg.hold_capacity = n.max(1);
        self
    }
    /// Bytes a channel sets aside when their endpoint's inbox is full
    /// (default 64 MiB), counted as for [`TeamBuilder::inbox_bytes`]; an
    /// empty hold queue takes one message whatever its size.
    pub fn hold_bytes(mut self, n: usize) -> Self {
        self.cfg.hold_bytes = n;
        self
    }
    /// Largest message sent or accepted (default 1 GiB + 1 MiB, at most
    /// [`MAX_MESSAGE`], 64 GiB). A message
    /// larger than a ring record travels out of band, through a payload
    /// area of this size per direction of each shared-memory channel
    /// (virtual memory: only the pages a message touched are resident; of
    /// those, the ones above the area's first MiB go back to the kernel
    /// once no message has needed them for a second or so).
    pub fn max_message(mut self, n: usize) -> Self {
        self.cfg.max_message = n;
        self
    }
    /// Directory of the node name plane (default `$FERRY_RUNTIME_DIR`, see `RuntimeDir::from_env`).
    pub fn runtime_dir(mut self, p: impl Into<PathBuf>) -> Self {
        self.cfg.runtime_dir = Some(p.into());
        self
    }

    /// How long shutdown waits for the team's threads to stop (default 1 s).
    /// A thread still busy after that (user code that blocks: a handler or a
    /// task) is left running, detached, with a warning; the team leaves anyway.
    /// `Duration::MAX` waits for good.
    pub fn shutdown_grace(mut self, d: Duration) -> Self {
        self.cfg.shutdown_grace = d;
        self
    }

    /// Most threads running [`Team::spawn_blocking`] jobs at once (default
    /// 16, at least 1, at most [`MAX_THREADS`]); further jobs wait for one
    /// of them.
    pub fn blocking_threads(mut self, n: usize) -> Self {
        self.cfg.blocking_threads = n.max(1);
        self
    }
    /// How long a blocking thread waits for another job before it ends
    /// (default 10 s, at most a day).
    pub fn blocking_idle(mut self, d: Duration) -> Self {
        self.cfg.blocking_idle = d;
        self
    }

    /// The cluster this node belongs to (default: read from the file
    /// `$FERRY_CLUSTER` names, if set; else none: teams of other nodes are
    /// out of reach). Its node number replaces [`TeamBuilder::node`]'s.
    pub fn cluster(mut self, c: Cluster) -> Self {
        self.cfg.cluster = Some(c);
        self
    }

    /// Most TCP connections from one address that the team takes at once
    /// before they prove the cluster key (default 8, at least 1; the
    /// cluster file's `handshakes-per-source N` replaces it). Each holds a
    /// thread of its own for at most the handshake's deadline (5 s); one
    /// past the bound is refused at once (its connector gets
    /// `LimitReached(Handshakes)`). Addresses that are no node's of the
    /// cluster file share one bound of 64 besides.
    pub fn handshakes_per_source(mut self, n: usize) -> Self {
        self.cfg.handshakes_per_source = n.max(1);
        self
    }

    /// How long a peer on another node may stay silent before it counts as
    /// gone (default 10 s, at least 4 ms, at most a day): its channel closes and what waits
    /// on it fails with `PeerGone`. Each channel sends a heartbeat when it
    /// has sent nothing for a quarter of this, so only a dead peer or a cut
    /// link is silent that long. (A peer on this node is known gone at once.)
    pub fn peer_timeout(mut self, d: Duration) -> Self {
        self.cfg.peer_timeout = d.max(MIN_PEER_TIMEOUT);
        self
    }

    /// Starts the team: claims its number on the node, opens its socket and
    /// starts its threads. A setting outside its allowed range fails here,
    /// with `Error::InvalidSetting` naming it and the range, before
    /// anything starts.
    pub fn start(self) -> Result<Team> {
        TeamInner::start(self.checked()?)
    }

    /// The settings, checked and normalized (what `start` starts with).
    pub(crate) fn checked(mut self) -> Result<Config> {
        let c = &mut self.cfg;
        in_range("processors", c.processors, 0..=MAX_THREADS)?;
        in_range("handoff_after", c.handoff_after, MIN_HANDOFF_AFTER..=MAX_HANDOFF_AFTER)?;
        in_range("max_replacements", c.max_replacements, 0..=MAX_THREADS)?;
        in_range("blocking_threads", c.blocking_threads, 1..=MAX_THREADS)?;
        in_range("spin", c.spin, Duration::ZERO..=A_DAY)?;
        in_range("park_timeout", c.park_timeout, MIN_PARK..=MAX_PARK)?;
        in_range("ring_bytes", c.ring_bytes, 0..=MAX_RING_BYTES)?;
        c.ring_bytes = c.ring_bytes.max(shm::MIN_RING).next_power_of_two();
        in_range("max_ring_bytes", c.max_ring_bytes, shm::MIN_RING..=MAX_RING_BYTES)?;
        in_range("max_message", c.max_message, 0..=MAX_MESSAGE)?;
        in_range("inbox_capacity", c.inbox_capacity, 1..=usize::MAX)?;
        in_range("hold_capacity", c.hold_capacity, 1..=usize::MAX)?;
        in_range("max_running_calls", c.max_running_calls, 1..=MAX_RUNNING_CALLS)?;
        in_range("max_regions", c.max_regions, 1..=MAX_REGIONS)?;
        in_range("max_exported_bytes", c.max_exported_bytes, 4096..=MAX_EXPORTED_BYTES)?;
        in_range("max_imported_regions", c.max_imported_regions, 1..=MAX_REGIONS)?;
        in_range("max_links", c.max_links, 1..=MAX_REGIONS)?;
        in_range("max_calls_in_flight", c.max_calls_in_flight, 1..=MAX_CALLS_IN_FLIGHT)?;
        in_range("link_window (messages)", c.link_window.0, 1..=1 << 16)?;
        in_range("link_window (bytes)", c.link_window.1, 4096..=1 << 28)?;
        in_range("link_proxy_lifetime", c.link_proxy_lifetime, Duration::from_millis(10)..=Duration::from_secs(3600))?;
        in_range("handshakes_per_source", c.handshakes_per_source, 1..=MAX_THREADS)?;
        in_range("blocking_idle", c.blocking_idle, Duration::ZERO..=A_DAY)?;
        in_range("peer_timeout", c.peer_timeout, MIN_PEER_TIMEOUT..=A_DAY)?;
        in_range("etcd (ttl)", c.names_ttl, Duration::ZERO..=A_DAY)?;
        // A cluster built in code (a file's is checked as it is read).
        if let Some(cluster) = &c.cluster {
            cluster.check()?;
        }
        Ok(self.cfg)
    }
}

/// `Ok` if `value` is in `allowed`, else `InvalidSetting` naming `setting`.
pub(super) fn in_range<T: PartialOrd + Debug>(
    setting: &'static str,
    value: T,
    allowed: RangeInclusive<T>,
) -> Result<()> {
    let shown = format!("{value:?}");
    in_range_as(setting, value, allowed, shown)
}

/// As [`in_range`], the value shown as `shown`.
pub(super) fn in_range_as<T: PartialOrd + Debug>(
    setting: &'static str,
    value: T,
    allowed: RangeInclusive<T>,
    shown: String,
) -> Result<()> {
    if allowed.contains(&value) {
        return Ok(());
    }
    let allowed = format!("{:?} to {:?}", allowed.start(), allowed.end());
    Err(Error::InvalidSetting { setting, value: shown, allowed })
}

/// The etcd client addresses in `$FERRY_ETCD`'s form: `ip:port`,
/// comma-separated. Empty (or blank): none.
pub(crate) fn parse_etcd_addrs(list: &str) -> Result<Vec<SocketAddr>> {
    if list.trim().is_empty() {
        return Ok(Vec::new());
    }
    list.split(',')
        .map(|a| {
            a.trim().parse().map_err(|_| Error::InvalidArgument(format!("FERRY_ETCD={list:?}: {a:?} is not ip:port")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(b: TeamBuilder) -> (&'static str, String) {
        match b.start() {
            Err(Error::InvalidSetting { setting, allowed, .. }) => (setting, allowed),
            other => panic!("expected InvalidSetting, got {:?}", other.map(|t| t.id())),
        }
    }

    /// Settings out of range fail `start` with the setting's name and range,
    /// before anything starts: a huge `ring_bytes` overflowed its rounding
    /// (a panic in debug builds, a 0-byte ring in release ones), and a
    /// `max_message` above 64 GiB tripped an `assert!` at the first connect.
    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let b = || Team::builder().runtime_dir(std::env::temp_dir().join("ferry-never-made"));
        assert_eq!(refused(b().ring_bytes(usize::MAX)).0, "ring_bytes");
        assert_eq!(refused(b().ring_bytes(MAX_RING_BYTES + 1)).0, "ring_bytes");
        let (setting, allowed) = refused(b().max_message(MAX_MESSAGE + 1));
        assert_eq!((setting, allowed.as_str()), ("max_message", "0 to 68719476736"));
        assert_eq!(refused(b().max_ring_bytes(1 << 40)).0, "max_ring_bytes");
        assert_eq!(refused(b().processors(1 << 20)).0, "processors");
        assert_eq!(refused(b().handoff_after(Duration::ZERO)).0, "handoff_after");
        assert_eq!(refused(b().handoff_after(Duration::MAX)).0, "handoff_after");
        assert_eq!(refused(b().max_replacements(1 << 20)).0, "max_replacements");
        for n in [0, MAX_RUNNING_CALLS + 1, usize::MAX] {
            assert_eq!(refused(b().max_running_calls(n)).0, "max_running_calls");
        }
        assert_eq!(refused(b().blocking_threads(usize::MAX)).0, "blocking_threads");
        assert_eq!(refused(b().spin(Duration::MAX)).0, "spin");
        assert_eq!(refused(b().park_timeout(Duration::MAX)).0, "park_timeout");
        assert_eq!(refused(b().peer_timeout(Duration::MAX)).0, "peer_timeout");
        assert_eq!(refused(b().blocking_idle(Duration::MAX)).0, "blocking_idle");
        let etcd = ([127, 0, 0, 1], 1).into();
        assert_eq!(refused(b().etcd(etcd, Duration::MAX)).0, "etcd (ttl)");
        // A cluster built in code: a `from` block of more bits than its
        // address has panicked in the handshake thread, on a peer's connection.
        let cluster = |from: Vec<crate::Cidr>, per_source| crate::Cluster {
            node: 1,
            listen: ([127, 0, 0, 1], 1).into(),
            peers: [(2, ([127, 0, 0, 2], 1).into())].into(),
            key: std::sync::Arc::from(&[7u8; 32][..]),
            tls: None,
            from: [(2, from)].into(),
            handshakes_per_source: per_source,
        };
        let v4 = |bits| crate::Cidr { addr: [10, 0, 0, 0].into(), bits };
        let v6 = |bits| crate::Cidr { addr: std::net::Ipv6Addr::LOCALHOST.into(), bits };
        for from in [vec![v4(33)], vec![v4(8), v4(255)], vec![v6(129)]] {
            assert_eq!(refused(b().cluster(cluster(from, None))).0, "cluster (from)");
        }
        for n in [0, MAX_THREADS + 1, usize::MAX] {
            assert_eq!(refused(b().cluster(cluster(vec![], Some(n)))).0, "cluster (handshakes_per_source)");
        }
        assert!(b().cluster(cluster(vec![v4(32), v6(128)], Some(MAX_THREADS))).checked().is_ok());
        assert!(!std::env::temp_dir().join("ferry-never-made").exists());
    }

    /// In range, rounded as documented.
    #[test]
    fn ring_bytes_round_up_within_range() {
        let c = |n| TeamBuilder::default().ring_bytes(n).checked().unwrap().ring_bytes;
        assert_eq!(c(0), shm::MIN_RING);
        assert_eq!(c(5000), 8192);
        assert_eq!(c(MAX_RING_BYTES), MAX_RING_BYTES);
    }

    #[test]
    fn etcd_addrs_parse() {
        let a: SocketAddr = "127.0.0.1:2379".parse().unwrap();
        let b: SocketAddr = "[::1]:2380".parse().unwrap();
        assert_eq!(parse_etcd_addrs("127.0.0.1:2379").unwrap(), vec![a]);
        assert_eq!(parse_etcd_addrs("127.0.0.1:2379, [::1]:2380").unwrap(), vec![a, b]);
        assert_eq!(parse_etcd_addrs(" ").unwrap(), vec![]);
        for bad in ["127.0.0.1", "127.0.0.1:2379,", "etcd:2379", "127.0.0.1:2379,,[::1]:2380"] {
            assert!(matches!(parse_etcd_addrs(bad), Err(Error::InvalidArgument(_))), "{bad:?}");
        }
    }
}
