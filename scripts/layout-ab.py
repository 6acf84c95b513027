#!/usr/bin/env python3
"""A/B of two builds over several code layouts each: is a difference the
change's, or where the linker happened to put the code?

On this project's machines one case can move by 5-10 % when only an
unrelated function changes (its neighbours move in the binary). So each
build is linked several times with its text sections in a shuffled order
(`scripts/layout-ab.py link`, lld's `--shuffle-sections`), and every
binary of both builds runs one case in each round, in a random order.
A round's figure is the median over the new build's layouts divided by
the median over the old build's, so a drift of the machine between rounds
cancels; the result is the median over rounds. Each layout's own median
is printed too, which shows how far layout alone moves the case.

    # in each tree, N layouts (the first build compiles; the rest relink):
    scripts/layout-ab.py link TREE OUT_PREFIX N
    # then:
    scripts/layout-ab.py run 'OLD_PREFIX-[0-9]*' 'NEW_PREFIX-[0-9]*' SUITE CASE [ROUNDS] [bench args...]
    scripts/layout-ab.py link /tmp/wt-old /tmp/old 5 && scripts/layout-ab.py link . /tmp/new 5
    scripts/layout-ab.py run '/tmp/old-[0-9]*' '/tmp/new-[0-9]*' rpc ferry.shm.arg4 12

A bisection: check each commit out in one worktree and link it with
LAYOUT_AB_TARGET set to one directory for all of them (each builds what
changed since the last), then `run` its layouts against the base's.
"""
import glob
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.dont_write_bytecode = True  # no __pycache__ left in scripts/
ab = __import__("ab-pairs")

LINKER = """#!/bin/sh
# Links as rustc asks, with the text sections in an order shuffled by $FERRY_SHUFFLE.
exec cc "$@" "-Wl,--shuffle-sections=.text*=$FERRY_SHUFFLE"
"""


def link(tree, prefix, n):
    wrapper = pathlib.Path(f"{prefix}-linker.sh")
    wrapper.write_text(LINKER)
    wrapper.chmod(0o755)
    # One target directory for several trees (a bisection's commits, checked
    # out in turn in one worktree) builds only what changed between them.
    target = os.environ.get("LAYOUT_AB_TARGET", f"{prefix}-target")
    for seed in range(1, n + 1):
        # Touched: the binary is linked again (only its own crate recompiles).
        pathlib.Path(tree, "crates/ferry-cli/src/main.rs").touch()
        env = dict(os.environ, FERRY_SHUFFLE=str(seed), CARGO_TARGET_DIR=target,
                   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=str(wrapper))
        subprocess.run(["cargo", "build", "--release", "-p", "ferry-cli"], cwd=tree, env=env, check=True)
        out = f"{prefix}-{seed}"
        shutil.copy(f"{target}/release/ferry", out)
        print(out)


def run(old_glob, new_glob, suite, case, rounds, extra):
    old, new = sorted(glob.glob(old_glob)), sorted(glob.glob(new_glob))
    if not old or not new:
        sys.exit("no binaries match")
    times = {b: [] for b in old + new}
    ratios = []
    for r in range(rounds):
        order = old + new
        random.shuffle(order)
        got = {b: ab.median_ns(b, suite, case, extra) for b in order}
        for b, ns in got.items():
            times[b].append(ns)
        ratio = statistics.median(got[b] for b in new) / statistics.median(got[b] for b in old)
        ratios.append(ratio)
        print(f"round {r + 1}: new / old {ratio:.3f}", file=sys.stderr)
    for b in old + new:
        print(f"{b}: median {statistics.median(times[b]):.1f} ns")
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    print(f"{case}: new / old over layouts = {statistics.median(ratios):.3f} "
          f"(quartiles {q[0]:.3f}, {q[2]:.3f}; {len(ratios)} rounds, {len(old)} and {len(new)} layouts)")


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "link":
        link(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif len(sys.argv) >= 6 and sys.argv[1] == "run":
        rounds = int(sys.argv[6]) if len(sys.argv) > 6 else 12
        extra = sys.argv[7:] or ab.DEFAULT_ARGS
        run(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], rounds, extra)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
