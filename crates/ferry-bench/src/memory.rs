//! What a team costs in memory: the resident size of an idle team in a
//! small program (`ferry`'s example `idle_team`, which `scripts/bench.sh`
//! builds beside the `ferry` binary), and the shared memory of one channel
//! pair between two processes — mapped, and resident in each process after
//! the channel carried a 4 MiB message and then stayed idle for 2 s.

use ferry::Team;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// `idle_team`'s port: each message is answered with nothing.
const PORT: &str = "idle";
/// What the channel carries before it idles: past the payload area's warm part.
const LARGE: usize = 4 << 20;
const IDLE_FOR: Duration = Duration::from_secs(2);
/// Most an idle team in a small program may keep resident.
const IDLE_RSS_TARGET_KIB: u64 = 4 << 10;

pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The `idle_team` example beside this binary (`target/release/examples`).
fn idle_program() -> Option<PathBuf> {
    let p = std::env::current_exe().ok()?.parent()?.join("examples").join("idle_team");
    p.is_file().then_some(p)
}

/// Mapped and resident bytes of the process's channel segments (`ferry-channel`
/// memfds), from its smaps.
fn channel_segments(pid: u32) -> Option<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let kib = |l: &str| l.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()).unwrap_or(0) * 1024;
    let (mut mapped, mut resident, mut ours) = (0, 0, false);
    for line in smaps.lines() {
        if line.starts_with("Size:") && ours {
            mapped += kib(line);
        } else if line.starts_with("Rss:") && ours {
            resident += kib(line);
        } else if line.split_whitespace().next().is_some_and(|a| a.contains('-') && !a.ends_with(':')) {
            ours = line.contains("memfd:ferry-channel");
        }
    }
    Some((mapped, resident))
}

/// Starts `idle_team` with its runtime under `dir`, once it says it is ready.
fn start_idle(program: &std::path::Path, dir: &std::path::Path) -> Option<Child> {
    let mut child = Command::new(program).arg(dir).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().ok()?;
    let mut line = String::new();
    BufReader::new(child.stdout.take()?).read_line(&mut line).ok()?;
    Some(child)
}

pub fn report() -> Value {
    let ring = ferry::Config::default().ring_bytes;
    let mut out = json!({
        "shm_per_channel_pair_bytes": ferry::testing::segment_len(ring, 0),
        "shm_payload_area_virtual_bytes": ferry::testing::area_for(ferry::Config::default().max_message),
        "shm_doorbell_per_team_bytes": ferry::testing::DOORBELL_LEN,
        "ring_bytes_per_direction": ring,
    });
    let Some(program) = idle_program() else {
        out["idle_team_program"] = json!("missing: cargo build --release -p ferry --example idle_team");
        return out;
    };
    let dir = std::env::temp_dir().join(format!("ferry-bench-idle-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    if let Some(mut child) = start_idle(&program, &dir) {
        std::thread::sleep(Duration::from_millis(100));
        let rss = rss_kib(child.id());
        out["idle_team_rss_kib"] = json!(rss);
        // Issue 21's target.
        out["idle_team_rss_target_kib"] = json!(IDLE_RSS_TARGET_KIB);
        out["idle_team_rss_met"] = json!(rss.map(|r| r <= IDLE_RSS_TARGET_KIB));
        // One channel pair, used once with a large message, then idle.
        let pair = (|| {
            let team = Team::builder().runtime_dir(&dir).start().ok()?;
            let to = team.lookup_wait(PORT, Duration::from_secs(10)).ok()?;
            let sender = team.raw_sender(to);
            sender.call(&vec![7u8; LARGE]).ok()?;
            sender.call(b"small").ok()?;
            std::thread::sleep(IDLE_FOR);
            let here = channel_segments(std::process::id())?;
            let there = channel_segments(child.id())?;
            team.shutdown();
            Some((here, there))
        })();
        if let Some(((mapped, resident_here), (_, resident_there))) = pair {
            out["shm_channel_pair_mapped_bytes"] = json!(mapped);
            out["shm_channel_pair_resident_bytes_after_idle"] =
                json!({ "connector": resident_here, "acceptor": resident_there });
        }
        drop(child.stdin.take());
        let _ = child.wait();
    }
    let _ = std::fs::remove_dir_all(&dir);
    out
}
