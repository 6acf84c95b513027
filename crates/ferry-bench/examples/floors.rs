//! Runs the pingpong floors (and the iceoryx2 peer with `--features
//! iceoryx2`) and prints the table, or the JSON with `--json`.
//!
//!     cargo run --release -p ferry-bench --features iceoryx2 --example floors -- \
//!         [--json] [--rounds N] [--iters N] [--warmup N] [--only NAME-PREFIX]

use ferry_bench::{child_main_if_requested, pingpong_floor_cases, run_suite, Params};

const BASELINE: &str = "floor.spin.two_line";

fn main() {
    let cases = pingpong_floor_cases();
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
    let mut report = run_suite("pingpong", &chosen, &params);
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
