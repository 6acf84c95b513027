//! A cluster soak team: starts (waiting out a cut link and its dead
//! incarnation's name), sends every kind of message and call to random
//! teams by name until told to stop, checks what it receives, and says
//! what it sent and received.

use super::{name, Spec, CHILD, DEADLINE, GRACE, HEAD, PACE, PEER_TIMEOUT, TTL};
use crate::crash::rng::Rng;
use crate::soak::{checksum, sample, say, send_as};
use ferry::{EndpointId, Error, RawSender, Team};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// In a re-executed team: plays it and exits.
pub(crate) fn team_if_requested() {
    let Ok(spec) = std::env::var(CHILD) else { return };
    play(serde_json::from_str(&spec).expect("team spec"));
    std::process::exit(0);
}

/// What a team saw of one sender incarnation.
#[derive(Default)]
struct FromSender {
    /// Messages of the kinds a sender gets confirmed (not `Immediate`).
    confirmed_kinds: u64,
    last: Option<u64>,
    /// Sequence numbers seen lately (to tell a duplicate from a reordering).
    recent: VecDeque<u64>,
}

#[derive(Default)]
struct Seen {
    from: HashMap<(u32, u32), FromSender>,
    received: u64,
    duplicated: u64,
    reordered: u64,
    corrupted: u64,
}

