"""README's main job: a local 2-node Ray cluster moves the same kind of object both ways, once
through Ray's own object manager and once through rayfabric (fi_read from the source node's plasma
memory into the destination node's plasma), and prints both times.

    python3 -m rayfabric.demo [--size-mb 1024] [--provider 'tcp;ofi_rxm'] [--json FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import ray
from ray.cluster_utils import Cluster
from ray.core.generated import common_pb2

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


def owner_fields(ref):
    addr = common_pb2.Address()
    addr.ParseFromString(ray._private.worker.global_worker.core_worker.get_owner_address(ref))
    return [addr.node_id.hex(), addr.ip_address, str(addr.port), addr.worker_id.hex()]


def fabric_copy(ref, src_socket, dst_socket, provider=None):
    cmd = [os.path.join(bin_dir(), "src", "agent", "rayfabric-copy"), "pull", src_socket, dst_socket,
           ref.hex(), *owner_fields(ref), "--ray-version", ray.__version__]
    if provider:
        cmd += ["--provider", provider]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"rayfabric-copy printed nothing (rc {out.returncode}): {out.stderr[-2000:]}")
    result = json.loads(lines[-1])
    if not result.get("ok"):
        raise RuntimeError(f"rayfabric-copy failed: {result}")
    return result


def start_cluster(store_bytes):
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"node_a": 1}, "object_store_memory": store_bytes,
        "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"node_b": 1}, object_store_memory=store_bytes)
    ray.init(address=c.address, logging_level="ERROR")
    c.wait_for_nodes()
    sockets = {}
    for n in ray.nodes():
        if n["Alive"]:
            for name in ("node_a", "node_b"):
                if name in n["Resources"]:
                    sockets[name] = n["ObjectStoreSocketName"]
    return c, sockets


def on(node, fn):
    return fn.options(resources={node: 0.01})


def run(size_bytes, provider=None, log=print):
    """Moves objects A->B and B->A both ways; returns a list of result dicts."""
    store_bytes = max(3 * size_bytes + (256 << 20), 512 << 20)
    cluster, sockets = start_cluster(store_bytes)
    results = []
    try:
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
                    copy = fabric_copy(ref, sockets[src], sockets[dst], provider)
                got = ray.get(on(dst, fingerprint).remote(ref))
                seconds = time.perf_counter() - t0
                locations = ray.experimental.get_object_locations([ref])[ref]["node_ids"]
                r = {"direction": f"{src}->{dst}", "path": path, "bytes": size_bytes, "seconds": seconds,
                     "gbps": size_bytes / seconds / 1e9, "fingerprint_ok": got == expected_fingerprint(size_bytes, seed),
                     "copies": len(locations), "copy": copy}
                results.append(r)
                log(f"  {r['direction']:16s} {path:10s} {seconds:8.3f} s {r['gbps']:7.3f} GB/s"
                    f"  bytes ok: {r['fingerprint_ok']}" + (f"  (fi_read {copy['read_gbps']:.2f} GB/s over {copy['provider']})" if copy else ""))
                del ref
    finally:
        ray.shutdown()
        cluster.shutdown()
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
