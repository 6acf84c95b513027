//! The runtime of one team: processors running tasks, the progress loop that
//! drains channels into inboxes, the send path, and peer-death handling.
//!
//! Communication and scheduling are one piece (the lesson of URPC and LYNX):
//! a thread with nothing to run polls the channels itself, spins a bounded
//! time, and only then sleeps, so while both sides are busy a round trip
//! makes no system call.

pub(crate) mod channel;
mod channel_list;
mod executor;
pub(crate) mod idle;
pub(crate) mod inbox;
pub(crate) mod payload;
mod reactor;
mod timer;

pub(crate) use executor::{panic_message, CatchUnwind};
pub use executor::{AbortHandle, JoinHandle};

use crate::error::{Error, Result};
use crate::id::{EndpointId, TeamId};
use crate::names::{NodeNames, RuntimeDir, TeamLease};
use crate::transport::doorbell::Doorbell;
use crate::transport::{inproc, shm, Recv, SendError};
use crate::wire::{flags, Checkpoint, Header, Kind, NackReason};
use channel::Channel;
use executor::Executor;
use inbox::{Inbox, Incoming, Offer};
use parking_lot::{Mutex, RwLock};
use payload::Payload;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant, SystemTime};
use timer::Timers;

/// Team numbers above every possible pid: used when the pid is taken (a
/// second team in the same process).
const EXTRA_TEAMS: u32 = 1 << 22;

/// What runs when a peer cancels a call it made to this team.
type OnCancel = Box<dyn FnOnce() + Send>;

/// Settings of a team. Build with [`Team::builder`].
#[derive(Clone, Debug)]
pub struct Config {
    pub node: u16,
    pub processors: usize,
    pub spin: Duration,
    pub park_timeout: Duration,
    pub ring_bytes: usize,
    pub max_ring_bytes: usize,
    pub inbox_capacity: usize,
    pub hold_capacity: usize,
    pub max_message: usize,
    pub runtime_dir: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node: std::env::var("FERRY_NODE").ok().and_then(|v| v.parse().ok()).unwrap_or(0),
            processors: 1,
            spin: Duration::from_micros(20),
            park_timeout: Duration::from_millis(50),
            ring_bytes: 64 * 1024,
            max_ring_bytes: 64 * 1024 * 1024,
            inbox_capacity: 1024,
            hold_capacity: 1024,
            max_message: 64 * 1024 * 1024,
            runtime_dir: None,
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
    /// How long an idle thread polls before it sleeps (default 20 µs).
    pub fn spin(mut self, d: Duration) -> Self {
        self.cfg.spin = d;
        self
    }
    /// Pure blocking mode for machines with few cores: never spin, sleep at once.
    pub fn blocking(self) -> Self {
        self.spin(Duration::ZERO)
    }
    /// Longest sleep without looking around (default 50 ms). Bounds how late a
    /// sleeper notices anything whose wake-up was lost, a dead peer included.
    pub fn park_timeout(mut self, d: Duration) -> Self {
        self.cfg.park_timeout = d.max(Duration::from_micros(100));
        self
    }
    /// Bytes of each ring (one per direction) of a shared-memory channel this
    /// team opens; rounded up to a power of two, at least 4 KiB (default 64 KiB:
    /// a channel pair costs 132 KiB of shared memory).
    pub fn ring_bytes(mut self, n: usize) -> Self {
        self.cfg.ring_bytes = n.max(shm::MIN_RING).next_power_of_two();
        self
    }
    /// Messages an endpoint queues before the sender is pushed back (default 1024).
    pub fn inbox_capacity(mut self, n: usize) -> Self {
        self.cfg.inbox_capacity = n.max(1);
        self
    }
    /// Messages a channel sets aside when their endpoint's inbox is full
    /// (default 1024), so that traffic behind them (replies, acks, other
    /// endpoints) keeps flowing; past that the channel pushes back on the sender.
    pub fn hold_capacity(mut self, n: usize) -> Self {
        self.cfg.hold_capacity = n;
        self
    }
    /// Largest message sent or accepted (default 64 MiB).
    pub fn max_message(mut self, n: usize) -> Self {
        self.cfg.max_message = n;
        self
    }
    /// Directory of the node name plane (default `$FERRY_RUNTIME_DIR`, see `RuntimeDir::from_env`).
    pub fn runtime_dir(mut self, p: impl Into<PathBuf>) -> Self {
        self.cfg.runtime_dir = Some(p.into());
        self
    }

    pub fn start(self) -> Result<Team> {
        TeamInner::start(self.cfg)
    }
}

/// A team: this process's presence in ferry. Clones share it; when the last
/// clone is dropped (or on [`Team::shutdown`]) the team leaves: its channels
/// close, its names disappear, its files are removed. A task that holds a
/// clone keeps the team alive; `shutdown` leaves regardless, failing what
/// waits with `Shutdown` and dropping every task.
#[derive(Clone)]
pub struct Team {
    pub(crate) inner: Arc<TeamInner>,
    _owner: Arc<ShutdownOnDrop>,
}

struct ShutdownOnDrop(Arc<TeamInner>);

impl Drop for ShutdownOnDrop {
    fn drop(&mut self) {
        self.0.shutdown();
    }
}

impl Team {
    pub fn builder() -> TeamBuilder {
        TeamBuilder::default()
    }

