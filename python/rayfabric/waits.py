"""ray.wait(..., fetch_local=True) over the fabric (part of transparent mode).

ray.wait with fetch_local=True (Ray's default) asks this node's raylet to pull every remote object
it waits for, by Ray's own transfer, and counts one ready only once it is here. Ray Data's
iterator prefetches its blocks that way (a background thread calls ray.wait(blocks, num_returns=1,
timeout=0, fetch_local=True)), so the blocks arrived by Ray's path before its ray.get asked for
them; Train's ingest and streaming_split consumers take the same path (issue 30: 3% of such a
job's bytes went by the fabric), and so does Ray's ActorPool.

With this hook installed, an object waited for that exists, sits in another node's plasma and is
big enough for a pull of its own (RAYFABRIC_MIN_PULL_BYTES where its size is known here) is pulled
by this node's agent in the background, one pull per object, at most _PULL_THREADS at once, and
Ray is not asked to fetch it while that pull runs: the wait counts it ready once the pull has
ended (Ray's own wait then finds it here). What the fabric did not bring (a failed pull: Ray
fetches it), what is small, inlined, here already, or not made yet (waited for without fetching
until it is), goes to Ray's wait as before, so the answer is Ray's: at most num_returns ready,
the order of each list the order given, timeout=0 returns at once. A ray.get of an object whose
pull runs joins that pull (the agent serves both from one read). A node without an agent,
fetch_local=False, a process not connected to Ray, and anything but a list of distinct
ObjectRefs go straight to Ray. Off: RAYFABRIC_WAITS=0 (or transparent.enable(waits=False))."""
import collections
import concurrent.futures
import queue
import threading
import time

import ray

from rayfabric import _pulls, api

_POLL_FIRST_S = 0.0005  # a wait that must block sleeps in steps from this ...
_POLL_MAX_S = 0.02      # ... doubling up to this, while the fabric's pulls run
_SETTLED_MAX = 100_000  # objects remembered as Ray's to fetch (oldest forgotten first)
_PULL_THREADS = 4       # objects pulled at once for waits (each one Pull of the local agent)
_AGENT_RECHECK_S = 5.0  # whether this node has an agent, read again (in the background) after this
# A result ready here before its owner (this process) knows where it was stored: looked at again
# (see _pulls._own_locations) for up to this long before it is left to Ray.
_LOCATION_HOLD_S = 2.0
# A pull still running after this (an agent that hangs, a huge object on a slow link) no longer
# keeps its object from Ray's wait: Ray's pull then finds the agent's replica and waits for its
# seal, or moves the object itself if the agent has not created it yet.
_PULL_GRACE_S = 10.0
_QUEUE_MAX = 256        # pulls waiting for a thread; past this, objects are Ray's to fetch
_RAY_STEP_MIN_S = 0.05  # a wait that asks Ray to fetch asks at most every this (each ask is a raylet request)
_WATCH_MAX = 10_000     # objects the watcher waits for at once (the rest: Ray's get fetches them)

_lock = threading.Lock()
_original_wait = None
_jobs = None   # queue of (Future, ref) for the pull threads
_pulling = {}  # object id (bytes) -> (Future of the background pull bringing it, when queued)
_settled = collections.OrderedDict()  # object id (bytes) -> None: its pull ended, or it is not the fabric's
_held = {}     # object id (bytes) -> when first seen made with its location unknown
_watch = None  # queue of refs a wait returned without (not made yet) for the watcher thread
_watched = set()  # object ids (bytes) the watcher waits to be made
_node = {}     # "worker": the worker id it was read for, "id": this process's node id (hex)
_agent = {"here": None, "at": 0.0, "refreshing": False}


def install():
    """Routes ray.wait(fetch_local=True) through the fabric in this process (idempotent)."""
    global _original_wait, _jobs, _watch
    if not hasattr(ray.experimental, "get_local_object_locations"):
        return  # a Ray before 2.10: its waits stay Ray's
    with _lock:
        if _original_wait is None:
            _original_wait = _pulls._ray_wait
            _jobs, _watch = queue.Queue(), queue.Queue()
            for i in range(_PULL_THREADS):
                # Daemon threads: a process that exits does not wait for a queued pull.
                threading.Thread(target=_pull_loop, args=(_jobs,), name=f"rayfabric-wait-{i}", daemon=True).start()
            threading.Thread(target=_watch_loop, args=(_watch, _original_wait), name="rayfabric-wait-watch",
                             daemon=True).start()
            ray.wait = _wait


def uninstall():
    global _original_wait, _jobs, _watch
    with _lock:
        if _original_wait is not None:
            ray.wait = _original_wait
            _original_wait = None
            while True:  # queued pulls are dropped, not run (their objects are Ray's)
                try:
                    job = _jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None:
                    job[0].set_result(None)
            for _ in range(_PULL_THREADS):
                _jobs.put(None)
            _watch.put(None)
            _jobs = _watch = None
            _watched.clear()
            _pulling.clear()
            _settled.clear()
            _held.clear()
            _node.clear()
            _agent.update(here=None, at=0.0, refreshing=False)


