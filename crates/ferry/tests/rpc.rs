//! RPC over every placement of client and server: one team (inproc), two
//! teams of one process and two processes (shared memory), two nodes in two
//! network namespaces (TCP). Each case is a server side (A) and a client
//! side (B) that share nothing but what they tell each other
//! (`common::pair`); what the server did is seen through calls (`ticks`).

mod common;

use common::pair::{pair, Placement, Side};
use common::typed::{blob, Blob};
use ferry::rpc::{RpcError, ServiceEndpoint};
use ferry::{Checkpoint, Team};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum MathError {
    DivideByZero,
}

#[ferry::service]
pub trait Calc {
    async fn add(&self, a: i32, b: i32) -> i32;
    async fn div(&self, a: i32, b: i32) -> Result<i32, MathError>;
    /// Records `v` (for one-way and batched calls).
    async fn push(&self, v: u64);
    async fn pushed(&self) -> Vec<u64>;
    async fn boom(&self);
    /// Counts up every 5 ms for `ms` milliseconds (to see cancellation stop it).
    async fn slow(&self, ms: u64) -> u64;
    async fn ticks(&self) -> u64;
    /// Calls back the client's `Notify` service at `to`.
    async fn call_me_back(&self, to: ferry::EndpointId, text: String) -> String;
    /// The same, with the blocking API inside the handler (the processor
    /// keeps running other tasks while this one blocks).
    async fn call_me_back_sync(&self, to: ferry::EndpointId, text: String) -> String;
    /// The name of the thread the handler runs on.
    async fn thread(&self) -> String;
}

#[ferry::service]
pub trait Notify {
    async fn note(&self, text: String) -> String;
}

struct CalcImpl {
    team: Team,
    pushed: parking_lot::Mutex<Vec<u64>>,
    ticks: Arc<AtomicU64>,
}

impl Calc for CalcImpl {
    async fn add(&self, a: i32, b: i32) -> i32 {
        a + b
    }
    async fn div(&self, a: i32, b: i32) -> Result<i32, MathError> {
        if b == 0 {
            Err(MathError::DivideByZero)
        } else {
            Ok(a / b)
        }
    }
    async fn push(&self, v: u64) {
        self.pushed.lock().push(v);
    }
    async fn pushed(&self) -> Vec<u64> {
        self.pushed.lock().clone()
    }
    async fn boom(&self) {
        panic!("boom on purpose");
    }
    async fn slow(&self, ms: u64) -> u64 {
        let end = Instant::now() + Duration::from_millis(ms);
        while Instant::now() < end {
            self.ticks.fetch_add(1, Ordering::SeqCst);
            self.team.sleep(Duration::from_millis(5)).await;
        }
        self.ticks.load(Ordering::SeqCst)
    }
    async fn ticks(&self) -> u64 {
        self.ticks.load(Ordering::SeqCst)
    }
    async fn call_me_back(&self, to: ferry::EndpointId, text: String) -> String {
        // Inside a handler: bind asynchronously (a blocking bind would hold the processor).
        let notify = NotifyClient::connect(&self.team, to).await.expect("bind the callback");
        notify.note(format!("{text}!")).await.expect("callback call")
    }
    async fn call_me_back_sync(&self, to: ferry::EndpointId, text: String) -> String {
        self.notify_blocking(to, text)
    }
    async fn thread(&self) -> String {
        std::thread::current().name().unwrap_or("?").to_string()
    }
}

struct NotifyImpl;

impl CalcImpl {
    fn notify_blocking(&self, to: ferry::EndpointId, text: String) -> String {
        let notify = NotifyClient::bind_to(&self.team, to).expect("blocking bind inside a handler");
        notify.note_blocking(format!("{text}?")).expect("blocking call inside a handler")
    }
}

impl Notify for NotifyImpl {
    async fn note(&self, text: String) -> String {
        format!("noted {text}")
    }
}

