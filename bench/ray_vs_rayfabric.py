#!/usr/bin/env python3
"""Ray's own cross-node object transfer vs rayfabric, side by side: a thin wrapper of
`rayfabric bench` (python/rayfabric/bench/objects.py), runnable from a source checkout without installing:

    python3 bench/ray_vs_rayfabric.py [--quick] [--json FILE] [--plots DIR] [--address ADDR] ...
"""
import os

os.environ["RAYFABRIC_AUTOLOAD"] = "0"  # the Ray side of the comparison is Ray alone
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))

from rayfabric.bench import objects  # noqa: E402

if __name__ == "__main__":
    sys.exit(objects.main(sys.argv[1:]))
