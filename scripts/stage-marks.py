#!/usr/bin/env python3
"""Where a small call's time goes, in TSC cycles stage by stage (`patch`,
`show`, `pairs`) and by the calls' lengths (`each`, `tails`). `patch`
patches a *worktree* of ferry (never `main`) with `rdtsc` marks, so that
two builds (an old one and the head) can be compared stage by stage with
`ferry bench rpc --only ferry.shm.arg4`, as docs/PERFORMANCE.md's
"Thirty-fifth session" table was made. The machine has no PMU; the marks
are what it gives.

    git worktree add /tmp/wt-old OLD && scripts/stage-marks.py patch /tmp/wt-old
    (cd /tmp/wt-old && CARGO_TARGET_DIR=/tmp/t-old cargo build --release -p ferry-cli)
    rm -f /tmp/ferry-stage-marks.log; /tmp/t-old/release/ferry bench rpc --passes 1 --only ferry.shm.arg4
    scripts/stage-marks.py show        # one line per thread that pushed and popped
    scripts/stage-marks.py pairs /tmp/t-old/release/ferry /tmp/t-new/release/ferry 8

Marks: the ring's push (after the stamp) and pop (a stamp seen); on the
server, in cycles since the thread's last pop: 2 the endpoint's direct
taker, 3 `start` before `dispatch`, 4/5 the arguments' decode, 8/9 the
codec's part of it, 6 the handler's first poll, 0/1 the bench's handler,
7 before `respond`. Every thread also times its waiting loop's turns
(`Idle::step` to `Idle::step`) and, when the progress loop's look found a
channel with work, the cycles from that look to the pop. Each process
appends, per 100,000 events, the medians of pop→push (the server's path,
or the client's between calls), push→pop, the turn, look→pop and the
marks. The patch finds its places by text: if the code moved, it says
which. (This guest's TSC reads move in steps of ~24.5 cycles.)

`each WORKTREE` adds two cases to a worktree's `bench rpc` instead (no
marks): `ferry.shm.arg4.each` and `ferry.shm.null.each`, calls timed one
by one (their median is the per-call p50, as `ferry.shm.null`'s); `tails
OLD_BIN NEW_BIN RUNS` runs two such builds in turn and says where a
call's mean goes, by the call's length:

    scripts/stage-marks.py each /tmp/wt-old && scripts/stage-marks.py each /tmp/wt-new   # then build each
    scripts/ab-pairs.py /tmp/t-old/release/ferry /tmp/t-new/release/ferry rpc ferry.shm.arg4.each 40
    scripts/stage-marks.py tails /tmp/t-old/release/ferry /tmp/t-new/release/ferry 8

`patch-hops WORKTREE` marks a port's and a link's ping-pong instead (not
with `patch`): from the pop, 8 the message caught (a port's `Incoming`
built; a link end's lock taken), 9 a link's `catch_message` done, 0/1 a
port's ring read done and `after_drain` done, 6/7 `Idle`'s drop begun
and done, 2 the receive returned, 3 the send called, 4 a link's frame
head written, 5 the team's send (`send_message`, `post`); the turn is
timed at `Idle::step_catching`. `hops BINARY ROUNDS` runs `ferry.shm.spin`
and `ferry.shm.link.fresh` in turn and gives, per case, the median
pop→push (one side's work between the message it took and the one it
sent), the round trip, and the stages of the runs in the fastest quarter
(the two vCPUs change speed from run to run; compare runs of one speed):

    git worktree add /tmp/wt-hops HEAD && scripts/stage-marks.py patch-hops /tmp/wt-hops
    (cd /tmp/wt-hops && CARGO_TARGET_DIR=/tmp/t-hops cargo build --release -p ferry-cli)
    scripts/stage-marks.py hops /tmp/t-hops/release/ferry 6

`pairs` runs the two marked builds in turn, ROUNDS times each, and gives
per pair new / old of the server's path, the client's, the round trip
and the transit (the client's push→pop less the server's path: both
ways' time in the rings and the waiting loops), then the stages'
differences: pairs see the same machine speed, whole sittings do not.
"""
import os
import statistics
import subprocess
import sys

