//! `ferry bench soak`: many teams, as processes, on two nodes of a cluster
//! on loopback (shared memory within a node, TCP between them), sending
//! each other messages of random sizes with every checkpoint and making
//! calls, for minutes. Every message carries its sender, a sequence number
//! and a checksum, so the report counts what was lost, duplicated,
//! reordered or corrupted (all must be 0); it also gives the calls'
//! latency percentiles minute by minute, and each team's resident memory
//! and descriptors over time (flat after warm-up).
//!
//! The teams run in blocking mode (no spinning): 16 processes share the
//! machine's cores.

use crate::run_dir::RemoveDir;
use ferry::{Checkpoint, Error, RawSender, Team};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `ferry bench soak` options.
#[derive(clap::Args, Debug)]
pub struct SoakArgs {
    /// How long the teams send.
    #[arg(long, default_value_t = 1.0)]
    pub minutes: f64,
    /// Teams (processes), split between the two nodes.
    #[arg(long, default_value_t = 16)]
    pub teams: usize,
    /// Print one JSON object instead of the report.
    #[arg(long)]
    pub json: bool,
    /// Report memory and descriptor growth without failing on it (a short
    /// run has not warmed up).
    #[arg(long)]
    pub no_memory_bound: bool,
    /// The cluster soak: this many hosts (network namespaces that
    /// scripts/cluster-soak.sh makes), names on etcd, links cut and teams
    /// killed (0: the two-node soak on loopback).
    #[arg(long, default_value_t = 0)]
    pub hosts: usize,
    /// Teams per host, with --hosts.
    #[arg(long, default_value_t = 4)]
    pub teams_per_host: usize,
}

/// The environment variable that makes this binary a soak team.
const CHILD: &str = "FERRY_SOAK_TEAM";
/// How often a team samples its memory, descriptors and latencies.
const SAMPLE: Duration = Duration::from_secs(10);
/// The header of every message: sender, sequence number, checksum of the rest.
const HEAD: usize = 4 + 8 + 8;

fn name(i: usize) -> String {
    format!("soak-{i}")
}

// ---------------------------------------------------------------- a team

/// In a re-executed team: plays it and exits.
pub(crate) fn team_if_requested() {
    let Ok(me) = std::env::var(CHILD) else { return };
    let me: usize = me.parse().expect("team number");
    let teams: usize = std::env::var("FERRY_SOAK_TEAMS").unwrap().parse().unwrap();
    let secs: f64 = std::env::var("FERRY_SOAK_SECS").unwrap().parse().unwrap();
    play(me, teams, Duration::from_secs_f64(secs));
    std::process::exit(0);
}

/// What a team saw of one sender.
#[derive(Default)]
struct FromSender {
    received: u64,
    last: Option<u64>,
    /// Sequence numbers seen lately (to tell a duplicate from a reordering).
    recent: std::collections::VecDeque<u64>,
}

#[derive(Default)]
struct Seen {
    from: HashMap<u32, FromSender>,
    duplicated: u64,
    reordered: u64,
    corrupted: u64,
    /// Senders whose end marker came (all they sent before it came first).
    done: usize,
}

/// The sequence number of a sender's last message to a team: the end
/// marker, a bare header sent `OnDelivery` once it sent everything else.
const END: u64 = u64::MAX;

