//! A model checker (stateright) over the real routing state machine
//! (`super::route`): three teams, one link whose two ends (in two teams,
//! or both in one as `Team::link_pair` makes them) each move up to
//! twice (to any team, back to one that still holds its proxy too), both
//! sides sending numbered frames all along, channels that keep order per
//! pair of teams and deliver in any interleaving. Optionally the ends
//! close (as `End::close` does: a close frame, the route left once both
//! closed) and a team holding only proxies is killed (its channels' frames
//! to it are lost; each other team notices once it drained what the dead
//! one sent, as `FrameHandler::peer_gone` runs, and again if it sends
//! there later). Or any team of the route is killed: one holding an end
//! (it dies with it), one an end is on its way to (lost), one in the middle
//! of a bypass, what it sent and nobody read lost with it (a TCP reset);
//! a proxy whose adoption will not come then gives up at its lifetime's
//! end. Or a proxy gives up at its lifetime's end at any moment. A frame
//! for a router that is not there is answered `Gone` (as
//! `Links::no_router` does). Checked
//! in every reachable state: no frame lost, doubled or taken off-route,
//! and no route broken unless a team died (or a proxy gave up); and once
//! every channel is empty (and the death noticed), every frame sent was
//! delivered to the end's holder of the moment (while its route stands),
//! an end whose other end died learned it (`PeerGone`: no end waits for
//! good), no proxy is left, and two closed ends left their route.
//!
//! `cargo test -p ferry --lib --release link::route_model -- --ignored`
//! runs the larger bounds (ignored in the test command for time).

use super::route::{Body, Control, Effect, Hop, Message, Moved, Router};
use super::Side;
use crate::id::TeamId;
use stateright::{Checker, Model, Property};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

const TEAMS: u32 = 3;

fn team(n: u32) -> TeamId {
    TeamId { node: 1, team: n + 1, incarnation: 7 }
}

/// The bounds of one run.
#[derive(Clone)]
struct RouteModel {
    /// Frames each side sends (before its close, if it closes).
    frames: u64,
    /// Times each end moves.
    moves: u32,
    /// Whether the ends close.
    closes: bool,
    /// Which team may be killed, if any.
    kill: Kill,
    /// Whether a proxy may reach its lifetime's end at any moment (once in
    /// a run): a route repaired late, under load.
    lifetime: bool,
    /// Whether both ends start in one team (`Team::link_pair`), not in two.
    together: bool,
}

/// Which team a run may kill (once).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kill {
    No,
    /// A team holding only proxies, to which no end is on its way.
    Proxies,
    /// Any team of the route: one holding an end (which dies with it), one
    /// an end is on its way to (it is lost), one in the middle of a bypass;
    /// what it sent and nobody took yet may be lost with it (over TCP, a
    /// reset drops what the peer had not read).
    Any,
}

/// What travels between two teams, in order.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Item {
    Route(Message<u64>),
    /// An end inside a message, moving.
    End(Side, Moved),
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct State {
    /// Routers by (team number, side, epoch).
    routers: BTreeMap<(u32, u8, u32), Router<u64>>,
    /// The channel from one team to another.
    channels: BTreeMap<(u32, u32), VecDeque<Item>>,
    /// Per side: frames sent (its close frame too), moves made, where its
    /// terminal is (`None` while the end travels), and what it took: the
    /// next frame due and those that came early.
    sent: [u64; 2],
    moved: [u32; 2],
    terminal: [Option<(u32, u32)>; 2],
    next_due: [u64; 2],
    early: [BTreeSet<u64>; 2],
    /// Per side: closed by its holder; the number of its close frame (none
    /// if it left without one); the other's close taken; the route broke
    /// (`PeerGone`); its terminal left the route.
    closed: [bool; 2],
    close_seq: [Option<u64>; 2],
    peer_closed: [bool; 2],
    gone: [bool; 2],
    left: [bool; 2],
    /// The killed team, and the teams that noticed it (a team that sent to
    /// it after it noticed notices again: the send fails, `End::pass`).
    dead: Option<u32>,
    noticed: BTreeSet<u32>,
    /// Per side: its end died with the killed team (held there, or on its
    /// way there); the proxy it left gives up at its lifetime's end.
    lost: [bool; 2],
    /// A proxy gave up at its lifetime's end.
    expired: bool,
    /// Something went wrong (a frame lost, doubled or off its route).
    broken: Option<String>,
}

