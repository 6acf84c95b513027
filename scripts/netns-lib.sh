# Network namespaces for ferry's multi-node tests and benchmarks (sourced).
# `netns_up PREFIX N` makes namespaces PREFIX-1 .. PREFIX-N, each with an
# eth0 at 10.77.0.<i>/24 joined through a bridge in PREFIX-br; the
# addresses exist only among them, so no traffic leaves. `netns_down
# PREFIX` removes them all; callers trap it on EXIT INT TERM. Needs root
# and iproute2 (installed if missing).

netns_require() {
    if [[ $(id -u) != 0 ]]; then
        echo "needs root to make network namespaces" >&2
        return 1
    fi
    command -v ip >/dev/null || { apt-get update -qq && apt-get install -y -qq iproute2 >/dev/null; }
}

netns_down() {
    local p=$1 ns
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^$p-" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
}

# Removes the namespaces of runs that were killed (their pid is gone).
netns_sweep() {
    local ns pid
    for ns in $(ip netns list | awk '{print $1}' | grep -E '^ferry-[0-9]+-' || true); do
        pid=${ns#ferry-}
        pid=${pid%%-*}
        kill -0 "$pid" 2>/dev/null || ip netns del "$ns" 2>/dev/null || true
    done
}

netns_up() {
    local p=$1 n=$2 i
    ip netns add "$p-br"
    ip -n "$p-br" link add br0 type bridge
    ip -n "$p-br" link set br0 up
    ip -n "$p-br" link set lo up
    for i in $(seq 1 "$n"); do
        ip netns add "$p-$i"
        ip link add "fv$$-$i" type veth peer name "fw$$-$i"
        ip link set "fv$$-$i" netns "$p-$i"
        ip link set "fw$$-$i" netns "$p-br"
        ip -n "$p-br" link set "fw$$-$i" master br0 up
        ip -n "$p-$i" link set "fv$$-$i" name eth0
        ip -n "$p-$i" addr add "10.77.0.$i/24" dev eth0
        ip -n "$p-$i" link set eth0 up
        ip -n "$p-$i" link set lo up
    done
}
