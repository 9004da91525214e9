"""ray.wait(..., fetch_local=True) over the fabric (rayfabric.waits, part of transparent mode) on a
REAL 4-node Ray cluster, transparent mode in the driver and (the job's runtime_env) every worker.

  n0: head, the driver; n1: makes the blocks; n2: the consumer (an actor); n3: its agent may use
  udp only (FI_PROVIDER=udp), so no pair shares a provider with it and its objects go Ray's way.

Ray Data's iterator prefetches with ray.wait(blocks, num_returns=1, timeout=0, fetch_local=True)
from a thread, then ray.gets each block; the consumer does exactly that, on blocks made on n1. The
blocks must come by the fabric (n2's agent pulled their bytes), identical, and Ray's own object
manager on n2 must receive none of them (its ray_object_manager_bytes{Type="Received"} metric,
checked against the same pattern with the hook off: RAYFABRIC_WAITS=0, whose bytes it must count).
Ray Data's own iterator (iter_batches in a trainer actor) and Ray's own ActorPool (ray.wait on
the actors' results) move their objects by the fabric. The
answers stay Ray's: order, num_returns, timeouts, objects not made yet, small ones, errors; a
block the fabric cannot bring (n3) comes by Ray's path, counted as a fallback."""
import hashlib
import os
import re
import time
import urllib.request

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util import ActorPool

import rayfabric
from rayfabric import transparent, waits

from ray_test_cluster import node_ids, on, use_this_checkout

MiB = 1 << 20
BLOCK = 8 * MiB
SCRAPE_S = 60


@pytest.fixture(scope="module")
def cluster():
    use_this_checkout()
    os.environ["RAY_metrics_report_interval_ms"] = "1000"  # Ray's own counters, scraped below
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"n0": 100}, "object_store_memory": 300 * MiB, "include_dashboard": False})
    for name in ("n1", "n2", "n3"):
        c.add_node(num_cpus=1, resources={name: 100}, object_store_memory=300 * MiB)
    ray.init(address=c.address, logging_level="ERROR", runtime_env=transparent.runtime_env())
    c.wait_for_nodes()
    ids = node_ids(("n0", "n1", "n2", "n3"))
    rayfabric.init(watch_new_nodes=False, node_env={ids["n3"]: {"FI_PROVIDER": "udp"}})
    transparent.enable()
    yield ids
    transparent.disable()
    rayfabric.shutdown()
    ray.shutdown()
    c.shutdown()


