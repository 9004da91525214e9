#!/usr/bin/env bash
# README's main job: sets up a fresh machine and builds (scripts/setup.sh), installs the package
# from this checkout (`pip install .`: meson builds the agent and the tools into it, several minutes
# on a small machine), then runs the installed `rayfabric` command from an empty folder outside
# the checkout, so that nothing comes from PYTHONPATH or build/:
#  1. `rayfabric demo`: moves a 1 GiB numpy array between the two nodes of a local Ray cluster
#     both ways, through Ray's own path and through rayfabric (arguments go to the demo, e.g.
#     --size-mb 64);
#  2. `rayfabric bench --quick`: Ray vs rayfabric side by side on one object (1M, 64M, 256M), 200
#     objects, fan-out and fan-in, next to the raw fabric ceiling of the same run (well under 2
#     minutes); table on stdout, JSON and PNG plots in build/bench-quick/ of this checkout.
# PYTHON: the Python to install into and run with (default python3, as scripts/setup.sh).
set -euo pipefail
if [ "${1:-}" = -h ] || [ "${1:-}" = --help ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
  echo "Demo options (after setup, \`rayfabric demo --help\`): --size-mb N (1024), --provider P, --json FILE"
  exit 0
fi
cd "$(dirname "$0")/.."
repo=$PWD
bash scripts/setup.sh
PY=${PYTHON:-python3}
echo "[demo] pip install $repo (builds the agent and the tools into the package)"
PYTHON=$PY bash scripts/pip-install.sh -q "$repo"

# The console script pip installed for this Python: its scripts folder (or the user one, where pip
# fell back to a user install), else the first `rayfabric` on PATH.
rayfabric=$($PY - <<'PYEOF'
import os, shutil, sysconfig
for d in (sysconfig.get_path("scripts"), sysconfig.get_path("scripts", f"{os.name}_user")):
    if os.access(os.path.join(d, "rayfabric"), os.X_OK):
        print(os.path.join(d, "rayfabric"))
        break
else:
    print(shutil.which("rayfabric") or "")
PYEOF
)
if [ -z "$rayfabric" ]; then
  echo "demo.sh: pip installed rayfabric but no \`rayfabric\` command was found for $PY" >&2
  exit 1
fi

out="$repo/build/bench-quick"
mkdir -p "$out"
work=$(mktemp -d -t rayfabric-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$work"
unset PYTHONPATH RAYFABRIC_BIN_DIR
echo "[demo] $rayfabric (in $work)"
demo_rc=0
"$rayfabric" demo "$@" || demo_rc=$?
bench_rc=0
"$rayfabric" bench --quick --json "$out/bench.json" --plots "$out" || bench_rc=$?
if [ "$demo_rc" != 0 ] || [ "$bench_rc" != 0 ]; then
  echo "demo.sh: demo exit status $demo_rc, bench exit status $bench_rc" >&2
  exit 1
fi
