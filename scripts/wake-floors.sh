#!/bin/sh
# Runs scripts/wake-floors.c's mechanisms in turn, RUNS times (3,000 round
# trips each, a 5 s sleep timeout as ferry's parked threads have), and
# prints each one's median and its median ratio to `eventfd` in the same
# turn (paired: the machine's speed changes from minute to minute).
set -e
runs=${1:-20}
cc -O2 -o /tmp/wake-floors "$(dirname "$0")/wake-floors.c"
for _ in $(seq "$runs"); do
    for m in futex eventfd eventfd-chk pipe; do /tmp/wake-floors $m 3000 5000; done | tr '\n' ' '
    echo
done | python3 -c '
import statistics, sys
rows = [dict(zip(l.split()[::2], map(float, l.split()[1::2]))) for l in sys.stdin if l.strip()]
for m in rows[0]:
    med = statistics.median(r[m] for r in rows)
    ratio = statistics.median(r[m] / r["eventfd"] for r in rows)
    print(f"{m:12} {med:8.0f} ns a round trip   / eventfd {ratio:.3f}")
'
