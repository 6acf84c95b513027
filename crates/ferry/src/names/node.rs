//! The node name plane: the embedded default name service of one machine.
//!
//! No daemon: all state is files under a private runtime directory.
//!
//! ```text
//! <dir>/teams/<team>.lock   flock(LOCK_EX)ed by the live team for its whole life; content: its pid
//! <dir>/teams/<team>.sock   the team's Unix socket
//! <dir>/names/<name>        one line "node.team.slot\n"
//! ```
//!
//! Liveness is the lock: the kernel drops a team's flock when the process
//! dies, so files of a team whose lock file is not locked are leftovers, and
//! whoever meets them sweeps them. Every change to `names/` is made under an
//! flock on the `names/` directory itself, so "read an entry, find it stale,
//! remove it" never removes an entry someone else has just written. Readers
//! take no lock: entries appear whole (link) and vanish whole (unlink).

use super::validate_name;
use crate::error::{Error, Result};
use crate::id::{EndpointId, MAX_TEAM};
use rustix::fs::{flock, AtFlags, FlockOperation, Mode, OFlags, CWD};
use rustix::io::Errno;
use std::ffi::OsString;
use std::fs::{self, DirBuilder, File, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A name entry being written (`.tmp-PID-N`) lives for one registration,
/// microseconds; one this old was left by a process that died meanwhile.
pub const STALE_TEMP: Duration = Duration::from_secs(60);

/// How long `acquire` keeps retrying a team lock that someone holds. Liveness
/// checks and sweeps hold it for a moment only; a live team holds it for good.
const CLAIM_PATIENCE: Duration = Duration::from_millis(1000);

/// The private directory that holds one user's node name plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeDir {
    path: PathBuf,
}

impl RuntimeDir {
    /// `$FERRY_RUNTIME_DIR` if set, else `$XDG_RUNTIME_DIR/ferry` if `XDG_RUNTIME_DIR`
    /// names a directory, else `/tmp/ferry-<uid>`; see [`RuntimeDir::at`].
    pub fn from_env() -> Result<RuntimeDir> {
        let uid = rustix::process::geteuid().as_raw();
        RuntimeDir::at(default_path(std::env::var_os("FERRY_RUNTIME_DIR"), std::env::var_os("XDG_RUNTIME_DIR"), uid))
    }

    /// Uses `path`, creating it and its `teams/` and `names/` with mode 0700.
    /// A directory we own with a looser mode is tightened; one owned by another
    /// user, or a symbolic link, is refused (`PermissionDenied`): it could be a trap.
    pub fn at(path: impl Into<PathBuf>) -> Result<RuntimeDir> {
        let path = path.into();
        for dir in [path.clone(), path.join("teams"), path.join("names")] {
            ensure_private_dir(&dir)?;
        }
        Ok(RuntimeDir { path })
    }

    /// The directory itself.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Path of the Unix socket a team listens on: `<dir>/teams/<team>.sock`.
    pub fn team_socket(&self, team: u32) -> PathBuf {
        self.path.join("teams").join(format!("{team}.sock"))
    }

    fn team_lock(&self, team: u32) -> PathBuf {
        self.path.join("teams").join(format!("{team}.lock"))
    }

    fn names_dir(&self) -> PathBuf {
        self.path.join("names")
    }

    fn name_path(&self, name: &str) -> PathBuf {
        self.names_dir().join(name)
    }
}

fn default_path(ferry: Option<OsString>, xdg: Option<OsString>, uid: u32) -> PathBuf {
    if let Some(dir) = ferry.filter(|d| !d.is_empty()) {
        return dir.into();
    }
    // The XDG spec says to ignore a relative XDG_RUNTIME_DIR.
    match xdg.map(PathBuf::from) {
        Some(xdg) if xdg.is_absolute() && xdg.is_dir() => xdg.join("ferry"),
        _ => PathBuf::from(format!("/tmp/ferry-{uid}")),
    }
}

/// The last component of `path` must be a real directory of ours: a symlink
/// is refused, or whoever planted it would have its target used (and
/// chmodded) as our private directory. The checks and the chmod act on one
/// fd opened without following links, so the path cannot be swapped between.
fn ensure_private_dir(path: &Path) -> Result<()> {
    if let Err(e) = DirBuilder::new().recursive(true).mode(0o700).create(path) {
        // Something that is not a directory is reported just below.
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(Error::io("create runtime directory")(e));
        }
    }
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dir = match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(dir) => dir,
        // Tell the usual refusals apart (a symlink fails with ELOOP or ENOTDIR).
        Err(e) => {
            return Err(match fs::symlink_metadata(path) {
                Ok(md) if md.file_type().is_symlink() => Error::Io {
                    context: "runtime directory path is a symbolic link",
                    source: io::Error::new(io::ErrorKind::PermissionDenied, format!("refused: {}", path.display())),
                },
                Ok(md) if !md.is_dir() => os_error("runtime directory path is not a directory", libc::ENOTDIR),
                _ => Error::io("open runtime directory")(e.into()),
            })
        }
    };
    let st = rustix::fs::fstat(&dir).map_err(|e| Error::io("inspect runtime directory")(e.into()))?;
    if st.st_uid != rustix::process::geteuid().as_raw() {
        return Err(os_error("runtime directory is owned by another user", libc::EACCES));
    }
    // Also covers a umask that stripped bits we want.
    if st.st_mode & 0o777 != 0o700 {
        rustix::fs::fchmod(&dir, Mode::RWXU).map_err(|e| Error::io("make runtime directory private")(e.into()))?;
    }
    Ok(())
}

fn os_error(context: &'static str, errno: i32) -> Error {
    Error::Io { context, source: io::Error::from_raw_os_error(errno) }
}