pub(crate) fn checksum(bytes: &[u8]) -> u64 {
    // FNV-1a: enough to catch a damaged byte.
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

pub(crate) fn say(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn play(me: usize, teams: usize, run: Duration) {
    let team = Team::builder().blocking().start().expect("start team");
    let port = team.open_named_raw_port(&name(me)).expect("open the team's port");
    let seen = Arc::new(Mutex::new(Seen::default()));
    // Receives everything, checks it, answers calls with the checksum.
    let receiver = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            // Received into memory reused from one message to the next, as
            // a long-running program receives large data (`read_into`).
            let mut buf = Vec::new();
            while let Ok(m) = port.recv_blocking() {
                m.read_into(&mut buf);
                let p = &buf[..];
                let mut s = seen.lock().unwrap();
                if p.len() < HEAD {
                    s.corrupted += 1;
                    continue;
                }
                let from = u32::from_le_bytes(p[..4].try_into().unwrap());
                let seq = u64::from_le_bytes(p[4..12].try_into().unwrap());
                let sum = u64::from_le_bytes(p[12..20].try_into().unwrap());
                if seq == END && p.len() == HEAD {
                    s.done += 1;
                } else if checksum(&p[HEAD..]) != sum {
                    s.corrupted += 1;
                } else {
                    let f = s.from.entry(from).or_default();
                    let (dup, reord) = match f.last {
                        Some(last) if seq <= last => (f.recent.contains(&seq), !f.recent.contains(&seq)),
                        _ => (false, false),
                    };
                    if !dup {
                        f.received += 1;
                        f.last = Some(f.last.map_or(seq, |l| l.max(seq)));
                        f.recent.push_back(seq);
                        if f.recent.len() > 4096 {
                            f.recent.pop_front();
                        }
                    }
                    s.duplicated += u64::from(dup);
                    s.reordered += u64::from(reord);
                }
                drop(s);
                if m.wants_reply() {
                    let _ = m.reply(&sum.to_le_bytes());
                }
            }
        })
    };
    // Every other team, by name (the other node's through the cluster).
    let until = Instant::now() + Duration::from_secs(60);
    let peers: Vec<(usize, RawSender)> = (0..teams)
        .filter(|&j| j != me)
        .map(|j| loop {
            match team.lookup(&name(j)) {
                Ok(id) => break (j, team.raw_sender(id).with_timeout(Duration::from_secs(20))),
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("team {j} never appeared: {e}"),
            }
        })
        .collect();
    say(json!({"ready": me}));
    let _ = wait_for_line("go");

    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (me as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut seqs = vec![0u64; teams];
    let mut sent = vec![0u64; teams];
    let (mut failed, mut calls) = (0u64, 0u64);
    let mut rtts: Vec<u32> = Vec::new();
    let mut msg: Vec<u8> = Vec::new();
    let start = Instant::now();
    let mut next_sample = start + SAMPLE;
    while start.elapsed() < run {
        let (j, to) = &peers[(next() % peers.len() as u64) as usize];
        let len = match next() % 100 {
            0..=69 => next() % 256,
            70..=94 => 256 + next() % (16 << 10),
            _ => (16 << 10) + next() % (1 << 20),
        } as usize;
        let seq = seqs[*j];
        // Built in memory reused from one message to the next.
        msg.clear();
        msg.extend_from_slice(&(me as u32).to_le_bytes());
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.extend_from_slice(&[0; 8]);
        msg.extend((0..len).map(|k| (seq as usize).wrapping_add(k * 31) as u8));
        let sum = checksum(&msg[HEAD..]);
        msg[12..HEAD].copy_from_slice(&sum.to_le_bytes());
        let kind = next() % 4;
        let t0 = Instant::now();
        let r = send_as(to, &msg, kind, &msg[12..20], None);
        match r {
            Ok(()) => {
                seqs[*j] += 1;
                sent[*j] += 1;
                if kind == 3 {
                    calls += 1;
                    rtts.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                }
            }
            Err(e) => {
                // Maybe delivered, maybe not: its number is not used again.
                seqs[*j] += 1;
                failed += 1;
                eprintln!("soak team {me}: {kind} to team {j}: {e}");
            }
        }
        if Instant::now() >= next_sample {
            next_sample += SAMPLE;
            say(json!({"sample": sample(start, &mut rtts)}));
        }
    }
    say(json!({"sample": sample(start, &mut rtts)}));
    // Every team learns we are done once it has everything we sent it (a
    // channel keeps a sender's order): then its count is final.
    for (j, to) in &peers {
        let mut end = Vec::with_capacity(HEAD);
        end.extend_from_slice(&(me as u32).to_le_bytes());
        end.extend_from_slice(&END.to_le_bytes());
        end.extend_from_slice(&checksum(&[]).to_le_bytes());
        if let Err(e) = to.send(&end, Checkpoint::OnDelivery) {
            failed += 1;
            eprintln!("soak team {me}: the end marker to team {j}: {e}");
        }
    }
    say(json!({"sent": sent, "failed": failed, "calls": calls}));
    // Receive on until every team is done sending and its messages came
    // (its end marker did), then report what came.
    let _ = wait_for_line("report");
    let until = Instant::now() + Duration::from_secs(30);
    while seen.lock().unwrap().done < peers.len() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = seen.lock().unwrap();
    let received: Vec<u64> = (0..teams).map(|i| s.from.get(&(i as u32)).map_or(0, |f| f.received)).collect();
    say(json!({"received": received, "duplicated": s.duplicated, "reordered": s.reordered, "corrupted": s.corrupted}));
    drop(s);
    let _ = wait_for_line("quit");
    team.shutdown();
    let _ = receiver.join();
}

