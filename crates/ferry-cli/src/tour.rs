//! `ferry tour`: starts a second process and walks through the primitives
//! between the two, printing what each costs: first with the two processes
//! as two nodes of a cluster (TCP on loopback), then over shared memory.
//! A third process only relays a link's end, which travels through both.

use ferry::memory::{Key, Step};
use ferry::rpc::RpcError;
use ferry::{Checkpoint, Result, Team};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 2000;

/// The tour's RPC service, served by the second process.
#[ferry::service]
pub trait Greeter {
    async fn greet(&self, name: String) -> String;
    async fn divide(&self, a: i64, b: i64) -> std::result::Result<i64, String>;
    async fn nap(&self, ms: u64);
    async fn count(&self, n: u64);
    async fn echo(&self, data: Vec<u8>) -> Vec<u8>;
}

mod older {
    /// The same service as an older client knew it: refused at bind.
    #[ferry::service]
    pub trait Greeter {
        async fn greet(&self, name: String, polite: bool) -> String;
    }
}

struct GreeterImpl {
    team: Team,
}

impl Greeter for GreeterImpl {
    async fn greet(&self, name: String) -> String {
        format!("hello, {name}")
    }
    async fn divide(&self, a: i64, b: i64) -> std::result::Result<i64, String> {
        a.checked_div(b).ok_or_else(|| format!("cannot divide {a} by {b}"))
    }
    async fn nap(&self, ms: u64) {
        self.team.sleep(Duration::from_millis(ms)).await
    }
    async fn count(&self, _n: u64) {}
    async fn echo(&self, data: Vec<u8>) -> Vec<u8> {
        data
    }
}

/// Median of `rounds` timings of `f`, in nanoseconds.
fn median_ns(rounds: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..rounds / 10 {
        f();
    }
    let mut v: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_nanos() as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn show(what: &str, ns: f64) {
    if ns >= 10_000.0 {
        println!("  {what:58} {:>9.1} µs", ns / 1000.0);
    } else {
        println!("  {what:58} {:>9.0} ns", ns);
    }
}

/// The key of the tour's two-node cluster (both processes know it).
const TOUR_KEY: &[u8] = b"the ferry tour's cluster key";

/// A cluster of two nodes on loopback: node 1 (the tour) and node 2 (its child).
fn tour_cluster(node: u16, ports: (u16, u16)) -> ferry::Cluster {
    let addr = |p| std::net::SocketAddr::from(([127, 0, 0, 1], p));
    let (listen, peer) = if node == 1 { (ports.0, (2, ports.1)) } else { (ports.1, (1, ports.0)) };
    ferry::Cluster {
        node,
        listen: addr(listen),
        peers: [(peer.0, addr(peer.1))].into_iter().collect(),
        key: std::sync::Arc::from(TOUR_KEY),
        tls: None,
        from: Default::default(),
        handshakes_per_source: None,
    }
}

fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(ferry::Error::io("pick a port"))?;
    Ok(l.local_addr().map_err(ferry::Error::io("pick a port"))?.port())
}

pub fn run() -> Result<()> {
    let dir = tempdir()?;
    let _cleanup = RemoveOnDrop(dir.clone());
    let ports = (free_port()?, free_port()?);
    println!("ferry tour — two processes on this machine, runtime dir {}", dir.display());
    let start = |role: &str, ports: &str| -> Result<KillOnDrop> {
        let child = Command::new(std::env::current_exe().expect("own path"))
            .arg(role)
            .env("FERRY_RUNTIME_DIR", &dir)
            .env("TOUR_TCP_PORTS", ports)
            .stdin(Stdio::piped())
            .spawn()
            .map_err(ferry::Error::io("start one of the tour's processes"))?;
        Ok(KillOnDrop(child))
    };
    let _child = start("tour-child", &format!("{},{}", ports.0, ports.1))?;
    let _third = start("tour-third", "")?;
    // Two cores, two processes: each side keeps one thread spinning at most.
    // Here the calling thread drives the team (no processor); the second
    // process runs everything as tasks on its one processor.
    let team = Team::builder().runtime_dir(&dir).processors(0).spin(Duration::from_micros(200)).start()?;
    let result = tcp_tour(&dir, ports).and_then(|()| tour(&team));
    team.shutdown();
    drop((_child, _third));
    result
}

