//! A crowd: the extra processes of a case that needs more than the
//! harness's one child (several client/server pairs, a server with many
//! peers). Each member is this binary re-executed with a *role* in the
//! environment, as the harness starts its child, but unpinned. It talks to
//! the parent in lines over a Unix socket that is its stdin: it says
//! `ready` once set up, answers the role's requests, and stops when the
//! parent closes the socket.
//!
//! Every wait of the parent has a deadline. A member that dies or falls
//! silent fails the case (the error says which and how it ended), and a
//! dropped crowd kills and reaps every member still there, also while a
//! failed case unwinds: no case leaves a process behind.

use std::io::{self, BufRead, BufReader, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{getppid, getrlimit, set_parent_process_death_signal, setrlimit, Resource, Signal};
use rustix::thread::{sched_setaffinity, CpuSet};

use crate::fdpass;

/// The role's name; its presence makes the binary a member.
const ROLE: &str = "FERRY_BENCH_CROWD_ROLE";
/// The role's argument (see [`Member::arg`]).
const ARG: &str = "FERRY_BENCH_CROWD_ARG";
const PARENT_PID: &str = "FERRY_BENCH_CROWD_PARENT";

/// A part a member can play: `run` returns when the parent closes the
/// socket ([`Member::hear`] gives `None`), or fails the member.
#[derive(Clone, Copy)]
pub(crate) struct Role {
    pub name: &'static str,
    pub run: fn(&mut Member) -> Result<(), String>,
}

/// The parent's side: the members, in the order they were added.
pub(crate) struct Crowd {
    members: Vec<Handle>,
}

struct Handle {
    label: String,
    child: Child,
    sock: BufReader<UnixStream>,
    ready: bool,
}

impl Crowd {
    pub fn new() -> Crowd {
        Crowd { members: Vec::new() }
    }

    /// Starts a member playing `role` with `arg`; returns its index. It is
    /// not waited for: see [`Crowd::ready`].
    pub fn add(&mut self, role: &str, arg: &str) -> Result<usize, String> {
        let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
        let mut cmd = Command::new(exe);
        cmd.env(ROLE, role).env(ARG, arg).env(PARENT_PID, std::process::id().to_string());
        self.add_command(&format!("{role}#{}", self.members.len()), cmd)
    }

    /// Starts `cmd` as a member (its stdin the socket, its stdout this
    /// process's stderr, which keeps a JSON stdout clean).
    fn add_command(&mut self, label: &str, mut cmd: Command) -> Result<usize, String> {
        let fail = |e: io::Error| format!("cannot start {label}: {e}");
        let (mine, theirs) = UnixStream::pair().map_err(fail)?;
        let out = io::stderr().as_fd().try_clone_to_owned().map_err(fail)?;
        // Only the child gets `theirs` (as fd 0): no other member inherits it.
        cmd.stdin(Stdio::from(OwnedFd::from(theirs))).stdout(out);
        let child = cmd.spawn().map_err(fail)?;
        let label = format!("{label} (pid {})", child.id());
        self.members.push(Handle { label, child, sock: BufReader::new(mine), ready: false });
        Ok(self.members.len() - 1)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.members[i].child.id()
    }

    /// Waits until every member not yet ready has said `ready`, at most `within`.
    pub fn ready(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        for i in 0..self.members.len() {
            if !self.members[i].ready {
                let line = self.read_by(i, deadline)?;
                if line != "ready" {
                    return Err(format!("{} said {line:?} instead of ready", self.members[i].label));
                }
                self.members[i].ready = true;
            }
        }
        Ok(())
    }

    /// Sends member `i` one line.
    pub fn tell(&mut self, i: usize, line: &str) -> Result<(), String> {
        let m = &mut self.members[i];
        let sock = m.sock.get_mut();
        let _ = sock.set_write_timeout(Some(Duration::from_secs(5)));
        let sent = sock.write_all(format!("{line}\n").as_bytes());
        sent.map_err(|e| format!("telling {}: {e}{}", m.label, exit_note(&mut m.child)))
    }

    /// Sends member `i` a descriptor (its role takes it with
    /// [`Member::recv_fd`] before reading any line).
    pub fn send_fd(&mut self, i: usize, fd: BorrowedFd<'_>) -> Result<(), String> {
        let m = &mut self.members[i];
        fdpass::send_fd(m.sock.get_ref(), fd).map_err(|e| format!("passing a descriptor to {}: {e}", m.label))
    }

    /// Reads one line from member `i`, waiting at most `within`.
    #[cfg(test)]
    pub fn read(&mut self, i: usize, within: Duration) -> Result<String, String> {
        self.read_by(i, Instant::now() + within)
    }

    /// Sends `line` to the members `which`, then reads one line from each,
    /// in that order, all by `within` from now.
    pub fn ask(&mut self, which: &[usize], line: &str, within: Duration) -> Result<Vec<String>, String> {
        let deadline = Instant::now() + within;
        for &i in which {
            self.tell(i, line)?;
        }
        which.iter().map(|&i| self.read_by(i, deadline)).collect()
    }

    fn read_by(&mut self, i: usize, deadline: Instant) -> Result<String, String> {
        let m = &mut self.members[i];
        let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
        let mut line = String::new();
        let read = m.sock.get_ref().set_read_timeout(Some(left)).and_then(|()| m.sock.read_line(&mut line));
        match read {
            Ok(_) if line.ends_with('\n') => Ok(line.trim_end().to_string()),
            Ok(_) => Err(format!("{} closed its socket{}", m.label, exit_note(&mut m.child))),
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                Err(format!("no answer from {} in time{}", m.label, exit_note(&mut m.child)))
            }
            Err(e) => Err(format!("reading from {}: {e}{}", m.label, exit_note(&mut m.child))),
        }
    }

    /// The clean stop: closes every socket (members stop and exit), then
    /// waits at most `within` for all of them. A member that exits with an
    /// error or has to be killed fails it; all are reaped either way.
    pub fn finish(mut self, within: Duration) -> Result<(), String> {
        for m in &self.members {
            let _ = m.sock.get_ref().shutdown(Shutdown::Both);
        }
        let deadline = Instant::now() + within;
        let mut failures = Vec::new();
        for m in &mut self.members {
            loop {
                match m.child.try_wait() {
                    Ok(Some(status)) if status.success() => break,
                    Ok(Some(status)) => {
                        failures.push(format!("{} ended with {status}", m.label));
                        break;
                    }
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
                    Ok(None) => {
                        failures.push(format!("{} still running after the stop; killed", m.label));
                        break;
                    }
                    Err(e) => {
                        failures.push(format!("waiting for {}: {e}", m.label));
                        break;
                    }
                }
            }
        }
        // Dropping `self` kills and reaps whoever is left.
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures.join("; "))
        }
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Ok(None) = m.child.try_wait() {
                let _ = m.child.kill();
            }
        }
        for m in &mut self.members {
            let _ = m.child.wait();
        }
    }
}

