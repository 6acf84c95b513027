//! What a team costs in memory: resident size of an idle team (a process
//! that only started a team), and shared memory per channel pair.

use ferry::Team;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const IDLE: &str = "FERRY_BENCH_IDLE_TEAM";

/// In the re-executed idle child: start a team, say so, wait for stdin to close.
pub(crate) fn idle_child_if_requested() {
    let Ok(dir) = std::env::var(IDLE) else { return };
    let team = Team::builder().runtime_dir(&dir).start().expect("start team");
    println!("ready");
    let _ = std::io::stdin().read_line(&mut String::new());
    team.shutdown();
    std::process::exit(0);
}

pub(crate) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub fn report() -> Value {
    let dir = std::env::temp_dir().join(format!("ferry-bench-idle-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let idle = (|| {
        let mut child = Command::new(std::env::current_exe().ok()?)
            .env(IDLE, &dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .ok()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take()?).read_line(&mut line).ok()?;
        std::thread::sleep(Duration::from_millis(100));
        let rss = rss_kib(child.id());
        drop(child.stdin.take());
        let _ = child.wait();
        rss
    })();
    let _ = std::fs::remove_dir_all(&dir);
    let ring = ferry::Config::default().ring_bytes;
    json!({
        "idle_team_rss_kib": idle,
        // Resident: the header and the rings; the payload areas are sparse (touched by large messages only).
        "shm_per_channel_pair_bytes": ferry::testing::segment_len(ring, 0),
        "shm_payload_area_virtual_bytes": ferry::testing::area_for(ferry::Config::default().max_message),
        "shm_doorbell_per_team_bytes": ferry::testing::DOORBELL_LEN,
        "ring_bytes_per_direction": ring,
    })
}