/// A non-blocking flock: `Ok(false)` when someone else holds a conflicting lock.
fn try_flock(file: &File, op: FlockOperation) -> io::Result<bool> {
    match flock(file, op) {
        Ok(()) => Ok(true),
        Err(Errno::WOULDBLOCK) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Opens (creating it if need be) and exclusively locks `<team>.lock`, making
/// sure the locked file is still the one at the path: a sweeper may unlink it
/// between our open and our flock, and a lock on an unlinked file guards
/// nothing. `Ok(None)` when someone else holds the lock, or (`create`
/// false: a sweep) when there is no lock file: its team left cleanly, and
/// creating one would leave a file behind.
fn claim(dir: &RuntimeDir, team: u32, create: bool) -> Result<Option<File>> {
    let path = dir.team_lock(team);
    loop {
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            // Never truncate before holding the lock: it may be a live team's pid.
            .truncate(false)
            .mode(0o600)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if !create && e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("open team lock file")(e)),
        };
        if !try_flock(&file, FlockOperation::NonBlockingLockExclusive).map_err(Error::io("lock team lock file"))? {
            return Ok(None);
        }
        let held = file.metadata().map_err(Error::io("inspect team lock file"))?;
        match fs::metadata(&path) {
            Ok(md) if (md.dev(), md.ino()) == (held.dev(), held.ino()) => {
                if held.mode() & 0o777 != 0o600 {
                    file.set_permissions(Permissions::from_mode(0o600)).map_err(Error::io("chmod team lock file"))?;
                }
                return Ok(Some(file));
            }
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::io("inspect team lock file")(e)),
        }
    }
}

/// Whether some process holds `team`'s lock. Only a missing lock file or a
/// granted shared lock means dead; any other doubt counts as alive, since a
/// wrong "dead" would delete a live team's names.
fn team_alive(dir: &RuntimeDir, team: u32) -> bool {
    if team > MAX_TEAM {
        return false;
    }
    match File::open(dir.team_lock(team)) {
        // The shared lock is released when `file` closes.
        Ok(file) => !matches!(try_flock(&file, FlockOperation::NonBlockingLockShared), Ok(true)),
        Err(e) => e.kind() != io::ErrorKind::NotFound,
    }
}

/// A live team's exclusive claim on its team number on this node: an
/// flock(LOCK_EX) on `<dir>/teams/<team>.lock` held for the lease's whole life.
/// The kernel drops it when the process dies, which is how everyone else tells
/// a dead team's leftovers from a live team's files.
#[derive(Debug)]
pub struct TeamLease {
    dir: RuntimeDir,
    team: u32,
    lock: File,
}

impl TeamLease {
    /// Claims `team`, first sweeping whatever a dead team with the same number
    /// left behind. Fails with `AddrInUse` ("team number in use") while a live
    /// process holds the number.
    pub fn acquire(dir: &RuntimeDir, team: u32) -> Result<TeamLease> {
        TeamLease::acquire_within(dir, team, CLAIM_PATIENCE)
    }

