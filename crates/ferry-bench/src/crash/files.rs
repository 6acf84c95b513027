//! The files of a runtime directory (`teams/` and `names/`, see
//! `ferry::names::node`), and which of them are a given team's.

use std::path::Path;

/// Every file in `dir`'s `teams/` and `names/`, as `teams/123.lock`.
pub(crate) fn all(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = ["teams", "names"]
        .iter()
        .flat_map(|sub| {
            std::fs::read_dir(dir.join(sub))
                .into_iter()
                .flatten()
                .flatten()
                .map(move |e| format!("{sub}/{}", e.file_name().to_string_lossy()))
        })
        .collect();
    v.sort();
    v
}

/// The files of team number `team` (process `pid`) in `dir`: its lock and
/// socket, the names bound to its endpoints, and name entries its process
/// was writing (`.tmp-PID-N`).
pub(crate) fn of_team(dir: &Path, team: u32, pid: u32) -> Vec<String> {
    let tmp = format!(".tmp-{pid}-");
    all(dir)
        .into_iter()
        .filter(|f| {
            if let Some(t) = f.strip_prefix("teams/") {
                return t == format!("{team}.lock") || t == format!("{team}.sock");
            }
            let name = f.trim_start_matches("names/");
            if name.starts_with(&tmp) {
                return true;
            }
            // An entry is one line, "node.team.slot".
            std::fs::read_to_string(dir.join(f))
                .ok()
                .and_then(|s| s.trim().split('.').nth(1).map(|t| t == team.to_string()))
                .unwrap_or(false)
        })
        .map(|f| format!("{}: {f}", dir.display()))
        .collect()
}
