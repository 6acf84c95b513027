//! ferry's RPC cases (`ferry bench rpc`): a generated client calling a
//! generated server in the other process (or the same one for `inproc`).
//!
//! - `ferry.shm.{null,arg4,arg256,arg512,arg1024}`: spinning client and server
//!   (implicit receipt: a task per call); `ferry.shm.null` times each call
//!   on its own ([`Params::measure_each`], `--iters` calls per pass): its
//!   figures are per-call p50 and p99;
//! - `ferry.shm.null.unpinned`: the blocking API from a plain thread, both
//!   teams with default settings, both processes free to move between
//!   CPUs; timed per call as `ferry.shm.null`, which it is compared to;
//! - `ferry.shm.parked.{null,arg1024}`: both sides in blocking mode;
//! - `ferry.inproc.{null,arg1024}`: client thread and server processor of one team;
//! - `ferry.shm.{implicit,explicit}.{null,bigop}`: LYNX nullop/bigop (1000
//!   bytes each way), a task per call vs a thread that accepts and replies;
//! - `ferry.shm.tasks{1,2,4,8,16}`: T calling tasks on one client processor,
//!   one server processor (URPC Figures 3 and 4): the figure is time per
//!   call, the inverse of throughput.

use crate::harness::{pin_current_thread, Case, ChildCtx, Params, Peer};
use crate::rpc_peers::{answer, argument};
use crate::run_dir::{run_dir, RemoveDir};
use ferry::rpc::ServiceEndpoint;
use ferry::Team;
use serde_bytes::ByteBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[ferry::service]
pub trait Bench {
    async fn null(&self);
    async fn arg(&self, data: ByteBuf) -> u64;
    async fn echo(&self, data: ByteBuf) -> ByteBuf;
    /// Switches cost accounting in the server's process; returns what it recorded so far.
    async fn cost(&self, on: bool) -> ferry::cost::Breakdown;
    async fn stop(&self);
}

pub(crate) struct BenchImpl {
    stopped: Arc<AtomicBool>,
}

impl BenchImpl {
    /// A server that sets `stopped` when told to stop.
    pub(crate) fn new(stopped: Arc<AtomicBool>) -> BenchImpl {
        BenchImpl { stopped }
    }
}

impl Bench for BenchImpl {
    async fn null(&self) {}
    async fn arg(&self, data: ByteBuf) -> u64 {
        answer(&data)
    }
    async fn echo(&self, data: ByteBuf) -> ByteBuf {
        data
    }
    async fn cost(&self, on: bool) -> ferry::cost::Breakdown {
        let b = ferry::cost::snapshot();
        ferry::cost::reset();
        ferry::cost::set_enabled(on);
        b
    }
    async fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
    }
}

const NAME: &str = "bench.rpc";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Spin,
    Parked,
    /// The team's default settings, as a new user starts it.
    Default,
}

fn team(run_id: &str, mode: Mode, processors: usize) -> Team {
    let b = Team::builder().runtime_dir(run_dir(run_id)).processors(processors);
    let b = match mode {
        Mode::Spin => b.spin(Duration::from_secs(5)),
        Mode::Parked => b.blocking().park_timeout(Duration::from_secs(5)),
        Mode::Default => b,
    };
    b.start().expect("start team")
}

fn bind(team: &Team) -> BenchClient {
    BenchClient::bind_wait(team, NAME, Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("cannot bind the bench service: {e}"))
}