/// The same two processes as two nodes of a cluster, over TCP on loopback
/// (the child's second team is node 2): the program is the same, only the
/// endpoint ids name another node.
fn tcp_tour(dir: &std::path::Path, ports: (u16, u16)) -> Result<()> {
    let node_dir = dir.join("node1");
    std::fs::create_dir_all(&node_dir).map_err(ferry::Error::io("create node 1's runtime dir"))?;
    let team = Team::builder()
        .runtime_dir(&node_dir)
        .processors(0)
        .spin(Duration::from_micros(200))
        .cluster(tour_cluster(1, ports))
        .start()?;
    // Names across nodes: node 1's plane does not have it, node 2 answers.
    let greeter = GreeterClient::bind_wait(&team, "tour.tcp.greeter", Duration::from_secs(10)).map_err(rpc_err)?;
    let echo = team.raw_sender(team.lookup("tour.tcp.echo")?);
    println!(
        "
across nodes — team {} (node 1) and team {} (node 2), TCP on loopback, median of {ROUNDS}:",
        team.id(),
        echo.to().team_id()
    );
    let msg = [7u8; 16];
    show("16-byte port round trip (OnReturn)", median_ns(ROUNDS, || drop(echo.call(&msg).unwrap())));
    show(
        "synchronous call greet(\"ferry\")",
        median_ns(ROUNDS, || drop(greeter.greet_blocking("ferry".into()).unwrap())),
    );
    let per_call = median_ns(ROUNDS / 20, || {
        let calls = team.batch(|| (0..32).map(|_| greeter.greet("ferry".into())).collect::<Vec<_>>());
        calls.into_iter().for_each(|c| drop(c.wait().unwrap()));
    }) / 32.0;
    show("32 calls in flight, written together (Team::batch), per call", per_call);
    memory_tour(&team, "tour.tcp.region")?;
    fifo_signal_tour(&team, "tour.tcp")?;
    link_tour(&team, "tour.tcp.links")?;
    team.shutdown();
    Ok(())
}

/// The other process's fifo `{prefix}.fifo` (a task of its dequeues it,
/// and answers elements that start with "rt" into our `{prefix}.replies`)
/// and its signal handler `{prefix}.signal`.
fn fifo_signal_tour(team: &Team, prefix: &str) -> Result<()> {
    let mut jobs =
        team.open_fifo_at(team.lookup_wait(&format!("{prefix}.fifo"), Duration::from_secs(10))?, REGION_KEY)?;
    let mut replies = team.fifo_with_key(&format!("{prefix}.replies"), 64, 64, REGION_KEY)?;
    let rounds = if jobs.id().node() == team.id().node { ROUNDS } else { ROUNDS / 4 };
    println!("\nfifos and signals — the other process's fifo and handler, median of {rounds}:");
    let per_element = median_ns(rounds / 10, || {
        for i in 0..100u64 {
            jobs.enqueue_timeout(&i.to_le_bytes(), Duration::from_secs(10)).unwrap();
        }
    }) / 100.0;
    show("enqueue 8 bytes, one way (a task of the other process dequeues)", per_element);
    show(
        "RPC over two fifos: a request into its fifo, the reply into ours",
        median_ns(rounds, || {
            jobs.enqueue_timeout(b"rt", Duration::from_secs(10)).unwrap();
            replies.dequeue_timeout(Duration::from_secs(10)).unwrap();
        }),
    );
    let s = team.signaller(&format!("{prefix}.signal"))?;
    show("signal, accepted by its runtime", median_ns(rounds, || s.signal(b"x").unwrap()));
    show(
        "signal_done: its handler ran (a task of the other process)",
        median_ns(rounds, || team.block_on(s.signal_done(b"x")).unwrap()),
    );
    Ok(())
}

/// The other process's side of `fifo_signal_tour`: the fifo, the task that
/// drains it, the signal handler.
fn serve_fifo_and_signal(team: &Team, prefix: &str) -> Result<ferry::signal::Signal> {
    let mut fifo = team.fifo_with_key(&format!("{prefix}.fifo"), 1024, 64, REGION_KEY)?;
    let (t, replies_name) = (team.clone(), format!("{prefix}.replies"));
    drop(team.spawn(async move {
        let mut replies = None;
        while let Ok(e) = fifo.dequeue().await {
            if e.starts_with(b"rt") {
                let r = match &mut replies {
                    Some(r) => r,
                    None => replies.insert(t.open_fifo(&replies_name, REGION_KEY)?),
                };
                r.enqueue_async(&t, &e).await?;
            }
        }
        Ok::<(), ferry::Error>(())
    }));
    team.on_signal(&format!("{prefix}.signal"), ferry::signal::Mode::EveryTime, |_| {})
}

