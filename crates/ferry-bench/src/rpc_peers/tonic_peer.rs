//! `tonic.uds.*`: a tonic gRPC unary call over a Unix domain socket. The
//! server runs in the child, the client in the parent, each on its own
//! current-thread tokio runtime (one thread per side: fair on 2 CPUs).
//!
//! No protoc and no generated code: the service and client are written by
//! hand the way tonic-build would write them (`tonic::server::Grpc::unary`
//! behind a `tower::Service`, `tonic::client::Grpc::unary` over a
//! `Channel`), with a codec that carries the message bytes as they are —
//! the argument as the request, the 8-byte [`answer`] as the response. So
//! the figure is gRPC's (HTTP/2 framing, headers, tonic's buffering) minus
//! protobuf's encoding of one `bytes` field, which is a tag and a length.
//!
//! The socket lives in `$TMPDIR/ferry-bench-<run_id>-tonic/`, which the
//! parent creates before and removes after the case (also when it fails).
//!
//! Handshake on the harness socket: parent `S` (directory made) → child
//! binds, `B` → parent connects and calls, then closes its connection and
//! sends `Q` → the child's server shuts down, removes its socket, `D`.

use std::convert::Infallible;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::{NamedService, UnaryService};
use tonic::transport::{Endpoint, Server};
use tonic::{Request, Response, Status};

use super::{answer, argument, expect_byte, send_byte, unlink, SockDir, HANDSHAKE_TIMEOUT};
use crate::harness::{Case, ChildCtx, Params, Peer};

/// A tonic call over UDS is ~40 µs: scale `Params::iters` down by this.
const ITERS_DIV: usize = 16;
const TAG: &str = "tonic";
const SERVICE: &str = "ferry.bench.Echo";
const METHOD: &str = "/ferry.bench.Echo/Call";
/// A round of calls that takes longer than this fails the case.
const ROUND_TIMEOUT: Duration = Duration::from_secs(60);

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("tonic.uds.null", parent::<0>, child),
        Case::new("tonic.uds.arg4", parent::<4>, child),
        Case::new("tonic.uds.arg256", parent::<256>, child),
        Case::new("tonic.uds.arg512", parent::<512>, child),
        Case::new("tonic.uds.arg1024", parent::<1024>, child),
    ]
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

// --- the codec: message bytes as they are --------------------------------

#[derive(Clone, Copy, Debug, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        // tonic hands over exactly one whole message.
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

// --- the server: one unary method, as tonic-build would write it ---------

/// The method's handler: answers its argument.
struct Call;

impl UnaryService<Bytes> for Call {
    type Response = Bytes;
    type Future = std::future::Ready<Result<Response<Bytes>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let a = answer(request.get_ref());
        std::future::ready(Ok(Response::new(Bytes::copy_from_slice(&a.to_le_bytes()))))
    }
}

#[derive(Clone, Copy, Debug)]
struct EchoServer;

impl NamedService for EchoServer {
    const NAME: &'static str = SERVICE;
}

impl<B> Service<http::Request<B>> for EchoServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == METHOD {
            Box::pin(async move { Ok(tonic::server::Grpc::new(RawCodec).unary(Call, req).await) })
        } else {
            Box::pin(async move { Ok(Status::unimplemented(req.uri().path().to_string()).into_http()) })
        }
    }
}

// --- the two sides --------------------------------------------------------

fn parent<const N: usize>(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let dir = SockDir::create(&peer.run_id, TAG).expect("tonic: socket directory");
    peer.sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).expect("SO_RCVTIMEO");
    send_byte(&peer.sock, b'S');
    expect_byte(&peer.sock, b'B');

    let rt = runtime();
    let uri = format!("unix://{}", SockDir::socket(&peer.run_id, TAG).display());
    let channel = rt.block_on(async { Endpoint::from_shared(uri)?.connect().await }).expect("tonic: connect");
    let mut client = tonic::client::Grpc::new(channel);
    let samples = measure(&rt, &mut client, &Bytes::from(argument(N)), p);
    // Close the connection (dropping the runtime ends its tasks), then tell
    // the server to stop and wait until it has cleaned up.
    drop(client);
    drop(rt);
    send_byte(&peer.sock, b'Q');
    expect_byte(&peer.sock, b'D');
    drop(dir);
    samples
}