/// The child: serves `Bench` until told to stop, a task per call, or
/// (`explicit`) by accepting on its main thread.
fn serve(ctx: &ChildCtx, mode: Mode, explicit: bool) {
    let team = team(&ctx.run_id, mode, if explicit { 0 } else { 1 });
    let stopped = Arc::new(AtomicBool::new(false));
    if explicit {
        let endpoint = ServiceEndpoint::open(&team, NAME, BenchClient::descriptor()).unwrap();
        while !stopped.load(Ordering::SeqCst) {
            let call = endpoint.accept_blocking().unwrap();
            match BenchRequest::from_call(call).unwrap() {
                BenchRequest::Null { reply } => reply.ok(&()).unwrap(),
                BenchRequest::Arg { data, reply } => reply.ok(&answer(&data)).unwrap(),
                BenchRequest::Echo { data, reply } => reply.ok(&data).unwrap(),
                BenchRequest::Cost { reply, .. } => reply.ok(&ferry::cost::snapshot()).unwrap(),
                BenchRequest::Stop { reply } => {
                    stopped.store(true, Ordering::SeqCst);
                    reply.ok(&()).unwrap()
                }
            }
        }
    } else {
        let _serving = BenchServer::serve(&team, NAME, BenchImpl { stopped: stopped.clone() }).unwrap();
        while !stopped.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    team.shutdown();
}

/// The parent: `iters` calls per round of `call`.
fn client(peer: &Peer, p: &Params, mode: Mode, iters: usize, call: impl Fn(&BenchClient)) -> Vec<f64> {
    with_client(peer, mode, |c| {
        p.measure(iters, |n| {
            for _ in 0..n {
                call(c);
            }
        })
    })
}

/// The parent of a null call timed call by call: `--iters` calls per pass.
fn null_each(peer: &mut Peer, p: &Params, mode: Mode) -> Vec<f64> {
    with_client(peer, mode, |c| p.measure_each(p.iters, || null_call(c)))
}

/// Starts the client team (no processor: calls come from this thread),
/// binds, runs `measure`, stops the server.
fn with_client(peer: &Peer, mode: Mode, measure: impl FnOnce(&BenchClient) -> Vec<f64>) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id, mode, 0);
    let c = bind(&team);
    let samples = measure(&c);
    c.stop_blocking().unwrap();
    drop(c);
    team.shutdown();
    samples
}

fn arg_call(n: usize) -> impl Fn(&BenchClient) {
    let data = ByteBuf::from(argument(n));
    let want = answer(&data);
    move |c: &BenchClient| assert_eq!(c.arg_blocking(data.clone()).unwrap(), want)
}

macro_rules! shm_case {
    ($name:literal, $mode:expr, $explicit:expr, $div:expr, $call:expr) => {{
        fn parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
            client(peer, p, $mode, p.iters_div($div), $call)
        }
        fn child(ctx: &ChildCtx) {
            serve(ctx, $mode, $explicit)
        }
        Case::new($name, parent, child)
    }};
}

macro_rules! inproc_case {
    ($name:literal, $call:expr) => {{
        fn parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
            inproc(peer, p, $call)
        }
        Case::new($name, parent, no_child)
    }};
}

fn null_call(c: &BenchClient) {
    c.null_blocking().unwrap()
}

fn bigop(c: &BenchClient) {
    let data = ByteBuf::from(vec![5u8; 1000]);
    assert_eq!(c.echo_blocking(data).unwrap().len(), 1000);
}

fn null_spin_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    null_each(peer, p, Mode::Spin)
}

fn null_spin_child(ctx: &ChildCtx) {
    serve(ctx, Mode::Spin, false)
}

fn null_default_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    null_each(peer, p, Mode::Default)
}

fn null_default_child(ctx: &ChildCtx) {
    serve(ctx, Mode::Default, false)
}

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("ferry.shm.null", null_spin_parent, null_spin_child),
        Case::unpinned("ferry.shm.null.unpinned", null_default_parent, null_default_child),
        shm_case!("ferry.shm.arg4", Mode::Spin, false, 4, arg_call(4)),
        shm_case!("ferry.shm.arg256", Mode::Spin, false, 4, arg_call(256)),
        shm_case!("ferry.shm.arg512", Mode::Spin, false, 4, arg_call(512)),
        shm_case!("ferry.shm.arg1024", Mode::Spin, false, 4, arg_call(1024)),
        shm_case!("ferry.shm.parked.null", Mode::Parked, false, 40, null_call),
        shm_case!("ferry.shm.parked.arg4", Mode::Parked, false, 40, arg_call(4)),
        shm_case!("ferry.shm.parked.arg256", Mode::Parked, false, 40, arg_call(256)),
        shm_case!("ferry.shm.parked.arg512", Mode::Parked, false, 40, arg_call(512)),
        shm_case!("ferry.shm.parked.arg1024", Mode::Parked, false, 40, arg_call(1024)),
        inproc_case!("ferry.inproc.null", null_call),
        inproc_case!("ferry.inproc.arg4", arg_call(4)),
        inproc_case!("ferry.inproc.arg256", arg_call(256)),
        inproc_case!("ferry.inproc.arg512", arg_call(512)),
        inproc_case!("ferry.inproc.arg1024", arg_call(1024)),
        shm_case!("ferry.shm.implicit.null", Mode::Spin, false, 4, null_call),
        shm_case!("ferry.shm.implicit.bigop", Mode::Spin, false, 4, bigop),
        shm_case!("ferry.shm.explicit.null", Mode::Spin, true, 4, null_call),
        shm_case!("ferry.shm.explicit.bigop", Mode::Spin, true, 4, bigop),
        Case::new("ferry.shm.tasks1", tasks::<1>, tasks_child),
        Case::new("ferry.shm.tasks2", tasks::<2>, tasks_child),
        Case::new("ferry.shm.tasks4", tasks::<4>, tasks_child),
        Case::new("ferry.shm.tasks8", tasks::<8>, tasks_child),
        Case::new("ferry.shm.tasks16", tasks::<16>, tasks_child),
    ]
}

