#!/usr/bin/env bash
# Fuzzes ferry's decoders of peer input (docs/RELIABILITY.md, "Fuzzing"):
# builds the targets in fuzz/ with `cargo +nightly fuzz` (libFuzzer,
# AddressSanitizer, debug assertions and overflow checks on), then runs
# each for N seconds from its committed seed corpus (fuzz/corpus/<target>,
# only read) and what earlier runs found (fuzz/target/corpus/<target>,
# where new inputs go). Installs cargo-fuzz if missing.
#
#   scripts/fuzz.sh [--seconds N] [--runs N] [--quick] [target...]
#
# --seconds N   time per target (default 10)
# --runs N      stop a target after N executions instead (and no time
#               limit unless --seconds is given too)
# --quick       a faster build (16 codegen units, in fuzz/target-quick)
#               for short runs: scripts/test.sh uses it
# target...     some targets (default: all; `cargo +nightly fuzz list`)
#
# Prints, per target, the executions done; on a crash, libFuzzer's report
# and the input (fuzz/artifacts/<target>/crash-*), to replay with
# `cargo +nightly fuzz run <target> <file>`, then fix and keep the input in
# fuzz/regressions/<target>/ (the unit tests replay it). Exits non-zero if
# a target crashed; ends with one line: "fuzz: N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=
runs_limit=()
quick=()
targets=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --seconds) seconds=$2; shift 2 ;;
        --runs) runs_limit=(-runs="$2"); shift 2 ;;
        --quick) quick=(--codegen-units 16 --target-dir fuzz/target-quick); shift ;;
        -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
        -*) echo "fuzz: unknown option $1" >&2; exit 2 ;;
        *) targets+=("$1"); shift ;;
    esac
done

cargo +nightly --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
cargo +nightly fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked
if [[ -z $seconds ]]; then
    [[ ${#runs_limit[@]} -gt 0 ]] && seconds=0 || seconds=10
fi
[[ ${#targets[@]} -gt 0 ]] || mapfile -t targets < <(cargo +nightly fuzz list)

cargo +nightly fuzz build "${quick[@]}"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed=0
failed=0
for t in "${targets[@]}"; do
    found="fuzz/target/corpus/$t"
    mkdir -p "$found" "fuzz/corpus/$t"
    # -timeout: an input taking 10 s is a hang (a crash); -rss_limit_mb the
    # memory a run may use (ASan's included).
    if cargo +nightly fuzz run "${quick[@]}" "$t" "$found" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" "${runs_limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        status=0
    else
        status=$?
    fi
    runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 \2/p' "$log" | tail -1)
    if [[ $status -eq 0 && -n $runs ]]; then
        read -r n s <<<"$runs"
        echo "fuzz: $t: $n executions in $s s ($((n / (s > 0 ? s : 1)))/s), no crash; corpus $(ls "$found" | wc -l) found + $(ls "fuzz/corpus/$t" | wc -l) seeds"
        passed=$((passed + 1))
    else
        echo "fuzz: $t: FAILED (exit $status)"
        grep -E -m1 -A14 'panicked at|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)' "$log" || tail -40 "$log"
        crash=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
        [[ -z $crash ]] || echo "fuzz: $t: input $crash (replay: cargo +nightly fuzz run $t $crash)"
        failed=$((failed + 1))
    fi
done
echo "fuzz: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
