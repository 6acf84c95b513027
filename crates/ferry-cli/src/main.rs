//! The `ferry` command: the tour of the primitives, the benchmarks, and
//! a look at the node name plane.

mod tour;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "ferry", version, about = "ferry: one family of communication primitives, placed cheaply")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Every primitive across two processes, with what each costs.
    Tour,
    /// Benchmarks: ferry beside the physical floor and the peers, in one run.
    Bench {
        #[command(subcommand)]
        suite: BenchSuite,
    },
    /// The names bound in this node's name plane.
    Names,
    /// (internal) the second process of the tour.
    #[command(hide = true)]
    TourChild,
    /// (internal) the third process of the tour (a link's end passes through it).
    #[command(hide = true)]
    TourThird,
}

#[derive(Subcommand)]
enum BenchSuite {
    /// Two-process port ping-pong beside floors and iceoryx2.
    Pingpong(ferry_bench::BenchArgs),
    /// RPC: null and 4..1024-byte calls, receipt styles, calling tasks,
    /// beside raw Unix sockets, iceoryx2, tonic gRPC and ZeroMQ.
    Rpc {
        #[command(flatten)]
        args: ferry_bench::BenchArgs,
        /// Print where a call's time goes instead (cost accounting on).
        #[arg(long)]
        breakdown: bool,
    },
    /// Remote memory: a region's get, put, atomics and paths between two
    /// processes (shared memory) and two nodes (TCP), beside a load and an
    /// atomic on shared memory, a TCP ping-pong, an RPC and MPI.
    Memory(ferry_bench::BenchArgs),
    /// Links: a round trip on a fresh link and on one whose ends moved,
    /// and an end's move with its route repaired, over shared memory and
    /// TCP, beside a port round trip and a null RPC.
    Links(ferry_bench::BenchArgs),
    /// RPC between two nodes over TCP (run across two network namespaces
    /// by `scripts/bench.sh tcp`) beside a raw TCP ping-pong and ZeroMQ.
    Tcp(ferry_bench::BenchArgs),
    /// Many peers: one client's null call beside 0..512 idle client teams
    /// (latency, the server's idle CPU and memory per peer), and 1..16
    /// client processes calling one server (calls/s, the smallest share).
    Scale(ferry_bench::scale::ScaleArgs),
    /// One-way transfer of 64 MiB and 1 GiB messages (cold, then warm into
    /// a reused buffer) beside a warm memcpy of the same size.
    Large(ferry_bench::large::LargeArgs),
    /// Many teams on two nodes (shared memory and TCP), mixed messages and
    /// calls for minutes: lost, duplicated, reordered, corrupted (all 0),
    /// latency, memory and descriptors over time.
    Soak(ferry_bench::soak::SoakArgs),
    /// The crash matrix: teams SIGKILLed at random moments of mixed
    /// traffic; checks that nothing hangs, in-flight operations fail with
    /// PeerGone, nothing of the dead team is left, no RPC runs twice.
    /// Exits non-zero if a check fails. Across network namespaces (and
    /// with etcd): scripts/crash.sh.
    Crash(ferry_bench::crash::CrashArgs),
}

fn main() {
    // A benchmark re-runs this binary as its second process.
    ferry_bench::child_main();
    tracing_subscriber_init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Tour => tour::run(),
        Command::TourChild => tour::child(),
        Command::TourThird => tour::third(),
        Command::Bench { suite: BenchSuite::Pingpong(args) } => ferry_bench::pingpong::run(&args),
        Command::Bench { suite: BenchSuite::Rpc { args, breakdown } } => ferry_bench::rpc::run(&args, breakdown),
        Command::Bench { suite: BenchSuite::Large(args) } => ferry_bench::large::run(&args),
        Command::Bench { suite: BenchSuite::Soak(args) } => ferry_bench::soak::run(&args),
        Command::Bench { suite: BenchSuite::Tcp(args) } => ferry_bench::tcp_suite::run(&args),
        Command::Bench { suite: BenchSuite::Memory(args) } => ferry_bench::memory_suite::run(&args),
        Command::Bench { suite: BenchSuite::Links(args) } => ferry_bench::links_suite::run(&args),
        Command::Bench { suite: BenchSuite::Scale(args) } => ferry_bench::scale::run(&args),
        Command::Bench { suite: BenchSuite::Crash(args) } => match ferry_bench::crash::run(&args) {
            Ok(true) => Ok(()),
            Ok(false) => std::process::exit(1),
            Err(e) => Err(e),
        },
        Command::Names => list_names(),
    };
    if let Err(e) = result {
        eprintln!("ferry: {e}");
        std::process::exit(1);
    }
}

fn tracing_subscriber_init() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    }
}

fn list_names() -> ferry::Result<()> {
    let names = ferry::names::NodeNames::new(ferry::names::RuntimeDir::from_env()?);
    let list = names.list()?;
    if list.is_empty() {
        println!("(no names bound in {})", names.dir().path().display());
    }
    for (name, ep) in list {
        println!("{name:40} {ep}");
    }
    Ok(())
}
