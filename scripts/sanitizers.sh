#!/usr/bin/env bash
# Runs ferry's tests under sanitizers (docs/RELIABILITY.md, "Sanitizers"):
# AddressSanitizer (and LeakSanitizer) over the tests whose teams are
# separate processes (each child is the same instrumented test binary), the
# transport conformance suite and the unit tests; ThreadSanitizer over the
# tests whose teams all live in this process (one team, two teams of one
# process, the conformance suite's pairs) and the unit tests. Nightly
# `-Zsanitizer` with the prebuilt std, which is not instrumented
# (`-Cunsafe-allow-abi-mismatch=sanitizer`), for x86_64-unknown-linux-gnu
# named explicitly so that build scripts and proc macros are built without
# it; opt-level 1 (debug assertions on). Builds in target/asan and
# target/tsan. The tests that need root and network namespaces
# (scripts/netns-test.sh) are not run.
#
#   scripts/sanitizers.sh [asan|tsan|both]     (default: both)
#
# A few tests are skipped, each for a reason given below (timing bounds a
# sanitizer's slowdown breaks). No suppressions. A sanitizer's report fails the
# run even where its test passed (a child process's report may not fail
# its test): it counts as one failure. Ends with one line: "sanitizers: N
# passed, N failed"; exits non-zero if anything failed.
set -euo pipefail
cd "$(dirname "$0")/.."

which=${1:-both}
case $which in
    asan | tsan | both) ;;
    -h | --help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "sanitizers: asan, tsan or both, not $which" >&2; exit 2 ;;
esac

target=x86_64-unknown-linux-gnu
cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
# The etcd name plane's tests start a real etcd (Debian's etcd-server).
command -v etcd >/dev/null || { apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null; }

log=$(mktemp)
bins=$(mktemp)
trap 'rm -f "$log" "$bins"' EXIT
status=0

# Builds ferry's test binaries with sanitizer $1 into target/$2, with
# cargo's extra arguments $3..., and lists them in $bins, one "name path" a
# line (the unit tests' name: ferry). `--cfg rustix_use_libc`: rustix
# calls the C library instead of making system calls itself, so that the
# sanitizers' interceptors see them (mmap and munmap, reads into buffers,
# reads and writes of descriptors, which ThreadSanitizer takes as
# synchronisation).
build() {
    local san=$1 dir=$2
    shift 2
    RUSTFLAGS="-Zsanitizer=$san ${SAN_RUSTFLAGS:-} -Cforce-frame-pointers=yes --cfg rustix_use_libc" \
        CARGO_PROFILE_DEV_OPT_LEVEL=1 \
        cargo +nightly test "$@" -p ferry --locked --target "$target" --target-dir "target/$dir" \
        --no-run --message-format=json |
        sed -n 's/.*"target":{[^}]*"name":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2/p' >"$bins"
}

# Runs test binary $1 with libtest's arguments $2... (filters, --skip).
run() {
    local name=$1 bin
    shift
    bin=$(awk -v n="$name" '$1 == n { print $2 }' "$bins" | tail -1)
    echo "sanitizers: $name $*"
    "$bin" --test-threads=2 "$@" 2>&1 | tee -a "$log" || status=1
}

if [[ $which == asan || $which == both ]]; then
    # The prebuilt std (not instrumented: ASan misses what std itself
    # gets wrong, and reports nothing false for it).
    SAN_RUSTFLAGS=-Cunsafe-allow-abi-mismatch=sanitizer build address asan
    # A small quarantine (freed memory ASan holds back to catch uses after
    # free; 256 MiB by default): the hostile-peer test bounds the victim's
    # RSS growth, which the default quarantine alone exceeds.
    export ASAN_OPTIONS="detect_leaks=1:quarantine_size_mb=16"
    run ferry
    # 10 000 frames over TCP within 10 s: under ASan, with other jobs on the
    # machine, the TCP ends (and TLS's more so) do not always make it.
    run transport_conformance --skip tcp::ordered_no_loss_no_duplicates_across_threads \
        --skip tls::ordered_no_loss_no_duplicates_across_threads
    # Each case with its two sides in two processes.
    run ports two_processes::
    run rpc two_processes::
    for t in cross_process hostile kept_senders node_leftovers limits liveness channel_leak \
        identity restart shutdown team wakeups etcd; do
        run "$t"
    done
    # The 1 GiB messages take minutes under ASan; the 64 MiB ones run the
    # same code.
    run large_messages --skip _1_gib_
    unset ASAN_OPTIONS
fi

if [[ $which == tsan || $which == both ]]; then
    # std built with the sanitizer (-Zbuild-std, from the rust-src
    # component): the prebuilt one's synchronisation is invisible to
    # ThreadSanitizer (Arc's release of its last reference is a fence,
    # which TSan does not model; libtest's channels and std's locks are not
    # instrumented), so it reported std's own hand-overs as races, 40 in
    # the unit tests alone.
    rustup component list --toolchain nightly --installed | grep -q '^rust-src' ||
        rustup component add rust-src --toolchain nightly
    build thread tsan -Zbuild-std
    run ferry
    run transport_conformance
    run ports --skip two_processes::
    run rpc --skip two_processes::
    run bounds
    for t in async_send cluster retry tls smoke; do
        run "$t"
    done
fi

# Reports: AddressSanitizer's and LeakSanitizer's "ERROR:", ThreadSanitizer's
# "WARNING:" (a data race, a lock-order inversion...).
reports=$(grep -cE '^(==[0-9]+==ERROR: (Address|Leak)Sanitizer|WARNING: ThreadSanitizer)' "$log" || true)
[[ $reports -eq 0 ]] || status=1
awk -v r="$reports" '
    /^test result: / { p += $4; f += $6 }
    END { printf "sanitizers: %d passed, %d failed\n", p, f + r }
' "$log"
exit "$status"