PROBE = r'''//! TEMPORARY (scripts/stage-marks.py): TSC marks of ring pushes and pops.
use std::cell::RefCell;
use std::io::Write;

#[derive(Default)]
struct S {
    last_push: bool, last: u64, a: Vec<u32>, b: Vec<u32>, m: [Vec<u32>; 10],
    tick: u64, ticks: Vec<u32>, seen: u64, seen_to_pop: Vec<u32>,
}

thread_local! { static ST: RefCell<S> = RefCell::new(S::default()); }

fn now() -> u64 {
    // SAFETY: rdtsc has no preconditions.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Cycles since this thread's last pop, as mark `i`.
#[inline(never)]
pub fn mark(i: usize) {
    let t = now();
    ST.with(|s| {
        let mut s = s.borrow_mut();
        // (Since the last pop: the thread's last event, if it was one.)
        if s.last != 0 && !s.last_push {
            let d = (t - s.last).min(u32::MAX as u64) as u32;
            s.m[i].push(d);
        }
    });
}

#[inline(never)]
pub fn event(push: bool) {
    let t = now();
    ST.with(|s| {
        let mut s = s.borrow_mut();
        if !push && s.seen != 0 && t - s.seen < 20_000 {
            let d = (t - s.seen) as u32;
            s.seen_to_pop.push(d);
        }
        s.seen = 0;
        if s.last != 0 && s.last_push != push {
            let d = (t - s.last).min(u32::MAX as u64) as u32;
            if push { s.a.push(d) } else { s.b.push(d) }
        }
        s.last = t;
        s.last_push = push;
        if s.a.len() + s.b.len() >= 100_000 {
            let med = |v: &mut Vec<u32>| {
                let mut v = std::mem::take(v);
                v.sort_unstable();
                v.get(v.len() / 2).copied().unwrap_or(0)
            };
            let (a, b) = (med(&mut s.a), med(&mut s.b));
            let marks: Vec<u32> = s.m.iter_mut().map(med).collect();
            let (tick, seen) = (med(&mut s.ticks), med(&mut s.seen_to_pop));
            let line = format!(
                "{} {:?} popToPush {a} pushToPop {b} turn {tick} seenToPop {seen} marks {marks:?}\n",
                std::process::id(),
                std::thread::current().id()
            );
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open("/tmp/ferry-stage-marks.log") {
                let _ = f.write_all(line.as_bytes());
            }
        }
    });
}

/// A turn of a waiting loop (`Idle::step`): cycles since the last turn.
#[inline(never)]
pub fn tick() {
    let t = now();
    ST.with(|s| {
        let mut s = s.borrow_mut();
        let d = t.wrapping_sub(s.tick);
        if d < 20_000 {
            s.ticks.push(d as u32);
        }
        s.tick = t;
    });
}

/// The progress loop found a channel with work (its look said so).
#[inline(never)]
pub fn seen() {
    let t = now();
    ST.with(|s| s.borrow_mut().seen = t);
}
'''

MARK = "crate::transport::shm::stage_marks::mark"


def edit(path, pairs):
    s = open(path).read()
    for old, new in pairs:
        if s.count(old) != 1:
            sys.exit(f"{path}: the text to mark is not there once (the code moved): {old!r}")
        s = s.replace(old, new)
    open(path, "w").write(s)


def edit_either(path, choices, optional=False):
    """The first of `choices` (old, new) whose text is there once (the
    code differs between the builds compared); whether one was."""
    s = open(path).read()
    for old, new in choices:
        if s.count(old) == 1:
            open(path, "w").write(s.replace(old, new))
            return True
    if optional:
        return False
    sys.exit(f"{path}: none of the texts to mark is there once (the code moved): {choices[0][0]!r}")


