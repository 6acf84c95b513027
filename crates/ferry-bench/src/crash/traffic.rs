//! The traffic of a team: random primitives toward random peers, each
//! with a deadline, each recorded (what, toward whom, when it started and
//! ended, how it ended); and what the records say once a peer was killed.

use crate::crash::protocol::{port_name, svc_name, temp_name, PeerInfo, TeamSpec};
use crate::crash::rng::{now_ns, Rng};
use crate::crash::service::CrashClient;
use ferry::rpc::RpcError;
use ferry::{Checkpoint, EndpointId, Error, Sender, Team};
use serde::{Deserialize, Serialize};
use serde_bytes::ByteBuf;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// What goes to a team's port: the receiver holds its reply `hold_ms`
/// (so calls are in flight when a team is killed).
#[derive(Serialize, Deserialize)]
pub(crate) struct Msg {
    pub hold_ms: u32,
    pub data: ByteBuf,
}

/// Largest "large" message (they go out of band over shared memory).
const LARGE_MAX: u64 = 4 << 20;
const LARGE_MIN: u64 = 256 << 10;
/// An operation that takes longer than its deadline plus this is overdue.
pub(crate) const SLACK: Duration = Duration::from_secs(2);

/// The primitives the traffic picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Prim {
    /// A port send, `Immediate` (never waits; may be `WouldBlock`).
    SendImmediate,
    /// A port send, `OnReceipt`.
    SendReceipt,
    /// A port send, `OnDelivery` (the receiver took it from its port).
    SendDelivery,
    /// A port call (`OnReturn`), blocking.
    Call,
    /// A port call (`OnReturn`) through its future.
    CallAsync,
    /// A message of 256 KiB..4 MiB, `OnReceipt` (out of band over shared memory).
    Large,
    /// An RPC call, blocking.
    Rpc,
    /// An RPC call through its promise.
    RpcAsync,
    /// A retryable RPC call (`Client::retrying`): run at most once.
    RpcRetrying,
    /// A one-way RPC call, `OnReceipt`.
    RpcOneway,
    /// The peer's port looked up by name, then a send to it.
    Lookup,
    /// A client bound by the service's name, then a call.
    Bind,
    /// A named port of this team opened, sent to, closed.
    NamedPort,
}

impl Prim {
    /// The primitives aimed at a peer.
    pub const TOWARD_PEER: [Prim; 12] = [
        Prim::SendImmediate,
        Prim::SendReceipt,
        Prim::SendDelivery,
        Prim::Call,
        Prim::CallAsync,
        Prim::Large,
        Prim::Rpc,
        Prim::RpcAsync,
        Prim::RpcRetrying,
        Prim::RpcOneway,
        Prim::Lookup,
        Prim::Bind,
    ];

    /// Failures allowed for an operation toward a team that was killed
    /// while it was in flight (or before it started): `PeerGone`; a bind
    /// that races the exit ends `NoSuchTeam` (documented), a look-up of a
    /// name that went `NameNotFound`.
    fn allowed_toward_dead(self, class: Class) -> bool {
        match class {
            Class::PeerGone | Class::NoSuchTeam => true,
            Class::NameNotFound => matches!(self, Prim::Lookup | Prim::Bind),
            Class::WouldBlock => self == Prim::SendImmediate,
            _ => false,
        }
    }
}

/// How an operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Class {
    Ok,
    WouldBlock,
    PeerGone,
    NoSuchTeam,
    NameNotFound,
    Deadline,
    Other,
}

fn class_of(e: &Error) -> Class {
    match e {
        Error::PeerGone { .. } => Class::PeerGone,
        Error::NoSuchTeam(_) => Class::NoSuchTeam,
        Error::NameNotFound(_) => Class::NameNotFound,
        Error::DeadlineExceeded => Class::Deadline,
        Error::WouldBlock { .. } => Class::WouldBlock,
        _ => Class::Other,
    }
}

fn rpc_class_of<E>(e: &RpcError<E>) -> Class {
    match e {
        RpcError::PeerGone { .. } => Class::PeerGone,
        RpcError::DeadlineExceeded => Class::Deadline,
        RpcError::Ferry(e) => class_of(e),
        _ => Class::Other,
    }
}

/// A failure: its class and its text.
type Failure = (Class, String);

