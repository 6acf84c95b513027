//! `ferry bench large`: large messages between two processes, beside two
//! copy floors measured in the same run. Per size (64 MiB and 1 GiB by
//! default), the cases are:
//!
//! - `floor.memcpy.SIZE`: a warm memcpy (both buffers touched before).
//! - `floor.copy.fresh.SIZE`: a new buffer allocated and the bytes copied
//!   into it, timed together (first touch of fresh pages included): what a
//!   program pays to make a fresh copy of a value.
//! - `ferry.shm.raw.cold.SIZE` / `ferry.shm.raw.warm.SIZE`: raw one-way
//!   transfer, timed from the start of the send until the receiver has
//!   copied the bytes into its buffer and its (empty) answer is back: one
//!   out-of-band staging copy on the sender, one copy out on the receiver,
//!   and a small round trip. *Cold* is the first transfer (fresh shared
//!   pages on the sender's side, a fresh buffer on the receiver's); *warm*
//!   ones come after one warm-up and land in a buffer the receiver reuses
//!   (`RawMessage::read_into`). Target: warm ≥ 25 % of memcpy.
//! - `ferry.shm.typed.SIZE`: a typed RPC echo as a new user writes it:
//!   `async fn echo(&self, data: ByteBuf) -> ByteBuf` (`serde_bytes`), the
//!   handler returning its argument, default settings, a fresh value each
//!   call (copied from the source outside the timed part; the timed part is
//!   `echo_blocking`). An echo carries the message both ways, so its
//!   bandwidth is 2 × SIZE / round trip; the one-way equivalent, SIZE /
//!   round trip, is reported beside it. Target: bandwidth ≥ 60 % of
//!   `floor.copy.fresh`.
//! - `ferry.shm.typed.vec.SIZE`: the same echo with a plain `Vec<u8>`
//!   argument and result. Target: ≥ 90 % of the `ByteBuf` echo.
//! - `ferry.shm.typed.warm.SIZE`: the typed twin of the raw warm case: a
//!   `Sender<Vec<u8>>` sending the same value each time (`call`, an
//!   `OnReturn` send) to a `Port<Vec<u8>>` whose receiver decodes into one
//!   reused `Vec` (`recv_into_blocking`) and replies its length. Target: ≥ 0.5 × `ferry.shm.raw.warm` of the same run.
//!
//! The receiver is this binary run again (see [`receiver_if_requested`]).

use crate::run_dir::RemoveDir;
use crate::stats::Stats;
use ferry::{Checkpoint, Team};
use serde_bytes::ByteBuf;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "FERRY_BENCH_LARGE_RECEIVER";
const PORT: &str = "bench-large";
const TYPED_PORT: &str = "bench-large-typed";
const SERVICE: &str = "bench-large-echo";
/// Warm transfer rate, as a fraction of a warm memcpy, that the suite targets.
pub const TARGET: f64 = 0.25;
/// `ferry.shm.typed` bandwidth as a fraction of `floor.copy.fresh`.
pub const TYPED_TARGET: f64 = 0.60;
/// `ferry.shm.typed.vec` as a fraction of `ferry.shm.typed`.
pub const VEC_TARGET: f64 = 0.90;
/// `ferry.shm.typed.warm` as a fraction of `ferry.shm.raw.warm`.
pub const TYPED_WARM_TARGET: f64 = 0.5;

/// The typed echo of the `ferry.shm.typed` cases.
#[ferry::service]
pub trait LargeEcho {
    async fn echo(&self, data: ByteBuf) -> ByteBuf;
    async fn echo_vec(&self, data: Vec<u8>) -> Vec<u8>;
}

struct Echo;

impl LargeEcho for Echo {
    async fn echo(&self, data: ByteBuf) -> ByteBuf {
        data
    }
    async fn echo_vec(&self, data: Vec<u8>) -> Vec<u8> {
        data
    }
}

