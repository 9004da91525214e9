#!/bin/bash
# agent-verbs.sh BUILD_DIR - agent-to-agent transfer of a plasma object over real verbs, inside
# the Soft-RoCE guest. Not in the default verbs suite (Ray under TCG needs ~10 min; the numbers
# and the decision are in docs/softroce.md). Run it, from the source root, as root, either in the
# suite (project check `agent_verbs`):
#   VERBS_AGENT=1 tests/softroce/verbs-suite.sh build
# or alone (the guest's PATH is reset: pass the interpreter that has Ray):
#   GUEST_MEM=4G GUEST_TIMEOUT=1200 tests/softroce/run-in-guest.sh \
#     "VERBS_PYTHON=$(python3 -c 'import sys; print(sys.executable)') tests/softroce/agent-verbs.sh build"
#
# Starts a 2-node ray.cluster_utils.Cluster (node A = head, node B; 1 CPU and a 200 MiB object
# store each, no dashboard), one rayfabricd per node through rayfabric.init(provider=
# "verbs;ofi_rxm") with node A's agent on rxe0 and node B's on rxe1 (node_env), so the bytes
# cross the veth pair. A task on A makes a numpy array (AGENT_VERBS_MIB, default 16 MiB) and
# its sha256; a task on B rayfabric.get()s it and hashes it. PASS when the hashes match, B's
# pull moved the object by the fabric (objects_pulled 1, bytes_pulled == the object's plasma
# size, no fallback), and rayfabric.status() shows both agents on verbs;ofi_rxm with domains
# rxe0 and rxe1 and B's agent reporting bytes_pulled == the object size.
#
# Prints one line per agent in the engine's report format ("agent A ...: provider
# verbs;ofi_rxm domain rxe0 ...") for the suite's provider check, the phase times, and
# "AGENT_VERBS PASS ..." or "AGENT_VERBS FAIL ..."; exit 0 only on PASS.
#
# Environment: VERBS_PYTHON (interpreter with Ray; default python3), AGENT_VERBS_MIB (16),
# AGENT_VERBS_PROVIDER ("verbs;ofi_rxm"), AGENT_VERBS_DOMAINS ("rxe0,rxe1": A's and B's; for a
# dry run on the host, without RDMA: AGENT_VERBS_PROVIDER="tcp;ofi_rxm" AGENT_VERBS_DOMAINS=eth0,eth0
# - tcp ignores a domain hint, the engine takes eth0 whatever RAYFABRIC_DOMAIN says), AGENT_VERBS_STORE_MIB
# (200), AGENT_VERBS_INIT_TRIES (5), AGENT_VERBS_RAYLET_WAIT_S (600), AGENT_VERBS_KEEP_LOGS=DIR (on
# failure, copy the Ray session logs there, e.g. a directory under the source root, which the
# guest shares with the host). FI_UNIVERSE_SIZE (64) and RAYFABRIC_CHUNK_SIZE (256K) are set
# for the agents unless already set (both needed on rxe, see docs/softroce.md).
set -uo pipefail
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
SOURCE_ROOT=$(cd "$SCRIPT_DIR/../.." && pwd)
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 BUILD_DIR   (a meson build dir holding src/agent/rayfabricd)" >&2; exit 2
fi
BUILD_DIR=$(cd "$1" && pwd)
PY=${VERBS_PYTHON:-python3}
# find_spec, not import: `import ray` alone takes ~50 s in the guest
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("ray", "numpy", "grpc")))' 2>/dev/null; then
    echo "AGENT_VERBS FAIL: '$PY' cannot import ray, numpy and grpc (set VERBS_PYTHON to the interpreter that has Ray)"
    exit 1
fi
export PYTHONPATH="$SOURCE_ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
export RAYFABRIC_BIN_DIR="$BUILD_DIR"
export FI_UNIVERSE_SIZE=${FI_UNIVERSE_SIZE:-64}
export RAYFABRIC_CHUNK_SIZE=${RAYFABRIC_CHUNK_SIZE:-256K}
export RAY_USAGE_STATS_ENABLED=0
# Ray under TCG (every Python process needs ~30-60 s to import ray): stretch the timeouts that
# assume a real CPU, or the raylet kills the workers it is waiting for and never converges.
export RAY_worker_register_timeout_seconds=${RAY_worker_register_timeout_seconds:-600}
export RAY_agent_register_timeout_ms=${RAY_agent_register_timeout_ms:-600000}
export RAY_health_check_timeout_ms=${RAY_health_check_timeout_ms:-60000}
export RAY_health_check_period_ms=${RAY_health_check_period_ms:-10000}
export RAY_health_check_failure_threshold=${RAY_health_check_failure_threshold:-30}
# The head waits up to this long for its API server (not used here; it keeps starting anyway).
export RAY_DASHBOARD_STARTUP_TIMEOUT_S=${RAY_DASHBOARD_STARTUP_TIMEOUT_S:-2}
# A Ray session of its own (the guest sees the host's /tmp/ray read-only underneath).
export RAY_TMPDIR=${RAY_TMPDIR:-/tmp/rayfabric-agent-verbs}
mkdir -p "$RAY_TMPDIR"
# Node start waits for its raylet in the GCS for a hard-coded 30 s (ray/_private/node.py);
# AGENT_VERBS_RAYLET_WAIT_S (default 600) stretches that wait (see the Python below).
cd "$SOURCE_ROOT" || exit 1
exec "$PY" -u - <<'PYEOF'
import hashlib
import os
import sys
import threading
import time

