#!/usr/bin/env python3
"""A/B of two ferry builds on one case, in pairs of short runs: each pair
runs `BASE bench SUITE --only CASE` and `NEW bench SUITE --only CASE` one
right after the other (~0.3 s each; the order swapped every pair), and the
figure is the median over the pairs of NEW / BASE.

This machine switches between speeds within minutes (docs/PERFORMANCE.md,
"Machine modes"): a whole-suite run of each build (`bench-ab.py`) often
straddles a switch, and medians of such runs move by 10-20 % between
sittings. The two runs of a pair are a second apart, so they almost always
see the same machine; a pair that did not is one outlier among many.

    scripts/ab-pairs.py BASE_BINARY NEW_BINARY SUITE CASE [PAIRS] [bench args...]
    scripts/ab-pairs.py /tmp/base/ferry target/release/ferry pingpong ferry.shm.spin 60
    scripts/ab-pairs.py /tmp/base/ferry target/release/ferry large ferry.shm.raw.warm.64MiB 20 --sizes-mib 64 --rounds 3

Prints the median ratio with its quartiles, how many pairs NEW won, and
each build's median. Default bench args: --passes 1 --rounds 5 --warmup 2.
"""
import json
import statistics
import subprocess
import sys


# One short run of a case, the default bench args.
DEFAULT_ARGS = ["--passes", "1", "--rounds", "5", "--warmup", "2"]

# Suites that run all their cases (no `--only`).
WHOLE = {"large"}


def median_ns(binary, suite, case, extra):
    only = [] if suite in WHOLE else ["--only", case]
    cmd = [binary, "bench", suite, "--json"] + only + extra
    run = subprocess.run(cmd, capture_output=True, text=True, check=True)
    out = run.stdout
    report = json.loads(out[: out.rindex("}") + 1])
    # `large` nests its cases in a row per size, timed in ms.
    rows = [c for r in report["results"] for c in r.get("cases", [r])]
    for row in rows:
        if row["name"] == case:
            return row["median_ns"] if "median_ns" in row else row["ms"] * 1e6
    # A case that failed says why in the report's `errors` (and on stderr).
    why = report.get("errors", {}).get(case) or run.stderr.strip()
    sys.exit(f"{binary}: no case {case} in the report: {why}")


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    base, new, suite, case = sys.argv[1:5]
    pairs = int(sys.argv[5]) if len(sys.argv) > 5 else 40
    extra = sys.argv[6:] or DEFAULT_ARGS
    ratios, a, b = [], [], []
    for i in range(pairs):
        order = [(base, a), (new, b)] if i % 2 == 0 else [(new, b), (base, a)]
        for binary, into in order:
            into.append(median_ns(binary, suite, case, extra))
        ratios.append(b[-1] / a[-1])
    q = statistics.quantiles(ratios, n=4)
    won = sum(r < 1 for r in ratios)
    print(f"{case}: new / base = {statistics.median(ratios):.3f} (quartiles {q[0]:.3f}, {q[2]:.3f}); "
          f"new faster in {won} of {pairs} pairs; medians {statistics.median(a):.1f} ns (base), "
          f"{statistics.median(b):.1f} ns (new)")


if __name__ == "__main__":
    main()
