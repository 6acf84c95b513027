#!/usr/bin/env bash
# Runs ferry's multi-node tests on real network namespaces: three nodes
# (ferry-$$-1, -2, -3 for nodes a, b, c), each joined by a veth pair to a bridge in
# a fourth namespace (-br; scripts/netns-lib.sh), with addresses 10.77.0.1-3/24 that exist only
# among them: no traffic leaves. Each node gets a cluster file; the test
# (crates/ferry/tests/netns.rs) runs one team per namespace, in processes
# started with `ip netns exec`, and cuts links with `ip link set ... down`;
# the port and RPC suites run their cases with one side on node a and the
# other on node b (tests/common/pair.rs). Some teams run as pid 1 of PID
# namespaces of their own (`unshare --pid --fork`), as in containers.
#
# Needs root (CI is), iproute2 (installed if missing) and util-linux's unshare. Everything made
# here is removed on exit, failure or interrupt.
# Ends with "netns: N passed, N failed" (scripts/test.sh adds it up).
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/netns-lib.sh
if ! netns_require; then
    echo "netns: 0 passed, 1 failed"
    exit 1
fi

p="ferry-$$"
work=$(mktemp -d)
cleanup() {
    netns_down "$p"
    rm -rf "$work"
}
trap cleanup EXIT INT TERM
netns_sweep
netns_up "$p" 3

# One key for the cluster; one cluster file per node.
head -c 32 /dev/urandom >"$work/cluster.key"
i=0
for n in a b c; do
    i=$((i + 1))
    {
        echo "node $i"
        echo "listen 10.77.0.$i:7400"
        echo "key-file $work/cluster.key"
        j=0
        for m in a b c; do
            j=$((j + 1))
            [[ $m != "$n" ]] && echo "peer $j 10.77.0.$j:7400"
        done
    } >"$work/$n.cluster"
    mkdir -p "$work/$n.run"
done

# Test binaries by name (built once, quietly).
test_bin() {
    cargo test -p ferry --test "$1" --locked --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1
}
log="$work/log"
status=0
# The multi-node scenarios; the transport conformance suite with its TCP
# ends in namespaces a and b; the port and RPC suites' cases with their two
# sides on nodes a and b (each case's `two_nodes::` instance).
for run in "netns" "transport_conformance tcp_netns::" "ports two_nodes::" "rpc two_nodes::" "typed_payloads two_nodes::" "scheduler two_nodes::" "served two_nodes::" "memory two_nodes::" "fifo two_nodes::" "signal two_nodes::" "links two_nodes::" "link_stress netns::"; do
    read -r name filter <<<"$run"
    bin=$(test_bin "$name")
    FERRY_NETNS="$p" FERRY_NETNS_WORK="$work" "$bin" --ignored --test-threads=1 ${filter:+"$filter"} 2>&1 |
        tee -a "$log" || status=$?
done
awk '/^test result: / { p += $4; f += $6 } END { printf "netns: %d passed, %d failed\n", p, f }' "$log"
exit "$status"
