//! Three nodes in real network namespaces, made by `scripts/netns-test.sh`
//! (which runs these tests): one team per namespace, each a process started
//! with `ip netns exec`, talking over TCP between addresses that exist only
//! among the namespaces. Ports and RPC across them, a team killed mid-call,
//! a link cut mid-call, the owner of a region, a fifo and a signal handler
//! killed, one of a fifo's two producers killed. Teams in PID namespaces of
//! their own (containers): with one team number on two nodes, and two on
//! one node.

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};
use common::Child;
use ferry::{Error, Team};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const START: Duration = Duration::from_secs(30);
/// Bytes of the large echo.
const LARGE: usize = 64 << 20;

/// A large echo, typed as a new user writes it (a `String`: MessagePack
/// str moves at copy speed even in a debug build, where 64 Mi integers of
/// a `Vec<u8>` encoded one by one took a minute).
#[ferry::service]
trait Large {
    async fn echo(&self, data: String) -> String;
}

struct LargeImpl;

impl Large for LargeImpl {
    async fn echo(&self, data: String) -> String {
        data
    }
}

/// The large echo's text for call `i` (differing per byte and per call).
fn large_payload(i: usize) -> String {
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ!";
    // 63 is prime to every power of two: no read or frame boundary lines up with it.
    let block: Vec<u8> = (0..63 * 4096).map(|k| alphabet[(k + k / 63 + i) % 63]).collect();
    String::from_utf8(block.iter().copied().cycle().take(LARGE).collect()).unwrap()
}
/// The key of the server's region.
const REGION_KEY: ferry::memory::Key = ferry::memory::Key::from_bytes(*b"netns region key");

/// How long a silent peer lasts (heartbeats every quarter of it).
const PEER_TIMEOUT: Duration = Duration::from_secs(2);

