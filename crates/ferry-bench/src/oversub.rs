//! Oversubscription (`ferry bench rpc`, issue 17): 4 client processes and 4
//! server processes in pairs on this machine's CPUs, unpinned, each client
//! making blocking null calls to its server. The figure is ns per call of
//! all four pairs together (1e9 / total calls per s; lower is better, as
//! for the suite's other cases), one sample per round: each round is a
//! slice of `iters × 10 µs` (200 ms by default) counted by every client at
//! once (see [`crate::windows`]; 20 ms at least), after `warmup` slices
//! uncounted.
//!
//! - `ferry.shm.oversub`: default settings on both sides;
//! - `ferry.shm.oversub.nospin`: spinning off on both sides (`blocking()`);
//! - `ferry.shm.oversub.spinall`: the old default, every waiting thread
//!   spinning its full `spin` whatever its peer does ([`old_default`]);
//! - `floor.futex.oversub`: four futex ping-pong pairs (as `floor.futex`).
//!
//! Beside them, `ferry.shm.procs8` (issue 21): 8 client processes making
//! blocking null calls to one server team with 8 processors, default
//! settings, unpinned; ns per call of all of them together, as above.
//! Reported, not a target: it needs 16 CPUs or more to mean what it says.
//!
//! The harness's own child is not used (it exits at once); the processes
//! are a [`Crowd`].

use std::sync::atomic::Ordering::{Acquire, Release};
use std::time::Duration;

use ferry::TeamBuilder;
use rustix::io::{fcntl_setfd, Errno, FdFlags};
use rustix::thread::futex;

use crate::crowd::{Crowd, Member, Role};
use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::rpc_roles::Waiting;
use crate::run_dir::{run_dir, RemoveDir};
use crate::shm::ShmRegion;
use crate::windows::{counts_line, ns_per_call, parse_counts, Windows};

/// Client/server pairs.
const PAIRS: usize = 4;
/// A round's slice per `Params::iters`: 20,000 iters make 200 ms.
const NS_PER_ITER: u64 = 10_000;
/// The shortest slice: a few scheduler ticks, so that every pair runs in it.
const MIN_SLICE_NS: u64 = 20_000_000;
/// Before the first slice: for the order to reach every client.
const LEAD_NS: u64 = 50_000_000;

/// The old default's settings (32b25a3): every waiting thread spins its
/// full `spin`, whatever its peer is doing.
pub(crate) fn old_default(b: TeamBuilder) -> TeamBuilder {
    b.share_cpu(false)
}

pub fn cases() -> Vec<Case> {
    vec![
        Case::unpinned("ferry.shm.oversub", |p, q| ferry_pairs(p, q, Waiting::Default), no_child),
        Case::unpinned("ferry.shm.oversub.nospin", |p, q| ferry_pairs(p, q, Waiting::NoSpin), no_child),
        Case::unpinned("ferry.shm.oversub.spinall", |p, q| ferry_pairs(p, q, Waiting::SpinAll), no_child),
        Case::unpinned("floor.futex.oversub", futex_pairs, no_child),
        Case::unpinned("ferry.shm.procs8", procs8, no_child),
    ]
}

fn no_child(_: &ChildCtx) {}

fn windows(p: &Params) -> Windows {
    let slice_ns = (p.iters as u64 * NS_PER_ITER).max(MIN_SLICE_NS);
    Windows::after(LEAD_NS + p.warmup as u64 * slice_ns, slice_ns, p.rounds)
}

/// How long to wait for the counts, past the end of the slices.
const GRACE: Duration = Duration::from_secs(10);
const START: Duration = Duration::from_secs(20);
const EXIT: Duration = Duration::from_secs(5);

fn ferry_pairs(peer: &mut Peer, p: &Params, mode: Waiting) -> Vec<f64> {
    crowd_calls(peer, p, |crowd, dir| {
        let mut clients = Vec::new();
        for i in 0..PAIRS {
            let arg = format!("dir={dir} name=bench.oversub.{i} mode={}", mode.word());
            crowd.add("rpc.server", &arg)?;
            clients.push(crowd.add("rpc.caller", &arg)?);
        }
        Ok(clients)
    })
}

/// Clients of `ferry.shm.procs8`, and the server's processors.
const PROCS: usize = 8;

fn procs8(peer: &mut Peer, p: &Params) -> Vec<f64> {
    crowd_calls(peer, p, |crowd, dir| {
        let arg = format!("dir={dir} name=bench.procs mode={}", Waiting::Default.word());
        crowd.add("rpc.server", &format!("{arg} processors={PROCS}"))?;
        (0..PROCS).map(|_| crowd.add("rpc.caller", &arg)).collect()
    })
}

/// Starts the crowd `add` makes in the case's runtime dir (it returns
/// the callers among its members), counts their calls (see [`measure`])
/// and stops it. A member that fails fails the case.
fn crowd_calls(
    peer: &mut Peer,
    p: &Params,
    add: impl FnOnce(&mut Crowd, &str) -> Result<Vec<usize>, String>,
) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let dir = run_dir(&peer.run_id).display().to_string();
    let mut crowd = Crowd::new();
    add(&mut crowd, &dir)
        .and_then(|callers| {
            crowd.ready(START)?;
            measure(&mut crowd, &callers, p)
        })
        .and_then(|samples| crowd.finish(EXIT).map(|()| samples))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Orders every client to count, collects the counts: ns per call per slice.
fn measure(crowd: &mut Crowd, clients: &[usize], p: &Params) -> Result<Vec<f64>, String> {
    let w = windows(p);
    let within = Duration::from_nanos(w.end_ns().saturating_sub(crate::windows::now_ns())) + GRACE;
    let lines = crowd.ask(clients, &w.to_line(), within)?;
    let counts: Vec<Vec<u64>> = lines.iter().map(|l| parse_counts(l, w.slices)).collect::<Result<_, _>>()?;
    ns_per_call(&w, &counts)
}

