"""rayfabric bench args: call arguments moved by Ray alone vs with rayfabric.args, same cluster,
same run, rounds alternating, bytes verified.

  python3 -m rayfabric bench args [--address ADDR] [--steps 8] [--batch-mib 16] [--blocks 48]
                                  [--block-mib 8] [--rounds 2] [--json F]

Cases (an embedded 3-node ray.cluster_utils.Cluster unless --address; nodes get resources
"rollout", "learner" and "mapper"):
  rl   4 rollout actors on one node each return a batch per step; a learner actor on another node
       takes them all: learner.update.remote(*batch_refs), `--steps` steps (an RL-shaped loop).
  map  `--blocks` blocks made on one node, one task per block pinned to another node
       (NodeAffinitySchedulingStrategy): a map over blocks whose destination is known.
  actor  the same blocks, each passed to one call of an actor on another node (ready arguments).
  pg   the same blocks, tasks in a placement group bundle on another node.
  create  the same blocks, passed to the constructors of 4 actors created on another node
       (NodeAffinitySchedulingStrategy), a quarter of the blocks each: actor-creation arguments.
  reduce  `--blocks`/2 default-scheduled tasks, each taking a block made on the mapper node and
       one made on the rollout node (a level of a tree reduce, its inputs ready): Ray's
       locality-aware lease policy asks the mapper node (the first to hold half the bytes; not the
       driver's, where Ray leases without locality) to run it; the hook predicts that and has its
       agent read the other block first.
  reduce-busy  the same with tasks that take 1 CPU of the 1 each node has: the mapper node is
       busy for about half of them and spills them back to other nodes (wrong predictions: the
       copy the agent made is wasted, Ray moves both blocks).
Per case and path: seconds, GB/s of argument bytes, and (rayfabric) what the destination's agent
did with each argument: pulled it (won the race with Ray's own pull), stood aside (Ray's pull was
first), found it local."""
import argparse
import contextlib
import hashlib
import json
import os
import sys
import time

import numpy as np
import ray

MiB = 1 << 20


def digest(a):
    return hashlib.sha256(memoryview(a).cast("B")).hexdigest()


@ray.remote(num_cpus=0)
class Rollout:
    def batch(self, nbytes, seed):
        return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


@ray.remote(num_cpus=0)
class Learner:
    def update(self, *batches):
        return [digest(b) for b in batches]

    def ping(self):
        return True


@ray.remote(num_cpus=0)
class Holder:
    """An actor made with blocks as its constructor's arguments."""
    def __init__(self, *blocks):
        self.digests = [digest(b) for b in blocks]

    def held(self):
        return self.digests


@ray.remote(num_cpus=0)
def block(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


@ray.remote(num_cpus=0)
def consume(b):
    return digest(b)


@ray.remote(num_cpus=0)
def reduce_pair(a, b):
    """A default-scheduled task: its digests, and where it ran."""
    return [digest(a), digest(b)], ray.get_runtime_context().get_node_id()


def expected(nbytes, seed):
    return digest(np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8))


def node_of(resource):
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])


def prefetch_outcomes(node_hex):
    from rayfabric import _agents
    s = ray.get(_agents.actor_of(node_hex).prefetch_stats.remote(), timeout=60)
    return {k: s[k] for k in ("objects_pulled", "stood_aside", "already_local", "already_here", "claimed", "fallbacks",
                              "ray_path_small")}


def delta(a, b):
    return {k: b[k] - a[k] for k in a}


def ray_received(node_hex):
    """Ray's own object manager's received bytes on that node (its metric), None if unknown."""
    from rayfabric import metrics
    node = next((n for n in ray.nodes() if n["NodeID"] == node_hex), None)
    return None if node is None else metrics.ray_bytes_received(node)


def _mean_received(rows):
    got = [r["ray_received"] for r in rows if r.get("ray_received") is not None]
    return sum(got) / len(got) if got else None


def _ran_where_predicted(rows):
    """The reduce cases: tasks that ran on the node the hook predicted (Ray's locality choice), of all."""
    if not rows or "tasks" not in rows[0]:
        return "-"
    return f"{sum(r['ran_where_predicted'] for r in rows)}/{sum(r['tasks'] for r in rows)}"


