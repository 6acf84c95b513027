#!/usr/bin/env bash
# Runs a benchmark suite with every peer built in (installs what the peers
# need first). Usage: scripts/bench.sh pingpong [--json] [--rounds N] ...
# Suites: pingpong, rpc, memory (remote memory on one machine), links, tcp, large, scale (many peers: idle client teams
# beside one caller, fan-in of 1..16 client processes), soak, crash.
# `tcp` runs across two network namespaces (needs root; see
# scripts/netns-lib.sh): the parent in one, its child processes in the other.
# Never run two benchmarks at once: the figures are ratios measured side
# by side on a shared, noisy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bench-deps.sh
cargo build --release --locked -p ferry-cli --features peers
# The small program whose idle team the memory report measures.
cargo build --release --locked -p ferry --example idle_team
if [[ ${1:-} == tcp ]]; then
    . scripts/netns-lib.sh
    netns_require
    p="ferry-$$"
    trap 'netns_down "$p"' EXIT INT TERM
    netns_sweep
    netns_up "$p" 2
    ip netns exec "$p-1" env FERRY_BENCH_CHILD_NETNS="$p-2" \
        FERRY_BENCH_TCP_PARENT=10.77.0.1 FERRY_BENCH_TCP_CHILD=10.77.0.2 \
        target/release/ferry bench "$@"
else
    exec target/release/ferry bench "$@"
fi
