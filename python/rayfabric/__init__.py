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
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
# Inside the package (an installed wheel), else next to it (the source tree's python/).
_RAY_VERSION_FILE = next((p for p in (os.path.join(_HERE, "RAY_VERSION"), os.path.join(_HERE, "..", "RAY_VERSION"))
                          if os.path.exists(p)), None)
RAY_VERSION = open(_RAY_VERSION_FILE).read().strip() if _RAY_VERSION_FILE else "2.60.0"
# Where an installed wheel keeps the binaries (the build tree's layout: src/agent/rayfabricd, ...).
_PACKAGED_BIN_DIR = os.path.join(_HERE, "_bin")


def bin_dir():
    """Where the C++ binaries are: $RAYFABRIC_BIN_DIR (developers), else inside the installed
    package (the wheel), else the source tree's build/."""
    env = os.environ.get("RAYFABRIC_BIN_DIR")  # settings.py's bin_dir (not imported: this runs first)
    if env:
        return env
    if os.path.isdir(_PACKAGED_BIN_DIR):
        return _PACKAGED_BIN_DIR
    return os.path.abspath(os.path.join(_HERE, "..", "..", "build"))


from rayfabric.api import broadcast, get, init, prefetch, shutdown, stats, status  # noqa: E402,F401
