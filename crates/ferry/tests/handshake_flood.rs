//! Strangers on the cluster port (issue 15, defect 3): connections that
//! never prove the key, trickling a byte at a time, took the team's
//! blocking threads for their handshakes, so `spawn_blocking`, binds and
//! name look-ups stalled behind them. Alone in its binary: it measures
//! delays and counts this process's descriptors.

use ferry::{Cluster, Team};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::FromRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY: &[u8] = b"a cluster key of more than 16 bytes";

/// A handler that runs a blocking job.
#[ferry::service]
pub trait Work {
    async fn run(&self, x: u32) -> u32;
}

struct WorkImpl(Team);

impl Work for WorkImpl {
    async fn run(&self, x: u32) -> u32 {
        self.0.spawn_blocking(move || x + 1).await.unwrap()
    }
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

fn cluster(addrs: &[SocketAddr], node: u16) -> Cluster {
    let peers: BTreeMap<u16, SocketAddr> =
        addrs.iter().enumerate().map(|(i, a)| (i as u16 + 1, *a)).filter(|(n, _)| *n != node).collect();
    let listen = addrs[node as usize - 1];
    Cluster {
        node,
        listen,
        peers,
        key: Arc::from(KEY),
        tls: None,
        from: Default::default(),
        handshakes_per_source: None,
    }
}

/// A TCP connection to `to` from the loopback address `from` (a stranger's).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let SocketAddr::V4(to) = to else { panic!("IPv4") };
    let sa = |a: SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns (handed
    // to the `TcpStream`, which closes it), with addresses that live across them.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = TcpStream::from_raw_fd(fd);
        let (me, them) = (sa(SocketAddrV4::new(from, 0)), sa(to));
        if libc::bind(fd, (&me as *const libc::sockaddr_in).cast(), len) != 0
            || libc::connect(fd, (&them as *const libc::sockaddr_in).cast(), len) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// This process's descriptors.
fn descriptors() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    v.sort();
    v
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100) - 1]
}

/// How long calls (each runs a blocking job on the server) and binds by
/// name from fresh teams of node 2 take: the p99 of each (and none stalls: all within 1 s).
fn measure(dir: &std::path::Path, c2: &Cluster, calls: &WorkClient, binds: usize) -> (Duration, Duration) {
    let mut call_times = Vec::new();
    for i in 0..200 {
        let t = Instant::now();
        assert_eq!(calls.run_blocking(i).unwrap(), i + 1);
        call_times.push(t.elapsed());
    }
    // On a thread that ends: the epoll sets a thread keeps for each team it
    // slept for go with it (else with its next set, lazily).
    let bind_times = std::thread::scope(|s| {
        s.spawn(|| {
            let mut bind_times = Vec::new();
            // Ten teams at a time (each holds a few descriptors), started before they are timed.
            for batch in 0..binds.div_ceil(10) {
                let n = (binds - batch * 10).min(10);
                let start = || Team::builder().blocking().runtime_dir(dir).cluster(c2.clone()).start().unwrap();
                let teams: Vec<Team> = (0..n).map(|_| start()).collect();
                for t in &teams {
                    let at = Instant::now();
                    let client = WorkClient::bind(t, "work").unwrap();
                    assert_eq!(client.run_blocking(1).unwrap(), 2);
                    bind_times.push(at.elapsed());
                }
            }
            bind_times
        })
        .join()
        .unwrap()
    });
    let longest = call_times.iter().chain(&bind_times).max().copied().unwrap_or_default();
    assert!(longest < Duration::from_secs(1), "a call or bind took {longest:?}");
    (p99(call_times), p99(bind_times))
}

#[test]
fn strangers_trickling_bytes_delay_neither_blocking_jobs_nor_binds() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let addrs = [free_addr(), free_addr()];
    let (c1, c2) = (cluster(&addrs, 1), cluster(&addrs, 2));
    let server = Team::builder().blocking().runtime_dir(dirs[0].path()).cluster(c1).start().unwrap();
    let _serving = WorkServer::serve(&server, "work", WorkImpl(server.clone())).unwrap();
    let client = Team::builder().blocking().runtime_dir(dirs[1].path()).cluster(c2.clone()).start().unwrap();
    let calls = WorkClient::bind(&client, "work").unwrap();
    // Warm: the blocking pool's threads, the channel.
    measure(dirs[1].path(), &c2, &calls, 2);
    std::thread::sleep(Duration::from_millis(200));
    let baseline = descriptors();
    let (calls_before, binds_before) = measure(dirs[1].path(), &c2, &calls, 30);

    // 200 strangers, 8 from each of 25 addresses that are no node's, each
    // sending the start of a hello, a byte every 200 ms.
    let connected = Instant::now();
    let strangers: Vec<TcpStream> =
        (0..200u32).map(|i| connect_from(Ipv4Addr::new(127, 0, 0, 10 + (i % 25) as u8), addrs[0]).unwrap()).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        let mut socks: Vec<TcpStream> = strangers.iter().map(|s| s.try_clone().unwrap()).collect();
        std::thread::spawn(move || {
            let hello = b"FERRYTC1";
            let mut at = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for s in &mut socks {
                    let _ = s.write(&hello[at % 8..at % 8 + 1]);
                }
                at += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (calls_during, binds_during) = measure(dirs[1].path(), &c2, &calls, 30);
    let took = started.elapsed();
    eprintln!(
        "p99 of calls {calls_before:?} -> {calls_during:?}, of binds {binds_before:?} -> {binds_during:?} \
         (measured in {took:?})"
    );
    assert!(took < Duration::from_secs(4), "measured in {took:?}: past the strangers' deadline");
    let extra = Duration::from_millis(10);
    assert!(calls_during <= calls_before + extra, "calls: p99 {calls_during:?}, {calls_before:?} before");
    assert!(binds_during <= binds_before + extra, "binds: p99 {binds_during:?}, {binds_before:?} before");

    // The server shuts every stranger, still trickling, once its handshake
    // is 5 s old (one deadline for the whole handshake, not one per read);
    // then its descriptors are back to what they were.
    let mut strangers = strangers;
    let mut refused = 0;
    for (i, s) in strangers.iter_mut().enumerate() {
        let left = Duration::from_secs(7).saturating_sub(connected.elapsed()).max(Duration::from_millis(1));
        s.set_read_timeout(Some(left)).unwrap();
        // Closed, or refused at once (`FERRYTRF`, past the bounds) and closed.
        let mut got = Vec::new();
        match std::io::Read::read_to_end(s, &mut got) {
            Ok(_) if got.is_empty() => {}
            Ok(_) if got.starts_with(b"FERRYTRF") => refused += 1,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            r => panic!("stranger {i}, {:?} after it connected: {r:?}, {got:?}", connected.elapsed()),
        }
    }
    // At most 64 from addresses that are no node's were taken.
    assert!(refused >= 200 - 64, "{refused} strangers refused at once");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickle.join().unwrap();
    drop(strangers);
    let until = Instant::now() + Duration::from_secs(10);
    while descriptors().len() > baseline.len() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = descriptors();
    assert!(after.len() <= baseline.len(), "descriptors {after:?}, before the strangers {baseline:?}");
    assert_eq!(calls.run_blocking(5).unwrap(), 6);
}
