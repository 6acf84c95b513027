//! One thread plays both sides of a shared-memory round trip between two
//! teams, so that `valgrind --tool=callgrind` counts the instructions of the
//! send and receive paths without any spinning:
//!
//!     cargo build --release -p ferry-bench --example rtt_instructions
//!     valgrind --tool=callgrind target/release/examples/rtt_instructions 100000
//!
//! Instructions per round trip = (total − startup) / N; compare two runs with
//! different N to cancel the startup. `rtt_instructions N rpc` does the same
//! for a null RPC (client and server teams, server run inline on the
//! calling thread's progress loop), `rtt_instructions N arg` for a call
//! with 4 bytes of arguments as `ferry.shm.arg4` (`argB`: B bytes); build with `--no-default-features` to
//! compile cost accounting out and compare. `rtt_instructions N tcp` makes
//! N null calls pipelined as `ferry bench tcp`'s `ferry.tcp.pipelined` does
//! (32 in flight, refilled 16 per batch) between two nodes of a cluster on
//! loopback, both teams in blocking mode (no spinning: what is counted is
//! the calls' work, system calls included, which `strace -c -f` counts).
//! `rtt_instructions N tcp-null` makes N null calls one after the other on
//! the same two nodes; `tcp-get` N 8-byte gets of a region of node 2
//! (served by its runtime), `tcp-get-nodeadline` the same without the
//! operations' default deadline. `rtt_instructions N oneway` sends N
//! one-way messages in bursts of 64 (`ferry.shm.oneway`'s path; count
//! per message). `rtt_instructions N link` bounces an
//! 8-byte message on a link between two teams as `bounce` does on ports
//! (`ferry.shm.link.fresh`'s path without its spinning;
//! `linkB`: a message of B bytes). `rtt_instructions
//! N tasks` bounces one between two tasks of one team, driven by this
//! thread's `block_on` (`ferry.inproc.tasks`' path without a processor).
//! `rtt_instructions N tasks8` makes N null calls from 8 tasks on a client
//! team's processor to a server with one processor (`ferry.shm.tasks8`'s
//! path; `--separate-threads=yes` parts the client's work from the server's).

use ferry::{Checkpoint, Team};

#[ferry::service]
pub trait Null {
    async fn null(&self);
    async fn arg(&self, data: serde_bytes::ByteBuf) -> u64;
}

struct NullImpl;

impl Null for NullImpl {
    async fn null(&self) {}
    async fn arg(&self, data: serde_bytes::ByteBuf) -> u64 {
        data.iter().map(|&b| u64::from(b)).sum()
    }
}

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    match std::env::args().nth(2).as_deref() {
        Some("rpc") => return rpc(n, None),
        Some("arg") => return rpc(n, Some(4)),
        Some(arg) if arg.starts_with("arg") => {
            return rpc(n, Some(arg[3..].parse().expect("argB: B, a number of bytes")))
        }
        Some("tcp") => return tcp(n),
        Some(op @ ("tcp-null" | "tcp-get" | "tcp-get-nodeadline")) => return tcp_one_by_one(n, op),
        Some("inproc") => return inproc(n),
        Some("oneway") => return oneway(n),
        Some("link") => return link(n, 8),
        Some(arg) if arg.starts_with("link") => return link(n, arg[4..].parse().expect("linkB: B, a number of bytes")),
        Some("tasks") => return tasks(n, 0),
        Some("tasks-proc") => return tasks(n, 1),
        Some("tasks8") => return calling_tasks(n, 8),
        _ => {}
    }
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    let b = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    bounce(n, &a, &b);
    a.shutdown();
    b.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `n` round trips of an 8-byte message between a port of `a` and one of
