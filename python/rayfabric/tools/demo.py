"""README's main job: a local 2-node Ray cluster moves the same kind of object both ways, once
through Ray's own object manager and once through rayfabric (fi_read from the source node's plasma
memory into the destination node's plasma, by the node agents rayfabricd), and prints both times.

    python3 -m rayfabric.tools.demo [--size-mb 1024] [--provider 'tcp;ofi_rxm'] [--json FILE]
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import ray
from ray.cluster_utils import Cluster

import rayfabric
from rayfabric import bin_dir


@ray.remote(num_cpus=0)
def make_array(nbytes, seed):
    arr = np.empty(nbytes, dtype=np.uint8)
    arr[::4096] = np.random.default_rng(seed).integers(0, 256, size=len(arr[::4096]), dtype=np.uint8)
    arr[-1] = seed % 251
    return arr


@ray.remote(num_cpus=0)
def sha256(arr):
    import hashlib
    return hashlib.sha256(arr.data).hexdigest()


@ray.remote(num_cpus=0)
def fingerprint(arr):
    # Cheap check of the bytes that arrived (one byte per page plus the last one).
    return int(arr[::4096].astype(np.uint64).sum()), int(arr[-1]), len(arr)


def expected_fingerprint(nbytes, seed):
    sample = np.random.default_rng(seed).integers(0, 256, size=len(range(0, nbytes, 4096)), dtype=np.uint8)
    if (nbytes - 1) % 4096 == 0:
        sample[-1] = seed % 251  # the producer overwrote it
    return int(sample.astype(np.uint64).sum()), seed % 251, nbytes


@ray.remote(num_cpus=0)
def fingerprint_via_rayfabric(refs):
    # The ref arrives wrapped in a list, so Ray does not resolve it: rayfabric.get moves the bytes
    # by the fabric into this node's store, then ray.get maps them.
    import rayfabric as rf
    before = rf.stats()
    arr = rf.get(refs[0])
    after = rf.stats()
    return fingerprint_local(arr), after["bytes_pulled"] - before["bytes_pulled"], after["fallback_reasons"]


def fingerprint_local(arr):
    return int(arr[::4096].astype(np.uint64).sum()), int(arr[-1]), len(arr)


def start_cluster(store_bytes):
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"node_a": 1}, "object_store_memory": store_bytes,
        "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=store_bytes)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(rayfabric.__file__)))  # python/, or site-packages
    ray.init(address=c.address, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": pkg_root, "RAYFABRIC_BIN_DIR": bin_dir()}})
    c.wait_for_nodes()
    return c


def on(node, fn):
    return fn.options(resources={node: 0.01})


def run(size_bytes, provider=None, log=print):
    """Moves objects A->B and B->A both ways; returns a list of result dicts."""
    store_bytes = max(3 * size_bytes + (256 << 20), 512 << 20)
    cluster = start_cluster(store_bytes)
    results = []
    try:
        agents = rayfabric.init(provider=provider, watch_new_nodes=False)
        used = sorted({a["provider"] for a in agents.values()})
        log(f"  agents: {len(agents)} nodes, provider {', '.join(used)}")
        for node in ("node_a", "node_b"):  # start the workers before timing anything
            ray.get(on(node, fingerprint).remote(np.zeros(8, dtype=np.uint8)))
        seed = 1
        for src, dst in (("node_a", "node_b"), ("node_b", "node_a")):
            for path in ("ray", "rayfabric"):
                seed += 1
                ref = on(src, make_array).remote(size_bytes, seed)
                ready, _ = ray.wait([ref], timeout=300, fetch_local=False)
                assert ready, "the producer task did not finish"
                copy = None
                t0 = time.perf_counter()
                if path == "rayfabric":
                    got, fabric_bytes, reasons = ray.get(on(dst, fingerprint_via_rayfabric).remote([ref]))
                    copy = {"fabric_bytes": fabric_bytes, "fallbacks": reasons, "provider": ", ".join(used)}
                else:
                    got = ray.get(on(dst, fingerprint).remote(ref))
                seconds = time.perf_counter() - t0
                locations = ray.experimental.get_object_locations([ref])[ref]["node_ids"]
                r = {"direction": f"{src}->{dst}", "path": path, "bytes": size_bytes, "seconds": seconds,
                     "gbps": size_bytes / seconds / 1e9, "fingerprint_ok": got == expected_fingerprint(size_bytes, seed),
                     "copies": len(locations), "copy": copy}
                results.append(r)
                log(f"  {r['direction']:16s} {path:10s} {seconds:8.3f} s {r['gbps']:7.3f} GB/s"
                    f"  bytes ok: {r['fingerprint_ok']}" + (f"  ({copy['fabric_bytes'] / 2**20:.0f} MiB by fi_read over {copy['provider']})" if copy else ""))
                del ref
    finally:
        rayfabric.shutdown()
        ray.shutdown()
        cluster.shutdown()
    return results


def main(argv=None):
    p = argparse.ArgumentParser(prog="rayfabric demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--provider", default=os.environ.get("RAYFABRIC_PROVIDER") or None)
    p.add_argument("--json")
    a = p.parse_args(argv)
    print(f"rayfabric demo: Ray {ray.__version__}, 2-node local cluster, {a.size_mb} MiB numpy array, "
          f"each direction through Ray's object manager and through rayfabric")
    results = run(a.size_mb << 20, a.provider)
    print("\nsummary (time from request to a task on the destination node holding the array):")
    for d in ("node_a->node_b", "node_b->node_a"):
        rr = {r["path"]: r for r in results if r["direction"] == d}
        print(f"  {d}: Ray {rr['ray']['seconds']:.3f} s, rayfabric {rr['rayfabric']['seconds']:.3f} s, "
              f"speed-up x{rr['ray']['seconds'] / rr['rayfabric']['seconds']:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(r["fingerprint_ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