fn child(ctx: &ChildCtx) {
    expect_byte(&ctx.sock, b'S');
    let path = SockDir::socket(&ctx.run_id, TAG);
    let rt = runtime();
    rt.block_on(async {
        let listener = tokio::net::UnixListener::bind(&path).expect("tonic: bind");
        send_byte(&ctx.sock, b'B');
        // The stop signal: the parent's `Q` (or EOF, if it is gone) on the
        // harness socket. (O_NONBLOCK also applies to `ctx.sock`, a dup of
        // the same socket: its last use below is a 1-byte write.)
        let sock = ctx.sock.try_clone().expect("dup harness socket");
        sock.set_nonblocking(true).expect("O_NONBLOCK");
        let sock = tokio::net::UnixStream::from_std(sock).expect("harness socket");
        let stop = async move {
            let mut b = [0u8];
            loop {
                if sock.readable().await.is_err() {
                    return;
                }
                match sock.try_read(&mut b) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    _ => return,
                }
            }
        };
        let incoming = tonic::codegen::tokio_stream::wrappers::UnixListenerStream::new(listener);
        Server::builder().serve_with_incoming_shutdown(EchoServer, incoming, stop).await.expect("tonic: serve");
    });
    drop(rt);
    unlink(&path);
    send_byte(&ctx.sock, b'D');
}

/// Rounds of unary calls with `arg` on `client`, checking each answer.
fn measure(
    rt: &tokio::runtime::Runtime,
    client: &mut tonic::client::Grpc<tonic::transport::Channel>,
    arg: &Bytes,
    p: &Params,
) -> Vec<f64> {
    let path = PathAndQuery::from_static(METHOD);
    let expected = answer(arg);
    p.measure(p.iters_div(ITERS_DIV), |n| {
        rt.block_on(async {
            tokio::time::timeout(ROUND_TIMEOUT, async {
                for _ in 0..n {
                    call(client, &path, arg, expected).await;
                }
            })
            .await
            .expect("tonic: a round of calls timed out")
        })
    })
}

/// One unary call, its answer checked.
async fn call(
    client: &mut tonic::client::Grpc<tonic::transport::Channel>,
    path: &PathAndQuery,
    arg: &Bytes,
    expected: u64,
) {
    client.ready().await.expect("tonic: channel not ready");
    // Bytes clones share the buffer: the codec's put_slice
    // is the one copy of the argument, as with protobuf.
    let resp =
        client.unary::<Bytes, Bytes, _>(Request::new(arg.clone()), path.clone(), RawCodec).await.expect("tonic: call");
    let resp = resp.into_inner();
    assert_eq!(resp.len(), 8, "tonic: response of {} bytes", resp.len());
    let got = u64::from_le_bytes(resp[..].try_into().unwrap());
    assert_eq!(got, expected, "tonic: wrong answer");
}

/// `tonic.tcp.null` (the TCP suite): the same unary call over TCP.
pub fn tcp_case() -> Case {
    Case::new("tonic.tcp.null", tcp_parent, tcp_child)
}

fn tcp_parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let addr = crate::tcp::hear(&peer.sock);
    let rt = runtime();
    let endpoint = Endpoint::from_shared(format!("http://{addr}")).expect("tonic: endpoint").tcp_nodelay(true);
    let channel = rt.block_on(endpoint.connect()).expect("tonic: connect");
    let mut client = tonic::client::Grpc::new(channel);
    // A latency case of the TCP suite: each call timed on its own.
    let (path, arg) = (PathAndQuery::from_static(METHOD), Bytes::new());
    let expected = answer(&arg);
    let samples = p.measure_each(crate::tcp::calls(p), || {
        // The timeout's timer is made inside the runtime: it needs its reactor.
        rt.block_on(async { tokio::time::timeout(ROUND_TIMEOUT, call(&mut client, &path, &arg, expected)).await })
            .expect("tonic: a call timed out")
    });
    drop(client);
    drop(rt);
    crate::tcp::tell(&peer.sock, "stop");
    assert_eq!(crate::tcp::hear(&peer.sock), "done");
    samples
}

fn tcp_child(ctx: &ChildCtx) {
    let rt = runtime();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((crate::tcp::child_ip(), 0)).await.expect("tonic: bind");
        crate::tcp::tell(&ctx.sock, &listener.local_addr().unwrap().to_string());
        let sock = ctx.sock.try_clone().expect("dup harness socket");
        let stop = async move {
            let _ = tokio::task::spawn_blocking(move || crate::tcp::hear(&sock)).await;
        };
        let incoming = tonic::codegen::tokio_stream::wrappers::TcpListenerStream::new(listener);
        Server::builder()
            .tcp_nodelay(true)
            .serve_with_incoming_shutdown(EchoServer, incoming, stop)
            .await
            .expect("tonic: serve");
    });
    drop(rt);
    crate::tcp::tell(&ctx.sock, "done");
}