/// Sends `msg` to `to` the `kind`th way: 0 `Immediate` (a full channel is
/// not a failure: it tries again every millisecond, for at most `patience`
/// if given), 1 `OnReceipt`, 2 `OnDelivery`, 3 a call, whose reply must be
/// `sum` (the receivers answer with the message's checksum).
pub(crate) fn send_as(
    to: &RawSender,
    msg: &[u8],
    kind: u64,
    sum: &[u8],
    patience: Option<Duration>,
) -> ferry::Result<()> {
    let t = Instant::now();
    match kind {
        0 => loop {
            match to.send(msg, Checkpoint::Immediate) {
                Err(Error::WouldBlock { .. }) if patience.is_none_or(|p| t.elapsed() < p) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                r => break r.map(drop),
            }
        },
        1 => to.send(msg, Checkpoint::OnReceipt).map(drop),
        2 => to.send(msg, Checkpoint::OnDelivery).map(drop),
        _ => to.call(msg).and_then(|back| {
            if back == sum {
                Ok(())
            } else {
                Err(crate::failed("soak call", "the reply's checksum differs"))
            }
        }),
    }
}

/// Reads stdin until `line` (false at end of input).
fn wait_for_line(line: &str) -> bool {
    std::io::stdin().lock().lines().map_while(Result::ok).any(|l| l == line)
}

