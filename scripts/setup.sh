#!/usr/bin/env bash
# Installs everything rayfabric needs on a fresh Debian 12 machine (as root, or with sudo) and
# builds it into ./build. Safe to run again: it skips what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

DEB_PKGS=(build-essential meson ninja-build pkg-config
          libfabric-dev libfabric-bin libibverbs-dev ibverbs-providers
          libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
          libflatbuffers-dev flatbuffers-compiler libgtest-dev libgmock-dev
          python3-pip pybind11-dev
          nftables)  # nftables: the netns tests make one fabric endpoint unreachable
missing=()
for p in "${DEB_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python side: the pinned Ray release (the plasma protocol is checked against it) and test tools.
PY=${PYTHON:-python3}
RAY_VERSION=$(cat python/RAY_VERSION)
if ! $PY -c "import ray, sys; sys.exit(ray.__version__ != '$RAY_VERSION')" 2>/dev/null ||
   ! $PY -c "import numpy, pandas, pyarrow, pytest, matplotlib" 2>/dev/null; then
  # ray[data]: Ray Data's iterator, whose prefetching ray.wait the tests run for real.
  echo "[setup] pip install ray[default,data]==$RAY_VERSION numpy pandas pytest matplotlib"
  PYTHON=$PY bash scripts/pip-install.sh -q "ray[default,data]==$RAY_VERSION" numpy pandas pytest matplotlib
fi
# torch: the RDT tests and `rayfabric bench tensors` (Ray Direct Transport moves torch tensors).
# RAYFABRIC_NO_TORCH=1 skips it (~3 GB with its CUDA libraries); those tests then say they skipped.
if [ "${RAYFABRIC_NO_TORCH:-0}" != 1 ] && ! $PY -c "import torch" 2>/dev/null; then
  echo "[setup] pip install torch"
  PYTHON=$PY bash scripts/pip-install.sh -q torch
fi

# Peer transfer engines for bench/peer_engines.py (issue 32), binary wheels: Mooncake Transfer
# Engine (its non-CUDA build) and NIXL (nixl-cu12: its UCX backend runs without a GPU; it needs
# torch). Best effort: a machine where they do not install still builds and tests, and the bench
# says why it skipped them.
if ! $PY -c "import mooncake.engine" 2>/dev/null; then
  echo "[setup] pip install mooncake-transfer-engine-non-cuda"
  PYTHON=$PY bash scripts/pip-install.sh -q "mooncake-transfer-engine-non-cuda==0.3.13.post1" ||
    echo "[setup] mooncake-transfer-engine-non-cuda did not install: bench/peer_engines.py skips it"
fi
if $PY -c "import torch" 2>/dev/null && ! $PY -c "import nixl_cu12" 2>/dev/null; then
  echo "[setup] pip install nixl-cu12"
  PYTHON=$PY bash scripts/pip-install.sh -q "nixl-cu12==1.5.1" ||
    echo "[setup] nixl-cu12 did not install: bench/peer_engines.py skips it"
fi

# rayfabric._fabric is built for the Python that runs Ray here.
PY_EXE=$($PY -c 'import sys; print(sys.executable)')
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release -Dpython_interpreter="$PY_EXE"
fi
ninja -C build