#[test]
#[ignore = "run as a child process by the other tests"]
fn child_entry() {
    let Some(role) = common::child_role() else { return };
    // FERRY_RUNTIME_DIR and FERRY_CLUSTER say which node this is.
    let team = Team::builder().peer_timeout(PEER_TIMEOUT).start().unwrap();
    match role.as_str() {
        // Echoes on "echo", serves "calc", and holds what comes to "hold".
        "server" => {
            let echo = team.open_named_port::<String>("echo").unwrap();
            let hold = team.open_named_port::<String>("hold").unwrap();
            let _serving = CalcServer::serve(&team, "calc", CalcImpl).unwrap();
            let _large = LargeServer::serve(&team, "large", LargeImpl).unwrap();
            let region = team.export_with_key("region", 4096, REGION_KEY).unwrap();
            // Drained by a task: producers never find it full.
            let mut fifo = team.fifo_with_key("fifo", 64, 8, REGION_KEY).unwrap();
            let _draining = team.spawn(async move { while fifo.dequeue().await.is_ok() {} });
            let _signal = team.on_signal("signal", ferry::signal::Mode::EveryTime, |_| {}).unwrap();
            common::say(format!("echo {}", echo.id()));
            common::say(format!("hold {}", hold.id()));
            common::say(format!("calc {}", team.lookup("calc").unwrap()));
            common::say(format!("large {}", team.lookup("large").unwrap()));
            common::say(format!("region {}", region.id()));
            common::say(format!("fifo {} {}", team.lookup("fifo").unwrap(), team.lookup("signal").unwrap()));
            // Answers "fds" with its count of descriptors.
            std::thread::spawn(|| {
                while let Some(line) = common::hear() {
                    if line == "fds" {
                        common::say(format!("fds {}", common::fd_count()));
                    }
                }
            });
            let holder = std::thread::spawn(move || {
                let mut held = Vec::new();
                while let Ok(m) = hold.recv_blocking() {
                    common::say("holding");
                    held.push(m);
                }
            });
            while let Ok(m) = echo.recv_blocking() {
                let v = m.value.clone();
                m.reply(&v).unwrap();
            }
            holder.join().unwrap();
        }
        // Owns the fifo "ordered" and drains it, checking that each
        // producer's elements (its number, then the element's: u32 each)
        // come in its order; answers "state" with what it has seen.
        "fifo-owner" => {
            let mut fifo = team.fifo_with_key("ordered", 64, 8, REGION_KEY).unwrap();
            common::say(format!("fifo {}", fifo.id()));
            // Producers with a ring, elements taken of producers 0 and 1, the first fault.
            let seen = Arc::new(Mutex::new((0usize, [0u32; 2], None::<String>)));
            let answers = seen.clone();
            std::thread::spawn(move || {
                while let Some(line) = common::hear() {
                    if line == "state" {
                        let (producers, [n0, n1], fault) = answers.lock().clone();
                        common::say(format!("state {producers} {n0} {n1} {}", fault.as_deref().unwrap_or("-")));
                    }
                }
            });
            loop {
                let took = fifo.dequeue_timeout(Duration::from_millis(100));
                let producers = fifo.producers();
                let mut seen = seen.lock();
                seen.0 = producers;
                let fault = match took {
                    Ok(e) => {
                        let word = |i: usize| u32::from_le_bytes(e[i..i + 4].try_into().unwrap());
                        let (who, n) = (word(0), word(4));
                        match seen.1.get_mut(who as usize) {
                            Some(next) if *next == n => {
                                *next += 1;
                                None
                            }
                            Some(next) => Some(format!("producer-{who}-sent-{n}-after-{}", *next)),
                            None => Some(format!("no-producer-{who}")),
                        }
                    }
                    Err(Error::DeadlineExceeded) => None,
                    Err(e) => Some(format!("{e:?}").replace(' ', "")),
                };
                if seen.2.is_none() {
                    seen.2 = fault;
                }
            }
        }
        // Does what the parent says, one line at a time, and says how it went.
        "client" => {
            common::say("ready");
            while let Some(line) = common::hear() {
                let words: Vec<&str> = line.split_whitespace().collect();
                let id = |i: usize| words[i].parse::<ferry::EndpointId>().unwrap();
                let outcome = match words[0] {
                    "echo" => {
                        let to = team.sender::<String>(id(1));
                        (0..100).try_for_each(|i| {
                            let back: String = to.call(&format!("{i}"))?;
                            assert_eq!(back, format!("{i}"));
                            Ok::<_, Error>(())
                        })
                    }
                    // By name: the other nodes are asked for it.
                    "calc-by-name" => CalcClient::bind(&team, words[1])
                        .map_err(rpc_error)
                        .and_then(|c| c.add_blocking(1, 2).map(|r| assert_eq!(r, 3)).map_err(rpc_error)),
                    // Two 64 MiB echoes, their bytes checked.
                    "large" => LargeClient::bind_to(&team, id(1)).map_err(rpc_error).and_then(|c| {
                        (0..2).try_for_each(|i| {
                            let sent = large_payload(i);
                            let back = c.echo_blocking(sent.clone()).map_err(rpc_error)?;
                            assert!(back == sent, "call {i}: the 64 MiB echo came back altered");
                            Ok(())
                        })
                    }),
                    // A look-up by name (the other nodes are asked), and the endpoint it should find.
                    "lookup" => team.lookup(words[1]).map(|ep| assert_eq!(ep.to_string(), words[2])),
                    "calc" => CalcClient::bind_to(&team, id(1)).map_err(rpc_error).and_then(|c| {
                        (0..100).try_for_each(|i| c.add_blocking(i, i).map(|r| assert_eq!(r, 2 * i)).map_err(rpc_error))
                    }),
                    // Echo calls to two endpoints at once, the second's
                    // first contact while calls to the first are in flight;
                    // every 10th call by a new sender (a route look-up).
                    "both" => {
                        let (first, second) = (id(1), id(2));
                        let calls = |to: ferry::EndpointId| {
                            let team = &team;
                            move || {
                                let mut s = team.sender::<String>(to);
                                (0..200).try_for_each(|i| {
                                    if i % 10 == 0 {
                                        s = team.sender::<String>(to);
                                    }
                                    let back: String = s.call(&format!("{i}"))?;
                                    assert_eq!(back, format!("{i}"));
                                    Ok::<_, Error>(())
                                })
                            }
                        };
                        team.sender::<String>(first).call::<String>(&"first".into()).and_then(|_| {
                            std::thread::scope(|s| {
                                let a = s.spawn(calls(first));
                                let b = s.spawn(calls(second));
                                a.join().unwrap().and(b.join().unwrap())
                            })
                        })
                    }
                    // Opens a region, says so, then adds to its first word
                    // until an operation fails (at most 20 s).
                    "region-until-gone" => team.open_region_at(id(1), REGION_KEY).and_then(|r| {
                        common::say("opened");
                        let until = Instant::now() + Duration::from_secs(20);
                        while Instant::now() < until {
                            r.fetch_add(0, 1)?;
                        }
                        Ok(())
                    }),
                    // A thousand additions to a region's first word.
                    "region-add" => team
                        .open_region_at(id(1), REGION_KEY)
                        .and_then(|r| (0..1000).try_for_each(|_| r.fetch_add(0, 1).map(drop))),
                    // Opens the fifo and the signal handler, says so, then
                    // enqueues and signals until one fails (at most 20 s).
                    "fifo-and-signal-until-gone" => team.open_fifo_at(id(1), REGION_KEY).and_then(|mut f| {
                        let s = team.signaller_at(id(2));
                        s.signal(b"")?;
                        common::say("opened");
                        let until = Instant::now() + Duration::from_secs(20);
                        while Instant::now() < until {
                            f.enqueue_timeout(b"x", Duration::from_secs(5))?;
                            s.signal(b"")?;
                        }
                        Ok(())
                    }),
                    // Opens the fifo, enqueues its elements (its number
                    // `who`, then the element's: u32 each) in order, says
                    // "opened" after the first 100, and goes on until told
                    // "stop" (at most 60 s) or an enqueue fails; says how
                    // many it enqueued.
                    "fifo-stream" => team.open_fifo_at(id(1), REGION_KEY).and_then(|mut f| {
                        let who: u32 = words[2].parse().unwrap();
                        let stop = Arc::new(AtomicBool::new(false));
                        let until = Instant::now() + Duration::from_secs(60);
                        let mut n = 0u32;
                        while !stop.load(Ordering::SeqCst) && Instant::now() < until {
                            f.enqueue_timeout(&[who.to_le_bytes(), n.to_le_bytes()].concat(), Duration::from_secs(5))?;
                            n += 1;
                            if n == 100 {
                                common::say("opened");
                                let stop = stop.clone();
                                std::thread::spawn(move || {
                                    common::hear();
                                    stop.store(true, Ordering::SeqCst);
                                });
                            }
                        }
                        common::say(format!("sent {n}"));
                        Ok(())
                    }),
                    "hold" => {
                        // A limit of 0: no deadline at all.
                        let limit: u64 = words[2].parse().unwrap();
                        let to = team.sender::<String>(id(1));
                        let to = if limit == 0 { to } else { to.with_timeout(Duration::from_millis(limit)) };
                        to.call::<String>(&"wait".into()).map(drop)
                    }
                    other => panic!("unknown command {other}"),
                };
                common::say(match outcome {
                    Ok(()) => "ok".to_string(),
                    Err(e) => format!("err {e:?}"),
                });
            }
        }
        other => panic!("unknown role {other}"),
    }
}

