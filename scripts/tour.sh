#!/usr/bin/env bash
# Builds ferry and runs its tour: every primitive across two processes,
# with what each costs.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p ferry-cli
exec target/release/ferry tour "$@"
