#!/usr/bin/env bash
# Every GPU check of the RAYFABRIC tensor transport, in one run on a GPU machine (after
# `LIBFABRIC_CUDA=<prefix> bash tests/gpu/prepare-device.sh` here, with .devbuild, .devlibs and
# .devstub carried there). Three libfabric setups, each with the path CUDA tensors must take:
#   1. libfabric 1.22 built with CUDA, shm provider (FI_HMEM): CUDA memory registered as it is and
#      read GPU to GPU, CPU to GPU and GPU to CPU without a host copy in rayfabric (--expect device);
#   2. the same libfabric, tcp (no FI_HMEM): staged through pinned host memory (--expect staged);
#   3. Debian's libfabric 1.17 (no CUDA), shm: FI_HMEM offered but CUDA registration refused: the
#      transport says why once and stages instead, bytes still identical (--expect fallback).
# shm is a same-host provider whose keys are not checked: RAYFABRIC_ALLOW_UNPROTECTED_MEMORY is set
# for it here only (the agent and the transport refuse it otherwise).
#   bash tests/gpu/device-check.sh [MiB]
set -uo pipefail
cd "$(dirname "$0")/../.."
export RAYFABRIC_BIN_DIR=$PWD/.devbuild RAYFABRIC_RAY_STUB=$PWD/.devstub PYTHONUNBUFFERED=1
export RAYFABRIC_LOG_LEVEL=${RAYFABRIC_LOG_LEVEL:-warn}
mib=${1:-256}
step_s=${STEP_TIMEOUT_S:-150}  # each setup, bounded: a hang fails it instead of the run
# libfabric dlopens "libcuda.so" (unversioned): the driver's libcuda.so.1 under that name.
driver=$(mktemp -d)
libcuda=$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')
[ -n "$libcuda" ] && ln -s "$libcuda" "$driver/libcuda.so"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
rc=0
echo "== 1. libfabric 1.22 with CUDA, shm (FI_HMEM): CUDA memory registered directly"
# rayfabric's default environment (the MR cache's monitors off, not FI_MR_CACHE_MAX_COUNT=0)
# leaves shm's CUDA IPC cache able to open (docs/rdt.md, GPU tensors).
LD_LIBRARY_PATH=$PWD/.devlibs/cuda:$driver RAYFABRIC_PROVIDER=shm RAYFABRIC_ALLOW_UNPROTECTED_MEMORY=true \
  FI_LOG_LEVEL=${CASE1_FI_LOG_LEVEL:-warn} timeout -k 5 "$step_s" python3 tests/gpu/gpu_rdt_check.py --mib "$mib" --expect device || rc=1
echo "== 2. libfabric 1.22 with CUDA, tcp (no FI_HMEM): staged through pinned host memory"
LD_LIBRARY_PATH=$PWD/.devlibs/cuda:$driver \
  timeout -k 5 "$step_s" python3 tests/gpu/gpu_rdt_check.py --mib "$mib" --expect staged || rc=1
echo "== 3. Debian's libfabric 1.17 (no CUDA), shm: CUDA registration refused, staged instead"
LD_LIBRARY_PATH=$PWD/.devlibs RAYFABRIC_PROVIDER=shm RAYFABRIC_ALLOW_UNPROTECTED_MEMORY=true \
  timeout -k 5 "$step_s" python3 tests/gpu/gpu_rdt_check.py --mib 16 --expect fallback || rc=1
echo "device-check: $([ $rc = 0 ] && echo PASS || echo FAIL)"
exit $rc
