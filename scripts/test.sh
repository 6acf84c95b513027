#!/usr/bin/env bash
# Sets up and runs every test of ferry: unit tests, the transport
# conformance suite, the port and RPC suites, cross-process tests (real
# child processes, SIGKILL, leak checks) and the benchmark harness's smoke
# test, the loom models, a short run of every fuzz target (scripts/fuzz.sh:
# nightly; installs cargo-fuzz if missing), the multi-node tests on real
# network namespaces (scripts/netns-test.sh: needs root, as CI is, and
# installs iproute2 if missing), a short crash matrix (scripts/crash.sh)
# and a one-minute soak. Installs etcd-server for the etcd name plane's
# tests.
# Ends with one line: "ferry: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."

# Spinning tests on a 2-core machine: test binaries run one at a time,
# tests inside a binary on 2 threads.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# The etcd name plane's tests start a real etcd (Debian's etcd-server).
command -v etcd >/dev/null || { apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null; }

cargo build --workspace --all-targets --locked
cargo clippy --workspace --all-targets --locked -- -D warnings
status=0
cargo test --workspace --locked --no-fail-fast -- --test-threads="$RUST_TEST_THREADS" 2>&1 | tee "$log" || status=$?

# loom models (crates/ferry/src/loom_models/): the real ring, doorbell,
# wait-for-space, executor, running-calls gate and hand-off watcher code run under loom,
# which explores their interleavings. A build of their own (--cfg loom), in target/loom.
RUSTFLAGS="${RUSTFLAGS:-} --cfg loom" cargo test -p ferry --lib --release --locked --target-dir target/loom loom \
    -- --test-threads="$RUST_TEST_THREADS" 2>&1 | tee -a "$log" || status=$?

# Fuzzing (docs/RELIABILITY.md): every decoder of peer input, 3 s each from
# its committed seed corpus, with AddressSanitizer (about 2 min with the
# build of its own, in fuzz/target-quick).
scripts/fuzz.sh --quick --seconds 3 2>&1 | tee -a "$log" || status=$?

# Nodes in network namespaces: ports and RPC over TCP, a team killed and
# a link cut mid-call (crates/ferry/tests/netns.rs).
scripts/netns-test.sh 2>&1 | tee -a "$log" || status=$?

# The crash matrix, short (a full run: docs/RELIABILITY.md): teams
# SIGKILLed at random moments of mixed traffic, over shared memory and over
# TCP between namespaces; nothing may hang, be left behind or run twice.
# Each round counts as a test. The debug build made above.
FERRY_CRASH_PROFILE=debug scripts/crash.sh --rounds 10 2>&1 | tee -a "$log" || status=$?

# A one-minute soak: 16 teams on two nodes, nothing lost, duplicated,
# reordered or corrupted (docs/RELIABILITY.md; the RSS bound is reported,
# not enforced, in so short a run).
if target/debug/ferry bench soak --minutes 1 --no-memory-bound 2>&1 | tee -a "$log"; then
    echo "soak: 1 passed, 0 failed" | tee -a "$log"
else
    echo "soak: 0 passed, 1 failed" | tee -a "$log"
    status=1
fi

# A one-minute cluster soak: 3 hosts (network namespaces) of 4 teams,
# names on etcd, a link cut and teams killed; every operation answers or
# fails typed within its deadline, nothing duplicated, names converge
# (docs/RELIABILITY.md has the 8-host, 10-minute run).
FERRY_SOAK_PROFILE=debug scripts/cluster-soak.sh --hosts 3 --minutes 1 2>&1 | tee -a "$log" || status=$?

# Totals over every test binary (libtest's "test result" lines; the
# harness-less smoke test's, the fuzz targets', the crash matrix's rounds
# and the soak's "<what>: N passed, N failed").
awk '
    /^test result: / { p += $4; f += $6 }
    /^(smoke|fuzz|crash|soak): [0-9]+ passed, [0-9]+ failed/ { p += $2; f += $4 }
    END { printf "ferry: %d passed, %d failed\n", p, f }
' "$log"
exit "$status"
