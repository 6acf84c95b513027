#!/usr/bin/env python3
"""Which side of a two-process case is busy: each build's two busiest
threads' time per unit (call, round trip) spent working, not spinning in
the idle loop's look for work.

Runs `BINARY bench SUITE --only CASE` under `perf record -e cpu-clock`
(software sampling: this machine's guest has no hardware counters),
builds in turn, RUNS times each. A thread's share of the case's time
is its samples over all samples, times two (the two spinning threads,
pinned one to a CPU each, are on their CPUs for the whole run); its busy
part is what was not in the idle loop's functions (`IDLE`). Busy time per
unit = busy share × the run's median. Stalls are attributed to whatever
instruction waits, so read the split between the two sides, not a
function's figure.

    scripts/busy-split.py SUITE CASE RUNS BINARY...
    scripts/busy-split.py rpc ferry.shm.tasks2 3 /tmp/ferry-32b target/release/ferry
"""
import collections
import json
import re
import subprocess
import sys
import tempfile

# The idle loop's look for work: what a waiting thread runs between frames.
IDLE = re.compile(
    r"needs_attention|Idle::step|progress_on|Sweep::progress|processor_loop|has_frame_or_gone"
    r"|more_at_hand|progress_one|progress_busy|ChannelList::refresh|Timers::fire"
)

# Functions only one side of a call runs: they name a thread's role.
ROLES = {
    "client": re.compile(r"Client::start_call|CallFuture"),
    "server": re.compile(r"ServiceEndpoint::|IncomingCall::respond"),
}


def run(binary, suite, case, rounds):
    with tempfile.NamedTemporaryFile(suffix=".perf") as data:
        cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-o", data.name, "--",
               binary, "bench", suite, "--json", "--passes", "1", "--rounds", str(rounds), "--only", case]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        report = json.loads(out[: out.rindex("}") + 1])
        median = next(r["median_ns"] for r in report["results"] if r["name"] == case)
        rep = subprocess.run(["perf", "report", "-i", data.name, "--sort", "pid,sym", "--stdio"],
                             capture_output=True, text=True, check=True).stdout
    total, idle, role = collections.Counter(), collections.Counter(), {}
    funcs = collections.defaultdict(collections.Counter)
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\d+):(\S+)\s+\[.\]\s+(.*)", line)
        if not m:
            continue
        share, thread, sym = float(m.group(1)), f"{m.group(3)}({m.group(2)})", m.group(4)
        total[thread] += share
        funcs[thread][sym] += share
        if IDLE.search(sym):
            idle[thread] += share
        for name, marks in ROLES.items():
            if marks.search(sym):
                role.setdefault(thread, name)
    busiest = [t for t, _ in total.most_common(2)]
    sides = [(role.get(t, t), 2 * total[t] / 100, 2 * (total[t] - idle[t]) / 100) for t in busiest]
    top = {role.get(t, t): {f: 2 * c / 100 * median for f, c in funcs[t].items()} for t in busiest}
    return median, sides, top


def main():
    suite, case, runs, binaries = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
    rounds = 100
    # Each side's functions: ns per unit, summed over the runs of a build.
    per_fn = {b: collections.defaultdict(collections.Counter) for b in binaries}
    for i in range(runs):
        for b in binaries:
            median, threads, top = run(b, suite, case, rounds)
            sides = ", ".join(f"{t}: {cpu:.2f} CPU, busy {busy * median:.0f} ns" for t, cpu, busy in threads)
            print(f"run {i + 1} {b}: median {median:.0f} ns; {sides}", flush=True)
            for side, fns in top.items():
                per_fn[b][side].update(fns)
    # The functions whose time moved most between the first build and each other one.
    first = binaries[0]
    for b in binaries[1:]:
        for side in sorted(per_fn[b]):
            old, new = per_fn[first][side], per_fn[b][side]
            moved = sorted(set(old) | set(new), key=lambda f: -abs(new[f] - old[f]))[:15]
            print(f"\n{side}, ns per unit (mean over runs), {first} -> {b}:")
            for f in moved:
                print(f"  {old[f] / runs:6.1f} -> {new[f] / runs:6.1f}  {f[:100]}")


if __name__ == "__main__":
    main()
