#!/usr/bin/env python3
"""A/B of two ferry builds on one suite: runs `BASE bench SUITE --json ...`
and `NEW bench SUITE --json ...` alternately (the order swapped every run),
and prints, per case, the median over the runs of each build's ratio to the
suite's floor, and new / base; then each case's absolute medians (median
over the runs). This machine is shared and noisy: only ratios taken side by
side mean anything (docs/PERFORMANCE.md). Cases whose code both builds share
(floors, peers) show how far the noise alone moves a figure.

    scripts/bench-ab.py BASE_BINARY NEW_BINARY SUITE RUNS [bench args...]
    scripts/bench-ab.py /tmp/base/target/release/ferry target/release/ferry rpc 4 --passes 3

Suites whose report has no `ratios` are compared on what they have: each
row's own `ratio` and bandwidth (`gbps`) for `large`, the targets' values
for `scale`.
"""
import json
import statistics
import subprocess
import sys


def figures(report):
    """(ratios, absolute figures) of one run's report."""
    rows = report.get("results", [])
    # `large` keeps its cases in a row per size.
    rows = [c for r in rows for c in r.get("cases", [r])]
    absolute = {r["name"]: r["median_ns"] for r in rows if "median_ns" in r}
    absolute |= {r["name"]: r["gbps"] for r in rows if isinstance(r.get("gbps"), (int, float))}
    if "ratios" in report:
        return report["ratios"], absolute
    ratios = {r["name"]: r["ratio"] for r in rows if isinstance(r.get("ratio"), (int, float))}
    # `scale` reports its targets' values (ratios, most of them).
    ratios |= {t["target"]: t["value"] for t in report.get("targets", []) if isinstance(t.get("value"), (int, float))}
    return ratios, absolute


if len(sys.argv) < 5:
    sys.exit(__doc__)
base, new, suite, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
extra = sys.argv[5:]
ratios = {"base": [], "new": []}
absolute = {"base": [], "new": []}
for i in range(runs):
    order = [("base", base), ("new", new)]
    for name, binary in order if i % 2 == 0 else reversed(order):
        out = subprocess.run([binary, "bench", suite, "--json", *extra], capture_output=True, text=True, check=True)
        r, a = figures(json.loads(out.stdout))
        ratios[name].append(r)
        absolute[name].append(a)
        print(f"run {i + 1}/{runs}: {name} done", file=sys.stderr, flush=True)


def table(runs_of, title, worse_if_higher=True):
    cases = sorted(set.intersection(*(set(r) for r in runs_of["base"] + runs_of["new"])))
    print(f"{title:40} {'base':>11} {'new':>11} {'new/base':>9}")
    for c in cases:
        b = statistics.median(r[c] for r in runs_of["base"])
        n = statistics.median(r[c] for r in runs_of["new"])
        worse = (n / b > 1.10) if worse_if_higher else (n / b < 1 / 1.10)
        flag = "  <- more than 10 % worse" if b and worse else ""
        print(f"{c:40} {b:11.3f} {n:11.3f} {n / b if b else float('nan'):9.3f}{flag}")


# Ratios to the floor: lower is better, but for bandwidth ratios (`large`).
bandwidth = suite == "large"
table(ratios, "case (ratio)", worse_if_higher=not bandwidth)
print()
table(absolute, "case (gbps)" if bandwidth else "case (median ns)", worse_if_higher=not bandwidth)
