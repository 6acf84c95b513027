#!/usr/bin/env bash
# Runs a benchmark suite with every peer built in (installs what the peers
# need first). Usage: scripts/bench.sh pingpong [--json] [--rounds N] ...
# Never run two benchmarks at once: the figures are ratios measured side
# by side on a shared, noisy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bench-deps.sh
cargo build --release --locked -p ferry-cli --features peers
exec target/release/ferry bench "$@"