def installed():
    return _original_wait is not None


def _wait(ray_waitables, *, num_returns=1, timeout=None, fetch_local=True):
    original = _original_wait or _pulls._ray_wait
    if not (_original_wait is not None and fetch_local and _distinct_refs(ray_waitables)
            and 0 < num_returns <= len(ray_waitables) and (timeout is None or timeout >= 0)):
        return original(ray_waitables, num_returns=num_returns, timeout=timeout, fetch_local=fetch_local)
    refs = ray_waitables
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        # Ray Client's processes have no core worker: their waits are Ray's.
        if (not ray.is_initialized() or getattr(ray._private.worker.global_worker, "core_worker", None) is None
                or not _agent_here()):
            return original(refs, num_returns=num_returns, timeout=timeout, fetch_local=True)
        return _fabric_wait(original, refs, num_returns, deadline)
    except Exception as e:  # noqa: BLE001 - never break ray.wait: the rest is Ray's
        _pulls._fallback(f"ray.wait by the fabric failed: {type(e).__name__}: {e}", len(refs))
        return original(refs, num_returns=num_returns, timeout=_left(deadline), fetch_local=True)


def _fabric_wait(original, refs, num_returns, deadline):
    pause = _POLL_FIRST_S
    while True:
        unmade, held = _start_pulls(original, refs)
        now = time.monotonic()
        with _lock:
            pulling = {r: _pulling[r.binary()][0] for r in refs
                       if r.binary() in _pulling and now - _pulling[r.binary()][1] < _PULL_GRACE_S}
        if not pulling and not unmade and not held:
            # Everything is Ray's to fetch now (here, brought, small, or failed): Ray's own wait.
            return original(refs, num_returns=num_returns, timeout=_left(deadline), fetch_local=True)
        busy = set(unmade) | set(held) | set(pulling)
        rays = [r for r in refs if r not in busy]
        ready = set(original(rays, num_returns=len(rays), timeout=0, fetch_local=True)[0]) if rays else set()
        left = _left(deadline)
        if len(ready) >= num_returns or left == 0:
            # As Ray's wait goes on fetching what it returned without, the objects not made yet
            # are pulled once they are (Ray Data's prefetch: timeout=0, then a get later).
            _watch_for(unmade + held)
            ready_list = [r for r in refs if r in ready][:num_returns]
            chosen = set(ready_list)
            return ready_list, [r for r in refs if r not in chosen]
        step = pause if left is None else min(pause, left)
        pause = min(2 * pause, _POLL_MAX_S)
        waiting_rays = [r for r in rays if r not in ready]
        if waiting_rays:
            # Ray fetches these only while asked to: the step is spent in its wait.
            original(waiting_rays, num_returns=1, timeout=max(step, min(_RAY_STEP_MIN_S, left or _RAY_STEP_MIN_S)),
                     fetch_local=True)
        elif pulling:
            concurrent.futures.wait(list(pulling.values()), timeout=step,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        elif unmade:
            # Nothing else to watch: block until one is made (or the deadline).
            original(unmade, num_returns=1, timeout=left if not held else step, fetch_local=False)
        else:
            time.sleep(step)


def _start_pulls(original, refs):
    """Starts the background pulls of the refs not yet seen that are made and may be the fabric's;
    settles the ones that are plainly Ray's. Returns (refs not made yet, refs made whose location
    this process, their owner, does not know yet)."""
    with _lock:
        unseen = [r for r in refs if r.binary() not in _settled and r.binary() not in _pulling]
    if not unseen:
        return [], []
    # What this process owns is known without a round trip: here already, or too small.
    known = ray.experimental.get_local_object_locations(unseen)
    here = _node["id"]
    core_worker = ray._private.worker.global_worker.core_worker
    rays, rest = [], []
    for r in unseen:
        loc = known.get(r) or {}
        size = loc.get("object_size")
        if here in (loc.get("node_ids") or []) or (size is not None and size < _pulls.MIN_PULL_BYTES):
            rays.append(r)
        else:
            rest.append(r)
    if not rest:
        _settle(rays)
        return [], []
    made, unmade = original(rest, num_returns=len(rest), timeout=0, fetch_local=False)
    pulls, held, now = [], [], time.monotonic()
    if len(_held) > _SETTLED_MAX:  # results whose location never came, waits that raised
        with _lock:
            for i in [i for i, t in _held.items() if now - t > 2 * _LOCATION_HOLD_S]:
                _held.pop(i, None)
    for r in made:
        if core_worker.object_exists(r):
            # Here already: a value in this process (a small result inlined in its owner, made
            # after `known` was read) or an object in this node's plasma. Ray's.
            rays.append(r)
            continue
        loc = known.get(r)
        if loc is not None and not loc.get("node_ids") and not loc.get("did_spill"):
            # Owned, made, stored nowhere it knows of yet: its location is on its way.
            first = _held.setdefault(r.binary(), now)
            if now - first < _LOCATION_HOLD_S:
                held.append(r)
                continue
        pulls.append(r)
    _settle(rays)
    overflow = []
    with _lock:
        for r in pulls:
            i = r.binary()
            _held.pop(i, None)
            if i in _pulling or i in _settled or _jobs is None:
                continue
            if _jobs.qsize() >= _QUEUE_MAX:
                overflow.append(r)
                continue
            future = concurrent.futures.Future()
            _pulling[i] = (future, now)
            _jobs.put((future, r))
    _settle(overflow)
    return unmade, held


def _watch_for(refs):
    with _lock:
        new = [r for r in refs if r.binary() not in _watched][:max(0, _WATCH_MAX - len(_watched))]
        if not new or _watch is None:
            return
        _watched.update(r.binary() for r in new)
        _watch.put(new)


def _watch_loop(watch, original):
    """Waits (without fetching) for the refs waits returned without until they are made, then
    starts their pulls as a wait would; each is watched for up to RAYFABRIC_PULL_TIMEOUT_S."""
    pending = {}  # object id -> (ref, watched until)
    while True:
        try:
            while True:
                refs = watch.get(timeout=0.1) if pending else watch.get()
                if refs is None:
                    return
                until = time.monotonic() + _pulls.PULL_TIMEOUT_S
                pending.update((r.binary(), (r, until)) for r in refs)
                if watch.empty():
                    break
        except queue.Empty:
            pass
        if not ray.is_initialized():  # shut down meanwhile: nothing to pull
            with _lock:
                _watched.difference_update(pending)
            pending.clear()
            continue
        try:
            refs = [r for r, _ in pending.values()]
            made, _ = original(refs, num_returns=len(refs), timeout=0.1, fetch_local=False)
            unmade, held = _start_pulls(original, made) if made else ([], [])
            now, keep, made_ids = time.monotonic(), {r.binary() for r in unmade + held}, {r.binary() for r in made}
            for r in refs:
                i = r.binary()
                if (i in made_ids and i not in keep) or now > pending[i][1]:
                    pending.pop(i)
                    with _lock:
                        _watched.discard(i)
        except Exception as e:  # noqa: BLE001 - what is not pulled is Ray's (its get fetches it)
            _pulls._fallback(f"ray.wait's watcher failed: {type(e).__name__}: {e}", len(pending))
            with _lock:
                _watched.difference_update(pending)
                for i in pending:
                    _held.pop(i, None)
            pending.clear()


def _pull_loop(jobs):
    while True:
        job = jobs.get()
        if job is None:
            return
        future, ref = job
        try:
            _pulls._count("waits_by_fabric")
            api.prefetch([ref])
        except Exception as e:  # noqa: BLE001 - Ray's wait fetches what did not come
            _pulls._fallback(f"ray.wait's fabric pull failed: {type(e).__name__}: {e}")
        finally:
            _settle([ref])
            future.set_result(None)


def _settle(refs):
    with _lock:
        for r in refs:
            i = r.binary()
            _pulling.pop(i, None)
            _held.pop(i, None)
            _settled[i] = None
            _settled.move_to_end(i)
        while len(_settled) > _SETTLED_MAX:
            _settled.popitem(last=False)


def _distinct_refs(refs):
    if not isinstance(refs, list) or not refs:
        return False
    if not all(isinstance(r, ray.ObjectRef) for r in refs):
        return False
    return len({r.binary() for r in refs}) == len(refs)


def _agent_here():
    """Whether this node has an agent. Read once on the caller's thread, then again every
    _AGENT_RECHECK_S in the background, so that a wait never waits for the KV."""
    worker = ray._private.worker.global_worker.worker_id
    if _node.get("worker") != worker:
        _node.update(worker=worker, id=ray.get_runtime_context().get_node_id())
        _agent.update(here=None, at=0.0)
    if _agent["here"] is None:
        _read_agent()
    elif time.monotonic() - _agent["at"] > _AGENT_RECHECK_S and not _agent["refreshing"]:
        _agent["refreshing"] = True
        threading.Thread(target=_read_agent, name="rayfabric-wait-agent", daemon=True).start()
    return bool(_agent["here"])


def _read_agent():
    try:
        here = _node["id"] in _pulls._agent_records()
    except Exception:  # noqa: BLE001 - the KV unreadable: Ray's path until it is read again
        here = False
    _agent.update(here=here, at=time.monotonic(), refreshing=False)


def _left(deadline):
    return None if deadline is None else max(0.0, deadline - time.monotonic())
