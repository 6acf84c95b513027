//! A link's route, sans I/O: the routers in the teams that hold or held
//! its ends, and the protocol that moves an end and repairs the route
//! behind it (Chromium's ipcz taught it: proxies that forward until they
//! are bypassed, one hop at a time). The model checker in
//! `tests/link_route_model.rs` runs this very code.
//!
//! A route is a chain: side A's terminal, side A's proxies, side B's
//! proxies, side B's terminal. Each router is named by a [`Hop`] — its
//! team, the side whose end it holds or held, and the end's *epoch* (how
//! many times it moved), so a team can hold two routers of one side (an
//! end that came back before the route was repaired).
//!
//! The rules (the model checks them; with rule 4's last condition taken
//! out it finds, in 26 steps, a `ProxyGone` that reaches a router which
//! had already left — frames forwarded by it were lost):
//!
//! 1. A moved end leaves a proxy. The new holder adopts the end with the
//!    token that came with it (`Adopt`); until then the proxy holds what
//!    comes for the end.
//! 2. Only the *outermost* proxy of a side (whose outward neighbour holds
//!    the other side) removes itself, and only once its inward neighbour
//!    is known.
//! 3. Removing proxy Y between X (outward) and Z (inward) is three steps:
//!    Y asks Z to take frames from X (`Bypassing`, answered
//!    `BypassReady`) before it asks X to send to Z (`Bypass`), so no frame
//!    of X reaches Z before Z takes X's frames. X answers Y with
//!    `StopForwarding` (after the last frame it sent Y: channels keep
//!    order) and tells Z `Accepted`; Z then sends to X and tells Y `Done`
//!    (after the last frame it sent Y).
//! 4. Y leaves only after `StopForwarding` and `Done` came, and after
//!    every router it was still taking frames from (one bypassed before
//!    it) said `ProxyGone`; it says `ProxyGone` to X and Z last.
//! 5. When two outermost proxies face each other and both remove
//!    themselves, side A's goes first: a proxy of side A that is removing
//!    itself refuses side B's `Bypass` (B's proxy asks again once A's is
//!    gone); anything else accepts it — a proxy that is not removing
//!    itself too (an end that keeps moving would otherwise starve the
//!    other side's repair).
//!
//! Frames carry their number in their direction; a terminal puts them
//! back in order (`super::stream`), since after a repair frames come by
//! two paths at once.

use super::Side;
use crate::id::TeamId;
use std::collections::VecDeque;

/// A router: its team, the side whose end it holds or held, and the
/// end's epoch (times it moved).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Hop {
    pub team: TeamId,
    pub side: Side,
    pub epoch: u32,
}

/// What routers tell each other (rule numbers as in the module's text).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Control {
    /// New holder → proxy: "I hold the end you sent" (rule 1).
    Adopt { token: u64 },
    /// Proxy → inward: "take frames from `x`" (rule 3).
    Bypassing { x: Hop },
    /// Inward → proxy: it does.
    BypassReady,
    /// Proxy → outward: "send to `z`, not to me".
    Bypass { z: Hop },
    /// Outward → proxy: not now (rule 5).
    BypassRefused,
    /// Proxy → inward: forget `x` (its bypass was refused or overtaken).
    BypassCancelled,
    /// Outward → proxy: nothing more from me.
    StopForwarding,
    /// Outward `x` → inward `z`: "I send to you now".
    Accepted,
    /// Inward → proxy: nothing more from me.
    Done,
    /// Proxy → its neighbours: nothing more from me; forget me (rule 4).
    ProxyGone,
    /// A router gave up (a proxy not repaired within its lifetime, or one
    /// that lost a neighbour): the route is broken. A terminal's end fails;
    /// a proxy passes it on and leaves.
    Gone,
}

/// A frame between two routers.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Message<D> {
    pub from: Hop,
    pub to: Hop,
    pub body: Body<D>,
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Body<D> {
    /// A frame of the link's own (`D`: its bytes), going to side `toward`.
    Data {
        toward: Side,
        data: D,
    },
    Control(Control),
}

