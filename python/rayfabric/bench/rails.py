"""rayfabric bench rails: one rail against two, on links that are the bottleneck.

  python3 -m rayfabric bench rails [--link 1gbit] [--size-mib 256] [--reps 3] [--quick] [--json F]

Two Ray nodes in their own network namespaces (rayfabric.tools.netns: `ray start` in each) joined by
two veth pairs, each shaped with tc to --link. Node B makes a fresh object per repetition; a task on
node A gets it, and the time of that get is measured, by:
  ray         Ray's own ray.get (its object manager runs on the nodes' Ray IPs: link 1)
  1 rail      rayfabric.get, agents on link 1 only (RAYFABRIC_DOMAIN=rfa0 / rfb0)
  2 rails     rayfabric.get, agents on both links (RAYFABRIC_DOMAIN=rfa0,rfa1 / rfb0,rfb1): the
              object is read in two stripes, one per link
Every object's sha256 is checked against one computed on node B. Per path: median seconds, Gb/s,
the fraction of ONE link's rate, and the bytes each of node A's interfaces received (from its
counters), which shows where the bytes went. Needs root and `ip netns`. --quick: 64 MiB, one
repetition, 2gbit links (the CI form)."""
import argparse
import json
import statistics
import sys

from rayfabric.tools import netns

MiB = 1 << 20

DRIVER = netns.PAIR_DRIVER_PRELUDE + r"""
def rx():
    out = {}
    for dev in cfg["devices"]:
        with open(f"/sys/class/net/{dev}/statistics/rx_bytes") as f:
            out[dev] = int(f.read())
    return out

@ray.remote(num_cpus=0, resources={"nA": 0.01})
def fetch(refs, how):
    import rayfabric as rf
    before = rf.stats()["objects_pulled"] if how != "ray" else 0
    t0 = time.perf_counter()
    v = ray.get(refs[0]) if how == "ray" else rf.get(refs[0], timeout=600)
    seconds = time.perf_counter() - t0
    pulled = rf.stats()["objects_pulled"] - before if how != "ray" else 0
    return seconds, hashlib.sha256(v.tobytes()).hexdigest(), pulled

rows = []
seed = 100
for name, how, node_env in cfg["paths"]:
    if node_env is not None:
        rayfabric.init(node_env={by_name[k]: v for k, v in node_env.items()}, watch_new_nodes=False)
    for rep in range(cfg["reps"] + 1):  # the first one warms the path up and is not counted
        seed += 1
        ref = make.remote(cfg["bytes"], seed)
        want = ray.get(digest_at_source.remote([ref]))
        before = rx()
        seconds, got, pulled = ray.get(fetch.remote([ref], how))
        after = rx()
        rows.append({"path": name, "rep": rep, "seconds": seconds, "ok": got == want, "pulled": pulled,
                     "rx": {d: after[d] - before[d] for d in after}})
        del ref
    if node_env is not None:
        rayfabric.shutdown()
print("RESULT " + json.dumps(rows))
"""


def main(argv=None):
    p = argparse.ArgumentParser(prog="rayfabric bench rails", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    netns.add_shaped_bench_options(p, "1gbit", "tc rate of each link (e.g. 500mbit, 1gbit, 2gbit)", reps=3,
                                   quick_help="64 MiB, 1 repetition, 2gbit links")
    a = p.parse_args(argv)
    if a.quick:
        a.size_mib, a.reps, a.link = 64, 1, "2gbit"
    skipped = netns.cannot_run(netns.NetnsPair, "rayfabric bench rails")
    if skipped:
        return skipped
    nbytes = a.size_mib * MiB
    link_bits = netns.rate_bits(a.link)
    cfg = {"bytes": nbytes, "reps": a.reps, "devices": ["rfa0", "rfa1"],
           "paths": [["ray", "ray", None],
                     ["rayfabric 1 rail", "rf", {"nA": {"RAYFABRIC_DOMAIN": "rfa0"},
                                                 "nB": {"RAYFABRIC_DOMAIN": "rfb0"}}],
                     ["rayfabric 2 rails", "rf", {"nA": {"RAYFABRIC_DOMAIN": "rfa0,rfa1"},
                                                  "nB": {"RAYFABRIC_DOMAIN": "rfb0,rfb1"}}]]}
    pair = netns.NetnsPair(links=2, store_bytes=max(300 * MiB, 4 * nbytes))
    print(f"rayfabric bench rails: 2 nodes in network namespaces, 2 links of {a.link} each, "
          f"{a.size_mib} MiB objects, {a.reps} repetitions (+1 warm-up)", flush=True)
    rows = netns.run_driver_shaped(pair, a.link, DRIVER, cfg, timeout=1800)
    bad = [r for r in rows if not r["ok"] or (r["path"] != "ray" and r["pulled"] != 1)]
    print(f"\n{'path':18s} {'median s':>9s} {'Gb/s':>7s} {'% of 1 link':>12s} {'vs ray':>7s} "
          f"{'rx rfa0 MiB':>12s} {'rx rfa1 MiB':>12s}")
    summary = {}
    for name, _, _ in cfg["paths"]:
        timed = [r for r in rows if r["path"] == name and r["rep"] > 0]
        med = statistics.median(r["seconds"] for r in timed)
        summary[name] = med
        gbps = nbytes * 8 / med / 1e9
        rx0 = statistics.median(r["rx"]["rfa0"] for r in timed) / MiB
        rx1 = statistics.median(r["rx"]["rfa1"] for r in timed) / MiB
        print(f"{name:18s} {med:9.3f} {gbps:7.2f} {100 * gbps * 1e9 / link_bits:11.0f}% "
              f"{summary['ray'] / med:6.2f}x {rx0:12.1f} {rx1:12.1f}")
    print(f"\nbytes verified: {'all' if not bad else f'{len(bad)} BAD'} ({len(rows)} gets, sha256 against "
          f"the source's)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"link": a.link, "bytes": nbytes, "rows": rows}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
