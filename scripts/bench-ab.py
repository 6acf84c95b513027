#!/usr/bin/env python3
"""A/B of two ferry builds on one suite: runs `BASE bench SUITE --json ...`
and `NEW bench SUITE --json ...` alternately (the order swapped every run),
and prints, per case, the median over the runs of each build's ratio to the
suite's floor, and new / base. This machine is shared and noisy: only
ratios taken side by side mean anything (docs/PERFORMANCE.md).

    scripts/bench-ab.py BASE_BINARY NEW_BINARY SUITE RUNS [bench args...]
    scripts/bench-ab.py /tmp/base/target/release/ferry target/release/ferry rpc 4 --passes 3
"""
import json
import statistics
import subprocess
import sys

if len(sys.argv) < 5:
    sys.exit(__doc__)
base, new, suite, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
extra = sys.argv[5:]
ratios = {"base": [], "new": []}
for i in range(runs):
    order = [("base", base), ("new", new)]
    for name, binary in order if i % 2 == 0 else reversed(order):
        out = subprocess.run([binary, "bench", suite, "--json", *extra], capture_output=True, text=True, check=True)
        ratios[name].append(json.loads(out.stdout)["ratios"])
        print(f"run {i + 1}/{runs}: {name} done", file=sys.stderr, flush=True)
cases = sorted(set.intersection(*(set(r) for r in ratios["base"] + ratios["new"])))
print(f"{'case':32} {'base':>9} {'new':>9} {'new/base':>9}")
for c in cases:
    b = statistics.median(r[c] for r in ratios["base"])
    n = statistics.median(r[c] for r in ratios["new"])
    flag = "  <- more than 10 % worse" if n / b > 1.10 else ""
    print(f"{c:32} {b:9.3f} {n:9.3f} {n / b:9.3f}{flag}")
