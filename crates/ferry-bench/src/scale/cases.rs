//! The two kinds of case of `ferry bench scale`, each one pass of one case
//! with its own processes (a [`Crowd`]: the server, the callers, the
//! holder of idle teams; all unpinned, default settings).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::crowd::Crowd;
use crate::memory::rss_kib;
use crate::run_dir::{run_dir, RemoveDir};
use crate::windows::{min_share, now_ns, ns_per_call, parse_counts, Windows};

use super::ScaleArgs;

/// One pass of one case: its samples (ns per call) and named figures.
pub(crate) struct Outcome {
    pub samples: Vec<f64>,
    pub figures: BTreeMap<&'static str, f64>,
}

const START: Duration = Duration::from_secs(20);
/// Binding hundreds of idle teams one after another takes a while.
const IDLE_START: Duration = Duration::from_secs(120);
const EXIT: Duration = Duration::from_secs(10);
/// How long the server is left alone before its idle CPU is measured.
const SETTLE: Duration = Duration::from_millis(200);
/// Past its expected end, how long a measurement may take.
const GRACE: Duration = Duration::from_secs(10);
/// Slices of a fan-in measurement (its samples).
const FANIN_SLICES: usize = 10;

fn run_id() -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!("scale-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// `ferry.shm.null.idleN`: one server team; a timer process binds and,
/// once `n` idle client teams (one process, teams without processors)
/// are bound too, times `calls` null calls one by one; then, all quiet,
/// the server's CPU over `idle_seconds` and its memory. The server and the
/// timer are pinned to two CPUs, as a case of the harness: unpinned, the
/// scheduler puts them on one CPU in some runs and not in others, and p50
/// swings between ~1 and ~50 µs whatever N is.
pub(crate) fn idle(n: usize, a: &ScaleArgs) -> Result<Outcome, String> {
    let id = run_id();
    let _dir = RemoveDir(run_dir(&id));
    let arg = format!("dir={} name=bench.scale mode=default", run_dir(&id).display());
    let (server_cpu, timer_cpu) = match two_cpus() {
        Some((s, t)) => (format!(" cpu={s}"), format!(" cpu={t}")),
        None => (String::new(), String::new()),
    };
    let mut crowd = Crowd::new();
    let server = crowd.add("rpc.server", &format!("{arg}{server_cpu}"))?;
    let timer = crowd.add("rpc.timer", &format!("{arg}{timer_cpu} warm={}", (a.calls / 10).max(100)))?;
    crowd.ready(START)?;
    let pid = crowd.pid(server);
    let rss_base = rss(pid)?;
    if n > 0 {
        crowd.add("rpc.idle", &format!("{arg} n={n}"))?;
        crowd.ready(IDLE_START)?;
    }
    std::thread::sleep(SETTLE);
    let rss_n = rss(pid)?;

    let line = crowd.ask(&[timer], &format!("time {}", a.calls), GRACE + Duration::from_millis(a.calls as u64))?;
    let samples = parse_times(&line[0], a.calls)?;

    std::thread::sleep(SETTLE);
    let (stat0, ns0, t0) = (stat_cpu_ns(pid)?, schedstat_ns(pid)?, Instant::now());
    std::thread::sleep(Duration::from_secs_f64(a.idle_seconds));
    let (stat1, ns1, wall) = (stat_cpu_ns(pid)?, schedstat_ns(pid)?, t0.elapsed().as_nanos() as f64);
    crowd.finish(EXIT)?;

    let mut figures = BTreeMap::from([
        ("p50_ns", percentile(&samples, 0.50).ok_or("no samples")?),
        ("p99_ns", percentile(&samples, 0.99).ok_or("no samples")?),
        ("idle_cpu_pct", 100.0 * stat1.saturating_sub(stat0) as f64 / wall),
        ("idle_cpu_pct_schedstat", 100.0 * ns1.saturating_sub(ns0) as f64 / wall),
        ("rss_kib", rss_n as f64),
        ("rss_kib_no_idle", rss_base as f64),
    ]);
    if n > 0 {
        figures.insert("rss_per_peer_kib", (rss_n as f64 - rss_base as f64) / n as f64);
    }
    Ok(Outcome { samples, figures })
}

/// `ferry.shm.fanin.C`: `c` caller processes making blocking null calls to
/// one server team for `seconds` (after a tenth of that uncounted).
pub(crate) fn fanin(c: usize, a: &ScaleArgs) -> Result<Outcome, String> {
    let id = run_id();
    let _dir = RemoveDir(run_dir(&id));
    let arg = format!("dir={} name=bench.scale mode=default", run_dir(&id).display());
    let mut crowd = Crowd::new();
    crowd.add("rpc.server", &arg)?;
    let callers: Vec<usize> = (0..c).map(|_| crowd.add("rpc.caller", &arg)).collect::<Result<_, _>>()?;
    crowd.ready(START)?;

    let slice_ns = (a.seconds * 1e9 / FANIN_SLICES as f64) as u64;
    let w = Windows::after(50_000_000 + slice_ns, slice_ns, FANIN_SLICES);
    let within = Duration::from_nanos(w.end_ns().saturating_sub(now_ns())) + GRACE;
    let lines = crowd.ask(&callers, &w.to_line(), within)?;
    crowd.finish(EXIT)?;

    let counts: Vec<Vec<u64>> = lines.iter().map(|l| parse_counts(l, w.slices)).collect::<Result<_, _>>()?;
    let samples = ns_per_call(&w, &counts)?;
    let per_caller: Vec<u64> = counts.iter().map(|c| c.iter().sum()).collect();
    let secs = (w.slice_ns * w.slices as u64) as f64 / 1e9;
    let figures = BTreeMap::from([
        ("calls_per_s", per_caller.iter().sum::<u64>() as f64 / secs),
        ("min_share", min_share(&per_caller).ok_or("no calls")?),
        ("min_caller_calls_per_s", *per_caller.iter().min().unwrap_or(&0) as f64 / secs),
        ("max_caller_calls_per_s", *per_caller.iter().max().unwrap_or(&0) as f64 / secs),
    ]);
    Ok(Outcome { samples, figures })
}

/// The first two CPUs this process may run on, if it may use two.
fn two_cpus() -> Option<(usize, usize)> {
    let set = rustix::thread::sched_getaffinity(None).ok()?;
    let mut allowed = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c));
    Some((allowed.next()?, allowed.next()?))
}

