"""A Ray driver that never mentions rayfabric (issue 30's "no code change"): a 64 MiB result made on
the node with resource `w`, fetched with ray.get; another passed as an argument to an actor on the
node with resource `h`. Prints one line,

    RESULT <result identical> <argument identical> <driver's mode> <actor's mode> <actor's MARKER>

where a mode is `transparent` (rayfabric's transparent mode is on in that process), `armed` (Ray's
ray.get/ray.wait under the start-up hook's look-again wrappers: no agents seen yet) or `ray`
(neither; `ray+rayfabric` if rayfabric was imported all the same),

and, with --wait-stdin, waits for a line on stdin before it exits (a test reads `rayfabric status`
meanwhile). Usage: plain_driver.py ADDRESS|auto [--runtime-env JSON] [--wait-stdin [--second-round]]
(`auto`: ray.init() as under `ray job submit`, whose supervisor says where the cluster is)."""
import argparse
import hashlib
import json
import os
import time

import numpy as np
import ray

p = argparse.ArgumentParser()
p.add_argument("address")
p.add_argument("--runtime-env", type=json.loads, default=None)
p.add_argument("--wait-stdin", action="store_true")
p.add_argument("--second-round", action="store_true", help="after stdin's line, again (RESULT2 ...)")
a = p.parse_args()
ray.init(address=None if a.address == "auto" else a.address, logging_level="ERROR", runtime_env=a.runtime_env)


def block(seed):
    return np.random.default_rng(seed).integers(0, 256, size=64 << 20, dtype=np.uint8)


def mode():
    import sys
    transparent = sys.modules.get("rayfabric.transparent")
    if transparent is not None and transparent.enabled():
        return "transparent"
    if hasattr(ray.get, "_rayfabric_original"):
        return "armed"
    return "ray+rayfabric" if "rayfabric" in sys.modules else "ray"


def digest(x):
    return hashlib.sha256(np.asarray(x).tobytes()).hexdigest()


@ray.remote(num_cpus=0, resources={"w": 0.01})
def make(seed):
    return block(seed)


@ray.remote(num_cpus=0, resources={"h": 0.01})
class Sink:
    def where_get_is(self):
        ray.get(ray.put(0))  # a worker Ray started before the agents looks again at its first get
        return mode(), os.environ.get("MARKER", "-")

    def digest(self, x):
        return digest(x)


sink = Sink.remote()


def one_round(seed, label):
    got = ray.get(make.remote(seed))
    actor_mode, marker = ray.get(sink.where_get_is.remote())  # placed: its node is known to calls
    arg = make.remote(seed + 1)
    ray.wait([arg], fetch_local=False)  # made: passed as an argument once it exists
    print(label, digest(got) == digest(block(seed)), ray.get(sink.digest.remote(arg)) == digest(block(seed + 1)),
          mode(), actor_mode, marker, flush=True)


one_round(1, "RESULT")
if a.wait_stdin:
    input()
if a.second_round:
    # Agents may have started meanwhile (a notebook connected before `rayfabric start`): a
    # process without agents looks again at its gets (in the background, at most every 5 s after
    # its first look, doubling): small gets until it has (at most 30 s), then the same round.
    deadline = time.monotonic() + 30
    while mode() != "transparent" and time.monotonic() < deadline:
        ray.get(ray.put(0))
        time.sleep(0.2)
    one_round(3, "RESULT2")
