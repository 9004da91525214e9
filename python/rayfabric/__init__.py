"""rayfabric: Ray object transfers over libfabric RDMA (verbs, efa, tcp/sockets fallback).

The Python package is thin glue around the C++ binaries built by meson (build/)."""
import os

RAY_VERSION = open(os.path.join(os.path.dirname(__file__), "..", "RAY_VERSION")).read().strip() \
    if os.path.exists(os.path.join(os.path.dirname(__file__), "..", "RAY_VERSION")) else "2.60.0"


def bin_dir():
    """Where the C++ binaries are: $RAYFABRIC_BIN_DIR, else the source tree's build/."""
    env = os.environ.get("RAYFABRIC_BIN_DIR")
    if env:
        return env
    return os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "build"))