def make(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def digest(a):
    return hashlib.sha256(np.asarray(a).tobytes()).hexdigest()


@ray.remote(num_cpus=0)
def produce(nbytes, seed, delay_s=0.0):
    time.sleep(delay_s)
    return make(nbytes, seed)


@ray.remote(num_cpus=0)
class Consumer:
    """Ray Data's iterator, as it fetches: a prefetching ray.wait(timeout=0), then a get per block."""

    def iterate(self, wrapped, hook=True):
        blocks = wrapped[0]
        if not hook:  # the opt-out, as a job sets it
            transparent.disable()
            os.environ["RAYFABRIC_WAITS"] = "0"
            transparent.enable()
        try:
            before, start = rayfabric.stats(), time.monotonic()
            ready, rest = ray.wait(blocks, num_returns=1, timeout=0, fetch_local=True)
            first = {"seconds": time.monotonic() - start, "ready": len(ready), "rest": len(rest),
                     "in_order": in_order(ready, blocks) and in_order(rest, blocks)}
            # Nothing else asks for them: Ray Data's prefetch alone must bring them (as Ray's would).
            first["local_after_prefetch"] = all(located_here(blocks, timeout=60)) if hook else None
            all_ready, not_ready = ray.wait(blocks, num_returns=len(blocks), timeout=120, fetch_local=True)
            local = located_here(blocks)
            digests = [digest(ray.get(b)) for b in blocks]
            after = rayfabric.stats()
            return {"seconds": time.monotonic() - start, "first": first, "all_ready": all_ready == blocks, "not_ready": len(not_ready),
                    "local": local, "digests": digests, "hooked": waits.installed(),
                    **{k: after[k] - before[k] for k in ("waits_by_fabric", "fallbacks", "objects_pulled")}}
        finally:
            if not hook:
                transparent.disable()
                os.environ.pop("RAYFABRIC_WAITS")
                transparent.enable()


@ray.remote(num_cpus=0)
class Maker:
    def make(self, seed):
        return make(BLOCK, seed)


def located_here(refs, timeout=30):
    """Per ref, whether Ray's directory lists this node as holding a copy (the raylet tells the
    owner a moment after the copy is sealed: read until it does, or `timeout`)."""
    here = ray.get_runtime_context().get_node_id()
    deadline = time.monotonic() + timeout
    while True:
        located = ray.experimental.get_object_locations(refs)
        out = [here in (located.get(r) or {}).get("node_ids", []) for r in refs]
        if all(out) or time.monotonic() > deadline:
            return out
        time.sleep(0.2)


def in_order(part, whole):
    """`part` keeps the order its refs have in `whole`."""
    return part == [r for r in whole if r in set(part)]


def agent(node_hex):
    a = rayfabric.status()["agents"][node_hex]
    return {k: a[k] for k in ("objects_pulled", "bytes_pulled")}


def ray_received(node_hex):
    """Bytes Ray's own object manager on the node received from other nodes (its metric)."""
    n = next(n for n in ray.nodes() if n["NodeID"] == node_hex)
    text = urllib.request.urlopen(f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics",
                                  timeout=10).read().decode()
    total = None
    for line in text.splitlines():
        m = re.match(r'^ray_object_manager_bytes\{(.*)\} (\S+)$', line)
        if m and 'Type="Received"' in m.group(1):
            total = (total or 0.0) + float(m.group(2))
    return total


def blocks_on(node, seeds):
    refs = [on(node, produce).remote(BLOCK, s) for s in seeds]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=120, fetch_local=False)
    assert len(ready) == len(refs)
    return refs


def test_a_prefetching_wait_brings_blocks_by_the_fabric_and_ray_moves_none(cluster):
    n2 = cluster["n2"]
    consumer = on("n2", Consumer).remote()
    seeds = list(range(100, 108))
    want = [digest(make(BLOCK, s)) for s in seeds]
    received_before, agent_before = ray_received(n2), agent(n2)
    assert received_before is not None, "Ray's ray_object_manager_bytes is not on n2's endpoint"

    out = ray.get(consumer.iterate.remote([blocks_on("n1", seeds)]), timeout=300)
    print("fabric:", {k: v for k, v in out.items() if k != "digests"})
    assert out["hooked"]
    assert out["first"]["ready"] <= 1 and out["first"]["ready"] + out["first"]["rest"] == 8, out["first"]
    assert out["first"]["in_order"] and out["first"]["local_after_prefetch"], out["first"]
    assert out["all_ready"] and out["not_ready"] == 0 and all(out["local"]), out
    assert out["digests"] == want
    assert out["waits_by_fabric"] == 8 and out["fallbacks"] == 0, out
    agent_after = agent(n2)
    assert agent_after["objects_pulled"] - agent_before["objects_pulled"] == 8
    assert agent_after["bytes_pulled"] - agent_before["bytes_pulled"] >= 8 * BLOCK

    # The same with the hook off: Ray's object manager moves these (so its counter is the one that
    # would have counted the first eight), and the fabric none.
    control_seeds = list(range(200, 208))
    off = ray.get(consumer.iterate.remote([blocks_on("n1", control_seeds)], hook=False), timeout=300)
    assert not off["hooked"] and off["waits_by_fabric"] == 0 and off["objects_pulled"] == 0, off
    assert off["digests"] == [digest(make(BLOCK, s)) for s in control_seeds]
    assert agent(n2)["objects_pulled"] == agent_after["objects_pulled"]
    deadline = time.monotonic() + SCRAPE_S
    while (ray_received(n2) or 0) - received_before < 8 * BLOCK and time.monotonic() < deadline:
        time.sleep(1)
    time.sleep(2)  # one more report of Ray's counters
    moved_by_ray = ray_received(n2) - received_before
    print(f"Ray's object manager on n2 received {moved_by_ray / MiB:.1f} MiB "
          f"(the hook-off blocks: {8 * BLOCK / MiB:.0f} MiB)")
    assert 8 * BLOCK <= moved_by_ray < 9 * BLOCK, moved_by_ray
    # `rayfabric status` shows the same: Ray's bytes into n2 beside the fabric's, and the share.
    shown = rayfabric.status()["agents"][n2]
    assert shown["ray_bytes_received"] == int(ray_received(n2)), shown
    assert shown["coverage"] == shown["bytes_pulled"] / (shown["bytes_pulled"] + shown["ray_bytes_received"])
    assert 0 < shown["coverage"] < 1, shown


