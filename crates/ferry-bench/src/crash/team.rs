//! A team of the matrix, in a process of its own (this binary, started
//! again with `$FERRY_CRASH_TEAM`): it binds a named port and serves the
//! counting service, says so, runs its traffic when told, learns which
//! peer was killed, and reports what its operations saw. The harness may
//! SIGKILL it at any moment.

use crate::crash::protocol::{port_name, svc_name, Command, PeerInfo, Report, TeamSpec, SPEC_VAR};
use crate::crash::rng::Rng;
use crate::crash::service::{CrashImpl, CrashServer, Executions};
use crate::crash::traffic::{Class, Ctx, Msg, Op, Outcome, Prim, Target, SLACK};
use ferry::{Cluster, Error, Port, Team};
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// First thing in `main()`: if this process is a team of the matrix, be
/// it and exit.
pub fn team_if_requested() {
    let Ok(spec) = std::env::var(SPEC_VAR) else { return };
    // Die with the harness: a crashed harness leaves no team behind.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let spec: TeamSpec = serde_json::from_str(&spec).expect("$FERRY_CRASH_TEAM");
    let code = match run(spec) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ferry bench crash: team: {e}");
            2
        }
    };
    std::process::exit(code);
}

fn say(report: &Report) {
    let line = serde_json::to_string(report).expect("report") + "\n";
    let mut out = std::io::stdout().lock();
    // The harness may be gone: then so are we, soon (PDEATHSIG).
    let _ = out.write_all(line.as_bytes()).and_then(|()| out.flush());
}

fn start(spec: &TeamSpec) -> ferry::Result<Team> {
    let mut b = Team::builder()
        .runtime_dir(&spec.runtime_dir)
        .peer_timeout(Duration::from_millis(spec.peer_timeout_ms))
        // Four teams' threads share two cores with the harness: sleep soon.
        .spin(Duration::from_micros(20));
    if let Some(c) = &spec.cluster {
        let key: Arc<[u8]> = Arc::from(c.key.as_slice());
        let peers = c.peers.iter().copied().collect();
        b = b.cluster(Cluster {
            node: c.node,
            listen: c.listen,
            peers,
            key,
            tls: None,
            from: Default::default(),
            handshakes_per_source: None,
        });
    }
    if let Some(etcd) = spec.etcd {
        b = b.etcd(etcd, Duration::from_millis(spec.etcd_ttl_ms));
    }
    b.start()
}

fn run(spec: TeamSpec) -> ferry::Result<()> {
    let team = start(&spec)?;
    let port = team.open_named_port::<Msg>(&port_name(spec.round, spec.index))?;
    let executions = Executions::default();
    let svc = svc_name(spec.round, spec.index);
    let serving = CrashServer::serve(&team, &svc, CrashImpl { team: team.clone(), executions: executions.clone() })?;
    say(&Report::Ready {
        team: team.id().to_string(),
        pid: std::process::id(),
        port: port.id().to_string(),
        svc: team.lookup(&svc)?.to_string(),
    });
    let leaving = Arc::new(AtomicBool::new(false));
    let receiver = receive(team.clone(), port, leaving.clone());

    let mut traffic = None;
    let mut victim = None;
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<Command>(&line).expect("a command") {
            Command::Go { peers } => traffic = Some(Traffic::start(&team, &spec, peers)),
            Command::Dead { index, kill_ns } => {
                victim = Some((index, kill_ns));
                if let Some(t) = &traffic {
                    t.shared.dead.store(index, Ordering::Relaxed);
                }
            }
            Command::Stop => {
                let ops = traffic.as_mut().map(Traffic::stop).unwrap_or_default();
                let deadline = Duration::from_millis(spec.deadline_ms);
                let mut outcome = Outcome::from_ops(&ops.0, victim, deadline);
                outcome.stuck = ops.1;
                (outcome.executions, outcome.duplicate_executions) = executions.summary();
                say(&Report::Done(Box::new(outcome)));
            }
            Command::Lookup { names } => {
                let resolved =
                    names.into_iter().filter_map(|n| team.lookup(&n).ok().map(|ep| (n, ep.to_string()))).collect();
                say(&Report::Looked { resolved });
            }
            Command::Exit => break,
        }
    }
    // Leave: what the traffic kept (senders, clients) goes, then the team.
    drop(traffic);
    drop(serving);
    leaving.store(true, Ordering::Relaxed);
    team.shutdown();
    let _ = receiver.join();
    Ok(())
}