/// An RPC failure as the child's outcome: the runtime's error as it is,
/// any other as its text.
fn rpc_error(e: ferry::rpc::RpcError) -> Error {
    match e {
        ferry::rpc::RpcError::Ferry(e) => e,
        other => Error::Io { context: "RPC", source: std::io::Error::other(other.to_string()) },
    }
}

/// The namespaces' name prefix and the work directory with the cluster files.
fn netns() -> (String, PathBuf) {
    let prefix = std::env::var("FERRY_NETNS").expect("run by scripts/netns-test.sh, which makes the namespaces");
    (prefix, PathBuf::from(std::env::var("FERRY_NETNS_WORK").unwrap()))
}

/// The namespace of node `n` (a, b or c: nodes 1, 2, 3).
fn namespace(n: &str) -> String {
    let (prefix, _) = netns();
    format!("{prefix}-{}", "abc".find(n).expect("node a, b or c") + 1)
}

/// Starts `role` as node `n` in its namespace.
fn node(n: &str, role: &str) -> Child {
    let (_, work) = netns();
    let cluster = work.join(format!("{n}.cluster"));
    Child::spawn_in_netns(&namespace(n), role, &work.join(format!("{n}.run")), &[("FERRY_CLUSTER", &cluster)])
}

/// Starts `role` as node `n` in its namespace and in a PID namespace of
/// its own (`unshare --pid --fork`): the test binary is pid 1 there, so its
/// team number is 1, as a container's first process's is.
fn node_as_pid_1(n: &str, role: &str) -> Child {
    let (_, work) = netns();
    let ns = namespace(n);
    let under = ["unshare", "--pid", "--fork", "--kill-child", "ip", "netns", "exec", &ns];
    let mut cmd = Child::command_under(&under, "child_entry", role, &work.join(format!("{n}.run")));
    cmd.env("FERRY_CLUSTER", work.join(format!("{n}.cluster")));
    Child::from_command(cmd, role)
}

