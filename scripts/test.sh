#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh), builds, and runs every test suite: unit, the
# multi-process fabric suites (tcp, sockets, shm), plasma against a real Ray, and the verbs
# suite inside a Soft-RoCE guest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
meson test -C build --print-errorlogs --num-processes 1 "$@"
