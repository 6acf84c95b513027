//! The runtime dir of one ferry benchmark run: shared by the run's two
//! processes (both derive it from the run id), removed by the side that
//! owns it when the case ends, even if it panics.

use std::path::PathBuf;

/// The run's runtime dir, created if missing.
pub(crate) fn run_dir(run_id: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferry-bench-{run_id}"));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Removes a directory (a run's runtime dir, a soak's files) when dropped:
/// declare it before the teams that use it, so it goes last.
pub(crate) struct RemoveDir(pub(crate) PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