/// A link to the other process's team (made at its listener `name`); a
/// task of the other process answers each message with its bytes.
fn link_tour(team: &Team, name: &str) -> Result<()> {
    let link = team.link_to(team.lookup_wait(name, Duration::from_secs(10))?)?;
    println!("\nlinks — {} to the other process's team, median of {ROUNDS}:", link.id());
    let msg = [7u8; 16];
    show(
        "16-byte request and its reply on the link",
        median_ns(ROUNDS, || drop(link.send_bytes(&msg, ferry::Checkpoint::OnReturn).unwrap())),
    );
    Ok(())
}

/// The other process's side of `link_tour`: a listener at `name`, and a
/// task per link made there that answers each message with its bytes.
fn serve_links(team: &Team, name: &str) -> Result<()> {
    let listener = team.named_link_listener(name)?;
    let t = team.clone();
    drop(team.spawn(async move {
        while let Ok(link) = listener.accept().await {
            drop(t.spawn(async move {
                while let Ok(m) = link.recv_bytes().await {
                    let bytes = m.value.clone();
                    if m.reply_bytes(&bytes).is_err() {
                        break;
                    }
                }
            }));
        }
    }));
    Ok(())
}

/// A link whose end travels: from here to the other process, on to the
/// third, and back, each holder saying who it is on it, while the end that
/// stays here sends all along.
fn moving_link_tour(team: &Team) -> Result<()> {
    let home = team.open_named_port::<ferry::link::Link>("tour.home")?;
    let first = team.connect_wait::<ferry::link::Link>("tour.relay", Duration::from_secs(10))?;
    team.lookup_wait("tour.third", Duration::from_secs(10))?;
    let (near, far) = team.link_pair()?;
    let near = near.with_timeout(Duration::from_secs(10));
    println!("\na link moving between three processes — {}:", near.id());
    for i in 0..50u32 {
        near.send(&i, Checkpoint::Immediate)?; // they wait in `far`, and travel with it
    }
    first.send(&far, Checkpoint::OnReceipt)?;
    let far = home.recv_timeout(Duration::from_secs(10))?.into_value().with_timeout(Duration::from_secs(10));
    let holders = [near.recv_blocking::<String>()?.value, near.recv_blocking::<String>()?.value];
    let in_order = (0..50u32).all(|i| far.recv_blocking::<u32>().is_ok_and(|m| m.value == i));
    println!("  its end went from team {} to {} and came back;", team.id(), holders.join(", then "));
    println!(
        "  the 50 messages sent to it meanwhile arrived {}",
        if in_order { "once each, in order" } else { "WRONG" }
    );
    let mut far = Some(far);
    show(
        "a trip of the end through both other processes and back (3 moves)",
        median_ns(50, || {
            first.send(&far.take().unwrap(), Checkpoint::OnReceipt).unwrap();
            far = Some(home.recv_timeout(Duration::from_secs(10)).unwrap().into_value());
            for _ in 0..2 {
                near.recv_blocking::<String>().unwrap();
            }
        }),
    );
    let far = far.take().unwrap();
    show(
        "then a 16-byte message from one end to the other (both here now)",
        median_ns(ROUNDS, || {
            near.send_bytes(&[7u8; 16], Checkpoint::Immediate).unwrap();
            far.recv_bytes_blocking().unwrap();
        }),
    );
    // This team has no processor: its frames are served while it waits.
    let t = Instant::now();
    while team.link_routers().proxies > 0 && t.elapsed() < Duration::from_secs(10) {
        team.block_on(team.sleep(Duration::from_millis(1)));
    }
    println!("  this team's link routers now: {:?} (no proxy stays once the route is repaired)", team.link_routers());
    Ok(())
}

/// Passes every link end that comes to port `name` on to the port named
/// `next`, after saying on it who holds it (a thread of its own: the tour
/// keeps it simple).
fn relay_ends(team: &Team, name: &str, next: &'static str) -> Result<()> {
    let port = team.open_named_port::<ferry::link::Link>(name)?;
    let team = team.clone();
    std::thread::spawn(move || {
        let mut to = None;
        while let Ok(m) = port.recv_blocking() {
            let end = m.into_value();
            let _ = end.send(&format!("team {}", team.id()), Checkpoint::Immediate);
            let to = match &mut to {
                Some(to) => to,
                None => match team.connect_wait::<ferry::link::Link>(next, Duration::from_secs(10)) {
                    Ok(s) => to.insert(s),
                    Err(_) => return,
                },
            };
            if to.send(&end, Checkpoint::OnReceipt).is_err() {
                return;
            }
        }
    });
    Ok(())
}

