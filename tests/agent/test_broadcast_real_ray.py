"""rayfabric.broadcast on a REAL Ray: a 4-node ray.cluster_utils.Cluster (tcp;ofi_rxm agents), one
object made on n0 copied into every other node's store in rounds where each holder serves one more
node (n0 -> 1 node, then 2 holders -> 2 nodes), every copy byte-identical (sha256 on each node),
each destination's pull counted by its own process, and the sources each round used are the
holders of that round. Also: readers of an object held by several nodes spread across them
(rendezvous choice), and broadcast of an object in no store is refused with the reason."""
import hashlib

import pytest
import ray

import rayfabric
from rayfabric import _agents

from ray_test_cluster import agents_cluster, on, produce

MiB = 1 << 20
NODES = ("n0", "n1", "n2", "n3")


@pytest.fixture(scope="module")
def cluster():
    with agents_cluster(NODES, env={"RAYFABRIC_PROVIDER": "tcp;ofi_rxm"}) as c:
        yield c["nodes"]


@ray.remote(num_cpus=0)
def local_copy(refs):
    """sha256 of this node's copy, and whether Ray found it here (no transfer)."""
    import ray as r
    node = r.get_runtime_context().get_node_id()
    here = node in (r.experimental.get_object_locations(refs)[refs[0]]["node_ids"] or [])
    return hashlib.sha256(r.get(refs[0]).tobytes()).hexdigest(), here


def test_broadcast_copies_to_every_node_in_doubling_rounds(cluster):
    nodes = cluster
    ref = on("n0", produce).remote(24 * MiB, 7)
    want, _ = ray.get(on("n0", local_copy).remote([ref]))
    rounds = rayfabric.broadcast(ref, nodes=list(nodes.values()), timeout=120)
    assert [len(r) for r in rounds] == [1, 2], rounds
    assert rounds[0][0]["source"] == nodes["n0"], rounds
    for pair in (p for r in rounds for p in r):  # each read by the fabric from its assigned source
        assert pair["pulled"] and pair["local"] and pair["read_from"] == [pair["source"]], pair
    first = rounds[0][0]["destination"]
    assert {p["source"] for p in rounds[1]} == {nodes["n0"], first}, rounds
    assert {p["destination"] for r in rounds for p in r} == {nodes[n] for n in NODES[1:]}
    for name in NODES[1:]:
        digest, here = ray.get(on(name, local_copy).remote([ref]))
        assert digest == want and here, name


def test_a_destination_whose_agent_died_gets_the_object_by_rays_path_in_its_round(cluster):
    """n3's agent is killed (for real): its round's fabric pull fails, Ray copies the object there
    in the same round, and the result says so (pulled false, local true); the copy is right."""
    nodes = cluster
    ref = on("n0", produce).remote(8 * MiB, 11)
    want, _ = ray.get(on("n0", local_copy).remote([ref]))
    n3_agent = _agents.actor_of(nodes["n3"])
    assert ray.get(n3_agent.kill_agent.remote()) != 0
    try:
        rounds = rayfabric.broadcast(ref, nodes=[nodes["n0"], nodes["n3"]], timeout=120)
        (pair,) = [p for r in rounds for p in r]
        assert pair["destination"] == nodes["n3"] and not pair["pulled"] and pair["local"], rounds
        digest, here = ray.get(on("n3", local_copy).remote([ref]))
        assert digest == want and here
    finally:
        ray.get(n3_agent.restart.remote())


@ray.remote(num_cpus=0)
def produce_later(nbytes, seed, delay_s):
    """As produce, `delay_s` later."""
    import time as t
    import numpy as np
    t.sleep(delay_s)
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def test_broadcast_of_a_result_still_being_computed_waits_for_it(cluster):
    nodes = cluster
    ref = on("n0", produce_later).remote(8 * MiB, 13, 2.0)
    rounds = rayfabric.broadcast(ref, nodes=list(nodes.values()), timeout=120)  # before the task ended
    assert [len(r) for r in rounds] == [1, 2], rounds
    assert all(p["pulled"] and p["local"] for r in rounds for p in r), rounds
    want, _ = ray.get(on("n0", local_copy).remote([ref]))
    for name in NODES[1:]:
        digest, here = ray.get(on(name, local_copy).remote([ref]))
        assert digest == want and here, name
    late = on("n0", produce_later).remote(8 * MiB, 14, 30.0)
    with pytest.raises(ray.exceptions.GetTimeoutError, match="was not made within 1 s"):
        rayfabric.broadcast(late, nodes=list(nodes.values()), timeout=1)
    ray.cancel(late, force=True)


def test_broadcast_of_an_object_in_no_store_is_refused(cluster):
    small = on("n1", produce).remote(100, 1)  # a small task result: inlined in its owner, no store
    ray.wait([small])
    with pytest.raises(ValueError, match="in no node's object store"):
        rayfabric.broadcast(small, nodes=list(cluster.values()))