/// ", which exited (exit status: 3)" if the member is gone, else "".
fn exit_note(child: &mut Child) -> String {
    // A member that just closed its socket may take a moment to be reaped.
    for _ in 0..50 {
        if let Ok(Some(status)) = child.try_wait() {
            return format!(", which exited ({status})");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    String::new()
}

/// A member's side: its argument and its socket to the parent.
pub(crate) struct Member {
    /// What the parent passed: `key=value` words (see [`Member::get`]).
    pub arg: String,
    sock: BufReader<UnixStream>,
}

impl Member {
    /// The value of `key=value` in the argument.
    pub fn get(&self, key: &str) -> Result<&str, String> {
        self.arg
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .ok_or_else(|| format!("no {key}= in {:?}", self.arg))
    }

    /// [`Member::get`], parsed.
    pub fn parse<T: std::str::FromStr>(&self, key: &str) -> Result<T, String> {
        let v = self.get(key)?;
        v.parse().map_err(|_| format!("{key}={v:?} does not parse"))
    }

    /// Sends the parent one line.
    pub fn say(&mut self, line: &str) -> Result<(), String> {
        self.sock.get_mut().write_all(format!("{line}\n").as_bytes()).map_err(|e| format!("writing to the parent: {e}"))
    }

    /// The parent's next line; `None` once it closed the socket (stop).
    pub fn hear(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.sock.read_line(&mut line) {
            Ok(_) if line.ends_with('\n') => Some(line.trim_end().to_string()),
            _ => None,
        }
    }

    /// A descriptor sent with [`Crowd::send_fd`]; call before any [`Member::hear`].
    pub fn recv_fd(&mut self) -> Result<OwnedFd, String> {
        fdpass::recv_fd(self.sock.get_ref()).map_err(|e| format!("receiving a descriptor: {e}"))
    }
}

/// First thing in `main()` (see [`crate::child_main`]): if this process is
/// a crowd member, plays its role and exits (0 when it stopped cleanly, 2
/// if it failed, 101 if it panicked); otherwise returns at once.
pub(crate) fn member_if_requested(roles: &[Role]) {
    let Ok(name) = std::env::var(ROLE) else { return };
    let code = match setup(&name, roles) {
        Ok((role, mut member)) => match catch_unwind(AssertUnwindSafe(|| (role.run)(&mut member))) {
            Ok(Ok(())) => 0,
            Ok(Err(msg)) => {
                eprintln!("ferry-bench member {name}: {msg}");
                2
            }
            Err(_) => 101, // the panic hook has printed the message
        },
        Err(msg) => {
            eprintln!("ferry-bench member {name}: {msg}");
            2
        }
    };
    std::process::exit(code);
}

fn setup(name: &str, roles: &[Role]) -> Result<(Role, Member), String> {
    let role = *roles.iter().find(|r| r.name == name).ok_or_else(|| format!("no role named {name:?}"))?;
    // Die with the parent, so a crashed parent leaves no member behind.
    set_parent_process_death_signal(Some(Signal::KILL)).map_err(|e| format!("prctl: {e}"))?;
    let parent: i32 = std::env::var(PARENT_PID).ok().and_then(|p| p.parse().ok()).ok_or("no parent pid")?;
    if getppid().map(|p| p.as_raw_nonzero().get()) != Some(parent) {
        return Err("the parent is already gone".into());
    }
    unpin();
    raise_open_files();
    let arg = std::env::var(ARG).unwrap_or_default();
    for key in [ROLE, ARG, PARENT_PID] {
        // Processes this member starts are not members.
        std::env::remove_var(key);
    }
    let sock = io::stdin().as_fd().try_clone_to_owned().map_err(|e| format!("taking the socket: {e}"))?;
    Ok((role, Member { arg, sock: BufReader::new(UnixStream::from(sock)) }))
}

/// Lets this process run on every CPU it is allowed (a member inherits the
/// pinning of the harness's parent thread): the kernel keeps only the
/// CPUs of the process's cpuset.
fn unpin() {
    let mut all = CpuSet::new();
    for cpu in 0..CpuSet::MAX_CPU {
        all.set(cpu);
    }
    let _ = sched_setaffinity(None, &all);
}

/// Raises the soft limit of open files to the hard one: hundreds of teams
/// (or peers) hold several descriptors each.
fn raise_open_files() {
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::process::{test_kill_process, Pid};

    fn sh(crowd: &mut Crowd, script: &str) -> usize {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", script]);
        crowd.add_command("sh", cmd).unwrap()
    }

    fn gone(pid: u32) -> bool {
        test_kill_process(Pid::from_raw(pid as i32).unwrap()).is_err()
    }

    #[test]
    fn a_clean_stop_ends_every_member() {
        let mut crowd = Crowd::new();
        // `cat` answers each line and ends at EOF, as a role does.
        for _ in 0..3 {
            sh(&mut crowd, "echo ready >&0; exec cat <&0 >&0");
        }
        crowd.ready(Duration::from_secs(10)).unwrap();
        assert_eq!(crowd.ask(&[0, 2], "x 1", Duration::from_secs(10)).unwrap(), ["x 1", "x 1"]);
        let pids: Vec<u32> = (0..crowd.len()).map(|i| crowd.pid(i)).collect();
        crowd.finish(Duration::from_secs(10)).unwrap();
        assert!(pids.into_iter().all(gone));
    }

    #[test]
    fn a_dying_member_fails_the_case_at_once_and_all_are_reaped() {
        let mut crowd = Crowd::new();
        let sleeper = sh(&mut crowd, "echo ready >&0; exec sleep 60");
        let dying = sh(&mut crowd, "echo ready >&0; exit 3");
        crowd.ready(Duration::from_secs(10)).unwrap();
        let start = Instant::now();
        let err = crowd.read(dying, Duration::from_secs(30)).unwrap_err();
        assert!(err.contains("exit status: 3"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        let pid = crowd.pid(sleeper);
        drop(crowd);
        assert!(gone(pid));
    }

    #[test]
    fn a_silent_or_stubborn_member_is_given_up_by_the_deadline() {
        let mut crowd = Crowd::new();
        let sleeper = sh(&mut crowd, "echo ready >&0; exec sleep 60");
        crowd.ready(Duration::from_secs(10)).unwrap();
        let start = Instant::now();
        let err = crowd.read(sleeper, Duration::from_millis(200)).unwrap_err();
        assert!(err.contains("no answer"), "{err}");
        let pid = crowd.pid(sleeper);
        // It ignores the stop: killed once `within` has passed.
        let err = crowd.finish(Duration::from_millis(200)).unwrap_err();
        assert!(err.contains("killed"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5));
        assert!(gone(pid));
    }

    #[test]
    fn a_member_that_never_gets_ready_fails_ready() {
        let mut crowd = Crowd::new();
        sh(&mut crowd, "echo ready >&0; exec sleep 60");
        sh(&mut crowd, "echo nope >&0; exec sleep 60");
        let err = crowd.ready(Duration::from_secs(10)).unwrap_err();
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn member_arguments_are_key_value_words() {
        let m =
            Member { arg: "dir=/tmp/x n=512 mode=nospin".into(), sock: BufReader::new(UnixStream::pair().unwrap().0) };
        assert_eq!(m.get("dir"), Ok("/tmp/x"));
        assert_eq!(m.parse::<usize>("n"), Ok(512));
        assert!(m.get("mo").is_err());
        assert!(m.parse::<usize>("mode").is_err());
    }
}