/// The third process: relays link ends back to the tour.
pub fn third() -> Result<()> {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let team = Team::builder().processors(1).spin(Duration::from_micros(200)).start()?;
    relay_ends(&team, "tour.third", "tour.home")?;
    loop {
        std::thread::park();
    }
}

/// The key of the tour's regions (both processes know it).
const REGION_KEY: Key = Key::from_bytes(*b"the tour's key!!");
/// Where the tour's regions lay out a path: word 0 points to the record at
/// 64, whose field 8 points to the 8 bytes at 256.
const PATH: [Step; 3] = [Step::Indirect, Step::Field(8), Step::Indirect];

/// The other process's region `name`, exported with its path laid out.
fn export_region(team: &Team, name: &str) -> Result<ferry::memory::Region> {
    let r = team.export_with_key(name, 4096, REGION_KEY)?;
    r.put(0, &64u64.to_le_bytes())?;
    r.put(72, &256u64.to_le_bytes())?;
    r.put(256, b"a region")?;
    Ok(r)
}

/// Remote memory: the other process's region, mapped here (one machine)
/// or served by its owner (another node); each operation's cost.
fn memory_tour(team: &Team, name: &str) -> Result<()> {
    let r = team.open_region_at(team.lookup_wait(name, Duration::from_secs(10))?, REGION_KEY)?;
    // Cheap operations are timed 100 at a time (a clock read costs more than they do).
    let (per, rounds) = if r.is_mapped() { (100, ROUNDS / 10) } else { (1, ROUNDS) };
    let cost = |f: &mut dyn FnMut()| median_ns(rounds, || (0..per).for_each(|_| f())) / per as f64;
    println!(
        "\nremote memory — region {name} of the other process's team, {}, median of {}:",
        if r.is_mapped() {
            "mapped here (loads, stores, atomics: no message)"
        } else {
            "served by its owner's runtime"
        },
        rounds * per
    );
    let mut out = [0u8; 8];
    show("get 8 bytes", cost(&mut || r.get(256, &mut out).unwrap()));
    show("put 64 bytes", cost(&mut || r.put(1024, &[7u8; 64]).unwrap()));
    show(
        "fetch_add on a u64",
        cost(&mut || {
            std::hint::black_box(r.fetch_add(2048, 1).unwrap());
        }),
    );
    show("path read: 3 steps (2 pointers), then 8 bytes", cost(&mut || r.get_path(0, &PATH, &mut out).unwrap()));
    if r.is_mapped() {
        let local = std::hint::black_box([7u8; 8]);
        show(
            "the floor: 8 bytes of this process's own memory",
            cost(&mut || {
                std::hint::black_box(local);
            }),
        );
    } else {
        show(
            "put 64 bytes, acknowledged (a future)",
            cost(&mut || team.block_on(r.put_async(1024, &[7u8; 64])).unwrap()),
        );
    }
    println!("  path read gave {:?}; every access is checked:", String::from_utf8_lossy(&out));
    println!("    put(4090, 8 bytes) = {}", r.put(4090, &[0; 8]).unwrap_err());
    println!("    fetch_add(4, 1) = {}", r.fetch_add(4, 1).unwrap_err());
    println!("    open with a wrong key = {}", team.open_region(name, Key::from_bytes([0; 16])).err().unwrap());
    Ok(())
}

