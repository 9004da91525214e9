"""Remote plasma objects moved into this node's store by the fabric: the machinery under
rayfabric.get and rayfabric.prefetch (and transparent mode's ray.get, ray.wait and call
arguments). Which holder to read from, the Pull asked of this node's agent, what went to Ray's
path and why (this process's counters, the fallback reports to the agent). Knows the agents only by
their records in Ray's KV (rayfabric._records); starting them is rayfabric._agents'."""
import atexit
import hashlib
import logging
import os
import threading
import time

import ray

from rayfabric import _records
from rayfabric import agent_pb2 as pb
from rayfabric import metrics
from rayfabric import settings
from rayfabric._client import AgentClient, PullSocketClient, PullSocketUnavailable, error_name

log = logging.getLogger("rayfabric")

# ray.get as it was at import: transparent mode replaces ray.get, and rayfabric.get must not
# call itself through it.
# Ray's own (under the start-up hook's look-again wrappers, if a process has them: _rayfabric_autoload).
_ray_get = getattr(ray.get, "_rayfabric_original", ray.get)
_ray_wait = getattr(ray.wait, "_rayfabric_original", ray.wait)  # as _ray_get: transparent mode replaces ray.wait (rayfabric.waits)

# Objects smaller than this go through Ray's own path (a pull's fixed cost is not worth it) ...
MIN_OBJECT_BYTES = settings.get("min_object_bytes")
# ... and so does a whole get whose remote objects add up to less than this: one Pull costs a few
# round trips between processes, which Ray's own pull of one small object does not pay
# (docs/benchmarks.md: crossover near 1 MiB on loopback TCP); many small objects in one get
# share one Pull and gain.
MIN_PULL_BYTES = settings.get("min_pull_bytes")
PULL_TIMEOUT_S = settings.get("pull_timeout_s")
# How long an owner waits for the location of its own task's result that is in plasma but not yet
# in its record (the raylet that stored it says where a moment after the task's reply: 0.15-3.8 ms
# measured, in ~2% of gets). Reading the own record costs no round trip.
OWN_LOCATION_WAIT_S = 0.05


def _max_inlined_bytes():
    """Ray keeps objects up to this size in their owner's memory instead of a store (its own
    max_direct_call_object_size: 100 KiB unless RAY_max_direct_call_object_size says otherwise; a
    cluster that raised it through ray.init(_system_config=...) alone is not seen here, and its
    objects between the two sizes count as NO_LOCATION)."""
    try:
        return int(os.environ.get("RAY_max_direct_call_object_size", 100 * 1024))
    except ValueError:
        return 100 * 1024


# A larger object in no store by its owner's directory is a skip an operator sees by reason.
_MAX_INLINED_BYTES = _max_inlined_bytes()
NO_LOCATION = ("no location known yet: the owner's directory lists no store holding the object (a "
               "get a moment after it was made, before its store told the owner; or after a link cut "
               "or a node's loss)")


# Whether the locations of objects this process owns are read from its own reference counter.
OWN_LOCATIONS = settings.get("own_locations")
# Whether pulls are asked of this node's agent over its pull socket (else gRPC's local socket).
PULL_SOCKET = settings.get("pull_socket")

