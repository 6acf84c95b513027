//! `ferry bench large`: one-way transfer of large messages between two
//! processes, beside a warm `memcpy` of the same size measured in the same
//! run.
//!
//! A transfer is timed from the start of the send until the receiver has
//! copied the bytes into its buffer and its (empty) answer is back: one
//! out-of-band staging copy on the sender, one copy out on the receiver,
//! and a small round trip. The *cold* transfer is the first one (fresh
//! shared pages on the sender's side, a fresh buffer on the receiver's);
//! *warm* transfers come after one warm-up and land in a buffer the receiver
//! reuses (`RawMessage::read_into`), which is how a program that moves large
//! data repeatedly should receive it. The target: warm ≥ 25 % of memcpy.

use crate::run_dir::RemoveDir;
use crate::stats::Stats;
use ferry::{Checkpoint, Team};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "FERRY_BENCH_LARGE_RECEIVER";
const PORT: &str = "bench-large";
/// Warm transfer rate, as a fraction of a warm memcpy, that the suite targets.
pub const TARGET: f64 = 0.25;

/// Arguments of `ferry bench large`.
#[derive(clap::Args, Debug, Clone)]
pub struct LargeArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Message sizes in MiB.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 1024])]
    pub sizes_mib: Vec<usize>,
    /// Warm transfers timed per size (after the cold one and one warm-up).
    #[arg(long, default_value_t = 7)]
    pub rounds: usize,
}

/// In the re-executed receiver: receive into one reused buffer and answer
/// each message with its length, until stdin closes.
pub(crate) fn receiver_if_requested() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let team = Team::builder().runtime_dir(&dir).start().expect("start team");
    let port = team.open_named_raw_port(PORT).expect("open port");
    println!("ready");
    std::io::stdout().flush().ok();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_line(&mut String::new());
        team.shutdown();
        std::process::exit(0);
    });
    let mut buf = Vec::new();
    while let Ok(m) = port.recv_blocking() {
        m.read_into(&mut buf);
        let _ = m.reply(&(buf.len() as u64).to_le_bytes());
    }
    std::process::exit(0);
}

/// A warm memcpy of `len` bytes: median seconds over `rounds`.
fn memcpy_secs(src: &[u8], dst: &mut [u8], rounds: usize) -> f64 {
    dst.copy_from_slice(src); // touch both
    let mut t = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t0 = Instant::now();
        dst.copy_from_slice(std::hint::black_box(src));
        std::hint::black_box(&mut *dst);
        t.push(t0.elapsed().as_secs_f64());
    }
    median(&mut t)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// `ferry bench large`.
pub fn run(args: &LargeArgs) -> ferry::Result<()> {
    let dir = std::env::temp_dir().join(format!("ferry-bench-large-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let _cleanup = RemoveDir(dir.clone());
    let mut child = Command::new(std::env::current_exe().map_err(ferry::Error::io("current exe"))?)
        .env(CHILD, &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(ferry::Error::io("spawn the receiver"))?;
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).ok();
    let team = Team::builder().runtime_dir(&dir).start()?;
    let to = team.raw_sender(team.lookup_wait(PORT, Duration::from_secs(10))?);
    let mut rows = Vec::new();
    for &mib in &args.sizes_mib {
        let len = mib << 20;
        let data = vec![0x5Au8; len];
        let transfer = || -> ferry::Result<f64> {
            let t0 = Instant::now();
            let answer = to.send(&data, Checkpoint::OnReturn)?;
            let secs = t0.elapsed().as_secs_f64();
            assert_eq!(answer, (len as u64).to_le_bytes(), "the receiver got another length");
            Ok(secs)
        };
        let cold = transfer()?;
        transfer()?; // warm-up
        let warm: Vec<f64> = (0..args.rounds).map(|_| transfer()).collect::<ferry::Result<_>>()?;
        let warm_stats = Stats::of(&warm).expect("rounds > 0");
        let warm_median = warm_stats.median;
        let mut dst = vec![0u8; len];
        let copy = memcpy_secs(&data, &mut dst, args.rounds);
        drop(dst);
        let gbps = |secs: f64| len as f64 / secs / 1e9;
        rows.push(json!({
            "size_mib": mib,
            "memcpy_gbps": gbps(copy),
            "cold_ms": cold * 1e3,
            "cold_gbps": gbps(cold),
            "warm_ms": warm_median * 1e3,
            "warm_gbps": gbps(warm_median),
            "warm_min_ms": warm_stats.min * 1e3,
            "warm_max_ms": warm_stats.max * 1e3,
            "warm_vs_memcpy": copy / warm_median,
            "target": TARGET,
            "met": copy / warm_median >= TARGET,
        }));
    }
    drop(child.stdin.take());
    let _ = child.wait();
    let report = json!({"suite": "large", "rounds": args.rounds, "results": rows});
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap());
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &Value) {
    println!(
        "{:>8}  {:>11}  {:>15}  {:>15}  {:>12}  {:>8}",
        "size", "memcpy GB/s", "cold ms (GB/s)", "warm ms (GB/s)", "warm/memcpy", "target"
    );
    for row in r["results"].as_array().into_iter().flatten() {
        let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "{:>5} MiB  {:>11.2}  {:>7.1} ({:>5.2})  {:>7.1} ({:>5.2})  {:>12.3}  {:>8}",
            row["size_mib"],
            f("memcpy_gbps"),
            f("cold_ms"),
            f("cold_gbps"),
            f("warm_ms"),
            f("warm_gbps"),
            f("warm_vs_memcpy"),
            if row["met"].as_bool() == Some(true) { "met" } else { "MISSED" }
        );
    }
}
