"""Task and actor arguments over the fabric (part of transparent mode).

Ray resolves the ObjectRef arguments of a call itself: the executing node's raylet pulls them
before the call runs, over Ray's own transfer. When the destination node of a call is known at
submission, this hook asks THAT node to pull the call's top-level ObjectRef arguments through its
rayfabric agent, then submits the call unchanged:

  * an actor method call: the actor's node (from the GCS actor table, cached per actor);
  * a task with NodeAffinitySchedulingStrategy: that node;
  * an actor's creation with NodeAffinitySchedulingStrategy or PlacementGroupSchedulingStrategy:
    that node (a default-scheduled actor's node is the GCS's choice: left to Ray);
  * a task with PlacementGroupSchedulingStrategy: the bundle's node (any bundle, if they all sit
    on one node);
  * a task with default scheduling whose arguments all exist: the node Ray's locality-aware lease
    policy picks (the one holding most of their bytes), which runs it unless it is busy.

The ask goes to the node's NodeAgent actor (the one that runs its rayfabricd), which pulls on its
own node through the agent's local socket (Pull is never served to other hosts). A call whose
arguments exist waits (at most RAYFABRIC_ARGS_CLAIM_WAIT_S) until they are read into the
destination's store, so that Ray's own pull finds them there and moves nothing; past the wait, or
if the agent failed, Ray's pull moves them itself: results and semantics stay Ray's in every
case. An argument that does not exist yet is left to Ray's pull, which starts the moment it exists
(RAYFABRIC_ARGS_PENDING=race: the agent pulls it too, without delaying the call).

SPREAD tasks, and default ones whose arguments are still being computed, are left to Ray: no
destination is known at submission (docs/agent.md, "Arguments").

Off for one call site: `with rayfabric.args.paused(): actor.f.remote(ref)`."""
import contextlib
import logging
import os
import threading
import time

import ray

from rayfabric import _agents, _pulls, settings

log = logging.getLogger("rayfabric")

_CACHE_S = 30.0  # an actor's or a placement group's node, and a node's NodeAgent handle
# How long a call waits for the destination to claim its existing arguments (0: never waits; the
# prefetch then races Ray's own pull, which it loses almost always: docs/agent.md).
CLAIM_WAIT_S = settings.get("args_claim_wait_s")
# What a call with ready arguments waits for (at most CLAIM_WAIT_S) before it is submitted:
# "sealed" (the default): the destination's agent has read them into its store, so that Ray's own
# pull, which starts when the call arrives, finds them there and moves nothing; "claimed": their
# replicas are created (the call goes on sooner, but Ray's pull does not wait for an unsealed
# replica: it moves the object too and the destination throws its chunks away, issue 30).
WAIT_FOR = {"sealed": "sealed", "claimed": True}
CLAIM_MODE = WAIT_FOR[settings.get("args_wait_for")]
# An argument still being computed at submission (or one a call could not wait for, from an event
# loop): "ray" (the default) leaves it to Ray's own pull, which starts the moment it exists and
# moves all of it whatever the agent does (a race the agent cannot win by being sealed first: the
# bytes crossed twice, docs/benchmarks-history.md); "race": the destination's agent pulls it too, as soon
# as it exists (the call is not delayed).
PENDING_MODES = ("ray", "race")
PENDING = settings.get("args_pending")
_lock = threading.Lock()
_installed = {}
_paused = threading.local()
_actor_nodes = {}  # actor id hex -> (node hex or None, when looked up)
_pg_nodes = {}     # placement group id hex -> ({bundle index: node hex}, when looked up)
_node_agents = {}  # node hex -> (NodeAgent handle, when looked up)
_node_resources = {}  # "all" -> ({node hex: total resources}, when looked up)


@contextlib.contextmanager
def paused():
    """No argument prefetch for calls submitted in this block (this thread)."""
    before = getattr(_paused, "on", False)
    _paused.on = True
    try:
        yield
    finally:
        _paused.on = before


def _cached(table, key, lookup, empty_s=0.0):
    """lookup()'s value, kept _CACHE_S; an empty one (not placed yet, no agent) is kept `empty_s`
    only (0: looked up again at the next call)."""
    now = time.monotonic()
    with _lock:
        hit = table.get(key)
    if hit is not None and now - hit[1] < (_CACHE_S if hit[0] else empty_s):
        return hit[0]
    value = lookup()
    if value or empty_s > 0:
        with _lock:
            table[key] = (value, now)
    return value


