#!/usr/bin/env bash
# Sets up and runs every test of ferry: unit tests, the transport
# conformance suite, the port suite, cross-process tests (real child
# processes, SIGKILL, leak checks) and the benchmark harness's smoke test.
# Needs only a Rust toolchain; installs nothing else so far.
set -euo pipefail
cd "$(dirname "$0")/.."

# Spinning tests on a 2-core machine: run test binaries one at a time,
# tests inside a binary on 2 threads.
export RUST_TEST_THREADS="${RUST_TEST_THREADS:-2}"
cargo build --workspace --all-targets --locked
cargo test --workspace --locked -- --test-threads="$RUST_TEST_THREADS"