@ray.remote(num_cpus=0)
def produce_table(rows, seed):
    import pyarrow as pa
    return pa.table({"x": np.random.default_rng(seed).integers(0, 1 << 62, size=rows, dtype=np.int64)})


@ray.remote(num_cpus=1)  # n2's one CPU: none of Ray Data's own tasks can run beside it
class Trainer:
    def ready(self):
        return ray.get_runtime_context().get_node_id()

    def ingest(self, ds):
        before = rayfabric.stats()
        digests = [digest(batch["x"]) for batch in ds.iter_batches(batch_size=None, batch_format="numpy")]
        after = rayfabric.stats()
        return {"digests": digests, **{k: after[k] - before[k] for k in ("waits_by_fabric", "fallbacks")}}


def test_ray_data_iter_batches_ingest_comes_by_the_fabric(cluster):
    """Ray Data's own iterator (iter_batches, its WaitBlockPrefetcher) in a trainer actor on n2, over
    blocks made on n1: every block by the fabric, none by Ray's object manager on n2."""
    pytest.importorskip("pyarrow", reason="ray[data] is not installed (scripts/setup.sh installs it)")
    n2 = cluster["n2"]
    trainer = on("n2", Trainer).remote()
    assert ray.get(trainer.ready.remote(), timeout=120) == n2
    rows, seeds = 1 << 20, list(range(700, 708))  # 8 x 8 MiB Arrow blocks
    tables = [on("n1", produce_table).remote(rows, s) for s in seeds]
    ray.wait(tables, num_returns=len(tables), timeout=120, fetch_local=False)
    ds = ray.data.from_arrow_refs(tables)
    time.sleep(2)  # Ray's counters as of now (reported every second)
    received_before, agent_before = ray_received(n2), agent(n2)
    out = ray.get(trainer.ingest.remote(ds), timeout=300)
    want = [digest(np.random.default_rng(s).integers(0, 1 << 62, size=rows, dtype=np.int64)) for s in seeds]
    assert sorted(out["digests"]) == sorted(want)
    assert out["fallbacks"] == 0, out
    pulled = agent(n2)["bytes_pulled"] - agent_before["bytes_pulled"]
    assert pulled >= 8 * rows * 8, pulled
    time.sleep(3)  # two reports of Ray's counters
    moved_by_ray = ray_received(n2) - received_before
    print(f"Ray Data iter_batches on n2: {pulled / MiB:.1f} MiB by the fabric, {moved_by_ray / MiB:.1f} MiB "
          f"received by Ray's object manager, waits pulled {out['waits_by_fabric']}")
    assert moved_by_ray < 1 * MiB, moved_by_ray


def test_ray_actor_pool_results_come_by_the_fabric(cluster):
    n0 = cluster["n0"]
    pool = ActorPool([on("n1", Maker).remote() for _ in range(2)])
    before, agent_before = rayfabric.stats(), agent(n0)
    seeds = list(range(300, 306))
    got = sorted(digest(a) for a in pool.map_unordered(lambda a, s: a.make.remote(s), seeds))
    assert got == sorted(digest(make(BLOCK, s)) for s in seeds)
    after = rayfabric.stats()
    assert after["waits_by_fabric"] - before["waits_by_fabric"] == 6, (before, after)
    assert agent(n0)["objects_pulled"] - agent_before["objects_pulled"] == 6
    assert after["fallbacks"] == before["fallbacks"]


