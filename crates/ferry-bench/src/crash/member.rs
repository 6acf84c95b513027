//! A team process as the harness sees it: started (in its network
//! namespace, if it has one), told commands, heard with a time limit on
//! every wait, stopped and killed, and never left running: dropping it
//! kills and reaps it.

use crate::crash::procfs::{self, Victim};
use crate::crash::protocol::{Command, Report, TeamSpec, SPEC_VAR};
use crate::crash::rng::now_ns;
use rustix::process::{kill_process, Pid, Signal};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub(crate) struct Member {
    pub index: usize,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Member {
    /// Starts team `spec.index` (inside network namespace `netns`: `ip
    /// netns exec` execs this binary, so the pid is the team's).
    pub fn spawn(spec: &TeamSpec, netns: Option<&str>) -> Result<Member, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = std::process::Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                c
            }
            None => std::process::Command::new(exe),
        };
        cmd.env(SPEC_VAR, serde_json::to_string(spec).expect("spec"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = cmd.spawn().map_err(|e| format!("cannot start team {}: {e}", spec.index))?;
        let out = BufReader::new(child.stdout.take().expect("piped"));
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let stdin = child.stdin.take();
        Ok(Member { index: spec.index, child, stdin, lines })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn tell(&mut self, cmd: &Command) {
        if let Some(stdin) = self.stdin.as_mut() {
            let line = serde_json::to_string(cmd).expect("command") + "\n";
            let _ = stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush());
        }
    }

    /// The team's next report, within `limit`.
    pub fn hear(&mut self, limit: Duration) -> Result<Report, String> {
        match self.lines.recv_timeout(limit) {
            Ok(line) => serde_json::from_str(&line).map_err(|e| format!("team {} said {line:?}: {e}", self.index)),
            Err(RecvTimeoutError::Timeout) => Err(format!("team {} said nothing for {limit:?}", self.index)),
            Err(RecvTimeoutError::Disconnected) => {
                Err(format!("team {} ended ({:?})", self.index, self.child.try_wait().ok().flatten()))
            }
        }
    }

    /// Stops the team (SIGSTOP) and waits until it is stopped, takes what
    /// identifies its resources, then SIGKILLs and reaps it. Returns when
    /// the SIGKILL was sent (CLOCK_MONOTONIC ns), how long the kernel took
    /// to tear the process down (until it was reaped, µs), and the snapshot.
    pub fn kill(&mut self) -> Result<(u64, u64, Victim), String> {
        let pid = Pid::from_raw(self.pid() as i32).expect("a pid");
        kill_process(pid, Signal::STOP).map_err(|e| format!("SIGSTOP: {e}"))?;
        let until = Instant::now() + Duration::from_secs(5);
        while !procfs::is_stopped(self.pid()) {
            if Instant::now() > until {
                return Err(format!("team {} did not stop", self.index));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let victim = procfs::snapshot(self.pid());
        let kill_ns = now_ns();
        kill_process(pid, Signal::KILL).map_err(|e| format!("SIGKILL: {e}"))?;
        let _ = self.child.wait();
        Ok((kill_ns, (now_ns() - kill_ns) / 1000, victim))
    }

    /// Closes the team's stdin and waits (at most `limit`) for it to exit;
    /// whether it exited with status 0.
    pub fn finish(&mut self, limit: Duration) -> Result<(), String> {
        self.stdin = None;
        let until = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) if s.success() => return Ok(()),
                Ok(Some(s)) => return Err(format!("team {} exited with {s}", self.index)),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return Err(format!("team {} did not exit within {limit:?}", self.index)),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}
