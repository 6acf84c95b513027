#!/usr/bin/env bash
# Runs one integration test of the ferry crate again and again until it
# fails, keeping the failing run's whole output (a flake's evidence).
#
#     scripts/repeat-test.sh TEST_FILE FILTER [RUNS] [--hog]
#     scripts/repeat-test.sh link_stress a_killed_passer 100 --hog
#
# --hog keeps one CPU busy beside it (timing flakes show more often).
# The failing output goes to target/repeat-test.log.
set -euo pipefail
cd "$(dirname "$0")/.."
file=$1 filter=$2 runs=${3:-50} hog=${4:-}
cargo test --release --locked -p ferry --test "$file" --no-run
bin=$(ls -t target/release/deps/"$file"-* | grep -v '\.d$' | head -1)
if [[ $hog == --hog ]]; then
    (while :; do :; done) &
    trap 'kill $!' EXIT
fi
for i in $(seq 1 "$runs"); do
    if ! out=$(timeout 600 "$bin" "$filter" --nocapture 2>&1); then
        printf '%s\n' "$out" >target/repeat-test.log
        echo "run $i of $runs failed: target/repeat-test.log"
        exit 1
    fi
    echo "run $i ok"
done