fn fail(e: Error) -> Failure {
    (class_of(&e), format!("{e:?}"))
}

fn rpc_fail<E: std::fmt::Debug>(e: RpcError<E>) -> Failure {
    (rpc_class_of(&e), format!("{e:?}"))
}

/// One operation as it went.
#[derive(Clone, Debug)]
pub(crate) struct Op {
    /// The peer's index (this team's own for `NamedPort`).
    pub peer: usize,
    pub prim: Prim,
    pub start: u64,
    pub end: u64,
    pub class: Class,
    pub what: Option<String>,
}

/// A peer as the traffic reaches it: a sender and a client kept for the
/// team's whole life, as a program keeps them (so what they hold of a
/// dead peer shows in the leak checks), and its names.
pub(crate) struct Target {
    pub info: PeerInfo,
    sender: Sender<Msg>,
    client: Mutex<Option<CrashClient>>,
}

impl Target {
    pub fn new(team: &Team, info: PeerInfo, deadline: Duration) -> Target {
        let port: EndpointId = info.port.parse().expect("port endpoint");
        let sender = team.sender::<Msg>(port).with_timeout(deadline);
        Target { info, sender, client: Mutex::new(None) }
    }

    /// The kept client, bound on first use.
    fn client(&self, team: &Team, deadline: Duration) -> Result<CrashClient, Failure> {
        if let Some(c) = self.client.lock().unwrap().as_ref() {
            return Ok(c.clone());
        }
        let ep: EndpointId = self.info.svc.parse().expect("service endpoint");
        let c = CrashClient::bind_to(team, ep).map_err(rpc_fail)?.with_timeout(deadline);
        Ok(self.client.lock().unwrap().get_or_insert(c).clone())
    }
}

/// What a worker needs to make operations.
pub(crate) struct Ctx<'a> {
    pub team: &'a Team,
    pub spec: &'a TeamSpec,
    /// This team's id, as callers name themselves to servers.
    pub me: String,
    pub worker: usize,
    /// Request ids, unique in the team.
    pub ids: &'a AtomicU64,
    /// Bytes the large messages are cut from.
    pub large: &'a [u8],
}

