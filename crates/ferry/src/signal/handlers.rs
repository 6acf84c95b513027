//! The owner's handlers, the handler of signal frames, and the signaller.

use super::{status, Mode, KINDS, MAX_PENDING, MAX_PENDING_BYTES, SIGNAL, SIGNAL_DONE};
use crate::error::{Error, Refusal, Result};
use crate::extend::{FrameHandler, PerTeam, ServedFrame};
use crate::id::EndpointId;
use crate::port::{RawSender, Responder};
use crate::runtime::Delivery;
use crate::wire::Checkpoint;
use crate::Team;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

type Run = Arc<dyn Fn(Vec<u8>) + Send + Sync>;

/// A registered handler.
struct Handler {
    mode: Mode,
    run: Run,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// A `Coalesce` handler's task is running.
    running: bool,
    /// A `Latch` handler ran and was not re-armed.
    latched: bool,
    /// A `Coalesce` handler's waiting arguments (and who waits for their run).
    pending: VecDeque<(Vec<u8>, Option<Responder>)>,
    /// An `EveryTime` handler's runs under way.
    runs: usize,
    /// Bytes of the arguments waiting (`Coalesce`) or being run (`EveryTime`).
    held_bytes: usize,
}

impl State {
    /// Whether an argument of `len` bytes must be refused (`WouldBlock`):
    /// a handler holds at most [`MAX_PENDING`] arguments waiting or being
    /// run, and [`MAX_PENDING_BYTES`] of them (one more if none is held).
    fn full(&self, mode: Mode, len: usize) -> bool {
        let held = match mode {
            Mode::Coalesce if self.running => self.pending.len(),
            Mode::EveryTime => self.runs,
            _ => return false,
        };
        held >= MAX_PENDING || (held > 0 && self.held_bytes + len > MAX_PENDING_BYTES)
    }
}

/// A team's signal handlers, and the handler of their frames.
struct Handlers {
    table: Mutex<HashMap<u32, Arc<Handler>>>,
}

static TEAMS: PerTeam<Handlers> = PerTeam::new(KINDS);

impl Handlers {
    fn of(team: &Team) -> Result<Arc<Handlers>> {
        TEAMS.of(team, |_| Handlers { table: Mutex::default() })
    }
}

/// Runs `run(args)` then answers `done` (if any) that it ran; a panic
/// drops `done` unanswered (its signaller is told `Refused`).
fn run_once(run: &Run, args: Vec<u8>, done: Option<Responder>) {
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(args)));
    if let (Ok(()), Some(done)) = (ran, done) {
        let _ = done.reply(&[status::OK]);
    }
}

impl FrameHandler for Handlers {
    fn serve(&self, mut frame: ServedFrame<'_>) {
        let kind = frame.kind();
        if kind != SIGNAL && kind != SIGNAL_DONE {
            return frame.refuse("a signal request this team does not serve");
        }
        let Some(h) = self.table.lock().get(&frame.slot()).cloned() else {
            let _ = frame.reply(&[status::NO_HANDLER]);
            return;
        };
        let mut state = h.state.lock();
        let refused = match h.mode {
            Mode::Latch if state.latched => Some(status::LATCHED),
            mode if state.full(mode, frame.payload_len()) => Some(status::FULL),
            _ => None,
        };
        if let Some(why) = refused {
            drop(state);
            let _ = frame.reply(&[why]);
            return;
        }
        // Accepted. A SIGNAL is answered now; a SIGNAL_DONE once it ran.
        let args = frame.with_payload(<[u8]>::to_vec);
        let waiter = if kind == SIGNAL_DONE { frame.defer() } else { None };
        state.latched = h.mode == Mode::Latch;
        if h.mode == Mode::Coalesce && std::mem::replace(&mut state.running, true) {
            // The running task takes it, in order.
            state.held_bytes += args.len();
            state.pending.push_back((args, waiter));
        } else {
            if h.mode == Mode::EveryTime {
                state.runs += 1;
                state.held_bytes += args.len();
            }
            let h = h.clone();
            drop(frame.spawn(run_task(h, args, waiter)));
        }
        drop(state);
        if kind == SIGNAL {
            let _ = frame.reply(&[status::OK]);
        }
    }
}

/// A handler's task: runs it, and a `Coalesce` handler's task then runs
/// it for every argument that came meanwhile.
async fn run_task(h: Arc<Handler>, args: Vec<u8>, waiter: Option<Responder>) {
    let len = args.len();
    run_once(&h.run, args, waiter);
    if h.mode == Mode::EveryTime {
        let mut state = h.state.lock();
        state.runs -= 1;
        state.held_bytes -= len;
    }
    if h.mode != Mode::Coalesce {
        return;
    }
    // A `Coalesce` task drains what came meanwhile; idle once none is left.
    loop {
        let next = {
            let mut state = h.state.lock();
            match state.pending.pop_front() {
                Some(next) => {
                    state.held_bytes -= next.0.len();
                    next
                }
                None => {
                    state.running = false;
                    return;
                }
            }
        };
        run_once(&h.run, next.0, next.1);
    }
}