def patch(w):
    src = f"{w}/crates/ferry/src"
    patch_common(src)
    with open(f"{src}/lib.rs", "a") as f:
        f.write(f"#[doc(hidden)]\npub use transport::shm::stage_marks::mark as __stage_mark;\n")
    taker = "    fn take(&self, m: crate::runtime::channel::Incoming, place: Place) {\n"
    dispatch = "    let t = cost::record(Side::Server, Stage::Dispatch, call.arrived);\n"
    poll = "    let mut cx = std::task::Context::from_waker(Waker::noop());\n    match Pin::new(&mut work).poll(&mut cx) {\n"
    handled = "            let response = handler_response(r);\n            let t = cost::record(Side::Server, Stage::Handler, t);\n"
    edit(f"{src}/rpc/server.rs", [
        (taker, taker + f"        {MARK}(2);\n"),
        (dispatch, dispatch + f"    {MARK}(3);\n"),
        (poll, poll.replace("    match", f"    {MARK}(6);\n    match")),
        (handled, handled + f"            {MARK}(7);\n"),
    ])
    # The codec alone (8, 9): in `Args::decode` (the head), in
    # `__private::decode` (3e198b0).
    inline = "            Payload::Inline { len, bytes } => codec::decode(bytes[..*len as usize].get(self.at..).unwrap_or_default()),"
    in_args = edit_either(f"{src}/rpc/server.rs", [(inline, inline.replace(
        "codec::decode(bytes[..*len as usize].get(self.at..).unwrap_or_default()),",
        f"{{\n                let b = bytes[..*len as usize].get(self.at..).unwrap_or_default();\n"
        f"                {MARK}(8);\n                let r = codec::decode(b);\n                {MARK}(9);\n"
        f"                r\n            }}"))], optional=True)
    # A waiting loop's turn, and the progress loop's look that found work.
    step = "    pub fn step(&mut self, ready: &dyn Fn() -> bool, parked: &dyn Fn(bool)) {\n"
    edit(f"{src}/runtime/idle.rs", [(step, step + "        crate::transport::shm::stage_marks::tick();\n")])
    seen = "crate::transport::shm::stage_marks::seen();\n"
    busy = "    fn progress_busy(&self, ch: &Arc<Channel>) -> bool {\n"
    look = "            if !ch.needs_attention() {\n                continue;\n            }\n"
    edit_either(f"{src}/runtime/dispatch.rs", [(busy, busy + "        " + seen), (look, look + "            " + seen)])
    s = open(f"{src}/rpc/mod.rs").read()
    old_codec = "        crate::wire::codec::decode(args).map_err(|e| {"
    if s.count(old_codec) == 1:
        s = s.replace(old_codec, f"        {MARK}(8);\n        let r0 = crate::wire::codec::decode(args);\n"
                      f"        {MARK}(9);\n        r0.map_err(|e| {{")
    elif not in_args:
        sys.exit("rpc: no codec call to mark (the code moved)")
    i = s.find("    pub fn decode<A: DeserializeOwned>(args")
    if i < 0:
        sys.exit("rpc/mod.rs: no __private::decode (the code moved)")
    j = s.index("{\n", i) + 2
    k = s.index("\n    }\n", j)
    s = s[:j] + f"        {MARK}(4);\n        let r = (|| {{\n" + s[j:k] + f"\n        }})();\n        {MARK}(5);\n        r" + s[k:]
    open(f"{src}/rpc/mod.rs", "w").write(s)
    edit(f"{w}/crates/ferry-bench/src/ferry_rpc.rs", [(
        "    async fn arg(&self, data: ByteBuf) -> u64 {\n        answer(&data)\n    }",
        "    async fn arg(&self, data: ByteBuf) -> u64 {\n        ferry::__stage_mark(0);\n"
        "        let r = answer(&data);\n        ferry::__stage_mark(1);\n        r\n    }",
    )])
    print(f"{w}: marked (build it with its own CARGO_TARGET_DIR)")


def patch_common(src):
    """The probe module and the ring's push and pop events."""
    open(f"{src}/transport/shm/stage_marks.rs", "w").write(PROBE)
    edit(f"{src}/transport/shm/mod.rs", [("pub mod ring;", "pub mod ring;\npub(crate) mod stage_marks;")])
    stamp = "        self.mem.stamp(pos).store(stamp, Ordering::Release);\n        self.tail += need as u64;"
    body = "            let body = len - STAMP;\n"
    edit(f"{src}/transport/shm/ring.rs", [
        (stamp, stamp.replace("\n        self.tail", "\n        super::stage_marks::event(true);\n        self.tail")),
        (body, body + "            super::stage_marks::event(false);\n"),
    ])