impl Ctx<'_> {
    fn deadline(&self) -> Duration {
        Duration::from_millis(self.spec.deadline_ms)
    }

    /// Makes one operation of `prim` toward `target`, recording it.
    pub fn run(&self, prim: Prim, peer: usize, target: Option<&Target>, rng: &mut Rng) -> Op {
        let start = now_ns();
        let r = self.attempt(prim, peer, target, rng);
        let end = now_ns();
        let (class, what) = match r {
            Ok(()) => (Class::Ok, None),
            Err((c, w)) => (c, Some(w)),
        };
        Op { peer, prim, start, end, class, what }
    }

    fn small(&self, rng: &mut Rng, hold: bool) -> Msg {
        let hold_ms = if hold && rng.one_in(3) { rng.between(1, 30) as u32 } else { 0 };
        Msg { hold_ms, data: ByteBuf::from(&self.large[..rng.below(512) as usize]) }
    }

    fn call_args(&self, rng: &mut Rng) -> (String, u64, u32, ByteBuf) {
        let hold = if rng.one_in(3) { rng.between(1, 30) as u32 } else { 0 };
        let pad = ByteBuf::from(&self.large[..rng.below(2048) as usize]);
        (self.me.clone(), self.ids.fetch_add(1, Ordering::Relaxed), hold, pad)
    }

    fn attempt(&self, prim: Prim, peer: usize, target: Option<&Target>, rng: &mut Rng) -> Result<(), Failure> {
        let d = self.deadline();
        let round = self.spec.round;
        if prim == Prim::NamedPort {
            return self.named_port(rng);
        }
        let t = target.expect("a peer");
        match prim {
            Prim::SendImmediate => t.sender.send(&self.small(rng, false), Checkpoint::Immediate).map_err(fail),
            Prim::SendReceipt => t.sender.send(&self.small(rng, false), Checkpoint::OnReceipt).map_err(fail),
            Prim::SendDelivery => t.sender.send(&self.small(rng, false), Checkpoint::OnDelivery).map_err(fail),
            Prim::Call => t.sender.call::<u64>(&self.small(rng, true)).map(drop).map_err(fail),
            Prim::CallAsync => {
                let reply = t.sender.call_async::<u64>(&self.small(rng, true));
                self.team.block_on(reply).map(drop).map_err(fail)
            }
            Prim::Large => {
                let len = rng.between(LARGE_MIN, LARGE_MAX) as usize;
                let m = Msg { hold_ms: 0, data: ByteBuf::from(&self.large[..len]) };
                t.sender.send(&m, Checkpoint::OnReceipt).map_err(fail)
            }
            Prim::Rpc => {
                let (c, id, hold, pad) = self.call_args(rng);
                t.client(self.team, d)?.exec_blocking(c, id, hold, pad).map(drop).map_err(rpc_fail)
            }
            Prim::RpcAsync => {
                let (c, id, hold, pad) = self.call_args(rng);
                t.client(self.team, d)?.exec(c, id, hold, pad).wait().map(drop).map_err(rpc_fail)
            }
            Prim::RpcRetrying => {
                let (c, id, hold, pad) = self.call_args(rng);
                t.client(self.team, d)?.retrying().exec_blocking(c, id, hold, pad).map(drop).map_err(rpc_fail)
            }
            Prim::RpcOneway => {
                let (c, id, _, pad) = self.call_args(rng);
                t.client(self.team, d)?.exec_oneway(c, id, 0, pad, Checkpoint::OnReceipt).map_err(rpc_fail)
            }
            Prim::Lookup => {
                let ep = self.team.lookup(&port_name(round, peer)).map_err(fail)?;
                let to = self.team.sender::<Msg>(ep).with_timeout(d);
                to.send(&self.small(rng, false), Checkpoint::OnReceipt).map_err(fail)
            }
            Prim::Bind => {
                let c = CrashClient::bind(self.team, &svc_name(round, peer)).map_err(rpc_fail)?.with_timeout(d);
                let (me, id, hold, pad) = self.call_args(rng);
                c.exec_blocking(me, id, hold, pad).map(drop).map_err(rpc_fail)
            }
            Prim::NamedPort => unreachable!(),
        }
    }

    /// Opens a named port, sends itself a message through its name, closes it.
    fn named_port(&self, rng: &mut Rng) -> Result<(), Failure> {
        let name = temp_name(self.spec.round, self.spec.index, self.worker, rng.next() % 1_000_000);
        let port = self.team.open_named_port::<Msg>(&name).map_err(fail)?;
        let to = self.team.connect::<Msg>(&name).map_err(fail)?.with_timeout(self.deadline());
        to.send(&self.small(rng, false), Checkpoint::OnReceipt).map_err(fail)?;
        port.recv_timeout(self.deadline()).map(drop).map_err(fail)
    }
}

/// What a team's traffic saw, as it reports it.
#[derive(Serialize, Deserialize, Debug, Default, Clone)]
pub(crate) struct Outcome {
    /// Operations made.
    pub ops: u64,
    /// Operations toward live teams (or this one) that failed, `WouldBlock` aside.
    pub survivor_failures: u64,
    /// Operations toward the killed team in flight at the kill (started
    /// before, ended after).
    pub in_flight: u64,
    /// Of those, the ones that succeeded (their answer came before the kill).
    pub in_flight_ok: u64,
    /// Per in-flight operation that failed with `PeerGone`: µs from the kill.
    pub peer_gone_us: Vec<u64>,
    /// In-flight operations that failed `NoSuchTeam` (a bind that raced the
    /// exit) or `NameNotFound` (a look-up).
    pub in_flight_unbound: u64,
    /// In-flight operations by primitive and outcome (`Rpc: PeerGone`).
    pub in_flight_by: BTreeMap<String, u64>,
    /// Operations toward the killed team made after the kill.
    pub after_kill: u64,
    /// The longest of them, µs.
    pub after_kill_max_us: u64,
    /// Operations toward the killed team that ended otherwise than allowed
    /// (`DeadlineExceeded` included: the peer's death went unnoticed for a
    /// whole deadline).
    pub wrong: u64,
    /// Operations that took longer than their deadline plus [`SLACK`].
    pub overdue: u64,
    /// Operations still running when the traffic was stopped, past their
    /// deadline plus the slack: hung.
    pub stuck: Vec<String>,
    /// A few of the failures above, as text.
    pub examples: Vec<String>,
    /// RPC calls this team's server ran, and executions beyond the first of a call.
    pub executions: u64,
    pub duplicate_executions: u64,
}

