"""The fabric runs on the interface of the node's Ray IP, with nothing set: two Ray nodes started
with `ray start` in their own network namespaces, joined by two veth pairs. The first pair
(198.51.100.0/24) carries Ray; the second (203.0.113.0/24) is created AFTER it, so libfabric lists
its interface first (before this was fixed every pull went over it). A 64 MiB object pulled from
node B to node A must cross the first pair: the interfaces' byte counters say which one carried
it. Then the same with RAYFABRIC_DOMAIN naming the second interface: the bytes move there (the
counters can tell the two apart). With both interfaces named, they are two rails and a pull
stripes across both. And a shared provider whose endpoint cannot be reached gives way to the next
one the two nodes share.

Needs root and `ip netns` (skipped otherwise, with the reason). Namespaces do not isolate PIDs:
Ray's processes are stopped by the namespaces' own PID lists, never by `ray stop`."""
import json
import os
import shutil

import pytest

from rayfabric.tools import netns

MiB = 1 << 20


@pytest.fixture(scope="module")
def two_namespaces():
    why = netns.NetnsPair.available()
    if why:
        pytest.skip(why)
    pair = netns.NetnsPair(links=2, store_bytes=300 * MiB)
    try:
        # Ray's pair first, then the side pair: libfabric lists the newer interface first.
        yield pair.start()
    finally:
        pair.stop()


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
                for i, s in status.items()},
    "rail_domains": {("nA" if i == by_name["nA"] else "nB"): [f["rail_domains"] for f in s["fabrics"]]
                     for i, s in status.items()},
    "link_rails": [l["rails"] for l in status[by_name["nA"]]["peer_links"]],
    "rail_bytes": {r["domain"]: r["bytes_read"] for r in status[by_name["nA"]]["rails"]}}))
rayfabric.shutdown()
"""


def run_driver(pair, node_env):
    out = pair.run_driver(DRIVER, json.dumps(node_env), timeout=400,
                          extra_env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                                     "RAYFABRIC_BIN_DIR": os.environ.get("RAYFABRIC_BIN_DIR", "")})
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_pulls_use_the_interface_of_the_nodes_ray_ip(two_namespaces):
    result = run_driver(two_namespaces, {})
    assert result["ok"] and result["pulled"] == 1, result
    # No RAYFABRIC_DOMAIN: each agent chose the interface holding its node's IP.
    assert result["domains"] == {"nA": ["rfa0"], "nB": ["rfb0"]}, result
    assert result["rx"]["rfa0"] >= 64 * MiB, result
    assert result["rx"]["rfa1"] < 1 * MiB, result

    # The counters tell the links apart: with the side interfaces named, the bytes move there.
    result = run_driver(two_namespaces, {"nA": {"RAYFABRIC_DOMAIN": "rfa1"}, "nB": {"RAYFABRIC_DOMAIN": "rfb1"}})
    assert result["ok"] and result["pulled"] == 1, result
    assert result["domains"] == {"nA": ["rfa1"], "nB": ["rfb1"]}, result
    assert result["rx"]["rfa1"] >= 64 * MiB, result
    assert result["rx"]["rfa0"] < 16 * MiB, result


def test_listed_interfaces_are_rails_and_a_large_pull_stripes_across_both(two_namespaces):
    """Both interfaces of each node named: two rails of tcp;ofi_rxm. A 64 MiB pull is read in two
    stripes, one per link (rail 1 with rail 1, rail 2 with rail 2): each interface carries half."""
    result = run_driver(two_namespaces, {"nA": {"RAYFABRIC_DOMAIN": "rfa0,rfa1"}, "nB": {"RAYFABRIC_DOMAIN": "rfb0,rfb1"}})
    assert result["ok"] and result["pulled"] == 1, result
    assert result["domains"] == {"nA": ["rfa0"], "nB": ["rfb0"]}, result
    assert result["rail_domains"] == {"nA": [["rfa1"]], "nB": [["rfb1"]]}, result
    assert result["link_rails"] == [2], result
    # Each link carried its stripe (half of 64 MiB, on a 64 KiB boundary), and each rail's engine
    # read it.
    for dev in ("rfa0", "rfa1"):
        assert 30 * MiB <= result["rx"][dev] <= 40 * MiB, result
    stored = result["rail_bytes"]["rfa0"] + result["rail_bytes"]["rfa1"]  # data + Ray's metadata
    assert 64 * MiB <= stored < 64 * MiB + 4096, result
    assert abs(result["rail_bytes"]["rfa0"] - stored / 2) <= 64 << 10, result


UNREACHABLE_DRIVER = r"""
import hashlib, json, subprocess, sys, time
import numpy as np, ray, rayfabric
ray.init(address=sys.argv[1], logging_level="ERROR")
nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
by_name = {("nA" if "nA" in n["Resources"] else "nB"): i for i, n in nodes.items()}
# Node A may hold one 8 MiB object pinned at node B, not two: the read over sockets is leased
# only once the failed one's lease is released, so that release must come first (and answered).
both = {"RAYFABRIC_PROVIDER": "tcp;ofi_rxm,sockets", "RAYFABRIC_OP_TIMEOUT_MS": "3000",
        "RAYFABRIC_DRAIN_TIMEOUT_MS": "1000", "RAYFABRIC_MAX_LEASE_BYTES_PER_PEER": "12M"}