def patch_hops(w):
    """Marks a port's and a link's ping-pong (see the module's text)."""
    src = f"{w}/crates/ferry/src"
    patch_common(src)
    m = lambda i, indent: f"{' ' * indent}{MARK}({i});\n"
    step = "    pub fn step_catching(&mut self, ready: &dyn Fn() -> bool, parked: &dyn Fn(bool), catch: Option<Catch<'_>>) {\n"
    drop = "    fn drop(&mut self) {\n        POLLING.set(self.outer);\n"
    dropped = "            if wake {\n                self.team.doorbell.ring_one();\n            }\n        }\n"
    edit(f"{src}/runtime/idle.rs", [
        (step, step + "        crate::transport::shm::stage_marks::tick();\n"),
        (drop, drop.replace("        POLLING", m(6, 8) + "        POLLING")),
        (dropped, dropped + m(7, 8)),
    ])
    busy = "    fn progress_busy(&self, ch: &Arc<Channel>) -> bool {\n"
    edit(f"{src}/runtime/dispatch.rs", [(busy, busy + "        crate::transport::shm::stage_marks::seen();\n")])
    caught = "                caught = Some(incoming(ch, h, Payload::from_slice(p), since));\n"
    burst = "        let burst = caught.is_some() && ch.transport.more_at_hand();\n        self.after_drain(ch, rx, drained);\n"
    edit(f"{src}/runtime/direct_receive.rs", [
        (caught, caught + m(8, 16)),
        (burst, m(0, 8) + burst + m(1, 8)),
    ])
    returned = "        // Not `ok_or(Error::Shutdown)`: that builds (and drops) the error at every receive.\n"
    send = "        if checkpoint == Checkpoint::Immediate && self.timeout.is_none() {\n            if let Some(ch) = self.cached() {\n"
    edit(f"{src}/port/mod.rs", [(returned, returned + m(2, 8)), (send, send.replace("            if let", m(3, 12) + "            if let"))])
    size = "    ) -> Result<()> {\n        self.check_size(ch, payload.len())?;\n"
    edit(f"{src}/runtime/send.rs", [(size, size.replace("        self.check", m(5, 8) + "        self.check"))])
    post = "        self.team.post(&ch, h, prefix, rest)\n    }\n"
    edit(f"{src}/runtime/served.rs", [(post, m(5, 8) + post)])
    locked = "        let mut s = self.state.lock();\n        if s.router.is_proxy() || s.moved.is_some()"
    catch = "        if !self.catch_message(&mut s, from, &f, caught) {\n"
    back = "            return Ok(self.message(m?));\n        }\n        idle::block_on(&self.end.team, self.recv_bytes())"
    sent = "    pub fn send_bytes(&self, bytes: &[u8], checkpoint: Checkpoint) -> Result<Vec<u8>> {\n"
    head = "        self.sender_in(sender, to.team)?.post_parts(&prefix[..HEAD + len], bytes)\n"
    edit(f"{src}/link/end.rs", [
        (locked, locked.replace("        if s.router", m(8, 8) + "        if s.router")),
        (catch, "        let c = self.catch_message(&mut s, from, &f, caught);\n" + m(9, 8) + "        if !c {\n"),
        (back, m(2, 12) + back),
        (sent, sent + m(3, 8)),
        (head, m(4, 8) + head),
    ])
    print(f"{w}: hops marked (build it with its own CARGO_TARGET_DIR)")


HOPS = [8, 9, 0, 1, 6, 7, 2, 3, 4, 5]
HOP_NAMES = {8: "caught", 9: "link caught", 0: "ring read", 1: "after drain", 6: "Idle drop", 7: "Idle dropped",
             2: "returned", 3: "send", 4: "link head", 5: "team's send"}


