//! Runs every pingpong case and ferry's RPC cases briefly, each in a real
//! child process (this test binary re-executes itself, hence `harness =
//! false` and our own main): a case that no longer starts (a setting the
//! team refuses, say) fails here, not first in a benchmark run.
//! Also runs a case of its own, the way a binary adds cases to the floors.

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
    cases.push(Case { name: "test.uds.fdpass", parent: fdpass_parent, child: fdpass_child });
    child_main_if_requested(&cases);

    let params = Params { passes: 2, rounds: 3, iters: 200, warmup: 1 };
    let report = run_suite("pingpong", &cases, &params);
    print!("{}", report.table("floor.spin.two_line"));

    let mut failed = report.errors.len();
    for case in &cases {
        match report.get(case.name) {
            Some(r) if r.samples.len() == params.passes * params.rounds && r.stats.min > 0.0 => {}
            Some(r) => {
                eprintln!("{}: bad samples {:?}", case.name, r.samples);
                failed += 1;
            }
            None => {} // counted in report.errors
        }
    }
    println!("smoke: {} passed, {} failed", cases.len() - failed.min(cases.len()), failed);
    if failed > 0 {
        std::process::exit(1);
    }
}