/// Where a frame of the ends' own goes from a router ([`Router::way`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Way {
    /// To this terminal's end.
    Deliver,
    /// On, to the router named.
    Forward(Hop),
    /// Kept by a proxy not adopted yet ([`Router::hold`]).
    Hold,
}

/// What a router asks its caller to do.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Effect<D> {
    Send(Message<D>),
    /// A frame for this terminal's end (to put in order and take).
    Deliver(D),
    /// This router is done: forget it.
    Retire,
    /// The route broke at the router `Hop` (this terminal's end fails).
    Broken(Hop),
}

/// What an end carries when it moves: enough for its new holder to adopt it.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Moved {
    /// The proxy it left behind (the new holder's first outward).
    pub proxy: Hop,
    /// The end's epoch at its new holder.
    pub epoch: u32,
    /// Proves to the proxy that the adopter got the end.
    pub token: u64,
}

/// A frame that is not on the route this router set up.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct OffRoute(pub &'static str);

const OFF_ROUTE: OffRoute = OffRoute("a frame from a router off this route");

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
enum Bypass {
    Idle,
    /// Asked the inward to take frames from `x` (rule 3).
    Preparing {
        x: Hop,
    },
    /// Asked `x` to bypass it; forwarding what is still on its way. Once
    /// `x` accepted, it says `StopForwarding` and the inward `Done` (in
    /// either order: they come on two channels).
    Asked {
        x: Hop,
        stopped: bool,
        done: bool,
    },
}

#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct Router<D> {
    me: Hop,
    /// Where frames toward the other side go.
    outward: Hop,
    /// A proxy's: where frames toward its side go, once adopted.
    inward: Option<Hop>,
    /// Whether this router is a proxy (its end moved away).
    proxy: bool,
    /// A proxy's before adoption: frames for the end.
    held: VecDeque<D>,
    /// The adoption's proof (a proxy's).
    token: u64,
    /// Routers whose frames are still on their way here: a bypassed
    /// outward (until its `ProxyGone`), one a bypass announced.
    decaying: Vec<Hop>,
    announced: Option<Hop>,
    bypass: Bypass,
    /// It gave up (once: a neighbour found gone meanwhile changes nothing).
    gave_up: bool,
}

impl<D: Clone> Router<D> {
    /// A terminal: `me` holds the end, whose frames go to `outward`.
    pub fn terminal(me: Hop, outward: Hop) -> Router<D> {
        Router {
            me,
            outward,
            inward: None,
            proxy: false,
            held: VecDeque::new(),
            token: 0,
            decaying: Vec::new(),
            announced: None,
            bypass: Bypass::Idle,
            gave_up: false,
        }
    }

    pub fn hop(&self) -> Hop {
        self.me
    }

    pub fn is_proxy(&self) -> bool {
        self.proxy
    }

    /// Whether a proxy's end was adopted (its inward is known).
    #[cfg(all(test, not(loom)))]
    pub fn adopted(&self) -> bool {
        self.inward.is_some()
    }

    /// Where frames toward the other side go now.
    pub fn outward(&self) -> Hop {
        self.outward
    }

