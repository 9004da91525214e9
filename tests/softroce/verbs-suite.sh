#!/bin/bash
# verbs-suite.sh BUILD_DIR - rayfabric's real-RDMA test suite (meson suite `verbs`).
#
# Boots ONE throw-away QEMU guest with Soft-RoCE (run-in-guest.sh beside this file:
# Debian's 6.1 kernel, rdma_rxe, always SOFTROCE_RAILS=2: rxe0 on 10.77.0.1 and rxe1 on
# 10.77.0.2 (veth0/veth1), rxe2 on 10.77.1.1 and rxe3 on 10.77.1.2 (veth2/veth3); node A =
# rxe0 + rxe2, node B = rxe1 + rxe3, for multi-rail checks) and runs inside it, in order:
#   fi_info        `fi_info -p verbs` must list domains rxe0 and rxe1 (and rxe2, rxe3
#                  when the guest has 2 rails)
#   fi_pingpong    `fi_pingpong -p "verbs;ofi_rxm" -e rdm -c` (data checks), server on
#                  rxe0, client on rxe1 -> 10.77.0.1: a smoke test of the guest itself
#   doctor         python/rayfabric/tools/doctor.py must find RDMA usable in the guest, and the
#                  engine (BUILD_DIR's rayfabric-fabric-info) must choose verbs;ofi_rxm
#   PROJECT_CHECKS the project's binaries from BUILD_DIR (list below). A binary that does
#                  not exist FAILS ("missing"); it is never skipped. Each one must print
#                  "provider verbs;ofi_rxm" (the engine's `rayfabric: provider ... domain
#                  ...` line) and no "provider <other> domain ..." line, or it fails.
# Exit: 0 all passed; 1 a check failed (or the guest timed out / died mid-suite);
#       2 usage; 77 (meson "skip") only when the guest could not start at all AND
#       RAYFABRIC_SKIP_VERBS=1. Without that variable a guest that cannot start is a
#       loud failure.
#
# Needs: root, Debian 12, the Debian archive reachable (first run installs qemu etc. and
# downloads the kernel into the cache), ~2.5 GiB RAM free. No RDMA hardware, no KVM.
#
# Environment:
#   RAYFABRIC_SKIP_VERBS=1  turn "guest cannot start" (no root, no QEMU, no kernel package,
#                           apt failure...) into exit 77 = skipped, with a SKIPPED banner.
#                           Failures of checks inside a guest that did start never skip.
#   VERBS_GTEST_FILTER      gtest filter for fabric_process_test's main run (default: all but
#                           the two that fabric_rails and mixed_fabrics run)
#   VERBS_BENCH_ITERS       rayfabric-bench --iters (default 3)
#   GUEST_TIMEOUT           whole-guest limit in seconds (default 720, bounds the suite
#                           < 10 min incl. boot); per-check limits are clamped to what is left
#   FI_UNIVERSE_SIZE        passed through if set; otherwise 64 in the guest (rxm's CQ
#                           sizing exceeds rxe's max_cqe with the default 256)
#   FI_LOG_LEVEL, FI_LOG_PROV, RAYFABRIC_LOG*  passed through to the guest if set
#   VERBS_KEEP=1            keep the per-run work dir (check logs) instead of deleting it
#   VERBS_AGENT=1           also run agent_verbs (2-node Ray + agents, plasma object over
#                           verbs; ~10 min more: GUEST_TIMEOUT defaults to 1500, GUEST_MEM 4G)
#   VERBS_PYTHON            interpreter with Ray for agent_verbs (default: python3 on PATH)
#   SOFTROCE_CACHE, GUEST_MEM, GUEST_CPUS, SOFTROCE_NO_INSTALL, SOFTROCE_VERBOSE: see
#                           run-in-guest.sh
set -uo pipefail