    /// [`TeamLease::acquire`], retrying a held lock for at most `patience`
    /// (none: a team looking for a free number among many tries each once).
    pub fn acquire_within(dir: &RuntimeDir, team: u32, patience: Duration) -> Result<TeamLease> {
        if team > MAX_TEAM {
            return Err(os_error("team number out of range", libc::EINVAL));
        }
        let give_up = Instant::now() + patience;
        let lock = loop {
            if let Some(lock) = claim(dir, team, true)? {
                break lock;
            }
            if Instant::now() >= give_up {
                return Err(os_error("team number in use", libc::EADDRINUSE));
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let lease = TeamLease { dir: dir.clone(), team, lock };
        // We hold the number now, so any file already bearing it is a dead team's.
        remove_team_files(dir, team, false);
        lease.lock.set_len(0).map_err(Error::io("write team lock file"))?;
        writeln!(&lease.lock, "{}", std::process::id()).map_err(Error::io("write team lock file"))?;
        Ok(lease)
    }

    /// The team number held.
    pub fn team(&self) -> u32 {
        self.team
    }

    /// The runtime directory the lease is in.
    pub fn dir(&self) -> &RuntimeDir {
        &self.dir
    }

    /// The locked file: a bind's hello carries it, for the acceptor to see
    /// that the connector holds the lease (see [`NodeNames::holds_lease`]).
    pub fn lock_file(&self) -> &File {
        &self.lock
    }
}

impl Drop for TeamLease {
    fn drop(&mut self) {
        // The lock file goes last and while still locked (the fd closes after
        // this body), so nobody can claim the number half-way through.
        remove_team_files(&self.dir, self.team, true);
    }
}

/// Removes `team`'s names, socket and (if `lock_file`) lock file. The caller
/// holds the team's lock, so nothing it removes can belong to a live team.
fn remove_team_files(dir: &RuntimeDir, team: u32, lock_file: bool) {
    match NamesLock::take(dir) {
        Ok(guard) => guard.remove_team_names(team),
        Err(e) => tracing::debug!(team, error = %e, "cannot lock names to sweep them"),
    }
    remove_file_if_exists(&dir.team_socket(team));
    if lock_file {
        remove_file_if_exists(&dir.team_lock(team));
    }
}

fn remove_file_if_exists(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        if e.kind() != io::ErrorKind::NotFound {
            tracing::debug!(path = %path.display(), error = %e, "cannot remove");
        }
    }
}

/// One name file as read: its endpoint, or `None` if its content is garbage.
fn read_entry(path: &Path) -> io::Result<Option<Option<EndpointId>>> {
    match fs::read(path) {
        Ok(bytes) => {
            Ok(Some(std::str::from_utf8(&bytes).ok().and_then(|s| s.strip_suffix('\n')).and_then(|s| s.parse().ok())))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Exclusive flock on the `names/` directory, held while changing it.
struct NamesLock<'a> {
    dir: &'a RuntimeDir,
    _fd: File,
}

impl<'a> NamesLock<'a> {
    fn take(dir: &'a RuntimeDir) -> Result<NamesLock<'a>> {
        let fd = File::open(dir.names_dir()).map_err(Error::io("open names directory"))?;
        loop {
            match flock(&fd, FlockOperation::LockExclusive) {
                Ok(()) => return Ok(NamesLock { dir, _fd: fd }),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(Error::io("lock names directory")(e.into())),
            }
        }
    }

    /// The live binding of `name`, removing the entry if it is stale or garbage.
    /// Returns the team of a removed stale entry too, for the caller to sweep.
    fn resolve(&self, name: &str) -> Result<Resolved> {
        let path = self.dir.name_path(name);
        match read_entry(&path).map_err(Error::io("read name entry"))? {
            None => Ok(Resolved::Absent),
            Some(Some(ep)) if team_alive(self.dir, ep.team()) => Ok(Resolved::Live(ep)),
            Some(stale) => {
                // Safe under the lock: no one can bind the name meanwhile, and a
                // team that takes this number now sweeps such entries anyway.
                tracing::debug!(name, owner = ?stale, "removing stale name");
                fs::remove_file(&path).map_err(Error::io("remove stale name entry"))?;
                Ok(Resolved::Removed(stale.map(|ep| ep.team())))
            }
        }
    }

    fn remove_team_names(&self, team: u32) {
        let Ok(entries) = fs::read_dir(self.dir.names_dir()) else { return };
        for entry in entries.flatten() {
            let file_name = entry.file_name();
            // Skips temp files (they start with '.') and anything odd.
            let Some(name) = file_name.to_str().filter(|n| validate_name(n).is_ok()) else { continue };
            if let Ok(Some(Some(ep))) = read_entry(&entry.path()) {
                if ep.team() == team {
                    tracing::debug!(name, team, "removing name of swept team");
                    remove_file_if_exists(&entry.path());
                }
            }
        }
    }
}

enum Resolved {
    Absent,
    Live(EndpointId),
    /// A stale entry was removed; the team it named, if its content was valid.
    Removed(Option<u32>),
}

/// A name entry being written in full before it gets its name (`link`), so
/// readers never see half of one. Unnamed (`O_TMPFILE`) where the kernel
/// and file system allow it: a process that dies before the link leaves
/// nothing behind. Else a temporary file `.tmp-PID-N`, removed on drop
/// (after the link, or on failure); one whose process died first is swept
/// once [`STALE_TEMP`] old (`NodeNames::sweep_dead_teams`).
enum TempEntry {
    Unnamed(File),
    Named(PathBuf),
}

impl TempEntry {
    fn write(dir: &RuntimeDir, ep: EndpointId) -> Result<TempEntry> {
        // A named one is removed (on drop) if what follows fails.
        let (file, named) = match Self::unnamed(dir)? {
            Some(file) => (file, None),
            None => {
                let (file, path) = Self::named(dir)?;
                (file, Some(TempEntry::Named(path)))
            }
        };
        // The umask may have stripped bits; the mode must be exactly 0600.
        file.set_permissions(Permissions::from_mode(0o600)).map_err(Error::io("chmod name entry"))?;
        writeln!(&file, "{ep}").map_err(Error::io("write name entry"))?;
        Ok(match named {
            Some(entry) => entry,
            None => TempEntry::Unnamed(file),
        })
    }

    /// An unnamed file in `names/`; `None` where that cannot be made, or
    /// not linked later (no `/proc` to link it through).
    fn unnamed(dir: &RuntimeDir) -> Result<Option<File>> {
        if !Path::new("/proc/self/fd").is_dir() {
            return Ok(None);
        }
        let flags = OFlags::WRONLY | OFlags::TMPFILE | OFlags::CLOEXEC;
        match rustix::fs::open(dir.names_dir(), flags, Mode::RUSR | Mode::WUSR) {
            Ok(fd) => Ok(Some(File::from(fd))),
            // An old kernel, or a file system without unnamed files.
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => Ok(None),
            Err(e) => Err(Error::io("create name entry")(e.into())),
        }
    }

    fn named(dir: &RuntimeDir) -> Result<(File, PathBuf)> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        loop {
            let seq = SEQ.fetch_add(1, Ordering::Relaxed);
            // Starts with '.', so it can never collide with a name.
            let path = dir.names_dir().join(format!(".tmp-{}-{seq}", std::process::id()));
            match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
                Ok(file) => return Ok((file, path)),
                // A crashed process with our pid left one behind: take the next number.
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(Error::io("create name entry")(e)),
            }
        }
    }

    /// Gives the entry the name `path`; `AlreadyExists` if it is taken.
    fn link(&self, path: &Path) -> io::Result<()> {
        match self {
            TempEntry::Named(temp) => fs::hard_link(temp, path),
            TempEntry::Unnamed(file) => {
                let me = format!("/proc/self/fd/{}", file.as_raw_fd());
                rustix::fs::linkat(CWD, me.as_str(), CWD, path, AtFlags::SYMLINK_FOLLOW).map_err(io::Error::from)
            }
        }
    }
}

impl Drop for TempEntry {
    fn drop(&mut self) {
        if let TempEntry::Named(temp) = self {
            remove_file_if_exists(temp);
        }
    }
}

/// The node name plane as seen from one team.
#[derive(Clone, Debug)]
pub struct NodeNames {
    dir: RuntimeDir,
}

impl NodeNames {
    /// The plane kept in `dir`.
    pub fn new(dir: RuntimeDir) -> NodeNames {
        NodeNames { dir }
    }

    /// The runtime directory holding the plane.
    pub fn dir(&self) -> &RuntimeDir {
        &self.dir
    }

    /// The pid a live team wrote into its lock file (how a bind checks that
    /// the process on a socket is the team it claims to be); `None` if the
    /// team is not alive or the file says nothing sensible.
    pub fn team_pid(&self, team: u32) -> Option<u32> {
        if !self.team_alive(team) {
            return None;
        }
        std::fs::read_to_string(self.dir.team_lock(team)).ok()?.trim().parse().ok()
    }

    /// Whether `lock` (a descriptor a bind's connector sent) is the open
    /// lock file by which a live team holds `team`'s lease: the file at
    /// `teams/<team>.lock`, locked by someone (a fresh open cannot take a
    /// shared lock), and by `lock` itself (an exclusive lock on it is
    /// granted again: a lock belongs to the open file, which only the team
    /// and those it sent it to have). Unlike a pid, this does not depend on
    /// the PID namespace that looks (containers sharing a runtime directory).
    pub fn holds_lease(&self, team: u32, lock: &File) -> bool {
        let (Ok(held), Ok(at)) = (lock.metadata(), fs::metadata(self.dir.team_lock(team))) else { return false };
        (held.dev(), held.ino()) == (at.dev(), at.ino())
            && self.team_alive(team)
            && matches!(try_flock(lock, FlockOperation::NonBlockingLockExclusive), Ok(true))
    }

    /// Binds `name` to `ep`, an endpoint of `lease`'s team. `NameTaken` while
    /// the name is bound by a live team (this one included); a dead team's
    /// binding is replaced.
    pub fn register(&self, lease: &TeamLease, name: &str, ep: EndpointId) -> Result<()> {
        validate_name(name)?;
        if ep.team() != lease.team() {
            return Err(os_error("endpoint to register is not of the lease's team", libc::EINVAL));
        }
        // Written in full before it gets its name, so readers never see half of it.
        let temp = TempEntry::write(&self.dir, ep)?;
        let path = self.dir.name_path(name);
        let names = NamesLock::take(&self.dir)?;
        loop {
            match temp.link(&path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => match names.resolve(name)? {
                    Resolved::Live(owner) => return Err(Error::NameTaken { name: name.to_string(), owner }),
                    // The stale entry is gone: link again.
                    Resolved::Absent | Resolved::Removed(_) => continue,
                },
                Err(e) => return Err(Error::io("bind name")(e)),
            }
        }
    }

    /// The endpoint bound to `name`. A binding of a dead team, or one that is
    /// not a valid id, is removed and reported as `NameNotFound` (and the dead
    /// team's other leftovers are swept).
    pub fn lookup(&self, name: &str) -> Result<EndpointId> {
        validate_name(name)?;
        // Fast path without the names lock: most bindings are live.
        match read_entry(&self.dir.name_path(name)).map_err(Error::io("read name entry"))? {
            None => return Err(Error::NameNotFound(name.to_string())),
            Some(Some(ep)) if team_alive(&self.dir, ep.team()) => return Ok(ep),
            Some(_) => {}
        }
        // Looks stale: decide again under the lock, where the decision holds.
        let resolved = NamesLock::take(&self.dir)?.resolve(name)?;
        match resolved {
            Resolved::Live(ep) => Ok(ep),
            Resolved::Removed(Some(team)) => {
                self.sweep_team(team);
                Err(Error::NameNotFound(name.to_string()))
            }
            Resolved::Absent | Resolved::Removed(None) => Err(Error::NameNotFound(name.to_string())),
        }
    }

    /// Removes `name` if it is bound to an endpoint of `lease`'s team;
    /// `NameNotFound` otherwise.
    pub fn unregister(&self, lease: &TeamLease, name: &str) -> Result<()> {
        validate_name(name)?;
        let path = self.dir.name_path(name);
        let _names = NamesLock::take(&self.dir)?;
        match read_entry(&path).map_err(Error::io("read name entry"))? {
            Some(Some(ep)) if ep.team() == lease.team() => {
                fs::remove_file(&path).map_err(Error::io("remove name entry"))
            }
            _ => Err(Error::NameNotFound(name.to_string())),
        }
    }

    /// All live bindings, sorted by name; stale ones are swept on the way and
    /// entries that cannot be read (odd files) are skipped.
    pub fn list(&self) -> Result<Vec<(String, EndpointId)>> {
        let entries = fs::read_dir(self.dir.names_dir()).map_err(Error::io("list names directory"))?;
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else { continue };
            if validate_name(&name).is_err() {
                continue;
            }
            if let Ok(ep) = self.lookup(&name) {
                out.push((name, ep));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Whether a team with this number currently holds its lease on this node.
    pub fn team_alive(&self, team: u32) -> bool {
        team_alive(&self.dir, team)
    }

    /// Whether `team` (alive or dead) has a lock file here: a team that
    /// left cleanly removed it with everything else.
    pub fn team_has_files(&self, team: u32) -> bool {
        team <= MAX_TEAM && self.dir.team_lock(team).exists()
    }

    /// Sweeps the leftovers of every dead team of this node: the lock
    /// file, socket and names of a team that was killed and that no live
    /// team has met since (none had a channel to it to find it gone, none
    /// looked one of its names up), and the name entries that processes
    /// which died while registering were writing (`.tmp-PID-N`, older
    /// than [`STALE_TEMP`]). A team calls it as it starts, so a dead
    /// team's files last at most until the next team starts on its node.
    pub fn sweep_dead_teams(&self) {
        let teams = fs::read_dir(self.dir.path.join("teams")).into_iter().flatten().flatten();
        for entry in teams {
            let name = entry.file_name();
            let team = name.to_str().and_then(|n| n.strip_suffix(".lock")).and_then(|n| n.parse::<u32>().ok());
            if let Some(team) = team.filter(|&t| !self.team_alive(t)) {
                self.sweep_team(team);
            }
        }
        for entry in fs::read_dir(self.dir.names_dir()).into_iter().flatten().flatten() {
            let temp = entry.file_name().to_str().is_some_and(|n| n.starts_with(".tmp-"));
            let age = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
            if temp && age.is_some_and(|a| a > STALE_TEMP) {
                remove_file_if_exists(&entry.path());
            }
        }
    }

    /// If `team` is dead, removes every name bound to it, its socket file and
    /// its lock file. No-op while it is alive.
    pub fn sweep_team(&self, team: u32) {
        if team > MAX_TEAM {
            return;
        }
        // Holding the team's lock while sweeping keeps a team that takes the
        // number meanwhile from losing its fresh files; dropping the temporary
        // lease removes the leftovers, lock file last.
        let give_up = Instant::now() + CLAIM_PATIENCE;
        loop {
            match claim(&self.dir, team, false) {
                Ok(Some(lock)) => {
                    tracing::debug!(team, dir = %self.dir.path.display(), "sweeping dead team");
                    drop(TeamLease { dir: self.dir.clone(), team, lock });
                    return;
                }
                // Swept already; or held exclusively: by a team that took the
                // number since (its files are its own), or by another
                // sweeper, which finishes the job.
                Ok(None) if !self.team_has_files(team) || self.team_alive(team) => return,
                // Still dead, so the claim met a shared lock: someone looking
                // at the team's liveness (a look-up of one of its names, a
                // bind), for a moment. Again, or its files would stay.
                Ok(None) if Instant::now() < give_up => std::thread::sleep(Duration::from_micros(200)),
                Ok(None) => {
                    tracing::debug!(team, "dead team not swept: its lock is looked at without end");
                    return;
                }
                Err(e) => {
                    tracing::debug!(team, error = %e, "cannot sweep team");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::atomic::AtomicBool;

    fn fresh() -> (tempfile::TempDir, RuntimeDir) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = RuntimeDir::at(tmp.path().join("rt")).unwrap();
        (tmp, dir)
    }

    fn ep(team: u32, slot: u32) -> EndpointId {
        crate::id::TeamId { node: 0, team, incarnation: 1 }.endpoint(slot).unwrap()
    }

    /// A bind's connector proves its team by the open lock file it holds
    /// the lease by (issue 15, defect 2): that file is accepted; the same
    /// file opened anew (anyone who can read it can), another team's, or
    /// a dead team's are not.
    #[test]
    fn only_the_lease_holders_open_lock_file_proves_the_team() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let lease = TeamLease::acquire(&dir, 5).unwrap();
        let other = TeamLease::acquire(&dir, 6).unwrap();
        let held = lease.lock_file().try_clone().unwrap();
        assert!(names.holds_lease(5, &held));
        // Still held by the team after the check (and checked again).
        assert!(names.team_alive(5) && names.holds_lease(5, &held));
        let anew = File::open(dir.team_lock(5)).unwrap();
        assert!(!names.holds_lease(5, &anew));
        assert!(!names.holds_lease(5, other.lock_file()));
        drop((held, lease));
        let stale = File::create(dir.team_lock(5)).unwrap();
        assert!(!names.holds_lease(5, &stale), "no live team holds 5's lease");
    }

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o777
    }

    fn dir_is_empty(path: PathBuf) -> bool {
        let left: Vec<_> = fs::read_dir(&path).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "{} still holds {left:?}", path.display());
        true
    }

    fn assert_all_clean(dir: &RuntimeDir) {
        assert!(dir_is_empty(dir.path().join("teams")));
        assert!(dir_is_empty(dir.names_dir()));
    }

    fn not_found<T: std::fmt::Debug>(r: Result<T>) -> bool {
        matches!(r, Err(Error::NameNotFound(_)))
    }

    #[test]
    fn register_lookup_unregister_list() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let lease = TeamLease::acquire(&dir, 7).unwrap();
        let other = TeamLease::acquire(&dir, 8).unwrap();
        assert!(not_found(names.lookup("echo")));
        names.register(&lease, "echo", ep(7, 1)).unwrap();
        names.register(&lease, "beta", ep(7, 2)).unwrap();
        names.register(&other, "alpha", ep(8, 1)).unwrap();
        assert_eq!(names.lookup("echo").unwrap(), ep(7, 1));
        assert_eq!(fs::read_to_string(dir.name_path("echo")).unwrap(), "0.7.1#00000001\n");
        assert_eq!(
            names.list().unwrap(),
            vec![("alpha".into(), ep(8, 1)), ("beta".into(), ep(7, 2)), ("echo".into(), ep(7, 1))]
        );
        // Only the owning team may unregister.
        assert!(not_found(names.unregister(&other, "echo")));
        names.unregister(&lease, "echo").unwrap();
        assert!(not_found(names.lookup("echo")));
        assert!(not_found(names.unregister(&lease, "echo")));
        // The endpoint must be of the lease's team.
        assert!(matches!(names.register(&lease, "x", ep(8, 1)), Err(Error::Io { .. })));
        // No temp files are left behind.
        assert_eq!(fs::read_dir(dir.names_dir()).unwrap().count(), 2);
    }

    #[test]
    fn live_owner_keeps_its_name() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let a = TeamLease::acquire(&dir, 1).unwrap();
        let b = TeamLease::acquire(&dir, 2).unwrap();
        names.register(&a, "svc", ep(1, 5)).unwrap();
        let taken = names.register(&b, "svc", ep(2, 5));
        assert!(matches!(taken, Err(Error::NameTaken { name, owner }) if name == "svc" && owner == ep(1, 5)));
        // Its own lease counts as alive too.
        assert!(matches!(names.register(&a, "svc", ep(1, 6)), Err(Error::NameTaken { .. })));
        assert_eq!(names.lookup("svc").unwrap(), ep(1, 5));
        // Once the owner is gone the name is free.
        drop(a);
        names.register(&b, "svc", ep(2, 5)).unwrap();
        assert_eq!(names.lookup("svc").unwrap(), ep(2, 5));
    }

    #[test]
    fn concurrent_registrations_have_one_winner() {
        let (_tmp, dir) = fresh();
        let leases: Vec<_> = (1..=4).map(|t| TeamLease::acquire(&dir, t).unwrap()).collect();
        let results: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = leases
                .iter()
                .map(|lease| {
                    let names = NodeNames::new(dir.clone());
                    s.spawn(move || names.register(lease, "contested", ep(lease.team(), 1)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
        assert!(results.iter().all(|r| r.is_ok() || matches!(r, Err(Error::NameTaken { .. }))));
    }

    #[test]
    fn invalid_names_are_refused() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let lease = TeamLease::acquire(&dir, 1).unwrap();
        for bad in ["", ".tmp-1-1", "..", "a/b", "../x", &"n".repeat(201)] {
            assert!(matches!(names.register(&lease, bad, ep(1, 1)), Err(Error::InvalidName(_))), "{bad:?}");
            assert!(matches!(names.lookup(bad), Err(Error::InvalidName(_))), "{bad:?}");
            assert!(matches!(names.unregister(&lease, bad), Err(Error::InvalidName(_))), "{bad:?}");
        }
        assert!(TeamLease::acquire(&dir, MAX_TEAM + 1).is_err());
    }

    #[test]
    fn modes_are_private() {
        let (_tmp, dir) = fresh();
        for d in [dir.path().to_path_buf(), dir.path().join("teams"), dir.names_dir()] {
            assert_eq!(mode(&d), 0o700, "{}", d.display());
        }
        let lease = TeamLease::acquire(&dir, 3).unwrap();
        NodeNames::new(dir.clone()).register(&lease, "m", ep(3, 1)).unwrap();
        assert_eq!(mode(&dir.team_lock(3)), 0o600);
        assert_eq!(mode(&dir.name_path("m")), 0o600);
        assert_eq!(fs::read_to_string(dir.team_lock(3)).unwrap(), format!("{}\n", std::process::id()));
        // A looser mode on a directory we own is tightened.
        drop(lease);
        fs::set_permissions(dir.path(), Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dir.names_dir(), Permissions::from_mode(0o777)).unwrap();
        RuntimeDir::at(dir.path()).unwrap();
        assert_eq!(mode(dir.path()), 0o700);
        assert_eq!(mode(&dir.names_dir()), 0o700);
    }

    #[test]
    fn foreign_or_odd_runtime_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        fs::write(&file, "").unwrap();
        assert!(matches!(RuntimeDir::at(&file), Err(Error::Io { .. })));
        // Only root can hand a directory to another user.
        if rustix::process::geteuid().is_root() {
            let foreign = tmp.path().join("foreign");
            fs::create_dir(&foreign).unwrap();
            std::os::unix::fs::chown(&foreign, Some(12345), None).unwrap();
            match RuntimeDir::at(&foreign) {
                Err(Error::Io { source, .. }) => assert_eq!(source.kind(), io::ErrorKind::PermissionDenied),
                other => panic!("expected PermissionDenied, got {other:?}"),
            }
        }
    }

    /// A runtime directory path (or its `teams/`/`names/`) planted as a
    /// symlink must not get its target used or chmodded.
    #[test]
    fn symlinked_runtime_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::set_permissions(&target, Permissions::from_mode(0o755)).unwrap();
        let refused = |path: &Path| match RuntimeDir::at(path) {
            Err(Error::Io { source, .. }) => {
                assert_eq!(source.kind(), io::ErrorKind::PermissionDenied);
                assert!(source.to_string().contains(&*path.to_string_lossy()), "{source}");
            }
            other => panic!("expected a refusal of {}, got {other:?}", path.display()),
        };
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        refused(&link);
        assert_eq!(mode(&target), 0o755);
        assert!(dir_is_empty(target.clone()));
        // Below a real runtime directory.
        let real = tmp.path().join("real");
        RuntimeDir::at(&real).unwrap();
        fs::remove_dir(real.join("names")).unwrap();
        std::os::unix::fs::symlink(&target, real.join("names")).unwrap();
        refused(&real);
        assert_eq!(mode(&target), 0o755);
        // Dangling: nothing is made at the target either.
        let dangling = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("nowhere"), &dangling).unwrap();
        refused(&dangling);
        assert!(!tmp.path().join("nowhere").exists());
    }

    #[test]
    fn default_path_order() {
        let tmp = tempfile::tempdir().unwrap();
        let xdg = Some(tmp.path().as_os_str().to_owned());
        assert_eq!(default_path(Some("/x/rt".into()), xdg.clone(), 5), PathBuf::from("/x/rt"));
        assert_eq!(default_path(None, xdg.clone(), 5), tmp.path().join("ferry"));
        assert_eq!(default_path(Some("".into()), xdg, 5), tmp.path().join("ferry"));
        assert_eq!(default_path(None, Some("/no/such/dir".into()), 5), PathBuf::from("/tmp/ferry-5"));
        assert_eq!(default_path(None, Some("relative".into()), 5), PathBuf::from("/tmp/ferry-5"));
        assert_eq!(default_path(None, None, 1000), PathBuf::from("/tmp/ferry-1000"));
    }

    #[test]
    fn lease_drop_removes_all_files() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let lease = TeamLease::acquire(&dir, 4).unwrap();
        let other = TeamLease::acquire(&dir, 6).unwrap();
        names.register(&lease, "one", ep(4, 1)).unwrap();
        names.register(&lease, "two", ep(4, 2)).unwrap();
        names.register(&other, "keep", ep(6, 1)).unwrap();
        File::create(dir.team_socket(4)).unwrap();
        assert!(names.team_alive(4));
        drop(lease);
        assert!(!names.team_alive(4));
        assert_eq!(names.list().unwrap(), vec![("keep".into(), ep(6, 1))]);
        drop(other);
        assert_all_clean(&dir);
    }

    #[test]
    fn acquire_sweeps_a_dead_teams_leftovers() {
        let (_tmp, dir) = fresh();
        // What a killed team 3 leaves: an unlocked lock file, a socket, names.
        fs::write(dir.team_lock(3), "999999\n").unwrap();
        File::create(dir.team_socket(3)).unwrap();
        fs::write(dir.name_path("old"), "0.3.1#00000001\n").unwrap();
        fs::write(dir.name_path("elsewhere"), "0.4.1#00000001\n").unwrap();
        let names = NodeNames::new(dir.clone());
        assert!(!names.team_alive(3));
        let lease = TeamLease::acquire(&dir, 3).unwrap();
        assert!(!dir.name_path("old").exists());
        assert!(!dir.team_socket(3).exists());
        assert_eq!(fs::read_to_string(dir.team_lock(3)).unwrap(), format!("{}\n", std::process::id()));
        // Another dead team's entry is not this acquire's business.
        assert!(dir.name_path("elsewhere").exists());
        // ... but lookup sweeps it, and register replaces a stale binding.
        assert!(not_found(names.lookup("elsewhere")));
        assert!(!dir.name_path("elsewhere").exists());
        fs::write(dir.name_path("taken-by-dead"), "0.9.1#00000001\n").unwrap();
        names.register(&lease, "taken-by-dead", ep(3, 2)).unwrap();
        assert_eq!(names.lookup("taken-by-dead").unwrap(), ep(3, 2));
        drop(lease);
        assert_all_clean(&dir);
    }

    #[test]
    fn dead_teams_are_swept_whoever_they_were() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let live = TeamLease::acquire(&dir, 8).unwrap();
        names.register(&live, "alive", ep(8, 1)).unwrap();
        File::create(dir.team_socket(8)).unwrap();
        // What killed teams 3 and 4 left: unlocked lock files, sockets, names;
        // and name entries a dead process was writing, one old, one fresh.
        for t in [3, 4] {
            fs::write(dir.team_lock(t), "999999\n").unwrap();
            File::create(dir.team_socket(t)).unwrap();
            fs::write(dir.name_path(&format!("dead{t}")), format!("0.{t}.1#00000001\n")).unwrap();
        }
        let old = dir.names_dir().join(".tmp-999999-1");
        fs::write(&old, "0.3.2#00000001\n").unwrap();
        let an_hour_ago = std::time::SystemTime::now() - Duration::from_secs(3600);
        File::options().write(true).open(&old).unwrap().set_modified(an_hour_ago).unwrap();
        let fresh_temp = dir.names_dir().join(".tmp-999999-2");
        fs::write(&fresh_temp, "0.3.3#00000001\n").unwrap();
        names.sweep_dead_teams();
        for t in [3, 4] {
            assert!(!dir.team_lock(t).exists() && !dir.team_socket(t).exists());
            assert!(!dir.name_path(&format!("dead{t}")).exists());
        }
        assert!(!old.exists());
        // A live team's files, and an entry that may be being written, stay.
        assert!(fresh_temp.exists());
        assert!(dir.team_lock(8).exists() && dir.team_socket(8).exists());
        assert_eq!(names.lookup("alive").unwrap(), ep(8, 1));
        fs::remove_file(fresh_temp).unwrap();
        drop(live);
        assert_all_clean(&dir);
    }