_lock = threading.Lock()
_clients = {}
_agents_cache = {"at": 0.0, "records": {}}
_pull_socket_failed = set()  # pull sockets that could not be connected (said once each)
_stats = {"objects_pulled": 0, "bytes_pulled": 0, "already_local": 0, "stood_aside": 0,
          "pulls_by_source": {},  # holder node id (hex) -> pulls asked of it (at most 256 nodes)
          "ray_path_small": 0, "ray_path_not_in_plasma": 0, "ray_path_spilled": 0, "fallbacks": 0,
          "fallback_reasons": {}, "already_here": 0, "claimed": 0,
          "waits_by_fabric": 0,  # objects a ray.wait(fetch_local=True) had pulled by the fabric (waits.py)
          # objects whose locations this process read from its own reference counter (it owns
          # them): no round trip to an owner; those of them whose location it waited for
          "locations_owned": 0, "locations_awaited": 0,
          # Pull calls to this node's agent: over its pull socket, or over gRPC (no pull socket
          # in its record, RAYFABRIC_PULL_SOCKET=0, or the socket could not be connected)
          "pull_calls_socket": 0, "pull_calls_grpc": 0,
          # call arguments (rayfabric.args): asked of the destination's node, or not (why)
          "args_prefetch_asked": 0, "args_no_destination": 0, "args_no_agent": 0,
          "args_pending_left_to_ray": 0, "args_claim_waited": 0, "args_claim_timeouts": 0, "args_not_worth_a_pull": 0,
          # fallback reports to this node's agent (`rayfabric status`): sent, or not (no agent here,
          # or it did not answer); the counts above stay what they are either way
          "fallback_reports_sent": 0, "fallback_reports_failed": 0}


def refresh_agents():
    """The agents' records are read again at the next pull (some were just started)."""
    _agents_cache["at"] = 0.0


def forget_agents():
    """Closes every client and forgets the agents' records (rayfabric.shutdown: they are gone)."""
    with _lock:
        for c in _clients.values():
            c.close()
        _clients.clear()
    _agents_cache["at"] = 0.0


def _agent_records(refresh=False):
    now = time.monotonic()
    if refresh or now - _agents_cache["at"] > 5.0:
        _agents_cache["records"] = _records.published()
        _agents_cache["unavailable"] = _records.unavailable()
        _agents_cache["at"] = now
    return _agents_cache["records"]


def _providers(record):
    """The providers an agent speaks, best first (an older agent's record names one)."""
    return [f["provider"] for f in record.get("fabrics") or []] or [record.get("provider")]


def _spread_weight(reader, object_id, holder):
    """Rendezvous (highest random weight) hashing: each reader of an object ranks its holders by
    a hash of (reader, object, holder), so readers spread over the holders instead of all taking
    the first one Ray lists, and one reader keeps its choice for one object."""
    h = hashlib.blake2b(digest_size=8)
    for part in (reader, object_id, holder):
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"\0")
    return int.from_bytes(h.digest(), "big")


def _pick_source(local, nodes, agents, object_id=b"", reader=""):
    """(source agent address, None) of the holder that shares the best of this node's providers
    with it (among several such holders, the one this reader's rendezvous hash for the object
    ranks first: load spreads across replicas), or (None, why) when none can be read by the
    fabric."""
    mine = _providers(local)
    best = None
    for n in nodes:
        if n not in agents:
            continue
        theirs = set(_providers(agents[n]))
        rank = next((i for i, p in enumerate(mine) if p in theirs), None)
        if rank is None:
            continue
        key = (rank, -_spread_weight(reader, object_id, n))
        if best is None or key < best[0]:
            best = (key, agents[n]["address"], n)
    if best is not None:
        with _lock:
            by_source = _stats["pulls_by_source"]
            if best[2] in by_source or len(by_source) < 256:
                by_source[best[2]] = by_source.get(best[2], 0) + 1
        return best[1], None
    failed = _agents_cache.get("unavailable") or {}
    with_agent = [n for n in nodes if n in agents]
    if with_agent:
        return None, ("no fabric shared with the node(s) holding the object: this node speaks " + ", ".join(mine)
                      + "; " + "; ".join(f"{n[:12]} speaks {', '.join(_providers(agents[n]))}"
                                         for n in with_agent))
    why = [f"{n[:12]}: {failed[n][:200]}" for n in nodes if n in failed]
    if why:
        return None, "no rayfabric agent on the node(s) holding the object (" + "; ".join(why) + ")"
    return None, "no rayfabric agent on the node(s) holding the object"


def _client(address):
    with _lock:
        c = _clients.get(address)
        if c is None:
            c = _clients[address] = AgentClient(address)
        return c


def _pull_socket_client(path):
    with _lock:
        c = _clients.get("pull:" + path)
        if c is None:
            c = _clients["pull:" + path] = PullSocketClient(path)
        return c


