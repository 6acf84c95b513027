//! Three nodes in real network namespaces, made by `scripts/netns-test.sh`
//! (which runs these tests): one team per namespace, each a process started
//! with `ip netns exec`, talking over TCP between addresses that exist only
//! among the namespaces. Ports and RPC across them, a team killed mid-call,
//! a link cut mid-call.

mod common;

use common::calc::{CalcClient, CalcImpl, CalcServer};
use common::Child;
use ferry::{Error, Team};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const START: Duration = Duration::from_secs(30);
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
            common::say(format!("echo {}", echo.id()));
            common::say(format!("hold {}", hold.id()));
            common::say(format!("calc {}", team.lookup("calc").unwrap()));
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
                    "calc" => CalcClient::bind_to(&team, id(1)).map_err(rpc_error).and_then(|c| {
                        (0..100).try_for_each(|i| c.add_blocking(i, i).map(|r| assert_eq!(r, 2 * i)).map_err(rpc_error))
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

/// A server's endpoints, as it said them.
struct Server {
    child: Child,
    echo: String,
    hold: String,
    calc: String,
}

fn server(n: &str) -> Server {
    let mut child = node(n, "server");
    let echo = child.expect("echo ", START);
    let hold = child.expect("hold ", START);
    let calc = child.expect("calc ", START);
    Server { child, echo, hold, calc }
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
