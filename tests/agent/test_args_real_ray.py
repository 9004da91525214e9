"""Call arguments over the fabric (rayfabric.args, part of transparent mode) on a REAL 3-node Ray
cluster: the ObjectRef arguments of calls whose destination node is known at submission (actor
method calls, node-affinity and placement-group tasks) are pulled by that node's agent, while Ray
resolves them as always. Results must be what Ray alone gives (same values, same exceptions, Ray's
reconstruction), and the destination's agent must have seen every argument (pulled it, or stood
aside because Ray's own pull was first, or found it local).

Nodes: n0 (head, the driver's; the producers), n1 (the learner actor), n2 (pinned tasks), n3
(a source that dies)."""
import hashlib
import os
import time

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

import rayfabric
from rayfabric import _agents, args as rf_args, metrics, transparent

from ray_test_cluster import located, node_ids, on, use_this_checkout

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster():
    use_this_checkout()
    os.environ["RAY_metrics_report_interval_ms"] = "1000"  # Ray's own counters, read by a test
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"n0": 100}, "object_store_memory": 600 * MiB, "include_dashboard": False})
    nodes = {"n3": c.add_node(num_cpus=1, resources={"n3": 100}, object_store_memory=300 * MiB)}
    for name in ("n1", "n2"):
        c.add_node(num_cpus=2, resources={name: 100}, object_store_memory=600 * MiB)
    # Transparent mode in the driver and, through the job's runtime_env, in every worker.
    ray.init(address=c.address, logging_level="ERROR", runtime_env=transparent.runtime_env())
    c.wait_for_nodes()
    ids = node_ids(("n0", "n1", "n2", "n3"))
    rayfabric.init(watch_new_nodes=False)
    transparent.enable()
    yield {"cluster": c, "nodes": ids, "n3": nodes["n3"]}
    transparent.disable()
    rayfabric.shutdown()
    ray.shutdown()
    c.shutdown()


def make(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)


def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()


@ray.remote(num_cpus=0, max_retries=2)
def produce(nbytes, seed, delay_s=0.0):
    time.sleep(delay_s)
    return make(nbytes, seed)


@ray.remote(num_cpus=0)
def fail_upstream():
    raise ValueError("upstream failed on purpose")


@ray.remote(num_cpus=0)
def digests(*arrays):
    return [digest(a) for a in arrays]


@ray.remote(num_cpus=0)
class Learner:
    def update(self, *arrays):
        return [digest(a) for a in arrays]

    def ping(self):
        return ray.get_runtime_context().get_node_id()


def outcomes(node_hex):
    """What this node's argument prefetches did so far (its NodeAgent's rayfabric.stats())."""
    s = ray.get(_agents.actor_of(node_hex).prefetch_stats.remote(), timeout=60)
    return {k: s[k] for k in ("objects_pulled", "bytes_pulled", "stood_aside", "already_local", "already_here", "claimed",
                              "fallbacks", "ray_path_small")}


def agent_counters(node_hex):
    a = rayfabric.status()["agents"][node_hex]
    return {k: a[k] for k in ("objects_pulled", "bytes_pulled", "pulls_stood_aside", "pulls_already_local")}


def seen(before, after):
    """Arguments the destination's prefetch saw to the end (pulled, stood aside, found local, or
    left to Ray after a failure)."""
    return sum(after[k] - before[k] for k in ("objects_pulled", "stood_aside", "already_local", "already_here", "claimed",
                                              "fallbacks", "ray_path_small"))


