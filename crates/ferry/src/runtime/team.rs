//! The team: this process's presence in ferry. `Team` is the public handle;
//! `TeamInner` ties the components together (endpoints, calls, peers and
//! channels, timers, the executor) and owns start and shutdown.

use super::blocking::BlockingPool;
use super::calls::Calls;
use super::channel::Channel;
use super::channel_list::ChannelList;
use super::config::{Config, TeamBuilder};
use super::endpoints::Endpoints;
use super::executor::{Executor, JoinHandle};
use super::handoff::{self, Handoff};
use super::handshakes::Handshakes;
use super::peers::Peers;
use super::reactor::{self, Reactor};
use super::timer::Timers;
use super::{idle, Sleep};
use crate::error::{Error, Limit, Result};
use crate::id::{EndpointId, TeamId};
use crate::names::etcd::EtcdNames;
use crate::names::plane::{EmbeddedPlane, EtcdPlane, NamePlane};
use crate::names::{NodeNames, RuntimeDir, TeamLease};
use crate::transport::doorbell::Doorbell;
use crate::transport::{inproc, shm, tcp};
use parking_lot::Mutex;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

/// Team numbers above every possible pid: used when the pid is taken (a
/// second team in the same process).
const EXTRA_TEAMS: u32 = 1 << 22;

/// A team: this process's presence in ferry. Clones share it; when the last
/// clone is dropped (or on [`Team::shutdown`]) the team leaves: its channels
/// close, its names disappear, its files are removed, its tasks are dropped.
///
/// Who keeps a team alive: every `Team` handle, and nothing else. The
/// runtime never holds one: ports, senders, clients, a served service with
/// its serving task and in-flight handlers refer to the team without owning
/// it, so the end of `main` (or any drop of the last handle) shuts the team
/// down even while `Serving` or a port is still around; they fail with
/// `Shutdown` from then on. A `Team` clone the program itself moves into a
/// task or a handler is a handle like any other: it keeps the team alive as
/// long as that task or handler lives (dropping the `Serving` releases its
/// handler; an aborted task's future is dropped at once). `shutdown` leaves
/// regardless, failing what waits with `Shutdown` and dropping every task.
///
/// Leaving never hangs: the team waits at most `shutdown_grace` (default
/// 1 s) for its threads; one still inside user code that blocks is left
/// running, detached, with a warning naming it.
#[derive(Clone)]
pub struct Team {
    pub(crate) inner: Arc<TeamInner>,
    /// The owner count: `TeamInner` references held inside the runtime are not owners.
    _owner: Arc<ShutdownOnDrop>,
}

struct ShutdownOnDrop(Arc<TeamInner>);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl Team {
    /// A builder to set the team up before starting it.
    pub fn builder() -> TeamBuilder {
        TeamBuilder::default()
    }

    /// A team with the default settings.
    pub fn start() -> Result<Team> {
        Team::builder().start()
    }

    /// This team's id (node, number, incarnation).
    pub fn id(&self) -> TeamId {
        self.inner.id
    }