    /// A team with the default settings.
    pub fn start() -> Result<Team> {
        Team::builder().start()
    }

    pub fn id(&self) -> TeamId {
        self.inner.id
    }

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

    /// Runs `fut` on this thread until it completes, driving the team's
    /// channels meanwhile: the blocking API for code with no runtime.
    pub fn block_on<F: Future>(&self, fut: F) -> F::Output {
        idle::block_on(&self.inner, fut)
    }

    /// A future that completes after `d`.
    pub fn sleep(&self, d: Duration) -> Sleep {
        Sleep::new(&self.inner, d)
    }

    /// The node name plane this team registers in.
    pub fn names(&self) -> &NodeNames {
        &self.inner.names
    }

    /// Looks a name up in the node name plane.
    pub fn lookup(&self, name: &str) -> Result<EndpointId> {
        self.inner.names.lookup(name)
    }

    /// Leaves now: fails what waits on this team with `Shutdown`, closes channels, removes files.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// A pending send waiting for its checkpoint (an ack, a reply or a nack).
pub(crate) struct Completion {
    /// Address of the channel the send went out on: only it may answer.
    channel: usize,
    state: Mutex<(Option<Result<Payload>>, Option<Waker>)>,
}

impl Completion {
    fn finish(&self, r: Result<Payload>) {
        let mut s = self.state.lock();
        if s.0.is_none() {
            s.0 = Some(r);
        }
        if let Some(w) = s.1.take() {
            drop(s);
            w.wake();
        }
    }