def _mib(n):
    return "-" if n is None else f"{n / MiB:.1f}"


def run_rl(steps, batch_bytes, seed0, use_fabric):
    from rayfabric import args
    rollouts = [Rollout.options(resources={"rollout": 0.01}).remote() for _ in range(4)]
    learner = Learner.options(resources={"learner": 0.01}).remote()
    ray.get(learner.ping.remote())
    ray.get([r.batch.remote(1, 0) for r in rollouts])
    want, got = [], []
    t0 = time.perf_counter()
    for step in range(steps):
        seeds = [seed0 + step * 4 + i for i in range(4)]
        refs = [r.batch.remote(batch_bytes, s) for r, s in zip(rollouts, seeds)]
        if use_fabric:
            got.append(learner.update.remote(*refs))
        else:
            with args.paused():
                got.append(learner.update.remote(*refs))
        want.append(seeds)
    results = ray.get(got)
    seconds = time.perf_counter() - t0
    ok = all(r == [expected(batch_bytes, s) for s in seeds] for r, seeds in zip(results, want))
    for a in rollouts + [learner]:
        ray.kill(a)
    return seconds, ok, steps * 4 * batch_bytes


def run_map(blocks, block_bytes, seed0, use_fabric, kind="map"):
    """One call per ready block, bound for the mapper node: a pinned task ("map"), a call of an
    actor there ("actor"), or a task in a placement group bundle there ("pg")."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
    from rayfabric import args
    mapper = node_of("mapper")
    refs = [block.options(resources={"rollout": 0.01}).remote(block_bytes, seed0 + i) for i in range(blocks)]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    pg = actor = None
    if kind == "actor":
        actor = Learner.options(resources={"mapper": 0.01}).remote()
        ray.get(actor.ping.remote())
        submit = actor.update.remote
    elif kind == "pg":
        pg = ray.util.placement_group([{"mapper": 1}])
        ray.get(pg.ready())
        submit = consume.options(resources={"mapper": 0.01},
                                 scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote
    else:
        submit = consume.options(scheduling_strategy=NodeAffinitySchedulingStrategy(mapper, soft=False)).remote
    t0 = time.perf_counter()
    if use_fabric:
        outs = [submit(r) for r in refs]
    else:
        with args.paused():
            outs = [submit(r) for r in refs]
    results = ray.get(outs)
    seconds = time.perf_counter() - t0
    if kind == "actor":
        results = [r[0] for r in results]
        ray.kill(actor)
    if pg is not None:
        ray.util.remove_placement_group(pg)
    ok = results == [expected(block_bytes, seed0 + i) for i in range(blocks)]
    return seconds, ok, blocks * block_bytes


def run_create(blocks, block_bytes, seed0, use_fabric, actors=4):
    """`actors` actors created on the mapper node, the ready blocks their constructors' arguments."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    from rayfabric import args
    refs = [block.options(resources={"rollout": 0.01}).remote(block_bytes, seed0 + i) for i in range(blocks)]
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    create = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_of("mapper"), soft=False)).remote
    share = -(-blocks // actors)
    t0 = time.perf_counter()
    holders = []
    try:
        with contextlib.nullcontext() if use_fabric else args.paused():
            for i in range(0, blocks, share):
                holders.append(create(*refs[i:i + share]))
        results = [d for held in ray.get([h.held.remote() for h in holders]) for d in held]
        seconds = time.perf_counter() - t0
    finally:
        for h in holders:
            ray.kill(h)
    return seconds, results == [expected(block_bytes, seed0 + i) for i in range(blocks)], blocks * block_bytes


def run_reduce(pairs, block_bytes, seed0, use_fabric, cpus):
    """`pairs` default-scheduled tasks, each on a block from the mapper node and one from the
    rollout node (ready). Returns seconds, verified, bytes that had to cross (one block per task),
    and how many tasks ran on the mapper node (Ray's locality choice, which the hook predicts)."""
    from rayfabric import args
    source, other = node_of("mapper"), node_of("rollout")
    lefts = [block.options(resources={"mapper": 0.01}).remote(block_bytes, seed0 + 2 * i) for i in range(pairs)]
    rights = [block.options(resources={"rollout": 0.01}).remote(block_bytes, seed0 + 2 * i + 1) for i in range(pairs)]
    ray.wait(lefts + rights, num_returns=2 * pairs, fetch_local=False)
    # (Their places as this driver knows them, which is what Ray's lease policy reads: the raylet's
    # location update follows a task's reply by a few ms.)
    want = {**{r: [source] for r in lefts}, **{r: [other] for r in rights}}
    deadline = time.monotonic() + 30
    while True:
        where = ray.experimental.get_local_object_locations(lefts + rights)
        if all(where[r]["node_ids"] == want[r] for r in want):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"blocks not where they were made: {where}")
        time.sleep(0.01)
    submit = reduce_pair.options(num_cpus=cpus).remote
    t0 = time.perf_counter()
    if use_fabric:
        outs = [submit(a, b) for a, b in zip(lefts, rights)]
    else:
        with args.paused():
            outs = [submit(a, b) for a, b in zip(lefts, rights)]
    results = ray.get(outs)
    seconds = time.perf_counter() - t0
    ok = [d for d, _ in results] == [[expected(block_bytes, seed0 + 2 * i), expected(block_bytes, seed0 + 2 * i + 1)]
                                     for i in range(pairs)]
    predicted = sum(1 for _, node in results if node == source)
    return seconds, ok, pairs * block_bytes, predicted


