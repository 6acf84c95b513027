//! `tarpc.tcp.null` (feature `tarpc`): a null call with tarpc, the Rust RPC
//! framework many pick for typed services, over its TCP transport with
//! bincode; server in the child, client in the parent, each on a
//! current-thread tokio runtime.

use crate::harness::{Case, ChildCtx, Params, Peer};
use crate::tcp::{child_ip, hear, tell};
use futures::{future, StreamExt};
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tarpc::{client, context};

#[tarpc::service]
trait Null {
    async fn null();
}

#[derive(Clone)]
struct NullServer;

impl Null for NullServer {
    async fn null(self, _: context::Context) {}
}

pub fn case() -> Case {
    Case::new("tarpc.tcp.null", parent, child)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime")
}

fn parent(peer: &mut Peer, p: &Params) -> Vec<f64> {
    let addr: std::net::SocketAddr = hear(&peer.sock).parse().unwrap();
    let rt = runtime();
    let c = rt.block_on(async {
        let transport = tarpc::serde_transport::tcp::connect(addr, Bincode::default).await.expect("tarpc: connect");
        NullClient::new(client::Config::default(), transport).spawn()
    });
    // A latency case of the TCP suite: each call timed on its own (the
    // client's dispatch task runs on this thread, inside each block_on).
    let samples =
        p.measure_each(crate::tcp::calls(p), || rt.block_on(c.null(context::current())).expect("tarpc: call"));
    drop(c);
    drop(rt);
    tell(&peer.sock, "stop");
    assert_eq!(hear(&peer.sock), "done");
    samples
}

fn child(ctx: &ChildCtx) {
    let rt = runtime();
    rt.block_on(async {
        let listener =
            tarpc::serde_transport::tcp::listen((child_ip(), 0), Bincode::default).await.expect("tarpc: bind");
        tell(&ctx.sock, &listener.local_addr().to_string());
        let sock = ctx.sock.try_clone().expect("dup harness socket");
        let stop = tokio::task::spawn_blocking(move || hear(&sock));
        let serve = listener.filter_map(|r| future::ready(r.ok())).map(BaseChannel::with_defaults).for_each(|ch| {
            tokio::spawn(ch.execute(NullServer.serve()).for_each(|response| async move {
                tokio::spawn(response);
            }));
            future::ready(())
        });
        tokio::select! {
            _ = serve => {}
            _ = stop => {}
        }
    });
    drop(rt);
    tell(&ctx.sock, "done");
}