/// Arguments of `ferry bench large`.
#[derive(clap::Args, Debug, Clone)]
pub struct LargeArgs {
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Message sizes in MiB.
    #[arg(long, value_delimiter = ',', default_values_t = [64usize, 1024])]
    pub sizes_mib: Vec<usize>,
    /// Timed rounds per case and size (after the cold transfer and one warm-up).
    #[arg(long, default_value_t = 7)]
    pub rounds: usize,
}

/// In the re-executed receiver (a team with default settings): the raw
/// port receives into one reused buffer and answers each message with its
/// length; the typed port decodes into one reused `Vec`
/// (`Port::recv_into_blocking`) and answers the same; the echo service answers its argument. Until stdin closes.
pub fn receiver_if_requested() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let team = Team::builder().runtime_dir(&dir).start().expect("start team");
    let port = team.open_named_raw_port(PORT).expect("open port");
    let typed = team.open_named_port::<Vec<u8>>(TYPED_PORT).expect("open typed port");
    let _serving = LargeEchoServer::serve(&team, SERVICE, Echo).expect("serve the echo");
    println!("ready");
    std::io::stdout().flush().ok();
    let stopper = team.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_line(&mut String::new());
        stopper.shutdown();
        std::process::exit(0);
    });
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        while let Ok(m) = typed.recv_into_blocking(&mut buf) {
            let _ = m.reply(&(buf.len() as u64));
        }
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
    median(&t)
}