def hops(binary, rounds):
    """Port and link ping-pongs in turn; per case the median pop→push and
    round trip, and the stages (cycles from the pop) of the fastest
    quarter of the runs' lines."""
    cases = [("pingpong", "ferry.shm.spin"), ("links", "ferry.shm.link.fresh")]
    lines = {case: [] for _, case in cases}
    for _ in range(rounds):
        for suite, case in cases:
            try:
                os.remove(LOG)
            except FileNotFoundError:
                pass
            subprocess.run([binary, "bench", suite, "--passes", "1", "--only", case], capture_output=True, check=True)
            lines[case] += [(int(f[3]), int(f[5]), marks) for f, marks in read_log()]
    for case, got in lines.items():
        got.sort(key=lambda x: x[0])
        fast = got[: max(1, len(got) // 4)]
        med = statistics.median
        stages = ", ".join(f"{HOP_NAMES[i]} {med(x[2][i] for x in fast):.0f}" for i in HOPS if med(x[2][i] for x in fast))
        print(f"{case}: pop→push {med(x[0] for x in got):.0f} (fastest quarter {med(x[0] for x in fast):.0f}), "
              f"round trip {med(x[0] + x[1] for x in got):.0f}; fastest quarter, from the pop: {stages}")


LOG = "/tmp/ferry-stage-marks.log"
# The server's marks in the order they come, and their names (see the module's text).
STAGES = [2, 3, 4, 8, 9, 5, 6, 0, 1, 7]
NAMES = {2: "taker", 3: "start", 4: "decode in", 8: "codec in", 9: "codec out", 5: "decode out",
         6: "first poll", 0: "handler in", 1: "handler out", 7: "respond"}


def read_log():
    """The log's lines: the words before the marks, and the marks."""
    for line in open(LOG):
        marks = [int(x) for x in line.split("marks [")[1].rstrip("]\n").split(", ")]
        yield line.split(), marks


def show():
    for f, marks in read_log():
        stages = ", ".join(f"{NAMES[i]} {marks[i]}" for i in STAGES if marks[i])
        print(f"pid {f[0]} {f[1]}: pop→push {f[3]}, push→pop {f[5]}, a waiting turn {f[7]}, seen→pop {f[9]}"
              + (f"; from the pop: {stages}" if stages else ""))


def run_marked(binary, case):
    """One marked run: the server's and the client's medians."""
    try:
        os.remove(LOG)
    except FileNotFoundError:
        pass
    subprocess.run([binary, "bench", "rpc", "--passes", "1", "--only", case], capture_output=True, check=True)
    server, client = [], []
    for f, marks in read_log():
        (server if marks[2] else client).append((int(f[3]), int(f[5]), marks))
    med = statistics.median
    srv, cli = med(x[0] for x in server), med(x[0] for x in client)
    cli_wait = med(x[1] for x in client)
    stages = [med(x[2][i] for x in server) for i in STAGES]
    return {"server": srv, "client": cli, "round trip": cli + cli_wait, "transit": cli_wait - srv, "stages": stages}



def pairs(old, new, rounds, case="ferry.shm.arg4"):
    keys = ["server", "client", "round trip", "transit"]
    runs = []
    for i in range(rounds):
        a = run_marked(old, case) if i % 2 == 0 else None
        b = run_marked(new, case)
        a = a or run_marked(old, case)
        runs.append((a, b))
        print("  ".join(f"{k} {a[k]:.0f}/{b[k]:.0f}" for k in keys), flush=True)
    print("new / old, median over pairs:",
          ", ".join(f"{k} {statistics.median(b[k] / a[k] for a, b in runs):.3f}" for k in keys))
    for j, mark in enumerate(STAGES):
        d = [(b["stages"][j] - (b["stages"][j - 1] if j else 0)) - (a["stages"][j] - (a["stages"][j - 1] if j else 0))
             for a, b in runs]
        print(f"  → {NAMES[mark]}: new − old {statistics.median(d):+.0f} cycles")


EACH = r"""
/// TEMPORARY (scripts/stage-marks.py each): `call` timed call by call;
/// the samples also go to `$FERRY_EXP_SAMPLES` if it is set.
fn client_each(peer: &Peer, p: &Params, call: impl Fn(&BenchClient)) -> Vec<f64> {
    let _dir = RemoveDir(run_dir(&peer.run_id));
    let team = team(&peer.run_id, Mode::Spin, 0);
    let c = bind(&team);
    for _ in 0..p.warmup * p.iters / 4 {
        call(&c);
    }
    let mut samples = Vec::with_capacity(p.iters);
    let mut last = std::time::Instant::now();
    for _ in 0..p.iters {
        call(&c);
        let now = std::time::Instant::now();
        samples.push((now - last).as_nanos() as f64);
        last = now;
    }
    c.stop_blocking().unwrap();
    drop(c);
    team.shutdown();
    if let Ok(path) = std::env::var("FERRY_EXP_SAMPLES") {
        let text: String = samples.iter().map(|s| format!("{s}\n")).collect();
        std::fs::write(path, text).unwrap();
    }
    samples
}

fn each_child(ctx: &ChildCtx) {
    serve(ctx, Mode::Spin, false)
}

fn arg4_each(peer: &mut Peer, p: &Params) -> Vec<f64> {
    client_each(peer, p, arg_call(4))
}

fn null_each_exp(peer: &mut Peer, p: &Params) -> Vec<f64> {
    client_each(peer, p, null_call)
}
"""


def each(w):
    """Adds `ferry.shm.arg4.each` and `ferry.shm.null.each` to a worktree's
    `bench rpc`: spinning calls timed one by one (the head's and
    3e198b0's bench alike)."""
    path = f"{w}/crates/ferry-bench/src/ferry_rpc.rs"
    s = open(path).read()
    if "Case::new(" in s:
        cases = ('        Case::new("ferry.shm.arg4.each", arg4_each, each_child),\n'
                 '        Case::new("ferry.shm.null.each", null_each_exp, each_child),\n')
    else:
        cases = ('        Case { name: "ferry.shm.arg4.each", parent: arg4_each, child: each_child },\n'
                 '        Case { name: "ferry.shm.null.each", parent: null_each_exp, child: each_child },\n')
    start = "pub fn cases() -> Vec<Case> {\n    vec![\n"
    if s.count(start) != 1:
        sys.exit(f"{path}: no list of cases (the code moved)")
    open(path, "w").write(s.replace(start, start + cases) + EACH)
    print(f"{w}: ferry.shm.arg4.each and ferry.shm.null.each added")


# Where a call's time goes by its length (ns): the bounds of `tails`' rows.
BOUNDS = [0, 2_000, 3_000, 20_000, 50_000, 100_000, float("inf")]


def tails(old, new, runs, case="ferry.shm.arg4.each"):
    """Both builds' per-call samples, runs taken in turn: each row gives
    the share of calls of that length and the ns per call they add to the
    mean, so that a gap in the mean shows whether it is in the typical
    call or in slow ones."""
    per = {}
    for name, binary in (("old", old), ("new", new)):
        per[name] = {"n": 0, "count": [0] * (len(BOUNDS) - 1), "sum": [0.0] * (len(BOUNDS) - 1), "medians": []}
    for i in range(runs):
        for name, binary in (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old)):
            path = f"/tmp/ferry-each-{name}.txt"
            env = dict(os.environ, FERRY_EXP_SAMPLES=path)
            subprocess.run([binary, "bench", "rpc", "--passes", "1", "--iters", "100000", "--only", case],
                           capture_output=True, check=True, env=env)
            v = [float(x) for x in open(path)]
            d = per[name]
            d["n"] += len(v)
            d["medians"].append(statistics.median(v))
            for x in v:
                k = next(k for k in range(len(BOUNDS) - 1) if x < BOUNDS[k + 1])
                d["count"][k] += 1
                d["sum"][k] += x
    print("a call's length   old: calls, ns per call    new: calls, ns per call")
    for k in range(len(BOUNDS) - 1):
        o, w = per["old"], per["new"]
        print(f"{BOUNDS[k] / 1000:>5.0f}–{BOUNDS[k + 1] / 1000:<6.0f}µs   "
              f"{o['count'][k] / o['n'] * 100:7.3f} %, {o['sum'][k] / o['n']:7.1f}      "
              f"{w['count'][k] / w['n'] * 100:7.3f} %, {w['sum'][k] / w['n']:7.1f}")
    for name in ("old", "new"):
        d = per[name]
        print(f"{name}: mean {sum(d['sum']) / d['n']:.0f} ns, median of the runs' medians {statistics.median(d['medians']):.0f} ns")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "patch":
        patch(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "patch-hops":
        patch_hops(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "hops":
        hops(sys.argv[2], int(sys.argv[3]))
    elif len(sys.argv) == 2 and sys.argv[1] == "show":
        show()
    elif len(sys.argv) == 5 and sys.argv[1] == "pairs":
        pairs(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "each":
        each(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "tails":
        tails(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
