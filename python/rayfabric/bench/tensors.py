"""rayfabric bench tensors: torch tensors from one actor to another on another node, by each way
Ray offers, side by side in one run.

  python3 -m rayfabric bench tensors [--sizes-mib 1,16,256] [--reps 3] [--quick] [--json F]

A 2-node local Ray cluster (ray.cluster_utils.Cluster); a source actor on node 0 returns one CPU
tensor (float32, random, made once per size) and an actor on node 1 takes it as an argument:
  ray        Ray's object store (the method returns the tensor normally)
  rayfabric  Ray Direct Transport, tensor_transport="RAYFABRIC" (rayfabric.rdt: fi_read)
  nixl       RDT with NIXL (its UCX backend), if `nixl` is installed
  gloo       RDT with GLOO (a torch.distributed collective group of the two actors)
Each case: one warm-up call whose tensor is checked byte for byte (sha256 at both ends), then
--reps timed calls (call to result, on the driver); the median is reported, with GB/s and the
ratio to Ray's object store. --quick: 1 and 16 MiB, 2 reps (the CI form)."""
import argparse
import hashlib
import importlib
import json
import os
import statistics
import sys
import time

import ray
import torch

import rayfabric.rdt
from rayfabric.bench.objects import worker_env

MiB = 1 << 20
rayfabric.rdt.enable()  # before the classes below (ray.method checks the name), here and in workers


def _sha(t):
    return hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()).hexdigest()


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class TensorSource:
    def __init__(self):
        self.tensors = {}

    def prepare(self, mib):
        t = torch.randn(mib * MiB // 4, generator=torch.Generator().manual_seed(mib))
        self.tensors[mib] = t
        return _sha(t)

    def make(self, mib):
        return self.tensors[mib]

    @ray.method(tensor_transport="RAYFABRIC")
    def make_rayfabric(self, mib):
        return self.tensors[mib]

    @ray.method(tensor_transport="NIXL")
    def make_nixl(self, mib):
        return self.tensors[mib]

    @ray.method(tensor_transport="GLOO")
    def make_gloo(self, mib):
        return self.tensors[mib]

    def has_nixl(self):
        try:
            importlib.import_module("nixl._api")  # NIXL usable here (a Ray NIXL transport needs it)
            return True
        except Exception:  # noqa: BLE001
            return False


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class TensorSink:
    def take(self, t, verify):
        return _sha(t) if verify else int(t.numel())


def run(args):
    from ray.cluster_utils import Cluster

    os.environ.update(worker_env())
    os.environ.setdefault("RAYFABRIC_LOG_LEVEL", "warn")
    store = max(args.sizes) * MiB * 4 + 256 * MiB
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"tb_n0": 100}, "object_store_memory": store, "include_dashboard": False})
    c.add_node(num_cpus=2, resources={"tb_n1": 100}, object_store_memory=store)
    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    c.wait_for_nodes()
    rows, notes = [], []
    try:
        src = TensorSource.options(resources={"tb_n0": 1}).remote()
        dst = TensorSink.options(resources={"tb_n1": 1}).remote()
        paths = {"ray": src.make, "rayfabric": src.make_rayfabric}
        if ray.get(src.has_nixl.remote()):
            paths["nixl"] = src.make_nixl
        else:
            notes.append("nixl: not installed (pip install nixl)")
        try:
            from ray.experimental.collective import create_collective_group
            create_collective_group([src, dst], backend="torch_gloo")
            paths["gloo"] = src.make_gloo
        except Exception as e:  # noqa: BLE001
            notes.append(f"gloo: no collective group ({type(e).__name__}: {e})")
        for mib in args.sizes:
            want = ray.get(src.prepare.remote(mib))
            row = {"mib": mib}
            for name, method in paths.items():
                try:
                    got = ray.get(dst.take.remote(method.remote(mib), True), timeout=600)
                    if got != want:
                        raise RuntimeError("bytes differ")
                    times = []
                    for _ in range(args.reps):
                        start = time.perf_counter()
                        ray.get(dst.take.remote(method.remote(mib), False), timeout=600)
                        times.append(time.perf_counter() - start)
                    row[name] = statistics.median(times)
                except Exception as e:  # noqa: BLE001
                    row[name] = None
                    notes.append(f"{name} {mib} MiB: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                print(f"  {mib} MiB {name}: " + (f"{row[name]:.4f} s" if row[name] else "failed"), file=sys.stderr)
            rows.append(row)
    finally:
        ray.shutdown()
        c.shutdown()
    return list(paths), rows, notes


def main(argv=None):
    p = argparse.ArgumentParser(prog="rayfabric bench tensors")
    p.add_argument("--sizes-mib", default="1,16,256")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    a = p.parse_args(argv)
    a.sizes = [1, 16] if a.quick else [int(x) for x in a.sizes_mib.split(",")]
    if a.quick:
        a.reps = 2
    names, rows, notes = run(a)
    print("| size | " + " | ".join(f"{n} s (GB/s)" for n in names) + " | rayfabric / ray | rayfabric / nixl |")
    print("|---" * (len(names) + 3) + "|")
    for r in rows:
        cells = []
        for n in names:
            t = r.get(n)
            cells.append(f"{t:.4f} ({r['mib'] * MiB / t / 1e9:.2f})" if t else "failed")
        ratio = lambda other: f"{r[other] / r['rayfabric']:.2f}x" if r.get(other) and r.get("rayfabric") else "-"  # noqa: E731
        print(f"| {r['mib']} MiB | " + " | ".join(cells) + f" | {ratio('ray')} | {ratio('nixl')} |")
    for n in notes:
        print("note:", n)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"paths": names, "rows": rows, "notes": notes}, f, indent=1)
    failed = any(r.get("rayfabric") is None for r in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