# ============================================================== the project's checks
# One entry per check: NAME|TIMEOUT_SECONDS|BINARY|COMMAND
#   BINARY  path relative to BUILD_DIR; must exist and be executable, or the check FAILS
#   COMMAND bash command line run in the guest; $BIN is the binary's absolute path,
#           $BUILD_DIR the build dir; FI_UNIVERSE_SIZE and VERBS_GTEST_FILTER are set.
# Timeouts are guest seconds (the guest is ~16-23x slower than the host; rxe moves
# ~2-10 MB/s). The guest has GUEST_MEM (2G) of RAM and no swap: cap test sizes
# (fabric_process_test defaults to 1 GiB transfers = 2 GiB of buffers: OOM-killed).
# To add a check, add a line here.
PROJECT_CHECKS=(
  'fabric_process_test|330|tests/fabric/fabric_process_test|RAYFABRIC_PROVIDER="verbs;ofi_rxm" RAYFABRIC_TEST_DOMAINS=rxe0,rxe1 RAYFABRIC_TEST_MAX_BYTES=${RAYFABRIC_TEST_MAX_BYTES:-67108864} RAYFABRIC_CHUNK_SIZE=${RAYFABRIC_CHUNK_SIZE:-256K} RAYFABRIC_OP_TIMEOUT_MS=${RAYFABRIC_OP_TIMEOUT_MS:-120000} RAYFABRIC_TEST_TIME_SCALE=${RAYFABRIC_TEST_TIME_SCALE:-8} "$BIN" --gtest_filter="$VERBS_GTEST_FILTER"'
  'stale_key_no_mr_cache|90|tests/fabric/fabric_process_test|out=$(FI_MR_CACHE_MAX_COUNT=0 RAYFABRIC_PROVIDER="verbs;ofi_rxm" RAYFABRIC_TEST_DOMAINS=rxe0,rxe1 "$BIN" --gtest_filter="*ReportsTheProviderItUses:*StaleKeyAfterDeregistrationFails:*ReadOnlyRegionRefusesWrites" 2>&1); rc=$?; printf "%s\n" "$out"; [ "$rc" = 0 ] || exit "$rc"; grep -q "deregistration_revokes_keys=1 mr_cache=0" <<<"$out" || { echo "!!! FI_MR_CACHE_MAX_COUNT=0 but the profile does not say deregistration revokes keys"; exit 1; }; grep -q "enforces_access=1" <<<"$out" || { echo "!!! FI_MR_CACHE_MAX_COUNT=0 but the profile does not say access is enforced (a read-only region refuses writes)"; exit 1; }'
  'mr_cache_monitors_off|90|tests/fabric/fabric_process_test|out=$(FI_MR_CACHE_MONITOR=disabled FI_MR_CUDA_CACHE_MONITOR_ENABLED=0 FI_MR_ROCR_CACHE_MONITOR_ENABLED=0 FI_MR_ZE_CACHE_MONITOR_ENABLED=0 RAYFABRIC_PROVIDER="verbs;ofi_rxm" RAYFABRIC_TEST_DOMAINS=rxe0,rxe1 "$BIN" --gtest_filter="*ReportsTheProviderItUses:*StaleKeyAfterDeregistrationFails:*ReadOnlyRegionRefusesWrites" 2>&1); rc=$?; printf "%s\n" "$out"; [ "$rc" = 0 ] || exit "$rc"; grep -q "deregistration_revokes_keys=1 mr_cache=0" <<<"$out" || { echo "!!! monitors off (the launcher default) but the profile does not say deregistration revokes keys"; exit 1; }; grep -q "enforces_access=1" <<<"$out" || { echo "!!! monitors off (the launcher default) but the profile does not say access is enforced"; exit 1; }'
  'fabric_rails|150|tests/fabric/fabric_process_test|out=$(RAYFABRIC_PROVIDER="verbs;ofi_rxm" RAYFABRIC_TEST_DOMAINS=rxe0,rxe1 RAYFABRIC_TEST_RAILS="rxe0,rxe2;rxe1,rxe3" RAYFABRIC_TEST_MAX_BYTES=16777216 RAYFABRIC_CHUNK_SIZE=${RAYFABRIC_CHUNK_SIZE:-256K} RAYFABRIC_OP_TIMEOUT_MS=${RAYFABRIC_OP_TIMEOUT_MS:-120000} "$BIN" --gtest_filter="*StripedReadMovesEachStripeOnItsOwnRail" 2>&1); rc=$?; printf "%s\n" "$out"; [ "$rc" = 0 ] || exit "$rc"; for d in rxe0 rxe1 rxe2 rxe3; do grep -q "provider verbs;ofi_rxm domain $d" <<<"$out" || { echo "!!! no engine on $d: the stripes did not use both rxe pairs"; exit 1; }; done'
  'mixed_fabrics|150|tests/fabric/fabric_process_test|out=$(RAYFABRIC_TEST_MIXED="verbs;ofi_rxm,tcp;ofi_rxm@rxe0|tcp;ofi_rxm|tcp;ofi_rxm verbs;ofi_rxm,tcp;ofi_rxm@rxe0|verbs;ofi_rxm,tcp;ofi_rxm@rxe1|verbs;ofi_rxm" RAYFABRIC_CHUNK_SIZE=${RAYFABRIC_CHUNK_SIZE:-256K} RAYFABRIC_OP_TIMEOUT_MS=${RAYFABRIC_OP_TIMEOUT_MS:-120000} "$BIN" --gtest_filter="*MixedNodesReadOverTheBestProviderTheyShare" 2>&1); rc=$?; printf "%s\n" "$out"; [ "$rc" = 0 ] || exit "$rc"; grep -q "^mixed: verbs;ofi_rxm,tcp;ofi_rxm with tcp;ofi_rxm: read .* over tcp;ofi_rxm" <<<"$out" && grep -q "^mixed: verbs;ofi_rxm,tcp;ofi_rxm with verbs;ofi_rxm,tcp;ofi_rxm: read .* over verbs;ofi_rxm (rxe0 -> rxe1)" <<<"$out" || { echo "!!! the pairs did not use tcp (verbs+tcp with tcp only) and verbs (two verbs nodes)"; exit 1; }'
  'rayfabric-bench|150|bench/rayfabric-bench|RAYFABRIC_CHUNK_SIZE=${RAYFABRIC_CHUNK_SIZE:-256K} RAYFABRIC_BENCH_SERVER_DOMAIN=rxe1 "$BIN" --provider "verbs;ofi_rxm" --domain rxe0 --sizes 4K,1M,64M --verify --iters ${VERBS_BENCH_ITERS:-3}'
)
# mr_cache_monitors_off: the same three tests in the environment rayfabric's launcher and RDT
# transport give by default (launch_env.MR_CACHE_OFF: the cache's memory monitors off, not a zero
# count, which would also keep shm's CUDA IPC cache from opening): verbs must register directly.
# stale_key_no_mr_cache also runs ReadOnlyRegionRefusesWrites without the cache: verbs must then
# refuse a write through a read-only descriptor (with the cache on, libfabric 1.17 registers every
# region writable and the main run checks that the profile says so).
# fabric_process_test: with libfabric's MR cache on (the default), StaleKeyAfterDeregistrationFails
# checks that the provider profile says so (mr_cache=1, deregistration_revokes_keys=0) and that
# the stale read indeed still succeeds; stale_key_no_mr_cache runs it again with
# FI_MR_CACHE_MAX_COUNT=0 (the user's switch; rayfabric never sets FI_* itself), where the profile
# must say keys are revoked and the stale read must fail.
# RAYFABRIC_OP_TIMEOUT_MS=120000: ConcurrentTransfersFromSeveralPeers reads 3 x 64 MiB at once,
# sharing rxe's ~6-10 MB/s: 29 s alone in the guest (2 Dec 2026), against the engine's default
# 30 s per-transfer op_timeout, so it failed (50 s, Wait() not ok) in two suite runs in a row under
# host load. The fault tests set their own 4 s timeout and are not affected.
# RAYFABRIC_TEST_MAX_BYTES=64 MiB: reads/writes of 64 MiB, byte-checked (~0.4 GiB of buffers at
# peak, in ConcurrentTransfersFromSeveralPeers: fits the 2 GiB guest).
# rayfabric-bench: --iters 3 because its default (2 GiB / size, 3..2000 per size: ~4 GiB in
# all) takes > 5 min at rxe's ~15 MB/s; server on rxe1, client on rxe0 so that the bytes
# cross the veth pair (without it both ends use rxe0, rxe's internal loopback).
# RAYFABRIC_CHUNK_SIZE=256K: rxe cannot do RDMA READs of >= 1 MiB in this guest (ib_read_bw
# -s 1048576 never completes; completer retries), and the engine's 4 MiB default chunk
# crawls at 0.45 MB/s and times out; 256 KiB chunks read at ~11 MB/s. Drop it once the
# engine picks a small chunk for rxe itself. (A value set by the user wins.)
# Opt-in, VERBS_AGENT=1: agent_verbs = tests/softroce/agent-verbs.sh, a 2-node Ray cluster in the
# guest, one rayfabricd per node (node A on rxe0, node B on rxe1), a 16 MiB numpy plasma object
# made on A and rayfabric.get() on B over verbs;ofi_rxm (sha256 and bytes_pulled checked). NOT in
# the default suite: Ray alone needs ~6-7 min of this guest (every Ray process imports ray in
# ~50 s under TCG; measured 578 s for the check, 700 s guest), which does not fit the 10-minute
# suite. With VERBS_AGENT=1, GUEST_TIMEOUT defaults to 1500 and GUEST_MEM to 4G.
if [ "${VERBS_AGENT:-0}" = 1 ]; then
  PROJECT_CHECKS+=('agent_verbs|900|src/agent/rayfabricd|"$SOURCE_ROOT/tests/softroce/agent-verbs.sh" "$BUILD_DIR"')