    pub fn poll_done(&self, cx: &mut Context<'_>) -> Poll<Result<Payload>> {
        let mut s = self.state.lock();
        match s.0.take() {
            Some(r) => Poll::Ready(r),
            None => {
                s.1 = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

pub(crate) struct TeamInner {
    pub id: TeamId,
    pub cfg: Config,
    pub doorbell: Arc<Doorbell>,
    pub names: NodeNames,
    lease: Mutex<Option<TeamLease>>,
    pub exec: Arc<Executor>,
    pub timers: Timers,
    inboxes: RwLock<HashMap<u32, Arc<Inbox>>>,
    next_slot: AtomicU32,
    /// Every channel the progress loop drains, the loop-back first. Read
    /// lock-free at every idle turn; replaced whole when a channel comes or goes.
    pub(crate) channels: channel_list::ChannelList,
    /// The channel used to send to each peer team.
    peers: Mutex<HashMap<u32, Arc<Channel>>>,
    connecting: Mutex<()>,
    loopback: Arc<Channel>,
    pending: Mutex<FxHashMap<u64, Arc<Completion>>>,
    next_call: AtomicU64,
    /// What to do when a peer cancels one of its calls: keyed by (channel address, call id).
    cancels: Mutex<FxHashMap<(usize, u64), OnCancel>>,
    /// Cancels that came before their call registered a hook (the call was
    /// still queued): applied when it does. Bounded: the oldest are forgotten.
    early_cancels: Mutex<std::collections::VecDeque<(usize, u64)>>,
    shut_down: AtomicBool,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    reactor: reactor::Reactor,
}

impl TeamInner {
    fn start(cfg: Config) -> Result<Team> {
        let dir = match &cfg.runtime_dir {
            Some(p) => RuntimeDir::at(p.clone())?,
            None => RuntimeDir::from_env()?,
        };
        let lease = claim_team_number(&dir)?;
        let id = TeamId { node: cfg.node, team: lease.team() };
        let doorbell = Arc::new(Doorbell::create()?);
        let reactor = reactor::Reactor::new(&dir.team_socket(id.team))?;
        let loopback = Arc::new(Channel::new(id, Box::new(inproc::loopback(cfg.ring_bytes, doorbell.clone())), None));
        let inner = Arc::new(TeamInner {
            id,
            names: NodeNames::new(dir),
            lease: Mutex::new(Some(lease)),
            exec: Executor::new(doorbell.clone()),
            doorbell,
            timers: Timers::new(),
            inboxes: RwLock::new(HashMap::new()),
            next_slot: AtomicU32::new(1),
            channels: channel_list::ChannelList::new(loopback.clone()),
            peers: Mutex::new(HashMap::new()),
            connecting: Mutex::new(()),
            loopback,
            pending: Mutex::new(FxHashMap::default()),
            next_call: AtomicU64::new(1),
            cancels: Mutex::new(FxHashMap::default()),
            early_cancels: Mutex::new(std::collections::VecDeque::new()),
            shut_down: AtomicBool::new(false),
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
        for i in 0..inner.cfg.processors {
            let t = inner.clone();
            threads.push(
                std::thread::Builder::new()
                    .name(format!("ferry-proc-{i}"))
                    .spawn(move || idle::processor_loop(t))
                    .map_err(Error::io("spawn processor thread"))?,
            );
        }
        *inner.threads.lock() = threads;
        tracing::debug!(team = %id, "team started");
        Ok(Team { _owner: Arc::new(ShutdownOnDrop(inner.clone())), inner })
    }

    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::Acquire)
    }

    fn bind_config(&self) -> shm::BindConfig {
        shm::BindConfig {
            me: self.id,
            doorbell: self.doorbell.clone(),
            ring_bytes: self.cfg.ring_bytes,
            max_ring_bytes: self.cfg.max_ring_bytes,
        }
    }

    // ---- endpoints ----

    /// Opens a new endpoint with its inbox.
    pub fn open_endpoint(&self) -> Result<(EndpointId, Arc<Inbox>)> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        let slot = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let id = self.id.endpoint(slot).ok_or(Error::Refused("endpoint slots exhausted".into()))?;
        let inbox = Arc::new(Inbox::new(self.cfg.inbox_capacity, self.doorbell.clone()));
        self.inboxes.write().insert(slot, inbox.clone());
        Ok((id, inbox))
    }

    /// Closes an endpoint: later messages are refused; queued ones are nacked.
    pub fn close_endpoint(&self, id: EndpointId) {
        let inbox = self.inboxes.write().remove(&id.slot());
        if let Some(inbox) = inbox {
            for m in inbox.close() {
                if let Some(ch) = &m.channel {
                    self.nack(ch, &m.header, NackReason::NoSuchEndpoint, "endpoint closed");
                }
            }
        }
    }

    // ---- sending ----

    fn new_call_id(&self) -> u64 {
        self.next_call.fetch_add(1, Ordering::Relaxed)
    }

    /// The channel to `team`, binding one if there is none yet.
    pub fn channel_to(&self, team: TeamId) -> Result<Arc<Channel>> {
        if self.is_shut_down() {
            return Err(Error::Shutdown);
        }
        if team == self.id {
            return Ok(self.loopback.clone());
        }
        if team.node != self.id.node {
            return Err(Error::NoSuchTeam(team));
        }
        if let Some(ch) = self.live_peer(team) {
            return Ok(ch);
        }
        let _one_at_a_time = self.connecting.lock();
        if let Some(ch) = self.live_peer(team) {
            return Ok(ch);
        }
        let path = self.names.dir().team_socket(team.team);
        let stream = std::os::unix::net::UnixStream::connect(&path).map_err(|_| Error::NoSuchTeam(team))?;
        let end = shm::connect(&stream, &self.bind_config(), team)?;
        let ch = Arc::new(Channel::new(team, Box::new(end), Some(stream)));
        self.add_channel(ch.clone());
        tracing::debug!(me = %self.id, peer = %team, "bound shared-memory channel");
        Ok(ch)
    }

    fn live_peer(&self, team: TeamId) -> Option<Arc<Channel>> {
        self.peers.lock().get(&team.team).filter(|c| !c.is_gone()).cloned()
    }

    pub(crate) fn add_channel(&self, ch: Arc<Channel>) {
        self.reactor.watch(&ch);
        self.channels.update(|v| v.iter().chain([&ch]).cloned().collect());
        // A frame may have come (and rung) before the channel was in the list.
        self.doorbell.ring_now();
        let mut peers = self.peers.lock();
        match peers.get(&ch.peer.team) {
            Some(old) if !old.is_gone() => {}
            _ => {
                peers.insert(ch.peer.team, ch);
            }
        }
    }

    /// Sends one message (split into pieces if needed). With `wait` false,
    /// a full channel fails with `WouldBlock` instead of waiting for room;
    /// with a deadline, waiting for room to start the message ends there
    /// (once a first piece is out, the rest follows regardless).
    pub fn send_message(
        &self,
        ch: &Channel,
        header: Header,
        payload: &[u8],
        wait: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        if payload.len() > self.cfg.max_message {
            return Err(Error::TooLarge { len: payload.len(), max: self.cfg.max_message });
        }
        let max = ch.transport.max_payload();
        if payload.len() <= max {
            // One frame: the send lock is taken per attempt, never held while waiting.
            return self.push_frame(ch, &header, payload, wait, deadline, true);
        }
        // Pieces of one message must be contiguous: the lock is held for all of
        // them. An Immediate send never waits behind a message being streamed.
        let _tx = if wait { ch.tx.lock() } else { ch.tx.try_lock().ok_or(Error::WouldBlock { to: header.dst })? };
        ch.streaming.store(true, Ordering::Relaxed);
        let _streaming = scopeguard(|| {
            ch.streaming.store(false, Ordering::Relaxed);
            // Senders of this team that waited behind the stream may go on.
            self.doorbell.ring_now();
        });
        let mut pieces = payload.chunks(max).peekable();
        let mut h = header;
        h.flags |= flags::MORE;
        self.push_frame(ch, &h, pieces.next().unwrap(), wait, deadline, false)?;
        let mut frag = Header::new(Kind::Fragment, header.src, header.dst, header.call_id);
        while let Some(piece) = pieces.next() {
            frag.flags = if pieces.peek().is_some() { flags::MORE } else { 0 };
            self.push_frame(ch, &frag, piece, true, None, false)?;
        }
        Ok(())
    }

    /// Writes one frame, waiting for room if `wait`. With `lock`, takes the
    /// channel's send lock for each attempt (else the caller holds it).
    fn push_frame(
        &self,
        ch: &Channel,
        h: &Header,
        payload: &[u8],
        wait: bool,
        deadline: Option<Instant>,
        lock: bool,
    ) -> Result<()> {
        let attempt = || {
            let _tx = match lock {
                // Behind a message being streamed the channel counts as full:
                // Immediate sends fail, others wait in the idle loop (with
                // their deadline), not on the lock.
                true if ch.streaming.load(Ordering::Relaxed) => return Err(SendError::Full),
                true => Some(ch.tx.lock()),
                false => None,
            };
            ch.transport.try_send(h, payload)
        };
        let outcome = |r: std::result::Result<(), SendError>| match r {
            Ok(()) => Some(Ok(())),
            Err(SendError::Closed) => Some(Err(self.gone_error(ch))),
            Err(SendError::TooLarge) => unreachable!("send_message splits frames"),
            Err(SendError::Full) if !wait => Some(Err(Error::WouldBlock { to: h.dst })),
            Err(SendError::Full) => None,
        };
        if let Some(r) = outcome(attempt()) {
            return r;
        }
        let mut idle = idle::Idle::new(self).until(deadline);
        loop {
            if self.is_shut_down() {
                return Err(Error::Shutdown);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::DeadlineExceeded);
            }
            // Asked for (and retried) only after the park ticket is taken, so
            // room made between the two is not slept through, and a writer
            // that merely spins costs the reader no wake-up calls.
            let done = std::cell::Cell::new(None);
            idle.step(
                &|| {
                    ch.transport.want_space();
                    let r = outcome(attempt());
                    let ready = r.is_some();
                    done.set(r);
                    ready
                },
                &|_| {},
            );
            if let Some(r) = done.take() {
                return r;
            }
            if let Some(r) = outcome(attempt()) {
                return r;
            }
        }
    }

    fn gone_error(&self, ch: &Channel) -> Error {
        if self.is_shut_down() {
            Error::Shutdown
        } else {
            Error::PeerGone { peer: ch.peer }
        }
    }

    /// Sends a message to `dst` over `ch` (the channel to its team, which a
    /// sender caches) and returns a future for its checkpoint.
    pub fn send_on(
        self: &Arc<Self>,
        ch: &Arc<Channel>,
        src: EndpointId,
        dst: EndpointId,
        payload: &[u8],
        checkpoint: Checkpoint,
        deadline: Option<Instant>,
    ) -> Delivery {
        let mut header = Header::new(Kind::Data, src, dst, 0).with_checkpoint(checkpoint);
        header.deadline_ns = deadline.map_or(0, deadline_to_wall_ns);
        if checkpoint == Checkpoint::Immediate {
            return match self.send_immediate(ch, header, payload) {
                Ok(()) => Delivery::done(),
                Err(e) => Delivery::failed(e),
            };
        }
        header.call_id = self.new_call_id();
        let completion = Arc::new(Completion { channel: Arc::as_ptr(ch) as usize, state: Mutex::new((None, None)) });
        self.pending.lock().insert(header.call_id, completion.clone());
        if let Err(e) = self.send_message(ch, header, payload, true, deadline) {
            self.pending.lock().remove(&header.call_id);
            return Delivery::failed(e);
        }
        self.hand_off(ch);
        // A peer that died while we sent would never answer, unless it did
        // (the answer already completed the call and took it from `pending`).
        if ch.is_gone() && ch.finished.load(Ordering::Acquire) && self.pending.lock().remove(&header.call_id).is_some()
        {
            return Delivery::failed(self.gone_error(ch));
        }
        Delivery {
            state: DeliveryState::Waiting(Waiting { team: self.clone(), channel: ch.clone(), header, completion }),
            deadline,
            timer: None,
        }
    }

    /// Replies to a received `OnReturn` message `h`, on the channel it came by.
    pub fn reply(&self, ch: &Channel, h: &Header, payload: &[u8]) -> Result<()> {
        // Nobody waits for a reply past the request's deadline.
        let deadline = TeamInner::deadline_of(h);
        self.send_message(ch, Header::new(Kind::Reply, h.dst, h.src, h.call_id), payload, true, deadline)
    }

    pub fn ack(&self, ch: &Arc<Channel>, h: &Header, checkpoint: Checkpoint) {
        let mut a = Header::new(Kind::Ack, h.dst, h.src, h.call_id).with_checkpoint(checkpoint);
        a.len = 0;
        ch.send_control(a, Vec::new());
    }

    pub fn nack(&self, ch: &Arc<Channel>, h: &Header, why: NackReason, text: &str) {
        if h.call_id == 0 {
            tracing::warn!(from = %h.src, to = %h.dst, ?why, text, "dropping a message nobody waits on");
            return;
        }
        let mut p = vec![why as u8];
        p.extend_from_slice(text.as_bytes());
        ch.send_control(Header::new(Kind::Nack, h.dst, h.src, h.call_id), p);
    }

    // ---- receiving ----

    /// Drains each of `channels` (an idle thread's snapshot of the team's
    /// list) once. Returns whether anything was received.
    pub fn progress_on(&self, channels: &[Arc<Channel>]) -> bool {
        let mut did = false;
        for ch in channels.iter() {
            if !ch.needs_attention() {
                continue;
            }
            let Some(mut rx) = ch.rx.try_lock() else { continue };
            ch.flush_backlog();
            let finished = match self.drain(ch, &mut rx) {
                Ok(n) => {
                    did |= n > 0;
                    // A gone peer's channel is finished only once everything it
                    // sent was taken. `gone` is read first: a peer that writes a
                    // last frame and then dies must not be seen as
                    // drained-before and gone-after.
                    ch.is_gone()
                        && !ch.transport.has_frame()
                        && rx.held.is_empty()
                        && rx.assembling.is_none()
                        && !ch.finished.load(Ordering::Acquire)
                }
                Err(what) => {
                    tracing::warn!(peer = %ch.peer, %what, "closing channel: peer broke the protocol");
                    ch.mark_gone();
                    true
                }
            };
            Self::run_direct(rx);
            if finished {
                self.finish_channel(ch);
            }
        }
        did
    }

    /// An `Immediate` send: buffered in the channel now, or `WouldBlock`.
    pub fn send_immediate(&self, ch: &Arc<Channel>, header: Header, payload: &[u8]) -> Result<()> {
        let sent = self.send_message(ch, header, payload, false, None);
        self.hand_off(ch);
        sent
    }

    /// Same-team send: the sender puts the message into its inbox itself
    /// (task hand-off), rather than leaving it for whichever thread polls next.
    fn hand_off(&self, ch: &Arc<Channel>) {
        if Arc::ptr_eq(ch, &self.loopback) {
            if let Some(mut rx) = ch.rx.try_lock() {
                let _ = self.drain(ch, &mut rx);
                Self::run_direct(rx);
            }
        }
    }

    /// Runs what a drain found for direct takers, once `rx` is unlocked (a
    /// taker may send, wait, or drain this channel itself).
    fn run_direct(mut rx: parking_lot::MutexGuard<'_, channel::RxState>) {
        if rx.direct.is_empty() {
            return;
        }
        thread_local! {
            /// A buffer to swap with `rx.direct`, so neither allocates per message.
            static SPARE: std::cell::Cell<Vec<(inbox::Direct, Incoming)>> = const { std::cell::Cell::new(Vec::new()) };
        }
        let mut batch = SPARE.take();
        std::mem::swap(&mut batch, &mut rx.direct);
        drop(rx);
        // A taker runs handlers: like a task, a blocking call it makes must
        // keep running the team's tasks (one of them may be what it waits for).
        let _in_task = executor::InTask::enter();
        for (taker, m) in batch.drain(..) {
            taker(m);
        }
        SPARE.set(batch);
    }

    /// Whether this thread runs the team's tasks: a processor, a thread
    /// inside a task, or any thread of a team without processors. Only such
    /// threads run direct takers (they run a service's handlers).
    fn runs_tasks_here(&self) -> bool {
        self.cfg.processors == 0 || executor::in_task() || idle::is_processor_of(self)
    }

    /// Takes frames from one channel until it is empty, a destination is
    /// full, or a budget is spent (so one busy peer cannot starve the rest).
    fn drain(&self, ch: &Arc<Channel>, rx: &mut channel::RxState) -> std::result::Result<usize, String> {
        // Held messages first, in order per endpoint, as far as their inboxes take them.
        if !rx.held.is_empty() {
            let mut refused: Vec<EndpointId> = Vec::new();
            let mut i = 0;
            while i < rx.held.len() {
                let dst = rx.held[i].0.dst;
                if refused.contains(&dst) {
                    i += 1;
                    continue;
                }
                let (h, p) = rx.held.remove(i).unwrap();
                let mut slot = Some(p);
                if !self.deliver(ch, rx, &h, || slot.take().unwrap()) {
                    rx.held.insert(i, (h, slot.take().unwrap()));
                    refused.push(dst);
                    i += 1;
                }
            }
            ch.held.store(!rx.held.is_empty(), Ordering::Relaxed);
        }
        if !ch.transport.has_frame() {
            // Nothing new: a good moment for the transport's deferred work.
            ch.transport.tidy();
            return Ok(0);
        }
        let mut taken = 0;
        let mut violation = None;
        while taken < 64 {
            rx.since = crate::cost::start();
            let got = ch.transport.try_recv(&mut |h, payload| self.route(ch, rx, h, payload, &mut violation));
            if let Some(v) = violation.take() {
                return Err(v);
            }
            match got.map_err(|e| e.to_string())? {
                Recv::Consumed if ch.transport.has_frame() => taken += 1,
                Recv::Consumed => return Ok(taken + 1),
                Recv::Empty | Recv::Kept => break,
            }
        }
        Ok(taken)
    }

    /// Handles one frame; returns false to leave it in the channel (its
    /// inbox is full and so is the channel's hold queue).
    fn route(
        &self,
        ch: &Arc<Channel>,
        rx: &mut channel::RxState,
        h: &Header,
        payload: &[u8],
        violation: &mut Option<String>,
    ) -> bool {
        let hold_full = rx.held.len() >= self.cfg.hold_capacity;
        if h.kind == Kind::Fragment {
            if rx.discarding {
                rx.discarding = h.more();
                return true;
            }
            let Some((first, buf)) = rx.assembling.as_mut() else {
                *violation = Some("a piece with no message to belong to".into());
                return false;
            };
            if buf.len() + payload.len() > self.cfg.max_message {
                // Refuse this message, skip its remaining pieces, keep the channel.
                let first = *first;
                rx.assembling = None;
                rx.discarding = h.more();
                self.nack(ch, &first, NackReason::TooLarge, &format!("larger than {} bytes", self.cfg.max_message));
                return true;
            }
            buf.extend_from_slice(payload);
            if !h.more() {
                let (mut first, whole) = rx.assembling.take().unwrap();
                first.flags &= !flags::MORE;
                first.len = whole.len() as u32;
                // Room in the hold queue was checked at the first piece, and
                // nothing else travels between the pieces of one message.
                self.dispatch(ch, rx, &first, || Payload::Heap(whole));
            }
            return true;
        }
        if rx.assembling.is_some() || rx.discarding {
            *violation = Some("a new message before the last piece of the previous one".into());
            return false;
        }
        if h.more() {
            if h.kind == Kind::Data && hold_full {
                return false;
            }
            rx.assembling = Some((*h, payload.to_vec()));
            return true;
        }
        match h.kind {
            Kind::Data if hold_full => false,
            Kind::Data => {
                self.dispatch(ch, rx, h, || Payload::from_slice(payload));
                true
            }
            Kind::Cancel => {
                self.cancel_arrived((Arc::as_ptr(ch) as usize, h.call_id));
                true
            }
            _ => {
                self.complete(ch, h, payload);
                true
            }
        }
    }

    /// Dispatches a whole message: answers go to the sends waiting for them;
    /// data goes to its inbox, or to the hold queue if that inbox is full
    /// (or messages for the same endpoint wait there already: order per
    /// endpoint is kept).
    fn dispatch(&self, ch: &Arc<Channel>, rx: &mut channel::RxState, h: &Header, payload: impl FnOnce() -> Payload) {
        if h.kind != Kind::Data {
            self.complete(ch, h, &payload());
            return;
        }
        // Behind a held message for the same endpoint, or refused: hold it.
        // (`deliver` builds the payload only when it takes the message.)
        let mut make = Some(payload);
        let behind = rx.held.iter().any(|(held, _)| held.dst == h.dst);
        if behind || !self.deliver(ch, rx, h, || (make.take().unwrap())()) {
            let payload = (make.take().expect("a refused message was not built"))();
            rx.held.push_back((*h, payload));
            ch.held.store(true, Ordering::Relaxed);
        }
    }

    /// Puts a data message into its endpoint's inbox; false if the inbox is full.
    fn deliver(
        &self,
        ch: &Arc<Channel>,
        rx: &mut channel::RxState,
        h: &Header,
        payload: impl FnOnce() -> Payload,
    ) -> bool {
        let slot = h.dst.slot();
        if rx.last_inbox.as_ref().is_none_or(|(s, _)| *s != slot) {
            let found = if h.dst.team_id() == self.id { self.inboxes.read().get(&slot).cloned() } else { None };
            let Some(i) = found else {
                self.nack(ch, h, NackReason::NoSuchEndpoint, &format!("no endpoint {}", h.dst));
                return true;
            };
            rx.last_inbox = Some((slot, i));
        }
        let inbox = &rx.last_inbox.as_ref().unwrap().1;
        // The channel goes with the message only if an answer will travel back on it.
        let answer_on = (h.checkpoint() != Checkpoint::Immediate).then(|| ch.clone());
        let arrived = crate::cost::record(crate::cost::Side::Server, crate::cost::Stage::Receive, rx.since.take());
        match inbox.offer(
            || self.runs_tasks_here(),
            || Incoming { header: *h, payload: payload(), channel: answer_on, arrived },
        ) {
            Offer::Accepted => {
                if h.checkpoint() == Checkpoint::OnReceipt {
                    self.ack(ch, h, Checkpoint::OnReceipt);
                }
                true
            }
            Offer::Direct(taker, m) => {
                if h.checkpoint() == Checkpoint::OnReceipt {
                    self.ack(ch, h, Checkpoint::OnReceipt);
                }
                rx.direct.push((taker, m));
                true
            }
            Offer::Full => false,
            Offer::Closed => {
                rx.last_inbox = None;
                self.nack(ch, h, NackReason::NoSuchEndpoint, &format!("endpoint {} closed", h.dst));
                true
            }
        }
    }

    /// An ack, reply or nack for one of our sends.
    fn complete(&self, ch: &Arc<Channel>, h: &Header, payload: &[u8]) {
        let mut pending = self.pending.lock();
        // Only the channel the send went out on may answer it.
        let Some(c) = pending.get(&h.call_id).filter(|c| c.channel == Arc::as_ptr(ch) as usize).cloned() else {
            tracing::debug!(call = h.call_id, peer = %ch.peer, "answer to no pending send; ignored");
            return;
        };
        pending.remove(&h.call_id);
        drop(pending);
        c.finish(match h.kind {
            Kind::Ack | Kind::Reply => Ok(Payload::from_slice(payload)),
            _ => Err(nack_error(h, payload)),
        });
    }

    /// A channel whose peer is gone and which holds nothing more: fail what
    /// waits on it and forget it.
    fn finish_channel(&self, ch: &Arc<Channel>) {
        if ch.finished.swap(true, Ordering::AcqRel) {
            return;
        }
        self.channels.update(|v| v.iter().filter(|c| !Arc::ptr_eq(c, ch)).cloned().collect());
        {
            let mut peers = self.peers.lock();
            if peers.get(&ch.peer.team).is_some_and(|c| Arc::ptr_eq(c, ch)) {
                peers.remove(&ch.peer.team);
            }
        }
        self.reactor.unwatch(ch);
        if let Some(s) = &ch.socket {
            // Tells the peer too (it may not know: a protocol violation is found here).
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if !self.is_shut_down() {
            tracing::debug!(me = %self.id, peer = %ch.peer, "peer gone; channel reclaimed");
            // Before the waiters learn of it: whoever sees `PeerGone` finds
            // the dead team's names and files gone (or being swept).
            sweep_dead_team(&self.names, ch.peer.team);
        }
        let err = || self.gone_error(ch);
        let failed: Vec<_> = {
            let mut pending = self.pending.lock();
            let ids: Vec<u64> =
                pending.iter().filter(|(_, c)| c.channel == Arc::as_ptr(ch) as usize).map(|(id, _)| *id).collect();
            ids.into_iter().filter_map(|id| pending.remove(&id)).collect()
        };
        for c in failed {
            c.finish(Err(err()));
        }
    }

    /// Called by the reactor when a peer's socket hangs up.
    pub(crate) fn peer_hung_up(&self, ch: &Arc<Channel>) {
        ch.mark_gone();
        // Wake every sleeper: someone must drain what is left and fail the waiters.
        self.doorbell.ring_now();
    }

    pub(crate) fn shutdown(&self) {
        if self.shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        // First fail everything that waits, so threads blocked in ferry calls
        // (processors included) return; then stop and join the threads.
        let channels = self.channels.take();
        self.peers.lock().clear();
        for ch in channels.iter() {
            ch.mark_gone();
            ch.finished.store(true, Ordering::Release);
            if let Some(s) = &ch.socket {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        let pending: Vec<_> = self.pending.lock().drain().map(|(_, c)| c).collect();
        for c in pending {
            c.finish(Err(Error::Shutdown));
        }
        let inboxes: Vec<_> = self.inboxes.write().drain().map(|(_, i)| i).collect();
        for i in inboxes {
            i.close();
        }
        self.reactor.stop();
        self.doorbell.ring_now();
        let me = std::thread::current().id();
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
        // Break the cycles that keep tasks (and through them this team) alive.
        self.timers.clear();
        self.cancels.lock().clear();
        self.early_cancels.lock().clear();
        self.exec.clear();
        self.lease.lock().take();
        tracing::debug!(team = %self.id, "team shut down");
    }

    /// A peer cancelled its call `key`: run its hook, or remember the cancel
    /// for a hook not registered yet.
    fn cancel_arrived(&self, key: (usize, u64)) {
        // `cancels` is held while `early_cancels` is looked at, here and in
        // `on_cancel`: a cancel and its hook never miss each other.
        let mut cancels = self.cancels.lock();
        match cancels.remove(&key) {
            Some(f) => {
                drop(cancels);
                f();
            }
            None => {
                let mut early = self.early_cancels.lock();
                if early.len() == 1024 {
                    early.pop_front();
                }
                early.push_back(key);
            }
        }
    }

    /// Runs `on_cancel` if the peer on `ch` cancels its call `call_id`
    /// (at once if it already did), until the returned guard is dropped.
    pub fn on_cancel(self: &Arc<Self>, ch: &Arc<Channel>, call_id: u64, on_cancel: OnCancel) -> CancelGuard {
        let key = (Arc::as_ptr(ch) as usize, call_id);
        let guard = CancelGuard { team: Arc::downgrade(self), key };
        let mut cancels = self.cancels.lock();
        let mut early = self.early_cancels.lock();
        if let Some(i) = early.iter().position(|k| *k == key) {
            early.remove(i);
            drop((early, cancels));
            on_cancel();
            return guard;
        }
        drop(early);
        cancels.insert(key, on_cancel);
        guard
    }

    /// Turns a frame's wall-clock deadline into a local instant.
    pub fn deadline_of(h: &Header) -> Option<Instant> {
        if h.deadline_ns == 0 {
            return None;
        }
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Some(Instant::now() + Duration::from_nanos(h.deadline_ns.saturating_sub(now)))
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

    pub fn register_name(&self, name: &str, ep: EndpointId) -> Result<()> {
        let lease = self.lease.lock();
        let lease = lease.as_ref().ok_or(Error::Shutdown)?;
        self.names.register(lease, name, ep)
    }

    pub fn unregister_name(&self, name: &str) {
        if let Some(lease) = self.lease.lock().as_ref() {
            let _ = self.names.unregister(lease, name);
        }
    }

    fn forget_call(&self, id: u64) {
        self.pending.lock().remove(&id);
    }
}

/// Runs `f` when dropped.
fn scopeguard(f: impl FnOnce()) -> impl Drop {
    struct Guard<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for Guard<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f();
            }
        }
    }
    Guard(Some(f))
}

/// Removes a dead peer's names and files. Its socket can hang up a moment
/// before the kernel drops its lock, so if it still looks alive, a short
/// background retry finishes the job.
fn sweep_dead_team(names: &NodeNames, team: u32) {
    if !names.team_has_files(team) {
        return; // it left cleanly
    }
    if !names.team_alive(team) {
        names.sweep_team(team);
        return;
    }
    let names = names.clone();
    let _ = std::thread::Builder::new().name("ferry-sweep".into()).spawn(move || {
        for _ in 0..300 {
            std::thread::sleep(Duration::from_millis(10));
            if !names.team_alive(team) {
                names.sweep_team(team);
                return;
            }
        }
    });
}

fn nack_error(h: &Header, payload: &[u8]) -> Error {
    let text = String::from_utf8_lossy(payload.get(1..).unwrap_or_default()).into_owned();
    match payload.first().map(|b| NackReason::from_u8(*b)) {
        Some(NackReason::NoSuchEndpoint) => Error::NoSuchEndpoint(h.src),
        Some(NackReason::TooLarge) => Error::Refused(format!("too large: {text}")),
        Some(NackReason::NoReply) => Error::Refused(format!("no reply: {text}")),
        _ => Error::Refused(text),
    }
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
    for t in first..crate::id::MAX_TEAM {
        if let Ok(l) = TeamLease::acquire(dir, t) {
            return Ok(l);
        }
    }
    Err(Error::Refused("no free team number on this node".into()))
}

pub(crate) fn deadline_to_wall_ns(d: Instant) -> u64 {
    let left = d.saturating_duration_since(Instant::now());
    (SystemTime::now() + left).duration_since(SystemTime::UNIX_EPOCH).map_or(1, |t| t.as_nanos() as u64).max(1)
}

/// A send on its way to its checkpoint. Resolves to the reply for
/// `OnReturn`, to an empty vector for the other checkpoints. Dropping it
/// stops waiting (the message itself is already sent); for `OnReturn` it
/// also tells the receiver the call is cancelled.
pub struct Delivery {
    state: DeliveryState,
    deadline: Option<Instant>,
    timer: Option<u64>,
}

enum DeliveryState {
    Ready(Result<Payload>),
    Waiting(Waiting),
    Done,
}

struct Waiting {
    team: Arc<TeamInner>,
    channel: Arc<Channel>,
    header: Header,
    completion: Arc<Completion>,
}

impl Delivery {
    fn done() -> Delivery {
        Delivery { state: DeliveryState::Ready(Ok(Payload::from_slice(&[]))), deadline: None, timer: None }
    }
    pub(crate) fn failed(e: Error) -> Delivery {
        Delivery { state: DeliveryState::Ready(Err(e)), deadline: None, timer: None }
    }

    /// The outcome, if known already (an `Immediate` send, or a failure).
    pub fn take_ready(&mut self) -> Option<Result<Vec<u8>>> {
        match std::mem::replace(&mut self.state, DeliveryState::Done) {
            DeliveryState::Ready(r) => Some(r.map(Payload::into_vec)),
            other => {
                self.state = other;
                None
            }
        }
    }
}

impl Future for Delivery {
    type Output = Result<Vec<u8>>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<Vec<u8>>> {
        self.get_mut().poll_payload(cx).map(|r| r.map(Payload::into_vec))
    }
}

impl Delivery {
    /// `poll` without turning a small reply into a `Vec` (RPC decodes it in place).
    pub(crate) fn poll_payload(&mut self, cx: &mut Context<'_>) -> Poll<Result<Payload>> {
        let w = match std::mem::replace(&mut self.state, DeliveryState::Done) {
            DeliveryState::Ready(r) => return Poll::Ready(r),
            DeliveryState::Done => return Poll::Ready(Err(Error::Cancelled)),
            DeliveryState::Waiting(w) => w,
        };
        if let Poll::Ready(r) = w.completion.poll_done(cx) {
            if let Some(t) = self.timer.take() {
                w.team.timers.cancel(t);
            }
            return Poll::Ready(r);
        }
        if let Some(at) = self.deadline {
            if Instant::now() >= at {
                w.team.forget_call(w.header.call_id);
                w.cancel_remote();
                return Poll::Ready(Err(Error::DeadlineExceeded));
            }
            self.timer = Some(w.team.register_timer(self.timer, at, cx.waker()));
        }
        self.state = DeliveryState::Waiting(w);
        Poll::Pending
    }
}

impl Waiting {
    fn cancel_remote(&self) {
        if self.header.checkpoint() == Checkpoint::OnReturn {
            let h = Header::new(Kind::Cancel, self.header.src, self.header.dst, self.header.call_id);
            self.channel.send_control(h, Vec::new());
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if let DeliveryState::Waiting(w) = &self.state {
            w.team.forget_call(w.header.call_id);
            w.cancel_remote();
            if let Some(t) = self.timer {
                w.team.timers.cancel(t);
            }
        }
    }
}

/// Keeps a cancellation hook registered (see `TeamInner::on_cancel`).
pub(crate) struct CancelGuard {
    team: std::sync::Weak<TeamInner>,
    key: (usize, u64),
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(t) = self.team.upgrade() {
            t.cancels.lock().remove(&self.key);
        }
    }
}

/// A future that completes at a point in time (see [`Team::sleep`]).
pub struct Sleep {
    team: Arc<TeamInner>,
    at: Instant,
    id: Option<u64>,
}

impl Sleep {
    pub(crate) fn new(team: &Arc<TeamInner>, d: Duration) -> Sleep {
        Sleep::until(team, Instant::now() + d)
    }
    pub(crate) fn until(team: &Arc<TeamInner>, at: Instant) -> Sleep {
        Sleep { team: team.clone(), at, id: None }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.at {
            return Poll::Ready(());
        }
        let (at, id) = (self.at, self.id);
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