// --- floor.futex.oversub -------------------------------------------------
// Pair i ping-pongs on two words of one shared region, `i * PAIR_BYTES`
// and 128 bytes further (as `floor.futex`: a word per direction, shared
// futexes). The caller counts round trips as a ferry caller counts calls;
// when stopped it writes STOP, which ends its server.

const PAIR_BYTES: usize = 256;
const REGION: usize = 4096;
const STOP: u32 = u32::MAX;
/// A futex sleep's longest stretch before the sleeper looks at the clock.
const TICK: futex::Timespec = futex::Timespec { tv_sec: 0, tv_nsec: 100_000_000 };

pub(crate) fn roles() -> [Role; 2] {
    [Role { name: "futex.server", run: futex_server }, Role { name: "futex.caller", run: futex_caller }]
}

fn futex_pairs(_: &mut Peer, p: &Params) -> Vec<f64> {
    let region = ShmRegion::create(REGION).unwrap_or_else(|e| panic!("shared region: {e}"));
    // Members get it over their socket; none inherits it.
    fcntl_setfd(region.fd(), FdFlags::CLOEXEC).unwrap_or_else(|e| panic!("{e}"));
    let mut crowd = Crowd::new();
    let mut clients = Vec::new();
    let add = |crowd: &mut Crowd, role: &str, i: usize| -> Result<usize, String> {
        let m = crowd.add(role, &format!("pair={i}"))?;
        crowd.send_fd(m, region.fd())?;
        Ok(m)
    };
    for i in 0..PAIRS {
        add(&mut crowd, "futex.server", i).unwrap_or_else(|e| panic!("{e}"));
        clients.push(add(&mut crowd, "futex.caller", i).unwrap_or_else(|e| panic!("{e}")));
    }
    crowd.ready(START).unwrap_or_else(|e| panic!("{e}"));
    let samples = measure(&mut crowd, &clients, p).unwrap_or_else(|e| panic!("{e}"));
    crowd.finish(EXIT).unwrap_or_else(|e| panic!("{e}"));
    samples
}

/// The pair's region and the offset of its request word.
fn pair_words(m: &mut Member) -> Result<(ShmRegion, usize), String> {
    let pair: usize = m.parse("pair")?;
    let region = ShmRegion::map(m.recv_fd()?, REGION).map_err(|e| format!("mapping the region: {e}"))?;
    if (pair + 1) * PAIR_BYTES > REGION {
        return Err(format!("pair {pair} is outside the region"));
    }
    Ok((region, pair * PAIR_BYTES))
}

/// Answers each request until STOP; a caller that vanished without it
/// leaves this one to the parent's kill.
fn futex_server(m: &mut Member) -> Result<(), String> {
    let (region, at) = pair_words(m)?;
    let (req, resp) = (region.atomic_u32(at), region.atomic_u32(at + 128));
    m.say("ready")?;
    let mut last = 0;
    loop {
        let v = req.load(Acquire);
        if v == last {
            match futex::wait(req, futex::Flags::empty(), last, Some(&TICK)) {
                Ok(()) | Err(Errno::AGAIN | Errno::INTR | Errno::TIMEDOUT) => continue,
                Err(e) => return Err(format!("FUTEX_WAIT: {e}")),
            }
        }
        if v == STOP {
            return Ok(());
        }
        resp.store(v, Release);
        futex::wake(resp, futex::Flags::empty(), 1).map_err(|e| format!("FUTEX_WAKE: {e}"))?;
        last = v;
    }
}

/// Counts round trips for each order `go ...`; on stop, stops its server.
fn futex_caller(m: &mut Member) -> Result<(), String> {
    let (region, at) = pair_words(m)?;
    let (req, resp) = (region.atomic_u32(at), region.atomic_u32(at + 128));
    m.say("ready")?;
    let mut v = 0u32;
    while let Some(line) = m.hear() {
        let w = Windows::parse(&line)?;
        let give_up = w.end_ns() + GRACE.as_nanos() as u64;
        let counts = w.count(|| {
            v += 1;
            req.store(v, Release);
            futex::wake(req, futex::Flags::empty(), 1).map_err(|e| format!("FUTEX_WAKE: {e}"))?;
            loop {
                let seen = resp.load(Acquire);
                if seen == v {
                    return Ok(());
                }
                match futex::wait(resp, futex::Flags::empty(), seen, Some(&TICK)) {
                    Err(Errno::TIMEDOUT) if crate::windows::now_ns() > give_up => {
                        return Err("no answer from the futex server".into())
                    }
                    Ok(()) | Err(Errno::AGAIN | Errno::INTR | Errno::TIMEDOUT) => {}
                    Err(e) => return Err(format!("FUTEX_WAIT: {e}")),
                }
            }
        })?;
        m.say(&counts_line(&counts))?;
    }
    req.store(STOP, Release);
    let _ = futex::wake(req, futex::Flags::empty(), 1);
    Ok(())
}

/// `"oversub": {case: {"calls_per_s": ...}}` for the rpc suite's JSON
/// (`ferry.shm.procs8` too).
pub fn throughput(report: &crate::Report) -> serde_json::Value {
    let cases: serde_json::Map<String, serde_json::Value> = report
        .results
        .iter()
        .filter(|r| r.name.contains(".oversub") || r.name == "ferry.shm.procs8")
        .map(|r| (r.name.clone(), serde_json::json!({"calls_per_s": (1e9 / r.stats.median).round()})))
        .collect();
    serde_json::Value::Object(cases)
}