fn no_child(_: &ChildCtx) {}

/// Server team made on a thread pinned to the other CPU, so its processor runs there.
fn inproc(peer: &mut Peer, p: &Params, call: impl Fn(&BenchClient)) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let run_id = peer.run_id.clone();
    let cpu = peer.child_cpu;
    let server = std::thread::spawn(move || {
        if let Some(cpu) = cpu {
            pin_current_thread(cpu);
        }
        team(&run_id, Mode::Spin, 1)
    })
    .join()
    .unwrap();
    let stopped = Arc::new(AtomicBool::new(false));
    let _serving = BenchServer::serve(&server, NAME, BenchImpl { stopped }).unwrap();
    let c = bind(&server);
    let samples = p.measure(p.iters_div(4), |n| {
        for _ in 0..n {
            call(&c);
        }
    });
    drop(c);
    drop(_serving);
    server.shutdown();
    samples
}

fn tasks_child(ctx: &ChildCtx) {
    serve(ctx, Mode::Spin, false)
}

/// T tasks on one client processor, each making calls back to back; the
/// sample is wall time per call (1 / throughput).
fn tasks<const T: usize>(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id, Mode::Spin, 1);
    let c = bind(&team);
    let per_round = p.iters_div(4).max(T);
    let samples = p.measure(per_round, |n| {
        let (done, wait) = std::sync::mpsc::channel();
        for _ in 0..T {
            let (c, done) = (c.clone(), done.clone());
            let calls = n / T;
            team.spawn(async move {
                for _ in 0..calls {
                    c.null().await.unwrap();
                }
                done.send(()).unwrap();
            });
        }
        for _ in 0..T {
            wait.recv().unwrap();
        }
    });
    c.stop_blocking().unwrap();
    drop(c);
    team.shutdown();
    samples
}

/// `ferry bench rpc --breakdown`: null calls with cost accounting on in
/// both processes; the table of where a call's time goes.
pub fn breakdown(calls: usize) -> ferry::Result<ferry::cost::Breakdown> {
    let run_id = format!("breakdown-{}", std::process::id());
    let _dir = RemoveDir(run_dir(&run_id));
    let mut child = std::process::Command::new(std::env::current_exe().map_err(ferry::Error::io("own path"))?)
        .env(BREAKDOWN_CHILD, &run_id)
        .spawn()
        .map_err(ferry::Error::io("start the server process"))?;
    let team = team(&run_id, Mode::Spin, 0);
    let c = bind(&team);
    c.cost_blocking(true).map_err(|e| crate::failed("RPC breakdown", e))?;
    ferry::cost::reset();
    ferry::cost::set_enabled(true);
    for _ in 0..calls {
        c.null_blocking().map_err(|e| crate::failed("RPC breakdown", e))?;
    }
    ferry::cost::set_enabled(false);
    let client = ferry::cost::snapshot();
    let server = c.cost_blocking(false).map_err(|e| crate::failed("RPC breakdown", e))?;
    let _ = c.stop_blocking();
    let _ = child.wait();
    team.shutdown();
    // The client side of the client, the server side of the server.
    let client_rows = client.rows.into_iter().filter(|r| r.0 == ferry::cost::Side::Client).collect();
    let server_only =
        ferry::cost::Breakdown { rows: server.rows.into_iter().filter(|r| r.0 == ferry::cost::Side::Server).collect() };
    Ok(ferry::cost::Breakdown { rows: client_rows }.merge(&server_only))
}

const BREAKDOWN_CHILD: &str = "FERRY_BENCH_BREAKDOWN_SERVER";

/// In the re-executed breakdown server: serve until stopped, then exit.
pub(crate) fn breakdown_child_if_requested() {
    let Ok(run_id) = std::env::var(BREAKDOWN_CHILD) else { return };
    let team = team(&run_id, Mode::Spin, 1);
    let stopped = Arc::new(AtomicBool::new(false));
    let serving = BenchServer::serve(&team, NAME, BenchImpl { stopped: stopped.clone() }).unwrap();
    while !stopped.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(serving);
    team.shutdown();
    std::process::exit(0);
}
