//! Runs every pingpong case, ferry's RPC cases, remote memory's and links' briefly, each in a real
//! child process (this test binary re-executes itself, hence `harness =
//! false` and our own main): a case that no longer starts (a setting the
//! team refuses, say) fails here, not first in a benchmark run.
//! Also runs a case of its own, the way a binary adds cases to the floors,
//! and `ferry bench large` at 1 MiB: each of its cases must give a time;
//! the many-process cases (rpc's `oversub`, `ferry bench scale`) briefly.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

use ferry_bench::{child_main_if_requested, ferry_rpc, pingpong_cases, run_suite, Case, ChildCtx, Params, Peer};

/// Passes a fresh socket to the child with `send_fd`, then makes round
/// trips over it.
fn fdpass_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let (mine, theirs) = UnixStream::pair().unwrap();
    peer.send_fd(theirs.as_fd()).unwrap();
    drop(theirs);
    let mut sock = &mine;
    let samples = p.measure(p.iters_div(10), |n| {
        for _ in 0..n {
            sock.write_all(&[7]).unwrap();
            let mut b = [0u8];
            sock.read_exact(&mut b).unwrap();
            assert_eq!(b[0], 8);
        }
    });
    sock.write_all(&[0]).unwrap();
    samples
}

fn fdpass_child(ctx: &ChildCtx) {
    let sock = UnixStream::from(ctx.recv_fd().unwrap());
    let mut b = [0u8];
    while (&sock).read_exact(&mut b).is_ok() && b[0] != 0 {
        (&sock).write_all(&[b[0] + 1]).unwrap();
    }
}

fn main() {
    let mut cases = pingpong_cases();
    cases.extend(ferry_rpc::cases());
    cases.extend(ferry_bench::oversub::cases());
    cases.extend(ferry_bench::remote_memory::cases());
    cases.extend(ferry_bench::fifo_bench::cases());
    cases.extend(ferry_bench::link_bench::cases());
    // A case several suites list (a floor, `ferry.shm.spin`) runs once.
    let mut named = std::collections::HashSet::new();
    cases.retain(|c| named.insert(c.name));
    cases.push(Case::new("test.uds.fdpass", fdpass_parent, fdpass_child));
    ferry_bench::large::receiver_if_requested();
    ferry_bench::crowd_member_if_requested();
    child_main_if_requested(&cases);

    let params = Params { passes: 2, rounds: 3, iters: 200, warmup: 1 };
    let report = run_suite("pingpong", &cases, &params);
    print!("{}", report.table("floor.spin.two_line"));

    let mut failed = report.errors.len();
    for case in &cases {
        match report.get(case.name) {
            // A sample per round, or per call for a case timed call by call
            // (the TCP cases of remote memory: a quarter of `iters`).
            Some(r)
                if [params.rounds, params.iters, params.iters_div(4)]
                    .map(|n| n * params.passes)
                    .contains(&r.samples.len())
                    && r.stats.min > 0.0 => {}
            Some(r) => {
                eprintln!("{}: bad samples {:?}", case.name, r.samples);
                failed += 1;
            }
            None => {} // counted in report.errors
        }
    }
    let large = large_cases();
    failed += large.iter().filter(|(_, ok)| !ok).count();
    let scale = scale_cases();
    failed += scale.iter().filter(|(_, ok)| !ok).count();
    let total = cases.len() + large.len() + scale.len();
    println!("smoke: {} passed, {} failed", total - failed.min(total), failed);
    if failed > 0 {
        std::process::exit(1);
    }
}

/// `ferry bench large --sizes-mib 1 --rounds 1`: each case's name and
/// whether it gave a positive, finite bandwidth.
fn large_cases() -> Vec<(String, bool)> {
    const WANT: [&str; 7] = [
        "floor.memcpy.1MiB",
        "floor.copy.fresh.1MiB",
        "ferry.shm.raw.cold.1MiB",
        "ferry.shm.raw.warm.1MiB",
        "ferry.shm.typed.1MiB",
        "ferry.shm.typed.vec.1MiB",
        "ferry.shm.typed.warm.1MiB",
    ];
    let args = ferry_bench::large::LargeArgs { json: true, sizes_mib: vec![1], rounds: 1 };
    let report = match ferry_bench::large::measure(&args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("bench large: {e}");
            return WANT.iter().map(|n| (n.to_string(), false)).collect();
        }
    };
    let cases = report["results"][0]["cases"].as_array().cloned().unwrap_or_default();
    WANT.iter()
        .map(|&name| {
            let gbps = cases.iter().find(|c| c["name"] == name).and_then(|c| c["gbps"].as_f64());
            let ok = gbps.is_some_and(|g| g.is_finite() && g > 0.0);
            println!("{name}: {}", gbps.map_or("missing".to_string(), |g| format!("{g:.2} GB/s")));
            if !ok {
                eprintln!("{name}: no bandwidth ({gbps:?})");
            }
            (name.to_string(), ok)
        })
        .collect()
}

/// `ferry bench scale` on two small cases, briefly: each must give its
/// samples and figures.
fn scale_cases() -> Vec<(String, bool)> {
    let args = ferry_bench::scale::ScaleArgs {
        only: "ferry.shm.null.idle16,ferry.shm.fanin.2".into(),
        passes: 1,
        calls: 300,
        seconds: 0.2,
        idle_seconds: 0.1,
        ..Default::default()
    };
    let report = ferry_bench::scale::measure(&args);
    let figures = &report.extra["figures"];
    [("ferry.shm.null.idle16", "rss_per_peer_kib"), ("ferry.shm.fanin.2", "min_share")]
        .iter()
        .map(|&(name, field)| {
            let ok = report.get(name).is_some_and(|r| r.stats.min > 0.0) && figures[name][field].is_number();
            if !ok {
                eprintln!("{name}: no result ({:?})", report.errors);
            }
            (name.to_string(), ok)
        })
        .collect()
}
