//! The iceoryx2 peer: `iceoryx2.req_resp`, iceoryx2's request-response
//! (client in the parent, server in the child, u64 payloads), both sides
//! busy-polling: one round trip = send a request, spin until its response.
//!
//! The service name includes the run id (parent pid and sequence number),
//! so parallel or crashed runs never meet. The child leaves on a STOP
//! request, after answering it, so both nodes are dropped cleanly and
//! iceoryx2 removes its files. (Nodes of crashed processes are cleaned up
//! by iceoryx2 when the next node is created.)

use std::io::{Read, Write};
use std::time::Duration;

use iceoryx2::prelude::*;

use crate::harness::{Case, ChildCtx, Params, Peer};

const STOP: u64 = u64::MAX;
/// A round trip is ~2.3 µs: scale `Params::iters` down by this.
const ITERS_DIV: usize = 4;

pub fn case() -> Case {
    Case { name: "iceoryx2.req_resp", parent, child }
}

fn service_name(run_id: &str) -> ServiceName {
    ServiceName::new(&format!("ferry-bench/{run_id}/req_resp")).expect("iceoryx2 service name")
}

fn node() -> Node<ipc::Service> {
    set_log_level(LogLevel::Error);
    NodeBuilder::new()
        // The harness, not iceoryx2, owns this process's signals.
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<ipc::Service>()
        .expect("iceoryx2 node")
}

fn parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let node = node();
    let service = node
        .service_builder(&service_name(&peer.run_id))
        .request_response::<u64, u64>()
        .create()
        .expect("iceoryx2 service");
    let client = service.client_builder().create().expect("iceoryx2 client");

    // Handshake on the harness socket: service created -> server ready.
    peer.sock.set_read_timeout(Some(Duration::from_secs(10))).expect("SO_RCVTIMEO");
    (&peer.sock).write_all(b"S").expect("handshake");
    (&peer.sock).read_exact(&mut [0u8]).expect("iceoryx2 server did not start");

    let call = |v: u64| -> u64 {
        let pending = client.send_copy(v).expect("iceoryx2 send request");
        let mut answer = None;
        peer.spin_until(|| match pending.receive().expect("iceoryx2 receive response") {
            Some(response) => {
                answer = Some(*response);
                true
            }
            None => false,
        });
        answer.expect("response")
    };
    let mut v = 0;
    let samples = p.measure(p.iters_div(ITERS_DIV), |n| {
        for _ in 0..n {
            v += 1;
            assert_eq!(call(v), v + 1, "iceoryx2: wrong response");
        }
    });
    call(STOP); // answered just before the child drops its node and exits
    samples
}

fn child(ctx: &ChildCtx) {
    (&ctx.sock).read_exact(&mut [0u8]).expect("handshake");
    let node = node();
    let service = node
        .service_builder(&service_name(&ctx.run_id))
        .request_response::<u64, u64>()
        .open()
        .expect("iceoryx2 open service");
    let server = service.server_builder().create().expect("iceoryx2 server");
    (&ctx.sock).write_all(b"R").expect("handshake");

    loop {
        let Some(request) = server.receive().expect("iceoryx2 receive request") else {
            continue;
        };
        let v = *request;
        let answer = if v == STOP { STOP } else { v + 1 };
        request.send_copy(answer).expect("iceoryx2 send response");
        if v == STOP {
            return;
        }
    }
}