    /// The settings the team started with.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// Runs a task on the team's processors.
    pub fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.exec.spawn(fut)
    }

    /// Runs blocking code (a file read, a long computation) on one of the
    /// team's blocking threads, so it stalls no processor: a handler or task
    /// awaits the returned handle instead of blocking. The threads are a
    /// small pool beside the processors, started when jobs need them (at
    /// most `blocking_threads`, default 16; further jobs wait for one) and
    /// ended after `blocking_idle` (default 10 s) without work. A job that
    /// panics yields `Panicked`; one that never ran because the team left,
    /// `Shutdown`. Aborting the handle does not stop a job.
    pub fn spawn_blocking<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        self.inner.blocking.spawn(f)
    }

    /// Runs `fut` on this thread until it completes, driving the team's
    /// channels meanwhile: the blocking API for code with no runtime.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        idle::block_on(&self.inner, fut)
    }

    /// Runs `f`, holding back what its sends would tell their peers, and
    /// telling it once per channel by the time it returns: on TCP the
    /// frames are written together, in order (a burst of calls or messages
    /// costs one system call per channel instead of one each); on shared
    /// memory each frame is published at once (a peer that polls takes it
    /// at once) and the peer is woken, if it sleeps, once (one full fence
    /// and one look at its state page per channel instead of one each).
    /// Another thread of the team that tidies the channel may do it
    /// sooner; a send that finds the ring full does it at once (room comes
    /// only once the peer drains). A wait inside `f` does it first, so a
    /// call inside a batch does not wait for itself.
    pub fn batch<R>(&self, f: impl FnOnce() -> R) -> R {
        idle::batch(&self.inner, f)
    }

    /// A future that completes after `d`.
    pub fn sleep(&self, d: Duration) -> Sleep {
        Sleep::new(&self.inner, d)
    }

    /// This node's name files (and runtime directory): the names of this
    /// node's teams, whichever plane they are registered in.
    pub fn names(&self) -> &NodeNames {
        &self.inner.names
    }

    /// Looks a name up in the team's name plane (see [`crate::names`]):
    /// this node's names, then the cluster's other nodes or etcd (blocking
    /// meanwhile); `NameNotFound` if none has it (to wait for it, see
    /// [`Team::lookup_wait`]).
    pub fn lookup(&self, name: &str) -> Result<EndpointId> {
        self.inner.plane.lookup(name)
    }

    /// How many replacement processors this team started: each time one of
    /// its processors stayed inside one handler or task for
    /// [`TeamBuilder::handoff_after`](crate::TeamBuilder::handoff_after)
    /// while other work waited (a handler that blocks).
    pub fn handoffs(&self) -> u64 {
        self.inner.handoff.started()
    }

    /// How many times a thread of this team slept until its park timeout
    /// (`TeamBuilder::park_timeout`) while a channel had work for it: a
    /// wake-up that was lost, the timeout bounding the delay. A monitor,
    /// not proof: a frame that came just as a sleep ended, while the thread
    /// it woke had not run yet, counts too (now and then, under load).
    pub fn late_wakeups(&self) -> u64 {
        self.inner.late_wakeups.load(Ordering::Relaxed)
    }

    /// How many sends looked their route up in the team's peers map
    /// instead of taking their sender's cached channel: a sender's first
    /// send, the first after its channel died (a new one is cached then),
    /// and every send of a sender whose peer reconnected more than 64
    /// times (it caches no more). A diagnostic: growing with the sends
    /// means they take the slow path.
    pub fn route_lookups(&self) -> u64 {
        self.inner.route_lookups.load(Ordering::Relaxed)
    }

    /// Leaves now: fails what waits on this team with `Shutdown`, closes
    /// channels, removes files, drops tasks. Returns within about
    /// `shutdown_grace` (default 1 s) even if a handler or task never does:
    /// its thread is left running, detached (see [`TeamBuilder::shutdown_grace`]).
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

pub(crate) struct TeamInner {
    pub id: TeamId,
    pub cfg: Config,
    pub doorbell: Arc<Doorbell>,
    /// This node's runtime directory and name files.
    pub names: NodeNames,
    /// Where the team's names are registered and looked up (chosen at start).
    pub(crate) plane: Box<dyn NamePlane>,
    /// The team's claim on its number on this node; `None` once it left.
    lease: Mutex<Option<TeamLease>>,
    pub exec: Arc<Executor>,
    /// Replacement processors for processors stuck in user code.
    pub(crate) handoff: Handoff,
    /// Channels that had frames lately (see `readiness`).
    pub(crate) hot: super::readiness::Hot,
    pub(super) blocking: BlockingPool,
    pub timers: Timers,
    pub(super) endpoints: Endpoints,
    /// Every channel the progress loop drains, the loop-back first. Read
    /// lock-free at every idle turn; replaced whole when a channel comes or goes.
    pub(crate) channels: ChannelList,
    pub(super) peers: Peers,
    pub(super) loopback: Arc<Channel>,
    pub(super) calls: Calls,
    /// Primitives' handlers of served frames (see `served`).
    pub(super) served: super::served::Served,
    shut_down: AtomicBool,
    /// Names bound now (at most `cfg.max_names`).
    names_held: AtomicUsize,
    /// See [`Team::late_wakeups`].
    pub(super) late_wakeups: AtomicU64,
    /// See [`Team::route_lookups`].
    pub(crate) route_lookups: AtomicU64,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(super) reactor: Reactor,
}

