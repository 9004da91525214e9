"""What every real-Ray test module here does the same way: workers that import this checkout
(the package and these test modules), a patient health check, a cluster of named nodes with
rayfabric's agents, nodes found by their custom resource, calls pinned to them."""
import contextlib
import os

import numpy as np
import ray
from ray.cluster_utils import Cluster

import rayfabric


def use_this_checkout():
    """Workers import the package and the test modules (the remote functions) of this checkout,
    and find its binaries. A raylet starved for ~15 s on a loaded 2-core host is declared dead by
    default (5 missed 3 s health checks): give it ~60 s. Nodes removed by the tests leave at once."""
    pkg = os.path.abspath(os.path.join(os.path.dirname(rayfabric.__file__), ".."))
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join([pkg, here, os.environ.get("PYTHONPATH", "")])
    os.environ["RAYFABRIC_BIN_DIR"] = rayfabric.bin_dir()
    os.environ.setdefault("RAY_health_check_failure_threshold", "20")


def node_ids(names):
    """{name: NodeID hex} of the alive nodes that carry custom resource `name`."""
    ids = {}
    for n in ray.nodes():
        for name in names:
            if n["Alive"] and name in n["Resources"]:
                ids[name] = n["NodeID"]
    return ids


@ray.remote(num_cpus=0)
def produce(nbytes, seed):
    """`nbytes` pseudo-random bytes from `seed` (a numpy array): an object where it runs."""
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def located(refs, timeout=30):
    """{ref: node ids} once this process knows where every one of `refs` (made, ready) is stored:
    a task's reply reaches its owner a few ms before the raylet that stored the result says where
    (longer on a loaded host), and Ray's lease policy reads the same record."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        where = ray.experimental.get_local_object_locations(refs)
        nodes = {r: (where.get(r) or {}).get("node_ids") or [] for r in refs}
        if all(nodes.values()) or time.monotonic() > deadline:
            return nodes
        time.sleep(0.02)


def on(node, fn):
    """`fn` (a remote function or actor class) pinned to the node with resource `node`."""
    return fn.options(resources={node: 0.01})


@contextlib.contextmanager
def agents_cluster(names, store_bytes=300 << 20, env=None, node_env=None):
    """A ray.cluster_utils.Cluster with one 1-CPU node per name (custom resource `name`; the first
    is the head), this driver connected, rayfabric's agents started (`env` for all, `node_env`
    {name: env} for some); yields {"cluster", "nodes" ({name: node id}), "records"}; all shut down
    after."""
    use_this_checkout()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {names[0]: 100}, "object_store_memory": store_bytes,
        "include_dashboard": False})
    try:
        for name in names[1:]:
            c.add_node(num_cpus=1, resources={name: 100}, object_store_memory=store_bytes)
        ray.init(address=c.address, logging_level="ERROR")
        c.wait_for_nodes()
        nodes = node_ids(names)
        records = rayfabric.init(env=env, node_env={nodes[k]: v for k, v in (node_env or {}).items()},
                                 watch_new_nodes=False)
        try:
            yield {"cluster": c, "nodes": nodes, "records": records}
        finally:
            rayfabric.shutdown()
    finally:
        ray.shutdown()
        c.shutdown()
