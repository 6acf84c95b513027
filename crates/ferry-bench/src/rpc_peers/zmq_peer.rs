//! `zmq.ipc.*`: ZeroMQ REQ/REP over `ipc://`, with the `zmq` crate on the
//! system's libzmq (Debian's `libzmq3-dev`, from `scripts/bench-deps.sh`).
//! REP in the child (binds), REQ in the parent (connects). A request is one
//! message holding the argument (empty for the null call); the response is
//! one 8-byte message, the [`answer`]. A 3-byte request `end` (no case uses
//! 3 bytes) is answered, then the child closes and removes its socket file.
//!
//! The socket lives in `$TMPDIR/ferry-bench-<run_id>-zmq/`, which the parent
//! creates before and removes after the case (also when it fails).
//!
//! Handshake on the harness socket: parent `S` (directory made) → child
//! binds, `B` → parent connects and calls … `end` → child cleans up, `D`.

use super::{answer, argument, expect_byte, send_byte, unlink, SockDir, HANDSHAKE_TIMEOUT, MAX_ARG};
use crate::harness::{Case, ChildCtx, Params, Peer};

/// A REQ/REP round trip is ~26 µs: scale `Params::iters` down by this.
const ITERS_DIV: usize = 10;
const TAG: &str = "zmq";
const STOP: &[u8] = b"end";
/// How long a REQ waits for its response before the case fails (ms).
const RECV_TIMEOUT_MS: i32 = 10_000;

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("zmq.ipc.null", parent::<0>, child),
        Case::new("zmq.ipc.arg4", parent::<4>, child),
        Case::new("zmq.ipc.arg256", parent::<256>, child),
        Case::new("zmq.ipc.arg512", parent::<512>, child),
        Case::new("zmq.ipc.arg1024", parent::<1024>, child),
    ]
}

fn endpoint(run_id: &str) -> String {
    format!("ipc://{}", SockDir::socket(run_id, TAG).display())
}

fn parent<const N: usize>(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let dir = SockDir::create(&peer.run_id, TAG).expect("zmq: socket directory");
    peer.sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).expect("SO_RCVTIMEO");
    send_byte(&peer.sock, b'S');
    expect_byte(&peer.sock, b'B');

    let ctx = zmq::Context::new();
    let req = ctx.socket(zmq::REQ).expect("zmq: REQ socket");
    req.set_linger(0).expect("zmq: linger");
    req.set_rcvtimeo(RECV_TIMEOUT_MS).expect("zmq: rcvtimeo");
    req.connect(&endpoint(&peer.run_id)).expect("zmq: connect");

    let arg = argument(N);
    let expected = answer(&arg);
    let call = |msg: &[u8]| -> u64 {
        req.send(msg, 0).expect("zmq: send");
        let mut resp = [0u8; 8];
        let len = req.recv_into(&mut resp, 0).expect("zmq: recv (no response within 10 s?)");
        assert_eq!(len, 8, "zmq: response of {len} bytes");
        u64::from_le_bytes(resp)
    };
    let samples = p.measure(p.iters_div(ITERS_DIV), |n| {
        for _ in 0..n {
            let got = call(&arg);
            assert_eq!(got, expected, "zmq: wrong answer");
        }
    });
    assert_eq!(call(STOP), answer(STOP), "zmq: wrong answer to stop");
    drop(req);
    drop(ctx);
    expect_byte(&peer.sock, b'D');
    drop(dir);
    samples
}

fn child(ctx: &ChildCtx) {
    expect_byte(&ctx.sock, b'S');
    let path = SockDir::socket(&ctx.run_id, TAG);
    let zctx = zmq::Context::new();
    let rep = zctx.socket(zmq::REP).expect("zmq: REP socket");
    // Long enough to flush the last response before close.
    rep.set_linger(1000).expect("zmq: linger");
    rep.bind(&endpoint(&ctx.run_id)).expect("zmq: bind");
    send_byte(&ctx.sock, b'B');

    // Room for the largest argument and one byte more, to see truncation.
    let mut buf = vec![0u8; MAX_ARG + 1];
    loop {
        // The parent's death kills this process (PDEATHSIG): no timeout.
        let len = rep.recv_into(&mut buf, 0).expect("zmq: recv");
        assert!(len <= MAX_ARG, "zmq: request of {len} bytes");
        let arg = &buf[..len];
        rep.send(&answer(arg).to_le_bytes()[..], 0).expect("zmq: send");
        if arg == STOP {
            break;
        }
    }
    drop(rep);
    drop(zctx);
    unlink(&path);
    send_byte(&ctx.sock, b'D');
}