/// The tour's runtime dir goes away with the tour, even if it fails.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The second process never outlives the tour, even if the tour fails.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn tour(team: &Team) -> Result<()> {
    let echo = team.lookup_wait("tour.echo", Duration::from_secs(10))?;
    let echo = team.sender::<Vec<u8>>(echo);
    let peer = echo.to().team_id();
    println!("\nteam {} talks to team {} (endpoint {}) over shared memory\n", team.id(), peer, echo.to());

    println!("ports — one 16-byte message, median of {ROUNDS}:");
    let msg = vec![7u8; 16];
    // Immediate only buffers: time bursts that fit the channel, then wait for the receiver.
    let burst = 256;
    let per_msg = median_ns(40, || {
        for _ in 0..burst {
            echo.send(&msg, Checkpoint::Immediate).unwrap();
        }
        echo.send(&msg, Checkpoint::OnDelivery).unwrap();
    }) / (burst + 1) as f64;
    show("send, Immediate (buffered in the channel), per message", per_msg);
    show(
        "send, OnReceipt (peer runtime has it)",
        median_ns(ROUNDS, || echo.send(&msg, Checkpoint::OnReceipt).unwrap()),
    );
    show(
        "send, OnDelivery (a peer task took it)",
        median_ns(ROUNDS, || echo.send(&msg, Checkpoint::OnDelivery).unwrap()),
    );
    show(
        "send, OnReturn (peer replied): a round trip",
        median_ns(ROUNDS, || drop(echo.call::<Vec<u8>>(&msg).unwrap())),
    );

    let raw = team.raw_sender(echo.to());
    let bytes = vec![1u8; 1000];
    show("raw 1000-byte round trip (no codec)", median_ns(ROUNDS, || drop(raw.call(&bytes).unwrap())));

    let local = team.open_port::<Vec<u8>>()?;
    let to_local = team.sender::<Vec<u8>>(local.id());
    show(
        "same team: send + receive (task hand-off, no shared memory)",
        median_ns(ROUNDS, || {
            to_local.send(&msg, Checkpoint::Immediate).unwrap();
            local.recv_blocking().unwrap();
        }),
    );

    println!(
        "\nlarge messages — out of band: copied once into the channel's payload area, a descriptor through the ring:"
    );
    for size in [64 << 10, 1 << 20, 16 << 20] {
        let big = vec![3u8; size];
        let rounds = if size > 1 << 20 { 5 } else { 50 };
        let ns = median_ns(rounds, || drop(raw.send(&big, Checkpoint::OnReceipt).unwrap()));
        let gbps = size as f64 / ns;
        show(&format!("{} KiB one way, OnReceipt ({gbps:.2} GB/s)", size >> 10), ns);
    }

    rpc_tour(team)?;
    memory_tour(team, "tour.region")?;
    fifo_signal_tour(team, "tour")?;
    link_tour(team, "tour.links")?;
    moving_link_tour(team)?;

    println!("\nbackpressure: Immediate sends into a receiver that does not keep up");
    echo.send(&b"pause".to_vec(), Checkpoint::OnDelivery)?; // the receiver stops reading for a while
    let mut sent = 0;
    let err = loop {
        match echo.send(&msg, Checkpoint::Immediate) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        if sent == 1_000_000 {
            unreachable!("a bounded channel took a million messages");
        }
    };
    println!("  {sent} messages buffered, then: \"{err}\" (nothing dropped; the sender decides)");
    echo.send(&msg, Checkpoint::OnDelivery)?;

    println!("\nfailure: the peer is killed while a call waits on it");
    raw.send(b"die", Checkpoint::OnReceipt)?;
    let t = Instant::now();
    match raw.call(b"are you there?") {
        Err(e) => show(&format!("call failed with \"{e}\" after"), t.elapsed().as_nanos() as f64),
        Ok(_) => println!("  unexpected: the dead peer answered"),
    }
    println!("\nmore primitives (groups, bulk transfer, ...) join this tour as they land.");
    Ok(())
}

/// An RPC error as the tour's error.
fn rpc_err(e: RpcError) -> ferry::Error {
    ferry::Error::Io { context: "RPC tour", source: std::io::Error::other(e.to_string()) }
}