/// Side A's part in most cases: serves `Calc` as "calc" until the client is done.
fn serve_calc(srv: &Side) {
    let imp = CalcImpl { team: srv.team.clone(), pushed: Default::default(), ticks: Default::default() };
    let _serving = CalcServer::serve(&srv.team, "calc", imp).unwrap();
    srv.put("serving", "");
    srv.get_within::<String>("done", Duration::from_secs(60));
}

/// Side B's start: a client of the server's "calc", bound by name.
fn calc_client(cli: &Side) -> CalcClient {
    cli.get::<String>("serving");
    CalcClient::bind(&cli.team, "calc").unwrap()
}

/// Runs a case whose server side only serves `Calc`: `client` is side B.
fn with_calc_server(p: Placement, client: impl FnOnce(&Side) + Send) {
    pair(p).config(|b| b.processors(1)).run(serve_calc, |cli| {
        client(cli);
        cli.put("done", "");
    });
}

fn calls_in_every_mode(p: Placement) {
    with_calc_server(p, |cli| {
        let calc = calc_client(cli);
        // synchronous
        assert_eq!(calc.add_blocking(2, 3).unwrap(), 5);
        // asynchronous: promises, the caller runs on, then claims them
        let promises: Vec<_> = (0..50).map(|i| calc.add(i, i)).collect();
        for (i, p) in promises.into_iter().enumerate() {
            assert_eq!(p.wait().unwrap(), 2 * i as i32);
        }
        // one-way with each checkpoint
        for (v, cp) in [
            (1, Checkpoint::Immediate),
            (2, Checkpoint::OnReceipt),
            (3, Checkpoint::OnDelivery),
            (4, Checkpoint::OnReturn),
        ] {
            calc.push_oneway(v, cp).unwrap();
        }
        // batched: queued, flushed by the next synchronous call, run in order before it
        for v in 10..20 {
            calc.push_batched(v).unwrap();
        }
        let got = calc.pushed_blocking().unwrap();
        let expect: Vec<u64> = (1..=4).chain(10..20).collect();
        // One-way Immediate/OnReceipt/OnDelivery calls race their handlers; the batch is ordered.
        let mut head = got[..4].to_vec();
        head.sort();
        assert_eq!(head, expect[..4]);
        assert_eq!(got[4..], expect[4..]);
        // flush with no call of its own
        calc.push_batched(99).unwrap();
        calc.flush().unwrap();
        assert_eq!(*calc.pushed_blocking().unwrap().last().unwrap(), 99);
        // from tokio too
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        assert_eq!(rt.block_on(calc.add(40, 2)).unwrap(), 42);
    });
}

/// Results on both sides of the size a reply holds inline (30 bytes: a
/// status byte, an array header and one byte per small number) arrive whole.
fn results_around_the_inline_size(p: Placement) {
    with_calc_server(p, |cli| {
        let calc = calc_client(cli);
        let mut expect = Vec::new();
        for v in 0..40u64 {
            calc.push_blocking(v).unwrap();
            expect.push(v);
            assert_eq!(calc.pushed_blocking().unwrap(), expect);
        }
    });
}

fn errors_reach_the_caller_typed(p: Placement) {
    with_calc_server(p, |cli| {
        let calc = calc_client(cli);
        assert_eq!(calc.div_blocking(7, 2).unwrap(), 3);
        assert!(matches!(calc.div_blocking(1, 0), Err(RpcError::Remote(MathError::DivideByZero))));
        match calc.boom_blocking() {
            Err(RpcError::HandlerPanicked(m)) => assert!(m.contains("boom on purpose"), "{m}"),
            other => panic!("want HandlerPanicked, got {other:?}"),
        }
        // The server keeps serving after a panic.
        assert_eq!(calc.add_blocking(1, 1).unwrap(), 2);
    });
}