/// `b` (the same team, or two), this thread playing both ends.
fn bounce(n: usize, a: &Team, b: &Team) {
    let (pa, pb) = (a.open_raw_port().unwrap(), b.open_raw_port().unwrap());
    let (to_b, to_a) = (a.raw_sender(pb.id()), b.raw_sender(pa.id()));
    let msg = [7u8; 8];
    for _ in 0..n {
        to_b.send(&msg, Checkpoint::Immediate).unwrap();
        let m = pb.recv_blocking().unwrap();
        to_a.send(m.payload(), Checkpoint::Immediate).unwrap();
        pa.recv_blocking().unwrap();
    }
}

/// `n` 8-byte messages one way between two teams, in bursts of 64 sent
/// then 64 received: `ferry.shm.oneway`'s per-message work (count per
/// message, not per round trip).
fn oneway(n: usize) {
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    let b = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    let pb = b.open_raw_port().unwrap();
    let to_b = a.raw_sender(pb.id());
    let msg = [7u8; 8];
    for _ in 0..n / 64 {
        for _ in 0..64 {
            to_b.send(&msg, Checkpoint::Immediate).unwrap();
        }
        for _ in 0..64 {
            pb.recv_blocking().unwrap();
        }
    }
    a.shutdown();
    b.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A port round trip inside one team (the loop-back channel), one thread
/// playing both ends: `ferry.inproc`'s path without its spinning.
fn inproc(n: usize) {
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let team = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    bounce(n, &team, &team);
    team.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `n` round trips of an 8-byte message between two tasks of one team with
/// no processor: `block_on` on this thread runs both.
fn tasks(n: usize, processors: usize) {
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let team = Team::builder().runtime_dir(&dir).processors(processors).blocking().start().unwrap();
    let (a, b) = (team.open_raw_port().unwrap(), team.open_raw_port().unwrap());
    let (to_a, to_b) = (team.raw_sender(a.id()), team.raw_sender(b.id()));
    let echo = team.spawn(async move {
        for _ in 0..n {
            let m = b.recv().await.unwrap();
            to_a.send_async(m.payload(), Checkpoint::Immediate).await.unwrap();
        }
    });
    let bounce = team.spawn(async move {
        let msg = [7u8; 8];
        for _ in 0..n {
            to_b.send_async(&msg, Checkpoint::Immediate).await.unwrap();
            a.recv().await.unwrap();
        }
    });
    team.block_on(bounce).unwrap();
    team.block_on(echo).unwrap();
    team.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `n` round trips of an 8-byte message on a link between two teams with
/// no processor, this thread playing both ends (each blocking receive
/// drives its team).
fn link(n: usize, size: usize) {
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let a = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    let b = Team::builder().runtime_dir(&dir).processors(0).start().unwrap();
    let listener = b.link_listener().unwrap();
    let to = listener.id();
    // `link_to` drives team a on its thread; accepting drives team b here.
    let (here, there) = std::thread::scope(|s| {
        let opening = s.spawn(|| a.link_to(to).unwrap());
        let there = listener.accept_blocking().unwrap();
        (opening.join().unwrap(), there)
    });
    let msg = vec![7u8; size];
    for _ in 0..n {
        here.send_bytes(&msg, Checkpoint::Immediate).unwrap();
        let m = there.recv_bytes_blocking().unwrap();
        there.send_bytes(&m.value, Checkpoint::Immediate).unwrap();
        here.recv_bytes_blocking().unwrap();
    }
    drop((here, there, listener));
    a.shutdown();
    b.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

fn rpc(n: usize, arg: Option<usize>) {
    // One processor serves; this thread calls. Callgrind runs threads one
    // at a time, so the count is the work of both sides, spins included:
    // compare builds with each other, not with the port figure.
    with_null_service(0, |_, c| {
        let data = serde_bytes::ByteBuf::from(vec![1u8; arg.unwrap_or(0)]);
        for _ in 0..n {
            if arg.is_some() {
                assert_eq!(c.arg_blocking(data.clone()).unwrap(), data.len() as u64);
            } else {
                c.null_blocking().unwrap();
            }
        }
    });
}

/// `n` null calls from `t` tasks of a client team with one processor (this
/// thread waits for them as `ferry.shm.tasks8` does) to a server team
/// with one processor.
fn calling_tasks(n: usize, t: usize) {
    with_null_service(1, |client, c| {
        let (done, wait) = std::sync::mpsc::channel();
        for _ in 0..t {
            let (c, done) = (c.clone(), done.clone());
            drop(client.spawn(async move {
                for _ in 0..n / t {
                    c.null().await.unwrap();
                }
                done.send(()).unwrap();
            }));
        }
        for _ in 0..t {
            wait.recv().unwrap();
        }
    });
}

/// Runs `calls` with a client team of `client_processors` processors
/// bound to `Null` on a server team with one processor (blocking mode,
/// both), then shuts both down.
fn with_null_service(client_processors: usize, calls: impl FnOnce(&Team, &NullClient)) {
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = Team::builder().runtime_dir(&dir).processors(1).blocking().start().unwrap();
    let client = Team::builder().runtime_dir(&dir).processors(client_processors).blocking().start().unwrap();
    let serving = NullServer::serve(&server, "null", NullImpl).unwrap();
    let c = NullClient::bind(&client, "null").unwrap();
    calls(&client, &c);
    drop((c, serving));
    client.shutdown();
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Node 1 (no processor) and node 2 (one) of a cluster on loopback, in
/// blocking mode, with their runtime dirs under `dir`.
fn two_nodes(dir: &std::path::Path) -> (Team, Team) {
    use std::collections::BTreeMap;
    use std::sync::Arc;
    let free = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let addrs = [free(), free()];
    let team = |node: u16, processors: usize| {
        let peers: BTreeMap<u16, _> = [(3 - node, addrs[2 - node as usize])].into();
        let key: Arc<[u8]> = Arc::from(&b"a cluster key of more than 16 bytes"[..]);
        let cluster = ferry::Cluster {
            node,
            listen: addrs[node as usize - 1],
            peers,
            key,
            tls: None,
            from: Default::default(),
            handshakes_per_source: None,
        };
        let run = dir.join(node.to_string());
        std::fs::create_dir_all(&run).unwrap();
        Team::builder().runtime_dir(run).processors(processors).blocking().cluster(cluster).start().unwrap()
    };
    (team(1, 0), team(2, 1))
}

/// `n` calls one after the other from node 1 to node 2: null RPCs, or gets
/// of 8 bytes of a region.
fn tcp_one_by_one(n: usize, op: &str) {
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    let (client, server) = two_nodes(&dir);
    let _serving = NullServer::serve(&server, "null", NullImpl).unwrap();
    let _region = server.export_with_key("region", 64, ferry::memory::Key::from_bytes([1; 16])).unwrap();
    let c = NullClient::bind(&client, "null").unwrap();
    let r = client.open_region("region", ferry::memory::Key::from_bytes([1; 16])).unwrap();
    let r = if op == "tcp-get-nodeadline" { r.with_timeout(std::time::Duration::MAX) } else { r };
    let mut out = [0u8; 8];
    for _ in 0..n {
        match op {
            "tcp-null" => c.null_blocking().unwrap(),
            _ => r.get(0, &mut out).unwrap(),
        }
    }
    drop((c, r));
    client.shutdown();
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

fn tcp(n: usize) {
    use std::collections::VecDeque;
    let dir = std::env::temp_dir().join(format!("ferry-rtt-{}", std::process::id()));
    let (client, server) = two_nodes(&dir);
    let serving = NullServer::serve(&server, "null", NullImpl).unwrap();
    let c = NullClient::bind(&client, "null").unwrap();
    let mut flying = VecDeque::new();
    let mut issued = 0;
    while issued < n || !flying.is_empty() {
        if flying.len() > 16 || issued == n {
            let f: ferry::rpc::CallFuture<()> = flying.pop_front().unwrap();
            f.wait().unwrap();
            continue;
        }
        let k = (32 - flying.len()).min(n - issued);
        client.batch(|| (0..k).for_each(|_| flying.push_back(c.null())));
        issued += k;
    }
    drop((c, serving));
    client.shutdown();
    server.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
