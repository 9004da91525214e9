"""A Ray driver that never mentions rayfabric (issue 30's "no code change"): a 64 MiB result made on
the node with resource `w`, fetched with ray.get; another passed as an argument to an actor on the
node with resource `h`. Prints one line,

    RESULT <result identical> <argument identical> <driver's ray.get module> <actor's ray.get module> <actor's MARKER>

and, with --wait-stdin, waits for a line on stdin before it exits (a test reads `rayfabric status`
meanwhile). Usage: plain_driver.py ADDRESS|auto [--runtime-env JSON] [--wait-stdin]
(`auto`: ray.init() as under `ray job submit`, whose supervisor says where the cluster is)."""
import argparse
import hashlib
import json
import os

import numpy as np
import ray

p = argparse.ArgumentParser()
p.add_argument("address")
p.add_argument("--runtime-env", type=json.loads, default=None)
p.add_argument("--wait-stdin", action="store_true")
a = p.parse_args()
ray.init(address=None if a.address == "auto" else a.address, logging_level="ERROR", runtime_env=a.runtime_env)


def block(seed):
    return np.random.default_rng(seed).integers(0, 256, size=64 << 20, dtype=np.uint8)


def digest(x):
    return hashlib.sha256(np.asarray(x).tobytes()).hexdigest()


@ray.remote(num_cpus=0, resources={"w": 0.01})
def make(seed):
    return block(seed)


@ray.remote(num_cpus=0, resources={"h": 0.01})
class Sink:
    def where_get_is(self):
        ray.get(ray.put(0))  # a worker Ray started before the agents looks again at its first get
        return ray.get.__module__, os.environ.get("MARKER", "-")

    def digest(self, x):
        return digest(x)


got = ray.get(make.remote(1))
sink = Sink.remote()
actor_get, marker = ray.get(sink.where_get_is.remote())  # placed: its node is known to calls
arg = make.remote(2)
ray.wait([arg], fetch_local=False)  # made: passed as an argument once it exists
print("RESULT", digest(got) == digest(block(1)), ray.get(sink.digest.remote(arg)) == digest(block(2)),
      ray.get.__module__, actor_get, marker, flush=True)
if a.wait_stdin:
    input()