def _actor_node(handle):
    actor_hex = handle._actor_id.hex()

    def lookup():
        info = ray._private.state.actors(actor_id=actor_hex) or {}
        if info.get("State") != "ALIVE":
            return None  # not placed yet (or restarting)
        return (info.get("Address") or {}).get("NodeID") or None
    return _cached(_actor_nodes, actor_hex, lookup)


def _locality_node(args, kwargs, demand):
    """Where Ray sends a default-scheduled task: its LocalityAwareLeasePolicy asks for a lease at
    the node holding the most bytes of the task's ObjectRef arguments (the first node to reach that
    count, arguments in order, as Ray adds them up), from the submitter's own reference table, the
    one get_local_object_locations reads (no round trip). That node's raylet runs the task unless it
    is busy and spills it back to another node (then Ray moves the arguments there too: a wrong
    prediction, docs/agent.md). None where Ray's choice cannot be told here: an argument still being
    computed (its size and place are known only when it exists; one whose place is not known yet
    is not waited for), no argument in any node's store (the local raylet decides), locality off
    (RAY_locality_aware_leasing_enabled in this process's environment), a tie that hangs on the
    order of one object's copies (a hash set in Ray), or a node that cannot run the task at all
    (`demand` beyond its resources: its raylet would spill it back every time). Returns (node, the
    locations read), so that the prefetch does not look them up again."""
    if os.environ.get("RAY_locality_aware_leasing_enabled", "1").strip().lower() not in ("1", "true") \
            or not hasattr(ray.experimental, "get_local_object_locations"):
        return None, None
    refs = _refs_of(args, kwargs, distinct=False)  # (Ray counts a repeated argument each time)
    locations = ray.experimental.get_local_object_locations(refs)
    held, best, most, copies = {}, None, 0, False
    for ref in refs:
        where = locations.get(ref) or {}
        size = where.get("object_size")
        if size is None:
            return None, None  # not made yet: Ray decides when it is
        nodes = where.get("node_ids") or []
        copies = copies or len(nodes) > 1
        for node in nodes:
            held[node] = held.get(node, 0) + size
            if held[node] > most:
                best, most = node, held[node]
    if copies and sum(1 for n in held.values() if n == most) > 1:
        return None, None
    if best is not None and not _can_run(best, demand):
        return None, None
    return best, locations


def _demand(options):
    """The resources a task submitted with `options` asks for (Ray's defaults: 1 CPU), or None
    where that is not plain (an accelerator type: a resource named after it)."""
    if options.get("accelerator_type"):
        return None
    demand = dict(options.get("resources") or {})
    cpus = options.get("num_cpus")
    demand.update(CPU=1 if cpus is None else cpus, GPU=options.get("num_gpus") or 0,
                  memory=options.get("memory") or 0)
    return {k: v for k, v in demand.items() if v}