def _ask_local_agent(local, items, timeout_s, **kwargs):
    """The Pull call to this node's agent: its pull socket when it has one (and it is not turned
    off), else gRPC on its local socket; a pull socket that cannot be used (no connection, the
    agent's bound on connections) is said once and the call goes to gRPC. One served by another
    user raises (PullSocketImpostor): nothing goes to that directory's gRPC socket either."""
    path = local.get("pull_socket") if PULL_SOCKET else None
    if path:
        try:
            reply = _pull_socket_client(path).pull(items, timeout_s, **kwargs)
            _count("pull_calls_socket")
            return reply
        except PullSocketUnavailable as e:
            with _lock:
                first = path not in _pull_socket_failed
                _pull_socket_failed.add(path)
            if first:
                log.warning("rayfabric: %s; pulling over gRPC's local socket instead", e)
    reply = _client("unix:" + local["local_socket"]).pull(items, timeout_s, **kwargs)
    _count("pull_calls_grpc")
    return reply


def _fallback(reason, count=1):
    """Counts a fallback to Ray's path; logs each distinct reason once; tells this node's agent."""
    with _lock:
        _stats["fallbacks"] += count
        first = reason not in _stats["fallback_reasons"]
        _stats["fallback_reasons"][reason] = _stats["fallback_reasons"].get(reason, 0) + count
    metrics.count_fallback(reason, count)
    _reporter.add(metrics.reason_class(reason), count)
    if first:
        log.warning("rayfabric: falling back to Ray's object transfer: %s", reason)


def _local_agent_address():
    """unix:<socket> of this node's agent (the only place it takes reports), or None."""
    here = ray.get_runtime_context().get_node_id()
    record = _agent_records().get(here)
    if record is None or not record.get("local_socket"):
        return None
    return "unix:" + record["local_socket"]


class _FallbackReporter:
    """Tells this node's agent what this process left to Ray's path (ReportFallbacks on its local
    socket), so that `rayfabric status` shows it per node. Off every get's path: _fallback only
    adds to a pending table (at most MAX_PENDING reasons; it merges while a report is on its way),
    a daemon thread sends it, one report at a time, each bounded by TIMEOUT_S; a failed report
    (no agent here, an agent that does not answer, an older one without the RPC) is dropped and
    counted in stats()["fallback_reports_failed"]. At exit what is pending is sent, bounded alike."""
    MAX_PENDING = 64
    OTHER = "(other reasons)"
    TIMEOUT_S = settings.get("fallback_report_timeout_s")

    def __init__(self, address_fn=_local_agent_address):
        self.address = None  # set by the get that found this node's agent; else asked address_fn
        self._address_fn = address_fn
        self._cv = threading.Condition()
        self._pending = {}
        self._sending = False
        self._thread = None

    def add(self, reason, count):
        if count <= 0:
            return
        with self._cv:
            if reason not in self._pending and len(self._pending) >= self.MAX_PENDING:
                reason = self.OTHER
            self._pending[reason] = self._pending.get(reason, 0) + count
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="rayfabric-fallback-report", daemon=True)
                self._thread.start()
                atexit.register(self.flush)
            self._cv.notify()

    def _take(self):
        with self._cv:
            batch, self._pending = self._pending, {}
        return batch

    def idle(self):
        """Nothing pending and no report on its way."""
        with self._cv:
            return not self._pending and not self._sending

    def _loop(self):
        while True:
            with self._cv:
                while not self._pending:
                    self._cv.wait()
                batch, self._pending = self._pending, {}
                self._sending = True
            try:
                self._send(batch)
            finally:
                with self._cv:
                    self._sending = False

    def flush(self):
        """Sends what is pending now (on the caller's thread, at exit: to the agent already known,
        without asking Ray where it is), bounded by TIMEOUT_S."""
        batch = self._take()
        if batch:
            self._send(batch, lookup=False)

    def _send(self, batch, lookup=True):
        try:
            address = self.address or (self._address_fn() if lookup else None)
            if address is None:
                raise RuntimeError("no rayfabric agent on this node")
            _client(address).report_fallbacks(sorted(batch.items()), timeout=self.TIMEOUT_S)
            _count("fallback_reports_sent")
        except Exception as e:  # noqa: BLE001 - a report never fails anything; counted, logged once
            self.address = None  # looked up again next time (the agent may have moved)
            with _lock:
                _stats["fallback_reports_failed"] += 1
                first = _stats["fallback_reports_failed"] == 1
            if first:
                log.info("rayfabric: fallbacks not reported to this node's agent: %s", str(e)[:200])


