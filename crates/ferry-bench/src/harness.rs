//! Running a case: start the child process, hand both sides their shared
//! resources, collect the parent's samples, and make sure the child is gone.

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rustix::io::{fcntl_setfd, FdFlags};
use rustix::process::{waitid, Pid, WaitId, WaitIdOptions};
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};

use crate::fdpass;
use crate::report::Report;
use crate::shm::{ShmRegion, SHM_BYTES};

/// Environment variables by which the parent tells the re-executed binary
/// that it is the child of a case, and what it inherited.
pub(crate) mod env {
    /// The case name; its presence makes the binary a child.
    pub const CHILD: &str = "FERRY_BENCH_CHILD";
    pub const SHM_FD: &str = "FERRY_BENCH_SHM_FD";
    pub const SOCK_FD: &str = "FERRY_BENCH_SOCK_FD";
    pub const RUN_ID: &str = "FERRY_BENCH_RUN_ID";
    pub const PARAMS: &str = "FERRY_BENCH_PARAMS";
    pub const CPU: &str = "FERRY_BENCH_CPU";
    pub const PARENT_PID: &str = "FERRY_BENCH_PARENT_PID";
}

/// The byte the child writes on the socket once it is set up (pinned, region
/// mapped), just before it enters the case's child function.
pub(crate) const READY: u8 = b'R';

/// How long a child may take to start, and a spin wait to finish.
const START_TIMEOUT: Duration = Duration::from_secs(10);
const SPIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the child may take to exit after the parent side returned.
const EXIT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a suite is run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// Times the whole suite runs, case after case: a ratio is taken within
    /// each pass (its cases ran minutes apart at most) and the median over
    /// passes reported, so slow drifts of a shared machine cancel out.
    pub passes: usize,
    /// Timed rounds per case and pass; each gives one sample (cases timed
    /// call by call, with [`Params::measure_each`], have no rounds).
    pub rounds: usize,
    /// Round trips per round (for spin cases; slow cases scale it down with
    /// [`Params::iters_div`]); also what scales the calls per pass of cases
    /// timed call by call.
    pub iters: usize,
    /// Untimed rounds run before the timed ones.
    pub warmup: usize,
}

impl Default for Params {
    fn default() -> Self {
        Self { passes: 3, rounds: 11, iters: 20_000, warmup: 2 }
    }
}

impl Params {
    /// `iters / div`, at least 1: for cases whose round trip is slow.
    pub fn iters_div(&self, div: usize) -> usize {
        (self.iters / div.max(1)).max(1)
    }

    /// Runs `warmup` untimed rounds, then `rounds` timed rounds; each round
    /// calls `round(iters)`, which must make `iters` round trips. Returns
    /// one sample per timed round: ns per round trip.
    pub fn measure(&self, iters: usize, mut round: impl FnMut(usize)) -> Vec<f64> {
        for _ in 0..self.warmup {
            round(iters);
        }
        (0..self.rounds)
            .map(|_| {
                let start = Instant::now();
                round(iters);
                start.elapsed().as_nanos() as f64 / iters as f64
            })
            .collect()
    }

    /// Runs `warmup` untimed tenths of `calls`, then `calls` calls of
    /// `call`, each timed on its own. Returns one sample per call: ns of
    /// that round trip (its median is the per-call p50, and so on). One
    /// clock read per call: each call's end is the next one's start.
    pub fn measure_each(&self, calls: usize, mut call: impl FnMut()) -> Vec<f64> {
        for _ in 0..self.warmup * calls.div_ceil(10) {
            call();
        }
        let mut samples = Vec::with_capacity(calls);
        let mut last = Instant::now();
        for _ in 0..calls {
            call();
            let now = Instant::now();
            samples.push((now - last).as_nanos() as f64);
            last = now;
        }
        samples
    }

    fn to_env(&self) -> String {
        format!("{},{},{}", self.rounds, self.iters, self.warmup)
    }

    pub(crate) fn from_env(s: &str) -> Option<Self> {
        let mut it = s.split(',').map(|x| x.parse::<usize>().ok());
        let p = Self { passes: 1, rounds: it.next()??, iters: it.next()??, warmup: it.next()?? };
        Some(p)
    }
}