fn rpc_tour(team: &Team) -> Result<()> {
    println!("\nRPC — #[ferry::service] trait Greeter, served in the other process:");
    let g = GreeterClient::bind(team, "tour.greeter").map_err(rpc_err)?;
    show("synchronous call greet(\"ferry\")", median_ns(ROUNDS, || drop(g.greet_blocking("ferry".into()).unwrap())));
    show(
        "asynchronous: 100 promises in flight, per call",
        median_ns(50, || {
            let calls: Vec<_> = (0..100).map(|_| g.greet("ferry".into())).collect();
            for c in calls {
                c.wait().unwrap();
            }
        }) / 100.0,
    );
    show("one-way count(1), OnReceipt", median_ns(ROUNDS, || g.count_oneway(1, Checkpoint::OnReceipt).unwrap()));
    show(
        "batched: 100 one-way calls flushed by one call, per call",
        median_ns(50, || {
            for i in 0..100 {
                g.count_batched(i).unwrap();
            }
            g.flush().unwrap();
        }) / 100.0,
    );
    // A plain Vec<u8> travels as MessagePack bin, encoded straight into the
    // payload area and decoded straight out of it: one copy each way.
    let data = vec![7u8; 16 << 20];
    let ns = median_ns(5, || {
        let back = g.echo_blocking(data.clone()).unwrap();
        assert_eq!(back.len(), data.len());
    });
    show(
        &format!(
            "echo(Vec<u8> of 16 MiB), a fresh value each way ({:.2} GB/s both ways)",
            2.0 * data.len() as f64 / ns
        ),
        ns,
    );
    println!("  greet(\"ferry\") = {:?}", g.greet_blocking("ferry".into()).map_err(rpc_err)?);
    println!("  divide(1, 0) = {:?}", g.divide_blocking(1, 0).unwrap_err());
    let t = Instant::now();
    let late = g.with_timeout(Duration::from_millis(20)).nap_blocking(1000);
    println!(
        "  nap(1000 ms) with a 20 ms deadline = {:?} after {:?} (the handler is cancelled at the server)",
        late.unwrap_err(),
        t.elapsed()
    );
    match older::GreeterClient::bind(team, "tour.greeter") {
        Err(e) => println!("  an older client binding: {e}"),
        Ok(_) => println!("  unexpected: an older client was accepted"),
    }
    Ok(())
}

/// The second process: echoes every call; on "die" it exits abruptly mid-call.
pub fn child() -> Result<()> {
    // Die with the tour, whatever happens to it.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let team = Team::builder().processors(1).spin(Duration::from_micros(200)).start()?;
    let _greeter = GreeterServer::serve(&team, "tour.greeter", GreeterImpl { team: team.clone() })?;
    let port = team.open_named_raw_port("tour.echo")?;
    let _echo = team.spawn(echo(team.clone(), port));
    let _region = export_region(&team, "tour.region")?;
    let _signal = serve_fifo_and_signal(&team, "tour")?;
    serve_links(&team, "tour.links")?;
    relay_ends(&team, "tour.relay", "tour.third")?;
    // Node 2 of the tour's cluster: the same services, reached over TCP.
    let ports = std::env::var("TOUR_TCP_PORTS").unwrap_or_default();
    let ports: Vec<u16> = ports.split(',').filter_map(|p| p.parse().ok()).collect();
    let dir = std::path::PathBuf::from(std::env::var("FERRY_RUNTIME_DIR").unwrap_or_default()).join("node2");
    std::fs::create_dir_all(&dir).map_err(ferry::Error::io("create node 2's runtime dir"))?;
    let node2 = Team::builder()
        .runtime_dir(&dir)
        .processors(1)
        .spin(Duration::from_micros(200))
        .cluster(tour_cluster(2, (ports[0], ports[1])))
        .start()?;
    let _greeter2 = GreeterServer::serve(&node2, "tour.tcp.greeter", GreeterImpl { team: node2.clone() })?;
    let port2 = node2.open_named_raw_port("tour.tcp.echo")?;
    let _echo2 = node2.spawn(echo(node2.clone(), port2));
    let _region2 = export_region(&node2, "tour.tcp.region")?;
    let _signal2 = serve_fifo_and_signal(&node2, "tour.tcp")?;
    serve_links(&node2, "tour.tcp.links")?;
    // This thread only waits (in the kernel) until the tour ends the process.
    loop {
        std::thread::park();
    }
}

/// The second process's echo port: answers calls with their payload; on
/// "pause" stops reading for a while; on "die" aborts at the next message.
async fn echo(team: Team, port: ferry::RawPort) -> Result<()> {
    let pause = ferry::codec::encode(&b"pause".to_vec())?; // as the tour's typed sender sends it
    let mut dying = false;
    loop {
        let m = port.recv().await?;
        if dying {
            std::process::abort();
        }
        if m.payload() == b"die" {
            dying = true;
        } else if m.payload() == pause {
            team.sleep(Duration::from_millis(500)).await;
        } else if m.wants_reply() {
            let body = m.payload().to_vec();
            m.reply(&body)?;
        }
    }
}

fn tempdir() -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("ferry-tour-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(ferry::Error::io("create the tour's runtime dir"))?;
    Ok(dir)
}