const EXAMPLES: usize = 8;

impl Outcome {
    fn example(&mut self, what: String) {
        if self.examples.len() < EXAMPLES {
            self.examples.push(what);
        }
    }

    /// Sums up `ops`, made by team `me`; `victim`: the killed team and when.
    pub fn from_ops(ops: &[Op], victim: Option<(usize, u64)>, deadline: Duration) -> Outcome {
        let mut o = Outcome { ops: ops.len() as u64, ..Outcome::default() };
        let limit = (deadline + SLACK).as_nanos() as u64;
        for op in ops {
            let took = op.end.saturating_sub(op.start);
            let text = || {
                format!(
                    "{:?} toward team {}: {:?} {} after {} µs",
                    op.prim,
                    op.peer,
                    op.class,
                    op.what.as_deref().unwrap_or(""),
                    took / 1000
                )
            };
            if took > limit {
                o.overdue += 1;
                o.example(format!("overdue: {}", text()));
            }
            match victim {
                Some((dead, kill)) if op.peer == dead && op.prim != Prim::NamedPort => {
                    if op.end < kill {
                        continue; // done before the kill
                    }
                    let in_flight = op.start < kill;
                    if in_flight {
                        o.in_flight += 1;
                        *o.in_flight_by.entry(format!("{:?}: {:?}", op.prim, op.class)).or_insert(0) += 1;
                    } else {
                        o.after_kill += 1;
                        o.after_kill_max_us = o.after_kill_max_us.max(took / 1000);
                    }
                    match op.class {
                        Class::Ok if in_flight => o.in_flight_ok += 1,
                        // Only an `Immediate` send can succeed toward a dead team: it writes and goes.
                        Class::Ok if op.prim == Prim::SendImmediate => {}
                        Class::PeerGone if in_flight => o.peer_gone_us.push((op.end - kill) / 1000),
                        Class::NoSuchTeam | Class::NameNotFound
                            if in_flight && op.prim.allowed_toward_dead(op.class) =>
                        {
                            o.in_flight_unbound += 1
                        }
                        c if c != Class::Ok && op.prim.allowed_toward_dead(c) => {}
                        _ => {
                            o.wrong += 1;
                            o.example(format!("wrong: {}", text()));
                        }
                    }
                }
                _ => {
                    if op.class != Class::Ok && op.class != Class::WouldBlock {
                        o.survivor_failures += 1;
                        o.example(format!("survivor: {}", text()));
                    }
                }
            }
        }
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(peer: usize, prim: Prim, start: u64, end: u64, class: Class) -> Op {
        Op { peer, prim, start, end, class, what: None }
    }

    #[test]
    fn operations_are_sorted_by_the_kill() {
        let s = Duration::from_secs(1);
        let ops = [
            op(1, Prim::Call, 10, 20, Class::Ok),               // before the kill: ignored
            op(1, Prim::Call, 90, 150, Class::PeerGone),        // in flight: 50 ns -> 0 µs
            op(1, Prim::Rpc, 90, 120, Class::Ok),               // in flight, answered
            op(1, Prim::Bind, 95, 130, Class::NoSuchTeam),      // in flight, bind raced the exit
            op(1, Prim::SendReceipt, 95, 200, Class::Deadline), // wrong
            op(1, Prim::SendImmediate, 120, 121, Class::Ok),    // after: an Immediate send may go
            op(1, Prim::SendReceipt, 120, 121, Class::Ok),      // after: a receipt from the dead: wrong
            op(2, Prim::Rpc, 50, 150, Class::PeerGone),         // toward a survivor: a failure
            op(0, Prim::NamedPort, 50, 150, Class::WouldBlock), // WouldBlock is no failure
        ];
        let o = Outcome::from_ops(&ops, Some((1, 100)), s);
        assert_eq!((o.in_flight, o.in_flight_ok, o.peer_gone_us.len(), o.in_flight_unbound), (4, 1, 1, 1));
        assert_eq!((o.after_kill, o.wrong, o.survivor_failures, o.overdue), (2, 2, 1, 0));
    }
}
