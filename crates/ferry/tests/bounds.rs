//! What a receiver holds for its senders is bounded in bytes, not only in
//! messages (defect 3): an endpoint's inbox (`inbox_bytes`) and a channel's
//! hold queue (`hold_bytes`) push back like their message bounds do, over
//! both placements (one team: the loop-back channel; two teams of this
//! process: a shared-memory channel).

mod common;

use common::{eventually, pattern};
use ferry::{Checkpoint, Error, RawPort, RawSender, Team, TeamBuilder};
use std::path::Path;
use std::time::Duration;

const PATIENCE: Duration = Duration::from_secs(10);
const MIB: usize = 1 << 20;

/// (sending team, receiving team): one team twice, or two teams.
fn teams(two: bool, dir: &Path, tweak: impl Fn(TeamBuilder) -> TeamBuilder) -> (Team, Team) {
    let b = || tweak(Team::builder().runtime_dir(dir));
    let tx = b().start().unwrap();
    let rx = if two { b().start().unwrap() } else { tx.clone() };
    (tx, rx)
}

/// Sends `Immediate` messages of `len` bytes until the push-back lasts (the
/// receiving runtime may still move a few from the channel meanwhile), at
/// most `most`; returns how many were accepted.
fn send_until_pushed_back(s: &RawSender, len: usize, most: usize) -> usize {
    let mut accepted = 0;
    loop {
        match s.send(&pattern(accepted as u64, len), Checkpoint::Immediate) {
            Ok(_) => accepted += 1,
            Err(Error::WouldBlock { .. }) => {
                std::thread::sleep(Duration::from_millis(50));
                match s.send(&pattern(accepted as u64, len), Checkpoint::Immediate) {
                    Ok(_) => accepted += 1,
                    Err(Error::WouldBlock { .. }) => return accepted,
                    Err(e) => panic!("{e}"),
                }
            }
            Err(e) => panic!("{e}"),
        }
        if accepted >= most {
            return accepted;
        }
    }
}

/// Receives `n` messages of `len` bytes, checking each.
fn receive_all(port: &RawPort, n: usize, len: usize) {
    for i in 0..n {
        let m = port.recv_timeout(PATIENCE).unwrap_or_else(|e| panic!("message {i} of {n}: {e}"));
        assert!(m.payload() == &pattern(i as u64, len)[..], "message {i} lost, damaged or reordered");
    }
    assert!(port.recv_timeout(Duration::from_millis(20)).is_err(), "nothing extra arrives");
}

/// Regression: only messages were counted, so a receiver that never
/// receives queued 1024 messages of any size in an endpoint's inbox and
/// 1024 more in the channel's hold queue (here 2 GiB of 1 MiB messages)
/// before its sender was pushed back. With the default bounds (64 MiB
/// each), push-back comes after about 128 MiB: 63 messages of 1 MiB (plus
/// their 64 bytes of overhead each) fill the inbox, 63 the hold queue, and
/// the rest is what the channel's ring holds. A sender that waits is held
/// up with its deadline.
fn large_messages_push_back_after_the_default_byte_bounds(two: bool) {
    let dir = tempfile::tempdir().unwrap();
    // Rings of 8 MiB carry 1 MiB messages in the frame (copied into the
    // receiver's memory), and a small `max_message` keeps the loop-back's
    // out-of-band bound out of the way: only the byte bounds count.
    let (tx, rx) = teams(two, dir.path(), |b| b.ring_bytes(8 * MIB).max_message(4 * MIB));
    assert_eq!((rx.config().inbox_bytes, rx.config().hold_bytes), (64 * MIB, 64 * MIB));
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    let accepted = send_until_pushed_back(&s, MIB, 300);
    eprintln!("accepted {accepted} messages of 1 MiB");
    assert!(accepted < 300, "no push-back after {accepted} MiB");
    eventually(PATIENCE, || port.len() == 63);
    // The hold queue holds as many, the 8 MiB ring at most 8.
    assert!((63 + 63..=63 + 63 + 8).contains(&accepted), "{accepted} messages accepted");
    let waiting = s.clone().with_timeout(Duration::from_millis(100)).send(&vec![1; MIB], Checkpoint::OnReceipt);
    assert!(matches!(waiting, Err(Error::DeadlineExceeded)), "{waiting:?}");
    assert_eq!(port.len(), 63, "the inbox took more than its bytes");
    receive_all(&port, accepted, MIB);
}

/// An empty inbox, and an empty hold queue, take one message larger than
/// their byte bound: else it could never be delivered. The next waits.
fn a_message_larger_than_the_byte_bounds_gets_through_alone(two: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(two, dir.path(), |b| b.inbox_bytes(MIB).hold_bytes(MIB).max_message(16 * MIB));
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    // One into the inbox, one into the hold queue, the rest wait in the channel.
    for i in 0..4u64 {
        s.send(&pattern(i, 3 * MIB), Checkpoint::Immediate).unwrap();
    }
    eventually(PATIENCE, || port.len() == 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(port.len(), 1, "a second message joined an inbox past its bound");
    receive_all(&port, 4, 3 * MIB);
}

/// Empty messages cost their overhead (64 bytes): a flood of them stops
/// at the byte bound, not at the (here huge) message bound.
fn a_flood_of_empty_messages_is_bounded_by_bytes(two: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = teams(two, dir.path(), |b| {
        b.inbox_capacity(1 << 20).hold_capacity(1 << 20).inbox_bytes(100 * 64).hold_bytes(50 * 64).ring_bytes(4096)
    });
    let port = rx.open_raw_port().unwrap();
    let s = tx.raw_sender(port.id());
    let accepted = send_until_pushed_back(&s, 0, 100_000);
    eventually(PATIENCE, || port.len() == 100);
    // 100 in the inbox, 50 held, what a 4 KiB ring holds (at most 4096 / 40 frames).
    assert!((150..=150 + 4096 / 40).contains(&accepted), "{accepted} empty messages accepted");
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(port.len(), 100);
    receive_all(&port, accepted, 0);
}

macro_rules! placements {
    ($($case:ident),* $(,)?) => {
        mod same_team {
            $(#[test] fn $case() { super::$case(false) })*
        }
        mod two_teams {
            $(#[test] fn $case() { super::$case(true) })*
        }
    };
}

placements!(
    large_messages_push_back_after_the_default_byte_bounds,
    a_message_larger_than_the_byte_bounds_gets_through_alone,
    a_flood_of_empty_messages_is_bounded_by_bytes,
);