    /// Every router this one takes frames from or sends them to.
    pub fn neighbours(&self) -> impl Iterator<Item = Hop> + '_ {
        std::iter::once(self.outward).chain(self.inward).chain(self.announced).chain(self.decaying.iter().copied())
    }

    /// A frame from this terminal's end, to the other side (`data`: what
    /// its caller makes of it; the router keeps nothing of it).
    pub fn send<E>(&self, data: E) -> Message<E> {
        Message { from: self.me, to: self.outward, body: Body::Data { toward: self.me.side.other(), data } }
    }

    /// Where a frame of the ends' own from `from`, going to side
    /// `toward`, goes from here ([`Router::receive`]'s part for such
    /// frames: its caller may so take one without copying it first).
    #[inline(always)]
    pub fn way(&self, from: Hop, toward: Side) -> Result<Way, OffRoute> {
        if !self.takes_from(from) {
            return Err(OFF_ROUTE);
        }
        Ok(match (self.proxy, toward == self.me.side) {
            (false, true) => Way::Deliver,
            (false, false) => return Err(OffRoute("a terminal's own direction came back to it")),
            (true, true) => match self.inward {
                Some(z) => Way::Forward(z),
                None => Way::Hold,
            },
            (true, false) => Way::Forward(self.outward),
        })
    }

    /// Keeps a frame for the end until its adopter is known ([`Way::Hold`]).
    pub fn hold(&mut self, data: D) {
        self.held.push_back(data);
    }

    /// This terminal's end moves away (`token`: drawn at random): it
    /// becomes a proxy; the returned `Moved` travels with the end.
    pub fn moved(&mut self, token: u64) -> Moved {
        debug_assert!(!self.proxy, "only a terminal moves");
        self.proxy = true;
        self.token = token;
        Moved { proxy: self.me, epoch: self.me.epoch + 1, token }
    }

    /// The end arrives at `team`: its new terminal, and the `Adopt` to send.
    pub fn adopt(team: TeamId, side: Side, moved: &Moved) -> (Router<D>, Effect<D>) {
        let me = Hop { team, side, epoch: moved.epoch };
        let r = Router::terminal(me, moved.proxy);
        let adopt = r.to(moved.proxy, Body::Control(Control::Adopt { token: moved.token }));
        (r, adopt)
    }

    fn to(&self, to: Hop, body: Body<D>) -> Effect<D> {
        Effect::Send(Message { from: self.me, to, body })
    }

    /// Whether frames from `from` are taken.
    fn takes_from(&self, from: Hop) -> bool {
        from == self.outward
            || Some(from) == self.inward
            || Some(from) == self.announced
            || self.decaying.contains(&from)
    }

    /// A message for this router.
    pub fn receive(&mut self, m: Message<D>) -> Result<Vec<Effect<D>>, OffRoute> {
        let mut out = Vec::new();
        if let Body::Control(Control::Adopt { token }) = m.body {
            // Rule 1: the adopter is not known before; its token is the proof.
            if !self.proxy || self.inward.is_some() || token != self.token {
                return Err(OffRoute("an adoption without the end's token"));
            }
            self.inward = Some(m.from);
            while let Some(data) = self.held.pop_front() {
                out.push(self.to(m.from, Body::Data { toward: self.me.side, data }));
            }
            self.maybe_bypass(&mut out);
            return Ok(out);
        }
        match m.body {
            // `way` checks that `m.from` is on the route.
            Body::Data { toward, data } => match self.way(m.from, toward)? {
                Way::Deliver => out.push(Effect::Deliver(data)),
                Way::Forward(to) => out.push(self.to(to, Body::Data { toward, data })),
                Way::Hold => self.hold(data),
            },
            Body::Control(_) if !self.takes_from(m.from) => return Err(OFF_ROUTE),
            Body::Control(c) => self.control(m.from, c, &mut out)?,
        }
        Ok(out)
    }

    fn control(&mut self, from: Hop, c: Control, out: &mut Vec<Effect<D>>) -> Result<(), OffRoute> {
        match c {
            Control::Adopt { .. } => unreachable!("handled before"),
            // Z's part of rule 3: take frames from x from now on.
            Control::Bypassing { x } if from == self.outward => {
                self.announced = Some(x);
                out.push(self.to(from, Body::Control(Control::BypassReady)));
            }
            Control::BypassReady if Some(from) == self.inward => match self.bypass.clone() {
                Bypass::Preparing { x } if x == self.outward => {
                    self.bypass = Bypass::Asked { x, stopped: false, done: false };
                    out.push(self.to(x, Body::Control(Control::Bypass { z: from })));
                }
                // The outward changed meanwhile (another bypass went first): again.
                Bypass::Preparing { .. } => {
                    self.bypass = Bypass::Idle;
                    out.push(self.to(from, Body::Control(Control::BypassCancelled)));
                    self.maybe_bypass(out);
                }
                _ => return Err(OffRoute("an unasked BypassReady")),
            },
            // X's part: send to z instead of the proxy `from` (rule 5 first).
            Control::Bypass { z } if from == self.outward => {
                if self.proxy && self.me.side == Side::A && self.bypass != Bypass::Idle {
                    out.push(self.to(from, Body::Control(Control::BypassRefused)));
                    return Ok(());
                }
                self.decaying.push(from);
                self.outward = z;
                out.push(self.to(from, Body::Control(Control::StopForwarding)));
                out.push(self.to(z, Body::Control(Control::Accepted)));
                // Its own bypass, if it asked one, is refused (it is side
                // B's): it asks again when the refusal comes. Else it may
                // ask now, with the new outward.
                self.maybe_bypass(out);
            }
            Control::BypassRefused => match self.bypass {
                Bypass::Asked { x, stopped: false, done: false } if x == from => {
                    self.bypass = Bypass::Idle;
                    let z = self.inward.expect("asked with an inward");
                    out.push(self.to(z, Body::Control(Control::BypassCancelled)));
                    // `x` refused because it removes itself: its `Bypass`
                    // gives this proxy a new outward, and then it asks
                    // again (asking `x` again meanwhile only spins).
                    if self.outward != x {
                        self.maybe_bypass(out);
                    }
                }
                _ => return Err(OffRoute("an unasked BypassRefused")),
            },
            Control::BypassCancelled if from == self.outward => self.announced = None,
            // Z: x sends here now; the old outward (the proxy) learns it last.
            Control::Accepted if Some(from) == self.announced => {
                self.announced = None;
                let old = std::mem::replace(&mut self.outward, from);
                self.decaying.push(old);
                out.push(self.to(old, Body::Control(Control::Done)));
                self.maybe_bypass(out);
            }
            Control::StopForwarding => match &mut self.bypass {
                Bypass::Asked { x, stopped, .. } if *x == from => *stopped = true,
                _ => return Err(OffRoute("an unasked StopForwarding")),
            },
            Control::Done if Some(from) == self.inward => match &mut self.bypass {
                Bypass::Asked { done, .. } => *done = true,
                _ => return Err(OffRoute("an unasked Done")),
            },
            Control::ProxyGone if self.decaying.contains(&from) => self.decaying.retain(|h| *h != from),
            Control::Gone if self.proxy => {
                out.extend(self.give_up(|h| h == from));
                return Ok(());
            }
            Control::Gone => out.push(Effect::Broken(from)),
            _ => return Err(OffRoute("a control message from the wrong neighbour")),
        }
        self.maybe_retire(out);
        Ok(())
    }

    /// Gives up (a proxy past its lifetime, one that lost a neighbour, a
    /// closed terminal leaving): tells every neighbour but those `skip`
    /// names (the one that said so, a dead team's) that the route broke,
    /// and leaves.
    pub fn give_up(&mut self, skip: impl Fn(Hop) -> bool) -> Vec<Effect<D>> {
        if std::mem::replace(&mut self.gave_up, true) {
            return Vec::new();
        }
        // Gone from its team before any neighbour hears of it.
        let mut out = vec![Effect::Retire];
        out.extend(self.neighbours().filter(|h| !skip(*h)).map(|h| self.to(h, Body::Control(Control::Gone))));
        out
    }

    /// Rule 2: the outermost proxy, adopted and idle, starts its bypass.
    fn maybe_bypass(&mut self, out: &mut Vec<Effect<D>>) {
        let Some(z) = self.inward else { return };
        if self.proxy && self.bypass == Bypass::Idle && self.outward.side != self.me.side {
            self.bypass = Bypass::Preparing { x: self.outward };
            out.push(self.to(z, Body::Control(Control::Bypassing { x: self.outward })));
        }
    }

    /// Rule 4: a drained proxy that takes frames from no one else leaves.
    fn maybe_retire(&mut self, out: &mut Vec<Effect<D>>) {
        if matches!(self.bypass, Bypass::Asked { stopped: true, done: true, .. }) && self.decaying.is_empty() {
            let z = self.inward.expect("a draining proxy has an inward");
            out.push(self.to(self.outward, Body::Control(Control::ProxyGone)));
            out.push(self.to(z, Body::Control(Control::ProxyGone)));
            out.push(Effect::Retire);
        }
    }
}