_reporter = _FallbackReporter()


def _count(key, n=1):
    with _lock:
        _stats[key] += n


def _owner(core_worker, ref):
    # Ray's rpc.Address and our OwnerAddress share fields 1-4 (node id, IP, port, worker id);
    # parsing the bytes with ours works on every supported Ray (2.49 renamed raylet_id -> node_id).
    owner = pb.OwnerAddress.FromString(core_worker.get_owner_address(ref))
    return pb.OwnerAddress(node_id=owner.node_id, ip_address=owner.ip_address, port=owner.port,
                           worker_id=owner.worker_id)


def _locations(core_worker, refs, get_locations=None, wait=True):
    """Ray's object directory for `refs`: {ref: {"node_ids", "object_size", "did_spill"}}.
    What this process owns is read from its own reference counter, without a round trip (Ray's
    get_local_object_locations: the same record its owner RPC answers from). The rest:
    ray.experimental.get_object_locations, one call per owner and at most 5,000 refs a call.
    Ray 2.60's GetLocationFromOwner can abort the calling worker ("std::future_error: Promise
    already satisfied") when one call spans several owners or 10,000-object batches: its count of
    outstanding replies reaches zero before the last request is sent (docs/benchmarks-history.md).
    get_locations: replaces the owner RPC (the bench times it), and is then used for every ref.
    wait: an owned object whose location is not known yet may be waited for (_own_locations)."""
    groups = {}
    for ref in refs:
        groups.setdefault(core_worker.get_owner_address(ref), []).append(ref)
    out = {}
    me = _worker_id() if get_locations is None else None
    for owner, group in groups.items():
        if me is not None and pb.OwnerAddress.FromString(owner).worker_id == me:
            out.update(_own_locations(core_worker, group, wait))
            _count("locations_owned", len(group))
            continue
        for i in range(0, len(group), 5000):
            out.update((get_locations or ray.experimental.get_object_locations)(group[i:i + 5000]))
    return out


def _own_locations(core_worker, refs, wait=True):
    """Where the objects this process owns are, from its own reference counter. A task's result is
    ready (its reply arrived, so its size is known) a moment before the raylet that stored it tells
    the owner where, and before this process's memory store holds anything of it (0.15-3.8 ms,
    ~2% of gets measured). Such refs, big enough for a pull and together worth one, are read again
    (no round trip) for up to OWN_LOCATION_WAIT_S; past that they are left as they are (Ray's
    path). Not waited for: small ones, values inlined here, copies on this node, spilled ones."""
    out = ray.experimental.get_local_object_locations(refs)
    if not wait:
        return out
    pending = [r for r in refs if r in out and (out[r].get("object_size") or 0) >= MIN_OBJECT_BYTES
               and not out[r].get("node_ids") and not out[r].get("did_spill")]
    # Nothing of it in this process's memory store (neither a value nor a copy in plasma here).
    pending = [r for r in pending if not core_worker.object_exists(r)]
    if not pending:
        return out
    here = ray.get_runtime_context().get_node_id()
    remote = sum(out[r]["object_size"] or 0 for r in refs
                 if r in out and out[r].get("node_ids") and here not in out[r]["node_ids"])
    if remote + sum(out[r]["object_size"] for r in pending) < MIN_PULL_BYTES:
        return out
    _count("locations_awaited", len(pending))
    deadline = time.monotonic() + OWN_LOCATION_WAIT_S
    pause = 0.0002
    while pending and time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(2 * pause, 0.002)
        got = ray.experimental.get_local_object_locations(pending)
        out.update(got)
        pending = [r for r in pending if not (got.get(r) or {}).get("node_ids")]
    return out


