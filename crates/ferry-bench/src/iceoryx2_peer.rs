//! The iceoryx2 peer: iceoryx2's request-response (client in the parent,
//! server in the child), both sides busy-polling: one round trip = send a
//! request, spin until its response.
//!
//! - `iceoryx2.req_resp`: a `u64` request, answered with the number + 1;
//! - `iceoryx2.req_resp.arg1024`: a 1024-byte request (a sequence number,
//!   then the fixed [`argument`] pattern), answered with the number plus the
//!   sum of the other bytes, so the server reads the whole request.
//!
//! - `iceoryx2.pubsub.pingpong`: iceoryx2's fastest pattern, as its own
//!   `benchmark-publish-subscribe` runs it: two publish-subscribe services
//!   (one each way, history 0, a subscriber buffer of one), a `u64` sent
//!   by copy, both sides busy-polling their subscriber.
//!
//! The service name includes the run id (parent pid and sequence number),
//! so parallel or crashed runs never meet. The child leaves on a STOP
//! request, after answering it, so both nodes are dropped cleanly and
//! iceoryx2 removes its files. (Nodes of crashed processes are cleaned up
//! by iceoryx2 when the next node is created.)

use std::fmt::Debug;
use std::io::{Read, Write};
use std::time::Duration;

use iceoryx2::prelude::*;

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::rpc_peers::{argument, MAX_ARG};

const STOP: u64 = u64::MAX;
/// A round trip is a few µs: scale `Params::iters` down by this.
const ITERS_DIV: usize = 4;

/// A request type: built from a sequence number, answered by the server.
trait Request: Debug + ZeroCopySend + Copy + 'static {
    const NAME: &'static str;
    fn with_seq(self, seq: u64) -> Self;
    fn seq(&self) -> u64;
    /// What the server answers.
    fn answer(&self) -> u64;
    fn first() -> Self;
}

impl Request for u64 {
    const NAME: &'static str = "iceoryx2.req_resp";
    fn with_seq(self, seq: u64) -> u64 {
        seq
    }
    fn seq(&self) -> u64 {
        *self
    }
    fn answer(&self) -> u64 {
        self.wrapping_add(1)
    }
    fn first() -> u64 {
        0
    }
}

type Arg = [u8; MAX_ARG];

impl Request for Arg {
    const NAME: &'static str = "iceoryx2.req_resp.arg1024";
    fn with_seq(mut self, seq: u64) -> Arg {
        self[..8].copy_from_slice(&seq.to_le_bytes());
        self
    }
    fn seq(&self) -> u64 {
        u64::from_le_bytes(self[..8].try_into().unwrap())
    }
    fn answer(&self) -> u64 {
        self[8..].iter().fold(self.seq(), |sum, &b| sum.wrapping_add(b as u64))
    }
    fn first() -> Arg {
        argument(MAX_ARG).try_into().unwrap()
    }
}

/// `iceoryx2.req_resp`.
pub fn case() -> Case {
    Case::new(<u64 as Request>::NAME, parent::<u64>, child::<u64>)
}

/// `iceoryx2.req_resp.arg1024`.
pub fn arg1024_case() -> Case {
    Case::new(<Arg as Request>::NAME, parent::<Arg>, child::<Arg>)
}

fn service_name<R: Request>(run_id: &str) -> ServiceName {
    ServiceName::new(&format!("ferry-bench/{run_id}/{}", R::NAME)).expect("iceoryx2 service name")
}

fn node() -> Node<ipc::Service> {
    set_log_level(LogLevel::Error);
    NodeBuilder::new()
        // The harness, not iceoryx2, owns this process's signals.
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<ipc::Service>()
        .expect("iceoryx2 node")
}

