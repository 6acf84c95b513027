//! Retryable calls across nodes: a call whose connection is lost before its
//! reply is sent once more over a new connection, and the server runs it at
//! most once. The connection is cut by a TCP proxy between the two nodes
//! (both on loopback), while the server's handler is running.

use ferry::{Cluster, Team};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const KEY: &[u8] = b"a cluster key of more than 16 bytes";

#[ferry::service]
pub trait Work {
    /// Takes `ms` milliseconds; returns how many runs of `work` there were so far.
    async fn work(&self, ms: u64) -> u64;
}

struct Counter(Arc<AtomicU64>);

impl Work for Counter {
    async fn work(&self, ms: u64) -> u64 {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        std::thread::sleep(Duration::from_millis(ms));
        n
    }
}

/// A TCP proxy to `to` whose connections can all be cut at once.
struct Proxy {
    addr: SocketAddr,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Proxy {
    fn new(to: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let keep = open.clone();
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                let Ok(inbound) = inbound else { return };
                let Ok(outbound) = TcpStream::connect(to) else { continue };
                let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
                keep.lock().unwrap().extend([inbound.try_clone().unwrap(), outbound.try_clone().unwrap()]);
                for (mut from, mut to) in
                    [(inbound.try_clone().unwrap(), outbound.try_clone().unwrap()), (outbound, inbound)]
                {
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 65536];
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = (from.shutdown(Shutdown::Both), to.shutdown(Shutdown::Both));
                    });
                }
            }
        });
        Proxy { addr, open }
    }

    /// Resets every connection through the proxy (both sides see it end).
    fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

/// Node 1 (the client) reaches node 2 (the server) through a proxy.
fn two_nodes() -> (Team, Team, Proxy, Arc<AtomicU64>, [tempfile::TempDir; 2]) {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let (a, b) = (free_addr(), free_addr());
    let proxy = Proxy::new(b);
    let cluster = |node, listen, peer: (u16, SocketAddr)| Cluster {
        node,
        listen,
        peers: BTreeMap::from([peer]),
        key: Arc::from(KEY),
        tls: None,
        from: Default::default(),
        handshakes_per_source: None,
    };
    let client = Team::builder().runtime_dir(dirs[0].path()).cluster(cluster(1, a, (2, proxy.addr))).start().unwrap();
    let server = Team::builder().runtime_dir(dirs[1].path()).cluster(cluster(2, b, (1, a))).start().unwrap();
    let runs = Arc::new(AtomicU64::new(0));
    (client, server, proxy, runs, dirs)
}

/// The connection is cut while the handler runs: a retryable call is sent
/// again over a new connection and gets the first run's reply (the handler
/// ran once); a plain call fails with `PeerGone` (the control).
#[test]
fn a_retryable_call_lost_with_its_connection_runs_once_and_gets_its_reply() {
    let (client, server, proxy, runs, _dirs) = two_nodes();
    let _serving = WorkServer::serve(&server, "work", Counter(runs.clone())).unwrap();
    let ep = server.lookup("work").unwrap();

    let retrying = WorkClient::bind_to(&client, ep).unwrap().retrying();
    let call = std::thread::spawn(move || retrying.work_blocking(600));
    while runs.load(Ordering::SeqCst) < 1 {
        std::thread::sleep(Duration::from_millis(5));
    }
    proxy.cut();
    assert_eq!(call.join().unwrap().unwrap(), 1, "the retry got the first run's reply");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retried call ran twice");

    // The control: a plain call lost with its connection fails.
    let plain = WorkClient::bind_to(&client, ep).unwrap();
    let call = std::thread::spawn(move || plain.work_blocking(600));
    while runs.load(Ordering::SeqCst) < 2 {
        std::thread::sleep(Duration::from_millis(5));
    }
    proxy.cut();
    let r = call.join().unwrap();
    assert!(matches!(r, Err(ferry::rpc::RpcError::PeerGone { .. })), "{r:?}");
}