/// A one-way call discards the method's value whatever its type; waiting
/// for its return (`OnReturn`) reports the handler's error and panic as a
/// call does, never as a decode error of the value.
fn oneway_discards_the_value_and_reports_errors(p: Placement) {
    with_calc_server(p, |cli| {
        let calc = calc_client(cli);
        for cp in [Checkpoint::Immediate, Checkpoint::OnReceipt, Checkpoint::OnDelivery, Checkpoint::OnReturn] {
            calc.add_oneway(2, 3, cp).unwrap();
            calc.slow_oneway(1, cp).unwrap();
            calc.div_oneway(7, 2, cp).unwrap();
        }
        match calc.div_oneway(1, 0, Checkpoint::OnReturn) {
            Err(RpcError::Remote(MathError::DivideByZero)) => {}
            other => panic!("want Remote(DivideByZero), got {other:?}"),
        }
        match calc.boom_oneway(Checkpoint::OnReturn) {
            Err(RpcError::HandlerPanicked(m)) => assert!(m.contains("boom on purpose"), "{m}"),
            other => panic!("want HandlerPanicked, got {other:?}"),
        }
        assert_eq!(calc.add_blocking(1, 1).unwrap(), 2);
    });
}

mod v2 {
    // The same service name with a different signature: a client built
    // against it must be refused at bind time.
    #[ferry::service]
    pub trait Calc {
        async fn add(&self, a: i64, b: i32) -> i32;
    }
}

fn mismatched_client_is_refused_at_bind(p: Placement) {
    with_calc_server(p, |cli| {
        cli.get::<String>("serving");
        match v2::CalcClient::bind(&cli.team, "calc") {
            Err(RpcError::InterfaceMismatch(why)) => {
                assert_eq!(why, "add: argument a is i32 here, a is i64 in the client")
            }
            Ok(_) => panic!("a mismatched client was accepted"),
            Err(e) => panic!("want InterfaceMismatch, got {e:?}"),
        }
        assert!(matches!(NotifyClient::bind(&cli.team, "calc"), Err(RpcError::InterfaceMismatch(_))));
        // A request for a method the service lacks (CALL, method 99, no
        // arguments): typed, naming the method (it was Refused("no method #99")).
        let to = cli.team.raw_sender(cli.team.lookup("calc").unwrap());
        let mut request = vec![2u8];
        request.extend_from_slice(&99u32.to_le_bytes());
        request.push(0x90);
        let answer = to.send(&request, Checkpoint::OnReturn).unwrap();
        let r = ferry::rpc::__private::decode_response::<(), ferry::rpc::Never>(&answer);
        assert!(matches!(r, Err(RpcError::NoSuchMethod(99))), "{r:?}");
        assert_eq!(r.unwrap_err().to_string(), "the server has no method #99");
    });
}

/// Waits until the handler's tick counter stops moving; returns its value.
fn settled(calc: &CalcClient) -> u64 {
    loop {
        let a = calc.ticks_blocking().unwrap();
        std::thread::sleep(Duration::from_millis(60));
        if calc.ticks_blocking().unwrap() == a {
            return a;
        }
    }
}

fn deadline_cancels_the_handler(p: Placement) {
    with_calc_server(p, |cli| {
        let calc = calc_client(cli);
        let short = calc.with_timeout(Duration::from_millis(100));
        let t0 = Instant::now();
        assert!(matches!(short.slow_blocking(5_000), Err(RpcError::DeadlineExceeded)));
        assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
        // The handler was cancelled at the server: it stopped long before its 5 s.
        let stopped = settled(&calc);
        assert!(stopped < 100, "the handler ran on ({stopped} ticks)");
    });
}