/// A benchmark case: a named pair of functions. The parent side runs in the
/// calling process and returns its samples (ns per round trip: one per
/// round from [`Params::measure`], or one per call from
/// [`Params::measure_each`]); the child side runs in a fresh process and
/// should return when the parent tells it to stop (its own protocol).
/// Either side fails the case by panicking.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Dotted `system.transport.variant`; its meaning never changes.
    pub name: &'static str,
    pub parent: fn(&mut Peer, &Params) -> Vec<f64>,
    pub child: fn(&ChildCtx),
    /// Whether the parent and the child are each pinned to a CPU (see
    /// [`run_suite`]); if not, both may run on any CPU the suite may use.
    pub pinned: bool,
}

impl Case {
    /// A case whose two processes are pinned to two CPUs.
    pub const fn new(name: &'static str, parent: fn(&mut Peer, &Params) -> Vec<f64>, child: fn(&ChildCtx)) -> Case {
        Case { name, parent, child, pinned: true }
    }

    /// A case whose two processes the scheduler places and moves freely.
    pub const fn unpinned(
        name: &'static str,
        parent: fn(&mut Peer, &Params) -> Vec<f64>,
        child: fn(&ChildCtx),
    ) -> Case {
        Case { name, parent, child, pinned: false }
    }
}

/// What the child side of a case gets.
pub struct ChildCtx {
    /// The same region the parent sees in [`Peer::shm`] (starts zeroed).
    pub shm: ShmRegion,
    /// The other end of [`Peer::sock`].
    pub sock: UnixStream,
    /// Unique per case run (parent pid and a sequence number): use it in
    /// any name the case creates outside the process.
    pub run_id: String,
    pub params: Params,
}

impl ChildCtx {
    /// Receives a descriptor the parent sent with [`Peer::send_fd`].
    pub fn recv_fd(&self) -> io::Result<OwnedFd> {
        fdpass::recv_fd(&self.sock)
    }
}

/// The parent side's view of a running child.
pub struct Peer {
    /// Zeroed shared memory, mapped in both processes.
    pub shm: ShmRegion,
    /// A connected Unix stream socket; the child holds the other end.
    pub sock: UnixStream,
    /// See [`ChildCtx::run_id`].
    pub run_id: String,
    /// The CPU the child is pinned to, if pinning worked: a case that runs
    /// its second side as a thread of this process pins it there.
    pub child_cpu: Option<usize>,
    child: ChildGuard,
}

/// Pins the calling thread to `cpu` (best effort).
pub fn pin_current_thread(cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu);
    let _ = sched_setaffinity(None, &set);
}

impl Peer {
    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    /// Sends a descriptor to the child (see [`ChildCtx::recv_fd`]), e.g. a
    /// memfd the case created after the child started.
    pub fn send_fd(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        fdpass::send_fd(&self.sock, fd)
    }

    /// Whether the child has exited (without reaping it).
    pub fn child_exited(&self) -> bool {
        self.child_exit().is_some()
    }

    /// How the child ended ("exit status 3", "signal 9"), if it has
    /// (without reaping it).
    pub fn child_exit(&self) -> Option<String> {
        let pid = Pid::from_raw(self.pid() as i32).expect("child pid");
        let opts = WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT;
        let status = waitid(WaitId::Pid(pid), opts).ok()??;
        Some(match (status.exit_status(), status.terminating_signal()) {
            (Some(code), _) => format!("exit status {code}"),
            (_, Some(sig)) => format!("signal {sig}"),
            _ => "ended".to_string(),
        })
    }