#[derive(Clone, Debug)]
enum Action {
    /// Side `s`'s end sends its next frame.
    Send(usize),
    /// Side `s`'s end moves to team `t`.
    Move(usize, u32),
    /// Side `s`'s holder closes its end.
    Close(usize),
    /// Team `t` dies (`true`: what it sent and nobody took is lost too).
    Kill(u32, bool),
    /// The proxy at this key reaches its lifetime's end (`End::expire`):
    /// only one that will never be adopted (see `State::expiring`).
    Expire((u32, u8, u32)),
    /// Team `t` notices the dead team is gone.
    Notice(u32),
    /// The next item on the channel from one team to another arrives.
    Arrive(u32, u32),
}

fn side(s: usize) -> Side {
    if s == 0 {
        Side::A
    } else {
        Side::B
    }
}

fn key(h: Hop) -> (u32, u8, u32) {
    (h.team.team - 1, h.side as u8, h.epoch)
}

impl State {
    fn push(&mut self, from: u32, to: u32, item: Item) {
        if Some(to) == self.dead {
            // Lost with its team; a sender that knew it is gone fails
            // (`End::pass`: its router is lost, as at the notice).
            self.noticed.remove(&from);
            return;
        }
        self.channels.entry((from, to)).or_default().push_back(item);
    }

    fn apply(&mut self, at: (u32, u8, u32), effects: Vec<Effect<u64>>) {
        let s = usize::from(at.1);
        for e in effects {
            match e {
                Effect::Send(m) => {
                    let (from, to) = (m.from.team.team - 1, m.to.team.team - 1);
                    self.push(from, to, Item::Route(m));
                }
                Effect::Deliver(seq) => {
                    if seq < self.next_due[s] || !self.early[s].insert(seq) {
                        self.broken = Some(format!("side {s} got frame {seq} twice"));
                    }
                    while self.early[s].remove(&self.next_due[s]) {
                        self.next_due[s] += 1;
                    }
                    // The other's close, taken in order (`End::take`); a
                    // closed end leaves at it (`End::apply`).
                    if self.close_seq[1 - s].is_some_and(|c| self.next_due[s] > c)
                        || self.closed[s] && Some(seq) == self.close_seq[1 - s]
                    {
                        self.peer_closed[s] = true;
                        if self.closed[s] {
                            self.leave(s, |_| false);
                        }
                    }
                }
                Effect::Retire => {
                    self.routers.remove(&at);
                }
                Effect::Broken(h) => self.route_lost(s, |x| x == h),
            }
        }
    }

    /// Side `s`'s terminal learns its route broke (`End::route_broke`).
    fn route_lost(&mut self, s: usize, skip: impl Fn(Hop) -> bool) {
        if self.lost[s] || self.left[s] || self.peer_closed[s] && !self.closed[s] {
            return;
        }
        if self.closed[s] {
            return self.leave(s, skip);
        }
        if self.dead.is_none() && !self.expired {
            self.broken = Some(format!("side {s}'s route broke with no team dead"));
        }
        self.gone[s] = true;
    }

    /// Side `s`'s terminal sends its next frame (a message's, or its close);
    /// returns its number.
    fn send(&mut self, s: usize) -> Option<u64> {
        let (t, epoch) = self.terminal[s]?;
        let at = (t, s as u8, epoch);
        let seq = self.sent[s];
        self.sent[s] += 1;
        let m = self.routers[&at].send(seq);
        self.apply(at, vec![Effect::Send(m)]);
        Some(seq)
    }

    /// Side `s`'s terminal leaves its route (`End::give_up`).
    fn leave(&mut self, s: usize, skip: impl Fn(Hop) -> bool) {
        let Some((t, epoch)) = self.terminal[s] else { return };
        let at = (t, s as u8, epoch);
        if let Some(r) = self.routers.get_mut(&at) {
            let effects = r.give_up(skip);
            self.left[s] = true;
            self.apply(at, effects);
        }
    }

    fn quiet(&self) -> bool {
        self.channels.values().all(VecDeque::is_empty)
            && self.dead.is_none_or(|d| (0..TEAMS).all(|t| t == d || self.noticed.contains(&t)))
            && self.expiring().next().is_none()
    }

