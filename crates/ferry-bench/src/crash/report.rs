//! The matrix's figures: a tally per transport, summed over its rounds,
//! printed as a table or as one JSON object.

use crate::crash::round::RoundResult;
use serde_json::{json, Value};
use std::time::Duration;

/// Failure messages kept per transport (the rest are counted).
const KEPT: usize = 20;

#[derive(Default)]
pub(crate) struct Tally {
    pub transport: String,
    pub placement: String,
    /// A silent peer is given up after this (TCP).
    pub peer_timeout: Duration,
    /// `PeerGone` must come within this of the kill.
    pub bound: Duration,
    pub rounds: u64,
    pub passed: u64,
    pub hangs: u64,
    pub leaked_files: u64,
    pub leaked_mappings: u64,
    pub leaked_fds: u64,
    pub leaked_names: u64,
    pub duplicate_executions: u64,
    pub wrong_errors: u64,
    pub survivor_failures: u64,
    pub late: u64,
    pub errors: u64,
    pub ops: u64,
    pub in_flight: u64,
    pub in_flight_ok: u64,
    pub in_flight_unbound: u64,
    pub in_flight_by: std::collections::BTreeMap<String, u64>,
    pub after_kill: u64,
    pub after_kill_max_us: u64,
    pub executions: u64,
    pub peer_gone_us: Vec<u64>,
    /// Per round: from the SIGKILL until the victim was reaped, µs.
    pub reaped_us: Vec<u64>,
    pub clean_ms_max: u64,
    /// Rounds in which no survivor had a channel to the dead team (shm).
    pub unmet: u64,
    pub etcd_rounds: u64,
    /// The names of the rounds on etcd, and those still there at the end.
    pub etcd_names: Vec<String>,
    pub etcd_dead_bound: u64,
    pub etcd_left: Vec<String>,
    pub etcd_waited: Duration,
    pub failures: Vec<String>,
}

impl Tally {
    pub fn add(&mut self, round: usize, r: RoundResult) {
        self.rounds += 1;
        let passed = r.passed(self.bound);
        self.passed += u64::from(passed);
        self.hangs += r.hangs.len() as u64;
        self.leaked_files += r.leaked_files.len() as u64;
        self.leaked_mappings += r.leaked_mappings.len() as u64;
        self.leaked_fds += r.leaked_fds.len() as u64;
        self.leaked_names += r.leaked_names.len() as u64;
        self.duplicate_executions += r.duplicate_executions();
        self.wrong_errors += r.wrong();
        self.survivor_failures += r.survivor_failures();
        self.late += r.late(self.bound) as u64;
        self.errors += r.errors.len() as u64;
        self.clean_ms_max = self.clean_ms_max.max(r.clean_ms);
        self.unmet += u64::from(r.unmet);
        if r.reaped_us > 0 {
            self.reaped_us.push(r.reaped_us);
        }
        self.etcd_rounds += u64::from(r.etcd);
        self.etcd_names.extend(r.etcd_names.iter().cloned());
        self.etcd_dead_bound += r.etcd_dead_bound as u64;
        for o in &r.outcomes {
            self.ops += o.ops;
            self.in_flight += o.in_flight;
            self.in_flight_ok += o.in_flight_ok;
            self.in_flight_unbound += o.in_flight_unbound;
            for (k, n) in &o.in_flight_by {
                *self.in_flight_by.entry(k.clone()).or_insert(0) += n;
            }
            self.after_kill += o.after_kill;
            self.after_kill_max_us = self.after_kill_max_us.max(o.after_kill_max_us);
            self.executions += o.executions;
            self.peer_gone_us.extend(&o.peer_gone_us);
        }
        if !passed {
            let lists = [&r.hangs, &r.leaked_files, &r.leaked_mappings, &r.leaked_fds, &r.leaked_names, &r.errors];
            let mut what: Vec<String> = lists.into_iter().flatten().cloned().collect();
            what.extend(r.outcomes.iter().flat_map(|o| o.examples.iter().cloned()));
            for w in what {
                if self.failures.len() < KEPT {
                    self.failures.push(format!("{} round {round} (team {} killed): {w}", self.transport, r.victim));
                }
            }
        }
    }

    pub fn failed_checks(&self) -> u64 {
        self.hangs
            + self.leaked_files
            + self.leaked_mappings
            + self.leaked_fds
            + self.leaked_names
            + self.duplicate_executions
            + self.wrong_errors
            + self.survivor_failures
            + self.late
            + self.errors
            + self.etcd_left.len() as u64
    }

