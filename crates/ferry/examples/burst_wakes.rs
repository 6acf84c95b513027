//! Bursts of 64 one-way messages over shared memory to a receiver that
//! falls asleep between them: what a burst costs in wake-ups, sent one by
//! one (a bell rings once per wake of the peer) or in a `Team::batch`
//! (which checks once per burst whether to wake the peer):
//!
//!     cargo build --release -p ferry --example burst_wakes
//!     strace -f -c -e trace=write,epoll_pwait target/release/examples/burst_wakes 200
//!     strace -f -c -e trace=write,epoll_pwait target/release/examples/burst_wakes 200 batch
use ferry::{Checkpoint, Team};
use std::time::Duration;

fn main() {
    let bursts: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(200);
    let batched = std::env::args().nth(2).as_deref() == Some("batch");
    let dir = std::env::temp_dir().join(format!("ferry-bw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let b = || Team::builder().runtime_dir(&dir).processors(0).blocking().start().unwrap();
    let (a, r) = (b(), b());
    let port = r.open_raw_port().unwrap();
    let to = a.raw_sender(port.id());
    let taker = std::thread::spawn(move || {
        for _ in 0..bursts * 64 {
            port.recv_blocking().unwrap();
        }
    });
    for _ in 0..bursts {
        std::thread::sleep(Duration::from_millis(2)); // the receiver falls asleep
        let send = || {
            for i in 0..64u8 {
                to.send(&[i], Checkpoint::Immediate).unwrap();
            }
        };
        if batched {
            a.batch(send)
        } else {
            send()
        }
    }
    taker.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
