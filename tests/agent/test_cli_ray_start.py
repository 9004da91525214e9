"""`rayfabric start/status/stop` on a cluster started with `ray start` (two nodes on this host),
and a driver that moves an object between them with rayfabric.get."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from local_ports import free_port

PY = sys.executable
ENV = dict(os.environ)


def run(*args, check=True, timeout=180):
    out = subprocess.run(list(args), capture_output=True, text=True, env=ENV, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{args} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def ray_start_cluster():
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="rf-raystart-")
    # Ray 2.60 keeps an auth token in ~/.ray; a stale one from an earlier cluster makes the
    # second node's join fail (InvalidAuthToken). A private HOME keeps this cluster's own.
    ENV["HOME"] = tmp
    common = ["--num-cpus", "1", "--object-store-memory", str(300 << 20), "--disable-usage-stats"]
    run("ray", "start", "--head", "--port", str(port), "--temp-dir", tmp, "--include-dashboard", "false",
        "--resources", json.dumps({"h": 10}), *common)
    address = f"127.0.0.1:{port}"
    try:
        run("ray", "start", "--address", address, "--resources", json.dumps({"w": 10}), *common)
        yield address
    finally:
        run("ray", "stop", "--force", check=False)


DRIVER = r"""
import sys, numpy as np, ray, rayfabric
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=0, resources={"w": 0.01})
def make():
    return np.arange(32 << 20, dtype=np.uint8)
ref = make.remote()
value = rayfabric.get(ref, timeout=120)
assert int(value.sum()) == int(np.arange(32 << 20, dtype=np.uint8).sum())
st = rayfabric.stats()
print("PULLED", st["objects_pulled"], st["bytes_pulled"], st["fallbacks"])
"""


def test_start_status_get_stop(ray_start_cluster):
    address = ray_start_cluster
    start = run(PY, "-m", "rayfabric", "start", "--address", address, "--provider", "tcp;ofi_rxm")
    assert "2 agent(s) running" in start.stdout, start.stdout
    again = run(PY, "-m", "rayfabric", "start", "--address", address)  # idempotent
    assert "2 agent(s) running" in again.stdout
    st = json.loads(run(PY, "-m", "rayfabric", "status", "--address", address, "--json").stdout)
    assert len(st["agents"]) == 2 and all(a["alive"] and a["provider"] == "tcp;ofi_rxm"
                                          for a in st["agents"].values()), st
    table = run(PY, "-m", "rayfabric", "status", "--address", address).stdout
    assert "tcp;ofi_rxm" in table
    # tcp's default exposure (a key per lease); this cluster's control plane as `ray start` set it.
    assert all(a["exposure"] == "object" for a in st["agents"].values()), st
    assert "exposure" in table and " object " in table
    got = run(PY, "-c", DRIVER, address)
    pulled = next(l for l in got.stdout.splitlines() if l.startswith("PULLED")).split()
    assert pulled[1] == "1" and int(pulled[2]) >= 32 << 20 and pulled[3] == "0", got.stdout
    # The table per node: peers, bytes in and out, the rate since the agent started.
    st = json.loads(run(PY, "-m", "rayfabric", "status", "--address", address, "--json").stdout)
    assert all(a["uptime_ms"] > 0 for a in st["agents"].values()), st
    reader = [a for a in st["agents"].values() if a["objects_pulled"] == 1]
    server = [a for a in st["agents"].values() if a["bytes_leased"] >= 32 << 20]
    assert len(reader) == 1 and len(server) == 1 and len(reader[0]["peer_links"]) == 1, st
    # The fabric's share of what came into the reader (Ray's own bytes from its metric, once the
    # raylet has reported it: None before).
    r = reader[0]
    assert r["ray_bytes_received"] is None or r["coverage"] == r["bytes_pulled"] / (r["bytes_pulled"] +
                                                                                  r["ray_bytes_received"]), r
    table = run(PY, "-m", "rayfabric", "status", "--address", address).stdout
    header, *lines = table.splitlines()
    for column in ("peers", "MiB in", "MiB out", "MiB/s", "up s", "pinned MiB", "Ray MiB in", "coverage"):
        assert column in header, header
    stop = run(PY, "-m", "rayfabric", "stop", "--address", address)
    assert "stopped 2 agent(s)" in stop.stdout
    st = json.loads(run(PY, "-m", "rayfabric", "status", "--address", address, "--json").stdout)
    assert st["agents"] == {}
    # Without agents a get still works, through Ray's path, and says why once.
    got = run(PY, "-c", DRIVER, address)
    assert "PULLED 0" in got.stdout and "no rayfabric agent on this node" in got.stderr


def test_bench_against_the_ray_start_cluster(ray_start_cluster, tmp_path):
    """`rayfabric bench --address`: the same measurement on a cluster it did not start; agents it
    started itself are stopped at the end."""
    address = ray_start_cluster
    out = tmp_path / "bench.json"
    run(PY, "-m", "rayfabric", "bench", "--address", address, "--provider", "tcp;ofi_rxm", "--sizes", "1M",
        "--kinds", "numpy", "--reps", "2", "--cases", "single", "--touch", "0", "--no-ceiling",
        "--json", str(out), timeout=300)
    doc = json.loads(out.read_text())
    assert doc["meta"]["cluster"] == "address " + address, doc["meta"]["cluster"]
    [row] = doc["rows"]
    assert (row["case"], row["size"]) == ("single", 1 << 20)
    for path in ("ray", "rayfabric"):
        assert row[path]["gbps"] > 0 and row[path]["bytes_ok"] is True, row[path]
    fab = row["rayfabric"]["fabric"]
    assert fab["fallbacks"] == 0 and fab["objects_pulled"] == fab["objects_requested"] == 2, fab
    st = json.loads(run(PY, "-m", "rayfabric", "status", "--address", address, "--json").stdout)
    assert st["agents"] == {}, "the bench left the agents it started running"