def wait_seen(node_hex, before, n, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        after = outcomes(node_hex)
        if seen(before, after) >= n or time.monotonic() > deadline:
            return after
        time.sleep(0.1)


def asked():
    return rayfabric.stats()["args_prefetch_asked"]


def ray_received(node_hex):
    """What Ray's own object manager on the node received from others (its metric), once the
    raylet has reported what it moved up to now (every second here)."""
    time.sleep(2.5)
    node = next(n for n in ray.nodes() if n["NodeID"] == node_hex)
    received = metrics.ray_bytes_received(node)
    assert received is not None, "Ray's ray_object_manager_bytes is not on the node's endpoint"
    return received


def learner_and_arguments(n1, sizes, seeds):
    """A learner actor on n1, placed, and arguments made on n0, ready."""
    learner = on("n1", Learner).remote()
    assert ray.get(learner.ping.remote(), timeout=120) == n1
    refs = [on("n0", produce).remote(n, s) for n, s in zip(sizes, seeds)]
    ray.wait(refs, num_returns=len(refs), fetch_local=False, timeout=120)
    return learner, refs


def test_no_argument_byte_crosses_twice(cluster):
    """The default (RAYFABRIC_ARGS_WAIT_FOR=sealed): a call with ready arguments is submitted once
    they are in the destination's store, so Ray's own pull finds them there: the fabric moved every
    byte, Ray's object manager there none (with `claimed`, its pull raced the agent's read: 192-416
    of 512 MiB crossed twice, docs/benchmarks-history.md)."""
    n1 = cluster["nodes"]["n1"]
    sizes, seeds = (16 * MiB, 16 * MiB, 32 * MiB), (51, 52, 53)
    learner, refs = learner_and_arguments(n1, sizes, seeds)
    assert rf_args.CLAIM_MODE == rf_args.WAIT_FOR["sealed"]
    before, agent_before, received_before = outcomes(n1), agent_counters(n1), ray_received(n1)
    out = [ray.get(learner.update.remote(r), timeout=180) for r in refs]
    assert out == [[digest(make(n, s))] for n, s in zip(sizes, seeds)]
    after = wait_seen(n1, before, 3)
    assert after["objects_pulled"] - before["objects_pulled"] == 3, (before, after)
    assert agent_counters(n1)["bytes_pulled"] - agent_before["bytes_pulled"] >= sum(sizes)
    moved_by_ray = ray_received(n1) - received_before
    print(f"Ray's object manager on n1 received {moved_by_ray / MiB:.1f} MiB of {sum(sizes) / MiB:.0f} MiB of arguments")
    assert moved_by_ray < 1 * MiB, moved_by_ray


def test_actor_call_arguments_reach_the_actors_node(cluster):
    """RAYFABRIC_ARGS_WAIT_FOR=claimed: the call waits until the replicas are created only."""
    n1 = cluster["nodes"]["n1"]
    sizes, seeds = (1 * MiB, 8 * MiB, 64 * MiB), (11, 12, 13)
    learner, refs = learner_and_arguments(n1, sizes, seeds)
    before, agent_before, asked_before = outcomes(n1), agent_counters(n1), asked()
    rf_args.CLAIM_MODE = rf_args.WAIT_FOR["claimed"]
    try:
        out = ray.get(learner.update.remote(*refs), timeout=180)
    finally:
        rf_args.CLAIM_MODE = rf_args.WAIT_FOR["sealed"]
    assert out == [digest(make(n, s)) for n, s in zip(sizes, seeds)]
    assert asked() - asked_before == 3
    after = wait_seen(n1, before, 3)
    assert seen(before, after) == 3, (before, after)
    print("actor call arguments, destination's prefetch:", {k: after[k] - before[k] for k in after})
    # The arguments existed at submission: the call waited until the learner's node claimed them;
    # their bytes came by the fabric, as the node's agent counts them (Ray's pull may have moved
    # some too: the test above).
    claimed = after["claimed"] - before["claimed"]
    assert claimed == 3, (before, after)
    agent_after = agent_counters(n1)
    assert agent_after["objects_pulled"] - agent_before["objects_pulled"] == 3
    assert agent_after["bytes_pulled"] - agent_before["bytes_pulled"] >= sum(sizes)


def test_pinned_and_placement_group_tasks(cluster):
    n2 = cluster["nodes"]["n2"]
    pg = ray.util.placement_group([{"n2": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready(), timeout=120)
    try:
        refs = [on("n0", produce).remote(16 * MiB, s) for s in (21, 22)]
        ray.wait(refs, num_returns=2, fetch_local=False, timeout=120)
        before, asked_before = outcomes(n2), asked()
        pinned = digests.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n2, soft=False)).remote(refs[0])
        in_pg = digests.options(resources={"n2": 0.5},
                                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote(refs[1])
        assert ray.get([pinned, in_pg], timeout=180) == [[digest(make(16 * MiB, 21))], [digest(make(16 * MiB, 22))]]
        assert asked() - asked_before == 2
        after = wait_seen(n2, before, 2)
        assert seen(before, after) == 2, (before, after)
    finally:
        ray.util.remove_placement_group(pg)


def test_an_argument_still_being_computed(cluster):
    """The call is submitted at once (never delayed by it). By default (RAYFABRIC_ARGS_PENDING=ray)
    the argument is left to Ray's own pull, which starts the moment it exists and would move all of
    it whatever the agent did: nothing is asked. With `race` the destination pulls it too, as soon
    as it exists."""
    n1 = cluster["nodes"]["n1"]
    learner = on("n1", Learner).remote()
    ray.get(learner.ping.remote(), timeout=120)
    assert rf_args.PENDING == "ray"
    asked_before, left_before = asked(), rayfabric.stats()["args_pending_left_to_ray"]
    ref = on("n0", produce).remote(32 * MiB, 30, 2.0)
    t0 = time.monotonic()
    call = learner.update.remote(ref)
    assert time.monotonic() - t0 < 1.0  # submission does not wait for the argument
    assert ray.get(call, timeout=180) == [digest(make(32 * MiB, 30))]
    assert asked() == asked_before and rayfabric.stats()["args_pending_left_to_ray"] == left_before + 1

    before = outcomes(n1)
    rf_args.PENDING = "race"
    try:
        ref = on("n0", produce).remote(32 * MiB, 31, 2.0)
        t0 = time.monotonic()
        call = learner.update.remote(ref)
        assert time.monotonic() - t0 < 1.0
    finally:
        rf_args.PENDING = "ray"
    assert ray.get(call, timeout=180) == [digest(make(32 * MiB, 31))]
    after = wait_seen(n1, before, 1)
    assert seen(before, after) == 1, (before, after)


def test_a_failed_upstream_task_raises_what_ray_raises(cluster):
    learner = on("n1", Learner).remote()
    ray.get(learner.ping.remote(), timeout=120)
    bad = on("n0", fail_upstream).remote()
    with pytest.raises(ValueError) as with_prefetch:
        ray.get(learner.update.remote(bad), timeout=120)
    with rf_args.paused():
        with pytest.raises(ValueError) as ray_alone:
            ray.get(learner.update.remote(bad), timeout=120)
    # (Ray makes the RayTaskError(ValueError) class anew for each error: compare what it is.)
    assert type(with_prefetch.value).__name__ == type(ray_alone.value).__name__ == "RayTaskError(ValueError)"
    assert type(with_prefetch.value.cause) is type(ray_alone.value.cause) is ValueError
    assert "upstream failed on purpose" in str(with_prefetch.value)
    assert str(with_prefetch.value) == str(ray_alone.value)


def test_paused_call_sites_ask_nothing(cluster):
    learner = on("n1", Learner).remote()
    ray.get(learner.ping.remote(), timeout=120)
    ref = on("n0", produce).remote(2 * MiB, 41)
    ray.wait([ref], fetch_local=False, timeout=120)
    before = asked()
    with rf_args.paused():
        assert ray.get(learner.update.remote(ref), timeout=120) == [digest(make(2 * MiB, 41))]
    assert asked() == before
    # A call without a destination known at submission (SPREAD) is left to Ray (counted).
    no_dest = rayfabric.stats()["args_no_destination"]
    assert ray.get(digests.options(scheduling_strategy="SPREAD").remote(ref), timeout=120) == [digest(make(2 * MiB, 41))]
    assert rayfabric.stats()["args_no_destination"] == no_dest + 1 and asked() == before
    # A default task whose one argument is on n0 only: Ray runs it there, nothing to move, nothing
    # asked. (`ref` is on n1 too by now: a tie Ray breaks by a hash set's order, left to Ray.)
    only_here = on("n0", produce).remote(2 * MiB, 42)
    ray.wait([only_here], fetch_local=False, timeout=120)
    assert located([only_here])[only_here] == [cluster["nodes"]["n0"]]
    not_worth = rayfabric.stats()["args_not_worth_a_pull"]
    assert ray.get(digests.remote(only_here), timeout=120) == [digest(make(2 * MiB, 42))]
    assert rayfabric.stats()["args_not_worth_a_pull"] == not_worth + 1 and asked() == before


@ray.remote(num_cpus=0)
def digests_where(*arrays):
    return [digest(a) for a in arrays], ray.get_runtime_context().get_node_id()


@ray.remote(num_cpus=2)
class Hog:
    """Holds both CPUs of its node."""
    def ping(self):
        return ray.get_runtime_context().get_node_id()


def spread_arguments(cluster, seeds):
    """A 32 MiB argument made on n1 and an 8 MiB one on n2, ready and their places known to the
    driver (the raylet's location update follows the task's reply by a few ms)."""
    refs = [on("n1", produce).remote(32 * MiB, seeds[0]), on("n2", produce).remote(8 * MiB, seeds[1])]
    ray.wait(refs, num_returns=2, fetch_local=False, timeout=120)
    where = located(refs)
    assert [where[r] for r in refs] == [[cluster["nodes"]["n1"]], [cluster["nodes"]["n2"]]], where
    return refs


def test_a_default_task_gets_its_arguments_where_ray_runs_it(cluster):
    """Default scheduling: Ray's locality-aware lease policy asks n1 (32 of the task's 40 MiB are
    there) to run it; the hook predicts that from the driver's own reference table, n1's agent reads
    the 8 MiB from n2 before the call goes, and Ray's own pull at n1 finds it there."""
    n1 = cluster["nodes"]["n1"]
    refs = spread_arguments(cluster, (61, 62))
    before, agent_before, asked_before, received_before = outcomes(n1), agent_counters(n1), asked(), ray_received(n1)
    out, ran_on = ray.get(digests_where.remote(*refs), timeout=180)
    assert out == [digest(make(32 * MiB, 61)), digest(make(8 * MiB, 62))]
    assert ran_on == n1
    assert asked() - asked_before == 1  # the 8 MiB one; the other is there already
    after = wait_seen(n1, before, 1)
    assert after["objects_pulled"] - before["objects_pulled"] == 1, (before, after)
    assert agent_counters(n1)["bytes_pulled"] - agent_before["bytes_pulled"] >= 8 * MiB
    moved_by_ray = ray_received(n1) - received_before
    print(f"default task: Ray's object manager on n1 received {moved_by_ray / MiB:.1f} MiB of 8 MiB")
    assert moved_by_ray < 1 * MiB, moved_by_ray


@ray.remote(num_cpus=0)
def pair_where(first, second):
    return [digest(first), digest(second)], ray.get_runtime_context().get_node_id()


def test_a_tie_goes_to_the_first_argument_as_in_ray(cluster):
    """16 MiB on n1 and 16 MiB on n2, passed as keywords, n2's first: Ray's lease policy counts the
    arguments in the order given and keeps the first node to reach the most bytes (not the
    driver's node, n0, where Ray would lease without locality): n2, whose agent reads n1's."""
    n1, n2 = cluster["nodes"]["n1"], cluster["nodes"]["n2"]
    on_n1, on_n2 = on("n1", produce).remote(16 * MiB, 81), on("n2", produce).remote(16 * MiB, 82)
    ray.wait([on_n1, on_n2], num_returns=2, fetch_local=False, timeout=120)
    assert located([on_n1, on_n2]) == {on_n1: [n1], on_n2: [n2]}
    before, received_before = outcomes(n2), ray_received(n2)
    out, ran_on = ray.get(pair_where.remote(second=on_n2, first=on_n1), timeout=180)
    assert out == [digest(make(16 * MiB, 81)), digest(make(16 * MiB, 82))]
    assert ran_on == n2
    after = wait_seen(n2, before, 1)
    assert after["objects_pulled"] - before["objects_pulled"] == 1, (before, after)
    assert ray_received(n2) - received_before < 1 * MiB


def test_no_prediction_for_a_node_that_cannot_run_the_task(cluster):
    """Most of the bytes are on n1, but the task needs n2's custom resource: Ray's lease request
    would go to n1 and be spilled to n2 every time, so the hook predicts nothing (no wasted copy,
    no wait) and Ray moves the argument."""
    n1 = cluster["nodes"]["n1"]
    refs = spread_arguments(cluster, (91, 92))
    before, asked_before = outcomes(n1), asked()
    no_dest = rayfabric.stats()["args_no_destination"]
    out, ran_on = ray.get(digests_where.options(resources={"n2": 1}).remote(*refs), timeout=180)
    assert out == [digest(make(32 * MiB, 91)), digest(make(8 * MiB, 92))]
    assert ran_on == cluster["nodes"]["n2"]
    assert asked() == asked_before and rayfabric.stats()["args_no_destination"] == no_dest + 2
    assert outcomes(n1) == before


def test_a_wrong_prediction_costs_a_copy_not_a_result(cluster):
    """n1 holds most of the bytes but is busy: its raylet spills the task back to a node with a free
    CPU, where Ray moves both arguments itself. The copy n1's agent made is wasted; the result is
    Ray's, and the call waited no longer than the bounded wait."""
    n1 = cluster["nodes"]["n1"]
    hog = on("n1", Hog).remote()
    assert ray.get(hog.ping.remote(), timeout=120) == n1
    try:
        refs = spread_arguments(cluster, (71, 72))
        before, asked_before = outcomes(n1), asked()
        t0 = time.monotonic()
        call = digests_where.options(num_cpus=1).remote(*refs)
        submitted_s = time.monotonic() - t0
        out, ran_on = ray.get(call, timeout=180)
        assert out == [digest(make(32 * MiB, 71)), digest(make(8 * MiB, 72))]
        assert ran_on != n1, "n1 was busy: Ray should have spilled the task back"
        assert asked() - asked_before == 1
        after = wait_seen(n1, before, 1)
        assert after["objects_pulled"] - before["objects_pulled"] == 1, (before, after)  # the wasted copy
        assert submitted_s < rf_args.CLAIM_WAIT_S + 1, submitted_s
    finally:
        ray.kill(hog)


@ray.remote(num_cpus=0)
class Holder:
    """Keeps what its constructor was given; reads refs nested in a list with ray.get itself."""
    def __init__(self, *arrays):
        self.digests = [digest(a) for a in arrays]

    def created_with(self):
        return self.digests, ray.get_runtime_context().get_node_id()

    def read_nested(self, box):
        return [digest(a) for a in ray.get(box["refs"])]


@ray.remote(num_cpus=0)
class AsyncLearner:
    async def update(self, *arrays):
        return [digest(a) for a in arrays]

    async def ping(self):
        return ray.get_runtime_context().get_node_id()


def test_a_pinned_actors_creation_arguments(cluster):
    """An actor created on n2 (node affinity) with two 16 MiB arguments made on n0: n2's agent reads
    them before the creation goes, so the raylet that starts the actor finds them local and Ray's
    object manager there moves none of them; so for one created in a placement-group bundle there.
    A get_if_exists creation asks once, and nothing when the actor exists. A default-scheduled
    actor's node is the GCS's choice: nothing asked, counted as no destination."""
    n2 = cluster["nodes"]["n2"]
    refs = [on("n0", produce).remote(16 * MiB, s) for s in (101, 102, 103)]
    ray.wait(refs, num_returns=3, fetch_local=False, timeout=120)
    pg = ray.util.placement_group([{"n2": 1}], strategy="STRICT_PACK")
    ray.get(pg.ready(), timeout=120)
    made = []
    try:
        before, asked_before, received_before = outcomes(n2), asked(), ray_received(n2)
        made.append(Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n2, soft=False)).remote(*refs[:2]))
        made.append(Holder.options(resources={"n2": 0.5},
                                   scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote(refs[2]))
        created = ray.get([h.created_with.remote() for h in made], timeout=180)
        assert created == [([digest(make(16 * MiB, s)) for s in (101, 102)], n2), ([digest(make(16 * MiB, 103))], n2)]
        assert asked() - asked_before == 3
        after = wait_seen(n2, before, 3)
        assert after["objects_pulled"] - before["objects_pulled"] == 3, (before, after)
        moved_by_ray = ray_received(n2) - received_before
        print(f"actor creation: Ray's object manager on n2 received {moved_by_ray / MiB:.1f} MiB of 48 MiB")
        assert moved_by_ray < 1 * MiB, moved_by_ray

        # get_if_exists: created (its argument, on n2 already by now, is not worth a pull), then
        # found: asked nothing the second time, no lookup.
        named = Holder.options(name="rf-holder", get_if_exists=True,
                               scheduling_strategy=NodeAffinitySchedulingStrategy(n2, soft=False))
        not_worth, asked_now = rayfabric.stats()["args_not_worth_a_pull"], asked()
        made.append(named.remote(refs[0]))
        assert ray.get(made[-1].created_with.remote(), timeout=180)[1] == n2
        assert rayfabric.stats()["args_not_worth_a_pull"] == not_worth + 1 and asked() == asked_now
        again = named.remote(refs[0])
        assert again._actor_id == made[-1]._actor_id
        assert rayfabric.stats()["args_not_worth_a_pull"] == not_worth + 1 and asked() == asked_now

        no_dest = rayfabric.stats()["args_no_destination"]
        made.append(Holder.remote(refs[0]))
        assert ray.get(made[-1].created_with.remote(), timeout=180)[0] == [digest(make(16 * MiB, 101))]
        assert rayfabric.stats()["args_no_destination"] == no_dest + 1 and asked() == asked_now
    finally:
        for h in made:
            ray.kill(h)
        ray.util.remove_placement_group(pg)


def test_refs_nested_in_an_argument_come_by_the_callees_get(cluster):
    """Ray does not resolve an ObjectRef inside a container: the callee's own ray.get does, and in
    transparent mode that get pulls by the fabric (n1's agent read both; Ray's object manager there
    received none of their bytes)."""
    n1 = cluster["nodes"]["n1"]
    holder = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n1, soft=False)).remote()
    try:
        assert ray.get(holder.created_with.remote(), timeout=120)[1] == n1
        refs = [on("n0", produce).remote(16 * MiB, s) for s in (111, 112)]
        ray.wait(refs, num_returns=2, fetch_local=False, timeout=120)
        agent_before, received_before = agent_counters(n1), ray_received(n1)
        assert ray.get(holder.read_nested.remote({"refs": refs}), timeout=180) == \
            [digest(make(16 * MiB, s)) for s in (111, 112)]
        agent_after = agent_counters(n1)
        assert agent_after["objects_pulled"] - agent_before["objects_pulled"] == 2, (agent_before, agent_after)
        assert agent_after["bytes_pulled"] - agent_before["bytes_pulled"] >= 32 * MiB
        assert ray_received(n1) - received_before < 1 * MiB
    finally:
        ray.kill(holder)


