#!/usr/bin/env bash
# README's main job: sets up a fresh machine, builds, then
#  1. the demo: moves a 1 GiB numpy array between the two nodes of a local Ray cluster both ways,
#     through Ray's own path and through rayfabric (arguments go to the demo);
#  2. `rayfabric bench --quick`: Ray vs rayfabric side by side on one object (1M, 64M, 256M), 200
#     objects, fan-out and fan-in, next to the raw fabric ceiling of the same run (well under 2
#     minutes); table on stdout, JSON and PNG plots in build/bench-quick/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
out="$PWD/build/bench-quick"
mkdir -p "$out"
cd python
demo_rc=0
python3 -m rayfabric.demo "$@" || demo_rc=$?
bench_rc=0
python3 -m rayfabric bench --quick --json "$out/bench.json" --plots "$out" || bench_rc=$?
if [ "$demo_rc" != 0 ] || [ "$bench_rc" != 0 ]; then
  echo "demo.sh: demo exit status $demo_rc, bench exit status $bench_rc" >&2
  exit 1
fi
