#!/usr/bin/env bash
# Prepares what tests/gpu/gpu_rdt_check.py needs on a GPU machine that has CUDA, torch and Python
# 3.12 but no libfabric, no Ray and no network (this workplace's device machines): rayfabric._fabric
# built here for Python 3.12 (.devbuild), libfabric and its libraries (.devlibs) and Ray's RDT
# interface module copied from the installed Ray (.devstub). Run after `ninja -C build`. Then, on
# the GPU machine, with those three folders carried:
#   export LD_LIBRARY_PATH=$PWD/.devlibs RAYFABRIC_BIN_DIR=$PWD/.devbuild RAYFABRIC_RAY_STUB=$PWD/.devstub
#   python3 tests/gpu/gpu_rdt_check.py --mib 256
# or all device checks at once: bash tests/gpu/device-check.sh 256
#
# LIBFABRIC_CUDA=<prefix>: also carry a libfabric built with CUDA (.devlibs/cuda, with the CUDA
# runtime it dlopens), for the FI_HMEM checks of device-check.sh. Built here (Debian's libfabric
# has no CUDA) from libfabric's v1.22.0 source with the CUDA toolkit of /usr/local/cuda:
#   ./autogen.sh && ./configure --prefix=<prefix> --with-cuda=/usr/local/cuda --enable-cuda-dlopen \
#     --disable-verbs --disable-efa --disable-psm2 --disable-psm3 --disable-opx --disable-usnic \
#     --disable-ucx --disable-lpp --disable-sm2 && make -j2 install
# (its hmem_cuda.c includes nvml.h, which the toolkit here lacks: the nvidia-nvml-dev-cu12 wheel
# has it; copy it into the source's include/.)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}  # any Python 3.12 with its headers
PYINC=$("$PY312" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
for d in .devbuild .devlibs .devstub; do grep -qx "/$d/" .git/info/exclude || echo "/$d/" >> .git/info/exclude; done
mkdir -p .devbuild/src/python .devlibs .devstub/ray/experimental/rdt
g++ -O2 -std=c++17 -shared -fPIC -fvisibility=hidden -Iinclude -Isrc -I"$PYINC" src/python/fabric_module.cc \
  build/src/fabric/librayfabric_fabric.a build/src/common/librayfabric_common.a -lfabric -pthread \
  -o .devbuild/src/python/_fabric.cpython-312-x86_64-linux-gnu.so
lib=$(ldconfig -p | awk '/libfabric.so.1 /{print $NF; exit}')
cp -L "$lib" .devlibs/
for dep in $(ldd "$lib" | awk '/=> \//{print $3}'); do
  case $(basename "$dep") in libc.so*|libm.so*|libpthread*|libdl*|ld-linux*) ;; *) cp -L "$dep" .devlibs/ ;; esac
done
if [ -n "${LIBFABRIC_CUDA:-}" ]; then
  mkdir -p .devlibs/cuda
  cp -L "$LIBFABRIC_CUDA/lib/libfabric.so.1" .devlibs/cuda/
  # libfabric dlopens "libcudart.so" (unversioned): the toolkit's runtime, under that name.
  cp -L "${CUDA_HOME:-/usr/local/cuda}/lib64/libcudart.so" .devlibs/cuda/libcudart.so
fi
ray_dir=$(python3 -c 'import os, ray; print(os.path.dirname(ray.__file__))')
touch .devstub/ray/__init__.py .devstub/ray/experimental/__init__.py .devstub/ray/experimental/rdt/__init__.py
cp "$ray_dir/experimental/rdt/tensor_transport_manager.py" .devstub/ray/experimental/rdt/
du -sh .devbuild .devlibs .devstub
