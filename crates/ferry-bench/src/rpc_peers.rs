//! The peers of the RPC suite (`ferry bench rpc`): other ways to make a
//! request/response call between two processes on this machine, each with
//! a null call and 4, 256, 512 and 1024-byte arguments (MBCF Table 5.1).
//!
//! * `raw.uds.{null,arg4,arg256,arg512,arg1024}` — a Unix stream socket,
//!   blocking I/O: the client writes a length-prefixed request (a `u32`
//!   length, then the argument), the server reads it fully and writes a
//!   length-prefixed 8-byte response. No feature needed.
//! * `tonic.uds.*` — a tonic gRPC unary call over a Unix domain socket
//!   (feature `tonic`): server in the child, client in the parent, each on
//!   its own current-thread tokio runtime.
//! * `zmq.ipc.*` — ZeroMQ REQ/REP over `ipc://` (feature `zmq`; the `zmq`
//!   crate against the system's libzmq, see `scripts/bench-deps.sh`).
//! * `iceoryx2.req_resp.arg1024` — iceoryx2 request-response with a
//!   1024-byte request (feature `iceoryx2`). The null case,
//!   `iceoryx2.req_resp`, is in [`crate::pingpong_floor_cases`].
//!
//! Every call's response is [`answer`] of its argument (its length plus the
//! sum of its bytes), so every server reads the whole argument and every
//! client checks that it got the answer to its own call. One round trip is
//! one call, made and answered.

use std::io::{self, Read, Write};
use std::time::Duration;

use crate::harness::{Case, ChildCtx, Params, Peer};

#[cfg(feature = "tonic")]
mod tonic_peer;
/// The tonic peer of the TCP suite.
#[cfg(feature = "tonic")]
pub(crate) use tonic_peer::tcp_case as tonic_tcp_case;
#[cfg(feature = "zmq")]
mod zmq_peer;

/// The largest argument any case sends.
pub const MAX_ARG: usize = 1024;

/// Every RPC peer case this build has: raw.uds always, the others when
/// their features are on. Does not include `iceoryx2.req_resp` (the null
/// iceoryx2 call), which [`crate::pingpong_floor_cases`] already has.
pub fn cases() -> Vec<Case> {
    #[allow(unused_mut)]
    let mut cases = raw_uds_cases();
    #[cfg(feature = "iceoryx2")]
    cases.push(crate::iceoryx2_peer::arg1024_case());
    #[cfg(feature = "tonic")]
    cases.extend(tonic_peer::cases());
    #[cfg(feature = "zmq")]
    cases.extend(zmq_peer::cases());
    cases
}

/// The argument of an `n`-byte call: a fixed, non-constant pattern.
pub fn argument(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(7)).collect()
}

/// What the server answers to `arg`: its length plus the sum of its bytes.
/// Cheap (a few dozen ns for 1024 bytes), but it makes the server read the
/// whole argument and lets the client check the response.
#[inline]
pub fn answer(arg: &[u8]) -> u64 {
    arg.len() as u64 + arg.iter().map(|&b| b as u64).sum::<u64>()
}

/// What the peers on a socket file (tonic, zmq) share: the handshake on the
/// harness socket and the directory that holds the socket file.
#[cfg(any(feature = "tonic", feature = "zmq"))]
mod sockfile {
    use std::io::{self, Read, Write};
    use std::os::unix::net::UnixStream;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    /// How long a parent waits for a handshake byte from its child.
    pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

    /// Writes one handshake byte on the harness socket.
    pub(super) fn send_byte(sock: &UnixStream, b: u8) {
        let mut s = sock;
        s.write_all(&[b]).expect("handshake: write");
    }

    /// Reads one handshake byte from the harness socket and checks it.
    pub(super) fn expect_byte(sock: &UnixStream, want: u8) {
        let mut s = sock;
        let mut b = [0u8];
        s.read_exact(&mut b).unwrap_or_else(|e| panic!("handshake: waiting for {:?}: {e}", want as char));
        assert_eq!(b[0], want, "handshake: expected {:?}, got {:?}", want as char, b[0] as char);
    }

    /// A directory of the parent's for one case's socket file, named after the
    /// run id: `$TMPDIR/ferry-bench-<run_id>-<tag>/`. Both sides compute the
    /// same path. Dropping it (also while unwinding) removes the directory and
    /// whatever the child left in it.
    pub(super) struct SockDir {
        dir: PathBuf,
    }

    impl SockDir {
        fn path(run_id: &str, tag: &str) -> PathBuf {
            std::env::temp_dir().join(format!("ferry-bench-{run_id}-{tag}"))
        }

