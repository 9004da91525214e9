"""rayfabric bench broadcast: one object read on every node, on links that are the bottleneck.

  python3 -m rayfabric bench broadcast [--nodes 4] [--link 2gbit] [--size-mib 256] [--reps 2]
                                         [--quick] [--json F]

--nodes Ray nodes, each in its own network namespace with one link to a switch (a bridge in a hub
namespace: rayfabric.tools.netns.NetnsStar), every node's link shaped with tc to --link in both
directions, so that a node's link, not this host's CPU, is what the readers of one source share.
Node 0 makes a fresh object per repetition; then every other node gets it, by:
  ray                Ray's own ray.get on every node at once
  rayfabric direct   rayfabric.get on every node at once (each reads the holder it picks: at first
                     only node 0 holds it, so they share node 0's link)
  rayfabric tree     rayfabric.broadcast: rounds in which every holder serves one more node
                     (1 -> 2 -> 4 holders), then ray.get (local) on every node
Time: from the start until the last node has the object (hashing excluded); every node's copy is
checked by sha256 against node 0's, and a tree in which any pull fell back to Ray's path counts as a
failure. Printed per path: median seconds, the aggregate rate (bytes
delivered to all readers per second) as a multiple of one link, the ratio to Ray, CPU seconds per GB
delivered (user+sys of every process in node 0's namespace, and in all the others together, less
the sha256 of every copy; at 2 Gb/s a broadcast takes seconds, so the nodes' idle background work
is in these too), and for the tree the sources each round used. --quick: 4 nodes, 32 MiB, one repetition (the CI form)."""
import argparse
import json
import signal
import statistics
import sys

from rayfabric.tools import netns

MiB = 1 << 20

DRIVER = netns.CPU_DRIVER_HELPERS + r"""
import hashlib, json, sys, time
import numpy as np, ray, rayfabric
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR")
cfg = json.loads(sys.argv[2])
node_of, N, waited = {}, cfg["nodes"], time.monotonic()
while len(node_of) < N and time.monotonic() - waited < 120:  # every node registered
    for n in ray.nodes():
        if n["Alive"]:
            for k in n["Resources"]:
                if k[0] == "n" and k[1:].isdigit():
                    node_of[int(k[1:])] = n["NodeID"]
    time.sleep(0.2)
assert len(node_of) == N, f"only {len(node_of)} of {N} nodes joined"
index_of = {v: k for k, v in node_of.items()}

def on(i):
    return NodeAffinitySchedulingStrategy(node_of[i], soft=False)

@ray.remote(num_cpus=0)
def make(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 255, nbytes, dtype=np.uint8)

@ray.remote(num_cpus=0)
def fetch(refs, how):
    import rayfabric as rf
    v = ray.get(refs[0]) if how == "ray" else rf.get(refs[0], timeout=600)
    done = time.time()
    hashing = time.process_time()
    digest = hashlib.sha256(v.tobytes()).hexdigest()
    return done, digest, time.process_time() - hashing  # the check's CPU, not the transfer's

# Node 0 (the source, the driver's own namespace) and every other node's namespace.
NETNS = namespace_inodes({i: ns for i, ns in enumerate(cfg["namespaces"])})
rayfabric.init(watch_new_nodes=False)
rows, seed = [], 10
for path in cfg["paths"]:
    for rep in range(cfg["reps"] + 1):  # the first one warms the path up and is not counted
        seed += 1
        ref = make.options(scheduling_strategy=on(0)).remote(cfg["bytes"], seed)
        want = ray.get(fetch.options(scheduling_strategy=on(0)).remote([ref], "ray"))[1]
        rounds = None
        cpu0 = cpu_ticks(NETNS)
        start = time.time()
        if path == "rayfabric tree":
            rounds = rayfabric.broadcast(ref, nodes=[node_of[i] for i in range(N)], timeout=600)
            end = time.time()  # every node holds a copy (by the fabric, or Ray's path if it fell back)
            got = ray.get([fetch.options(scheduling_strategy=on(i)).remote([ref], "ray") for i in range(1, N)])
            got.append((end, want if all(p["pulled"] for r in rounds for p in r) else "a pull fell back", 0.0))
            rounds = [[(index_of[p["source"]], index_of[p["destination"]], round(p["seconds"] or 0, 3),
                        p["pulled"]) for p in r] for r in rounds]
        else:
            how = "ray" if path == "ray" else "rf"
            got = ray.get([fetch.options(scheduling_strategy=on(i)).remote([ref], how) for i in range(1, N)])
            end = max(g[0] for g in got)
        # Less the check of every copy (its sha256, measured by the task that hashed; all on the
        # readers' nodes).
        cpu = cpu_seconds_between(cpu0, cpu_ticks(NETNS))
        rows.append({"path": path, "rep": rep, "seconds": end - start, "ok": all(g[1] == want for g in got),
                     "rounds": rounds, "cpu_s_source": cpu[0],
                     "cpu_s_others": sum(v for i, v in cpu.items() if i != 0) - sum(g[2] for g in got)})
        del ref
print("RESULT " + json.dumps(rows))
"""

