//! One thread plays both sides of a shared-memory round trip between two
//! teams, so that `valgrind --tool=callgrind` counts the instructions of the
//! send and receive paths without any spinning:
//!
//!     cargo build --release -p ferry-bench --example rtt_instructions
//!     valgrind --tool=callgrind target/release/examples/rtt_instructions 100000
//!
//! Instructions per round trip = (total − startup) / N; compare two runs with
//! different N to cancel the startup. `rtt_instructions N rpc` does the same
//! for a null RPC (client and server teams, server run inline on the
//! calling thread's progress loop); build with `--no-default-features` to
//! compile cost accounting out and compare.

use ferry::{Checkpoint, Team};

#[ferry::service]
pub trait Null {
    async fn null(&self);
}

struct NullImpl;

impl Null for NullImpl {
    async fn null(&self) {}
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    if std::env::args().nth(2).as_deref() == Some("rpc") {
        return rpc(n);
    }
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    let b = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    let (pa, pb) = (a.open_raw_port().unwrap(), b.open_raw_port().unwrap());
    let (to_b, to_a) = (a.raw_sender(pb.id()), b.raw_sender(pa.id()));
    let msg = [7u8; 8];
    for _ in 0..n {
        to_b.send(&msg, Checkpoint::Immediate).unwrap();
        let m = pb.recv_blocking().unwrap();
        to_a.send(m.payload(), Checkpoint::Immediate).unwrap();
        pa.recv_blocking().unwrap();
    }
    drop((pa, pb));
    a.shutdown();
    b.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

fn rpc(n: usize) {
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // One processor serves; this thread calls. Callgrind runs threads one
    // at a time, so the count is the work of both sides, spins included:
    // compare builds with each other, not with the port figure.
    let server = Team::builder().runtime_dir(&dir).processors(1).blocking().start().unwrap();
    let client = Team::builder().runtime_dir(&dir).processors(0).blocking().start().unwrap();
    let serving = NullServer::serve(&server, "null", NullImpl).unwrap();
    let c = NullClient::bind(&client, "null").unwrap();
    for _ in 0..n {
        c.null_blocking().unwrap();
    }
    drop((c, serving));
    client.shutdown();
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