    pub fn json(&self) -> Value {
        json!({
            "placement": self.placement,
            "rounds": self.rounds,
            "rounds_passed": self.passed,
            "hangs": self.hangs,
            "leaked_files": self.leaked_files,
            "leaked_mappings": self.leaked_mappings,
            "leaked_fds": self.leaked_fds,
            "leaked_names": self.leaked_names + self.etcd_left.len() as u64,
            "duplicate_executions": self.duplicate_executions,
            "wrong_errors": self.wrong_errors,
            "survivor_failures": self.survivor_failures,
            "late": self.late,
            "errors": self.errors,
            "peer_gone_ms": ms_stats(&self.peer_gone_us),
            "peer_gone_bound_ms": self.bound.as_millis() as u64,
            "kill_to_reaped_ms": ms_stats(&self.reaped_us),
            "peer_timeout_ms": self.peer_timeout.as_millis() as u64,
            "operations": self.ops,
            "in_flight_at_kill": self.in_flight,
            "in_flight_answered_before_kill": self.in_flight_ok,
            "in_flight_peer_gone": self.peer_gone_us.len(),
            "in_flight_unbound": self.in_flight_unbound,
            "in_flight_outcomes": self.in_flight_by,
            "after_kill": self.after_kill,
            "after_kill_max_ms": self.after_kill_max_us as f64 / 1000.0,
            "rpc_executions": self.executions,
            "cleanup_max_ms": self.clean_ms_max,
            "rounds_dead_team_met_by_no_survivor": self.unmet,
            "etcd": {
                "rounds": self.etcd_rounds,
                "names": self.etcd_names.len(),
                "dead_teams_names_bound_after_the_kill": self.etcd_dead_bound,
                "left": self.etcd_left,
                "waited_ms": self.etcd_waited.as_millis() as u64,
            },
            "failures": self.failures,
        })
    }

    pub fn print(&self) {
        let pg = ms_stats(&self.peer_gone_us);
        println!("{} ({}):", self.transport, self.placement);
        println!("  rounds passed            {}/{}", self.passed, self.rounds);
        println!("  operations               {} ({} RPC executions)", self.ops, self.executions);
        println!(
            "  in flight at the kill    {} ({} answered before it, {} PeerGone, {} bind/name raced the exit)",
            self.in_flight,
            self.in_flight_ok,
            self.peer_gone_us.len(),
            self.in_flight_unbound
        );
        println!(
            "  kill → PeerGone          median {} ms, max {} ms (bound {} ms{})",
            pg["median"],
            pg["max"],
            self.bound.as_millis(),
            if self.transport == "tcp" {
                format!(", peer_timeout {} ms", self.peer_timeout.as_millis())
            } else {
                String::new()
            }
        );
        let reaped = ms_stats(&self.reaped_us);
        println!(
            "  kill → victim reaped     median {} ms, max {} ms (the kernel's teardown)",
            reaped["median"], reaped["max"]
        );
        println!(
            "  toward the dead after    {} operations, longest {:.1} ms",
            self.after_kill,
            self.after_kill_max_us as f64 / 1000.0
        );
        println!("  leftovers gone within    {} ms (longest round)", self.clean_ms_max);
        if self.unmet > 0 {
            println!(
                "  met by no survivor       {} rounds (its files went with the first look-up of its names)",
                self.unmet
            );
        }
        if self.etcd_rounds > 0 {
            println!(
                "  etcd                     {} rounds, {} names ({} of the dead teams' still bound after their round), {} left at the end (waited {} ms)",
                self.etcd_rounds,
                self.etcd_names.len(),
                self.etcd_dead_bound,
                self.etcd_left.len(),
                self.etcd_waited.as_millis()
            );
        }
        println!(
            "  checks                   hangs {}, leaked files {}, mappings {}, fds {}, names {}, duplicate executions {}, wrong errors {}, survivor failures {}, late {}, errors {}",
            self.hangs,
            self.leaked_files,
            self.leaked_mappings,
            self.leaked_fds,
            self.leaked_names + self.etcd_left.len() as u64,
            self.duplicate_executions,
            self.wrong_errors,
            self.survivor_failures,
            self.late,
            self.errors
        );
        for f in &self.failures {
            println!("  FAILED: {f}");
        }
    }
}

/// Median and max of µs samples, in ms.
pub(crate) fn ms_stats(us: &[u64]) -> Value {
    if us.is_empty() {
        return json!({"median": null, "max": null, "samples": 0});
    }
    let mut v = us.to_vec();
    v.sort_unstable();
    let ms = |x: u64| x as f64 / 1000.0;
    json!({"median": ms(v[v.len() / 2]), "max": ms(v[v.len() - 1]), "samples": v.len()})
}

/// The whole run: the brief's fields over every transport, then each.
pub(crate) fn summary(tallies: &[Tally], seed: u64) -> Value {
    let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
    let all: Vec<u64> = tallies.iter().flat_map(|t| t.peer_gone_us.iter().copied()).collect();
    let per: serde_json::Map<String, Value> = tallies.iter().map(|t| (t.transport.clone(), t.json())).collect();
    json!({
        "rounds": sum(|t| t.rounds),
        "hangs": sum(|t| t.hangs),
        "leaked_files": sum(|t| t.leaked_files),
        "leaked_mappings": sum(|t| t.leaked_mappings),
        "leaked_fds": sum(|t| t.leaked_fds),
        "leaked_names": sum(|t| t.leaked_names + t.etcd_left.len() as u64),
        "duplicate_executions": sum(|t| t.duplicate_executions),
        "wrong_errors": sum(|t| t.wrong_errors),
        "survivor_failures": sum(|t| t.survivor_failures),
        "peer_gone_ms": ms_stats(&all),
        "seed": seed,
        "passed": tallies.iter().all(|t| t.failed_checks() == 0),
        "per_transport": per,
    })
}
