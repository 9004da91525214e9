"""What reading an owner's own locations saves: rayfabric.get of results this process owns, with
the locations read from its own reference counter (today) against the owner RPC it used before,
and Ray's own get, interleaved get by get on one 2-node embedded cluster (so that the machine's
noise hits the three alike). Prints the median per get of each, and the ratios.

    RAYFABRIC_BIN_DIR=build PYTHONPATH=python python3 bench/owned_locations.py [--size 1M] [--gets 150]
"""
import os

os.environ["RAYFABRIC_AUTOLOAD"] = "0"  # the Ray side of the comparison is Ray alone
import argparse
import statistics
import sys
import time

import numpy as np
import ray
from ray.cluster_utils import Cluster

import rayfabric
from rayfabric import _pulls
from rayfabric.bench.objects import parse_size, size_name


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1M", help="object size (default 1M)")
    p.add_argument("--gets", type=int, default=150, help="gets per variant (the first 10 are not counted)")
    p.add_argument("--provider", default="tcp;ofi_rxm")
    a = p.parse_args()
    size = parse_size(a.size)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 1 << 30,
                                                      "include_dashboard": False})
    c.add_node(num_cpus=1, resources={"source": 1}, object_store_memory=1 << 30)
    try:
        ray.init(address=c.address, logging_level="ERROR")
        rayfabric.init(provider=a.provider, watch_new_nodes=False)

        @ray.remote(resources={"source": 1}, num_cpus=0)
        def make(i):  # its result is in the source node's store, owned by this driver
            return np.full(size, i % 251, dtype=np.uint8)

        variants = {"ray.get": (ray.get, True),
                    "rf, owner RPC": (rayfabric.get, False),  # RAYFABRIC_OWN_LOCATIONS=0, as before
                    "rf, own record": (rayfabric.get, True)}
        times = {k: [] for k in variants}
        unlocated = {k: 0 for k in variants}  # left to Ray's path: not (yet) in Ray's directory

        def unlocated_so_far():  # (too big to be inlined, they count as that fallback)
            st = rayfabric.stats()
            return st["ray_path_not_in_plasma"] + st["fallback_reasons"].get(_pulls.NO_LOCATION, 0)
        for i in range(a.gets):
            for name in (list(variants) if i % 2 == 0 else list(variants)[::-1]):
                get, _pulls.OWN_LOCATIONS = variants[name]
                ref = make.remote(i)
                ray.wait([ref], fetch_local=False)
                before = unlocated_so_far()
                t0 = time.perf_counter()
                value = get(ref)
                seconds = time.perf_counter() - t0
                unlocated[name] += unlocated_so_far() - before
                if value[0] != i % 251 or value[-1] != i % 251:
                    sys.exit(f"{name}: wrong bytes in get {i}")
                if i >= 10:
                    times[name].append(seconds)
                del value, ref
        _pulls.OWN_LOCATIONS = True
        st = rayfabric.stats()
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(f"{size_name(size)} objects, {a.gets - 10} gets per variant, interleaved; median ms per get")
        for k, v in med.items():
            print(f"  {k:16s} {v:7.2f}" + (f"   (left to Ray's path, no location yet: {unlocated[k]})" if k != "ray.get" else ""))
        print(f"  Ray / rf (owner RPC) {med['ray.get'] / med['rf, owner RPC']:.2f}, "
              f"Ray / rf (own record) {med['ray.get'] / med['rf, own record']:.2f}; saved per get "
              f"{med['rf, owner RPC'] - med['rf, own record']:.2f} ms")
        print(f"  pulled by the fabric {st['objects_pulled']}, fallbacks {st['fallbacks']}, "
              f"located from the own record {st['locations_owned']} (waited for {st['locations_awaited']}); stood aside {st['stood_aside']}, "
              f"already local {st['already_local']}, already here {st['already_here']}")
    finally:
        rayfabric.shutdown()
        ray.shutdown()
        c.shutdown()


if __name__ == "__main__":
    main()