/// A server's endpoints, as it said them.
struct Server {
    child: Child,
    echo: String,
    hold: String,
    calc: String,
    large: String,
    region: String,
    fifo_and_signal: String,
}

fn server(n: &str) -> Server {
    serving(node(n, "server"))
}

fn serving(mut child: Child) -> Server {
    let echo = child.expect("echo ", START);
    let hold = child.expect("hold ", START);
    let calc = child.expect("calc ", START);
    let large = child.expect("large ", START);
    let region = child.expect("region ", START);
    let fifo_and_signal = child.expect("fifo ", START);
    Server { child, echo, hold, calc, large, region, fifo_and_signal }
}

/// The client, node a, ready for commands.
fn client() -> Child {
    let mut client = node("a", "client");
    client.expect("ready", START);
    client
}

/// Sets node `n`'s link `up` or `down`.
fn set_link(n: &str, state: &str) {
    let status = std::process::Command::new("ip").args(["-n", &namespace(n), "link", "set", "eth0", state]).status();
    assert!(status.unwrap().success(), "ip link set {state} in node {n}");
}

/// Tells the client a command; its answer within `limit`.
fn ask(client: &mut Child, cmd: &str, limit: Duration) -> String {
    client.tell(cmd);
    let took = Instant::now();
    let line = client.expect("", limit);
    eprintln!("{cmd} -> {line} ({:?})", took.elapsed());
    line
}

#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn ports_and_rpc_across_three_nodes() {
    let (b, c) = (server("b"), server("c"));
    let mut client = client();
    for s in [&b, &c] {
        assert_eq!(ask(&mut client, &format!("echo {}", s.echo), START), "ok");
        assert_eq!(ask(&mut client, &format!("calc {}", s.calc), START), "ok");
    }
    // Names registered on nodes b and c, looked up from node a.
    assert_eq!(ask(&mut client, "calc-by-name calc", START), "ok");
}

/// Issue 16: a large message across machines streams through the
/// connection (its payload read straight into a buffer of its own): a
/// typed 64 MiB echo between two nodes, twice, comes back intact.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_typed_64_mib_echo_crosses_two_nodes_intact() {
    let b = server("b");
    let mut client = client();
    assert_eq!(ask(&mut client, &format!("large {}", b.large), Duration::from_secs(120)), "ok");
}

/// Defect 1 of issue 15: routes were keyed by team number alone, so a
/// team talking to `2.1` lost its route to `3.1` (containers: every node's
/// first process is pid 1). Nodes b and c run their teams as pid 1 of PID
/// namespaces of their own; node a calls both at once, in both orders of
/// first contact, each first contact while calls to the other are in
/// flight, with new senders (route look-ups) all along.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn teams_with_one_number_on_two_nodes_are_both_reached() {
    let (b, c) = (serving(node_as_pid_1("b", "server")), serving(node_as_pid_1("c", "server")));
    let number = |s: &Server| s.echo.parse::<ferry::EndpointId>().unwrap().team_id();
    let (tb, tc) = (number(&b), number(&c));
    assert_eq!((tb.node, tb.team, tc.node, tc.team), (2, 1, 3, 1), "not one number on two nodes");
    for (first, second) in [(&b, &c), (&c, &b)] {
        let mut client = client();
        assert_eq!(ask(&mut client, &format!("both {} {}", first.echo, second.echo), START), "ok");
        // And RPC to both, on the routes the sends made.
        for s in [first, second] {
            assert_eq!(ask(&mut client, &format!("calc {}", s.calc), START), "ok");
        }
    }
}

