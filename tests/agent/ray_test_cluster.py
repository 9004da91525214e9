"""What every real-Ray test module here does the same way: workers that import this checkout
(the package and these test modules), a patient health check, nodes found by their custom
resource, calls pinned to them."""
import os

import ray

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


def on(node, fn):
    """`fn` (a remote function or actor class) pinned to the node with resource `node`."""
    return fn.options(resources={node: 0.01})
