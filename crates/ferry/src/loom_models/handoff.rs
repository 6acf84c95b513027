//! The hand-off watcher's sleep against a processor waking
//! (`WatcherBell`): the watcher sleeps until poked when it sees no
//! processor awake; a processor that wakes just then must poke it, or the
//! watcher would not look for up to `FOR_GOOD` (a stuck handler's calls
//! would wait that long for a replacement).

use super::WatcherBell;
use crate::loom_models::check;
use loom::thread;
use std::sync::Arc;
use std::time::Duration;

/// A processor wakes while the watcher decides how to sleep: the watcher
/// either sees it awake (and sleeps a look's length: not at all, in the
/// model) or is poked. A watcher asleep for good after the wake is a
/// deadlock loom reports.
#[test]
fn loom_handoff_a_waking_processor_pokes_a_sleeping_watcher() {
    check(None, || {
        let bell = Arc::new(WatcherBell::new());
        let b = bell.clone();
        let processor = thread::spawn(move || b.parked(false));
        bell.sleep(Duration::from_millis(1), || false);
        processor.join().unwrap();
    });
}