/// A signal handler this team registered (see [`crate::signal`]).
/// Dropping it unregisters it: signals to it are then refused
/// (`NoSuchEndpoint`); runs under way finish.
pub struct Signal {
    team: Team,
    name: String,
    id: EndpointId,
    handler: Arc<Handler>,
    handlers: Arc<Handlers>,
}

impl Team {
    /// Registers `handler` under `name` with `mode`: signals to it run it
    /// as a task of this team, with the signal's arguments.
    pub fn on_signal(
        &self,
        name: &str,
        mode: Mode,
        handler: impl Fn(Vec<u8>) + Send + Sync + 'static,
    ) -> Result<Signal> {
        let handlers = Handlers::of(self)?;
        let id = self.reserve_endpoint()?;
        self.bind_name(name, id)?;
        let handler = Arc::new(Handler { mode, run: Arc::new(handler), state: Mutex::default() });
        handlers.table.lock().insert(id.slot(), handler.clone());
        Ok(Signal { team: self.clone(), name: name.to_string(), id, handler, handlers })
    }

    /// A signaller of the handler named `name`.
    pub fn signaller(&self, name: &str) -> Result<Signaller> {
        Ok(self.signaller_at(self.lookup(name)?))
    }

    /// A signaller of the handler `to`.
    pub fn signaller_at(&self, to: EndpointId) -> Signaller {
        // Served kinds are in range: `frame_sender` cannot refuse them.
        let sender = |kind| self.frame_sender(to, kind).expect("a signal kind is a served kind");
        Signaller { accept: sender(SIGNAL), done: sender(SIGNAL_DONE), to }
    }

    /// Signals the handler named `name` with `args` (see [`Signaller::signal`]).
    pub fn signal(&self, name: &str, args: &[u8]) -> Result<()> {
        self.signaller(name)?.signal(args)
    }
}

impl Signal {
    /// Its endpoint id.
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Re-arms a `Latch` handler: the next signal runs it again.
    pub fn rearm(&self) {
        self.handler.state.lock().latched = false;
    }

    /// Whether a `Latch` handler ran and waits to be re-armed.
    pub fn is_latched(&self) -> bool {
        self.handler.state.lock().latched
    }
}

impl Drop for Signal {
    fn drop(&mut self) {
        self.team.unbind_name(&self.name);
        self.handlers.table.lock().remove(&self.id.slot());
    }
}

/// Sends signals to one handler.
#[derive(Clone)]
pub struct Signaller {
    accept: RawSender,
    done: RawSender,
    to: EndpointId,
}

impl Signaller {
    /// The handler's id.
    pub fn to(&self) -> EndpointId {
        self.to
    }

    /// The same signaller, waiting at most `limit` for each answer.
    pub fn with_timeout(self, limit: std::time::Duration) -> Signaller {
        Signaller { accept: self.accept.with_timeout(limit), done: self.done.with_timeout(limit), to: self.to }
    }

    /// Signals the handler with `args`; returns once its team accepted the
    /// signal (its runtime answers, none of its tasks: one round trip), and
    /// the handler runs then, asynchronously. `Latched` if it is a latched
    /// `Latch` handler, `WouldBlock` if a `Coalesce` handler has
    /// [`MAX_PENDING`] arguments waiting, `NoSuchEndpoint` if there is no
    /// such handler.
    pub fn signal(&self, args: &[u8]) -> Result<()> {
        status_of(&self.accept.call(args).map_err(Error::gone_if_missing)?, self.to)
    }

    /// [`Signaller::signal`], as a future: it resolves once the handler's
    /// team accepted the signal.
    pub fn signal_async(&self, args: &[u8]) -> SignalAnswer {
        SignalAnswer { delivery: self.accept.send_async(args, Checkpoint::OnReturn), to: self.to }
    }

    /// Signals the handler with `args`; the future resolves once the
    /// handler has run with them (an error as for [`Signaller::signal`], or
    /// `Refused` if the handler panicked).
    pub fn signal_done(&self, args: &[u8]) -> SignalAnswer {
        SignalAnswer { delivery: self.done.send_async(args, Checkpoint::OnReturn), to: self.to }
    }
}

/// What an answer's status byte says.
pub(crate) fn status_of(answer: &[u8], to: EndpointId) -> Result<()> {
    match answer {
        [status::OK] => Ok(()),
        [status::NO_HANDLER] => Err(Error::NoSuchEndpoint(to)),
        [status::LATCHED] => Err(Error::Latched { handler: to }),
        [status::FULL] => Err(Error::WouldBlock { to }),
        _ => Err(Error::Refused(Refusal::Peer(format!("a signal's answer of no known form ({} bytes)", answer.len())))),
    }
}

/// The answer to a signal, as a future: that its team accepted it
/// ([`Signaller::signal_async`]) or that its handler ran
/// ([`Signaller::signal_done`]).
pub struct SignalAnswer {
    delivery: Delivery,
    to: EndpointId,
}

impl Future for SignalAnswer {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        Pin::new(&mut this.delivery).poll(cx).map(|answer| status_of(&answer.map_err(Error::gone_if_missing)?, this.to))
    }
}