fn parent<R: Request>(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let node = node();
    let service = node
        .service_builder(&service_name::<R>(&peer.run_id))
        .request_response::<R, u64>()
        .create()
        .expect("iceoryx2 service");
    let client = service.client_builder().create().expect("iceoryx2 client");

    // Handshake on the harness socket: service created -> server ready.
    peer.sock.set_read_timeout(Some(Duration::from_secs(10))).expect("SO_RCVTIMEO");
    (&peer.sock).write_all(b"S").expect("handshake");
    (&peer.sock).read_exact(&mut [0u8]).expect("iceoryx2 server did not start");

    let mut req = R::first();
    let mut call = |seq: u64| -> (u64, u64) {
        req = req.with_seq(seq);
        let pending = client.send_copy(req).expect("iceoryx2 send request");
        let mut answer = None;
        peer.spin_until(|| match pending.receive().expect("iceoryx2 receive response") {
            Some(response) => {
                answer = Some(*response);
                true
            }
            None => false,
        });
        (answer.expect("response"), req.answer())
    };
    let mut seq = 0;
    let samples = p.measure(p.iters_div(ITERS_DIV), |n| {
        for _ in 0..n {
            seq += 1;
            let (got, want) = call(seq);
            assert_eq!(got, want, "iceoryx2: wrong response");
        }
    });
    call(STOP); // answered just before the child drops its node and exits
    samples
}

fn child<R: Request>(ctx: &ChildCtx) {
    (&ctx.sock).read_exact(&mut [0u8]).expect("handshake");
    let node = node();
    let service = node
        .service_builder(&service_name::<R>(&ctx.run_id))
        .request_response::<R, u64>()
        .open()
        .expect("iceoryx2 open service");
    let server = service.server_builder().create().expect("iceoryx2 server");
    (&ctx.sock).write_all(b"R").expect("handshake");

    loop {
        let Some(request) = server.receive().expect("iceoryx2 receive request") else {
            continue;
        };
        let req: R = *request;
        request.send_copy(req.answer()).expect("iceoryx2 send response");
        if req.seq() == STOP {
            return;
        }
    }
}

/// `iceoryx2.pubsub.pingpong`.
pub fn pubsub_case() -> Case {
    Case::new("iceoryx2.pubsub.pingpong", pubsub_parent, pubsub_child)
}

/// The parent's `ping` and the child's `pong` subscribers and publishers,
/// as `benchmark-publish-subscribe` configures them; `f` runs with this
/// side's publisher and subscriber.
fn pubsub<R>(run_id: &str, parent: bool, f: impl FnOnce(&dyn Fn(u64), &dyn Fn() -> Option<u64>) -> R) -> R {
    let node = node();
    let service = |way: &str| {
        let name = ServiceName::new(&format!("ferry-bench/{run_id}/pubsub.{way}")).expect("iceoryx2 service name");
        node.service_builder(&name)
            .publish_subscribe::<u64>()
            .history_size(0)
            .subscriber_max_buffer_size(1)
            .enable_safe_overflow(true)
            .open_or_create()
            .expect("iceoryx2 publish-subscribe service")
    };
    let (out, back) = if parent { (service("ping"), service("pong")) } else { (service("pong"), service("ping")) };
    let publisher = out.publisher_builder().create().expect("iceoryx2 publisher");
    let subscriber = back.subscriber_builder().create().expect("iceoryx2 subscriber");
    let send = |v: u64| publisher.send_copy(v).map(drop).expect("iceoryx2 send");
    let receive = || subscriber.receive().expect("iceoryx2 receive").map(|s| *s);
    f(&send, &receive)
}

fn pubsub_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let run_id = peer.run_id.clone();
    pubsub(&run_id, true, |send, receive| {
        // Both sides' subscribers exist before the first sample goes (history 0).
        peer.sock.set_read_timeout(Some(Duration::from_secs(10))).expect("SO_RCVTIMEO");
        (&peer.sock).write_all(b"S").expect("handshake");
        (&peer.sock).read_exact(&mut [0u8]).expect("iceoryx2 subscriber did not start");
        let round = |seq: u64| {
            send(seq);
            let mut got = None;
            peer.spin_until(|| {
                got = receive();
                got.is_some()
            });
            assert_eq!(got, Some(seq), "iceoryx2: wrong sample");
        };
        let mut seq = 0;
        let samples = p.measure(p.iters_div(ITERS_DIV), |n| {
            for _ in 0..n {
                seq += 1;
                round(seq);
            }
        });
        round(STOP);
        samples
    })
}

fn pubsub_child(ctx: &ChildCtx) {
    (&ctx.sock).read_exact(&mut [0u8]).expect("handshake");
    pubsub(&ctx.run_id, false, |send, receive| {
        (&ctx.sock).write_all(b"R").expect("handshake");
        loop {
            if let Some(v) = receive() {
                send(v);
                if v == STOP {
                    return;
                }
            }
        }
    })
}