/// Defect 2 of issue 15: two teams of one node in PID namespaces of their
/// own (containers sharing a runtime directory). The acceptor of a bind
/// checked the pid in the connector's lock file against the pid the kernel
/// reports for the socket's other end, which another PID namespace sees
/// otherwise (or not at all): binds were refused and the connector told
/// `NoSuchTeam`. Both teams are pid 1, each in its own namespace.
#[test]
#[ignore = "run by scripts/netns-test.sh (PID namespaces need root)"]
fn teams_in_two_pid_namespaces_of_one_node_bind() {
    let dir = tempfile::tempdir().unwrap();
    let own_pid_ns = ["unshare", "--pid", "--fork", "--kill-child"];
    let spawn = |role| Child::from_command(Child::command_under(&own_pid_ns, "child_entry", role, dir.path()), role);
    let server = serving(spawn("server"));
    let mut client = spawn("client");
    client.expect("ready", START);
    assert_eq!(ask(&mut client, &format!("echo {}", server.echo), START), "ok");
    assert_eq!(ask(&mut client, &format!("calc {}", server.calc), START), "ok");
}

/// A team killed (SIGKILL) while a call to it waits: the call fails with
/// `PeerGone` (its kernel closes the connection), well before any timeout.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_team_killed_mid_call_fails_the_call() {
    let mut b = server("b");
    let mut client = client();
    client.tell(&format!("hold {} 60000", b.hold));
    b.child.expect("holding", START);
    let t0 = Instant::now();
    b.child.kill();
    let answer = client.expect("", Duration::from_secs(20));
    assert!(answer.starts_with("err PeerGone"), "{answer}");
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
}

/// A region's owner killed while an importer on another node uses it: the
/// importer's next operation fails with `PeerGone`, well before any timeout.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_regions_owner_killed_fails_its_importers_operations() {
    an_owner_killed_fails_its_user(|b| format!("region-until-gone {}", b.region));
}

/// An importer on another node killed while it uses a region: the owner
/// works on (another importer's operations succeed) and, once the dead
/// importer's channel is reclaimed, holds no more descriptors than before
/// it came (counted after a first importer came and went: what a team
/// makes once, on its first peer, stays).
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_killed_importer_on_another_node_leaves_the_owner_whole() {
    let mut b = server("b");
    let fds = |b: &mut Server| -> usize {
        b.child.tell("fds");
        b.child.expect("fds ", START).parse().unwrap()
    };
    let settled = |b: &mut Server, what: &str| -> usize {
        let t = Instant::now();
        let mut last = fds(b);
        loop {
            std::thread::sleep(Duration::from_millis(500));
            let now = fds(b);
            if now == last {
                return now;
            }
            assert!(t.elapsed() < Duration::from_secs(20), "{what}: the owner's descriptors never settled");
            last = now;
        }
    };
    let mut first = client();
    assert_eq!(ask(&mut first, &format!("region-add {}", b.region), START), "ok");
    drop(first);
    let before = settled(&mut b, "after a first importer");
    let mut doomed = client();
    doomed.tell(&format!("region-until-gone {}", b.region));
    assert_eq!(doomed.expect("", START), "opened");
    doomed.kill();
    let t = Instant::now();
    while fds(&mut b) != before {
        assert!(t.elapsed() < Duration::from_secs(20), "the dead importer's descriptors stayed at the owner");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut other = client();
    assert_eq!(ask(&mut other, &format!("region-add {}", b.region), START), "ok");
}

/// A fifo's and a signal handler's owner killed while a producer and
/// signaller on another node use them: the next enqueue or signal fails
/// with `PeerGone`, well before any timeout.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_fifos_and_a_signals_owner_killed_fails_their_users() {
    an_owner_killed_fails_its_user(|b| format!("fifo-and-signal-until-gone {}", b.fifo_and_signal));
}

