//! Runs the RPC suite's peers beside the round-trip floors and prints the
//! table (baseline `raw.uds.null`), or the JSON with `--json`.
//!
//!     scripts/bench-deps.sh   # once: libclang (iceoryx2), libzmq (zmq)
//!     cargo run --release -p ferry-bench --features peers --example rpc_peers -- \
//!         [--json] [--rounds N] [--iters N] [--warmup N] [--only NAME-PREFIX]

use ferry_bench::{child_main_if_requested, pingpong_floor_cases, rpc_peer_cases, run_suite, Params};

const BASELINE: &str = "raw.uds.null";

fn main() {
    let mut cases = pingpong_floor_cases();
    cases.extend(rpc_peer_cases());
    child_main_if_requested(&cases);

    let mut params = Params::default();
    let mut json = false;
    let mut only = String::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut number = || args.next().and_then(|n| n.parse().ok()).expect("a number");
        match arg.as_str() {
            "--json" => json = true,
            "--rounds" => params.rounds = number(),
            "--iters" => params.iters = number(),
            "--warmup" => params.warmup = number(),
            "--only" => only = args.next().expect("a case name prefix"),
            other => panic!("unknown argument {other:?}"),
        }
    }

    let chosen: Vec<_> = cases.iter().copied().filter(|c| c.name.starts_with(&only)).collect();
    let mut report = run_suite("rpc", &chosen, &params);
    if json {
        report.insert_ratios(BASELINE);
        println!("{}", serde_json::to_string_pretty(&report.to_json()).unwrap());
    } else {
        report.print_table(BASELINE);
    }
    if !report.errors.is_empty() {
        std::process::exit(1);
    }
}