fn dropped_call_cancels_the_handler(p: Placement) {
    with_calc_server(p, |cli| {
        let calc = calc_client(cli);
        let call = calc.slow(5_000);
        std::thread::sleep(Duration::from_millis(100));
        assert!(calc.ticks_blocking().unwrap() > 0, "the handler should be running");
        drop(call);
        let stopped = settled(&calc);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(calc.ticks_blocking().unwrap(), stopped, "the handler goes on after its caller left");
        assert!(stopped < 200, "the handler ran on ({stopped} ticks)");
        // The server still works.
        assert_eq!(calc.add_blocking(2, 2).unwrap(), 4);
    });
}

fn server_calls_back_over_the_same_channel(p: Placement) {
    with_calc_server(p, |cli| {
        let notify = ServiceEndpoint::open_unnamed(&cli.team, NotifyClient::descriptor()).unwrap();
        let notify_id = notify.id();
        let _serving = notify.serve(Arc::new(NotifyServer::new(NotifyImpl)));
        let calc = calc_client(cli);
        assert_eq!(calc.call_me_back_blocking(notify_id, "hi".into()).unwrap(), "noted hi!");
        // Blocking calls inside a handler: even with one processor per team
        // (and one team for both sides) the processor runs the other tasks
        // (the callback's server) while the handler blocks.
        let t0 = Instant::now();
        assert_eq!(calc.call_me_back_sync_blocking(notify_id, "yo".into()).unwrap(), "noted yo?");
        assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    });
}

/// One server, both receipt styles: a task accepts calls explicitly,
/// answers `add` itself (when it chooses), and hands everything else to
/// the implicit dispatcher.
fn explicit_and_implicit_receipt_on_one_server(p: Placement) {
    pair(p).config(|b| b.processors(1)).run(
        |srv| {
            let endpoint = ServiceEndpoint::open(&srv.team, "calc", CalcClient::descriptor()).unwrap();
            let implicit = Arc::new(CalcServer::new(CalcImpl {
                team: srv.team.clone(),
                pushed: Default::default(),
                ticks: Default::default(),
            }));
            let st = srv.team.clone();
            let acceptor = srv.team.spawn(async move {
                let mut explicit = 0;
                for _ in 0..6 {
                    let call = endpoint.accept().await.unwrap();
                    if call.method_name() == "add" {
                        match CalcRequest::from_call(call).unwrap() {
                            CalcRequest::Add { a, b, reply } => {
                                explicit += 1;
                                // Reply when we choose: after a pause, with a marked answer.
                                st.sleep(Duration::from_millis(1)).await;
                                reply.ok(&(1000 + a + b)).unwrap();
                            }
                            _ => unreachable!(),
                        }
                    } else {
                        call.dispatch(&st, &implicit);
                    }
                }
                explicit
            });
            srv.put("serving", "");
            assert_eq!(srv.team.block_on(acceptor).unwrap(), 3);
        },
        |cli| {
            let calc = calc_client(cli);
            for i in 0..3 {
                assert_eq!(calc.add_blocking(i, 1).unwrap(), 1001 + i, "explicit");
                assert_eq!(calc.div_blocking(9, 3).unwrap(), 3, "implicit");
            }
        },
    );
}