def test_the_answers_stay_rays(cluster):
    before = rayfabric.stats()
    # Not made yet: a timeout answers nothing ready; a blocking wait answers once made and here.
    late = [on("n1", produce).remote(BLOCK, 400, 20.0), on("n1", produce).remote(BLOCK, 401, 0.0)]
    ready, rest = ray.wait(late, num_returns=2, timeout=0.5)
    assert ready == [] or ready == [late[1]], ready
    assert set(ready) | set(rest) == set(late) and in_order(rest, late)
    ready, rest = ray.wait(late, num_returns=1, timeout=18)
    assert ready == [late[1]] and rest == [late[0]], (ready, rest)
    ready, rest = ray.wait(late, num_returns=2, timeout=60)
    assert ready == late and rest == []
    assert [digest(a) for a in ray.get(late)] == [digest(make(BLOCK, s)) for s in (400, 401)]
    # Small results (inlined in their owner) and objects here already: Ray's answers at once.
    small = [on("n1", produce).remote(100, s) for s in range(5)]
    local = [ray.put(make(BLOCK, 402))]
    ready, rest = ray.wait(small + local, num_returns=6, timeout=60)
    assert set(ready) == set(small + local) and in_order(ready, small + local) and rest == []
    # num_returns: that many of the ready (which is Ray's to choose), each list in the order given.
    ready, rest = ray.wait(late + small, num_returns=3, timeout=60)
    assert len(ready) == 3 and set(ready) | set(rest) == set(late + small) and not set(ready) & set(rest)
    assert in_order(ready, late + small) and in_order(rest, late + small)
    # Ray's own errors for bad calls.
    with pytest.raises(ValueError):
        ray.wait(late, num_returns=3)
    with pytest.raises(Exception, match="unique"):
        ray.wait([late[0], late[0]])
    # fetch_local=False is Ray's alone: nothing is moved.
    fresh = blocks_on("n1", [403])
    pulled = rayfabric.stats()["waits_by_fabric"]
    assert ray.wait(fresh, timeout=60, fetch_local=False)[0] == fresh
    assert rayfabric.stats()["waits_by_fabric"] == pulled
    after = rayfabric.stats()
    assert after["waits_by_fabric"] - before["waits_by_fabric"] == 2, (before, after)  # `late`
    assert after["fallbacks"] == before["fallbacks"]


def test_a_block_the_fabric_cannot_bring_comes_by_rays_path(cluster):
    # n3's agent may use udp only: no pair shares a provider with it.
    before = rayfabric.stats()
    refs = blocks_on("n3", [500, 501])
    ready, rest = ray.wait(refs, num_returns=2, timeout=120)
    assert ready == refs and rest == []
    assert all(located_here(refs))
    assert [digest(a) for a in ray.get(refs)] == [digest(make(BLOCK, s)) for s in (500, 501)]
    after = rayfabric.stats()
    assert after["waits_by_fabric"] - before["waits_by_fabric"] == 2
    assert after["fallbacks"] > before["fallbacks"], (before, after)
    assert after["objects_pulled"] == before["objects_pulled"]


def test_on_a_node_without_an_agent_the_wait_is_rays(cluster):
    # n3 has no agent (udp only): its waits go straight to Ray (its gets count that fallback).
    consumer = on("n3", Consumer).remote()
    seeds = [600, 601]
    out = ray.get(consumer.iterate.remote([blocks_on("n1", seeds)]), timeout=300)
    assert out["hooked"], out  # installed, but passing through
    assert out["all_ready"] and all(out["local"]), out
    assert out["digests"] == [digest(make(BLOCK, s)) for s in seeds]
    assert out["waits_by_fabric"] == 0 and out["objects_pulled"] == 0, out