fn rss(pid: u32) -> Result<u64, String> {
    rss_kib(pid).ok_or_else(|| format!("no VmRSS for pid {pid}"))
}

fn parse_times(line: &str, n: usize) -> Result<Vec<f64>, String> {
    let times: Option<Vec<f64>> =
        line.strip_prefix("ns").and_then(|r| r.split_whitespace().map(|t| t.parse().ok()).collect());
    times.filter(|t| t.len() == n).ok_or_else(|| format!("bad times ({} bytes)", line.len()))
}

/// The `q` quantile by nearest rank (the smallest sample with at least
/// `q` of all at or below it).
pub(crate) fn percentile(samples: &[f64], q: f64) -> Option<f64> {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = (q * s.len() as f64).ceil().max(1.0) as usize;
    s.get(rank.min(s.len()).checked_sub(1)?).copied()
}

/// What `/proc/PID/stat` counts as the process's CPU time (utime + stime,
/// its dead threads' included), in ns. Its unit is the clock tick (10 ms):
/// coarse over a couple of seconds, hence [`schedstat_ns`] beside it.
fn stat_cpu_ns(pid: u32) -> Result<u64, String> {
    /// `USER_HZ`, fixed at 100 by Linux's ABI on x86 and arm64.
    const NS_PER_TICK: u64 = 10_000_000;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // Fields after the command name (which may hold spaces): state is
    // field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|x| x.parse().ok()).collect();
    match f[..] {
        [utime, stime] => Ok((utime + stime) * NS_PER_TICK),
        _ => Err(format!("/proc/{pid}/stat does not parse")),
    }
}

/// Time on a CPU of the process's live threads, in ns
/// (`/proc/PID/task/*/schedstat`, first field).
fn schedstat_ns(pid: u32) -> Result<u64, String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| format!("/proc/{pid}/task: {e}"))?;
    let mut sum = 0;
    for t in tasks.flatten() {
        // A thread that just ended has no file left: it counts as nothing.
        if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
            sum += s.split_whitespace().next().and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
        }
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&s, 0.5), Some(50.0));
        assert_eq!(percentile(&s, 0.99), Some(99.0));
        assert_eq!(percentile(&s, 1.0), Some(100.0));
        assert_eq!(percentile(&s, 0.0), Some(1.0));
        assert_eq!(percentile(&[7.0], 0.99), Some(7.0));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn times_are_checked() {
        assert_eq!(parse_times("ns 5 7", 2), Ok(vec![5.0, 7.0]));
        assert!(parse_times("ns 5", 2).is_err());
        assert!(parse_times("counts 5 7", 2).is_err());
    }

    #[test]
    fn this_process_has_cpu_time_and_memory() {
        let pid = std::process::id();
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {}
        assert!(schedstat_ns(pid).unwrap() > 10_000_000);
        assert!(stat_cpu_ns(pid).is_ok());
        assert!(rss(pid).unwrap() > 0);
    }
}
