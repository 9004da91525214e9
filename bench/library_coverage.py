"""Coverage of real Ray library workloads (issue 30): of the object bytes that crossed nodes, how
many the fabric moved, and what each workload's time is against Ray's own path, side by side in
one 3-node cluster, every result checked identical between the two.

Each run is a fresh driver (a job of its own, so its workers are its own): "ray" is Ray alone (no
rayfabric in the driver or its workers), "rayfabric" has transparent mode in the driver and in
every worker of the job (the state the installed package's start-up hook puts a job in; here by
runtime_env, so that it runs from a checkout). Runs alternate which way goes first. Per run this
process reads the bytes the agents pulled (rayfabric.status()) and what Ray's own object managers
received on all nodes (their ray_object_manager_bytes{Type="Received"}, thrown-away chunks
included), once both stopped moving. Coverage = fabric / (fabric + Ray's).

Workloads (`--workloads`, a comma list; blocks of `--block-mib` MiB, `--blocks` of them):
  ingest         Ray Data: blocks made on n1, `iter_batches()` in a trainer actor on n2
  split          Ray Data `streaming_split(2)`: blocks made on n1, two consumer actors on n2 and n0
  shuffle        Ray Data `random_shuffle()` of blocks made on n1 and n2, read by an actor on n0
  train          Ray Train `TorchTrainer` (1 CPU worker on n2) reading its dataset shard, blocks on n1
                 (the time includes Train's start-up, alike for both ways)
  tree-reduce    default-scheduled tasks: leaves on n1 and n2, a pairwise sum tree submitted at once
  reduce-ready   the same, each level submitted once the one below exists
  actor-pool     `ray.util.ActorPool` of 2 actors on n2 mapping over blocks made on n1
  rl             4 rollout actors (n0, n1) feeding a learner actor on n2, calls submitted at once
  pipeline       three actor stages on n0 -> n1 -> n2, each call taking the previous stage's result

    RAYFABRIC_BIN_DIR=build PYTHONPATH=python python3 bench/library_coverage.py [--reps 3]
        [--blocks 16] [--block-mib 8] [--workloads ...] [--json F]
"""
import os

os.environ["RAYFABRIC_AUTOLOAD"] = "0"  # this process and Ray's path stay Ray's alone
import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time

MiB = 1 << 20
WORKLOADS = ("ingest", "split", "shuffle", "train", "tree-reduce", "reduce-ready", "actor-pool", "rl", "pipeline")
WAYS = ("ray", "rayfabric")
HERE = os.path.abspath(__file__)


# ------------------------------------------------------------------ the driver of one run (a job)