def _worker_id():
    """This process's worker id (bytes), where its own locations are to be read (else None)."""
    if not OWN_LOCATIONS or not hasattr(ray.experimental, "get_local_object_locations"):
        return None
    return ray._private.worker.global_worker.worker_id


def _pull(refs, timeout, claim=False, answer_within_s=None, source_node=None):
    """Pulls by the fabric what is in another node's plasma; returns nothing, counts everything.
    Never raises for a transfer problem: whatever did not arrive is left to Ray's path. claim:
    return once the agent has claimed the objects (created their replicas); the reads go on.
    source_node: read from that node's agent if it shares a provider with this node (broadcast
    assigns sources), whether or not Ray lists it as a holder yet."""
    if not refs:
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    # Wait until every object exists somewhere, without moving it (fetch_local=False).
    ready, _ = _ray_wait(refs, num_returns=len(refs), timeout=timeout, fetch_local=False)
    if not ready:
        return
    agents = _agent_records()
    here = ray.get_runtime_context().get_node_id()
    local = agents.get(here) or _agent_records(refresh=True).get(here)
    if local is not None and not local.get("local_socket"):
        _fallback(f"the agent on this node ({here[:12]}) publishes no local socket (an older rayfabricd?): "
                  "restart it with `rayfabric stop && rayfabric start`", len(ready))
        return
    if local is None:
        why = (_agents_cache.get("unavailable") or {}).get(here)
        _fallback(f"no rayfabric agent on this node ({here[:12]})"
                  + (f": it could not start: {why[:300]}" if why else ": rayfabric.init() or `rayfabric start`"),
                  len(ready))
        return
    core_worker = ray._private.worker.global_worker.core_worker
    locations = _locations(core_worker, ready)
    candidates = []  # (ref, holder node ids, size from Ray's directory) worth a pull
    spilled = set()  # Ray keeps listing the node of a spilled object after evicting it from plasma
    total = 0
    for ref in ready:
        loc = locations.get(ref) or {}
        nodes = loc.get("node_ids") or []
        size = loc.get("object_size") or 0
        if here in nodes:
            _count("already_here")  # nothing to move (for call arguments: Ray's pull was done first)
            continue
        if not nodes:
            if size > _MAX_INLINED_BYTES and not loc.get("did_spill"):
                # Too big to be inlined, in no store by the owner's directory: lost with its node
                # (Ray rebuilds it from lineage or raises), or not yet heard of by its owner (right
                # after a link cut): Ray's path moves it, and an operator sees it by reason.
                _fallback(NO_LOCATION)
            else:
                _count("ray_path_not_in_plasma")  # inlined in the owner, or spilled to disk
            continue
        if size < MIN_OBJECT_BYTES:
            _count("ray_path_small")
            continue
        candidates.append((ref, nodes, size))
        if loc.get("did_spill"):
            spilled.add(ref.binary())
        total += size
    if candidates and total < MIN_PULL_BYTES:
        _count("ray_path_small", len(candidates))
        return
    # A source agent that does not answer may have been restarted at a new address: read the KV
    # again and retry those objects once, before leaving them to Ray's path.
    for attempt in range(2):
        items = []
        for ref, nodes, size in candidates:
            source, why = None, None
            if source_node is not None and attempt == 0 and source_node in agents:
                source, why = _pick_source(local, [source_node], agents, ref.binary(), here)
            if source is None:
                source, why = _pick_source(local, nodes, agents, ref.binary(), here)
            if source is None:
                _fallback(why)
                continue
            items.append(pb.PullItem(object_id=ref.binary(), owner=_owner(core_worker, ref), source_agent=source,
                                     object_size=size))
        if not items:
            return
        left = PULL_TIMEOUT_S if deadline is None else max(0.1, min(PULL_TIMEOUT_S, deadline - time.monotonic()))
        # This node's agent serves Pull on its local socket only.
        local_address = "unix:" + local["local_socket"]
        _reporter.address = local_address
        try:
            reply = _ask_local_agent(local, items, left, answer_when_claimed=claim, answer_within_s=answer_within_s)
        except Exception as e:  # noqa: BLE001 - agent dead/unreachable: Ray's path
            code = e.code().name if hasattr(e, "code") else type(e).__name__
            _fallback(f"local agent did not answer ({code}): {local_address}", len(items))
            _agents_cache["at"] = 0.0
            return
        unreachable = {}
        for item, r in zip(items, reply.results):
            if r.outcome == pb.PULLED:
                with _lock:
                    _stats["objects_pulled"] += 1
                    _stats["bytes_pulled"] += r.bytes
            elif r.outcome == pb.CLAIMED:
                _count("claimed")  # its read goes on at the agent (the agent counts the bytes)
            elif r.outcome == pb.ALREADY_LOCAL:
                _count("already_local")
            elif r.outcome == pb.STOOD_ASIDE:
                _count("stood_aside")
            elif r.error_code == pb.ERROR_CODE_NOT_FOUND and item.object_id in spilled:
                _count("ray_path_spilled")  # evicted after spilling: Ray restores it from disk
            elif r.error_code == pb.ERROR_CODE_UNAVAILABLE and attempt == 0:
                unreachable[item.object_id] = (item.source_agent, r)
            else:
                if r.error_code == pb.ERROR_CODE_UNAVAILABLE:
                    _agents_cache["at"] = 0.0  # an agent moved or died: read the KV again next time
                _fallback(f"pull failed: {error_name(r.error_code)}: {r.error[:200]}")
        if not unreachable:
            return
        agents = _agent_records(refresh=True)
        retry = []
        for ref, nodes, size in candidates:
            if ref.binary() not in unreachable:
                continue
            old_source, r = unreachable[ref.binary()]
            if any(agents[n]["address"] != old_source for n in nodes if n in agents):
                retry.append((ref, nodes, size))
            else:
                _fallback(f"pull failed: {error_name(r.error_code)}: {r.error[:200]}")
        candidates = retry
        if not candidates:
            return