/// A producer on node a killed while a producer on node c keeps
/// enqueueing into one fifo on node b: the owner keeps taking the
/// survivor's elements, in order; the dead producer's ring goes once
/// drained (the owner has one producer left while the survivor goes on,
/// and nothing more of the dead one's comes); the survivor's every element
/// arrives, in order, and its ring goes with its handle. Nothing hangs:
/// every wait here has a deadline, the owner's dequeue too.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_killed_producer_on_another_node_leaves_the_fifo_to_the_survivor() {
    let mut owner = node("b", "fifo-owner");
    let fifo = owner.expect("fifo ", START);
    let mut doomed = client();
    let mut survivor = node("c", "client");
    survivor.expect("ready", START);
    doomed.tell(&format!("fifo-stream {fifo} 0"));
    survivor.tell(&format!("fifo-stream {fifo} 1"));
    assert_eq!(doomed.expect("", START), "opened");
    assert_eq!(survivor.expect("", START), "opened");
    // What the owner has seen: producers with a ring, elements taken of
    // producers 0 (doomed) and 1 (survivor); within `limit`, once `until` holds.
    let state_until = |owner: &mut Child, limit: Duration, what: &str, until: &dyn Fn(usize, u32, u32) -> bool| {
        let t = Instant::now();
        loop {
            owner.tell("state");
            let line = owner.expect("state ", START);
            let w: Vec<&str> = line.split(' ').collect();
            assert_eq!(w[3], "-", "the owner found a fault: {line}");
            let (producers, n0, n1) = (w[0].parse().unwrap(), w[1].parse().unwrap(), w[2].parse().unwrap());
            if until(producers, n0, n1) {
                return (producers, n0, n1);
            }
            assert!(t.elapsed() < limit, "{what}: not within {limit:?} (last state: {line})");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let limit = Duration::from_secs(20);
    state_until(&mut owner, limit, "both producers' elements", &|p, n0, n1| p == 2 && n0 >= 1000 && n1 >= 1000);
    doomed.kill();
    let (_, _, at_kill) = state_until(&mut owner, limit, "a state", &|_, _, _| true);
    // The survivor goes on: its elements keep coming once the dead ring went.
    let (_, drained, n1) =
        state_until(&mut owner, limit, "the dead producer's ring dropped, the survivor served", &|p, _, n1| {
            p == 1 && n1 > at_kill + 1000
        });
    let (_, n0, _) = state_until(&mut owner, limit, "more of the survivor's", &|_, _, m| m > n1 + 1000);
    assert_eq!(n0, drained, "an element of the dead producer after its ring went");
    survivor.tell("stop");
    let sent: u32 = survivor.expect("sent ", START).parse().unwrap();
    assert_eq!(survivor.expect("", START), "ok");
    let (_, n0, _) = state_until(&mut owner, limit, "every element of the survivor's, its ring gone", &|p, _, n1| {
        p == 0 && n1 == sent
    });
    assert_eq!(n0, drained);
    eprintln!("the dead producer's {drained} elements taken, then its ring dropped; the survivor's {sent}, in order");
}

/// The client runs `command` (which says "opened", then uses server b's
/// objects until an operation fails); server b is killed: the client's
/// answer is `PeerGone`, within 10 s.
fn an_owner_killed_fails_its_user(command: impl Fn(&Server) -> String) {
    let mut b = server("b");
    let mut client = client();
    client.tell(&command(&b));
    assert_eq!(client.expect("", START), "opened");
    let t0 = Instant::now();
    b.child.kill();
    let answer = client.expect("", Duration::from_secs(20));
    assert!(answer.starts_with("err PeerGone"), "{answer}");
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
}

/// The link to a node cut (`ip link set eth0 down`) while a call waits:
/// nothing tells the caller, so its deadline ends the call
/// (`DeadlineExceeded`), and nothing hangs.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_link_cut_mid_call_ends_the_call_at_its_deadline() {
    let mut c = server("c");
    let mut client = client();
    assert_eq!(ask(&mut client, &format!("echo {}", c.echo), START), "ok");
    client.tell(&format!("hold {} 2000", c.hold));
    c.child.expect("holding", START);
    set_link("c", "down");
    let answer = client.expect("", Duration::from_secs(20));
    set_link("c", "up");
    assert!(answer.starts_with("err DeadlineExceeded"), "{answer}");
}

