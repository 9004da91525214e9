"""Ray Data ingest into a trainer on another node, three ways in one cluster, rep by rep in turn
(so that the machine's noise hits them alike): Ray alone (transparent mode off in the trainer),
transparent mode without the ray.wait hook (RAYFABRIC_WAITS=0: what rayfabric did before), and
transparent mode with it. Blocks (Arrow tables) are made on n1; a trainer actor on n2 runs
`ds.iter_batches(batch_size=None)` (Ray Data's WaitBlockPrefetcher) and hashes every batch.
Per way: median seconds, GB/s, MiB by the fabric (n2's agent) and MiB Ray's object manager on n2
received (its ray_object_manager_bytes{Type="Received"}, thrown-away chunks included), coverage =
fabric / (fabric + Ray), and whether every batch was identical.

    RAYFABRIC_BIN_DIR=build PYTHONPATH=python python3 bench/ray_data_ingest.py [--blocks 32] [--block 16M] [--reps 5]
"""
import os

os.environ["RAYFABRIC_AUTOLOAD"] = "0"  # the Ray side of the comparison is Ray alone
import argparse
import hashlib
import re
import statistics
import time
import urllib.request

import numpy as np
import ray
from ray.cluster_utils import Cluster

import rayfabric
from rayfabric import transparent
from rayfabric.bench.objects import parse_size

WAYS = ("ray", "rayfabric, no wait hook", "rayfabric")


@ray.remote(num_cpus=0)
def produce_table(rows, seed):
    import pyarrow as pa
    return pa.table({"x": np.random.default_rng(seed).integers(0, 1 << 62, size=rows, dtype=np.int64)})


@ray.remote(num_cpus=1)
class Trainer:
    def node(self):
        return ray.get_runtime_context().get_node_id()

    def ingest(self, ds, way):
        transparent.disable()
        if way != "ray":
            os.environ["RAYFABRIC_WAITS"] = "0" if way == "rayfabric, no wait hook" else "1"
            transparent.enable()
        try:
            start = time.perf_counter()
            digests = [hashlib.sha256(b["x"].tobytes()).hexdigest()
                       for b in ds.iter_batches(batch_size=None, batch_format="numpy")]
            return time.perf_counter() - start, digests
        finally:
            os.environ.pop("RAYFABRIC_WAITS", None)
            transparent.enable()


def ray_received(node_hex):
    n = next(n for n in ray.nodes() if n["NodeID"] == node_hex)
    text = urllib.request.urlopen(f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics",
                                  timeout=10).read().decode()
    return sum(float(m.group(2)) for m in (re.match(r'^ray_object_manager_bytes\{(.*)\} (\S+)$', line)
                                           for line in text.splitlines())
               if m and 'Type="Received"' in m.group(1))


def settled_received(node_hex):
    """Ray's counter once it stopped moving (it is reported every second here)."""
    last = ray_received(node_hex)
    while True:
        time.sleep(1.5)
        now = ray_received(node_hex)
        if now == last:
            return now
        last = now


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=32)
    p.add_argument("--block", default="16M", help="bytes per block (default 16M)")
    p.add_argument("--reps", type=int, default=5, help="timed reps per way (+1 warm-up each)")
    p.add_argument("--provider", default="tcp;ofi_rxm")
    a = p.parse_args()
    rows = parse_size(a.block) // 8
    os.environ["RAY_metrics_report_interval_ms"] = "1000"
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(rayfabric.__file__)))
    os.environ["PYTHONPATH"] = os.pathsep.join([pkg, os.environ.get("PYTHONPATH", "")])
    store = max(2 * a.blocks * rows * 8, 300 << 20)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"n0": 1},
                                                      "object_store_memory": store, "include_dashboard": False})
    for name in ("n1", "n2"):
        c.add_node(num_cpus=1, resources={name: 1}, object_store_memory=store)
    ray.init(address=c.address, logging_level="ERROR", runtime_env=transparent.runtime_env())
    c.wait_for_nodes()
    rayfabric.init(provider=a.provider, watch_new_nodes=False)
    try:
        trainer = Trainer.options(resources={"n2": 0.01}).remote()
        n2 = ray.get(trainer.node.remote(), timeout=120)
        results = {w: {"s": [], "fabric": 0.0, "ray": 0.0, "ok": True} for w in WAYS}
        seed = 0
        for rep in range(a.reps + 1):
            for way in WAYS:
                seeds = list(range(seed, seed + a.blocks))
                seed += a.blocks
                tables = [produce_table.options(resources={"n1": 0.01}).remote(rows, s) for s in seeds]
                ray.wait(tables, num_returns=len(tables), timeout=300, fetch_local=False)
                ds = ray.data.from_arrow_refs(tables)
                want = sorted(hashlib.sha256(np.random.default_rng(s).integers(0, 1 << 62, size=rows,
                                                                                dtype=np.int64).tobytes()).hexdigest()
                              for s in seeds)
                received, fabric = settled_received(n2), rayfabric.status()["agents"][n2]["bytes_pulled"]
                seconds, digests = ray.get(trainer.ingest.remote(ds, way), timeout=600)
                r = results[way]
                r["ok"] &= sorted(digests) == want
                if rep > 0:  # the first rep of each way warms up
                    r["s"].append(seconds)
                    r["fabric"] += rayfabric.status()["agents"][n2]["bytes_pulled"] - fabric
                    r["ray"] += settled_received(n2) - received
                del ds, tables
        total = a.blocks * rows * 8
        print(f"Ray Data ingest: {a.blocks} x {a.block} Arrow blocks made on n1, iter_batches in a trainer "
              f"on n2, {a.reps} reps per way (provider {a.provider})")
        print(f"{'way':26s} {'median s':>9s} {'GB/s':>6s} {'fabric MiB':>11s} {'Ray MiB':>8s} {'coverage':>9s} "
              f"{'vs ray':>7s} {'identical':>9s}")
        base = statistics.median(results["ray"]["s"])
        for way in WAYS:
            r = results[way]
            med = statistics.median(r["s"])
            moved = r["fabric"] + r["ray"]
            print(f"{way:26s} {med:9.3f} {total / med / 1e9:6.2f} {r['fabric'] / a.reps / 2**20:11.1f} "
                  f"{r['ray'] / a.reps / 2**20:8.1f} {(r['fabric'] / moved if moved else 0):9.0%} "
                  f"{base / med:6.2f}x {'yes' if r['ok'] else 'NO':>9s}")
        return 0 if all(r["ok"] for r in results.values()) else 1
    finally:
        rayfabric.shutdown()
        ray.shutdown()
        c.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