def _can_run(node_hex, demand):
    """Whether the node has, in all, the resources `demand` asks for (ray.nodes(), cached)."""
    if demand is None:
        return False

    def lookup():
        return {n["NodeID"]: n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")}
    totals = _cached(_node_resources, "all", lookup).get(node_hex)
    if totals is None:  # (a node that joined after the cache was filled: looked up again)
        with _lock:
            _node_resources.clear()
        totals = _cached(_node_resources, "all", lookup).get(node_hex) or {}
    return all(totals.get(name, 0) >= amount for name, amount in demand.items())


def _task_destination(options, args=None, kwargs=None):
    """(node, locations already read or None) of a task submitted with `options`."""
    strategy = options.get("scheduling_strategy")
    if strategy is None or strategy == "DEFAULT":
        if options.get("placement_group") not in (None, "default") or options.get("label_selector") \
                or options.get("fallback_strategy"):
            return None, None  # the old placement_group= option, or nodes chosen by label: not locality's choice
        if strategy is None and ray.util.get_current_placement_group() is not None:
            return None, None  # inside a placement group, which may capture the task
        if not _may_block():
            return None, None  # (a prediction it could not wait for would race Ray: bytes twice)
        return _locality_node(args, kwargs, _demand(options))
    return _task_node(options), None


def _task_node(options):
    strategy = options.get("scheduling_strategy")
    node_id = getattr(strategy, "node_id", None)
    if node_id is not None and hasattr(strategy, "soft"):
        return node_id  # NodeAffinitySchedulingStrategy (soft: where it will run unless that node is gone)
    pg = getattr(strategy, "placement_group", None)
    if pg is None:
        return None
    index = getattr(strategy, "placement_group_bundle_index", -1)

    def lookup():
        table = ray.util.placement_group_table(pg) or {}
        return {int(k): v for k, v in (table.get("bundles_to_node_id") or {}).items()}
    bundles = _cached(_pg_nodes, pg.id.hex(), lookup)
    if not bundles:
        return None  # not placed yet
    if index is not None and index >= 0:
        return bundles.get(index)
    nodes = set(bundles.values())
    return nodes.pop() if len(nodes) == 1 else None


def _node_agent(node_hex):
    def lookup():
        try:
            return _agents.actor_of(node_hex)
        except ValueError:
            return None
    # (A node without an agent is asked again after 5 s, not at every call bound for it.)
    return _cached(_node_agents, node_hex, lookup, empty_s=5.0)


def _refs_of(args, kwargs, distinct=True):
    """The top-level ObjectRef arguments, in order (positional, then keywords as given: Ray's
    order), each once unless `distinct` is False."""
    refs = [a for a in list(args or ()) + list((kwargs or {}).values()) if isinstance(a, ray.ObjectRef)]
    return list(dict.fromkeys(refs)) if distinct else refs


def _may_block():
    """False in an asyncio event loop (an async actor, a Serve router): a call submitted there must
    not wait for a claim."""
    import asyncio
    try:
        asyncio.get_running_loop()
        return False
    except RuntimeError:
        pass
    try:
        return not ray._private.worker.global_worker.core_worker.current_actor_is_asyncio()
    except Exception:  # noqa: BLE001 - not in an actor, or a Ray without it
        return True


def _prefetch_to(node_hex, refs, known=None):
    """Asks `node_hex` to pull `refs` (waiting for the seal of those that exist, bounded).
    known: their locations, read already (all of them exist)."""
    if node_hex is None:
        _pulls._count("args_no_destination", len(refs))
        return
    # Arguments that exist: the call waits (at most CLAIM_WAIT_S) until the destination's agent
    # has read them into its store (RAYFABRIC_ARGS_WAIT_FOR, above), so that Ray's own pull, which
    # starts when the call arrives, finds them there. Arguments still being computed: Ray's
    # (RAYFABRIC_ARGS_PENDING, above), or asked for without waiting (pulled when they exist).
    if known is not None:
        ready, pending = list(refs), []
    else:
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    if ready:
        # Only what is worth a pull (as rayfabric.get decides): not on the destination already,
        # not tiny; a call with nothing of the kind pays no round trip.
        core_worker = ray._private.worker.global_worker.core_worker
        # No wait for a location not known yet: such an argument (its size known) is asked for
        # anyway (the destination's agent finds where it is); not where the locations were read
        # for a prediction (an object in no store there is inlined, or one Ray does not count).
        locations = known if known is not None else _pulls._locations(core_worker, ready, wait=False)
        worth = [r for r in ready if node_hex not in (locations.get(r) or {}).get("node_ids", [node_hex])
                 and (locations.get(r) or {}).get("object_size", 0) >= _pulls.MIN_OBJECT_BYTES
                 and (known is None or locations[r].get("node_ids"))]
        if sum(locations[r]["object_size"] for r in worth) < _pulls.MIN_PULL_BYTES:
            worth = []
        _pulls._count("args_not_worth_a_pull", len(ready) - len(worth))
        ready = worth
    if not (ready and CLAIM_WAIT_S > 0 and _may_block()):
        pending, ready = pending + ready, []  # (not waited for: they would race Ray's pull)
    if pending and PENDING != "race":
        _pulls._count("args_pending_left_to_ray", len(pending))
        pending = []
    if not ready and not pending:
        return
    agent = _node_agent(node_hex)
    if agent is None:
        _pulls._count("args_no_agent", len(ready) + len(pending))
        return
    # (In a list, so that Ray hands the refs over as they are, not their values.)
    if ready:
        try:
            # Ray's own get (transparent mode's would try to pull the reply).
            answered = _pulls._ray_get(agent.prefetch.remote([ready], CLAIM_MODE, CLAIM_WAIT_S), timeout=CLAIM_WAIT_S + 1)
            # (A wait for the seal answers 0 when its reads were not all done within the wait.)
            _pulls._count("args_claim_waited" if answered else "args_claim_timeouts", len(ready))
        except Exception as e:  # noqa: BLE001 - a slow or dead NodeAgent: the call goes on
            _pulls._count("args_claim_timeouts", len(ready))
            log.debug("rayfabric: claim of %d arguments did not answer: %s", len(ready), e)
    if pending:
        agent.prefetch.remote([pending])
    _pulls._count("args_prefetch_asked", len(ready) + len(pending))


def _guarded(kind, find_destination, args, kwargs):
    if getattr(_paused, "on", False):
        return
    try:
        refs = _refs_of(args, kwargs)
        if not refs:  # (most calls have none: no lookup at all then)
            return
        if PENDING != "race" and not _may_block():
            # A call from an event loop cannot wait for a read, and one it did not wait for races
            # Ray's pull (bytes twice): Ray's, without a lookup (which could block the loop).
            _pulls._count("args_pending_left_to_ray", len(refs))
            return
        node, known = find_destination()
        _prefetch_to(node, refs, known)
    except Exception as e:  # noqa: BLE001 - never break a call
        _pulls._fallback(f"argument prefetch for {kind} failed: {type(e).__name__}: {e}")


def install():
    """Hooks actor method calls, actor creation and task submission in this process (idempotent)."""
    from ray.actor import ActorClass, ActorHandle
    from ray.remote_function import RemoteFunction
    with _lock:
        if _installed:
            return True
        actor_call = ActorHandle._actor_method_call
        actor_create = ActorClass._remote
        task_remote = RemoteFunction._remote

    def _actor_method_call(self, method_name, args=None, kwargs=None, *rest, **options):
        if method_name != "__ray_terminate__":
            _guarded("an actor call", lambda: (_actor_node(self), None), args, kwargs)
        return actor_call(self, method_name, args, kwargs, *rest, **options)

    def _remote(self, args=None, kwargs=None, **task_options):
        merged = dict(getattr(self, "_default_options", {}) or {})
        merged.update(task_options)
        _guarded("a task", lambda: _task_destination(merged, args, kwargs), args, kwargs)
        return task_remote(self, args, kwargs, **task_options)

    def _create(self, args=None, kwargs=None, **actor_options):
        # (ActorClass.remote and .options().remote pass the merged options here.) Only a pinned
        # actor's node is known at submission: the GCS places a default-scheduled one. With
        # get_if_exists, Ray looks the actor up and calls _remote again only to create it: asked
        # then, once.
        if not actor_options.get("get_if_exists"):
            _guarded("an actor's creation", lambda: (_task_node(actor_options), None), args, kwargs)
        return actor_create(self, args, kwargs, **actor_options)

    with _lock:
        if _installed:
            return True
        _installed.update(actor=actor_call, create=actor_create, task=task_remote,
                          wrappers=(_actor_method_call, _create, _remote))
        ActorHandle._actor_method_call = _actor_method_call
        ActorClass._remote = _create
        RemoteFunction._remote = _remote
    return True


def uninstall():
    from ray.actor import ActorClass, ActorHandle
    from ray.remote_function import RemoteFunction
    with _lock:
        if not _installed:
            return
        # Each put back only where it is still ours (not where someone patched it after us).
        mine = dict(zip(("actor", "create", "task"), _installed.pop("wrappers")))
        for owner, attr, key in ((ActorHandle, "_actor_method_call", "actor"), (ActorClass, "_remote", "create"),
                                 (RemoteFunction, "_remote", "task")):
            original = _installed.pop(key)
            if owner.__dict__.get(attr) is mine[key]:
                setattr(owner, attr, original)


def installed():
    return bool(_installed)
