#!/usr/bin/env python3
"""Locked instructions (`lock`-prefixed, `xchg`, `mfence`) a program ran,
by function, from a callgrind profile taken with `--dump-instr=yes`. Each
is a full barrier on x86: it waits for the thread's earlier stores to
reach the cache, which a store to a line another core holds makes slow.
Callgrind counts them like any instruction; this says where they are.

    cargo build --release -p ferry-bench --example rtt_instructions
    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=/tmp/cg.link \\
        target/release/examples/rtt_instructions 3000 link
    scripts/locked-instructions.py /tmp/cg.link target/release/examples/rtt_instructions 3000

The last argument divides the counts (3000: per round trip).
"""
import collections
import re
import subprocess
import sys


def costs_by_address(profile):
    """Instruction address -> (executions, function), self cost only."""
    names, costs, owner = {}, collections.Counter(), {}
    fn, last, in_call = None, 0, False
    for line in open(profile):
        line = line.rstrip("\n")
        m = re.match(r"fn=\((\d+)\)(?: (.*))?", line)
        if m:
            if m.group(2):
                names[m.group(1)] = m.group(2)
            fn, last, in_call = names.get(m.group(1)), 0, False
            continue
        m = re.match(r"cfn=\((\d+)\) (.*)", line)
        if m:
            names[m.group(1)] = m.group(2)
        if line.startswith(("cfn=", "cfi=", "cob=", "calls=")):
            in_call = in_call or line.startswith("calls=")
            continue
        m = re.match(r"(0x[0-9a-f]+|\+\d+|-\d+|\*)\s+\S+\s+(\d+)", line)
        if not (m and fn):
            continue
        a = m.group(1)
        addr = int(a, 16) if a.startswith("0x") else last + int(a[1:]) if a[0] == "+" else last - int(a[1:]) if a[0] == "-" else last
        last = addr
        if in_call:  # the cost line of a call: the callee's inclusive cost
            in_call = False
            continue
        costs[addr] += int(m.group(2))
        owner[addr] = fn
    return costs, owner


def main():
    profile, binary, per = sys.argv[1], sys.argv[2], float(sys.argv[3])
    costs, owner = costs_by_address(profile)
    disassembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary], capture_output=True, text=True).stdout
    by_fn, total = collections.Counter(), 0
    for line in disassembly.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
        if not m:
            continue
        addr, ins = int(m.group(1), 16), m.group(2)
        if costs.get(addr) and (ins.startswith(("lock", "xchg")) or "mfence" in ins):
            by_fn[owner[addr]] += costs[addr]
            total += costs[addr]
    print(f"locked instructions per unit: {total / per:.1f}")
    for fn, n in by_fn.most_common(25):
        print(f"{n / per:7.2f}  {fn[:100]}")


if __name__ == "__main__":
    main()