rayfabric.init(node_env={by_name["nA"]: both, by_name["nB"]: both}, watch_new_nodes=False)
status = rayfabric.status()["agents"]
tcp = next(f for f in status[by_name["nB"]]["fabrics"] if f["provider"] == "tcp;ofi_rxm")
address = bytes.fromhex(tcp["address"])  # a sockaddr_in: family, port (network order), IPv4
port = int.from_bytes(address[2:4], "big")
assert address[4:8] == bytes([198, 51, 100, 2]), address.hex()
# Node B's tcp endpoint becomes unreachable: its port dropped on the way in (sockets' is not).
for cmd in (["add", "table", "inet", "rftest"],
            ["add", "chain", "inet", "rftest", "in", "{ type filter hook input priority 0 ; }"],
            ["add", "rule", "inet", "rftest", "in", "tcp", "dport", str(port), "drop"]):
    subprocess.run(["ip", "netns", "exec", "rfnsB", "nft", *cmd], check=True)

@ray.remote(num_cpus=0, resources={"nB": 0.01})
def make(seed):
    return np.random.default_rng(seed).integers(0, 256, size=8 << 20, dtype=np.uint8)

@ray.remote(num_cpus=0, resources={"nA": 0.01})
def fetch(refs):
    import rayfabric as rf
    before = rf.stats()
    t0 = time.monotonic()
    v = rf.get(refs[0], timeout=120)
    seconds = time.monotonic() - t0
    after = rf.stats()
    return (hashlib.sha256(v.tobytes()).hexdigest(), after["objects_pulled"] - before["objects_pulled"],
            seconds, after["fallback_reasons"])

out = []
for seed in (1, 2):
    ref = make.remote(seed)
    ray.wait([ref], fetch_local=False, timeout=120)
    digest, pulled, seconds, reasons = ray.get(fetch.remote([ref]), timeout=300)
    want = hashlib.sha256(np.random.default_rng(seed).integers(0, 256, size=8 << 20, dtype=np.uint8).tobytes()).hexdigest()
    out.append({"ok": digest == want, "pulled": pulled, "seconds": seconds, "reasons": reasons})
links = rayfabric.status()["agents"][by_name["nA"]]["peer_links"]
print("RESULT " + json.dumps({"pulls": out, "links": [
    {"provider": l["provider"], "unusable": list(l["unusable_providers"]), "objects": l["objects_pulled"]}
    for l in links]}))
rayfabric.shutdown()
"""


def test_a_shared_provider_that_cannot_reach_the_source_gives_way_to_the_next(two_namespaces):
    """Both nodes speak tcp;ofi_rxm and sockets, but the source's tcp endpoint is unreachable (its
    port dropped by an nftables rule on the way in): the first pull fails over tcp after one op
    timeout and is read again over sockets at once (its first lease released before the second,
    which the source's bound per peer would refuse otherwise); the next pull goes straight to
    sockets."""
    if shutil.which("nft") is None:
        pytest.skip("needs nft (Debian package nftables; scripts/setup.sh installs it)")
    try:
        out = two_namespaces.run_driver(
            UNREACHABLE_DRIVER, timeout=400,
            extra_env={"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                       "RAYFABRIC_BIN_DIR": os.environ.get("RAYFABRIC_BIN_DIR", "")})
    finally:
        netns.in_ns(netns.NAMESPACES[1], "nft", "delete", "table", "inet", "rftest", check=False)
    result = json.loads(next(l for l in out.splitlines() if l.startswith("RESULT "))[len("RESULT "):])
    first, second = result["pulls"]
    assert first["ok"] and first["pulled"] == 1 and not first["reasons"], result
    assert second["ok"] and second["pulled"] == 1 and not second["reasons"], result
    assert first["seconds"] >= 2.5, result          # one op timeout (3 s) on tcp first
    assert second["seconds"] < first["seconds"] - 2, result  # then sockets at once
    assert result["links"] == [{"provider": "sockets", "unusable": ["tcp;ofi_rxm"], "objects": 2}], result