impl Seen {
    fn take(&mut self, p: &[u8]) -> Option<u64> {
        if p.len() < HEAD {
            self.corrupted += 1;
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(p[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(p[i..i + 8].try_into().expect("8 bytes"));
        let (from, inc, seq, kind, sum) = (u32_at(0), u32_at(4), u64_at(8), p[16], u64_at(17));
        if checksum(&p[HEAD..]) != sum {
            self.corrupted += 1;
            return None;
        }
        let f = self.from.entry((from, inc)).or_default();
        let dup = f.recent.contains(&seq);
        let reordered = !dup && f.last.is_some_and(|l| seq < l);
        if !dup {
            self.received += 1;
            f.confirmed_kinds += u64::from(kind != 0);
            f.last = Some(f.last.map_or(seq, |l| l.max(seq)));
            f.recent.push_back(seq);
            if f.recent.len() > 4096 {
                f.recent.pop_front();
            }
        }
        self.duplicated += u64::from(dup);
        self.reordered += u64::from(reordered);
        if dup || reordered {
            eprintln!(
                "cluster soak: from team {from}#{inc}: {} message {seq}",
                if dup { "a duplicated" } else { "a reordered" }
            );
        }
        Some(sum)
    }
}

/// The error's variant, as the report counts it.
fn variant(e: &Error) -> String {
    let d = format!("{e:?}");
    d.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("?").to_string()
}

fn play(spec: Spec) {
    let me = spec.index;
    // Commands from the harness: "stop" (sending), "report", "quit".
    let stop = Arc::new(AtomicBool::new(false));
    let (cmd_tx, cmd_rx) = mpsc::channel::<String>();
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if line == "stop" {
                    stop.store(true, Ordering::Relaxed);
                }
                let _ = cmd_tx.send(line);
            }
            // The harness is gone: so is this team.
            std::process::exit(1);
        });
    }
    // The host's link may be down now (etcd out of reach), and the name
    // stays the dead incarnation's until its lease expires: both are
    // waited out.
    let t0 = Instant::now();
    let patience = Duration::from_secs(60);
    let team = loop {
        match Team::builder().blocking().etcd(spec.etcd, TTL).peer_timeout(PEER_TIMEOUT).start() {
            Ok(t) => break t,
            Err(e) if t0.elapsed() < patience => {
                eprintln!("cluster soak team {me}: start: {e}; again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("team {me} could not start: {e}"),
        }
    };
    let port = loop {
        match team.open_named_raw_port(&name(me)) {
            Ok(p) => break p,
            Err(e) if t0.elapsed() < patience => {
                if !matches!(e, Error::NameTaken { .. }) {
                    eprintln!("cluster soak team {me}: bind its name: {e}; again");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("team {me} could not bind its name: {e}"),
        }
    };
    say(json!({"ready": me, "ep": port.id().to_string()}));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let receiver = {
        let seen = seen.clone();
        std::thread::spawn(move || {
            while let Ok(m) = port.recv_blocking() {
                let sum = seen.lock().unwrap().take(m.payload());
                if let (true, Some(sum)) = (m.wants_reply(), sum) {
                    let _ = m.reply(&sum.to_le_bytes());
                }
            }
        })
    };

    let mut rng = Rng::derive(spec.seed, &[me as u64, u64::from(spec.incarnation)]);
    let mut peers: HashMap<usize, (EndpointId, RawSender)> = HashMap::new();
    let mut seq = 0u64;
    let (mut ops, mut calls, mut late, mut lookups) = (0u64, 0u64, 0u64, 0u64);
    let mut worst = Duration::ZERO;
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    // Per destination endpoint: messages confirmed.
    let mut confirmed: HashMap<String, u64> = HashMap::new();
    let mut rtts: Vec<u32> = Vec::new();
    let start = Instant::now();
    let mut next_sample = start + Duration::from_secs(10);
    // Times an operation; counts it late past its deadline and the grace.
    let timed = |what: &str, t: Instant, worst: &mut Duration, late: &mut u64| {
        let took = t.elapsed();
        *worst = (*worst).max(took);
        if took > DEADLINE + GRACE {
            *late += 1;
            eprintln!("cluster soak team {me}: {what} took {took:?}, past its deadline {DEADLINE:?}");
        }
    };
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(PACE);
        let j = (me + 1 + rng.below(spec.teams as u64 - 1) as usize) % spec.teams;
        if let std::collections::hash_map::Entry::Vacant(v) = peers.entry(j) {
            let t = Instant::now();
            lookups += 1;
            let found = team.lookup(&name(j));
            timed("a look-up", t, &mut worst, &mut late);
            match found {
                Ok(ep) => {
                    v.insert((ep, team.raw_sender(ep).with_timeout(DEADLINE)));
                }
                Err(e) => {
                    *errors.entry(format!("lookup:{}", variant(&e))).or_default() += 1;
                    continue;
                }
            }
        }
        let (ep, to) = &peers[&j];
        let len = match rng.below(100) {
            0..=69 => rng.below(256),
            70..=94 => 256 + rng.below(16 << 10),
            _ => (16 << 10) + rng.below(240 << 10),
        } as usize;
        let kind = rng.below(4) as u8;
        let body: Vec<u8> = (0..len).map(|k| (seq as usize).wrapping_add(k * 31) as u8).collect();
        let mut msg = Vec::with_capacity(HEAD + len);
        msg.extend_from_slice(&(me as u32).to_le_bytes());
        msg.extend_from_slice(&spec.incarnation.to_le_bytes());
        msg.extend_from_slice(&seq.to_le_bytes());
        msg.push(kind);
        msg.extend_from_slice(&checksum(&body).to_le_bytes());
        msg.extend_from_slice(&body);
        seq += 1;
        let t = Instant::now();
        // Immediate: a full channel is not a failure before the deadline.
        let r = send_as(to, &msg, u64::from(kind), &msg[17..25], Some(DEADLINE));
        timed(
            ["an immediate send", "a send on receipt", "a send on delivery", "a call"][kind as usize],
            t,
            &mut worst,
            &mut late,
        );
        ops += 1;
        match r {
            Ok(()) => {
                if kind != 0 {
                    *confirmed.entry(ep.to_string()).or_default() += 1;
                }
                if kind == 3 {
                    calls += 1;
                    rtts.push(t.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                }
            }
            Err(e) => {
                *errors.entry(variant(&e)).or_default() += 1;
                // Looked up again: the peer may be a new incarnation.
                peers.remove(&j);
            }
        }
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(10);
            say(json!({"sample": sample(start, &mut rtts)}));
        }
    }
    say(json!({"sample": sample(start, &mut rtts)}));
    say(json!({"sent": {"ops": ops, "calls": calls, "lookups": lookups, "late": late,
                        "worst_ms": worst.as_secs_f64() * 1e3, "errors": errors, "confirmed": confirmed}}));
    while let Ok(line) = cmd_rx.recv() {
        match line.as_str() {
            "report" => {
                // A message's `OnDelivery` ack leaves inside `recv_blocking`,
                // before the receiving thread counts it: its sender may have
                // said "sent" while the count is still to come. So the
                // report waits until the count has stood still a while.
                let mut last = seen.lock().unwrap().received;
                loop {
                    std::thread::sleep(Duration::from_millis(200));
                    let now = seen.lock().unwrap().received;
                    if now == last {
                        break;
                    }
                    last = now;
                }
                let s = seen.lock().unwrap();
                let from: Vec<Value> = s.from.iter().map(|((f, inc), v)| json!([f, inc, v.confirmed_kinds])).collect();
                say(json!({"received": {"messages": s.received, "duplicated": s.duplicated,
                    "reordered": s.reordered, "corrupted": s.corrupted, "from": from}}));
            }
            "quit" => break,
            _ => {}
        }
    }
    team.shutdown();
    let _ = receiver.join();
}
