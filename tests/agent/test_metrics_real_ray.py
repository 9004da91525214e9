"""rayfabric's metrics where Ray users look: each node's Prometheus endpoint (its metrics export
port, served by Ray's own metrics agent), on a REAL 3-node Ray cluster.

  n0: the source; n1: the reader; n2: libfabric restricted to udp (FI_PROVIDER=udp), so no agent
  can start there and its gets go Ray's path (a fallback, counted by reason).

An 8 MiB object made on n0 is pulled by rayfabric.get on n1; the same object is got on n2. Then the
endpoints are scraped (the agents' counters are mirrored every second here,
RAYFABRIC_METRICS_INTERVAL_S=1; Ray exports every ~10 s) until they show, with the values the agents
themselves report: on n1 the bytes and objects pulled, the pull by outcome, the bytes per source
agent with the provider the pair used, the get latency histogram on the fabric path; on n0 the lease
granted and the bytes served; on n2 the fallback with its reason."""
import hashlib
import re
import time
import urllib.request

import numpy as np
import pytest
import ray

import rayfabric

from ray_test_cluster import agents_cluster, on, produce

MiB = 1 << 20
NODES = ("n0", "n1", "n2")
SCRAPE_S = 90


@pytest.fixture(scope="module")
def cluster():
    with agents_cluster(NODES, env={"RAYFABRIC_METRICS_INTERVAL_S": "1"}, node_env={"n2": {"FI_PROVIDER": "udp"}}) as c:
        yield {"nodes": c["nodes"], "records": c["records"]}


@ray.remote(num_cpus=0)
def fetch(refs):
    import rayfabric as rf
    before = rf.stats()
    value = rf.get(refs[0], timeout=120)
    after = rf.stats()
    return {"sha256": hashlib.sha256(value.tobytes()).hexdigest(),
            "pulled": after["objects_pulled"] - before["objects_pulled"],
            "fallbacks": after["fallbacks"] - before["fallbacks"]}


def scrape(node_hex):
    n = next(n for n in ray.nodes() if n["NodeID"] == node_hex)
    url = f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
    return urllib.request.urlopen(url, timeout=10).read().decode()


def samples(text, name):
    """[(labels dict, value)] of metric `name` in a Prometheus text page."""
    out = []
    for line in text.splitlines():
        m = re.match(r"^" + re.escape(name) + r"\{(.*)\} (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            out.append((labels, float(m.group(2))))
    return out


def value(text, name, **labels):
    """Sum of the samples of `name` whose labels include `labels` (None if there is none)."""
    hits = [v for lab, v in samples(text, name) if all(lab.get(k) == w for k, w in labels.items())]
    return sum(hits) if hits else None


def wait_for(node_hex, want):
    """Scrapes until every (name, labels, check) in `want` holds; returns the last page."""
    deadline = time.monotonic() + SCRAPE_S
    while True:
        text = scrape(node_hex)
        missing = [(name, labels) for name, labels, ok in want if not ok(value(text, name, **labels))]
        if not missing:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"not on {node_hex[:12]}'s endpoint after {SCRAPE_S} s: {missing}\n"
                                 + "\n".join(l for l in text.splitlines() if "rayfabric" in l)[:4000])
        time.sleep(2)


def test_agent_and_get_metrics_reach_each_nodes_prometheus_endpoint(cluster):
    nodes = cluster["nodes"]
    assert nodes["n2"] not in cluster["records"]  # no agent could start there
    ref = on("n0", produce).remote(8 * MiB, 11)
    ray.wait([ref], fetch_local=False, timeout=60)
    want = hashlib.sha256(np.random.default_rng(11).integers(0, 256, size=8 * MiB, dtype=np.uint8)
                          .tobytes()).hexdigest()
    got = ray.get(on("n1", fetch).remote([ref]), timeout=180)
    assert got == {"sha256": want, "pulled": 1, "fallbacks": 0}, got
    ray_path = ray.get(on("n2", fetch).remote([ref]), timeout=180)
    assert ray_path["sha256"] == want and ray_path["pulled"] == 0 and ray_path["fallbacks"] == 1, ray_path

    agents = rayfabric.status()["agents"]
    reader, source = agents[nodes["n1"]], agents[nodes["n0"]]
    pulled_bytes = reader["bytes_pulled"]
    assert pulled_bytes >= 8 * MiB and reader["objects_pulled"] == 1, reader
    link = reader["peer_links"][0]
    n1, n0 = nodes["n1"][:12], nodes["n0"][:12]

    text = wait_for(nodes["n1"], [
        ("ray_rayfabric_bytes_pulled_total", {"node": n1}, lambda v: v == pulled_bytes),
        ("ray_rayfabric_objects_pulled_total", {"node": n1}, lambda v: v == 1),
        ("ray_rayfabric_pulls_total", {"node": n1, "outcome": "pulled"}, lambda v: v == 1),
        ("ray_rayfabric_peer_bytes_pulled_total", {"node": n1, "peer": link["peer"], "provider": link["provider"]},
         lambda v: v == pulled_bytes),
        ("ray_rayfabric_rail_bytes_read_total", {"node": n1, "rail": "1"}, lambda v: v == pulled_bytes),
        ("ray_rayfabric_get_seconds_count", {"path": "fabric"}, lambda v: v is not None and v >= 1),
    ])
    # Ray's own object manager metrics are on the same page: the two can be graphed side by side.
    assert "ray_object_manager" in text or "ray_object_store" in text

    wait_for(nodes["n0"], [
        ("ray_rayfabric_leases_total", {"node": n0, "event": "granted"},
         lambda v: v == source["leases_granted"] and v >= 1),
        ("ray_rayfabric_bytes_served_total", {"node": n0}, lambda v: v == source["bytes_leased"] and v >= pulled_bytes),
        ("ray_rayfabric_pinned_bytes", {"node": n0}, lambda v: v is not None),
    ])
    wait_for(nodes["n2"], [
        ("ray_rayfabric_fallbacks_total", {"reason": "no rayfabric agent on this node (*)"}, lambda v: v == 1),
        ("ray_rayfabric_get_seconds_count", {"path": "ray"}, lambda v: v is not None and v >= 1),
    ])