    /// Busy-waits until `done()` is true. Panics (failing the case) if the
    /// child exits or the wait lasts longer than 10 s. The loop has no
    /// `spin_loop()` hint: on this KVM guest PAUSE adds latency and can
    /// trigger pause-loop exits.
    #[inline]
    pub fn spin_until(&self, mut done: impl FnMut() -> bool) {
        let mut spins: u32 = 0;
        let mut started: Option<Instant> = None;
        while !done() {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1 << 16) {
                self.check_progress(&mut started);
            }
        }
    }

    /// The slow path of waits: panics if the child is gone or the wait that
    /// began at `*started` (set on first call) has lasted too long.
    #[cold]
    pub fn check_progress(&self, started: &mut Option<Instant>) {
        if let Some(how) = self.child_exit() {
            panic!("child ended during the case ({how})");
        }
        let started = *started.get_or_insert_with(Instant::now);
        if started.elapsed() > SPIN_TIMEOUT {
            panic!("no answer from the child for {SPIN_TIMEOUT:?}");
        }
    }

    fn spawn(case: &Case, params: &Params, run_id: String, cpu: Option<usize>) -> io::Result<Self> {
        let shm = ShmRegion::create(SHM_BYTES)?;
        let (sock, child_sock) = UnixStream::pair()?;
        // The child's end must survive exec; the parent's end stays CLOEXEC.
        fcntl_setfd(&child_sock, FdFlags::empty())?;
        let child_stdout = io::stderr().as_fd().try_clone_to_owned()?;

        // `$FERRY_BENCH_CHILD_EXE`: the child is that build of `ferry`, not
        // this one (a mixed A/B: which side of a case a change slowed).
        let exe = match std::env::var_os("FERRY_BENCH_CHILD_EXE") {
            Some(exe) => exe.into(),
            None => std::env::current_exe()?,
        };
        // `$FERRY_BENCH_CHILD_NETNS`: the child runs in that network namespace
        // (`ip netns exec` execs it: the pid is the child's).
        let mut cmd = match std::env::var("FERRY_BENCH_CHILD_NETNS") {
            Ok(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns]).arg(exe);
                c
            }
            Err(_) => Command::new(exe),
        };
        cmd.env(env::CHILD, case.name)
            .env(env::SHM_FD, shm.fd().as_raw_fd().to_string())
            .env(env::SOCK_FD, child_sock.as_raw_fd().to_string())
            .env(env::RUN_ID, &run_id)
            .env(env::PARAMS, params.to_env())
            .env(env::PARENT_PID, std::process::id().to_string())
            .stdin(Stdio::null())
            // Keep the parent's stdout clean (it may be printing JSON).
            .stdout(child_stdout);
        if let Some(cpu) = cpu {
            cmd.env(env::CPU, cpu.to_string());
        }
        let child = ChildGuard(cmd.spawn()?);
        drop(child_sock); // so that a dead child reads as EOF here
        fcntl_setfd(shm.fd(), FdFlags::CLOEXEC)?; // inherited by this child only

        let mut peer = Self { shm, sock, run_id, child_cpu: None, child };
        peer.await_ready()?;
        Ok(peer)
    }

    fn await_ready(&mut self) -> io::Result<()> {
        self.sock.set_read_timeout(Some(START_TIMEOUT))?;
        let mut byte = [0u8];
        (&self.sock).read_exact(&mut byte)?;
        self.sock.set_read_timeout(None)?;
        if byte[0] != READY {
            return Err(io::Error::other("child sent a bad ready byte"));
        }
        Ok(())
    }

    /// Waits for the child to exit on its own. On timeout, dropping `self`
    /// kills and reaps it.
    fn finish(mut self) -> Result<(), String> {
        let deadline = Instant::now() + EXIT_TIMEOUT;
        loop {
            match self.child.0.try_wait() {
                Ok(Some(status)) => return check_status(status),
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
                Ok(None) => return Err(format!("child still running after {EXIT_TIMEOUT:?}; killed")),
                Err(e) => return Err(format!("waiting for the child: {e}")),
            }
        }
    }
}

fn check_status(status: ExitStatus) -> Result<(), String> {
    if status.success() {
        Ok(())
    } else {
        Err(format!("child failed: {status}"))
    }
}

/// Kills and reaps the child when dropped, also while unwinding: no case
/// leaves a process behind.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// The calling thread's CPUs for the suite: the first two it may run on,
/// one for the parent and one for the child. Restores the thread's
/// affinity when dropped.
struct Pinning {
    saved: CpuSet,
    cpus: Option<(usize, usize)>,
}

impl Pinning {
    /// With only one CPU allowed (or none known), nothing is pinned.
    fn new() -> Option<Pinning> {
        let saved = sched_getaffinity(None).ok()?;
        let mut allowed = (0..CpuSet::MAX_CPU).filter(|&c| saved.is_set(c));
        let cpus = allowed.next().zip(allowed.next());
        Some(Pinning { saved, cpus })
    }

    /// Sets the calling thread's affinity for `case` (before its child is
    /// started, which inherits it): one CPU if the case is pinned, else
    /// every CPU the suite may use. Returns the CPU for the child, if any.
    fn enter(&self, case: &Case) -> Option<usize> {
        let (mine, child) = self.cpus.filter(|_| case.pinned)?;
        let mut set = CpuSet::new();
        set.set(mine);
        sched_setaffinity(None, &set).ok().map(|()| child)
    }

