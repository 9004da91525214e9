#!/usr/bin/env bash
# Sets up a fresh machine (scripts/setup.sh), builds, and runs every test suite: unit, the
# multi-process fabric suites (tcp, sockets, shm), plasma against a real Ray, and the verbs
# suite inside a Soft-RoCE guest. Afterwards the host must be as the run found it: the settings
# tests change for themselves (a sysctl, hugepages, network namespaces, Ray's ~/.ray/auth_token
# that a new local ray.init() leaves behind) are compared before and after, and a difference
# fails the run with what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

host_state() {
    echo "~/.ray/auth_token: $([ -e "$HOME/.ray/auth_token" ] && echo present || echo absent)"
    echo "net.ipv4.tcp_allowed_congestion_control: $(cat /proc/sys/net/ipv4/tcp_allowed_congestion_control 2>/dev/null)"
    echo "vm.nr_hugepages: $(cat /proc/sys/vm/nr_hugepages 2>/dev/null)"
    echo "network namespaces: $(ip netns list 2>/dev/null | awk '{print $1}' | sort | tr '\n' ' ')"
}

# A rayfabric installed on this host (scripts/demo.sh installs one) turns transparent mode on in
# every Ray job of a cluster with agents: the suite's Ray-alone baselines must stay Ray's. The
# tests of that start-up hook turn it back on for their own clusters.
export RAYFABRIC_AUTOLOAD=0

before=$(host_state)
rc=0
meson test -C build --print-errorlogs --num-processes 1 "$@" || rc=$?
after=$(host_state)
if [ "$before" != "$after" ]; then
    echo "scripts/test.sh: the tests changed this host and did not set it back:" >&2
    diff <(echo "$before") <(echo "$after") | sed -n 's/^</  before:/p; s/^>/  after: /p' >&2
    [ "$rc" -ne 0 ] || rc=1
fi
exit "$rc"