def prefetch(refs, timeout=None, claim=False, answer_within_s=None):
    """Moves remote plasma objects into this node's store by the fabric; does not ray.get them.
    claim=True: returns once this node's agent has claimed them (created their replicas); the
    reads go on (Ray's own pull does not wait for an unsealed replica: it moves such an object
    too, so rayfabric.args waits for the seal by default)."""
    single = isinstance(refs, ray.ObjectRef)
    _pull([refs] if single else list(refs), timeout, claim, answer_within_s)


def get(refs, timeout=None):
    """ray.get, with the bytes of remote plasma objects moved by the fabric first."""
    single = isinstance(refs, ray.ObjectRef)
    lst = [refs] if single else list(refs)
    start = time.monotonic()
    pulled_before = _stats["objects_pulled"]
    try:
        _pull(lst, timeout)
    except Exception as e:  # noqa: BLE001 - a bug or an unexpected Ray answer: still Ray's path
        _fallback(f"unexpected error before the pull: {type(e).__name__}: {e}", len(lst))
    left = None if timeout is None else max(0.0, timeout - (time.monotonic() - start))
    out = _ray_get(refs, timeout=left)
    # (With concurrent gets in one process a get may be counted as fabric for another's pull.)
    metrics.observe_get(time.monotonic() - start, _stats["objects_pulled"] > pulled_before)
    return out


def stats():
    """This process's counters (pulled objects and bytes, fallbacks by reason)."""
    with _lock:
        out = dict(_stats)
        out["fallback_reasons"] = dict(_stats["fallback_reasons"])
        out["pulls_by_source"] = dict(_stats["pulls_by_source"])
        return out