    fn leave(&self) {
        let _ = sched_setaffinity(None, &self.saved);
    }
}

impl Drop for Pinning {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Runs `cases` one after another, each with a fresh child. A pinned case
/// (the default) runs with the calling thread pinned to one CPU and its
/// child to another (if the process may use two); an unpinned one with
/// both free to move. A case that fails (a panic on either side, a child that does not
/// start or exit cleanly) is reported in [`Report::errors`] and the suite
/// goes on.
///
/// Panics if this process is itself the child of a case (a binary that did
/// not call [`crate::child_main_if_requested`] would otherwise start
/// children without end).
pub fn run_suite(suite: &str, cases: &[Case], params: &Params) -> Report {
    assert!(
        std::env::var_os(env::CHILD).is_none(),
        "ferry-bench: this binary must call child_main_if_requested() first thing in main()"
    );
    let mut report = Report::new(suite, params);
    let pinning = Pinning::new();
    // Per case: the samples of each pass, or why it failed (it is not run again).
    let mut outcomes: Vec<Result<Vec<Vec<f64>>, String>> = vec![Ok(Vec::new()); cases.len()];
    for _ in 0..params.passes.max(1) {
        for (case, outcome) in cases.iter().zip(&mut outcomes) {
            let Ok(passes) = outcome else { continue };
            let child_cpu = pinning.as_ref().and_then(|p| p.enter(case));
            let result = run_case(case, params, child_cpu);
            if let Some(p) = &pinning {
                p.leave();
            }
            match result {
                Ok(samples) => passes.push(samples),
                Err(msg) => {
                    eprintln!("ferry-bench: {} failed: {msg}", case.name);
                    *outcome = Err(msg);
                }
            }
        }
    }
    drop(pinning);
    for (case, outcome) in cases.iter().zip(outcomes) {
        match outcome {
            Ok(passes) => report.push_passes(case.name, passes),
            Err(msg) => report.fail(case.name, msg),
        }
    }
    report
}

fn run_case(case: &Case, params: &Params, child_cpu: Option<usize>) -> Result<Vec<f64>, String> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let run_id = format!("{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
    let mut peer = Peer::spawn(case, params, run_id, child_cpu).map_err(|e| format!("cannot start the child: {e}"))?;
    peer.child_cpu = child_cpu;
    let samples =
        catch_unwind(AssertUnwindSafe(|| (case.parent)(&mut peer, params))).map_err(|panic| panic_message(&*panic))?;
    peer.finish()?;
    if samples.is_empty() {
        return Err("no samples".into());
    }
    Ok(samples)
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_round_trip_through_env() {
        let p = Params { passes: 1, rounds: 5, iters: 77, warmup: 1 };
        assert_eq!(Params::from_env(&p.to_env()), Some(p));
        assert_eq!(Params::from_env("1,2"), None);
    }

    #[test]
    fn measure_gives_one_sample_per_round() {
        let p = Params { passes: 1, rounds: 3, iters: 10, warmup: 2 };
        let mut calls = 0;
        let samples = p.measure(10, |n| calls += n);
        assert_eq!(samples.len(), 3);
        assert_eq!(calls, 50);
        assert_eq!(p.iters_div(100), 1);
    }

    #[test]
    fn measure_each_gives_one_sample_per_call() {
        let p = Params { passes: 1, rounds: 3, iters: 10, warmup: 2 };
        let mut calls = 0;
        let samples = p.measure_each(25, || {
            calls += 1;
            if calls == 30 {
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        // 2 × ⌈25 / 10⌉ warm-up calls, then 25 timed ones.
        assert_eq!((samples.len(), calls), (25, 31));
        // The slow call (the 30th: the 24th timed) is timed on its own.
        assert!(samples[23] >= 2e6, "{samples:?}");
    }

    #[test]
    fn cases_are_pinned_unless_made_unpinned() {
        fn parent(_: &mut Peer, _: &Params) -> Vec<f64> {
            vec![]
        }
        fn child(_: &ChildCtx) {}
        assert!(Case::new("a.b.c", parent, child).pinned);
        assert!(!Case::unpinned("a.b.c.unpinned", parent, child).pinned);
    }
}
