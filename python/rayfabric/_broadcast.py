"""rayfabric.broadcast: one plasma object into every node's store in doubling rounds, each
destination reading by the fabric (rayfabric._pulls) from a node that holds it already."""
import time

import ray

from rayfabric._pulls import (MIN_OBJECT_BYTES, PULL_TIMEOUT_S, _agent_records, _locations, _pull, _ray_get,
                              _ray_wait, stats)

_broadcast_task = None


def _broadcast_pull(refs, source, timeout_s):
    """On a destination node: the fabric pull from `source`, then Ray's own path for what it did not
    bring (ray.wait with fetch_local: at once when the copy is here). What happened, for broadcast."""
    before = stats()
    start = time.monotonic()
    error = None
    try:
        _pull(refs, timeout_s, source_node=source)
    except Exception as e:  # noqa: BLE001 - as get(): Ray's path still brings it
        error = f"{type(e).__name__}: {e}"[:300]
    after = stats()
    fabric_s = time.monotonic() - start
    read_from = sorted(n for n, c in after["pulls_by_source"].items() if c > before["pulls_by_source"].get(n, 0))
    ready, _ = _ray_wait(refs, num_returns=len(refs), timeout=max(0.1, timeout_s - fabric_s), fetch_local=True)
    return {"seconds": time.monotonic() - start, "fabric_seconds": fabric_s,
            "pulled": after["objects_pulled"] > before["objects_pulled"] or after["already_here"] > before["already_here"],
            "local": len(ready) == len(refs), "read_from": read_from, "error": error}


def broadcast(ref, nodes=None, timeout=None):
    """Copies one plasma object into the store of every node in `nodes` (node ids; default: every
    node with a rayfabric agent) in rounds like a binomial tree: each round every node that holds
    the object serves one node that does not, by the fabric, so the copies double per round instead
    of every reader sharing the first holder's link. A destination the fabric could not serve gets
    the object by Ray's own path in the same round (counted as a fallback where rayfabric.get would
    count one). Returns the rounds, each a list of {"source", "destination", "read_from" (the node(s)
    its fabric pull read), "pulled" (by the fabric), "local" (the node holds a copy now),
    "seconds", "error"}; a node without a copy (dead, timed out) does not serve later rounds.
    An object still being computed is waited for first, and then its owner's record of where it
    was stored (up to BROADCAST_LOCATION_WAIT_S, 5 s; a small result inlined in its owner is
    refused at once: ValueError, as is one spilled or lost). `timeout` bounds the whole (default: no
    bound on that wait, RAYFABRIC_PULL_TIMEOUT_S per round); GetTimeoutError if the object was not
    made within it."""
    global _broadcast_task
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if _broadcast_task is None:
        _broadcast_task = ray.remote(num_cpus=0)(_broadcast_pull)
    deadline = None if timeout is None else time.monotonic() + timeout
    # A result still being computed is waited for (within `timeout`): it has no holder yet.
    made, _ = ray.wait([ref], timeout=timeout, fetch_local=False)
    if not made:
        raise ray.exceptions.GetTimeoutError(f"rayfabric.broadcast: the object was not made within {timeout} s")
    holders = _broadcast_holders(ref, deadline)
    if not holders:
        raise ValueError("rayfabric.broadcast: the object is in no node's object store (inlined in its "
                         "owner, spilled or lost); use ray.get for it")
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    if nodes is None:
        nodes = list(_agent_records(refresh=True))
    pending = [n for n in dict.fromkeys(nodes) if n in alive and n not in holders]
    rounds = []
    while pending:
        pairs = list(zip(holders, pending))
        pending = pending[len(pairs):]
        left = PULL_TIMEOUT_S if deadline is None else max(0.1, deadline - time.monotonic())
        futures = [_broadcast_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(dst, soft=False))
                   .remote([ref], src, left) for src, dst in pairs]
        ready, not_ready = _ray_wait(futures, num_returns=len(futures), timeout=left + 5)
        for f in not_ready:
            ray.cancel(f, force=True)
        results = []
        for f in futures:
            try:
                results.append(_ray_get(f, timeout=1) if f in ready else
                               {"pulled": False, "local": False, "read_from": [], "seconds": left,
                                "error": f"no answer within {left:.0f} s"})
            except Exception as e:  # noqa: BLE001 - the destination died or could not run the task
                results.append({"pulled": False, "local": False, "read_from": [], "seconds": None,
                                "error": f"{type(e).__name__}: {e}"[:300]})
        rounds.append([dict(r, source=src, destination=dst) for (src, dst), r in zip(pairs, results)])
        holders += [dst for (_, dst), r in zip(pairs, results) if r["local"]]
    return rounds


BROADCAST_LOCATION_WAIT_S = 5.0


def _broadcast_holders(ref, deadline):
    """The nodes whose stores hold `ref` (a made object). A task's result is ready a moment before
    the raylet that stored it tells the owner where (_own_locations waits 50 ms for that, which a
    busy machine can outlast: a fresh-clone CI run saw broadcast refuse a just-made 8 MiB result),
    so one big enough for a store and not spilled is read again for up to
    BROADCAST_LOCATION_WAIT_S (within `deadline`). Small ones (inlined in their owner) are not."""
    core_worker = ray._private.worker.global_worker.core_worker
    wait_until = time.monotonic() + BROADCAST_LOCATION_WAIT_S
    if deadline is not None:
        wait_until = min(wait_until, deadline)
    pause = 0.001
    while True:
        location = _locations(core_worker, [ref]).get(ref) or {}
        holders = list(dict.fromkeys(location.get("node_ids") or []))
        size = location.get("object_size")
        inlined = size is not None and size < MIN_OBJECT_BYTES
        if holders or inlined or location.get("did_spill") or time.monotonic() >= wait_until:
            return holders
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
