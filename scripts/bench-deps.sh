#!/usr/bin/env bash
# System packages needed to build ferry-bench with `--features iceoryx2`
# (iceoryx2's build runs bindgen, which needs libclang). Idempotent.
set -euo pipefail

if dpkg -s libclang-dev clang >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update
$SUDO apt-get install -y libclang-dev clang
