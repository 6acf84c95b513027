//! Runs every pingpong case briefly, each in a real child process (this test
//! binary re-executes itself, hence `harness = false` and our own main).

use ferry_bench::{child_main_if_requested, pingpong_floor_cases, run_suite, Params};

fn main() {
    let cases = pingpong_floor_cases();
    child_main_if_requested(&cases);

    let params = Params { rounds: 3, iters: 200, warmup: 1 };
    let report = run_suite("pingpong", &cases, &params);
    print!("{}", report.table("floor.spin.two_line"));

    let mut failed = report.errors.len();
    for case in &cases {
        match report.get(case.name) {
            Some(r) if r.samples.len() == params.rounds && r.stats.min > 0.0 => {}
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