    /// Found by the crash matrix: a sweep claims a dead team's lock
    /// exclusively without waiting, and gave up when the claim failed. But
    /// every look at a team's liveness (each look-up of its names, each
    /// bind) holds a shared lock on it for a moment, so while survivors
    /// were looking the dead team's names up, the survivors' sweeps could
    /// all fail, and its files stayed. A sweep now tries again while the
    /// team still looks dead.
    #[test]
    fn a_sweep_is_not_put_off_by_looks_at_the_teams_liveness() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let dead = 10..410;
        for t in dead.clone() {
            fs::write(dir.team_lock(t), "999999\n").unwrap();
            File::create(dir.team_socket(t)).unwrap();
        }
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        for t in dead.clone() {
                            // (A team being swept looks alive: the sweeper holds its lock.)
                            names.team_alive(t);
                        }
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(20));
            for t in dead.clone() {
                names.sweep_team(t);
            }
            stop.store(true, Ordering::Relaxed);
        });
        let left: Vec<u32> = dead.filter(|&t| dir.team_lock(t).exists()).collect();
        assert!(left.is_empty(), "dead teams {left:?} were not swept");
        assert_all_clean(&dir);
    }

    #[test]
    fn acquire_of_a_live_number_fails() {
        let (_tmp, dir) = fresh();
        let lease = TeamLease::acquire(&dir, 11).unwrap();
        match TeamLease::acquire(&dir, 11) {
            Err(Error::Io { context, source }) => {
                assert_eq!(context, "team number in use");
                assert_eq!(source.kind(), io::ErrorKind::AddrInUse);
            }
            other => panic!("expected AddrInUse, got {other:?}"),
        }
        // A sweep of a live team is a no-op.
        NodeNames::new(dir.clone()).sweep_team(11);
        assert!(dir.team_lock(11).exists());
        drop(lease);
        TeamLease::acquire(&dir, 11).unwrap();
    }

    #[test]
    fn garbage_and_odd_files_are_skipped() {
        let (_tmp, dir) = fresh();
        let names = NodeNames::new(dir.clone());
        let lease = TeamLease::acquire(&dir, 2).unwrap();
        names.register(&lease, "good", ep(2, 1)).unwrap();
        fs::write(dir.name_path("junk"), "not an id").unwrap();
        fs::write(dir.name_path("no-newline"), "0.2.1").unwrap();
        fs::create_dir(dir.name_path("a-dir")).unwrap();
        fs::write(dir.names_dir().join(".hidden"), "0.2.1#00000001\n").unwrap();
        fs::write(dir.path().join("teams").join("stray"), "").unwrap();
        assert!(not_found(names.lookup("junk")));
        assert!(!dir.name_path("junk").exists());
        assert_eq!(names.list().unwrap(), vec![("good".into(), ep(2, 1))]);
        assert!(!dir.name_path("no-newline").exists());
        assert!(dir.name_path("a-dir").is_dir());
        drop(lease);
        assert!(!dir.name_path("good").exists());
    }

    #[test]
    fn sweepers_never_hurt_a_live_team() {
        let (_tmp, dir) = fresh();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                let names = NodeNames::new(dir.clone());
                let stop = &stop;
                s.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        names.sweep_team(9);
                        let _ = names.lookup("racer");
                        let _ = names.team_alive(9);
                        // Two cores: leave the claimer room to run.
                        std::thread::yield_now();
                    }
                });
            }
            let names = NodeNames::new(dir.clone());
            for i in 0..200 {
                let lease = TeamLease::acquire(&dir, 9).unwrap();
                names.register(&lease, "racer", ep(9, i)).unwrap();
                // The lock we hold is on the file at the path, and our files survive the sweepers.
                let held = lease.lock.metadata().unwrap();
                let at_path = fs::metadata(dir.team_lock(9)).unwrap();
                assert_eq!((held.dev(), held.ino()), (at_path.dev(), at_path.ino()));
                assert_eq!(names.lookup("racer").unwrap(), ep(9, i));
                assert!(names.team_alive(9));
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert_all_clean(&dir);
    }

    const HOLDER_DIR: &str = "FERRY_NAMES_TEST_HOLDER_DIR";
    const HOLDER_READY: &str = "ferry-names-holder-ready";

    /// Run as a child process by `dead_owner_entries_disappear`: holds a real
    /// lease with names and a socket until killed.
    #[test]
    #[ignore = "helper process for dead_owner_entries_disappear"]
    fn holder_process() {
        let Some(path) = std::env::var_os(HOLDER_DIR) else { return };
        let dir = RuntimeDir::at(path).unwrap();
        let lease = TeamLease::acquire(&dir, 77).unwrap();
        let names = NodeNames::new(dir.clone());
        names.register(&lease, "held", ep(77, 1)).unwrap();
        names.register(&lease, "held-too", ep(77, 2)).unwrap();
        File::create(dir.team_socket(77)).unwrap();
        println!("{HOLDER_READY}");
        io::stdout().flush().unwrap();
        // Until killed (or the parent goes away and closes our stdin).
        let _ = io::Read::read_to_end(&mut io::stdin(), &mut Vec::new());
    }

    #[test]
    fn dead_owner_entries_disappear() {
        let (_tmp, dir) = fresh();
        let module = module_path!().split_once("::").unwrap().1;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([&format!("{module}::holder_process"), "--exact", "--ignored", "--nocapture"])
            .env(HOLDER_DIR, dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let ready = BufReader::new(child.stdout.take().unwrap()).lines().any(|l| l.unwrap() == HOLDER_READY);
        assert!(ready, "holder process did not start");

        let names = NodeNames::new(dir.clone());
        let lease = TeamLease::acquire(&dir, 5).unwrap();
        assert!(names.team_alive(77));
        assert_eq!(names.lookup("held").unwrap(), ep(77, 1));
        assert!(matches!(names.register(&lease, "held", ep(5, 1)), Err(Error::NameTaken { .. })));
        assert!(TeamLease::acquire(&dir, 77).is_err());

        child.kill().unwrap(); // SIGKILL: no destructor runs, the kernel drops the flock
        child.wait().unwrap();
        assert!(!names.team_alive(77));
        assert!(not_found(names.lookup("held")));
        // The lookup swept the whole dead team.
        assert!(!dir.name_path("held-too").exists());
        assert!(!dir.team_socket(77).exists());
        assert!(!dir.team_lock(77).exists());
        names.register(&lease, "held", ep(5, 1)).unwrap();
        drop(lease);
        assert_all_clean(&dir);
    }

    const REGISTRAR_DIR: &str = "FERRY_NAMES_TEST_REGISTRAR_DIR";

    /// Run as a child process by `a_team_killed_while_registering_leaves_no_entry`:
    /// registers and unregisters names, as fast as it can, until killed.
    #[test]
    #[ignore = "helper process for a_team_killed_while_registering_leaves_no_entry"]
    fn registrar_process() {
        let Some(path) = std::env::var_os(REGISTRAR_DIR) else { return };
        let dir = RuntimeDir::at(path).unwrap();
        let team = 100 + std::process::id() % 1000;
        let lease = TeamLease::acquire(&dir, team).unwrap();
        let names = NodeNames::new(dir.clone());
        println!("{HOLDER_READY}");
        io::stdout().flush().unwrap();
        for i in 0u32.. {
            let name = format!("n{}", i % 8);
            names.register(&lease, &name, ep(team, i % 1000 + 1)).unwrap();
            names.unregister(&lease, &name).unwrap();
        }
    }

    /// Found by the crash matrix: a name entry is written in full before
    /// it gets its name; it was written as a named temporary file
    /// (`.tmp-PID-N`), so a team killed while registering a name left it
    /// behind, and no sweep could tell whose it was (it was swept only
    /// once a minute old). Now it is written unnamed (`O_TMPFILE`) and
    /// linked to its name: a registration cut short leaves nothing.
    #[test]
    fn a_team_killed_while_registering_leaves_no_entry() {
        let (_tmp, dir) = fresh();
        let module = module_path!().split_once("::").unwrap().1;
        for round in 0..20u64 {
            let mut child = Command::new(std::env::current_exe().unwrap())
                .args([&format!("{module}::registrar_process"), "--exact", "--ignored", "--nocapture"])
                .env(REGISTRAR_DIR, dir.path())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            let ready = BufReader::new(child.stdout.take().unwrap()).lines().any(|l| l.unwrap() == HOLDER_READY);
            assert!(ready, "registrar process did not start");
            std::thread::sleep(Duration::from_micros(500 + round * 797 % 5000));
            child.kill().unwrap();
            child.wait().unwrap();
            let temps: Vec<_> = fs::read_dir(dir.names_dir())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('.'))
                .collect();
            assert!(temps.is_empty(), "round {round}: a killed registration left {temps:?}");
            NodeNames::new(dir.clone()).sweep_dead_teams();
        }
        assert_all_clean(&dir);
    }
}