    /// Proxies that will give up at their lifetime's end: those whose
    /// adoption will not come (their end, or its `Adopt`, was lost with the
    /// killed team).
    fn expiring(&self) -> impl Iterator<Item = (u32, u8, u32)> + '_ {
        let coming = |at: &(u32, u8, u32)| {
            self.channels.values().flatten().any(|i| match i {
                Item::End(_, moved) => key(moved.proxy) == *at,
                Item::Route(m) => key(m.to) == *at && matches!(m.body, Body::Control(Control::Adopt { .. })),
            })
        };
        self.routers
            .iter()
            .filter(move |(k, r)| self.dead.is_some() && r.is_proxy() && !r.adopted() && !coming(k))
            .map(|(k, _)| *k)
    }

    /// Where side `s`'s end is at rest, if it is open: its holder may
    /// close it then, and, unless its link ended, send on it and move it
    /// (`End::poll_send` and `End::move_away` fail on an ended link).
    fn open(&self, s: usize) -> Option<(u32, bool)> {
        let ended = self.gone[s] || self.peer_closed[s];
        self.terminal[s].filter(|_| !self.closed[s]).map(|(t, _)| (t, !ended))
    }
}

impl Model for RouteModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let a = Hop { team: team(0), side: Side::A, epoch: 0 };
        let b = Hop { team: team(u32::from(!self.together)), side: Side::B, epoch: 0 };
        let mut routers = BTreeMap::new();
        routers.insert(key(a), Router::terminal(a, b));
        routers.insert(key(b), Router::terminal(b, a));
        vec![State {
            routers,
            channels: BTreeMap::new(),
            sent: [0; 2],
            moved: [0; 2],
            terminal: [Some((0, 0)), Some((u32::from(!self.together), 0))],
            next_due: [0; 2],
            early: [BTreeSet::new(), BTreeSet::new()],
            closed: [false; 2],
            close_seq: [None; 2],
            peer_closed: [false; 2],
            gone: [false; 2],
            left: [false; 2],
            dead: None,
            noticed: BTreeSet::new(),
            lost: [false; 2],
            expired: false,
            broken: None,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        if s.broken.is_some() {
            return;
        }
        for side in 0..2 {
            let Some((t, usable)) = s.open(side) else { continue };
            if usable && s.sent[side] < self.frames {
                actions.push(Action::Send(side));
            }
            if usable && s.moved[side] < self.moves {
                (0..TEAMS).filter(|n| *n != t && Some(*n) != s.dead).for_each(|n| actions.push(Action::Move(side, n)));
            }
            if self.closes {
                actions.push(Action::Close(side));
            }
        }
        if self.kill == Kill::Any && s.dead.is_none() {
            for t in 0..TEAMS {
                let holds_router = s.routers.keys().any(|k| k.0 == t);
                let end_coming =
                    s.channels.iter().any(|((_, to), q)| *to == t && q.iter().any(|i| matches!(i, Item::End(..))));
                if holds_router || end_coming {
                    actions.push(Action::Kill(t, false));
                    if s.channels.iter().any(|((from, _), q)| *from == t && !q.is_empty()) {
                        actions.push(Action::Kill(t, true));
                    }
                }
            }
        }
        s.expiring().for_each(|at| actions.push(Action::Expire(at)));
        if self.lifetime && !s.expired {
            s.routers.iter().filter(|(_, r)| r.is_proxy()).for_each(|(at, _)| actions.push(Action::Expire(*at)));
        }
        if self.kill == Kill::Proxies && s.dead.is_none() {
            for t in 0..TEAMS {
                // A team of proxies only, to which no end is on its way.
                let holds_proxy = s.routers.iter().any(|(k, r)| k.0 == t && r.is_proxy());
                let holds_end = s.terminal.iter().any(|at| at.is_some_and(|(x, _)| x == t));
                let end_coming =
                    s.channels.iter().any(|((_, to), q)| *to == t && q.iter().any(|i| matches!(i, Item::End(..))));
                if holds_proxy && !holds_end && !end_coming {
                    actions.push(Action::Kill(t, false));
                }
            }
        }
        if let Some(d) = s.dead {
            for t in (0..TEAMS).filter(|t| *t != d && !s.noticed.contains(t)) {
                if s.channels.get(&(d, t)).is_none_or(VecDeque::is_empty) {
                    actions.push(Action::Notice(t));
                }
            }
        }
        for ((from, to), q) in &s.channels {
            if !q.is_empty() {
                actions.push(Action::Arrive(*from, *to));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Send(i) => {
                s.send(i)?;
            }
            Action::Move(i, to) => {
                let (t, epoch) = s.terminal[i].take()?;
                s.moved[i] += 1;
                let token = u64::from(s.moved[i]) << 8 | i as u64;
                let moved = s.routers.get_mut(&(t, i as u8, epoch))?.moved(token);
                s.push(t, to, Item::End(side(i), moved));
            }
            Action::Close(i) => {
                // `End::close`: a close frame, unless the route is over for it.
                s.closed[i] = true;
                if s.peer_closed[i] || s.gone[i] {
                    s.leave(i, |_| false);
                } else {
                    s.close_seq[i] = Some(s.send(i)?);
                }
            }
            Action::Kill(t, lose) => {
                s.dead = Some(t);
                s.routers.retain(|k, _| k.0 != t);
                for i in 0..2 {
                    // An end held there, or on its way there (or from there, lost).
                    let on_its_way = |to: u32, from: u32, q: &VecDeque<Item>| {
                        (to == t || lose && from == t)
                            && q.iter().any(|it| matches!(it, Item::End(sd, _) if *sd as usize == i))
                    };
                    if s.terminal[i].is_some_and(|(x, _)| x == t)
                        || s.channels.iter().any(|((from, to), q)| on_its_way(*to, *from, q))
                    {
                        s.lost[i] = true;
                        s.terminal[i] = None;
                    }
                }
                s.channels.retain(|(from, to), _| *to != t && !(lose && *from == t));
            }
            Action::Expire(at) => {
                s.expired = true;
                let r = s.routers.get_mut(&at)?;
                let effects = r.give_up(|_| false);
                s.apply(at, effects);
            }
            Action::Notice(t) => {
                // `Links::peer_gone`: each router next to the dead team.
                s.noticed.insert(t);
                let d = team(s.dead?);
                let next_to: Vec<_> = s
                    .routers
                    .iter()
                    .filter(|(k, r)| k.0 == t && r.neighbours().any(|h| h.team == d))
                    .map(|(k, _)| *k)
                    .collect();
                for at in next_to {
                    let Some(r) = s.routers.get_mut(&at) else { continue };
                    if r.is_proxy() {
                        let effects = r.give_up(|h| h.team == d);
                        s.apply(at, effects);
                    } else {
                        s.route_lost(usize::from(at.1), |h| h.team == d);
                    }
                }
            }
            Action::Arrive(from, to) => {
                let item = s.channels.get_mut(&(from, to))?.pop_front()?;
                match item {
                    Item::End(sd, moved) => {
                        let (r, adopt) = Router::adopt(team(to), sd, &moved);
                        let at = key(r.hop());
                        if s.routers.insert(at, r).is_some() {
                            s.broken = Some(format!("two routers at {at:?}"));
                        }
                        s.terminal[sd as usize] = Some((to, moved.epoch));
                        s.apply(at, vec![adopt]);
                    }
                    Item::Route(m) => {
                        let at = key(m.to);
                        let Some(r) = s.routers.get_mut(&at) else {
                            // `Links::no_router`: its sender learns the route broke here.
                            if m.body != Body::Control(Control::Gone) {
                                let gone = Message { from: m.to, to: m.from, body: Body::Control(Control::Gone) };
                                s.push(to, from, Item::Route(gone));
                            }
                            return Some(s);
                        };
                        let is_gone = m.body == Body::Control(Control::Gone);
                        match r.receive(m) {
                            Ok(effects) => s.apply(at, effects),
                            Err(_) if is_gone => {} // A `Gone` from off the route: nothing to do.
                            Err(e) => s.broken = Some(format!("off route at {at:?}: {}", e.0)),
                        }
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no frame lost, doubled or off its route", |_, s: &State| s.broken.is_none()),
            Property::always("once quiet, every frame delivered and no proxy left", |_, s: &State| {
                if !s.quiet() {
                    return true;
                }
                let no_proxy = s.routers.values().all(|r| !r.is_proxy());
                // A side whose route stands got every frame the other sent;
                // one whose other end died learned it (`PeerGone`) unless
                // that end's close came: no end waits for good.
                let delivered = (0..2).all(|i| {
                    s.lost[i]
                        || s.left[i]
                        || s.gone[i]
                        || s.peer_closed[i] && s.closed[i]
                        || (!s.lost[1 - i] || s.peer_closed[i]) && s.next_due[i] == s.sent[1 - i]
                });
                let in_order = (0..2).all(|i| s.lost[i] || s.left[i] || s.gone[i] || s.early[i].is_empty());
                // Two closed ends (or a closed one whose route broke, or
                // whose other end died) left.
                let closed_left = (0..2).all(|i| {
                    s.lost[i] || !s.closed[i] || s.left[i] || !(s.closed[1 - i] || s.gone[i] || s.lost[1 - i])
                });
                no_proxy && delivered && in_order && closed_left
            }),
            Property::sometimes("both ends moved and the route was repaired", |m: &RouteModel, s: &State| {
                s.moved == [m.moves, m.moves] && s.quiet() && s.routers.len() == 2
            }),
        ]
    }
}

fn check(model: RouteModel) {
    let (frames, moves, closes, kill, together) = (model.frames, model.moves, model.closes, model.kill, model.together);
    // Depth first: it keeps fingerprints of the states seen, not the states.
    let checker = model.checker().threads(2).spawn_dfs().join();
    println!(
        "route model ({frames} frames, {moves} moves a side, closes {closes}, kill {kill:?}, one team first {together}): {} states",
        checker.unique_state_count()
    );
    checker.assert_properties();
}

/// Both ends move (once each, at any moment) under two-way traffic.
#[test]
fn moves_of_both_ends_lose_double_and_leave_nothing() {
    check(RouteModel { frames: 2, moves: 1, closes: false, kill: Kill::No, lifetime: false, together: false });
}

/// Both ends move once and close, at any moment: what was sent before a
/// close arrives, and two closed ends leave nothing of their route.
#[test]
fn closes_during_moves_leave_nothing() {
    check(RouteModel { frames: 0, moves: 1, closes: true, kill: Kill::No, lifetime: false, together: false });
}

/// A team holding only proxies dies while both ends move and close: the
/// route breaks (`PeerGone`) rather than hangs, and no proxy stays.
#[test]
fn a_proxys_team_dying_leaves_no_proxy() {
    check(RouteModel { frames: 0, moves: 1, closes: true, kill: Kill::Proxies, lifetime: false, together: false });
}

/// Any team of the route dies — one holding an end, one an end is on its
/// way to, one in the middle of a bypass — and what it sent may be lost
/// with it: the other end learns it (`PeerGone`) rather than waits for
/// good, and no proxy stays.
#[test]
fn a_team_dying_anywhere_leaves_no_end_waiting() {
    check(RouteModel { frames: 1, moves: 1, closes: false, kill: Kill::Any, lifetime: false, together: false });
}

/// A proxy gives up at its lifetime's end at any moment (a route repaired
/// late, under load): both ends learn it or get every frame, and no proxy
/// stays.
#[test]
fn a_proxy_at_its_lifetimes_end_leaves_no_end_waiting() {
    check(RouteModel { frames: 1, moves: 1, closes: false, kill: Kill::No, lifetime: true, together: false });
}

/// Larger bounds, by hand (`--ignored`, release): each end moves twice —
/// again before its route is repaired, and back to a team that still
/// holds its proxy —; frames with closes and a death; and ends of one
/// pair (both in one team first) with a death, a proxy's lifetime's end
/// and two moves each.
#[test]
#[ignore = "minutes: run by hand (see the module's text)"]
fn larger_bounds() {
    check(RouteModel { frames: 1, moves: 2, closes: false, kill: Kill::No, lifetime: false, together: false });
    check(RouteModel { frames: 1, moves: 1, closes: true, kill: Kill::No, lifetime: false, together: false });
    check(RouteModel { frames: 1, moves: 1, closes: true, kill: Kill::Proxies, lifetime: false, together: false });
    check(RouteModel { frames: 0, moves: 2, closes: false, kill: Kill::Any, lifetime: false, together: false });
    check(RouteModel { frames: 1, moves: 1, closes: true, kill: Kill::Any, lifetime: false, together: false });
    check(RouteModel { frames: 1, moves: 1, closes: false, kill: Kill::Any, lifetime: false, together: true });
    check(RouteModel { frames: 1, moves: 1, closes: false, kill: Kill::No, lifetime: true, together: true });
    check(RouteModel { frames: 1, moves: 2, closes: false, kill: Kill::No, lifetime: false, together: true });
}

/// Both ends start in one team (`Team::link_pair`) and move away from it,
/// their two proxies side by side there, under two-way traffic.
#[test]
fn ends_of_one_pair_moving_away_from_one_team_lose_nothing() {
    check(RouteModel { frames: 2, moves: 1, closes: false, kill: Kill::No, lifetime: false, together: true });
}
