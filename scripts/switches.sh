#!/usr/bin/env bash
# Context switches per second of a benchmark's ferry threads, by thread
# kind and by how each left its CPU: "blocked" (it slept: a park, a lock, a
# watcher's wait) or "preempted" (another thread took the CPU). Counted
# with the kernel's sched:sched_switch tracepoint, which needs no hardware
# counters (this project's KVM guests have none), over the whole run:
#
#     scripts/switches.sh BINARY [SUITE CASE]      # default: rpc ferry.shm.arg4
#     scripts/switches.sh target/release/ferry pingpong ferry.shm.spin
#
# The thirty-ninth session found this way that an answer wait slept ~500
# times a second because the peer's hand-off watcher borrowed the peer's
# CPU (docs/PERFORMANCE.md, "Thirty-ninth session"). Needs root (perf).
set -euo pipefail
bin=$1 suite=${2:-rpc} case=${3:-ferry.shm.arg4}
data=$(mktemp)
trap 'rm -f "$data"' EXIT
perf record -q -e sched:sched_switch -a -o "$data" -- \
    "$bin" bench "$suite" --passes 1 --rounds 60 --only "$case" 2>&1 | grep -F "$case" || true
perf script -i "$data" -F comm,time,trace 2>/dev/null | python3 -c '
import collections, re, sys
count, first, last = collections.Counter(), None, None
for line in sys.stdin:
    m = re.match(r"\s*(\S.*?)\s+(\d+\.\d+):\s+(.*)", line)
    if not m or not m.group(1).startswith("ferry"):
        continue
    comm, t, rest = m.group(1), float(m.group(2)), m.group(3)
    first = t if first is None else first
    last = t
    kind = re.sub(r"-\d+$", "", comm)  # ferry-proc-0, ferry-watch-12 ...
    how = "preempted" if "prev_state=R" in rest else "blocked"
    count[(kind, how)] += 1
span = (last - first) if first is not None and last > first else 1.0
print(f"  over {span:.2f} s:")
for (kind, how), n in count.most_common():
    print(f"  {kind:20} {how:10} {n / span:8.0f}/s")
'
