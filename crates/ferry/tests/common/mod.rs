//! Helpers shared by the integration test binaries.
// Each test binary uses only some of these.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub mod pair;
pub mod segment;
pub mod typed;

/// A loopback address no other test of this process was given (see
/// `ferry::testing::free_loopback_addr`).
pub use ferry::testing::free_loopback_addr;

/// [`free_loopback_addr`]'s port.
pub fn free_port() -> u16 {
    free_loopback_addr().port()
}

/// Deterministic, non-constant bytes for message `i`.
pub fn pattern(i: u64, len: usize) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

// ---------------------------------------------------------------- child processes
//
// A test binary re-runs itself as the child: its `child_entry` test (marked
// `#[ignore]`, so normal runs skip it) reads its role from `FERRY_TEST_CHILD`.
// The child talks to the parent with lines `ferry-child: <what>` on stdout
// and takes commands as lines on stdin.

pub const ROLE: &str = "FERRY_TEST_CHILD";
const SAY: &str = "ferry-child: ";

/// In `child_entry`: the role this process was started with, if it is a child.
pub fn child_role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// In a child: tells the parent something (see [`Child::expect`]).
pub fn say(what: impl std::fmt::Display) {
    // One write per line: libtest may print on the same stream.
    let line = format!("{SAY}{what}\n");
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes()).unwrap();
    out.flush().unwrap();
}

/// In a child: the next command line from the parent (`None` at end of input).
pub fn hear() -> Option<String> {
    let mut line = String::new();
    match std::io::stdin().read_line(&mut line) {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(line.trim_end().to_string()),
    }
}

/// A child process running `child_entry` of this binary with a role.
/// Killed (SIGKILL) and reaped on drop, so a failing test leaves nothing running.
pub struct Child {
    pub proc: std::process::Child,
    lines: Receiver<String>,
    role: String,
}

impl Child {
    /// Starts `role` with the runtime dir `dir`.
    pub fn spawn(role: &str, dir: &Path) -> Child {
        Child::spawn_with(role, dir, |_| {})
    }

    /// Starts `role` after `tweak` adjusted the command (more env vars...).
    pub fn spawn_with(role: &str, dir: &Path, tweak: impl FnOnce(&mut Command)) -> Child {
        let mut cmd = Child::command("child_entry", role, dir, None);
        tweak(&mut cmd);
        Child::from_command(cmd, role)
    }

    /// [`Child::spawn`] with `FERRY_TEST_KEY` set to `key` (a region's or
    /// a fifo's, for the child to open it with).
    pub fn spawn_with_key(role: &str, dir: &Path, key: &impl std::fmt::Display) -> Child {
        Child::spawn_with(role, dir, |c| {
            c.env("FERRY_TEST_KEY", key.to_string());
        })
    }

    /// Starts `role` inside network namespace `ns` (`ip netns exec`, which
    /// execs the test binary: the pid is the child's), with the runtime dir
    /// `dir` and the environment `env`.
    pub fn spawn_in_netns(ns: &str, role: &str, dir: &Path, env: &[(&str, &Path)]) -> Child {
        let mut cmd = Child::command("child_entry", role, dir, Some(ns));
        for (k, v) in env {
            cmd.env(k, v);
        }
        Child::from_command(cmd, role)
    }

    /// A command that runs test `test` of this binary (ignored or not) with
    /// `role` in `FERRY_TEST_CHILD` and the runtime dir `dir`, inside network
    /// namespace `ns` if given, with piped stdin and stdout.
    pub fn command(test: &str, role: &str, dir: &Path, ns: Option<&str>) -> Command {
        match ns {
            Some(ns) => Child::command_under(&["ip", "netns", "exec", ns], test, role, dir),
            None => Child::command_under(&[], test, role, dir),
        }
    }

    /// [`Child::command`] run by the command line `under` (which execs the
    /// test binary given after it), e.g. `ip netns exec NS`.
    pub fn command_under(under: &[&str], test: &str, role: &str, dir: &Path) -> Command {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match under.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        cmd.args(["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"])
            .env(ROLE, role)
            .env("FERRY_RUNTIME_DIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        cmd
    }

    /// Starts `cmd` (made by [`Child::command`]); a reader thread takes its
    /// lines, so every wait on the child has a deadline.
    pub fn from_command(mut cmd: Command, role: &str) -> Child {
        let mut proc = cmd.spawn().expect("spawn child process");
        let out = BufReader::new(proc.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { return };
                if let Some(i) = line.find(SAY) {
                    if tx.send(line[i + SAY.len()..].to_string()).is_err() {
                        return;
                    }
                }
            }
        });
        Child { proc, lines, role: role.to_string() }
    }

    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// Waits (at most `limit`) for the child to say a line starting with
    /// `what`; returns the rest of that line, trimmed. Earlier lines are skipped.
    pub fn expect(&mut self, what: &str, limit: Duration) -> String {
        let until = Instant::now() + limit;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(what) => return line[what.len()..].trim().to_string(),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    panic!("child {:?} did not say {what:?} within {limit:?}", self.role)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("child {:?} exited ({:?}) before saying {what:?}", self.role, self.proc.try_wait())
                }
            }
        }
    }

    /// Every line the child says from now on (instead of [`Child::expect`]
    /// and [`Child::next_line`], which then see nothing).
    pub fn take_lines(&mut self) -> Receiver<String> {
        std::mem::replace(&mut self.lines, std::sync::mpsc::channel().1)
    }

    /// The next line the child says within `limit`, if any (no panic).
    pub fn next_line(&mut self, limit: Duration) -> Option<String> {
        self.lines.recv_timeout(limit).ok()
    }

    /// Sends the child a command line.
    pub fn tell(&mut self, line: &str) {
        let stdin = self.proc.stdin.as_mut().expect("child stdin");
        let _ = writeln!(stdin, "{line}");
        let _ = stdin.flush();
    }

    /// Waits at most `limit` for the child to exit; `None` if it did not.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Some(s) = self.proc.try_wait().unwrap() {
                return Some(s);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILL, then reap.
    pub fn kill(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }

    /// Sends `sig` (e.g. `libc::SIGSTOP`) to the child.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid; it is not reaped while `self` lives.
        let r = unsafe { libc::kill(self.proc.id() as i32, sig) };
        assert_eq!(r, 0, "kill({}, {sig})", self.proc.id());
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------- bounds and looks

