"""rayfabric: Ray object transfers over libfabric RDMA (verbs, efa; tcp/sockets fallback).

    import ray, rayfabric
    ray.init(address="auto")
    rayfabric.init()                    # an agent (rayfabricd) on every node, and on nodes that join
    arrays = rayfabric.get(refs)        # remote plasma objects arrive by fi_read, then ray.get
    rayfabric.prefetch(refs)            # the same, without ray.get
    rayfabric.status()                  # per-node agent counters + this process's counters

Any failure (no agent, lease refused, RDMA error, object spilled or inlined) falls back to Ray's
own path: the result is always what ray.get returns. The Python package is thin glue around the
C++ binaries built by meson (inside the package when installed with pip, else build/)."""
from rayfabric._paths import RAY_VERSION, bin_dir
from rayfabric.api import broadcast, get, init, prefetch, shutdown, stats, status

__all__ = ["RAY_VERSION", "bin_dir", "broadcast", "get", "init", "prefetch", "shutdown", "stats", "status"]  # the API