/// Explicit receipt enforces deadlines too: the accepted call's cancel token
/// fires at the caller's deadline (even for a one-way call, whose caller
/// sends no cancel), and a call whose deadline passed while it waited in the
/// queue is answered for the caller instead of being accepted.
fn explicit_receipt_sees_the_deadline(p: Placement) {
    use std::future::Future;
    use std::task::Poll;
    pair(p).config(|b| b.processors(1)).run(
        |srv| {
            let endpoint = ServiceEndpoint::open(&srv.team, "calc", CalcClient::descriptor()).unwrap();
            srv.put("serving", "");
            // Holds the first call until the next two have expired in the queue.
            let first = endpoint.accept_blocking().unwrap();
            assert_eq!(first.method_name(), "div");
            srv.get::<String>("expired");
            first.reply_ok(&0i32).unwrap();
            // The expired calls are answered for their callers, not handed out.
            let call = endpoint.accept_blocking().unwrap();
            assert_eq!(call.method_name(), "push", "an expired call was accepted");
            let token = call.cancel_token().unwrap().clone();
            let waited = Instant::now();
            let mut cancelled = std::pin::pin!(token.cancelled());
            let mut patience = std::pin::pin!(srv.team.sleep(Duration::from_secs(10)));
            srv.team.block_on(std::future::poll_fn(|cx| {
                if cancelled.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(());
                }
                patience.as_mut().poll(cx).map(|()| panic!("the deadline never cancelled the accepted call"))
            }));
            let waited = waited.elapsed();
            assert!(waited < Duration::from_secs(3), "cancelled after {waited:?}");
        },
        |cli| {
            let calc = calc_client(cli);
            let short = calc.with_timeout(Duration::from_millis(100));
            let first = calc.div(1, 1);
            let expired = [short.add(1, 2), short.add(3, 4)];
            for call in expired {
                assert!(matches!(cli.team.block_on(call), Err(RpcError::DeadlineExceeded)));
            }
            // The server counts a deadline from a call's arrival (budgets, not
            // clocks, travel): a server thread descheduled before it took the
            // calls gives them that much longer. A margin past the caller's
            // deadline, so that they expired at the server too (under a
            // loaded machine one was accepted, 1 run in 8).
            std::thread::sleep(Duration::from_millis(300));
            cli.put("expired", "");
            assert_eq!(cli.team.block_on(first).unwrap(), 0);
            // One-way: no caller waits to send a cancel, the deadline alone must
            // stop it. (Long enough not to expire in the queue on a slow machine.)
            calc.with_timeout(Duration::from_millis(500)).push_oneway(7, Checkpoint::OnReceipt).unwrap();
        },
    );
}

/// A call cancelled while it still waits in the server's queue is seen as
/// cancelled when it is accepted (its cancel arrived before its hook).
fn cancel_before_accept_is_not_lost(p: Placement) {
    pair(p).config(|b| b.processors(1)).run(
        |srv| {
            let endpoint = ServiceEndpoint::open(&srv.team, "calc", CalcClient::descriptor()).unwrap();
            srv.put("serving", "");
            // The bind is answered inside accept; the first call is the add.
            match CalcRequest::from_call(endpoint.accept_blocking().unwrap()).unwrap() {
                CalcRequest::Add { a, b, reply } => reply.ok(&(a + b)).unwrap(),
                _ => panic!("expected add"),
            }
            srv.get::<String>("cancelled");
            let call = endpoint.accept_blocking().unwrap();
            assert_eq!(call.method_name(), "slow");
            assert!(call.cancel_token().unwrap().is_cancelled(), "the early cancel was lost");
        },
        |cli| {
            let calc = calc_client(cli);
            assert_eq!(calc.add_blocking(1, 1).unwrap(), 2);
            drop(calc.slow(1_000)); // sent, then cancelled at once
            std::thread::sleep(Duration::from_millis(50)); // the cancel is there before anyone accepts
            cli.put("cancelled", "");
        },
    );
}

/// Implicit handlers run on the server team's processors (most often the
/// one that received the call, with no task switch), never on a client
/// thread that happened to receive the call while it waited.
fn handlers_run_on_the_servers_processors(p: Placement) {
    with_calc_server(p, |cli| {
        let calc = calc_client(cli);
        for _ in 0..200 {
            let on = calc.thread_blocking().unwrap();
            assert!(on.starts_with("ferry-proc"), "handler ran on {on:?}");
        }
        let calls: Vec<_> = (0..50).map(|_| calc.thread()).collect();
        for c in calls {
            let on = cli.team.block_on(c).unwrap();
            assert!(on.starts_with("ferry-proc"), "handler ran on {on:?}");
        }
    });
}

#[ferry::service]
pub trait Blobs {
    /// Answers a blob of `id + 1`, as long, with the data reversed.
    async fn turn(&self, b: Blob) -> Blob;
}

