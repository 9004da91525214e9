#!/usr/bin/env bash
# The plasma tests and one cross-node rayfabric.get under the OLDEST Ray release the package
# declares (python/RAY_OLDEST), in a virtual environment of its own (it sees the system's packages,
# its own Ray shadows the system's newest one). Usage: oldest_ray.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1 src=$2
oldest=$(cat "$src/python/RAY_OLDEST")
venv="$build/venv-ray-$oldest"
if ! "$venv/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$oldest')" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q "ray[default]==$oldest"
fi
export RAYFABRIC_BIN_DIR="$build" PYTHONPATH="$src/python" RAYFABRIC_PLASMA_TOOL="$build/src/plasma/rayfabric-plasma-tool"
cd "$src"
"$venv/bin/python" -c "import ray; print('Ray', ray.__version__, 'from', ray.__file__)"
exec "$venv/bin/python" -m pytest -q -s -p no:cacheprovider tests/plasma/test_plasma_real_ray.py tests/agent/test_ray_versions.py
