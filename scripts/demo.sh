#!/usr/bin/env bash
# README's main job: sets up a fresh machine, builds, then moves a 1 GiB numpy array between the
# two nodes of a local Ray cluster both ways, through Ray's own path and through rayfabric.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd python && exec python3 -m rayfabric.demo "$@"
