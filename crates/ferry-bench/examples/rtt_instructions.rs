//! One thread plays both sides of a shared-memory round trip between two
//! teams, so that `valgrind --tool=callgrind` counts the instructions of the
//! send and receive paths without any spinning:
//!
//!     cargo build --release -p ferry-bench --example rtt_instructions
//!     valgrind --tool=callgrind target/release/examples/rtt_instructions 100000
//!
//! Instructions per round trip = (total − startup) / N; compare two runs with
//! different N to cancel the startup.

use ferry::{Checkpoint, Team};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
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