PATHS = ["ray", "rayfabric direct", "rayfabric tree"]


def main(argv=None):
    p = argparse.ArgumentParser(prog="rayfabric bench broadcast", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=4, help="Ray nodes, the source included (2..8)")
    netns.add_shaped_bench_options(p, "2gbit", "tc rate of every node's link (e.g. 1gbit, 2gbit)", reps=2,
                                   quick_help="4 nodes, 32 MiB, one repetition")
    a = p.parse_args(argv)
    if a.quick:
        a.nodes, a.size_mib, a.reps = 4, 32, 1
    skipped = netns.cannot_run(netns.NetnsStar, "rayfabric bench broadcast")
    if skipped:
        return skipped
    nbytes = a.size_mib * MiB
    link_bits = netns.rate_bits(a.link)
    star = netns.NetnsStar(nodes=a.nodes, store_bytes=max(300 * MiB, 3 * nbytes))
    print(f"rayfabric bench broadcast: {a.nodes} nodes in network namespaces, each on a {a.link} link to a "
          f"switch; one {a.size_mib} MiB object from node 0 to the {a.nodes - 1} others, {a.reps} repetitions "
          f"(+1 warm-up)", flush=True)
    # A test runner's SIGTERM (its timeout) must still tear the namespaces and Ray nodes down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = netns.run_driver_shaped(star, a.link, DRIVER, {"bytes": nbytes, "reps": a.reps, "paths": PATHS,
                                                          "nodes": a.nodes,
                                                          "namespaces": [star.ns(i) for i in range(a.nodes)]},
                                   timeout=540 if a.quick else 3000)
    bad = [r for r in rows if not r["ok"]]
    delivered = (a.nodes - 1) * nbytes * 8
    delivered_gb = delivered / 8e9
    print(f"\n{'path':18s} {'median s':>9s} {'aggregate Gb/s':>15s} {'x one link':>11s} {'vs ray':>7s} "
          f"{'CPU s/GB node 0':>16s} {'others':>7s}")
    summary = {}
    for name in PATHS:
        timed = [r for r in rows if r["path"] == name and r["rep"] > 0]
        med = statistics.median(r["seconds"] for r in timed)
        summary[name] = med
        gbps = delivered / med / 1e9
        cpu_source = statistics.median(r["cpu_s_source"] for r in timed) / delivered_gb
        cpu_others = statistics.median(r["cpu_s_others"] for r in timed) / delivered_gb
        print(f"{name:18s} {med:9.3f} {gbps:15.2f} {gbps * 1e9 / link_bits:10.2f}x {summary['ray'] / med:6.2f}x "
              f"{cpu_source:16.2f} {cpu_others:7.2f}")
    for r in rows:
        if r["rounds"] and r["rep"] > 0:
            print(f"tree rep {r['rep']}: " + "; ".join(
                f"round {k + 1}: " + ", ".join(f"{s}->{d} {sec:.2f}s{'' if ok else ' (fell back)'}"
                                               for s, d, sec, ok in rnd) for k, rnd in enumerate(r["rounds"])))
    print(f"\nbytes verified: {'all' if not bad else f'{len(bad)} BAD'} ({len(rows)} broadcasts, every node's "
          f"copy by sha256 against node 0's)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"link": a.link, "nodes": a.nodes, "bytes": nbytes, "rows": rows}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