impl TeamInner {
    pub(super) fn start(mut cfg: Config) -> Result<Team> {
        if cfg.cluster.is_none() {
            if let Some(path) = std::env::var_os("FERRY_CLUSTER") {
                cfg.cluster = Some(super::cluster::Cluster::from_file(std::path::Path::new(&path))?);
            }
        }
        if let Some(c) = &cfg.cluster {
            cfg.node = c.node;
        }
        let dir = match &cfg.runtime_dir {
            Some(p) => RuntimeDir::at(p.clone())?,
            None => RuntimeDir::from_env()?,
        };
        let lease = claim_team_number(&dir)?;
        // What the node's dead teams left that no live team met goes now.
        NodeNames::new(dir.clone()).sweep_dead_teams();
        let id = TeamId { node: cfg.node, team: lease.team(), incarnation: crate::id::new_incarnation() };
        if cfg.etcd.is_empty() {
            if let Ok(list) = std::env::var("FERRY_ETCD") {
                cfg.etcd = super::config::parse_etcd_addrs(&list)?;
            }
        }
        let plane = name_plane(&cfg, &dir)?;
        let doorbell = Arc::new(Doorbell::create()?);
        let handshakes = match &cfg.cluster {
            Some(c) => Handshakes::new(c.handshakes_per_source.unwrap_or(cfg.handshakes_per_source), c.sources()),
            None => Handshakes::new(cfg.handshakes_per_source, []),
        };
        let reactor = Reactor::new(&dir.team_socket(id.team), cfg.cluster.as_ref().map(|c| c.listen), handshakes)?;
        let loopback =
            Arc::new(Channel::new(id, Box::new(inproc::loopback(cfg.ring_bytes, cfg.max_message, doorbell.clone()))));
        let inner = Arc::new(TeamInner {
            id,
            names: NodeNames::new(dir),
            plane,
            lease: Mutex::new(Some(lease)),
            exec: Executor::new(doorbell.clone()),
            handoff: Handoff::new(cfg.processors, cfg.handoff_after, cfg.max_replacements),
            hot: super::readiness::Hot::new(),
            blocking: BlockingPool::new(id.team, cfg.blocking_threads, cfg.blocking_idle),
            endpoints: Endpoints::new(id, cfg.inbox_capacity, cfg.inbox_bytes, doorbell.clone()),
            doorbell,
            timers: Timers::new(),
            channels: ChannelList::new(loopback.clone()),
            peers: Peers::default(),
            loopback,
            calls: Calls::new(cfg.max_calls_in_flight),
            served: Default::default(),
            shut_down: AtomicBool::new(false),
            names_held: AtomicUsize::new(0),
            late_wakeups: AtomicU64::new(0),
            route_lookups: AtomicU64::new(0),
            threads: Mutex::new(Vec::new()),
            reactor,
            cfg,
        });
        let mut threads = Vec::new();
        let r = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("ferry-reactor-{}", id.team))
                .spawn(move || reactor::run(r))
                .map_err(Error::io("spawn reactor thread"))?,
        );
        if inner.handoff.enabled() {
            let t = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ferry-watch-{}", id.team))
                    .spawn(move || handoff::watch(t))
                    .map_err(Error::io("spawn watcher thread"))?,
            );
        }
        *inner.threads.lock() = threads;
        for i in 0..inner.cfg.processors {
            if let Err(e) = inner.start_processor(format!("ferry-proc-{i}"), false) {
                inner.shutdown();
                return Err(Error::io("spawn processor thread")(e));
            }
        }
        tracing::debug!(team = %id, names = inner.plane.describe(), "team started");
        Ok(Team { _owner: Arc::new(ShutdownOnDrop(inner.clone())), inner })
    }

    /// Starts a processor thread (a `replacement` for one stuck in user
    /// code, see `handoff`), unless the team is shut down.
    pub(super) fn start_processor(self: &Arc<Self>, name: String, replacement: bool) -> std::io::Result<()> {
        if self.is_shut_down() {
            return Err(std::io::Error::other("the team is shut down"));
        }
        let t = self.clone();
        let h = std::thread::Builder::new().name(name).spawn(move || idle::processor_loop(t, replacement))?;
        self.threads.lock().push(h);
        Ok(())
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    /// A look for `name` beyond this node ([`NamePlane::lookup_elsewhere`])
    /// on a blocking thread, for async callers.
    pub(crate) fn lookup_elsewhere(self: &Arc<Self>, name: &str) -> JoinHandle<Result<EndpointId>> {
        let (t, n) = (self.clone(), name.to_string());
        self.blocking.spawn(move || t.plane.lookup_elsewhere(&n))
    }

    /// A wait for `name` ([`NamePlane::watch`], at most `limit`) on a
    /// blocking thread, for async callers.
    pub(crate) fn watch_name(self: &Arc<Self>, name: &str, limit: Duration) -> JoinHandle<Result<EndpointId>> {
        let (t, n) = (self.clone(), name.to_string());
        self.blocking.spawn(move || t.plane.watch(&n, limit))
    }

    /// What this team brings to a TCP bind (it is in a cluster).
    pub(super) fn tcp_bind(&self, cluster: &super::cluster::Cluster) -> tcp::handshake::TcpBind {
        tcp::handshake::TcpBind {
            me: self.id,
            doorbell: self.doorbell.clone(),
            key: cluster.key.clone(),
            // As much in flight as a shared-memory ring holds; a large
            // message of any size this team accepts.
            grant: tcp::Grant { frames: self.cfg.ring_bytes, detached: self.cfg.max_message },
            patience: shm::HANDSHAKE_TIMEOUT,
            peer_timeout: self.cfg.peer_timeout,
            magic: None,
            tls: cluster.tls.clone(),
        }
    }

    pub(super) fn bind_config(&self) -> shm::BindConfig {
        shm::BindConfig {
            me: self.id,
            doorbell: self.doorbell.clone(),
            ring_bytes: self.cfg.ring_bytes,
            max_ring_bytes: self.cfg.max_ring_bytes,
            area_bytes: shm::area_for(self.cfg.max_message),
            handshake_timeout: shm::HANDSHAKE_TIMEOUT,
            cooler: Some(self.reactor.cooler.clone()),
            lease: None,
        }
    }

    /// The settings of a bind this team starts: with its lock file, which
    /// proves its identity to the acceptor (a second descriptor of it, not
    /// the lease's own: a bind must not keep the lock once the team left).
    pub(super) fn connect_config(&self) -> shm::BindConfig {
        let lease = self.lease.lock().as_ref().and_then(|l| l.lock_file().try_clone().ok()).map(Arc::new);
        shm::BindConfig { lease, ..self.bind_config() }
    }

    pub(crate) fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        // First fail everything that waits, so threads blocked in ferry calls
        // (processors included) return; then stop and join the threads, a
        // bounded time: one stuck in user code is left behind.
        let channels = self.channels.take();
        self.peers.clear();
        for ch in channels.iter() {
            // Tells each peer, whose end sees the hang-up.
            ch.close();
            ch.finished.store(true, Ordering::Release);
        }
        for ch in channels.iter() {
            self.fail_outbox(ch);
        }
        self.end_binds();
        self.calls.ours.fail_waiting(None, || Error::Shutdown);
        self.endpoints.close_all();
        self.blocking.close();
        self.reactor.stop();
        self.handoff.poke();
        self.doorbell.ring_now();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        self.join_bounded(threads);
        self.reactor.close();
        // Break the cycles that keep tasks (and through them this team) alive.
        self.timers.clear();
        self.calls.clear_cancels();
        self.served.clear();
        self.exec.clear();
        // The team's names go: its node files with its lease, then the plane's.
        self.lease.lock().take();
        self.plane.leave();
        tracing::debug!(team = %self.id, "team shut down");
    }

    /// Joins the team's threads (but this one), waiting `shutdown_grace` in
    /// all. A thread still running then is stuck in user code (a handler or
    /// task that blocks): it is left to finish on its own, detached, and
    /// exits when it next looks at the team; shutdown must not hang on it.
    fn join_bounded(&self, threads: Vec<std::thread::JoinHandle<()>>) {
        let me = std::thread::current().id();
        let mut left: Vec<_> = threads.into_iter().filter(|t| t.thread().id() != me).collect();
        let grace = self.cfg.shutdown_grace;
        let until = Instant::now().checked_add(grace);
        // Threads usually stop within microseconds of the doorbell: look often first.
        let mut pause = Duration::from_micros(20);
        loop {
            let (done, busy): (Vec<_>, Vec<_>) = left.into_iter().partition(|t| t.is_finished());
            for t in done {
                let _ = t.join();
            }
            left = busy;
            let now = Instant::now();
            if left.is_empty() || until.is_some_and(|u| now >= u) {
                break;
            }
            std::thread::sleep(until.map_or(pause, |u| pause.min(u - now)));
            pause = (pause * 2).min(Duration::from_millis(5));
        }
        for t in left {
            tracing::warn!(
                team = %self.id,
                thread = t.thread().name().unwrap_or("?"),
                ?grace,
                "thread still busy at shutdown (a handler or task that blocks?): left running, detached"
            );
        }
    }

    /// Registers a timer; if it is the earliest, wakes sleepers so they
    /// shorten their sleep to it.
    pub(crate) fn register_timer(&self, id: Option<u64>, at: Instant, waker: &Waker) -> u64 {
        let (id, earlier) = self.timers.register(id, at, waker);
        if earlier {
            self.doorbell.ring();
        }
        id
    }

    /// Binds `name` to `ep` in the team's name plane.
    pub fn register_name(&self, name: &str, ep: EndpointId) -> Result<()> {
        let lease = self.lease.lock();
        let lease = lease.as_ref().ok_or(Error::Shutdown)?;
        // Counted under the lease's lock, as the unbinding is.
        let held = self.names_held.load(Ordering::Relaxed);
        if held >= self.cfg.max_names {
            return Err(Error::LimitReached { limit: Limit::Names, max: self.cfg.max_names as u64 });
        }
        self.plane.register(lease, name, ep)?;
        self.names_held.store(held + 1, Ordering::Relaxed);
        Ok(())
    }

    /// Unbinds `name`, which this team bound (if the team is still there:
    /// leaving took its names).
    pub fn unregister_name(&self, name: &str) {
        if let Some(lease) = self.lease.lock().as_ref() {
            self.plane.unregister(lease, name);
            self.names_held.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The team's name plane: etcd's if configured, else the embedded one
/// (this node, and the cluster's other nodes if it is in one).
fn name_plane(cfg: &Config, dir: &RuntimeDir) -> Result<Box<dyn NamePlane>> {
    let node = NodeNames::new(dir.clone());
    if !cfg.etcd.is_empty() {
        return Ok(Box::new(EtcdPlane::new(node, EtcdNames::connect(&cfg.etcd, cfg.names_ttl)?)));
    }
    Ok(Box::new(EmbeddedPlane::new(node, cfg.cluster.clone(), shm::HANDSHAKE_TIMEOUT)))
}

/// Claims a team number: the pid for the first team of a process, then
/// numbers above every possible pid (a pid is at most 2^22).
fn claim_team_number(dir: &RuntimeDir) -> Result<TeamLease> {
    static STARTED: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    let n = STARTED.fetch_add(1, Ordering::Relaxed);
    if n == 0 {
        if let Ok(l) = TeamLease::acquire(dir, pid) {
            return Ok(l);
        }
    }
    let first = EXTRA_TEAMS + (pid % 2048) * 2048 + n % 2048;
    // Each tried once: a number held is most likely a live team's (in
    // containers, teams of other PID namespaces hold these numbers too).
    for t in first..crate::id::MAX_TEAM {
        if let Ok(l) = TeamLease::acquire_within(dir, t, Duration::ZERO) {
            return Ok(l);
        }
    }
    Err(Error::Refused(crate::error::Refusal::NoTeamNumber))
}
