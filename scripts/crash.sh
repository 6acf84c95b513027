#!/usr/bin/env bash
# The crash matrix (`ferry bench crash`, issue 9 item 1): a few teams run
# mixed traffic, one is SIGKILLed at a random moment, and each round
# checks that nothing hangs, that what was in flight toward the dead team
# fails with PeerGone (and how soon), that nothing of it is left (files,
# mappings, descriptors, names) and that no RPC ran twice. Over shared
# memory, and over TCP between nodes in network namespaces: this script
# makes them (scripts/netns-lib.sh; needs root, like `scripts/bench.sh
# tcp`) and removes them on exit: the harness and an etcd in PREFIX-1
# (10.77.0.1), the teams in PREFIX-2.. (10.77.0.2..).
#
#   scripts/crash.sh [--rounds N] [--json] [--transport shm|tcp|both] [--seed S]
#
# $FERRY_CRASH_PROFILE=debug runs the debug build (scripts/test.sh has just
# made it) instead of building the release one. Ends with "crash: N
# passed, N failed" (rounds; scripts/test.sh adds it up) and exits non-zero
# if any check failed.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=${FERRY_CRASH_PROFILE:-release}
if [[ $profile == release ]]; then
    cargo build --release --locked -p ferry-cli
fi
bin=target/$profile/ferry

. scripts/netns-lib.sh
if ! netns_require; then
    echo "crash: 0 passed, 1 failed"
    exit 1
fi
# Every other TCP round keeps its names on a real etcd (Debian's etcd-server).
command -v etcd >/dev/null || { apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null; } || true

p="ferry-$$"
trap 'netns_down "$p"' EXIT INT TERM
netns_sweep
# The harness's namespace and four nodes' (--teams may be up to 4).
netns_up "$p" 5
ip netns exec "$p-1" env FERRY_CRASH_NETNS="$p" FERRY_CRASH_NODES=4 "$bin" bench crash "$@"