/// A copy into a newly allocated buffer, allocation and first touch
/// included: seconds per round (the buffer is freed outside the timing).
fn copy_fresh_secs(src: &[u8], rounds: usize) -> Vec<f64> {
    (0..rounds)
        .map(|_| {
            let t0 = Instant::now();
            let mut v = Vec::with_capacity(src.len());
            v.extend_from_slice(std::hint::black_box(src));
            let v = std::hint::black_box(v);
            let secs = t0.elapsed().as_secs_f64();
            drop(v);
            secs
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    Stats::of(v).map_or(f64::NAN, |s| s.median)
}

/// Whether an echo came back as sent (its ends and a sample of its middle:
/// a full comparison would double the work outside the timing).
fn echoed(got: &[u8], sent: &[u8]) -> bool {
    let k = got.len().min(4096);
    got.len() == sent.len()
        && got[..k] == sent[..k]
        && got[got.len() - k..] == sent[sent.len() - k..]
        && got.iter().step_by(4093).eq(sent.iter().step_by(4093))
}

/// One case's row: `seconds` per round (median, min, max) and its
/// bandwidth at `bytes` moved per round.
fn case(name: String, seconds: &[f64], bytes: f64) -> Value {
    let s = Stats::of(seconds).unwrap_or(Stats::NAN);
    json!({
        "name": name,
        "ms": s.median * 1e3,
        "min_ms": s.min * 1e3,
        "max_ms": s.max * 1e3,
        "gbps": bytes / s.median / 1e9,
    })
}

/// Adds `ratio` = this case's bandwidth / `to`'s, with its target.
fn compare(row: &mut Value, to: &Value, target: f64) {
    let ratio = row["gbps"].as_f64().unwrap_or(f64::NAN) / to["gbps"].as_f64().unwrap_or(f64::NAN);
    row["ratio_to"] = to["name"].clone();
    row["ratio"] = json!(ratio);
    row["target"] = json!(target);
    row["met"] = json!(ratio >= target);
}

/// Runs the suite and gives its report (what `--json` prints).
pub fn measure(args: &LargeArgs) -> ferry::Result<Value> {
    if args.rounds == 0 {
        return Err(crate::failed("ferry bench large", "--rounds must be at least 1"));
    }
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
    if let Some(out) = child.stdout.take() {
        BufReader::new(out).read_line(&mut line).ok();
    }
    let result = measure_with(args, &dir);
    drop(child.stdin.take());
    let _ = child.wait();
    result
}

fn measure_with(args: &LargeArgs, dir: &std::path::Path) -> ferry::Result<Value> {
    let limit = Duration::from_secs(10);
    let team = Team::builder().runtime_dir(dir).start()?;
    let to = team.raw_sender(team.lookup_wait(PORT, limit)?);
    let typed_to = team.sender::<Vec<u8>>(team.lookup_wait(TYPED_PORT, limit)?);
    let echo = LargeEchoClient::bind_wait(&team, SERVICE, limit).map_err(|e| crate::failed("bind the echo", e))?;
    let mut rows = Vec::new();
    for &mib in &args.sizes_mib {
        let len = mib << 20;
        let data = vec![0x5Au8; len];
        let bytes = len as f64;
        let rounds = args.rounds;
        // A case that stops answering fails (the smoke test sees it) instead of hanging.
        let patience = Duration::from_secs(60 + (len >> 23) as u64);
        let (to, typed_to, echo) =
            (to.clone().with_timeout(patience), typed_to.clone().with_timeout(patience), echo.with_timeout(patience));

        // Raw one way: cold, one warm-up, then `rounds` warm.
        let transfer = || -> ferry::Result<f64> {
            let t0 = Instant::now();
            let answer = to.send(&data, Checkpoint::OnReturn)?;
            let secs = t0.elapsed().as_secs_f64();
            if answer != (len as u64).to_le_bytes() {
                return Err(crate::failed("ferry.shm.raw", "the receiver got another length"));
            }
            Ok(secs)
        };
        let cold = transfer()?;
        transfer()?;
        let warm: Vec<f64> = (0..rounds).map(|_| transfer()).collect::<ferry::Result<_>>()?;

        // Typed one way into the receiver's reused buffer: one warm-up, then `rounds`.
        let typed_transfer = || -> ferry::Result<f64> {
            let t0 = Instant::now();
            let got: u64 = typed_to.call(&data)?;
            let secs = t0.elapsed().as_secs_f64();
            if got != len as u64 {
                return Err(crate::failed("ferry.shm.typed.warm", "the receiver got another length"));
            }
            Ok(secs)
        };
        typed_transfer()?;
        let typed_warm: Vec<f64> = (0..rounds).map(|_| typed_transfer()).collect::<ferry::Result<_>>()?;

        // Typed echoes, a fresh value each call: one warm-up, then `rounds`
        // of each, the `ByteBuf` and the `Vec<u8>` echo alternated (their
        // order swapped each round), so both meet the same state of the
        // allocator and of this VM's host, and their ratio is fair.
        let echo_secs = |vec: bool| -> ferry::Result<f64> {
            let fresh = data.clone();
            let t0 = Instant::now();
            let back = if vec {
                echo.echo_vec_blocking(fresh).map_err(|e| crate::failed("ferry.shm.typed.vec", e))?
            } else {
                echo.echo_blocking(ByteBuf::from(fresh)).map_err(|e| crate::failed("ferry.shm.typed", e))?.into_vec()
            };
            let secs = t0.elapsed().as_secs_f64();
            if !echoed(&back, &data) {
                return Err(crate::failed("ferry.shm.typed", "the echo differs from what was sent"));
            }
            Ok(secs)
        };
        echo_secs(false)?;
        echo_secs(true)?;
        let (mut typed, mut typed_vec) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        for round in 0..rounds {
            for vec in [round % 2 == 1, round % 2 == 0] {
                let secs = echo_secs(vec)?;
                if vec { &mut typed_vec } else { &mut typed }.push(secs);
            }
        }

        // The floors, last (the echoes leave the allocator as a user's program would).
        let fresh = copy_fresh_secs(&data, rounds);
        let mut dst = vec![0u8; len];
        let copy = memcpy_secs(&data, &mut dst, rounds);
        drop(dst);

        let size = format!("{mib}MiB");
        let memcpy_row = case(format!("floor.memcpy.{size}"), &[copy], bytes);
        let fresh_row = case(format!("floor.copy.fresh.{size}"), &fresh, bytes);
        let cold_row = case(format!("ferry.shm.raw.cold.{size}"), &[cold], bytes);
        let mut warm_row = case(format!("ferry.shm.raw.warm.{size}"), &warm, bytes);
        compare(&mut warm_row, &memcpy_row, TARGET);
        let mut typed_row = case(format!("ferry.shm.typed.{size}"), &typed, 2.0 * bytes);
        typed_row["oneway_gbps"] = json!(bytes / median(&typed) / 1e9);
        compare(&mut typed_row, &fresh_row, TYPED_TARGET);
        let mut vec_row = case(format!("ferry.shm.typed.vec.{size}"), &typed_vec, 2.0 * bytes);
        vec_row["oneway_gbps"] = json!(bytes / median(&typed_vec) / 1e9);
        compare(&mut vec_row, &typed_row, VEC_TARGET);
        let mut typed_warm_row = case(format!("ferry.shm.typed.warm.{size}"), &typed_warm, bytes);
        compare(&mut typed_warm_row, &warm_row, TYPED_WARM_TARGET);

        let warm_stats = Stats::of(&warm).unwrap_or(Stats::NAN);
        let gbps = |secs: f64| bytes / secs / 1e9;
        rows.push(json!({
            "size_mib": mib,
            "memcpy_gbps": gbps(copy),
            "cold_ms": cold * 1e3,
            "cold_gbps": gbps(cold),
            "warm_ms": warm_stats.median * 1e3,
            "warm_gbps": gbps(warm_stats.median),
            "warm_min_ms": warm_stats.min * 1e3,
            "warm_max_ms": warm_stats.max * 1e3,
            "warm_vs_memcpy": copy / warm_stats.median,
            "target": TARGET,
            "met": copy / warm_stats.median >= TARGET,
            "cases": [memcpy_row, fresh_row, cold_row, warm_row, typed_row, vec_row, typed_warm_row],
        }));
    }
    Ok(json!({"suite": "large", "rounds": args.rounds, "results": rows}))
}

/// `ferry bench large`.
pub fn run(args: &LargeArgs) -> ferry::Result<()> {
    let report = measure(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
    } else {
        print_table(&report);
    }
    Ok(())
}

fn print_table(r: &Value) {
    let rows = r["results"].as_array().map_or(&[][..], |v| &v[..]);
    println!(
        "{:>8}  {:>11}  {:>15}  {:>15}  {:>12}  {:>8}",
        "size", "memcpy GB/s", "cold ms (GB/s)", "warm ms (GB/s)", "warm/memcpy", "target"
    );
    for row in rows {
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
    // Echoes carry the message both ways: their GB/s is 2 × size / round
    // trip, the one-way equivalent (size / round trip) beside it.
    println!(
        "\n{:<30}  {:>10}  {:>10}  {:>12}  {:<26}  {:>6}  {:>6}",
        "case", "ms", "GB/s", "1-way GB/s", "ratio to", "ratio", "target"
    );
    for c in rows.iter().filter_map(|row| row["cases"].as_array()).flatten() {
        let f = |k: &str| c[k].as_f64();
        let opt = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
        let target = match (f("target"), c["met"].as_bool()) {
            (Some(t), Some(true)) => format!("{t} met"),
            (Some(t), _) => format!("{t} MISSED"),
            _ => String::new(),
        };
        println!(
            "{:<30}  {:>10}  {:>10}  {:>12}  {:<26}  {:>6}  {}",
            c["name"].as_str().unwrap_or("?"),
            opt(f("ms"), 3),
            opt(f("gbps"), 2),
            opt(f("oneway_gbps"), 2),
            c["ratio_to"].as_str().unwrap_or("-"),
            opt(f("ratio"), 3),
            target,
        );
    }
}