/// Runs `f` on a thread of its own and returns its result, failing the test
/// if it takes longer than `limit` (the thread is then left behind: a hang
/// becomes a failure, not a hung test binary).
pub fn within<T: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(RecvTimeoutError::Timeout) => panic!("{what}: not done within {limit:?} (hung)"),
        Err(RecvTimeoutError::Disconnected) => panic!("{what}: panicked"),
    }
}

/// Waits (looking every few ms, at most `limit`) until `cond` holds; whether it did.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every file in a runtime dir's `teams/` and `names/` folders.
pub fn runtime_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = ["teams", "names"]
        .iter()
        .flat_map(|sub| {
            std::fs::read_dir(dir.join(sub))
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok())
                .map(move |e| format!("{sub}/{}", e.file_name().to_string_lossy()))
        })
        .collect();
    v.sort();
    v
}

/// Open descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// This process's shared-memory mappings (memfds: channels and doorbells).
pub fn shared_mappings() -> Vec<String> {
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.contains("memfd:") || l.contains("/dev/shm/"))
        .map(str::to_string)
        .collect()
}

/// Ports between two teams that can reach each other (on two nodes, say):
/// typed calls with replies, 500 one-way messages in order with their
/// receipts, and a 5 MB message.
pub fn exchange_messages(a: &ferry::Team, b: &ferry::Team) {
    use ferry::Checkpoint;
    let port = b.open_port::<String>().unwrap();
    let to_b = a.sender::<String>(port.id());
    let echo = std::thread::spawn(move || {
        for _ in 0..3 {
            let m = port.recv_blocking().unwrap();
            let v = m.value.clone();
            m.reply(&format!("{v}!")).unwrap();
        }
        port
    });
    for i in 0..3 {
        let back: String = to_b.call(&format!("hello {i}")).unwrap();
        assert_eq!(back, format!("hello {i}!"));
    }
    let port = echo.join().unwrap();
    for i in 0..500 {
        to_b.send(&format!("m{i}"), Checkpoint::OnReceipt).unwrap();
    }
    for i in 0..500 {
        assert_eq!(port.recv_timeout(Duration::from_secs(10)).unwrap().value, format!("m{i}"));
    }
    // A large message (out of band; in TLS, in records of at most 16 KiB).
    let big = "x".repeat(5 << 20);
    to_b.send(&big, Checkpoint::OnReceipt).unwrap();
    assert_eq!(port.recv_timeout(Duration::from_secs(10)).unwrap().value.len(), big.len());
}

/// The smallest service: what the cross-process suites serve and call.
pub mod calc {
    /// Adds.
    #[ferry::service]
    pub trait Calc {
        async fn add(&self, a: i32, b: i32) -> i32;
    }

    /// The one implementation.
    pub struct CalcImpl;

    impl Calc for CalcImpl {
        async fn add(&self, a: i32, b: i32) -> i32 {
            a + b
        }
    }
}

// ---------------------------------------------------------------- TLS certificates

/// Test certificates for TLS between nodes, made with rcgen when a test
/// runs: a CA, certificates it signs, and a rogue CA's.
pub mod certs {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    use std::path::{Path, PathBuf};

    /// A certificate authority (its certificate is `NAME-ca.pem` in the directory).
    pub struct Ca {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    impl Ca {
        /// A self-signed CA called `name`; writes its certificate to `dir/NAME-ca.pem`.
        pub fn new(dir: &Path, name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.distinguished_name.push(DnType::CommonName, format!("ferry test CA {name}"));
            let key = KeyPair::generate().unwrap();
            let cert = params.self_signed(&key).unwrap();
            std::fs::write(dir.join(format!("{name}-ca.pem")), cert.pem()).unwrap();
            Ca { cert, key }
        }

        /// A certificate for `names` (IP addresses or DNS names) signed by
        /// this CA: writes `dir/FILE.pem` and `dir/FILE.key`.
        pub fn issue(&self, dir: &Path, file: &str, names: &[&str]) {
            let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
            params.distinguished_name.push(DnType::CommonName, format!("ferry test node {file}"));
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
            std::fs::write(dir.join(format!("{file}.pem")), cert.pem()).unwrap();
            std::fs::write(dir.join(format!("{file}.key")), key.serialize_pem()).unwrap();
        }
    }

    /// The cluster-file lines of node certificate `file` trusting CA `ca`.
    pub fn lines(dir: &Path, file: &str, ca: &str) -> String {
        let p = |name: String| -> PathBuf { dir.join(name) };
        format!(
            "tls-cert {}\ntls-key {}\ntls-ca {}\n",
            p(format!("{file}.pem")).display(),
            p(format!("{file}.key")).display(),
            p(format!("{ca}-ca.pem")).display()
        )
    }

    /// The TLS settings of node certificate `file` trusting CA `ca`.
    pub fn config(dir: &Path, file: &str, ca: &str) -> ferry::TlsConfig {
        ferry::TlsConfig::from_files(
            &dir.join(format!("{file}.pem")),
            &dir.join(format!("{file}.key")),
            &dir.join(format!("{ca}-ca.pem")),
        )
        .unwrap()
    }
}