fi
# fabric_rails: two rxe devices per side (rxe0+rxe2 here, rxe1+rxe3 in the peer process, on two
# veth pairs: SOFTROCE_RAILS=2), one read striped across both pairs, every byte and each rail's
# share checked. mixed_fabrics: a verbs+tcp process reads from a tcp-only one (over tcp) and from a
# verbs+tcp one (over verbs, rxe0 -> rxe1), as two agents pair up; it alone may print tcp lines.
# Both run outside fabric_process_test's main run (VERBS_GTEST_FILTER's default leaves them out).
# Every project check must report this provider (substring "provider <this>"); mixed_* checks may
# report others too.
EXPECTED_PROVIDER='verbs;ofi_rxm'
# fi_pingpong message sizes (one server/client pair per size). 1 MiB takes ~46 s on
# rxe (rxm large-message path, 0.45 MB/s) against ~0.1 s for 64 KiB, so it is left out.
PINGPONG_SIZES=${PINGPONG_SIZES:-"64 4096 65536"}
# ==================================================================================

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SELF="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
SOURCE_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)

bar() { printf '%s\n' "########################################################################"; }

# ------------------------------------------------------------------ guest side
guest_up() { local u; read -r u _ </proc/uptime; printf '%s' "$u"; }
guest_say() { printf '\n=== [guest %6ss] %s\n' "$(guest_up)" "$*"; }