T0 = time.monotonic()


def say(msg):
    print(f"[agent-verbs {time.monotonic() - T0:7.1f}s] {msg}", flush=True)


say(f"python {sys.executable}; importing ray")
import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

import rayfabric  # noqa: E402

MiB = 1 << 20
PROVIDER = os.environ.get("AGENT_VERBS_PROVIDER", "verbs;ofi_rxm")
DOM_A, DOM_B = os.environ.get("AGENT_VERBS_DOMAINS", "rxe0,rxe1").split(",")
NBYTES = int(os.environ.get("AGENT_VERBS_MIB", "16")) * MiB
STORE = int(os.environ.get("AGENT_VERBS_STORE_MIB", "200")) * MiB
AGENT_ENV = {k: os.environ[k] for k in ("FI_UNIVERSE_SIZE", "RAYFABRIC_CHUNK_SIZE") if k in os.environ}
times = {}
failures = []
cluster = None

# ray._private.node.Node gives its raylet 30 s to appear in the GCS (hard-coded); in the TCG guest
# it needs minutes. Make each get_node() call in that loop wait (the loop then succeeds).
_get_node = ray._private.services.get_node
RAYLET_WAIT_S = float(os.environ.get("AGENT_VERBS_RAYLET_WAIT_S", "600"))


def _raylet_alive(node_id):
    """Is a raylet process for this node still running (scans /proc: no psutil needed)?"""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if argv and argv[0].endswith(b"/raylet") and any(str(node_id).encode() in a for a in argv):
            return state != "Z"
    return False


def _patient_get_node(gcs_address, node_id, *args, **kwargs):
    deadline = time.monotonic() + RAYLET_WAIT_S
    t0 = time.monotonic()
    while True:
        try:
            node = _get_node(gcs_address, node_id, *args, **kwargs)
            say(f"raylet of node {str(node_id)[:12]} registered after {time.monotonic() - t0:.1f}s")
            return node
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            if time.monotonic() - t0 > 10 and not _raylet_alive(node_id):
                raise RuntimeError(f"the raylet of node {str(node_id)[:12]} died while starting "
                                   f"(see raylet.out below)") from None
            time.sleep(1)


def agent_ports():
    """Fixed ports for a node's Ray agents. With port 0 the raylet waits for the dashboard agent
    to write its ports to files, for a hard-coded 30 s, then aborts (node_manager.cc
    `Timed out waiting for file .../metrics_agent_port_<node>`): in the TCG guest that agent needs
    longer just to import. Ports given up front (and their files written, see above) skip it."""
    import socket
    socks = [socket.socket() for _ in range(4)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return dict(zip(("metrics_agent_port", "metrics_export_port", "runtime_env_agent_port",
                     "dashboard_agent_listen_port"), ports))


def dump_ray_logs():
    """Tails of the Ray logs that explain a start failure; the whole directory to
    AGENT_VERBS_KEEP_LOGS if set (e.g. a path under the shared work dir)."""
    import glob
    import shutil
    logs = os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray", "session_latest", "logs")
    for name in ("raylet.out", "raylet.err", "raylet.1.out", "gcs_server.out", "gcs_server.err",
                 "dashboard_agent.log", "runtime_env_agent.log"):
        for path in sorted(glob.glob(os.path.join(logs, name))):
            try:
                with open(path, errors="replace") as f:
                    lines = f.readlines()[-15:]
            except OSError:
                continue
            for ln in lines:
                print(f"  | {name}: {ln.rstrip()[:300]}")
    keep = os.environ.get("AGENT_VERBS_KEEP_LOGS")
    if keep:
        shutil.copytree(logs, keep, dirs_exist_ok=True, symlinks=True)
        say(f"Ray logs copied to {keep}")


ray._private.services.get_node = _patient_get_node

# The raylet also waits (hard-coded 30 s, then aborts) for the dashboard agent it starts to write
# its listen port to <session>/dashboard_agent_listen_port_<node>; that port is not passed to the
# raylet on its command line. We fix the agents' ports (agent_ports()) and write the port files
# ourselves before the raylet starts; the agents later write the same values.
_start_raylet = ray._private.services.start_raylet


def _start_raylet_with_port_files(*args, **kwargs):
    import inspect
    from ray import _raylet
    a = inspect.signature(_start_raylet).bind(*args, **kwargs).arguments
    for name, key in ((_raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME, "dashboard_agent_listen_port"),
                      (_raylet.METRICS_AGENT_PORT_NAME, "metrics_agent_port"),
                      (_raylet.METRICS_EXPORT_PORT_NAME, "metrics_export_port"),
                      (_raylet.RUNTIME_ENV_AGENT_PORT_NAME, "runtime_env_agent_port")):
        if a.get(key):
            _raylet.persist_port(a["session_dir"], a["node_id"], name, a[key])
    return _start_raylet(*args, **kwargs)


ray._private.services.start_raylet = _start_raylet_with_port_files


def phase(name, t):
    times[name] = time.monotonic() - t
    say(f"{name}: {times[name]:.1f}s")


@ray.remote(num_cpus=0, num_returns=2)
def produce(nbytes, seed):
    a = np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)
    return a, hashlib.sha256(a.tobytes()).hexdigest()


