//! `ferry bench crash`: the crash matrix (issue 9, item 1).
//!
//! Per round, a few teams start as processes of their own (over shared
//! memory on this machine; over TCP as nodes of a cluster, each in a
//! network namespace when `scripts/crash.sh` runs it), bind a named port
//! and serve a service that counts its executions per (client, request
//! id), and run mixed traffic at each other: port sends with every
//! checkpoint, port calls (blocking and async), 256 KiB..4 MiB messages,
//! RPC calls (blocking, async, retrying, one-way), look-ups, binds by
//! name, named ports opened and closed; some calls held 1..30 ms by
//! their receiver, so that some are in flight at any moment. At a random
//! moment one team, chosen at random, is SIGKILLed. The survivors' traffic
//! goes on a while, then stops, and the round checks:
//!
//! - nothing hangs: every operation has a deadline (5 s) and ends within
//!   it plus 2 s, every wait of the harness on a team has a limit;
//! - every operation toward the dead team in flight at the kill ends with
//!   `PeerGone` within the bound (1 s; over TCP the peer timeout is 1 s),
//!   or `NoSuchTeam` / `NameNotFound` for a bind or look-up that raced the
//!   exit (documented); the time from the kill to each `PeerGone` is
//!   recorded; operations made toward it afterwards fail at once with one
//!   of those; operations between survivors never fail;
//! - nothing of the dead team is left (within 4 s): no file in the runtime
//!   directory (`teams/`, `names/`: over shared memory, swept by the
//!   survivors that had a channel to it, or, if none had, by the first
//!   look-up of one of its names; over TCP, where it was its node's only
//!   team, once the next team starts on its node: the harness starts one),
//!   no mapping or descriptor of its memory, eventfds or connections in any
//!   survivor (`/proc/PID/maps`, `/proc/PID/fd`: see `procfs`), no name of
//!   it that resolves (on etcd: checked at the end of the run, once the
//!   dead teams' leases expired);
//! - no RPC executed twice (the servers' counts);
//!
//! then the survivors leave, and nothing at all is left in the runtime
//! directories. The command exits non-zero if any check failed.

pub(crate) mod etcd;
mod files;
mod member;
mod placement;
mod procfs;
mod protocol;
mod report;
pub(crate) mod rng;
mod round;
mod service;
mod team;
mod traffic;

pub use placement::Transport;
pub use team::team_if_requested;

use crate::run_dir::RemoveDir;
use placement::{Placement, ETCD_TTL};
use report::Tally;
use std::time::Duration;

/// `ferry bench crash`'s arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct CrashArgs {
    /// Rounds per transport (a team killed in each).
    #[arg(long, default_value_t = 100)]
    pub rounds: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Which transports: shm, tcp (across network namespaces under
    /// scripts/crash.sh, else on loopback) or both.
    #[arg(long, value_enum, default_value_t = Transport::Both)]
    pub transport: Transport,
    /// Teams per round.
    #[arg(long, default_value_t = 3)]
    pub teams: usize,
    /// TCP: how long a silent peer lasts (ms).
    #[arg(long, default_value_t = 1000)]
    pub peer_timeout_ms: u64,
    /// TCP: keep every other round's names on a real etcd (started here;
    /// needs `etcd` on the PATH). On by default when it is there.
    #[arg(long, default_value = "auto")]
    pub etcd: EtcdChoice,
    /// Seed of the random choices (default: from the clock).
    #[arg(long)]
    pub seed: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EtcdChoice {
    Auto,
    Yes,
    No,
}

/// Runs the matrix; `Ok(false)` if a check failed. A matrix that could
/// not run at all still ends with the line the test command counts.
pub fn run(args: &CrashArgs) -> ferry::Result<bool> {
    let r = matrix(args);
    if r.is_err() {
        let line = "crash: 0 passed, 1 failed";
        if args.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    r
}

fn matrix(args: &CrashArgs) -> ferry::Result<bool> {
    let seed = args.seed.unwrap_or_else(rng::now_ns);
    let base = std::env::temp_dir().join(format!("ferry-crash-{}", std::process::id()));
    let _remove = RemoveDir(base.clone());
    let etcd = match args.etcd {
        EtcdChoice::Auto => etcd::available(),
        EtcdChoice::Yes => true,
        EtcdChoice::No => false,
    };
    if args.teams < 2 {
        return Err(ferry::Error::InvalidArgument("--teams: at least 2".into()));
    }
    let mut tallies = Vec::new();
    for transport in args.transport.list() {
        let peer_timeout = Duration::from_millis(args.peer_timeout_ms);
        let pl = Placement::new(transport, args.teams, &base, peer_timeout, etcd)
            .map_err(|e| ferry::Error::InvalidArgument(format!("{}: {e}", transport.name())))?;
        let mut tally = Tally {
            transport: transport.name().into(),
            placement: pl.describe(),
            peer_timeout: pl.peer_timeout,
            bound: Duration::from_secs(1).max(if transport == Transport::Tcp {
                pl.peer_timeout
            } else {
                Duration::ZERO
            }),
            ..Tally::default()
        };
        for r in 0..args.rounds {
            let result = round::run(&pl, r, seed);
            let mut gone: Vec<u64> = result.outcomes.iter().flat_map(|o| o.peer_gone_us.iter().copied()).collect();
            gone.sort_unstable();
            eprintln!(
                "crash {} round {}/{}: team {} killed {} ms in{}; PeerGone after {:?} ms: {}",
                transport.name(),
                r + 1,
                args.rounds,
                result.victim,
                result.kill_after_ms,
                if result.etcd { " (names on etcd)" } else { "" },
                gone.iter().map(|us| us / 1000).collect::<Vec<_>>(),
                if result.passed(tally.bound) { "ok" } else { "FAILED" }
            );
            tally.add(r, result);
        }
        if let Some(etcd) = &pl.etcd {
            // Every lease has expired or been revoked by now, or will within its TTL.
            let (left, waited) = etcd.names_left(&tally.etcd_names, ETCD_TTL * 3);
            tally.etcd_left = left;
            tally.etcd_waited = waited;
        }
        tallies.push(tally);
    }
    let summary = report::summary(&tallies, seed);
    let rounds: u64 = tallies.iter().map(|t| t.rounds).sum();
    let passed: u64 = tallies.iter().map(|t| t.passed).sum();
    let ok = summary["passed"] == serde_json::Value::Bool(true);
    let last = format!("crash: {passed} passed, {} failed", rounds - passed + u64::from(!ok && passed == rounds));
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary).expect("json"));
        eprintln!("{last}");
    } else {
        println!(
            "crash matrix: {} rounds per transport, {} teams each, a random one SIGKILLed per round (seed {seed})",
            args.rounds, args.teams
        );
        for t in &tallies {
            t.print();
        }
        println!("peer_gone_ms over every transport: {}", summary["peer_gone_ms"]);
        println!("{last}");
    }
    Ok(ok)
}
