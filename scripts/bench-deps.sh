#!/usr/bin/env bash
# System packages needed to build ferry-bench's peers. Idempotent.
#   --features iceoryx2: iceoryx2's build runs bindgen, which needs libclang
#                        (libclang-dev, clang).
#   --features zmq:      the zmq crate (0.9) links the system's libzmq, found
#                        with pkg-config (libzmq3-dev, pkg-config).
#   --features tonic:    nothing (no protoc: the service is written by hand).
#   bench memory, mpi.*: Open MPI's mpirun and mpicc, which compiles the
#                        cases' program on first use (openmpi-bin,
#                        libopenmpi-dev); without them the cases are left out.
set -euo pipefail

PACKAGES=(libclang-dev clang libzmq3-dev pkg-config openmpi-bin libopenmpi-dev)

if dpkg -s "${PACKAGES[@]}" >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update
$SUDO apt-get install -y "${PACKAGES[@]}"
