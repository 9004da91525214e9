"""The fabric runs on the interface of the node's Ray IP, with nothing set: two Ray nodes started
with `ray start` in their own network namespaces, joined by two veth pairs. The first pair
(198.51.100.0/24) carries Ray; the second (203.0.113.0/24) is created AFTER it, so libfabric lists
its interface first (before this was fixed every pull went over it). A 64 MiB object pulled from
node B to node A must cross the first pair: the interfaces' byte counters say which one carried
it. Then the same with RAYFABRIC_DOMAIN naming the second interface: the bytes move there (the
counters can tell the two apart).

Needs root and `ip netns` (skipped otherwise, with the reason). Namespaces do not isolate PIDs:
Ray's processes are stopped by the namespaces' own PID lists, never by `ray stop`."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

PY = sys.executable
NS = ("rfnsA", "rfnsB")
RAY_NET = ("198.51.100.1", "198.51.100.2")    # first pair: Ray's network
SIDE_NET = ("203.0.113.1", "203.0.113.2")     # second pair, created later
IFACES = {"rfnsA": ("rfa0", "rfa1"), "rfnsB": ("rfb0", "rfb1")}
MiB = 1 << 20


def sh(*args, check=True, timeout=120, env=None):
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise AssertionError(f"{args} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def in_ns(ns, *args, **kw):
    return sh("ip", "netns", "exec", ns, *args, **kw)


def kill_namespace(ns):
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(int(pid), sig)
            except (ProcessLookupError, ValueError):
                pass
        time.sleep(1.0 if sig == signal.SIGTERM else 0)
        pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
        if not pids:
            break


def teardown():
    for ns in NS:
        kill_namespace(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def two_namespaces():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 (ip netns)")
    teardown()
    probe = subprocess.run(["ip", "netns", "add", NS[0]], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {probe.stderr.strip()}")
    sh("ip", "netns", "add", NS[1])
    try:
        # Ray's pair first, then the side pair: libfabric lists the newer interface first.
        for (a, b), (ip_a, ip_b) in (((IFACES[NS[0]][0], IFACES[NS[1]][0]), RAY_NET),
                                     ((IFACES[NS[0]][1], IFACES[NS[1]][1]), SIDE_NET)):
            sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            sh("ip", "link", "set", a, "netns", NS[0])
            sh("ip", "link", "set", b, "netns", NS[1])
            in_ns(NS[0], "ip", "addr", "add", f"{ip_a}/24", "dev", a)
            in_ns(NS[1], "ip", "addr", "add", f"{ip_b}/24", "dev", b)
            in_ns(NS[0], "ip", "link", "set", a, "up")
            in_ns(NS[1], "ip", "link", "set", b, "up")
        for ns in NS:
            in_ns(ns, "ip", "link", "set", "lo", "up")
        tmp = tempfile.mkdtemp(prefix="rf-netns-")
        env = dict(os.environ, HOME=tmp, RAY_AUTH_MODE="disabled")
        common = ["--num-cpus", "1", "--object-store-memory", str(300 * MiB), "--disable-usage-stats"]
        in_ns(NS[0], "ray", "start", "--head", "--node-ip-address", RAY_NET[0], "--port", "6379",
              "--temp-dir", tmp, "--include-dashboard", "false", "--resources", json.dumps({"nA": 10}),
              *common, env=env, timeout=180)
        in_ns(NS[1], "ray", "start", "--address", f"{RAY_NET[0]}:6379", "--node-ip-address", RAY_NET[1],
              "--resources", json.dumps({"nB": 10}), *common, env=env, timeout=180)
        yield env
    finally:
        teardown()


DRIVER = r"""
import hashlib, json, sys, time
import numpy as np, ray, rayfabric
ray.init(address=sys.argv[1], logging_level="ERROR")
node_env = json.loads(sys.argv[2])
nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
by_name = {("nA" if "nA" in n["Resources"] else "nB"): i for i, n in nodes.items()}
records = rayfabric.init(node_env={by_name[k]: v for k, v in node_env.items()}, watch_new_nodes=False)

def counters():
    out = {}
    for dev in ("rfa0", "rfa1"):
        with open(f"/sys/class/net/{dev}/statistics/rx_bytes") as f:
            out[dev] = int(f.read())
    return out

@ray.remote(num_cpus=0, resources={"nB": 0.01})
def make():
    return np.random.default_rng(7).integers(0, 256, size=64 << 20, dtype=np.uint8)

@ray.remote(num_cpus=0, resources={"nA": 0.01})
def fetch(refs):
    import rayfabric as rf
    v = rf.get(refs[0], timeout=120)
    st = rf.stats()
    return hashlib.sha256(v.tobytes()).hexdigest(), st["objects_pulled"], st["fallback_reasons"]

ref = make.remote()
ray.wait([ref], fetch_local=False, timeout=120)
before = counters()
digest, pulled, reasons = ray.get(fetch.remote([ref]), timeout=180)
after = counters()
want = hashlib.sha256(np.random.default_rng(7).integers(0, 256, size=64 << 20, dtype=np.uint8).tobytes()).hexdigest()
status = rayfabric.status()["agents"]
print("RESULT " + json.dumps({
    "ok": digest == want, "pulled": pulled, "reasons": reasons,
    "rx": {d: after[d] - before[d] for d in after},
    "domains": {("nA" if i == by_name["nA"] else "nB"): [f["domain"] for f in s["fabrics"]]
                for i, s in status.items()}}))
rayfabric.shutdown()
"""


def run_driver(env, node_env):
    out = in_ns(NS[0], PY, "-c", DRIVER, f"{RAY_NET[0]}:6379", json.dumps(node_env), env=env, timeout=400)
    line = next(l for l in out.stdout.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_pulls_use_the_interface_of_the_nodes_ray_ip(two_namespaces):
    env = dict(two_namespaces, PYTHONPATH=os.environ.get("PYTHONPATH", ""),
               RAYFABRIC_BIN_DIR=os.environ.get("RAYFABRIC_BIN_DIR", ""))
    result = run_driver(env, {})
    assert result["ok"] and result["pulled"] == 1, result
    # No RAYFABRIC_DOMAIN: each agent chose the interface holding its node's IP.
    assert result["domains"] == {"nA": ["rfa0"], "nB": ["rfb0"]}, result
    assert result["rx"]["rfa0"] >= 64 * MiB, result
    assert result["rx"]["rfa1"] < 1 * MiB, result

    # The counters tell the links apart: with the side interfaces named, the bytes move there.
    result = run_driver(env, {"nA": {"RAYFABRIC_DOMAIN": "rfa1"}, "nB": {"RAYFABRIC_DOMAIN": "rfb1"}})
    assert result["ok"] and result["pulled"] == 1, result
    assert result["domains"] == {"nA": ["rfa1"], "nB": ["rfb1"]}, result
    assert result["rx"]["rfa1"] >= 64 * MiB, result
    assert result["rx"]["rfa0"] < 16 * MiB, result
