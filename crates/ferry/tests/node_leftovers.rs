//! A killed team that no live team ever met leaves its files on its node
//! only until the next team starts there.

mod common;

use common::Child;
use ferry::Team;
use std::time::Duration;

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    assert_eq!(role, "lonely");
    let _port = team.open_named_port::<u8>("lonely").unwrap();
    common::say("ready");
    std::thread::sleep(Duration::from_secs(3600));
}

/// Found by the crash matrix (`ferry bench crash`) over TCP, where a
/// killed team is its node's only team: a dead team's files are swept by
/// a survivor of its node that had a channel to it, or that looks one of
/// its names up, or by a team that later takes the same number. When none
/// of those happens (no team of the node ever met it), its lock file,
/// socket and names stayed for good. Now a team that starts sweeps the
/// node's dead teams.
#[test]
fn a_starting_team_sweeps_what_a_dead_team_left_on_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Child::spawn("lonely", dir.path());
    child.expect("ready", Duration::from_secs(20));
    let pid = child.pid();
    child.kill();
    let left = common::runtime_files(dir.path());
    assert_eq!(left, ["names/lonely".to_string(), format!("teams/{pid}.lock"), format!("teams/{pid}.sock")]);

    let team = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let me = team.id().team;
    assert_eq!(common::runtime_files(dir.path()), [format!("teams/{me}.lock"), format!("teams/{me}.sock")]);
    drop(team);
    assert!(common::runtime_files(dir.path()).is_empty());
}