def test_an_async_actors_calls_from_a_driver(cluster):
    """The callee an async actor, the caller a plain driver (which may wait): its ready argument
    is read at the actor's node before the call goes, as for any actor."""
    n1 = cluster["nodes"]["n1"]
    learner = AsyncLearner.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n1, soft=False)).remote()
    try:
        assert ray.get(learner.ping.remote(), timeout=120) == n1
        ref = on("n0", produce).remote(16 * MiB, 121)
        ray.wait([ref], fetch_local=False, timeout=120)
        before, received_before = outcomes(n1), ray_received(n1)
        assert ray.get(learner.update.remote(ref), timeout=180) == [digest(make(16 * MiB, 121))]
        after = wait_seen(n1, before, 1)
        assert after["objects_pulled"] - before["objects_pulled"] == 1, (before, after)
        assert ray_received(n1) - received_before < 1 * MiB
    finally:
        ray.kill(learner)


def test_an_argument_whose_source_node_died(cluster):
    """Its only copy was on n3, which is gone: Ray reconstructs it (lineage), as without rayfabric;
    the destination's prefetch finds no holder and leaves it to Ray."""
    n3 = cluster["nodes"]["n3"]
    learner = on("n1", Learner).remote()
    ray.get(learner.ping.remote(), timeout=120)
    ref = produce.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n3, soft=True)).remote(8 * MiB, 51)
    ray.wait([ref], fetch_local=False, timeout=120)
    # Ready a moment before Ray's directory says where (the raylet's location update follows the
    # task's reply: 0.15-3.8 ms, ~2% of results): waited for, bounded, then the same check.
    assert n3 in located([ref])[ref]
    cluster["cluster"].remove_node(cluster["n3"], allow_graceful=False)
    assert ray.get(learner.update.remote(ref), timeout=300) == [digest(make(8 * MiB, 51))]