        /// The socket file inside the directory.
        pub(super) fn socket(run_id: &str, tag: &str) -> PathBuf {
            Self::path(run_id, tag).join("sock")
        }

        pub(super) fn create(run_id: &str, tag: &str) -> io::Result<Self> {
            use std::os::unix::fs::DirBuilderExt;
            let dir = Self::path(run_id, tag);
            std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
            Ok(Self { dir })
        }
    }

    impl Drop for SockDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Removes a socket file, if it is still there.
    pub(super) fn unlink(path: &Path) {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => panic!("removing {}: {e}", path.display()),
        }
    }
}
#[cfg(any(feature = "tonic", feature = "zmq"))]
use sockfile::{expect_byte, send_byte, unlink, SockDir, HANDSHAKE_TIMEOUT};

// --- raw.uds -------------------------------------------------------------
// On the harness's socketpair. Request: u32 length (little-endian), then the
// argument. Response: u32 length 8, then the u64 answer. A request length
// of u32::MAX asks the child to stop (no response).

/// raw.uds round trips are ~8.5 µs: scale `Params::iters` down by this.
const UDS_DIV: usize = 5;
const STOP_LEN: u32 = u32::MAX;
const RESP_LEN: usize = 4 + 8;

fn raw_uds_cases() -> Vec<Case> {
    vec![
        Case::new("raw.uds.null", uds_parent::<0>, uds_child),
        Case::new("raw.uds.arg4", uds_parent::<4>, uds_child),
        Case::new("raw.uds.arg256", uds_parent::<256>, uds_child),
        Case::new("raw.uds.arg512", uds_parent::<512>, uds_child),
        Case::new("raw.uds.arg1024", uds_parent::<1024>, uds_child),
    ]
}

fn uds_parent<const N: usize>(peer: &mut Peer, p: &Params) -> Vec<f64> {
    // A hung child fails the read instead of hanging the suite.
    peer.sock.set_read_timeout(Some(Duration::from_secs(10))).expect("SO_RCVTIMEO");
    let mut sock = &peer.sock;
    let arg = argument(N);
    let expected = answer(&arg);
    let mut req = Vec::with_capacity(4 + MAX_ARG);
    let samples = p.measure(p.iters_div(UDS_DIV), |n| {
        for _ in 0..n {
            // Marshal (copy the argument behind its length), send, await.
            req.clear();
            req.extend_from_slice(&(N as u32).to_le_bytes());
            req.extend_from_slice(&arg);
            sock.write_all(&req).expect("raw.uds: write");
            let mut resp = [0u8; RESP_LEN];
            sock.read_exact(&mut resp).expect("raw.uds: read");
            let len = u32::from_le_bytes(resp[..4].try_into().unwrap());
            let got = u64::from_le_bytes(resp[4..].try_into().unwrap());
            assert!(len == 8 && got == expected, "raw.uds: bad response (len {len}, answer {got}, want {expected})");
        }
    });
    sock.write_all(&STOP_LEN.to_le_bytes()).expect("raw.uds: write");
    samples
}

fn uds_child(ctx: &ChildCtx) {
    let mut sock = &ctx.sock;
    // Room for the largest request, so one read() takes a whole request.
    let mut buf = vec![0u8; 4 + MAX_ARG];
    loop {
        let mut have = 0;
        // An error or EOF means the parent is gone: nothing left to do.
        if read_until(&mut sock, &mut buf, &mut have, 4).is_none() {
            return;
        }
        let len = u32::from_le_bytes(buf[..4].try_into().unwrap());
        if len == STOP_LEN {
            return;
        }
        let len = len as usize;
        assert!(len <= MAX_ARG, "raw.uds: request of {len} bytes");
        if read_until(&mut sock, &mut buf, &mut have, 4 + len).is_none() {
            return;
        }
        assert_eq!(have, 4 + len, "raw.uds: the parent sent more than one request");
        let mut resp = [0u8; RESP_LEN];
        resp[..4].copy_from_slice(&8u32.to_le_bytes());
        resp[4..].copy_from_slice(&answer(&buf[4..4 + len]).to_le_bytes());
        if sock.write_all(&resp).is_err() {
            return;
        }
    }
}

/// Reads into `buf[*have..]` until at least `want` bytes are there. `None`
/// on EOF or error.
fn read_until(sock: &mut impl Read, buf: &mut [u8], have: &mut usize, want: usize) -> Option<()> {
    while *have < want {
        match sock.read(&mut buf[*have..]) {
            Ok(0) => return None,
            Ok(k) => *have += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(())
}