def run_one(address, workload, way, blocks, block_bytes, seed):
    """Runs `workload` as a job of its own; returns {"seconds", "digest"}."""
    import numpy as np
    import ray

    import rayfabric
    from rayfabric import transparent
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(rayfabric.__file__)))
    env = transparent.runtime_env() if way == "rayfabric" else {"env_vars": {"PYTHONPATH": pkg}}
    ray.init(address=address, logging_level="ERROR", runtime_env=env)
    if way == "rayfabric":
        transparent.enable()
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.execution_options.verbose_progress = False
    rows = block_bytes // 8

    @ray.remote(num_cpus=0)
    def make(n, s):
        return np.random.default_rng(s).integers(0, 1 << 62, size=n, dtype=np.int64)

    @ray.remote(num_cpus=0)
    def make_table(n, s):
        import pyarrow as pa
        return pa.table({"x": np.random.default_rng(s).integers(0, 1 << 62, size=n, dtype=np.int64)})

    @ray.remote(num_cpus=0)
    def add(a, b):
        return a + b

    @ray.remote(num_cpus=0)
    class Reader:
        def ready(self):
            return True

        def read(self, it_or_ds):
            """What it read, in a form that does not depend on the order of rows or blocks: rows,
            their sum (mod 2**64) and their xor."""
            n, total, xor = 0, np.uint64(0), np.uint64(0)
            for b in it_or_ds.iter_batches(batch_size=None, batch_format="numpy"):
                x = b["x"].view(np.uint64)
                n, total, xor = n + len(x), total + x.sum(dtype=np.uint64), xor ^ np.bitwise_xor.reduce(x)
            return [n, int(total), int(xor)]

        def make(self, n, s):
            return np.random.default_rng(s).integers(0, 1 << 62, size=n, dtype=np.int64)

        def take(self, *arrays):
            return [hashlib.sha256(a.tobytes()).hexdigest() for a in arrays]

        def step(self, a, s):
            return a + s

    def on(node, what):
        return what.options(resources={node: 0.01})

    def tables(node_names):
        refs = [on(node_names[i % len(node_names)], make_table).remote(rows, seed + i) for i in range(blocks)]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        return refs

    def arrays(node_names):
        refs = [on(node_names[i % len(node_names)], make).remote(rows, seed + i) for i in range(blocks)]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)
        return refs

    def readers(*nodes):
        actors = [on(n, Reader).remote() for n in nodes]
        ray.get([a.ready.remote() for a in actors])
        return actors

    if workload in ("ingest", "split", "shuffle"):
        refs = tables(["n1", "n2"] if workload == "shuffle" else ["n1"])
        ds = ray.data.from_arrow_refs(refs)
        if workload == "ingest":
            (reader,) = readers("n2")
            t0 = time.perf_counter()
            parts = [ray.get(reader.read.remote(ds))]
        elif workload == "split":
            pair = readers("n2", "n0")
            t0 = time.perf_counter()
            parts = ray.get([r.read.remote(it) for r, it in zip(pair, ds.streaming_split(2))])
        else:
            (reader,) = readers("n0")
            t0 = time.perf_counter()
            parts = [ray.get(reader.read.remote(ds.random_shuffle(seed=seed)))]
        seconds = time.perf_counter() - t0
        xor = 0
        for part in parts:
            xor ^= part[2]
        result = json.dumps([sum(p[0] for p in parts), sum(p[1] for p in parts) % (1 << 64), xor])
    elif workload == "train":
        import tempfile

        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer
        ds = ray.data.from_arrow_refs(tables(["n1"]))

        def loop(config):
            import numpy as np
            from ray import train
            n, total, xor = 0, np.uint64(0), np.uint64(0)
            for b in train.get_dataset_shard("train").iter_batches(batch_size=None, batch_format="numpy"):
                x = b["x"].view(np.uint64)
                n, total, xor = n + len(x), total + x.sum(dtype=np.uint64), xor ^ np.bitwise_xor.reduce(x)
            # (A file, not train.report: Train v2 keeps metrics only with a checkpoint. One host.)
            with open(config["out"], "w") as f:
                json.dump([n, int(total), int(xor)], f)

        with tempfile.TemporaryDirectory(prefix="rf-train-") as storage:
            out = os.path.join(storage, "read.json")
            trainer = TorchTrainer(loop, train_loop_config={"out": out}, datasets={"train": ds},
                                   run_config=RunConfig(storage_path=storage),
                                   scaling_config=ScalingConfig(num_workers=1,
                                                                resources_per_worker={"CPU": 1, "n2": 0.01}))
            t0 = time.perf_counter()
            trainer.fit()
            seconds = time.perf_counter() - t0
            with open(out) as f:
                result = f.read()
    elif workload in ("tree-reduce", "reduce-ready"):
        leaves = arrays(["n1", "n2"])
        t0 = time.perf_counter()
        level = leaves
        while len(level) > 1:
            level = [add.remote(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)] + \
                    ([level[-1]] if len(level) % 2 else [])
            if workload == "reduce-ready":
                ray.wait(level, num_returns=len(level), fetch_local=False)
        total = ray.get(level[0])
        seconds = time.perf_counter() - t0
        result = hashlib.sha256(total.tobytes()).hexdigest()
    elif workload == "actor-pool":
        refs = arrays(["n1"])
        pool = ray.util.ActorPool(readers("n2", "n2"))
        t0 = time.perf_counter()
        digests = list(pool.map(lambda a, r: a.take.remote(r), refs))
        seconds = time.perf_counter() - t0
        result = hashlib.sha256(json.dumps(digests).encode()).hexdigest()
    elif workload == "rl":
        rollouts = readers("n0", "n0", "n1", "n1")
        (learner,) = readers("n2")
        steps = max(1, blocks // 4)
        t0 = time.perf_counter()
        updates = []
        for step in range(steps):
            batches = [r.make.remote(rows, seed + 4 * step + i) for i, r in enumerate(rollouts)]
            updates.append(learner.take.remote(*batches))
        digests = ray.get(updates)
        seconds = time.perf_counter() - t0
        result = hashlib.sha256(json.dumps(digests).encode()).hexdigest()
    elif workload == "pipeline":
        stages = readers("n0", "n1", "n2")
        t0 = time.perf_counter()
        outs = []
        for i in range(blocks):
            x = stages[0].make.remote(rows, seed + i)
            x = stages[1].step.remote(x, 1)
            outs.append(stages[2].take.remote(x))
        digests = ray.get(outs)
        seconds = time.perf_counter() - t0
        result = hashlib.sha256(json.dumps(digests).encode()).hexdigest()
    else:
        raise SystemExit(f"unknown workload {workload!r}: one of {', '.join(WORKLOADS)}")
    return {"seconds": seconds, "digest": result}


# ------------------------------------------------------------------------------- the orchestrator

def settled(read, pause=1.5):
    """read()'s value once it stopped changing (Ray reports its counters every second here)."""
    last = read()
    while True:
        time.sleep(pause)
        now = read()
        if now == last:
            return now
        last = now


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--blocks", type=int, default=16)
    p.add_argument("--block-mib", type=int, default=8)
    p.add_argument("--reps", type=int, default=3, help="runs per way and workload")
    p.add_argument("--provider", default="tcp;ofi_rxm")
    p.add_argument("--json")
    p.add_argument("--run", nargs=4, metavar=("ADDRESS", "WORKLOAD", "WAY", "SEED"), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.run:
        address, workload, way, seed = a.run
        print("RUN " + json.dumps(run_one(address, workload, way, a.blocks, a.block_mib * MiB, int(seed))), flush=True)
        return 0
    workloads = a.workloads.split(",")
    bad = [w for w in workloads if w not in WORKLOADS]
    if bad:
        p.error(f"--workloads: unknown {', '.join(bad)}; choose from {', '.join(WORKLOADS)}")

    import ray
    from ray.cluster_utils import Cluster

    import rayfabric
    from rayfabric import metrics
    os.environ["RAY_metrics_report_interval_ms"] = "1000"
    os.environ["RAYFABRIC_BIN_DIR"] = rayfabric.bin_dir()
    store = max(6 * a.blocks * a.block_mib * MiB, 512 * MiB)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"n0": 100},
                                                      "object_store_memory": store, "include_dashboard": False})
    for name in ("n1", "n2"):
        c.add_node(num_cpus=2, resources={name: 100}, object_store_memory=store)
    ray.init(address=c.address, logging_level="ERROR", namespace="rayfabric-bench")
    c.wait_for_nodes()
    rayfabric.init(provider=a.provider, watch_new_nodes=False)
    nodes = [n for n in ray.nodes() if n["Alive"]]

    def fabric_bytes():
        return sum(x.get("bytes_pulled", 0) for x in rayfabric.status()["agents"].values())

    names = {n["NodeID"]: next(r for r in ("n0", "n1", "n2") if r in n["Resources"]) for n in nodes}

    def ray_bytes():
        """{node name: what Ray's object manager there received so far} (None: unknown)."""
        got = {names[n["NodeID"]]: metrics.ray_bytes_received(n) for n in nodes}
        return None if None in got.values() else got

    rows, failed = [], {}
    try:
        for w in workloads:
            for rep in range(a.reps):
                if w in failed:
                    break
                for way in (WAYS if rep % 2 == 0 else WAYS[::-1]):
                    seed = 1000 * (workloads.index(w) + 1) + 10 * rep
                    fabric0, ray0 = fabric_bytes(), settled(ray_bytes)
                    out = subprocess.run([sys.executable, HERE, "--blocks", str(a.blocks), "--block-mib",
                                          str(a.block_mib), "--run", c.address, w, way, str(seed)],
                                         capture_output=True, text=True, timeout=900)
                    lines = [x for x in out.stdout.splitlines() if x.startswith("RUN ")]
                    if out.returncode != 0 or not lines:
                        # (Reported and left out of the table; the other workloads go on.)
                        failed[w] = f"{way} run {rep}: rc {out.returncode}: {out.stderr.strip()[-1500:]}"
                        print(f"{w} FAILED ({failed[w]})", flush=True)
                        break
                    result = json.loads(lines[-1][4:])
                    ray1 = settled(ray_bytes)
                    by_node = None if None in (ray0, ray1) else {k: ray1[k] - ray0[k] for k in ray1}
                    row = {"workload": w, "way": way, "rep": rep, "seed": seed, **result,
                           "fabric_bytes": fabric_bytes() - fabric0, "ray_bytes_by_node": by_node,
                           "ray_bytes": None if by_node is None else sum(by_node.values())}
                    rows.append(row)
                    where = "" if by_node is None else " (" + ", ".join(
                        f"{k} {v / MiB:.0f}" for k, v in sorted(by_node.items())) + ")"
                    print(f"{w:13s} {way:9s} rep {rep}: {row['seconds']:7.3f} s  fabric "
                          f"{row['fabric_bytes'] / MiB:7.1f} MiB  Ray {_mib(row['ray_bytes'])} MiB{where}", flush=True)
    finally:
        rayfabric.shutdown()
        ray.shutdown()
        c.shutdown()
    print()
    print(f"{blocks_line(a)}; median of {a.reps} runs per way, ways alternating")
    print(f"{'workload':13s} {'Ray s':>7s} {'rf s':>7s} {'rf/Ray':>7s} {'fabric MiB':>10s} {'Ray MiB (rf)':>12s} "
          f"{'Ray MiB (Ray)':>13s} {'coverage':>8s} {'identical':>9s}")
    summary = {}
    for w in workloads:
        if w in failed:
            print(f"{w:13s} FAILED: {failed[w].splitlines()[-1][:200]}")
            continue
        mine = {way: [r for r in rows if r["workload"] == w and r["way"] == way] for way in WAYS}
        ray_s = statistics.median(r["seconds"] for r in mine["ray"])
        rf_s = statistics.median(r["seconds"] for r in mine["rayfabric"])
        fabric = statistics.mean(r["fabric_bytes"] for r in mine["rayfabric"])
        known = [r["ray_bytes"] for r in mine["rayfabric"] if r["ray_bytes"] is not None]
        ray_rf = statistics.mean(known) if known else None
        known = [r["ray_bytes"] for r in mine["ray"] if r["ray_bytes"] is not None]
        ray_ray = statistics.mean(known) if known else None
        moved = fabric + (ray_rf or 0)
        # (Each run pair has a seed of its own: the two ways' results compared run by run.)
        identical = all(r["digest"] == next(x["digest"] for x in mine["ray"] if x["rep"] == r["rep"])
                        for r in mine["rayfabric"])
        summary[w] = {"ray_s": ray_s, "rf_s": rf_s, "speedup": ray_s / rf_s, "fabric_mib": fabric / MiB,
                      "ray_mib_rf": None if ray_rf is None else ray_rf / MiB,
                      "ray_mib_ray": None if ray_ray is None else ray_ray / MiB,
                      "coverage": fabric / moved if moved else None, "identical": identical}
        s = summary[w]
        print(f"{w:13s} {ray_s:7.3f} {rf_s:7.3f} {s['speedup']:6.2f}x {s['fabric_mib']:10.1f} "
              f"{_mib(ray_rf):>12s} {_mib(ray_ray):>13s} {_share(s['coverage']):>8s} {'yes' if identical else 'NO':>9s}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(a).items() if k != "run"}, "rows": rows, "summary": summary,
                       "failed": failed}, f, indent=1)
    return 0 if not failed and all(s["identical"] for s in summary.values()) else 1


def blocks_line(a):
    return f"{a.blocks} blocks of {a.block_mib} MiB per workload, 3 nodes of 2 CPUs, provider {a.provider}"


def _mib(n):
    return "-" if n is None else f"{n / MiB:.1f}"


def _share(x):
    return "-" if x is None else f"{x:.0%}"


if __name__ == "__main__":
    sys.exit(main())
