"""One cross-node rayfabric.get on whatever Ray release is installed: CI runs it with the newest
release the package declares (the main suite) and with the oldest (tests/agent/oldest_ray.sh, in its
own virtual environment). A 2-node cluster, an agent on each, a 16 MiB object pulled by fi_read,
bytes checked, no fallback."""
import importlib

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

import rayfabric

from ray_test_cluster import node_ids, on, use_this_checkout

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster():
    use_this_checkout()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"n0": 100}, "object_store_memory": 200 * MiB, "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"n1": 100}, object_store_memory=200 * MiB)
    ray.init(address=c.address, logging_level="ERROR")
    c.wait_for_nodes()
    rayfabric.init(watch_new_nodes=False)
    yield node_ids(("n0", "n1"))
    rayfabric.shutdown()
    ray.shutdown()
    c.shutdown()


@ray.remote(num_cpus=0)
def produce(nbytes):
    return np.random.default_rng(7).integers(0, 256, size=nbytes, dtype=np.uint8)


@ray.remote(num_cpus=0)
def fetch(refs):
    import rayfabric as rf
    before = rf.stats()
    value = rf.get(refs[0], timeout=120)
    after = rf.stats()
    return (int(value.sum()), value.nbytes, after["objects_pulled"] - before["objects_pulled"],
            after["fallbacks"] - before["fallbacks"], dict(after["fallback_reasons"]))


def test_rdt_says_which_ray_it_needs():
    """rayfabric.rdt uses Ray Direct Transport as Ray 2.56 has it: on an older Ray importing it says
    so (the oldest supported Ray, 2.49, has no such module)."""
    version = tuple(int(x) for x in ray.__version__.split(".")[:2])
    if version >= (2, 56):
        pytest.importorskip("torch", reason="torch is not installed")
        importlib.import_module("rayfabric.rdt")  # imports cleanly
        return
    with pytest.raises(ImportError, match=r"needs Ray 2\.56\.0 or later.*this is Ray " + ray.__version__):
        importlib.import_module("rayfabric.rdt")


def test_cross_node_get_on_this_ray(cluster):
    ref = on("n0", produce).remote(16 * MiB)
    want = int(np.random.default_rng(7).integers(0, 256, size=16 * MiB, dtype=np.uint8).sum())
    total, nbytes, pulled, fallbacks, reasons = ray.get(on("n1", fetch).remote([ref]), timeout=180)
    print(f"Ray {ray.__version__}: pulled {pulled}, fallbacks {fallbacks}")
    assert (total, nbytes) == (want, 16 * MiB)
    assert pulled == 1 and fallbacks == 0, reasons
