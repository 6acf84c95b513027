//! A real etcd for the TCP rounds that keep their names there (Debian's
//! `etcd-server`, which `scripts/test.sh` installs), started as the etcd
//! name plane's tests start theirs, and the check at the end of the run:
//! every name of those rounds is gone, the dead teams' with their expired
//! leases, the survivors' revoked when they left.

use ferry::testing::{etcd_compact, EtcdNames};
use ferry::Error;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Etcd {
    proc: Child,
    pub addr: SocketAddr,
    data: PathBuf,
    /// The harness's own client, for looking names up.
    client: Option<EtcdNames>,
}

impl Etcd {
    /// Starts an etcd listening on `ip` (free ports), its data under `dir`.
    pub fn start(ip: IpAddr, dir: &Path) -> Result<Etcd, String> {
        let port = || TcpListener::bind((ip, 0)).and_then(|l| l.local_addr()).map(|a| a.port());
        let (client, peer) = (port().map_err(|e| e.to_string())?, port().map_err(|e| e.to_string())?);
        let data = dir.join("etcd");
        let url = |p: u16| format!("http://{}", SocketAddr::new(ip, p));
        let proc = Command::new("etcd")
            .arg("--data-dir")
            .arg(&data)
            .args(["--listen-client-urls", &url(client), "--advertise-client-urls", &url(client)])
            .args(["--listen-peer-urls", &url(peer), "--initial-advertise-peer-urls", &url(peer)])
            .args(["--initial-cluster", &format!("default={}", url(peer))])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start etcd ({e}); Debian: apt-get install etcd-server"))?;
        let mut etcd = Etcd { proc, addr: SocketAddr::new(ip, client), data, client: None };
        let until = Instant::now() + Duration::from_secs(20);
        // Up once it answers a request (a compaction of its empty store).
        while etcd_compact(etcd.addr).is_err() {
            if Instant::now() > until {
                return Err("etcd did not come up within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        etcd.client = Some(EtcdNames::connect(&[etcd.addr], Duration::from_secs(10)).map_err(|e| e.to_string())?);
        Ok(etcd)
    }

    /// Those of `names` that resolve in etcd now.
    pub fn bound(&self, names: &[String]) -> Vec<String> {
        let client = self.client.as_ref().expect("connected");
        names.iter().filter(|n| !matches!(client.lookup(n), Err(Error::NameNotFound(_)))).cloned().collect()
    }

    /// Waits until none of `names` resolves in etcd, at most `limit`;
    /// returns those still there and how long it waited.
    pub fn names_left(&self, names: &[String], limit: Duration) -> (Vec<String>, Duration) {
        let t0 = Instant::now();
        loop {
            let left = self.bound(names);
            if left.is_empty() || t0.elapsed() >= limit {
                return (left, t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        drop(self.client.take());
        let _ = self.proc.kill();
        let _ = self.proc.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// Whether an `etcd` is on the `PATH`.
pub(crate) fn available() -> bool {
    Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
