//! `iceoryx2.req_resp.arg1024`: as `iceoryx2.req_resp` (see
//! `crate::iceoryx2_peer`: client in the parent, server in the child, both
//! busy-polling), with a 1024-byte request and a `u64` response.
//!
//! The request's first 8 bytes are a sequence number (`u64::MAX` asks the
//! child to stop, after answering); the rest is the fixed [`argument`]
//! pattern. The server answers the sequence number plus the sum of the
//! other 1016 bytes, so it reads the whole request and the client knows
//! the response is the one to its own call.

use std::io::{Read, Write};
use std::time::Duration;

use iceoryx2::prelude::*;

use super::{argument, MAX_ARG};
use crate::harness::{Case, ChildCtx, Params, Peer};

const STOP: u64 = u64::MAX;
/// A round trip is a few µs: scale `Params::iters` down by this.
const ITERS_DIV: usize = 4;

type Arg = [u8; MAX_ARG];

pub fn case() -> Case {
    Case { name: "iceoryx2.req_resp.arg1024", parent, child }
}

fn service_name(run_id: &str) -> ServiceName {
    ServiceName::new(&format!("ferry-bench/{run_id}/req_resp_arg1024")).expect("iceoryx2 service name")
}

fn node() -> Node<ipc::Service> {
    set_log_level(LogLevel::Error);
    NodeBuilder::new()
        // The harness, not iceoryx2, owns this process's signals.
        .signal_handling_mode(SignalHandlingMode::Disabled)
        .create::<ipc::Service>()
        .expect("iceoryx2 node")
}

/// The sum of the request's bytes after the sequence number.
#[inline]
fn tail_sum(req: &Arg) -> u64 {
    req[8..].iter().map(|&b| b as u64).sum()
}

fn parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let node = node();
    let service = node
        .service_builder(&service_name(&peer.run_id))
        .request_response::<Arg, u64>()
        .create()
        .expect("iceoryx2 service");
    let client = service.client_builder().create().expect("iceoryx2 client");

    // Handshake on the harness socket: service created -> server ready.
    peer.sock.set_read_timeout(Some(Duration::from_secs(10))).expect("SO_RCVTIMEO");
    (&peer.sock).write_all(b"S").expect("handshake");
    (&peer.sock).read_exact(&mut [0u8]).expect("iceoryx2 server did not start");

    let mut req: Arg = argument(MAX_ARG).try_into().unwrap();
    let tail = tail_sum(&req);
    let mut call = |seq: u64| -> u64 {
        req[..8].copy_from_slice(&seq.to_le_bytes());
        let pending = client.send_copy(req).expect("iceoryx2 send request");
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
    let mut seq = 0;
    let samples = p.measure(p.iters_div(ITERS_DIV), |n| {
        for _ in 0..n {
            seq += 1;
            assert_eq!(call(seq), seq + tail, "iceoryx2: wrong response");
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
        .request_response::<Arg, u64>()
        .open()
        .expect("iceoryx2 open service");
    let server = service.server_builder().create().expect("iceoryx2 server");
    (&ctx.sock).write_all(b"R").expect("handshake");

    loop {
        let Some(request) = server.receive().expect("iceoryx2 receive request") else {
            continue;
        };
        let seq = u64::from_le_bytes(request[..8].try_into().unwrap());
        let answer = seq.wrapping_add(tail_sum(&request));
        request.send_copy(answer).expect("iceoryx2 send response");
        if seq == STOP {
            return;
        }
    }
}