# record STATUS NAME SECONDS DETAIL
record() {
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$RESULTS"
    printf '=== %s %s (%ss)%s\n' "$1" "$2" "$3" "${4:+: $4}"
}

# Seconds the next check may use: its own limit, clamped to the guest budget.
budget_for() {
    local want=$1 up left
    up=$(guest_up); up=${up%.*}
    left=$(( GUEST_BUDGET - up - 5 ))
    if [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi
}

# run_logged NAME LIMIT LOG CMD : runs bash -c CMD under timeout, output to LOG and
# (indented) to stdout; sets RC and SECS.
run_logged() {
    local name=$1 limit=$2 log=$3 cmd=$4 t0 t1
    t0=$(guest_up)
    timeout -k 5 "$limit" bash -c "$cmd" </dev/null 2>&1 | tee "$log" | sed -u 's/^/  | /'
    RC=${PIPESTATUS[0]}
    t1=$(guest_up)
    SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
}

check_fi_info() {
    local limit; limit=$(budget_for 60)
    local want="" k
    for ((k = 0; k < 2 * ${SOFTROCE_RAILS:-1}; k++)); do want="$want rxe$k"; done
    guest_say "CHECK fi_info: fi_info -p verbs (want domains$want) [limit ${limit}s]"
    if [ "$limit" -le 0 ]; then record FAIL fi_info 0 "no time left (GUEST_TIMEOUT)"; return; fi
    local t0 t1; t0=$(guest_up)
    timeout -k 5 "$limit" fi_info -p verbs > "$WORK/fi_info.log" 2>&1
    RC=$?
    t1=$(guest_up); SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
    # one line per fi_info entry: provider / domain / endpoint type
    awk '/^provider:/{p=$2} /^ *domain:/{d=$2} /^ *type:/{print "  | provider " p "  domain " d "  " $2}' \
        "$WORK/fi_info.log" | sort | uniq -c
    local missing=""
    for d in $want; do grep -qE "^ *domain: $d\$" "$WORK/fi_info.log" || missing="$missing $d"; done
    if [ "$RC" != 0 ]; then
        sed 's/^/  | /' "$WORK/fi_info.log" | tail -20
        record FAIL fi_info "$SECS" "fi_info -p verbs exited $RC"
    elif [ -n "$missing" ]; then
        record FAIL fi_info "$SECS" "verbs domain(s)${missing} not listed (rxe setup failed?)"
    else
        record PASS fi_info "$SECS" "verbs domains$want"
    fi
}

# One fi_pingpong pair per size: server on rxe0 (10.77.0.1), client on rxe1 -> 10.77.0.1.
check_pingpong() {
    local limit; limit=$(budget_for 120)
    local P="-p verbs;ofi_rxm -e rdm -c -I 10"
    guest_say "CHECK fi_pingpong: FI_UNIVERSE_SIZE=$FI_UNIVERSE_SIZE fi_pingpong $P, server -d rxe0 ($RXE_IP0), client -d rxe1 ($RXE_IP1) -> $RXE_IP0, sizes: $PINGPONG_SIZES [limit ${limit}s]"
    if [ "$limit" -le 0 ]; then record FAIL fi_pingpong 0 "no time left (GUEST_TIMEOUT)"; return; fi
    local t0 t1 port=47600 fails="" s sp crc src
    t0=$(guest_up)
    for s in $PINGPONG_SIZES; do
        port=$((port + 1))
        echo "  -- size $s: server: fi_pingpong $P -S $s -d rxe0 -B $port"
        echo "  --          client: fi_pingpong $P -S $s -d rxe1 -P $port $RXE_IP0"
        timeout -k 5 "$limit" fi_pingpong -p "verbs;ofi_rxm" -e rdm -c -I 10 -S "$s" -d rxe0 -B "$port" \
            > "$WORK/pp-srv-$s.log" 2>&1 &
        sp=$!
        crc=1
        for _ in $(seq 1 20); do
            sleep 1                                       # server start-up
            timeout -k 5 "$limit" fi_pingpong -p "verbs;ofi_rxm" -e rdm -c -I 10 -S "$s" -d rxe1 -P "$port" \
                "$RXE_IP0" > "$WORK/pp-cli-$s.log" 2>&1 && { crc=0; break; }
            kill -0 "$sp" 2>/dev/null || break
        done
        wait "$sp"; src=$?
        sed 's/^/  | client: /' "$WORK/pp-cli-$s.log"
        if [ "$crc" != 0 ] || [ "$src" != 0 ]; then
            sed 's/^/  | server: /' "$WORK/pp-srv-$s.log"
            kill "$sp" 2>/dev/null
            fails="$fails $s(client rc=$crc server rc=$src)"
        fi
    done
    t1=$(guest_up); SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
    if [ -n "$fails" ]; then record FAIL fi_pingpong "$SECS" "failed sizes:$fails"
    else record PASS fi_pingpong "$SECS" "verbs;ofi_rxm rdm, data checked, sizes $PINGPONG_SIZES"; fi
}

check_doctor() {
    local limit; limit=$(budget_for 90)     # 17-35 s measured (fi_info x4 + rayfabric-fabric-info)
    local doc="$SOURCE_ROOT/python/rayfabric/tools/doctor.py"
    guest_say "CHECK doctor: python3 $doc (must find RDMA usable, engine on $EXPECTED_PROVIDER) [limit ${limit}s]"
    if [ "$limit" -le 0 ]; then record FAIL doctor 0 "no time left (GUEST_TIMEOUT)"; return; fi
    if [ ! -f "$doc" ]; then record FAIL doctor 0 "missing: $doc"; return; fi
    # RAYFABRIC_BIN_DIR: the doctor asks BUILD_DIR's rayfabric-fabric-info which provider the
    # engine picks; it must be verbs;ofi_rxm. The JSON report lands in the work dir (VERBS_KEEP=1).
    run_logged doctor "$limit" "$WORK/doctor.log" \
        "RAYFABRIC_BIN_DIR=$(printf %q "$BUILD_DIR") python3 $(printf %q "$doc") --json-file $(printf %q "$WORK/doctor.json")"
    local engine
    engine=$(grep -oE "^engine choice  $EXPECTED_PROVIDER on [^ ]+" "$WORK/doctor.log" | sed 's/^engine choice  //')
    if [ "$RC" = 124 ]; then record FAIL doctor "$SECS" "TIMEOUT after ${limit}s"
    elif [ "$RC" != 0 ]; then record FAIL doctor "$SECS" "exit $RC (see its output above)"
    elif [ -z "$engine" ]; then record FAIL doctor "$SECS" "RDMA usable, but the engine (rayfabric-fabric-info) does not choose $EXPECTED_PROVIDER"
    else record PASS doctor "$SECS" "RDMA usable; engine: $engine"; fi
}

check_project() {
    local entry=$1 name want rel cmd limit log
    IFS='|' read -r name want rel cmd <<<"$entry"
    limit=$(budget_for "$want")
    guest_say "CHECK $name: $rel [limit ${limit}s]"
    export BIN="$BUILD_DIR/$rel"
    if [ ! -e "$BIN" ]; then
        echo "  !!! MISSING: $BIN does not exist (not built yet? wrong BUILD_DIR?)"
        record FAIL "$name" 0 "missing: $BIN"; return
    fi
    if [ ! -x "$BIN" ]; then record FAIL "$name" 0 "missing: $BIN is not executable"; return; fi
    if [ "$limit" -le 0 ]; then record FAIL "$name" 0 "no time left (GUEST_TIMEOUT)"; return; fi
    echo "  \$ $cmd    (BIN=$BIN)"
    log="$WORK/$name.log"
    run_logged "$name" "$limit" "$log" "$cmd"
    local lines others
    lines=$(grep -F "provider $EXPECTED_PROVIDER" "$log" | head -3)
    # "provider X domain Y" lines naming any other provider (the engine's report format,
    # e.g. "rayfabric: provider tcp;ofi_rxm domain lo" or "[rayfabric I 1] provider ...")
    others=$(grep -oE 'provider [^ ]+ domain [^ :(]+' "$log" | grep -vF "provider $EXPECTED_PROVIDER " | sort -u | tr '\n' ' ')
    if [ "$RC" = 137 ] && [ "${SECS%.*}" -lt "$limit" ]; then
        local oom
        oom=$(dmesg 2>/dev/null | grep -iE 'out of memory|oom-kill|killed process' | tail -2 | tr '\n' ' ')
        echo "  !!! killed by SIGKILL after ${SECS}s; guest kernel says: ${oom:-nothing about OOM}"
        record FAIL "$name" "$SECS" "killed (SIGKILL)${oom:+: guest out of memory (GUEST_MEM=${GUEST_MEM_SEEN:-2G}): $(cut -c1-100 <<<"$oom")}"
    elif [ "$RC" = 124 ] || [ "$RC" = 137 ]; then
        record FAIL "$name" "$SECS" "TIMEOUT after ${limit}s"
    elif [ "$RC" != 0 ]; then
        local failed
        failed=$(grep -oE '^\[  FAILED  \] [A-Za-z0-9_/]+\.[A-Za-z0-9_/.]+' "$log" | awk '{print $NF}' | sed 's/^[^.]*\.//' | sort -u | tr '\n' ' ')
        record FAIL "$name" "$SECS" "exit $RC${failed:+; failed: $failed}"
    elif [ -n "$others" ] && [[ "$name" != mixed_* ]]; then
        record FAIL "$name" "$SECS" "ran on another provider: $others(want $EXPECTED_PROVIDER)"
    elif [ -z "$lines" ]; then
        record FAIL "$name" "$SECS" "no 'provider $EXPECTED_PROVIDER' line in its output: cannot tell it used verbs"
    else
        record PASS "$name" "$SECS" "$(grep -oE "provider $EXPECTED_PROVIDER domain [^ :(]+" "$log" | sort -u | tr '\n' ' ')"
    fi
}

guest_main() {
    BUILD_DIR=$1
    WORK=$(pwd)                      # the host's per-run dir, mounted read-write
    RESULTS="$WORK/results.tsv"
    : > "$RESULTS"
    echo "$(guest_up)" > "$WORK/started"
    GUEST_BUDGET=${VERBS_GUEST_BUDGET:-555}
    GUEST_MEM_SEEN="$(awk '/^MemTotal/{printf "%.1fG", $2/1048576}' /proc/meminfo)"
    export FI_UNIVERSE_SIZE=${FI_UNIVERSE_SIZE:-64}
    export VERBS_GTEST_FILTER=${VERBS_GTEST_FILTER:-*-*MixedNodesReadOverTheBestProviderTheyShare:*StripedReadMovesEachStripeOnItsOwnRail}
    export BUILD_DIR SOURCE_ROOT
    guest_say "guest up: $(uname -r), rxe: $(ls /sys/class/infiniband 2>/dev/null | tr '\n' ' ')(gid index ${RXE_GID_IDX:-none}; rails ${SOFTROCE_RAILS:-1}); BUILD_DIR=$BUILD_DIR; FI_UNIVERSE_SIZE=$FI_UNIVERSE_SIZE; VERBS_GTEST_FILTER=$VERBS_GTEST_FILTER; budget ${GUEST_BUDGET}s"
    check_fi_info
    check_pingpong
    check_doctor
    local e
    for e in "${PROJECT_CHECKS[@]}"; do check_project "$e"; done
    guest_say "suite done"
    echo "$(guest_up)" > "$WORK/finished"
    ! grep -q '^FAIL' "$RESULTS"
}

# ------------------------------------------------------------------ host side
cannot_start() {   # cannot_start REASON [FIX]
    echo
    bar; bar
    echo "##  VERBS SUITE: THE SOFT-RoCE GUEST COULD NOT START"
    echo "##  reason: $1"
    [ -n "${2:-}" ] && echo "##  fix:    $2"
    if [ "${RAYFABRIC_SKIP_VERBS:-0}" = 1 ]; then
        echo "##"
        echo "##  >>> SKIPPED (RAYFABRIC_SKIP_VERBS=1): NO REAL-VERBS TEST RAN <<<"
        bar; bar
        exit 77
    fi
    echo "##  No real-verbs test ran. This is a FAILURE. To skip instead (machines"
    echo "##  that cannot run the guest), set RAYFABRIC_SKIP_VERBS=1."
    bar; bar
    exit 1
}

host_main() {
    if [ $# -ne 1 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
        sed -n '2,42p' "$SELF" >&2; exit 2
    fi
    local BUILD_DIR
    BUILD_DIR=$(realpath -m -- "$1")
    [ -d "$BUILD_DIR" ] || { echo "verbs-suite: BUILD_DIR $BUILD_DIR is not a directory" >&2; exit 2; }
    local T0; T0=$(date +%s.%N)

    [ "$(id -u)" = 0 ] || cannot_start "not running as root (uid $(id -u)): the guest needs apt-get and QEMU's 9p root share" \
        "run as root (sudo meson test -C $BUILD_DIR --suite verbs)"
    [ -x "$SCRIPT_DIR/run-in-guest.sh" ] || cannot_start "$SCRIPT_DIR/run-in-guest.sh missing or not executable"
    command -v qemu-system-x86_64 >/dev/null 2>&1 || command -v apt-get >/dev/null 2>&1 ||
        cannot_start "no qemu-system-x86_64 and no apt-get to install it" "install qemu-system-x86 (Debian)"

    local GT=${GUEST_TIMEOUT:-720}
    if [ "${VERBS_AGENT:-0}" = 1 ]; then
        GT=${GUEST_TIMEOUT:-1500}
        export GUEST_MEM=${GUEST_MEM:-4G}
    fi
    # agent_verbs (VERBS_AGENT=1) needs the interpreter that has Ray; the guest's PATH is reset,
    # so pass its real path (meson sets VERBS_PYTHON to its python3, maybe a pyenv shim).
    local py=${VERBS_PYTHON:-python3}
    VERBS_PYTHON=$("$py" -c 'import sys; print(sys.executable)' 2>/dev/null) || VERBS_PYTHON=$py
    export VERBS_PYTHON
    [ "$GT" -ge 60 ] 2>/dev/null || { echo "verbs-suite: GUEST_TIMEOUT=$GT must be an integer >= 60" >&2; exit 2; }
    export VERBS_GUEST_BUDGET=$(( GT - 15 ))
    local rf_vars
    rf_vars=$(compgen -e | grep '^RAYFABRIC_' | tr '\n' ' ')
    export GUEST_ENV="${GUEST_ENV:-} VERBS_GUEST_BUDGET VERBS_GTEST_FILTER VERBS_BENCH_ITERS VERBS_AGENT VERBS_PYTHON FI_UNIVERSE_SIZE FI_LOG_LEVEL FI_LOG_PROV FI_LOG_SUBSYS FI_MR_CACHE_MAX_COUNT PINGPONG_SIZES $rf_vars"

    local WORK
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/rayfabric-verbs.XXXXXX") || cannot_start "cannot create a work dir in ${TMPDIR:-/tmp}"
    chmod 755 "$WORK"
    # shellcheck disable=SC2064
    [ "${VERBS_KEEP:-0}" = 1 ] || trap "rm -rf '$WORK'" EXIT
    cd "$WORK" || exit 1

    echo "=== verbs suite: BUILD_DIR=$BUILD_DIR GUEST_TIMEOUT=${GT}s work=$WORK"
    echo "=== project checks: $(for e in "${PROJECT_CHECKS[@]}"; do printf '%s ' "${e%%|*}"; done)"
    local rc
    # SOFTROCE_RAILS=2: a second veth pair with rxe2/rxe3, for the multi-rail checks
    SOFTROCE_RAILS=2 GUEST_TIMEOUT=$GT "$SCRIPT_DIR/run-in-guest.sh" \
        "bash $(printf %q "$SELF") --in-guest $(printf %q "$BUILD_DIR")" 2>&1 | tee "$WORK/host.out"
    rc=${PIPESTATUS[0]}
    local T1 total; T1=$(date +%s.%N)
    total=$(awk -v a="$T0" -v b="$T1" 'BEGIN{printf "%.1f", b-a}')

    if [ ! -f "$WORK/started" ]; then
        local why
        why=$(grep -E '^\[run-in-guest\]|^E: |rror' "$WORK/host.out" | tail -3 | tr '\n' ' ')
        cannot_start "run-in-guest.sh exited $rc before the suite started in the guest: ${why:-no message}" \
            "see the messages above (apt/network? kernel package? QEMU?); SOFTROCE_VERBOSE=1 shows the guest console"
    fi

    echo
    bar
    printf '## verbs suite summary (host wall %ss; guest booted and set up rxe in %ss of guest uptime)\n' \
        "$total" "$(cat "$WORK/started")"
    local st name secs detail nfail=0 npass=0
    while IFS=$'\t' read -r st name secs detail; do
        printf '##  %-4s %-22s %7ss  %s\n' "$st" "$name" "$secs" "$detail"
        if [ "$st" = PASS ]; then npass=$((npass + 1)); else nfail=$((nfail + 1)); fi
    done < "$WORK/results.tsv"
    if [ ! -f "$WORK/finished" ]; then
        nfail=$((nfail + 1))
        case $rc in
            124) echo "##  FAIL guest timed out after GUEST_TIMEOUT=${GT}s before the suite finished" ;;
            *)   echo "##  FAIL guest stopped (exit $rc) before the suite finished" ;;
        esac
    fi
    [ "$nfail" = 0 ] && [ "$rc" != 0 ] && { nfail=1; echo "##  FAIL guest command exited $rc"; }
    bar
    echo "verbs: $npass passed, $nfail failed"
    [ "${VERBS_KEEP:-0}" = 1 ] && echo "check logs kept in $WORK"
    [ "$nfail" = 0 ]
}

if [ "${1:-}" = --in-guest ]; then
    shift
    guest_main "$@"
else
    host_main "$@"
fi