/// The link to a node cut while a call without a deadline waits: the
/// heartbeats stop, and once the peer has been silent for `peer_timeout`
/// the call fails with `PeerGone` (nothing hangs for good).
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_link_cut_mid_call_without_a_deadline_fails_after_the_peer_timeout() {
    let mut c = server("c");
    let mut client = client();
    client.tell(&format!("hold {} 0", c.hold));
    c.child.expect("holding", START);
    // Idle for twice the peer timeout: the heartbeats keep the channel (and
    // the call) alive meanwhile.
    assert_eq!(client.next_line(PEER_TIMEOUT * 2), None, "the idle channel was given up");
    let t0 = Instant::now();
    set_link("c", "down");
    let answer = client.expect("", Duration::from_secs(30));
    let took = t0.elapsed();
    set_link("c", "up");
    assert!(answer.starts_with("err PeerGone"), "{answer}");
    assert!(took < PEER_TIMEOUT * 3, "gave up after {took:?}");
}

/// Regression (issue 15, defect 12): a look-up asked the other nodes one
/// after the other, each for up to 5 s, so with node b's link cut a name on
/// node c took 5 s to find. The nodes are now asked at once: the look-up
/// takes c's answer plus the 200 ms it waits for the lower-numbered b
/// (`PASS_OVER`), about 0.25 s. The bound sits well below the defect's 5 s
/// and well above that: a CI run once took over 1 s (a loaded machine, or
/// a SYN retransmitted after 1 s).
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_lookup_is_not_delayed_by_a_node_whose_link_is_cut() {
    let c = server("c");
    let mut client = client();
    set_link("b", "down");
    let t0 = Instant::now();
    let answer = ask(&mut client, &format!("lookup calc {}", c.calc), START);
    let took = t0.elapsed();
    set_link("b", "up");
    assert_eq!(answer, "ok", "after {took:?}");
    assert!(took < Duration::from_millis(2500), "took {took:?}");
}

/// Regression (issue 15, defect 10): a node holding the cluster key could
/// claim another node's identity: nothing compared the node a hello claims
/// with where the connection came from. Here a team on node c's machine
/// (10.77.0.3), with the key, says it is node 1 (node a, 10.77.0.1): node b
/// refuses it with `Unauthenticated`, and node a's own channel and calls to
/// b go on untouched.
#[test]
#[ignore = "run by scripts/netns-test.sh, which makes the namespaces"]
fn a_node_with_the_key_cannot_claim_another_nodes_identity() {
    let (_, work) = netns();
    let b = server("b");
    let mut client = client();
    assert_eq!(ask(&mut client, &format!("echo {}", b.echo), START), "ok");
    // The impostor: node 1's number, node c's address, the cluster's key.
    let file = work.join("impostor.cluster");
    let key = work.join("cluster.key");
    std::fs::write(
        &file,
        format!("node 1\nlisten 10.77.0.3:7401\nkey-file {}\npeer 2 10.77.0.2:7400\n", key.display()),
    )
    .unwrap();
    let run = work.join("impostor.run");
    std::fs::create_dir_all(&run).unwrap();
    let mut impostor = Child::spawn_in_netns(&namespace("c"), "client", &run, &[("FERRY_CLUSTER", &file)]);
    impostor.expect("ready", START);
    let answer = ask(&mut impostor, &format!("echo {}", b.echo), START);
    assert!(answer.starts_with("err Unauthenticated"), "{answer}");
    // Node a's channel and calls are untouched.
    assert_eq!(ask(&mut client, &format!("echo {}", b.echo), START), "ok");
    assert_eq!(ask(&mut client, &format!("calc {}", b.calc), START), "ok");
}