/// This process's resident memory, descriptors, and the latencies since the last sample.
pub(crate) fn sample(start: Instant, rtts: &mut Vec<u32>) -> Value {
    let page = 4096; // statm counts 4 KiB pages on x86-64
    let rss = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok()))
        .unwrap_or(0)
        * page;
    let fds = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0);
    let mut lat = std::mem::take(rtts);
    lat.sort_unstable();
    let at = |q: f64| lat.get(((lat.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or(0);
    json!({"t": start.elapsed().as_secs_f64(), "rss": rss, "fds": fds,
           "calls": lat.len(), "p50_us": at(0.5), "p99_us": at(0.99), "max_us": at(1.0)})
}

// ---------------------------------------------------------------- the run

/// Runs the soak and prints its report; an error if anything was lost,
/// duplicated, reordered or corrupted, or a call failed.
pub fn run(args: &SoakArgs) -> ferry::Result<()> {
    if args.hosts > 0 {
        return crate::cluster_soak::run(args);
    }
    let io = ferry::Error::io;
    let teams = args.teams.max(2);
    let dir = std::env::temp_dir().join(format!("ferry-soak-{}", std::process::id()));
    let _cleanup = RemoveDir(dir.clone());
    // Two nodes of a cluster on loopback, a runtime directory each.
    let free = || std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr());
    let addrs = [free().map_err(io("pick a port"))?, free().map_err(io("pick a port"))?];
    std::fs::create_dir_all(&dir).map_err(io("soak dir"))?;
    std::fs::write(dir.join("key"), b"the soak's cluster key, 32 bytes").map_err(io("key file"))?;
    for n in 1..=2usize {
        let other = 3 - n;
        let file = format!(
            "node {n}\nlisten {}\nkey-file {}\npeer {other} {}\n",
            addrs[n - 1],
            dir.join("key").display(),
            addrs[other - 1]
        );
        std::fs::write(dir.join(format!("node{n}.cluster")), file).map_err(io("cluster file"))?;
        std::fs::create_dir_all(dir.join(format!("node{n}"))).map_err(io("runtime dir"))?;
    }
    let exe = std::env::current_exe().map_err(io("current exe"))?;
    let mut children = Vec::new();
    for i in 0..teams {
        let n = 1 + i % 2;
        let child = Command::new(&exe)
            .env(CHILD, i.to_string())
            .env("FERRY_SOAK_TEAMS", teams.to_string())
            .env("FERRY_SOAK_SECS", (args.minutes * 60.0).to_string())
            .env("FERRY_RUNTIME_DIR", dir.join(format!("node{n}")))
            .env("FERRY_CLUSTER", dir.join(format!("node{n}.cluster")))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(io("start a team"))?;
        children.push(TeamProcess { child, lines: None });
    }
    for c in &mut children {
        c.lines = Some(BufReader::new(c.child.stdout.take().expect("piped")).lines());
    }
    let deadline = Duration::from_secs_f64(args.minutes * 60.0) + Duration::from_secs(120);
    let started = Instant::now();
    // The next line of `c` that has `key` (any, for "").
    let read = |c: &mut TeamProcess, key: &str| -> ferry::Result<Value> {
        for line in c.lines.as_mut().expect("taken").map_while(Result::ok) {
            // Anything else on stdout (not JSON) is skipped.
            let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
            if key.is_empty() || v.get(key).is_some() {
                return Ok(v);
            }
        }
        Err(crate::failed("soak", format!("a soak team ended before saying {key:?}")))
    };
    // A watchdog: a team that hangs fails the run, it does not hang it.
    let finished = Arc::new(AtomicBool::new(false));
    let pids: Vec<u32> = children.iter().map(|c| c.child.id()).collect();
    {
        let finished = finished.clone();
        std::thread::spawn(move || {
            while started.elapsed() < deadline {
                if finished.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            eprintln!("soak: not done within {deadline:?}: killing the teams");
            for p in pids {
                let _ = rustix::process::kill_process(
                    rustix::process::Pid::from_raw(p as i32).expect("pid"),
                    rustix::process::Signal::KILL,
                );
            }
        });
    }
    for c in &mut children {
        read(c, "ready")?;
    }
    for c in &mut children {
        c.tell("go");
    }
    // Each team's samples, then what it sent; then, all done, what each received.
    let mut samples: Vec<Vec<Value>> = vec![Vec::new(); teams];
    let mut sent = vec![vec![0u64; teams]; teams];
    let (mut failed, mut calls) = (0u64, 0u64);
    for (i, c) in children.iter_mut().enumerate() {
        loop {
            let v = read(c, "")?;
            if let Some(s) = v.get("sample") {
                samples[i].push(s.clone());
            } else if let Some(s) = v.get("sent") {
                sent[i] = serde_json::from_value(s.clone()).unwrap_or_default();
                failed += v["failed"].as_u64().unwrap_or(0);
                calls += v["calls"].as_u64().unwrap_or(0);
                break;
            }
        }
    }
    children.iter_mut().for_each(|c| c.tell("report"));
    let (mut lost, mut duplicated, mut reordered, mut corrupted, mut messages) = (0u64, 0u64, 0u64, 0u64, 0u64);
    // [sender, receiver, messages lost] of every pair that lost some (the
    // same node's teams talk over shared memory: both even or both odd).
    let mut lost_pairs: Vec<[u64; 3]> = Vec::new();
    for (j, c) in children.iter_mut().enumerate() {
        let v = read(c, "received")?;
        let received: Vec<u64> = serde_json::from_value(v["received"].clone()).unwrap_or_default();
        for (i, sent) in sent.iter().enumerate() {
            let got = received.get(i).copied().unwrap_or(0);
            let missing = sent[j].saturating_sub(got);
            if missing > 0 {
                lost_pairs.push([i as u64, j as u64, missing]);
            }
            lost += missing;
            messages += got;
        }
        duplicated += v["duplicated"].as_u64().unwrap_or(0);
        reordered += v["reordered"].as_u64().unwrap_or(0);
        corrupted += v["corrupted"].as_u64().unwrap_or(0);
    }
    children.iter_mut().for_each(|c| c.tell("quit"));
    for c in &mut children {
        let _ = c.child.wait();
    }
    finished.store(true, Ordering::Relaxed);

    // Memory and descriptors: flat after the warm-up, the first third of
    // the run (what a process touches once — every channel, a thread's
    // allocator arena, buffers at the size of the largest messages — has
    // been touched by then, however long the run).
    let warm = args.minutes * 60.0 / 3.0;
    let after: Vec<Vec<&Value>> =
        samples.iter().map(|s| s.iter().filter(|v| v["t"].as_f64().unwrap_or(0.0) >= warm).collect()).collect();
    let growth = |key: &str, pct: bool| {
        after
            .iter()
            .filter_map(|s| Some((s.first()?[key].as_f64()?, s.last()?[key].as_f64()?)))
            .map(|(a, b)| if pct { (b - a) / a.max(1.0) * 100.0 } else { b - a })
            .fold(0.0f64, f64::max)
    };
    let (rss_endpoints_pct, fd_growth) = (growth("rss", true), growth("fds", false));
    // RSS: the median of a team's samples in the first minute after the
    // warm-up against the median of its last minute's. A single sample
    // catches whatever is in flight then (a burst of queued messages,
    // 1 MiB each, moves a team by several MiB for a moment); a trend shows
    // in the medians all the same.
    let median_rss = |s: &[&Value], from: f64, to: f64| {
        let mut v: Vec<f64> = s
            .iter()
            .filter(|v| (from..=to).contains(&v["t"].as_f64().unwrap_or(-1.0)))
            .filter_map(|v| v["rss"].as_f64())
            .collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied()
    };
    let rss_growth_pct = after
        .iter()
        .filter_map(|s| {
            let (t0, t1) = (s.first()?["t"].as_f64()?, s.last()?["t"].as_f64()?);
            Some((median_rss(s, t0, t0 + 60.0)?, median_rss(s, t1 - 60.0, t1)?))
        })
        .map(|(a, b)| (b - a) / a.max(1.0) * 100.0)
        .fold(0.0f64, f64::max);
    // The largest team's RSS at the first sample after the warm-up, and at the last.
    let rss_mib = |last: bool| {
        after
            .iter()
            .filter_map(|s| if last { s.last() } else { s.first() })
            .filter_map(|v| v["rss"].as_f64())
            .fold(0.0f64, f64::max)
            / (1 << 20) as f64
    };
    // Minute by minute: the calls' latency (the median of the teams'
    // 10-second medians, the worst 99th percentile, the worst call), and
    // the largest team's memory and descriptors.
    let minutes = args.minutes.ceil().max(1.0) as usize;
    let by_minute: Vec<Value> = (0..minutes)
        .map(|m| {
            let w: Vec<&Value> = samples
                .iter()
                .flatten()
                .filter(|v| (v["t"].as_f64().unwrap_or(0.0) / 60.0) as usize == m && v["calls"].as_u64() > Some(0))
                .collect();
            let mut p50: Vec<u64> = w.iter().filter_map(|v| v["p50_us"].as_u64()).collect();
            p50.sort_unstable();
            let worst = |k: &str| w.iter().filter_map(|v| v[k].as_u64()).max().unwrap_or(0);
            // The largest team's memory and descriptors at the end of the minute.
            let at_end = |k: &str| {
                samples
                    .iter()
                    .filter_map(|s| s.iter().rfind(|v| (v["t"].as_f64().unwrap_or(0.0) / 60.0) as usize <= m))
                    .filter_map(|v| v[k].as_u64())
                    .max()
                    .unwrap_or(0)
            };
            json!({"minute": m, "p50_us": p50.get(p50.len() / 2).copied().unwrap_or(0),
                   "p99_us": worst("p99_us"), "max_us": worst("max_us"),
                   "rss_mib": at_end("rss") as f64 / (1 << 20) as f64, "fds": at_end("fds")})
        })
        .collect();
    let report = json!({
        "teams": teams, "minutes": args.minutes, "messages": messages, "calls": calls,
        "lost": lost, "lost_pairs": lost_pairs, "duplicated": duplicated, "reordered": reordered, "corrupted": corrupted, "failed": failed,
        "warm_up_minutes": warm / 60.0, "rss_growth_pct": rss_growth_pct,
        "rss_growth_endpoints_pct": rss_endpoints_pct, "fd_growth": fd_growth,
        "rss_mib_first": rss_mib(false), "rss_mib_last": rss_mib(true),
        // Every team's samples, [seconds, RSS in MiB], for a closer look.
        "rss_mib_by_team": samples.iter().map(|s| s.iter().map(|v| {
            let t = v["t"].as_f64().unwrap_or(0.0);
            let mib = v["rss"].as_f64().unwrap_or(0.0) / (1 << 20) as f64;
            [(t * 10.0).round() / 10.0, (mib * 100.0).round() / 100.0]
        }).collect::<Vec<_>>()).collect::<Vec<_>>(),
        "by_minute": by_minute,
    });
    if args.json {
        println!("{report}");
    } else {
        print_report(&report);
    }
    let bad = lost + duplicated + reordered + corrupted + failed;
    let grew = !args.no_memory_bound && (rss_growth_pct > 10.0 || fd_growth > 0.0);
    if bad > 0 || grew {
        return Err(crate::failed(
            "soak",
            format!(
                "soak failed: {lost} lost, {duplicated} duplicated, {reordered} reordered, {corrupted} corrupted, \
                 {failed} failed; RSS +{rss_growth_pct:.1} %, descriptors +{fd_growth}"
            ),
        ));
    }
    Ok(())
}

fn print_report(r: &Value) {
    println!(
        "soak: {} teams on two nodes (shared memory within a node, TCP between), {} min",
        r["teams"], r["minutes"]
    );
    println!(
        "messages received {} (calls {}): lost {}, duplicated {}, reordered {}, corrupted {}, failed {}",
        r["messages"], r["calls"], r["lost"], r["duplicated"], r["reordered"], r["corrupted"], r["failed"]
    );
    if r["lost"].as_u64() > Some(0) {
        println!("lost, as [sender, receiver, messages]: {}", r["lost_pairs"]);
    }
    println!(
        "after the warm-up ({:.1} min): RSS growth {:.1} % (first minute's median to the last's; {:.1} % from \
         the first sample to the last), largest team {:.1} -> {:.1} MiB; descriptors {:+}",
        r["warm_up_minutes"].as_f64().unwrap_or(0.0),
        r["rss_growth_pct"].as_f64().unwrap_or(0.0),
        r["rss_growth_endpoints_pct"].as_f64().unwrap_or(0.0),
        r["rss_mib_first"].as_f64().unwrap_or(0.0),
        r["rss_mib_last"].as_f64().unwrap_or(0.0),
        r["fd_growth"].as_f64().unwrap_or(0.0)
    );
    println!("by minute: calls' latency p50 / p99 / max (µs); the largest team's RSS and descriptors");
    for m in r["by_minute"].as_array().into_iter().flatten() {
        println!(
            "  minute {}: {} / {} / {}; {:.1} MiB, {} fds",
            m["minute"],
            m["p50_us"],
            m["p99_us"],
            m["max_us"],
            m["rss_mib"].as_f64().unwrap_or(0.0),
            m["fds"]
        );
    }
}

/// A team process and its stdout's lines.
struct TeamProcess {
    child: std::process::Child,
    lines: Option<std::io::Lines<BufReader<std::process::ChildStdout>>>,
}

impl TeamProcess {
    fn tell(&mut self, line: &str) {
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = writeln!(stdin, "{line}");
            let _ = stdin.flush();
        }
    }
}

impl Drop for TeamProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