/// Takes what comes to the team's port; answers calls, after the hold
/// they ask for (on a task: the receiver goes on meanwhile).
fn receive(team: Team, port: Port<Msg>, leaving: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        while !leaving.load(Ordering::Relaxed) {
            let m = match port.recv_timeout(Duration::from_millis(100)) {
                Ok(m) => m,
                Err(Error::DeadlineExceeded | Error::Codec(_)) => continue,
                Err(_) => break,
            };
            if !m.wants_reply() {
                continue;
            }
            let len = m.value.data.len() as u64;
            match m.value.hold_ms {
                0 => drop(m.reply(&len)),
                hold => {
                    let sleep = team.sleep(Duration::from_millis(hold.into()));
                    drop(team.spawn(async move {
                        sleep.await;
                        let _ = m.reply(&len);
                    }));
                }
            }
        }
    })
}

/// What the workers share.
struct Shared {
    stop: AtomicBool,
    /// The killed peer's index once known (`usize::MAX` before).
    dead: AtomicUsize,
    targets: Vec<Target>,
    ids: AtomicU64,
    large: Vec<u8>,
}

/// What a worker is doing: the primitive, toward which peer, since when.
type Current = Arc<Mutex<Option<(Prim, usize, Instant)>>>;

/// The team's workers, and what they keep of their peers.
struct Traffic {
    shared: Arc<Shared>,
    deadline: Duration,
    workers: Vec<(JoinHandle<Vec<Op>>, Current)>,
}

impl Traffic {
    fn start(team: &Team, spec: &TeamSpec, peers: Vec<PeerInfo>) -> Traffic {
        let deadline = Duration::from_millis(spec.deadline_ms);
        let mut rng = Rng::derive(spec.seed, &[0]);
        let large = (0..(4 << 20)).map(|_| rng.next() as u8).collect();
        let targets = peers.into_iter().map(|p| Target::new(team, p, deadline)).collect();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            dead: AtomicUsize::new(usize::MAX),
            targets,
            ids: AtomicU64::new(1),
            large,
        });
        let workers = (0..spec.workers)
            .map(|w| {
                let current = Arc::new(Mutex::new(None));
                let (team, spec, shared, cur) = (team.clone(), spec.clone(), shared.clone(), current.clone());
                let h = std::thread::Builder::new()
                    .name(format!("crash-worker-{w}"))
                    .spawn(move || work(&team, &spec, w, &shared, &cur))
                    .expect("spawn a worker");
                (h, current)
            })
            .collect();
        Traffic { shared, deadline, workers }
    }

    /// Stops the workers: each ends its operation (bounded by its deadline)
    /// and hands its records over. One that does not within the deadline
    /// plus the slack is hung: it is left behind, and reported.
    fn stop(&mut self) -> (Vec<Op>, Vec<String>) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let (mut ops, mut stuck) = (Vec::new(), Vec::new());
        let until = Instant::now() + self.deadline + SLACK;
        for (h, current) in self.workers.drain(..) {
            while !h.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(5));
            }
            if h.is_finished() {
                ops.extend(h.join().unwrap_or_default());
            } else if let Some((prim, peer, since)) = *current.lock().unwrap() {
                stuck.push(format!("{prim:?} toward team {peer}, running for {:?}", since.elapsed()));
            }
        }
        (ops, stuck)
    }
}

/// A worker: random operations toward random peers until told to stop.
/// The killed peer stays a target, less often: what is made toward it
/// after its death must fail at once, with a typed error.
fn work(team: &Team, spec: &TeamSpec, worker: usize, shared: &Shared, current: &Current) -> Vec<Op> {
    let mut rng = Rng::derive(spec.seed, &[1, worker as u64]);
    let ctx = Ctx { team, spec, me: team.id().to_string(), worker, ids: &shared.ids, large: &shared.large };
    let mut ops = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        let (prim, peer, target) = if rng.one_in(12) {
            (Prim::NamedPort, spec.index, None)
        } else {
            let mut t = &shared.targets[rng.below(shared.targets.len() as u64) as usize];
            if t.info.index == shared.dead.load(Ordering::Relaxed) && !rng.one_in(4) {
                t = &shared.targets[rng.below(shared.targets.len() as u64) as usize];
            }
            let prim = Prim::TOWARD_PEER[rng.below(Prim::TOWARD_PEER.len() as u64) as usize];
            (prim, t.info.index, Some(t))
        };
        *current.lock().unwrap() = Some((prim, peer, Instant::now()));
        let op = ctx.run(prim, peer, target, &mut rng);
        *current.lock().unwrap() = None;
        // What fails at once toward the dead team is not tried again in a
        // hot loop (two cores, shared).
        let failed_fast = op.class != Class::Ok && op.end - op.start < 1_000_000;
        ops.push(op);
        if failed_fast && peer == shared.dead.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    ops
}