@ray.remote(num_cpus=0)
def consume(refs):
    import rayfabric as rf
    before = rf.stats()
    t = time.perf_counter()
    value = rf.get(refs[0], timeout=300)
    secs = time.perf_counter() - t
    after = rf.stats()
    return {"node": ray.get_runtime_context().get_node_id(), "sha256": hashlib.sha256(value.tobytes()).hexdigest(),
            "nbytes": value.nbytes, "seconds": secs,
            "pulled": after["objects_pulled"] - before["objects_pulled"],
            "bytes": after["bytes_pulled"] - before["bytes_pulled"],
            "fallbacks": after["fallbacks"] - before["fallbacks"], "reasons": after["fallback_reasons"]}


def main():
    global cluster
    t = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"nodeA": 10}, "object_store_memory": STORE, "include_dashboard": False,
        "no_monitor": True, "include_log_monitor": False, **agent_ports()})
    phase("ray head node up", t)
    cluster.add_node(num_cpus=1, resources={"nodeB": 10}, object_store_memory=STORE, **agent_ports())
    ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
    cluster.wait_for_nodes(timeout=600)
    phase("ray cluster (2 nodes) up", t)
    nodes = {}
    for n in ray.nodes():
        for name in ("nodeA", "nodeB"):
            if n["Alive"] and name in n["Resources"]:
                nodes[name] = n["NodeID"]
    say(f"nodes: A {nodes['nodeA'][:12]} ({DOM_A}), B {nodes['nodeB'][:12]} ({DOM_B}); node ip "
        f"{ray.nodes()[0]['NodeManagerAddress']}")

    t = time.monotonic()
    # rayfabric.init waits 120 s per node for its agent actor; in the guest the actor's worker
    # (runtime_env -> the runtime env agent must be up, then `import ray`) can take longer. The
    # actors are named and get_if_exists: calling init again waits for the same actors again.
    tries = int(os.environ.get("AGENT_VERBS_INIT_TRIES", "5"))
    for attempt in range(1, tries + 1):
        try:
            records = rayfabric.init(provider=PROVIDER, env=AGENT_ENV, watch_new_nodes=False,
                                     node_env={nodes["nodeA"]: {"RAYFABRIC_DOMAIN": DOM_A},
                                               nodes["nodeB"]: {"RAYFABRIC_DOMAIN": DOM_B}})
            break
        except RuntimeError as e:
            if "timed out" not in str(e).lower() or attempt == tries:
                raise
            say(f"agents not up yet after attempt {attempt}/{tries} ({str(e)[:160]}); waiting again")
    phase("agents up", t)
    for name, dom in (("nodeA", DOM_A), ("nodeB", DOM_B)):
        r = records[nodes[name]]
        say(f"agent {name[-1]} ready: {r['address']} provider {r['provider']} domain {r['domain']} pid {r['pid']}")

    t = time.monotonic()
    arr_ref, sha_ref = produce.options(resources={"nodeA": 1}).remote(NBYTES, 7)
    want_sha = ray.get(sha_ref, timeout=300)
    phase(f"produce {NBYTES} B on node A", t)
    size = ray.experimental.get_object_locations([arr_ref])[arr_ref]["object_size"]
    say(f"object {arr_ref.hex()[:16]}: plasma size {size} B, sha256 {want_sha[:16]}")

    t = time.monotonic()
    got = ray.get(consume.options(resources={"nodeB": 1}).remote([arr_ref]), timeout=600)
    phase("consume on node B (worker + rayfabric.get + sha256)", t)
    say(f"rayfabric.get on node B: {got['seconds']:.2f}s, {got['bytes']} B pulled "
        f"({got['bytes'] / max(got['seconds'], 1e-9) / 1e6:.1f} MB/s incl. lease/create), "
        f"fallbacks {got['fallbacks']} {got['reasons'] or ''}")
    if got["node"] != nodes["nodeB"]:
        failures.append(f"consumer ran on {got['node'][:12]}, not node B")
    if got["sha256"] != want_sha or got["nbytes"] != NBYTES:
        failures.append(f"sha256 mismatch: producer {want_sha[:16]}, consumer {got['sha256'][:16]} "
                        f"({got['nbytes']} B)")
    if got["pulled"] != 1 or got["bytes"] != size or got["fallbacks"]:
        failures.append(f"consumer's rayfabric.get did not pull by the fabric: objects {got['pulled']}, "
                        f"bytes {got['bytes']} (want {size}), fallbacks {got['fallbacks']} {got['reasons']}")

    st = rayfabric.status()["agents"]
    for name, dom in (("nodeA", DOM_A), ("nodeB", DOM_B)):
        s = st.get(nodes[name], {"alive": False, "error": "no published agent"})
        if not s.get("alive"):
            failures.append(f"agent {name[-1]} not answering: {s.get('error')}")
            continue
        # the engine's report format; the suite's provider check reads these lines
        print(f"  agent {name[-1]} (node {nodes[name][:12]}, pid {s['pid']}): provider {s['provider']} domain "
              f"{s['domain']} objects_pulled={s['objects_pulled']} bytes_pulled={s['bytes_pulled']} "
              f"leases_granted={s['leases_granted']} bytes_leased={s['bytes_leased']} "
              f"fabric_bytes_read={s['fabric_bytes_read']} pulls_failed={s['pulls_failed']}", flush=True)
        if s["provider"] != PROVIDER or s["domain"] != dom:
            failures.append(f"agent {name[-1]} on provider {s['provider']} domain {s['domain']}, "
                            f"want {PROVIDER} domain {dom}")
    sa, sb = st.get(nodes["nodeA"], {}), st.get(nodes["nodeB"], {})
    if sb.get("alive") and (sb["bytes_pulled"] != size or sb["objects_pulled"] != 1 or sb["pulls_failed"]):
        failures.append(f"agent B: bytes_pulled {sb['bytes_pulled']} (want {size}), objects_pulled "
                        f"{sb['objects_pulled']} (want 1), pulls_failed {sb['pulls_failed']}")
    if sa.get("alive") and sa["bytes_leased"] != size:
        failures.append(f"agent A: bytes_leased {sa['bytes_leased']} (want {size})")
    for name in ("nodeA", "nodeB"):
        log = records[nodes[name]].get("log")
        try:
            with open(log, errors="replace") as f:
                lines = [ln.rstrip() for ln in f if "provider " in ln or " E " in ln or "rror" in ln]
        except OSError:
            lines = [f"(cannot read {log})"]
        for ln in lines[:4]:
            print(f"  rayfabricd {name[-1]} log: {ln}", flush=True)
    return size