def main(argv=None):
    p = argparse.ArgumentParser(prog="rayfabric bench args", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--batch-mib", type=int, default=16)
    p.add_argument("--blocks", type=int, default=48)
    p.add_argument("--block-mib", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--cases", default="rl,map,actor,pg,create,reduce,reduce-busy")
    p.add_argument("--wait-for", default="sealed",
                   help="what a call with ready arguments waits for before it is submitted, a comma list run side "
                        "by side: sealed (the default: the arguments are in the destination's store, so Ray's pull "
                        "finds them there) or claimed (their replicas created: Ray's pull races the read)")
    p.add_argument("--json")
    a = p.parse_args(argv)
    modes = a.wait_for.split(",")
    if not modes or any(m not in ("sealed", "claimed") for m in modes):
        p.error(f"--wait-for {a.wait_for}: a comma list of sealed, claimed")
    import rayfabric
    from rayfabric import args as args_hook, transparent
    # Ray's own object manager's received bytes per node (its metric), reported every second.
    os.environ.setdefault("RAY_metrics_report_interval_ms", "1000")
    cluster = None
    env = transparent.runtime_env()
    if a.address:
        ray.init(address=a.address, logging_level="ERROR", runtime_env=env)
    else:
        from ray.cluster_utils import Cluster
        os.environ["RAYFABRIC_BIN_DIR"] = rayfabric.bin_dir()
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": {"rollout": 100}, "object_store_memory": 1024 * MiB,
            "include_dashboard": False})
        cluster.add_node(num_cpus=1, resources={"learner": 100}, object_store_memory=1024 * MiB)
        cluster.add_node(num_cpus=1, resources={"mapper": 100}, object_store_memory=1024 * MiB)
        ray.init(address=cluster.address, logging_level="ERROR", runtime_env=env)
        cluster.wait_for_nodes()
    rayfabric.init(watch_new_nodes=False)
    transparent.enable()
    rows = []
    try:
        cases = a.cases.split(",")
        dest = {"rl": node_of("learner"), "map": node_of("mapper"), "actor": node_of("mapper"),
                "pg": node_of("mapper"), "create": node_of("mapper"), "reduce": node_of("mapper"), "reduce-busy": node_of("mapper")}
        everyone = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        for rnd in range(a.rounds):
            for case in cases:
                paths = ["ray"] + [f"rayfabric-{m}" for m in modes]
                for path in (paths if rnd % 2 == 0 else paths[::-1]):  # (each path first in turn)
                    use = path != "ray"
                    if use:
                        args_hook.CLAIM_MODE = args_hook.WAIT_FOR[path.split("-", 1)[1]]
                    before = prefetch_outcomes(dest[case])
                    # (Ray's received bytes on every node: a reduce may run anywhere.)
                    ray_before = [ray_received(n) for n in everyone]
                    seed0 = 1000 * (rnd + 1) + (500 if use else 0)
                    extra = {}
                    if case == "rl":
                        seconds, ok, nbytes = run_rl(a.steps, a.batch_mib * MiB, seed0, use)
                    elif case.startswith("reduce"):
                        seconds, ok, nbytes, predicted = run_reduce(a.blocks // 2, a.block_mib * MiB, seed0, use,
                                                                    1 if case == "reduce-busy" else 0)
                        extra = {"ran_where_predicted": predicted, "tasks": a.blocks // 2}
                    elif case == "create":
                        seconds, ok, nbytes = run_create(a.blocks, a.block_mib * MiB, seed0, use)
                    else:
                        seconds, ok, nbytes = run_map(a.blocks, a.block_mib * MiB, seed0, use, case)
                    time.sleep(2.5)  # let the prefetches that lost report, and Ray's metric
                    ray_after = [ray_received(n) for n in everyone]
                    row = {"case": case, "path": path, "round": rnd, "seconds": seconds, "ok": ok,
                           "bytes": nbytes, "gbps": nbytes / seconds / 1e9,
                           "outcomes": delta(before, prefetch_outcomes(dest[case])),
                           # what Ray's own object managers received meanwhile, all nodes (chunks
                           # thrown away for an object the agent was creating included)
                           "ray_received": None if None in ray_before + ray_after
                           else sum(ray_after) - sum(ray_before), **extra}
                    rows.append(row)
                    where = f" {extra['ran_where_predicted']}/{extra['tasks']} ran where predicted" if extra else ""
                    print(f"{case:11s} {path:17s} round {rnd}: {seconds:7.3f} s {row['gbps']:6.3f} GB/s "
                          f"verified={ok} Ray received {_mib(row['ray_received'])} MiB{where} agent: "
                          f"{row['outcomes']}", flush=True)
    finally:
        transparent.disable()
        rayfabric.shutdown()
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    print()
    # won: the destination's agent moved the argument (claimed before the call, or pulled first);
    # lost: Ray's own pull was first (the agent stood aside, or found it created or already here).
    # Ray MiB: what Ray's own object managers received, all nodes, per round (the argument bytes for
    # Ray's path; for rayfabric's, the bytes it moved too: ~0 when no byte crosses twice).
    # predicted: reduce tasks that ran where the hook had their arguments read (Ray's locality choice).
    print(f"{'case':11s} {'path':17s} {'Ray s':>8s} {'rf s':>8s} {'rf/Ray':>7s} {'won':>5s} {'lost':>5s} "
          f"{'Ray MiB':>8s} {'predicted':>9s}")
    for case in a.cases.split(","):
        ray_rows = [r for r in rows if r["case"] == case and r["path"] == "ray"]
        mean_ray = sum(r["seconds"] for r in ray_rows) / len(ray_rows)
        print(f"{case:11s} {'ray':17s} {mean_ray:8.3f} {'':8s} {'':7s} {'':5s} {'':5s} "
              f"{_mib(_mean_received(ray_rows)):>8s} {_ran_where_predicted(ray_rows):>9s}")
        for mode in modes:
            rf = [r for r in rows if r["case"] == case and r["path"] == f"rayfabric-{mode}"]
            mean_rf = sum(r["seconds"] for r in rf) / len(rf)
            won = sum(r["outcomes"]["objects_pulled"] + r["outcomes"]["claimed"] for r in rf)
            lost = sum(r["outcomes"]["stood_aside"] + r["outcomes"]["already_local"] + r["outcomes"]["already_here"]
                       for r in rf)
            print(f"{case:11s} {'rayfabric-' + mode:17s} {'':8s} {mean_rf:8.3f} {mean_ray / mean_rf:7.2f} {won:5d} "
                  f"{lost:5d} {_mib(_mean_received(rf)):>8s} {_ran_where_predicted(rf):>9s}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