struct BlobsImpl;

impl Blobs for BlobsImpl {
    async fn turn(&self, mut b: Blob) -> Blob {
        b.id += 1;
        b.data.reverse();
        b
    }
}

/// A large typed argument and result (12 MiB: far larger than a frame,
/// staged out of band, encoded where they are staged) arrive whole.
fn large_typed_arguments_and_results(p: Placement) {
    pair(p).config(|b| b.processors(1)).run(
        |srv| {
            let _serving = BlobsServer::serve(&srv.team, "blobs", BlobsImpl).unwrap();
            srv.put("serving", "");
            srv.get_within::<String>("done", Duration::from_secs(60));
        },
        |cli| {
            cli.get::<String>("serving");
            let blobs = BlobsClient::bind(&cli.team, "blobs").unwrap();
            for (id, len) in [(1, 12 << 20), (2, 100), (3, 70_000), (4, 9 << 20)] {
                let mut want = blob(id, len);
                let got = match id % 2 {
                    0 => blobs.turn_blocking(blob(id, len)).unwrap(),
                    _ => cli.team.block_on(blobs.turn(blob(id, len))).unwrap(),
                };
                want.id += 1;
                want.data.reverse();
                assert!(got == want, "blob {id} ({len} bytes) damaged");
            }
            cli.put("done", "");
        },
    );
}

#[ferry::service]
pub trait Holder {
    /// Waits for a message on the server's `go` port; answers `b`'s length and the message's.
    async fn hold(&self, b: Blob) -> (u64, u64);
}

struct HolderImpl {
    go: ferry::RawPort,
}

impl Holder for HolderImpl {
    async fn hold(&self, b: Blob) -> (u64, u64) {
        let go = self.go.recv_timeout(Duration::from_secs(20)).map_or(0, |m| m.len() as u64);
        ((b.data.len() + b.chunk.len()) as u64, go)
    }
}

/// The server lets a call's request go once its arguments are decoded,
/// before the handler runs: with room for one 20 MiB message on the way
/// (32 MiB of payload area, or of TCP credit), a second one goes while the
/// handler of the first still runs (the handler waits for it). Kept until
/// the reply, the first request would hold the second up past its deadline.
fn request_goes_before_the_handler_runs(p: Placement) {
    const BIG: usize = 20 << 20;
    pair(p).config(|b| b.processors(1).max_message(32 << 20)).run(
        |srv| {
            let go = srv.team.open_raw_port().unwrap();
            srv.put("go", go.id());
            let _serving = HolderServer::serve(&srv.team, "holder", HolderImpl { go }).unwrap();
            srv.put("serving", "");
            srv.get_within::<String>("done", Duration::from_secs(60));
        },
        |cli| {
            let go = cli.team.raw_sender(cli.get("go")).with_timeout(Duration::from_secs(5));
            cli.get::<String>("serving");
            let holder = HolderClient::bind(&cli.team, "holder").unwrap();
            let held = holder.hold(blob(1, BIG));
            go.send(&vec![7u8; BIG], Checkpoint::OnReceipt).expect("the second large message went");
            assert_eq!(held.wait().unwrap(), (BIG as u64, BIG as u64));
            cli.put("done", "");
        },
    );
}

placements!(
    request_goes_before_the_handler_runs,
    large_typed_arguments_and_results,
    calls_in_every_mode,
    results_around_the_inline_size,
    errors_reach_the_caller_typed,
    oneway_discards_the_value_and_reports_errors,
    mismatched_client_is_refused_at_bind,
    deadline_cancels_the_handler,
    dropped_call_cancels_the_handler,
    server_calls_back_over_the_same_channel,
    explicit_and_implicit_receipt_on_one_server,
    cancel_before_accept_is_not_lost,
    handlers_run_on_the_servers_processors,
    explicit_receipt_sees_the_deadline,
);
