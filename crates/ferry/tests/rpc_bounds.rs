//! What one peer's well-formed requests can make an RPC server hold. The
//! server runs in a process of its own, so that its peak memory (VmHWM)
//! is its own; the client crafts requests as a hostile peer would.

mod common;

use common::Child;
use ferry::rpc::{RpcError, __private::decode_response};
use ferry::{Checkpoint, Error, Limit, Team};
use std::time::Duration;

const MIB: u64 = 1 << 20;

#[ferry::service]
pub trait Hold {
    /// Does nothing (what the entries of a crafted batch call).
    async fn nothing(&self);
}

struct HoldImpl;

impl Hold for HoldImpl {
    async fn nothing(&self) {}
}

/// The process's peak resident memory (VmHWM), in bytes.
fn vm_hwm() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// The server: serves `Hold` as "hold", and answers "hwm" with its VmHWM
/// until its input ends.
#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    assert_eq!(role, "server");
    let team = Team::builder().start().unwrap();
    let serving = HoldServer::serve(&team, "hold", HoldImpl).unwrap();
    common::say("serving");
    while let Some(line) = common::hear() {
        match line.as_str() {
            "hwm" => common::say(format!("hwm {}", vm_hwm())),
            other => panic!("unknown command {other}"),
        }
    }
    drop(serving);
}

/// Asks the server for its VmHWM.
fn server_hwm(server: &mut Child) -> u64 {
    server.tell("hwm");
    server.expect("hwm", Duration::from_secs(10)).parse().unwrap()
}

/// Regression (issue 15, defect 4): a batch of 8-byte empty entries became
/// a vector of entries and then a call of ~300 bytes each: 64 MiB asked
/// for more than 2 GiB. Now a batch carries at most as many calls as its
/// size allows; past that it is refused, typed, before anything is made of it.
#[test]
fn a_batch_of_empty_entries_is_refused_within_twice_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Child::spawn("server", dir.path());
    server.expect("serving", Duration::from_secs(10));
    let client = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let to = client.raw_sender(client.lookup("hold").unwrap()).with_timeout(Duration::from_secs(60));
    // A request the server answers first: the channel is up, the server warm.
    let mut ping = vec![2u8]; // CALL, method 0, no arguments
    ping.extend_from_slice(&0u32.to_le_bytes());
    ping.push(0xc0); // MessagePack: no arguments (`()`, nil)
    decode_response::<(), ferry::rpc::Never>(&to.send(&ping, Checkpoint::OnReturn).unwrap()).unwrap();
    let before = server_hwm(&mut server);

    // BATCH, count, then that many entries (method 0, no arguments).
    let size = 64 * MIB as usize;
    let entries = (size - 5) / 8;
    let mut batch = vec![0u8; 5 + entries * 8];
    batch[0] = 3;
    batch[1..5].copy_from_slice(&(entries as u32).to_le_bytes());
    let reply = to.send(&batch, Checkpoint::OnReturn).unwrap();
    match decode_response::<(), ferry::rpc::Never>(&reply) {
        Err(RpcError::Ferry(Error::LimitReached { limit: Limit::BatchCalls, max })) => {
            assert!(max < entries as u64, "{max}")
        }
        other => panic!("want LimitReached(BatchCalls), got {other:?}"),
    }
    let grew = server_hwm(&mut server).saturating_sub(before);
    assert!(grew <= 2 * batch.len() as u64, "the server's VmHWM grew by {} MiB", grew / MIB);
    // The server still serves.
    decode_response::<(), ferry::rpc::Never>(&to.send(&ping, Checkpoint::OnReturn).unwrap()).unwrap();
}
