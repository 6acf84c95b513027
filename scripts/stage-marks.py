#!/usr/bin/env python3
"""Where a small call's server time goes, in TSC cycles, stage by stage:
patches a *worktree* of ferry (never `main`) with `rdtsc` marks, so that
two builds (an old one and the head) can be compared stage by stage with
`ferry bench rpc --only ferry.shm.arg4`, as docs/PERFORMANCE.md's
"Thirty-fifth session" table was made. The machine has no PMU; the marks
are what it gives.

    git worktree add /tmp/wt-old OLD && scripts/stage-marks.py patch /tmp/wt-old
    (cd /tmp/wt-old && CARGO_TARGET_DIR=/tmp/t-old cargo build --release -p ferry-cli)
    rm -f /tmp/ferry-stage-marks.log; /tmp/t-old/release/ferry bench rpc --passes 1 --only ferry.shm.arg4
    scripts/stage-marks.py show        # one line per thread that pushed and popped

Marks: the ring's push (after the stamp) and pop (a stamp seen); on the
server, in cycles since the thread's last pop: 2 the endpoint's direct
taker, 3 `start` before `dispatch`, 4/5 the arguments' decode, 6 the
handler's first poll, 0/1 the bench's handler, 7 before `respond`. Each
process appends, per 100,000 events, the medians of pop→push (the
server's path, or the client's between calls), push→pop and the marks.
The patch finds its places by text: if the code moved, it says which.
"""
import sys

PROBE = r'''//! TEMPORARY (scripts/stage-marks.py): TSC marks of ring pushes and pops.
use std::cell::RefCell;
use std::io::Write;

#[derive(Default)]
struct S { last_push: bool, last: u64, a: Vec<u32>, b: Vec<u32>, m: [Vec<u32>; 8] }

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
            let line = format!("{} {:?} popToPush {a} pushToPop {b} marks {marks:?}\n", std::process::id(), std::thread::current().id());
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open("/tmp/ferry-stage-marks.log") {
                let _ = f.write_all(line.as_bytes());
            }
        }
    });
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


def patch(w):
    src = f"{w}/crates/ferry/src"
    open(f"{src}/transport/shm/stage_marks.rs", "w").write(PROBE)
    edit(f"{src}/transport/shm/mod.rs", [("pub mod ring;", "pub mod ring;\npub(crate) mod stage_marks;")])
    with open(f"{src}/lib.rs", "a") as f:
        f.write(f"#[doc(hidden)]\npub use transport::shm::stage_marks::mark as __stage_mark;\n")
    stamp = "        self.mem.stamp(pos).store(stamp, Ordering::Release);\n        self.tail += need as u64;"
    body = "            let body = len - STAMP;\n"
    edit(f"{src}/transport/shm/ring.rs", [
        (stamp, stamp.replace("\n        self.tail", "\n        super::stage_marks::event(true);\n        self.tail")),
        (body, body + "            super::stage_marks::event(false);\n"),
    ])
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
    s = open(f"{src}/rpc/mod.rs").read()
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


def show():
    names = ["handler in", "handler out", "taker", "start", "decode in", "decode out", "first poll", "respond"]
    order = [2, 3, 4, 5, 6, 0, 1, 7]
    for line in open("/tmp/ferry-stage-marks.log"):
        f = line.split()
        marks = [int(x) for x in line.split("marks [")[1].rstrip("]\n").split(", ")]
        stages = ", ".join(f"{names[i]} {marks[i]}" for i in order if marks[i])
        print(f"pid {f[0]} {f[1]}: pop→push {f[3]}, push→pop {f[5]}" + (f"; from the pop: {stages}" if stages else ""))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "patch":
        patch(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "show":
        show()
    else:
        sys.exit(__doc__)