def teardown():
    t = time.monotonic()
    for step in (rayfabric.shutdown, ray.shutdown, lambda: cluster and cluster.shutdown()):
        th = threading.Thread(target=step, daemon=True)
        th.start()
        th.join(60)
    phase("teardown", t)


rc = 1
try:
    size = main()
    total = time.monotonic() - T0
    if failures:
        for f in failures:
            print(f"  !!! {f}", flush=True)
        dump_ray_logs()
        print(f"AGENT_VERBS FAIL ({len(failures)} problem(s)); {total:.1f}s", flush=True)
    else:
        print(f"AGENT_VERBS PASS: {NBYTES >> 20} MiB plasma object node A ({DOM_A}) -> node B ({DOM_B}) "
              f"by {PROVIDER}, sha256 equal, bytes_pulled {size} == object size, no fallback; "
              f"ray up {times['ray cluster (2 nodes) up']:.0f}s, agents {times['agents up']:.0f}s, "
              f"total {total:.0f}s", flush=True)
        rc = 0
except Exception as e:  # noqa: BLE001 - one clear verdict line
    import traceback
    traceback.print_exc()
    dump_ray_logs()
    print(f"AGENT_VERBS FAIL: {type(e).__name__}: {str(e)[:300]}", flush=True)
finally:
    try:
        teardown()
    finally:
        sys.stdout.flush()
        os._exit(rc)
PYEOF
