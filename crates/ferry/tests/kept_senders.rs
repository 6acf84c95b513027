//! What a program keeps of a peer that died must not keep the peer's
//! channel. Alone in its binary: it counts this process's descriptors and
//! mappings, which other tests running alongside would move.

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};
use common::Child;
use ferry::{Error, Team};
use std::time::Duration;

const START: Duration = Duration::from_secs(20);

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    assert_eq!(role, "server");
    let echo = team.open_named_port::<u32>("echo").unwrap();
    let _calc = CalcServer::serve(&team, "calc", CalcImpl).unwrap();
    common::say("ready");
    while let Ok(m) = echo.recv_blocking() {
        let v = m.value;
        let _ = m.reply(&v);
    }
}

/// Open descriptors and shared-memory mappings of this process.
fn holdings() -> (usize, usize) {
    (common::fd_count(), common::shared_mappings().len())
}

/// Found by the crash matrix (`ferry bench crash`): a sender caches the
/// channel to its destination's team for good, so a `Sender` or an RPC
/// client a program kept after the peer died (as programs keep them: in a
/// struct, to call again later) kept the dead peer's channel with it: the
/// channel's shared memory (rings and a payload area of up to 1 GiB of
/// address space), the peer's doorbell page, their eventfds and the
/// socket, until the program dropped the sender.
///
/// Now the cache does not own the channel: once the peer is gone and the
/// team has reclaimed its channel, what the sender kept goes with it.
#[test]
fn a_kept_sender_or_client_does_not_keep_a_dead_peers_channel() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    // Calls to a peer that dies, its senders dropped: whatever this process
    // creates once (threads' sleep sets, buffers) is there from now on.
    let calls = |kept: bool| {
        let mut child = Child::spawn("server", dir.path());
        child.expect("ready", START);
        let echo = team.connect::<u32>("echo").unwrap().with_timeout(Duration::from_secs(5));
        assert_eq!(echo.call::<u32>(&7).unwrap(), 7);
        let calc = CalcClient::bind(&team, "calc").unwrap().with_timeout(Duration::from_secs(5));
        assert_eq!(calc.add_blocking(2, 3).unwrap(), 5);
        child.kill();
        let after = echo.call::<u32>(&8);
        assert!(matches!(after, Err(Error::PeerGone { .. } | Error::NoSuchTeam(_))), "{after:?}");
        assert!(calc.add_blocking(2, 3).is_err());
        if kept {
            Some((echo, calc))
        } else {
            None
        }
    };
    drop(calls(false));
    let settle = |want: (usize, usize)| common::eventually(Duration::from_secs(5), || holdings() == want);
    std::thread::sleep(Duration::from_millis(200));
    let baseline = holdings();
    assert!(settle(baseline));

    let kept = calls(true);
    let settled = settle(baseline);
    let now = holdings();
    assert!(
        settled,
        "a sender and a client kept after their peer died hold {} descriptors and {} shared mappings: {:#?}",
        now.0 as isize - baseline.0 as isize,
        now.1 as isize - baseline.1 as isize,
        common::shared_mappings()
    );
    drop(kept);
}
