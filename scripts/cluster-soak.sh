#!/usr/bin/env bash
# The cluster soak (`ferry bench soak --hosts N`, issue 9 item 7): N hosts
# (network namespaces PREFIX-2 .. PREFIX-(N+1) at 10.77.0.2.., joined by a
# bridge; scripts/netns-lib.sh) of 4 teams each, names on an etcd that
# runs with the harness in PREFIX-1 (10.77.0.1), traffic of every kind
# between all teams, while the harness cuts one host's link for 8 s every
# 30 s and SIGKILLs (and starts again) a random team every 20 s. Checks
# that every operation answers or fails with a typed error within its
# deadline, that nothing is duplicated, reordered, corrupted or confirmed
# and lost, and that names converge within a lease TTL.
#
#   scripts/cluster-soak.sh [--hosts N] [--minutes M] [--json]
#
# Defaults: 8 hosts, 10 minutes. $FERRY_SOAK_PROFILE=debug runs the debug
# build instead of building the release one. Needs root (for the
# namespaces), iproute2 and etcd (Debian's etcd-server; both installed if
# missing). Ends with "soak: N passed, N failed" (1 run).
set -euo pipefail
cd "$(dirname "$0")/.."

hosts=8
minutes=10
json=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --hosts) hosts=$2; shift 2 ;;
        --minutes) minutes=$2; shift 2 ;;
        --json) json=(--json); shift ;;
        -h | --help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "cluster-soak: unknown option $1" >&2; exit 2 ;;
    esac
done

profile=${FERRY_SOAK_PROFILE:-release}
if [[ $profile == release ]]; then
    cargo build --release --locked -p ferry-cli
fi
bin=target/$profile/ferry

. scripts/netns-lib.sh
if ! netns_require; then
    echo "soak: 0 passed, 1 failed"
    exit 1
fi
command -v etcd >/dev/null || { apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null; }

p="ferry-$$"
trap 'netns_down "$p"' EXIT INT TERM
netns_sweep
netns_up "$p" $((hosts + 1))
if ip netns exec "$p-1" env FERRY_SOAK_NETNS="$p" "$bin" bench soak --hosts "$hosts" --minutes "$minutes" "${json[@]}"; then
    echo "soak: 1 passed, 0 failed"
else
    echo "soak: 0 passed, 1 failed"
    exit 1
fi
