"""rayfabric bench objects: Ray's own cross-node object transfer and rayfabric's, side by side, on
the same kinds of objects, in the same run, next to the raw fabric ceiling measured in that run.
`rayfabric bench` with no variant runs it.

    rayfabric bench [objects] [--quick] [--json FILE] [--plots DIR] [--address ADDR] [--provider NAME]
                              [--all-providers] [--sizes 64K,1M,16M,256M,1G]
                              [--cases single,owned,many,fanout,fanin]

Cases (every one: fresh objects for each path and each repetition, so neither path finds a copy
left by the other; one untimed repetition per path first, then the paths alternate rep by rep):
  single   one object from a producer actor on node S to a consumer actor on node D; numpy arrays
           and raw bytes; the consumer times only the get (ray.get, or rayfabric.get) of a ref it
           received inside a list (so Ray does not resolve it as an argument); the producer owns
           it (ray.put), the consumer borrows it
  owned    as single, but the object is the result of the consumer's own call to the producer (made
           on S, owned by the consumer): what a driver's ray.get of its own tasks' results is;
           rayfabric reads its locations from the consumer's own record (no owner RPC). Sizes above
           100 KiB only (smaller results are inlined in the reply); measured next to single, size by
           size, in turns (the one listed first in --cases goes first at the first size)
  many     N objects of one size fetched by one consumer with one get of the list
  fanout   one object on S read at once by K consumers on the other nodes
  fanin    one consumer reading objects that live on two different nodes (one get of both)
Per case and size: throughput (payload bytes / get time), end-to-end throughput (driver: submit
the consumer call -> its answer), p50/p99 get latency over the repetitions, CPU seconds per GB on
the source and destination nodes (user+sys of the node's raylet + its rayfabricd + the consumer
workers there), whether the bytes that arrived hash the same as the bytes put (sha256 on both ends,
first repetition of each size), and how many objects rayfabric really moved by the fabric.
The raw ceiling: build/bench/rayfabric-bench (fi_read between two processes, same provider) at
the same object sizes, with its raw TCP-stream and memcpy ceilings, run before the cluster starts.

Default cluster: an embedded ray.cluster_utils.Cluster of 3 nodes on this host (custom resources
place producers and consumers). --address: an existing cluster (e.g. `ray start`), work placed by
NodeAffinitySchedulingStrategy on distinct alive nodes; agents started with rayfabric.init() (and
stopped at the end only if this run started them). The package directory must be at the same path
on every host (workers get it through runtime_env PYTHONPATH)."""
import argparse
import contextlib
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import rayfabric
from rayfabric import _agents, _pulls, bin_dir
from rayfabric.tools import hugepages

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
DEFAULT_PROVIDER = "tcp;ofi_rxm"
ALL_PROVIDERS = ["tcp;ofi_rxm", "sockets", "shm"]
CASES = ["single", "owned", "many", "fanout", "fanin"]
# Ray's max_direct_call_object_size (default): a task's result up to this size travels inside the
# reply to its owner, never through a store (so the owned case starts above it).
RAY_INLINE_BYTES = 100 * KiB


# ------------------------------------------------------------------------------------ helpers

def parse_size(text):
    t = text.strip().upper().rstrip("B").rstrip("I")
    mult = {"K": KiB, "M": MiB, "G": GiB}.get(t[-1:], 1)
    return int(float(t[:-1] if t[-1:] in "KMG" else t) * mult)


def size_name(n):
    for unit, div in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def parse_many(spec):
    """'1000x1M,10000x64K' -> [(1000, 1 MiB), (10000, 64 KiB)]."""
    out = []
    for item in spec.split(","):
        if item.strip():
            count, size = item.lower().split("x")
            out.append((int(count), parse_size(size)))
    return out


def percentile(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p * len(v)))] if v else 0.0


_BASE = None


def make_value(kind, size, seed):
    """size bytes, different for every seed and position-dependent: a random block repeated, with
    (seed, page index) stamped into the first 8 bytes of every 4 KiB page (cheap to make)."""
    global _BASE
    if _BASE is None:
        _BASE = np.random.default_rng(20261202).integers(0, 256, size=MiB + 4 * KiB, dtype=np.uint8)
    off = seed % 4096
    arr = np.resize(_BASE[off:off + min(size, MiB)], size)
    words = (size // 8) * 8
    if words:
        stamps = arr[:words].view(np.uint64)[::512]
        stamps[:] = (np.uint64(seed & 0xFFFFFFFF) << np.uint64(32)) + np.arange(len(stamps), dtype=np.uint64)
    return arr.tobytes() if kind == "bytes" else arr


def digest(value):
    if isinstance(value, np.ndarray):
        return hashlib.sha256(np.ascontiguousarray(value).data).hexdigest()
    return hashlib.sha256(value).hexdigest()


def _cpu_seconds(pid):
    try:
        import psutil  # vendored by Ray (ray/thirdparty_files), importable after `import ray`
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 - gone
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


# ------------------------------------------------------------------------------------ actors

@ray.remote(num_cpus=0)
class Producer:
    """Puts objects into its node's store (ray.put: always plasma, never inlined, whatever the size)
    and owns them; returns the refs and, when asked, the sha256 of every object."""

    def make(self, kind, size, count, seed, verify):
        refs, digests = [], []
        for i in range(count):
            v = make_value(kind, size, seed * 100003 + i)
            if verify:
                digests.append(digest(v))
            refs.append(ray.put(v))
            del v
        return refs, digests

    def make_one(self, kind, size, seed, verify):
        """One object as this call's result (num_returns=2), owned by the caller: in this node's store
        when above Ray's 100 KiB inline limit (the owned case measures only those); with its sha256
        when asked."""
        v = make_value(kind, size, seed)
        return v, digest(v) if verify else ""

    def touch(self, nbytes):
        """Puts and frees one object of nbytes: the store's pages are faulted in once, before
        anything is timed (a long-running store is warm; a fresh one pays first-touch once)."""
        chunk = np.ones(min(nbytes, 256 * MiB), dtype=np.uint8)
        refs, left = [], nbytes
        while left > 0:  # held until the end, so that every put lands in new space
            refs.append(ray.put(chunk[:min(left, len(chunk))]))
            left -= min(left, len(chunk))
        del refs
        return nbytes

    def pid(self):
        return os.getpid()


_PHASES = {}


def _per_owner(get_object_locations):
    """Ray 2.60's CoreWorker::GetLocationFromOwner can abort the calling worker ("std::future_error:
    Promise already satisfied") when one call spans several owners (or several 10,000-object
    batches): its counter of outstanding replies reaches zero before the last request is sent.
    One call per owner, at most 5,000 refs each, avoids that (rayfabric.get itself does so since
    2026-12-03; this wraps the timed Ray call the same way for --locations-per-owner)."""
    def per_owner(refs, timeout_ms=-1):
        core = ray._private.worker.global_worker.core_worker
        return _pulls._locations(core, refs, lambda group: get_object_locations(group, timeout_ms))
    return per_owner


# The agent's steps of a Pull (PullPhases in agent.proto), and every phase the consumer records.
AGENT_STEPS = ("lease", "lease_served", "create", "prepare", "post", "wait", "seal", "total")
# lease_served is part of lease: the source agent's own time answering (the rest is the RPC).
STEP_NAMES = {"lease_served": "served"}
PHASE_KEYS = ("wait", "locations", "pull_rpc", "local_get", "agent_object_max_s", "agent_object_sum_s") + tuple(
    "agent_" + step for step in AGENT_STEPS)


def _instrument():
    """Times the steps of rayfabric.get in this (consumer) process: wait for the objects to exist,
    ask Ray for their locations, the Pull RPC to the local agent, the final local ray.get."""
    if _PHASES.get("installed"):
        return _PHASES
    from rayfabric._client import AgentClient, PullSocketClient

    def timed(name, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                out = fn(*a, **k)
                if name == "pull_rpc":
                    secs = [r.seconds for r in out.results if r.seconds > 0]
                    _PHASES["agent_object_max_s"] = max(secs) if secs else 0.0
                    _PHASES["agent_object_sum_s"] = sum(secs)
                    # The agent's own steps (seconds, summed over its sources; older agents: 0).
                    for step in AGENT_STEPS:
                        _PHASES["agent_" + step] = _PHASES.get("agent_" + step, 0.0) + getattr(
                            out.phases, step + "_s", 0.0)
                return out
            finally:
                _PHASES[name] = _PHASES.get(name, 0.0) + time.perf_counter() - t0
        return wrapper
    ray.wait = timed("wait", ray.wait)
    _PHASES["timed_locations"] = timed("locations", ray.experimental.get_object_locations)
    _PHASES["timed_locations_per_owner"] = timed("locations", _per_owner(ray.experimental.get_object_locations))
    ray.experimental.get_object_locations = _PHASES["timed_locations"]
    # An owner's own record (the "owned" case), with any wait for a location not known yet.
    _pulls._own_locations = timed("locations", _pulls._own_locations)
    AgentClient.pull = timed("pull_rpc", AgentClient.pull)
    PullSocketClient.pull = timed("pull_rpc", PullSocketClient.pull)
    _pulls._ray_get = timed("local_get", _pulls._ray_get)
    _PHASES["installed"] = True
    return _PHASES


@ray.remote(num_cpus=0)
class Consumer:
    def __init__(self):
        # This class travels by value (cloudpickle): reach the module's dict through the function.
        self.phases = _instrument()

    def pid(self):
        return os.getpid()

    def node(self):
        return ray.get_runtime_context().get_node_id()

    def locations_per_owner(self, on):
        ray.experimental.get_object_locations = self.phases["timed_locations_per_owner" if on else "timed_locations"]
        return on

    def refresh(self):
        """After agents were restarted (another provider): read their addresses again."""
        _pulls._agents_cache["at"] = 0.0
        return len(_pulls._agent_records(refresh=True))

    def own(self, producers, kind, size, count, seed, verify, timeout=600):
        """Makes the objects of the "owned" case by this consumer's own calls to the producers (it owns
        the results, as a driver owns its tasks' results) and holds them for fetch_held; returns their
        sha256 as computed on the source when asked. Untimed: they exist before the get starts."""
        calls = [p.make_one.options(num_returns=2).remote(kind, size, (seed * 7 + j) * 100003 + i, verify)
                 for j, p in enumerate(producers) for i in range(count)]
        self.held = [v for v, _ in calls]
        ready, _ = ray.wait(self.held, num_returns=len(self.held), timeout=timeout, fetch_local=False)
        if len(ready) != len(self.held):
            raise TimeoutError(f"{len(self.held) - len(ready)} owned objects not made within {timeout} s")
        return ray.get([d for _, d in calls], timeout=timeout) if verify else []

    def fetch_held(self, path, verify, timeout=600):
        return self.fetch(self.held, path, verify, timeout)

    def release_held(self):
        """Drops the owned objects (after the CPU is read, as the driver drops the borrowed ones)."""
        self.held = None

    def fetch(self, refs, path, verify, timeout=600):
        import rayfabric as rf
        phases = self.phases
        for k in PHASE_KEYS:
            phases[k] = 0.0
        before = rf.stats()
        wall0 = time.time()
        t0 = time.perf_counter()
        values = ray.get(refs, timeout=timeout) if path == "ray" else rf.get(refs, timeout=timeout)
        seconds = time.perf_counter() - t0
        wall1 = time.time()
        after = rf.stats()
        nbytes = sum(v.nbytes if isinstance(v, np.ndarray) else len(v) for v in values)
        h0 = time.perf_counter()
        digests = [digest(v) for v in values] if verify else []
        hash_s = time.perf_counter() - h0
        del values
        reasons = {k: n - before["fallback_reasons"].get(k, 0) for k, n in after["fallback_reasons"].items()
                   if n != before["fallback_reasons"].get(k, 0)}
        phases = {k: phases[k] for k in PHASE_KEYS} if path == "rayfabric" else {}
        return {"seconds": seconds, "start": wall0, "end": wall1, "nbytes": nbytes, "digests": digests,
                "pulled": after["objects_pulled"] - before["objects_pulled"],
                "fabric_bytes": after["bytes_pulled"] - before["bytes_pulled"],
                "fallbacks": after["fallbacks"] - before["fallbacks"], "reasons": reasons,
                "stood_aside": after["stood_aside"] - before["stood_aside"],
                "ray_path_small": after["ray_path_small"] - before["ray_path_small"],
                "not_in_plasma": after["ray_path_not_in_plasma"] - before["ray_path_not_in_plasma"],
                "phases": phases, "hash_s": hash_s, "pid": os.getpid()}


def raylet_pid(match):
    """The pid of this host's raylet process one of whose arguments contains `match` (bytes: its
    store socket, or b"--node_id=<hex>"), from /proc; None if there is none."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if args and os.path.basename(args[0].decode(errors="replace")) == "raylet" and \
                any(match in a for a in args):
            return int(entry)
    return None


@ray.remote(num_cpus=0)
class Probe:
    """CPU times of its node's processes (works when the nodes are different hosts)."""

    def __init__(self):
        node = ray.get_runtime_context().get_node_id()
        sock = next(n["ObjectStoreSocketName"] for n in ray.nodes() if n["NodeID"] == node)
        self.raylet = raylet_pid(sock.encode())

    def raylet_pid(self):
        return self.raylet

    def cpu(self, pids):
        return {pid: _cpu_seconds(pid) for pid in pids if pid}


# ------------------------------------------------------------------------------------ the run

class Progress:
    def __init__(self, quiet=False):
        self.tty = sys.stderr.isatty()
        self.quiet = quiet
        self.t0 = time.monotonic()
        self.last = 0.0
        self.width = 0

    def __call__(self, msg, final=False):
        if self.quiet:
            return
        line = f"[bench {time.monotonic() - self.t0:6.1f}s] {msg}"
        if self.tty:
            pad = max(0, self.width - len(line))
            sys.stderr.write("\r" + line + " " * pad + ("\n" if final else ""))
            self.width = 0 if final else len(line)
            sys.stderr.flush()
        elif final or time.monotonic() - self.last > 10:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            self.last = time.monotonic()

    def done(self, msg):
        self(msg, final=True)


def worker_env():
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(rayfabric.__file__)))  # python/, or site-packages
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": pkg_root + (os.pathsep + path if path else ""), "RAYFABRIC_BIN_DIR": bin_dir()}


class Bench:
    def __init__(self, a, progress):
        self.a = a
        self.progress = progress
        self.cluster = None
        self.started_agents = False
        self.seed = 1000
        self.results = []
        self.notes = []
        self.crashes = []
        self.per_owner_since = "the start (--locations-per-owner)" if a.locations_per_owner else None
        if a.locations_per_owner:
            self.notes.append("--locations-per-owner: consumers call Ray's get_object_locations once per owner")
        self.failures = []
        self.exit_stack = contextlib.ExitStack()

    # ---------------------------------------------------------------- cluster
    def start(self):
        a = self.a
        if a.address:
            ray.init(address=a.address, logging_level="ERROR", log_to_driver=False, namespace="rayfabric-bench",
                     runtime_env={"env_vars": worker_env()})
            here = ray.get_runtime_context().get_node_id()
            alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
            if len(alive) < 2:
                raise SystemExit(f"rayfabric bench: the cluster at {a.address} has {len(alive)} alive node(s); "
                                 f"it needs at least 2")
            self.nodes = [here] + sorted(n for n in alive if n != here)
            self.embedded = False
        else:
            from ray.cluster_utils import Cluster
            os.environ.update(worker_env())  # raylets pass it on to the workers they start
            store = a.store_bytes
            on_pages = {i: {} for i in range(a.nodes)}
            if a.huge_pages:
                names = [f"n{i}" for i in range(a.nodes)]
                pages = hugepages.pages_for_stores(store, a.nodes)
                self.progress(f"reserving {pages} huge pages of 2 MiB and mounting hugetlbfs for {a.nodes} stores")
                try:
                    mounts = self.exit_stack.enter_context(hugepages.mounts(names, pages))
                except hugepages.Unavailable as e:
                    raise SystemExit(f"rayfabric bench --huge-pages: {e}") from e
                on_pages = {i: {"plasma_directory": mounts[f"n{i}"], "huge_pages": True} for i in range(a.nodes)}
            self.progress(f"starting a {a.nodes}-node local Ray cluster ({size_name(store)} store per node"
                          f"{', on huge pages' if a.huge_pages else ''})")
            c = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 2, "resources": {"rfbench_n0": 1000}, "object_store_memory": store,
                "include_dashboard": False, **on_pages[0]})
            self.cluster = c  # shut down by shutdown() even if a later node fails to start
            for i in range(1, a.nodes):
                c.add_node(num_cpus=2, resources={f"rfbench_n{i}": 1000}, object_store_memory=store, **on_pages[i])
            ray.init(address=c.address, logging_level="ERROR", log_to_driver=False, namespace="rayfabric-bench")
            c.wait_for_nodes()
            by_res = {}
            for n in ray.nodes():
                for r in n["Resources"]:
                    if n["Alive"] and r.startswith("rfbench_n"):
                        by_res[int(r[len("rfbench_n"):])] = n["NodeID"]
            self.nodes = [by_res[i] for i in range(a.nodes)]
            self.embedded = True
        self.probes = {n: Probe.options(**self.place(n)).remote() for n in self.nodes}
        self.raylet_pids = dict(zip(self.nodes, ray.get([self.probes[n].raylet_pid.remote() for n in self.nodes])))
        for n, pid in self.raylet_pids.items():
            if not pid:
                self.notes.append(f"raylet of node {n[:12]} not found: its CPU is not counted")
        self.producers = {n: Producer.options(**self.place(n)).remote() for n in self.nodes}
        self.consumers = {}  # (node, slot) -> actor
        self.consumer_pids = {}

    def place(self, node):
        if self.embedded:
            return {"resources": {f"rfbench_n{self.nodes.index(node)}": 0.01}}
        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=False)}

    def consumer(self, node, slot=0):
        key = (node, slot)
        if key not in self.consumers:
            c = Consumer.options(**self.place(node)).remote()
            self.consumers[key] = c
            self.consumer_pids[key] = ray.get(c.pid.remote())
            if self.a.locations_per_owner:
                ray.get(c.locations_per_owner.remote(True))
        return self.consumers[key]

    def start_agents(self, provider):
        before = _agents.published()
        self.progress(f"starting rayfabric agents (provider {provider})")
        records = rayfabric.init(provider=provider, watch_new_nodes=False)
        if not all(n in before for n in self.nodes):
            self.started_agents = True
        st = rayfabric.status()["agents"]
        self.agent = {n: st[n] for n in self.nodes if n in st}
        missing = [n[:12] for n in self.nodes if n not in self.agent or not self.agent[n].get("alive")]
        if missing:
            raise RuntimeError(f"no live rayfabric agent on node(s) {missing}")
        used = sorted({a["provider"] for a in self.agent.values()})
        if provider and used != [provider]:
            self.notes.append(f"asked for provider {provider}, agents run {used} (agents that were already "
                              f"running keep theirs: `rayfabric stop` first)")
        for c in self.consumers.values():
            ray.get(c.refresh.remote())
        return ", ".join(used), records

    def stop_agents(self):
        rayfabric.shutdown()
        deadline = time.time() + 60
        for n in self.nodes:  # a killed actor's name is free only once it is gone
            while time.time() < deadline:
                try:
                    ray.get_actor(_agents.actor_name(n), namespace=_agents.NAMESPACE)
                    time.sleep(0.2)
                except ValueError:
                    break

    def shutdown(self):
        try:
            if self.started_agents:
                rayfabric.shutdown()
        finally:
            try:
                try:
                    ray.shutdown()
                finally:
                    if self.cluster is not None:
                        self.cluster.shutdown()
            finally:
                self.exit_stack.close()  # the huge pages and their mounts, once the raylets are gone

    # ---------------------------------------------------------------- measuring
    def cpu_snapshot(self, nodes):
        refs = {}
        for n in nodes:
            pids = [self.raylet_pids.get(n), self.agent.get(n, {}).get("pid")]
            pids += [pid for (node, _), pid in self.consumer_pids.items() if node == n]
            refs[n] = self.probes[n].cpu.remote(pids)
        got = ray.get(list(refs.values()))
        return {n: sum(v.values()) for n, v in zip(refs, got)}

    def transfer(self, path, kind, size, count, sources, consumers, verify, owned=False):
        """One repetition: fresh objects on every source node, then every consumer gets all of them.
        owned: the one consumer makes them by its own calls (the "owned" case), else producers put them."""
        self.seed += 1
        if owned:
            (key,) = consumers
            refs = None  # held by the consumer that owns them
            src_digests = ray.get(self.consumer(*key).own.remote([self.producers[s] for s in sources], kind, size,
                                                                 count, self.seed, verify))
        else:
            made = ray.get([self.producers[s].make.remote(kind, size, count, self.seed * 7 + j, verify)
                            for j, s in enumerate(sources)])
            refs = [r for m in made for r in m[0]]
            src_digests = [d for m in made for d in m[1]]
        nodes_dst = sorted({n for n, _ in consumers})
        involved = list(sources) + [n for n in nodes_dst if n not in sources]
        cpu0 = self.cpu_snapshot(involved)
        t0 = time.perf_counter()
        try:
            outs = ray.get([self.consumer(n, slot).fetch_held.remote(path, verify) if owned else
                            self.consumer(n, slot).fetch.remote(refs, path, verify) for n, slot in consumers])
            t1 = time.perf_counter()
            cpu1 = self.cpu_snapshot(involved)
        finally:
            if owned:  # dropped after the CPU is read, as the borrowed ones are; and when the get failed
                try:
                    ray.get(self.consumer(*key).release_held.remote(), timeout=60)
                except Exception:  # noqa: BLE001 - the consumer died: its objects went with it
                    pass
        # End to end (driver): submit -> answer, less the sha256 the consumer did after its get.
        e2e = t1 - t0 - max(o["hash_s"] for o in outs)
        del refs
        get_s = outs[0]["seconds"] if len(outs) == 1 else max(o["end"] for o in outs) - min(o["start"] for o in outs)
        ok = None
        if verify:
            ok = all(o["digests"] == src_digests for o in outs) and len(src_digests) == count * len(sources)
        return {"get_s": get_s, "e2e_s": e2e, "bytes": sum(o["nbytes"] for o in outs),
                "node_bytes": outs[0]["nbytes"] * len(nodes_dst),
                "cpu_src": sum(cpu1[n] - cpu0[n] for n in sources),
                "cpu_dst": sum(cpu1[n] - cpu0[n] for n in nodes_dst if n not in sources),
                "ok": ok, "outs": outs}

    def transfer_retrying(self, path, label, kind, size, count, sources, consumers, verify, attempts=3, owned=False):
        """transfer(); a consumer worker that dies is recorded (a crash is a result too), replaced,
        and the repetition is redone with fresh objects."""
        for attempt in range(attempts):
            try:
                return self.transfer(path, kind, size, count, sources, consumers, verify, owned)
            except ray.exceptions.RayActorError as e:
                detail = str(e).replace("\n", " ")
                self.crashes.append({"case": label, "path": path, "attempt": attempt + 1, "error": detail[:600]})
                self.progress.done(f"{label}: a consumer worker died during the {path} get (attempt {attempt + 1}); "
                                   f"replacing it and redoing the repetition with fresh objects")
                for key in consumers:
                    try:
                        ray.kill(self.consumers[key])
                    except Exception:  # noqa: BLE001 - already dead
                        pass
                    del self.consumers[key]
                    ray.get(self.consumer(*key).locations_per_owner.remote(True))
                for p in ("ray", "rayfabric"):  # untimed: the new workers' first calls connect
                    try:
                        self.transfer(p, "numpy", MiB, 1, sources, consumers, verify=False)
                    except Exception:  # noqa: BLE001 - the timed attempt below reports
                        pass
                self.per_owner_since = self.per_owner_since or label
                note = (f"from '{self.per_owner_since}' on, after a consumer worker died, consumers call Ray's "
                        f"get_object_locations once per owner (workaround for Ray 2.60's GetLocationFromOwner "
                        f"race; see consumer_crashes)")
                if note not in self.notes:
                    self.notes.append(note)
                if attempt == attempts - 1:
                    raise

    def safe_measure(self, case, kind, size, count, *rest):
        """measure(); a case that cannot be measured is recorded and the run goes on."""
        try:
            return self.measure(case, kind, size, count, *rest)
        except Exception as e:  # noqa: BLE001 - reported in the table's notes and the JSON
            what = f"{case} {kind} {count}x{size_name(size)}"
            self.failures.append({"case": case, "kind": kind, "size": size, "count": count,
                                  "error": f"{type(e).__name__}: {str(e)[:500]}"})
            self.progress.done(f"{what}: NOT MEASURED: {type(e).__name__}: {str(e)[:200]}")
            return []

    def measure(self, case, kind, size, count, sources, consumers, reps, provider, paths):
        per = {p: [] for p in paths}
        label = f"{case} {kind} {count}x{size_name(size)}" if count > 1 else f"{case} {kind} {size_name(size)}"
        # One untimed repetition per path first: the first gets of a case and size ran slower (Ray's
        # path the most: whichever case came first at a size lost 1.2-1.5x), whatever the case.
        for p in paths:
            self.progress(f"{label:28s} untimed first repetition {p}")
            self.transfer_retrying(p, label, kind, size, count, sources, consumers, False, owned=case == "owned")
        for rep in range(reps):
            order = paths if rep % 2 == 0 else list(reversed(paths))
            for p in order:
                self.progress(f"{label:28s} rep {rep + 1}/{reps} {p}")
                per[p].append(self.transfer_retrying(p, label, kind, size, count, sources, consumers, rep == 0,
                                                     owned=case == "owned"))
        out = []
        for p, runs in per.items():
            total = sum(r["bytes"] for r in runs)
            gb = total / 1e9
            gets = [r["get_s"] for r in runs]
            e2es = [r["e2e_s"] for r in runs]
            outs = [o for r in runs for o in r["outs"]]
            res = {
                "case": case, "kind": kind, "size": size, "count": count, "path": p,
                "provider": provider if p == "rayfabric" else None,
                "sources": len(sources), "consumers": len(consumers), "reps": reps,
                "bytes_per_rep": runs[0]["bytes"],
                "gbps": total / sum(gets) / 1e9, "e2e_gbps": total / sum(e2es) / 1e9,
                # bytes that crossed between nodes (fan-out: one copy per destination NODE)
                "node_gbps": sum(r["node_bytes"] for r in runs) / sum(gets) / 1e9,
                "p50_ms": percentile(gets, 0.5) * 1e3, "p99_ms": percentile(gets, 0.99) * 1e3,
                "e2e_p50_ms": percentile(e2es, 0.5) * 1e3, "e2e_p99_ms": percentile(e2es, 0.99) * 1e3,
                "cpu_s_per_gb": {"src": sum(r["cpu_src"] for r in runs) / gb, "dst": sum(r["cpu_dst"] for r in runs) / gb},
                "bytes_ok": all(r["ok"] for r in runs if r["ok"] is not None) and any(r["ok"] is not None for r in runs),
                "verified_reps": sum(1 for r in runs if r["ok"] is not None),
                "get_s": gets, "e2e_s": e2es,
                "consumer_crashes": sum(1 for c in self.crashes if c["case"] == label and c["path"] == p),
                "locations_per_owner": self.per_owner_since is not None,
            }
            if p == "rayfabric":
                reasons = {}
                for o in outs:
                    for k, n in o["reasons"].items():
                        reasons[k] = reasons.get(k, 0) + n
                res["fabric"] = {
                    "objects_pulled": sum(o["pulled"] for o in outs), "objects_requested": count * len(sources) * len(outs),
                    "bytes_pulled": sum(o["fabric_bytes"] for o in outs), "fallbacks": sum(o["fallbacks"] for o in outs),
                    "fallback_reasons": reasons, "stood_aside": sum(o["stood_aside"] for o in outs),
                    "ray_path_small": sum(o["ray_path_small"] for o in outs),
                    "not_in_plasma": sum(o["not_in_plasma"] for o in outs)}
                ph = [o["phases"] for o in outs if o["phases"]]
                if ph:
                    mean = {k: sum(x[k] for x in ph) / len(ph) * 1e3 for k in ph[0]}
                    mean["python_other"] = sum(o["seconds"] for o in outs) / len(outs) * 1e3 - sum(
                        mean[k] for k in ("wait", "locations", "pull_rpc", "local_get"))
                    res["phases_ms"] = {k: round(v, 3) for k, v in mean.items()}
            out.append(res)
            self.results.append(res)
        r = {x["path"]: x for x in out}
        msg = f"{label:28s} " + "  ".join(f"{p} {r[p]['gbps']:.3f} GB/s" for p in paths if p in r)
        if "ray" in r and "rayfabric" in r:
            msg += f"  x{r['rayfabric']['gbps'] / r['ray']['gbps']:.2f}"
        self.progress.done(msg)
        return out

    def warm_up(self, pairs):
        """Starts consumer workers, raylet<->raylet and agent<->agent connections, registrations."""
        nodes = list(dict.fromkeys([s for s, _ in pairs] + [c[0] for _, c in pairs]))
        touch = min(self.a.touch_bytes, max(0, self.a.store_bytes - 512 * MiB)) if self.embedded else self.a.touch_bytes
        if touch:
            self.progress(f"touching {size_name(touch)} of the object store on {len(nodes)} node(s)")
            ray.get([self.producers[n].touch.remote(touch) for n in nodes])
        self.progress(f"warming up {len(pairs)} source/consumer pair(s)")
        for src, consumer in pairs:
            for p in ("ray", "rayfabric"):
                self.transfer(p, "numpy", MiB, 2, [src], [consumer], verify=True)

    def run_cases(self, provider, paths, cases):
        a = self.a
        N = self.nodes
        src = N[1]
        dst = N[2] if len(N) > 2 else N[0]
        others = [n for n in N if n != src]
        fan_consumers = []
        for i in range(a.fan_consumers):
            node = others[i % len(others)]
            fan_consumers.append((node, sum(1 for n, _ in fan_consumers if n == node)))
        fanin_sources = [n for n in N if n != dst][:2]
        pairs = [(src, (dst, 0))]
        if "fanout" in cases:
            pairs += [(src, c) for c in fan_consumers if (src, c) not in pairs]
        if "fanin" in cases and len(fanin_sources) == 2:
            pairs += [(s, (dst, 0)) for s in fanin_sources if (s, (dst, 0)) not in pairs]
        self.warm_up(pairs)
        one_object = [c for c in cases if c in ("single", "owned")]  # the first goes first at the first size
        note = (f"owned: sizes up to {size_name(RAY_INLINE_BYTES)} not measured: Ray returns such results inside "
                f"the reply to their owner (max_direct_call_object_size), no store holds them")
        if "owned" in cases and any(size <= RAY_INLINE_BYTES for size in a.sizes) and note not in self.notes:
            self.notes.append(note)
        for n, size in enumerate(a.sizes):
            for kind in a.kinds:
                # single and owned one after the other, in turns, so that neither is always later in the run
                for case in (one_object if n % 2 == 0 else one_object[::-1]):
                    if case == "owned" and size <= RAY_INLINE_BYTES:
                        continue
                    self.safe_measure(case, kind, size, 1, [src], [(dst, 0)], a.reps_for(size), provider, paths)
        if "many" in cases:
            for count, size in a.many:
                self.safe_measure("many", "numpy", size, count, [src], [(dst, 0)], a.many_reps, provider, paths)
        if "fanout" in cases:
            self.safe_measure("fanout", "numpy", a.fan_size, 1, [src], fan_consumers, a.fan_reps, provider, paths)
        if "fanin" in cases:
            if len(fanin_sources) < 2:
                self.notes.append("fanin skipped: it needs 3 nodes (2 sources + 1 consumer)")
            else:
                self.safe_measure("fanin", "numpy", a.fan_size, 1, fanin_sources, [(dst, 0)], a.fan_reps, provider, paths)
        return {"source": src, "destination": dst, "fanout_consumers": [n for n, _ in fan_consumers],
                "fanin_sources": fanin_sources}


def raw_ceiling(provider, sizes, progress):
    """rayfabric-bench (fi_read between two processes on this host) at the given sizes."""
    exe = os.path.join(bin_dir(), "bench", "rayfabric-bench")
    if not os.path.exists(exe):
        return {"error": f"{exe} not found (build it: ninja -C build)"}
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [exe, "--provider", provider, "--op", "read", "--sizes", ",".join(size_name(s) for s in sizes),
           "--json", path]
    progress(f"raw ceiling: {' '.join(cmd[1:-2])}")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if p.returncode != 0:
            return {"error": f"rayfabric-bench exited {p.returncode}: {p.stderr.strip()[-300:]}", "command": cmd[:-2]}
        with open(path) as f:
            raw = json.load(f)
    except (subprocess.TimeoutExpired, OSError, ValueError) as e:
        return {"error": f"rayfabric-bench: {e}", "command": cmd[:-2]}
    finally:
        if os.path.exists(path):
            os.unlink(path)
    progress.done(f"raw ceiling ({provider}): " + ", ".join(
        f"{size_name(r['size'])} {r['gbps']:.2f}" for r in raw["results"]) +
        f" GB/s; TCP stream {raw['ceilings']['tcp_stream_gbps']:.2f}, memcpy {raw['ceilings']['memcpy_gbps']:.2f} GB/s"
        f" ({time.monotonic() - t0:.0f} s)")
    return {"command": " ".join(cmd[:-2]), "by_size": {str(r["size"]): r for r in raw["results"]},
            "tcp_stream_gbps": raw["ceilings"]["tcp_stream_gbps"], "memcpy_gbps": raw["ceilings"]["memcpy_gbps"],
            "engine": raw.get("engine")}


def ceiling_for(ceiling, size):
    if not ceiling or "by_size" not in ceiling:
        return None
    r = ceiling["by_size"].get(str(size))
    return r["gbps"] if r else None


def pair_rows(results, ceilings):
    """One row per (provider, case, kind, size, count): Ray's numbers next to rayfabric's."""
    ray_of = {(r["case"], r["kind"], r["size"], r["count"]): r for r in results if r["path"] == "ray"}
    rows = []
    for r in results:
        if r["path"] != "rayfabric":
            continue
        key = (r["case"], r["kind"], r["size"], r["count"])
        ray_r = ray_of.get(key)
        ceil = ceiling_for(ceilings.get(r["provider"]), r["size"])
        rows.append({"case": r["case"], "kind": r["kind"], "size": r["size"], "count": r["count"],
                     "provider": r["provider"], "ray": ray_r, "rayfabric": r,
                     "ratio": r["gbps"] / ray_r["gbps"] if ray_r and ray_r["gbps"] else None,
                     "e2e_ratio": r["e2e_gbps"] / ray_r["e2e_gbps"] if ray_r and ray_r["e2e_gbps"] else None,
                     "ceiling_gbps": ceil,
                     "fraction_of_ceiling": r["node_gbps"] / ceil if ceil else None,
                     "bytes_ok": bool(r["bytes_ok"] and (ray_r is None or ray_r["bytes_ok"]))})
    return rows


def object_label(row):
    n = size_name(row["size"])
    if row["case"] == "many":
        return f"{row['count']} x {n}"
    if row["case"] == "fanout":
        return f"{n} -> {row['rayfabric']['consumers']} readers"
    if row["case"] == "fanin":
        return f"{row['rayfabric']['sources']} x {n} from {row['rayfabric']['sources']} nodes"
    return f"{row['kind']} {n}"


def format_table(rows, ceilings, congestion=None, where="on this host"):
    out = []
    if congestion:  # it paces both paths wherever they ride kernel TCP (docs/benchmarks.md)
        out.append(f"TCP congestion control {where}: {congestion}")
    for provider in dict.fromkeys(r["provider"] for r in rows):
        c = ceilings.get(provider) or {}
        head = f"provider {provider}"
        if "tcp_stream_gbps" in c:
            head += (f"; ceilings this run: raw fi_read (rayfabric-bench, per size), TCP stream "
                     f"{c['tcp_stream_gbps']:.2f} GB/s, memcpy {c['memcpy_gbps']:.2f} GB/s")
        elif c.get("error"):
            head += f"; raw ceiling not measured: {c['error']}"
        out.append(head)
        out.append(f"{'case':7s} {'object':26s} {'Ray GB/s':>8s} {'rf GB/s':>8s} {'rf/Ray':>6s} "
                   f"{'Ray p50/p99 ms':>16s} {'rf p50/p99 ms':>16s} {'e2e Ray/rf GB/s':>15s} "
                   f"{'CPU s/GB src Ray/rf':>19s} {'dst Ray/rf':>11s} {'ceil':>5s} {'rf/ceil':>7s} ok")
        for row in (r for r in rows if r["provider"] == provider):
            ray_r, rf = row["ray"] or {}, row["rayfabric"]

            def lat(x):
                return f"{x['p50_ms']:.1f}/{x['p99_ms']:.1f}" if x else "-"
            ceil = f"{row['ceiling_gbps']:.2f}" if row["ceiling_gbps"] else "-"
            frac = f"{100 * row['fraction_of_ceiling']:.0f}%" if row["fraction_of_ceiling"] else "-"
            ratio = f"{row['ratio']:.2f}" if row["ratio"] else "-"
            out.append(
                f"{row['case']:7s} {object_label(row):26s} {ray_r.get('gbps', 0):8.3f} {rf['gbps']:8.3f} {ratio:>6s} "
                f"{lat(ray_r):>16s} {lat(rf):>16s} "
                f"{ray_r.get('e2e_gbps', 0):7.3f}/{rf['e2e_gbps']:.3f} "
                f"{ray_r.get('cpu_s_per_gb', {}).get('src', 0):9.2f}/{rf['cpu_s_per_gb']['src']:.2f} "
                f"{ray_r.get('cpu_s_per_gb', {}).get('dst', 0):5.2f}/{rf['cpu_s_per_gb']['dst']:.2f} "
                f"{ceil:>5s} {frac:>7s} {'yes' if row['bytes_ok'] else 'NO'}")
        out.append("")
    out += format_breakdown(rows)
    return "\n".join(out)


def format_breakdown(rows):
    """Where a rayfabric.get's time goes (ms per get, mean over repetitions): the consumer's steps,
    and inside the Pull RPC the agent's (summed over sources; the rest of the RPC is gRPC and
    the agent's bookkeeping)."""
    with_phases = [r for r in rows if r["rayfabric"].get("phases_ms")]
    if not with_phases:
        return []
    cols = ["wait", "locations", "pull_rpc"] + ["agent_" + s for s in AGENT_STEPS] + ["local_get", "python_other"]
    names = ["wait", "locate", "Pull"] + [STEP_NAMES.get(s, s) for s in AGENT_STEPS[:-1]] + ["agent", "ray.get", "other"]
    out = ["where rayfabric.get's time goes, ms per get (Pull = the RPC to the local agent; lease..seal = "
           "the agent's steps inside it, served = the source agent's own part of lease, agent = its wall "
           "time for the Pull)",
           f"{'case':7s} {'object':26s} " + " ".join(f"{n:>8s}" for n in names)]
    for row in with_phases:
        ph = row["rayfabric"]["phases_ms"]
        out.append(f"{row['case']:7s} {object_label(row):26s} " +
                   " ".join(f"{ph[c]:8.1f}" if c in ph else f"{'-':>8s}" for c in cols))
    out.append("")
    return out


def _size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ticks = sorted(set(sizes))
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_name(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("object size (log scale)")


def plots(doc, outdir, log):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return []
    os.makedirs(outdir, exist_ok=True)
    rows, results, ceilings = doc["rows"], doc["results"], doc["ceilings"]
    files = []

    def save(fig, name):
        """`fig` laid out and written to outdir/name, closed, and listed in what plots() returns."""
        fig.tight_layout()
        f = os.path.join(outdir, name)
        fig.savefig(f, dpi=110)
        plt.close(fig)
        files.append(f)

    single = [r for r in rows if r["case"] == "single"]
    one_object = [r for r in rows if r["case"] in ("single", "owned")]
    kinds = list(dict.fromkeys(r["kind"] for r in one_object))
    providers = list(dict.fromkeys(r["provider"] for r in rows))
    if one_object:
        fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.5), squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            ray_pts = sorted({(r["size"], r["ray"]["gbps"]) for r in single if r["kind"] == kind and r["ray"]})
            ax.plot([s for s, _ in ray_pts], [g for _, g in ray_pts], "o-", color="tab:gray", label="Ray (object manager)")
            for i, p in enumerate(providers):
                pts = sorted((r["size"], r["rayfabric"]["gbps"]) for r in single if r["kind"] == kind and r["provider"] == p)
                ax.plot([s for s, _ in pts], [g for _, g in pts], "s-", color=f"C{i}", label=f"rayfabric ({p})")
                if i == 0:  # the owned case, dashed: the consumer owns the object (a driver's own results)
                    own = sorted((r["size"], r["ray"]["gbps"] if r["ray"] else None, r["rayfabric"]["gbps"])
                                 for r in rows if r["case"] == "owned" and r["kind"] == kind and r["provider"] == p)
                    if own:
                        ax.plot([s for s, g, _ in own if g], [g for _, g, _ in own if g], "o--", color="tab:gray",
                                alpha=0.7, label="Ray, owned")
                        ax.plot([s for s, _, _ in own], [g for _, _, g in own], "s--", color=f"C{i}", alpha=0.7,
                                label=f"rayfabric ({p}), owned")
                c = ceilings.get(p) or {}
                if "by_size" in c:
                    cpts = sorted((int(s), v["gbps"]) for s, v in c["by_size"].items())
                    ax.plot([s for s, _ in cpts], [g for _, g in cpts], "^--", color=f"C{i}", alpha=0.6,
                            label=f"raw fi_read ceiling ({p})")
            c0 = ceilings.get(providers[0]) or {}
            if "tcp_stream_gbps" in c0:
                ax.axhline(c0["tcp_stream_gbps"], color="k", ls=":", lw=1, label="raw TCP stream")
            _size_axis(ax, [r["size"] for r in one_object])
            ax.set_yscale("log")
            ax.set_ylabel("GB/s (payload / get time, log scale)")
            ax.set_title(f"one {kind} object, node to node")
            ax.grid(True, alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="lower right")
        save(fig, "bench_throughput.png")

        fig, axes = plt.subplots(1, len(kinds), figsize=(6 * len(kinds), 4.5), squeeze=False)
        for ax, kind in zip(axes[0], kinds):
            series = [("Ray", None, "tab:gray", "o")] + [(f"rayfabric ({p})", p, f"C{i}", "s")
                                                         for i, p in enumerate(providers)]
            for (name, p, color, marker), case in ((x, c) for c in ("single", "owned") for x in series):
                rs = sorted((r for r in results if r["case"] == case and r["kind"] == kind and
                             (r["path"] == "ray" if p is None else r["path"] == "rayfabric" and r["provider"] == p)),
                            key=lambda r: r["size"])
                if not rs:
                    continue
                style = marker + ("-" if case == "single" else "--")
                name = name if case == "single" else f"{name}, owned"
                xs = [r["size"] for r in rs]
                p50 = [r["p50_ms"] for r in rs]
                p99 = [r["p99_ms"] for r in rs]
                ax.errorbar(xs, p50, yerr=[[0] * len(rs), [b - a for a, b in zip(p50, p99)]], fmt=style, color=color,
                            capsize=3, label=f"{name} p50 (bar: p99)")
            _size_axis(ax, [r["size"] for r in one_object])
            ax.set_yscale("log")
            ax.set_ylabel("get latency (ms)")
            ax.set_title(f"one {kind} object: get latency")
            ax.grid(True, alpha=0.3, which="both")
            ax.legend(fontsize=7)
        save(fig, "bench_latency.png")
    other = [r for r in rows if r["case"] not in ("single", "owned")]
    if other:
        labels = list(dict.fromkeys(f"{r['case']}\n{object_label(r)}" for r in other))
        fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(labels)), 4.5))
        width = 0.8 / (1 + len(providers))
        xs = np.arange(len(labels))
        ray_vals = {f"{r['case']}\n{object_label(r)}": r["ray"]["gbps"] for r in other if r["ray"]}
        ax.bar(xs - 0.4 + width / 2, [ray_vals.get(l, 0) for l in labels], width, color="tab:gray", label="Ray")
        for i, p in enumerate(providers):
            vals = {f"{r['case']}\n{object_label(r)}": r["rayfabric"]["gbps"] for r in other if r["provider"] == p}
            ax.bar(xs - 0.4 + width * (i + 1.5), [vals.get(l, 0) for l in labels], width, color=f"C{i}",
                   label=f"rayfabric ({p})")
        ax.set_xticks(xs)
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_ylabel("GB/s (payload delivered / get time)")
        ax.set_title("many objects, fan-out, fan-in")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        save(fig, "bench_cases.png")
    return files


def tcp_sysctl(name):
    """/proc/sys/net/ipv4/<name> of this network namespace, stripped (None: unreadable)."""
    try:
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            return f.read().strip()
    except OSError:
        return None


def tcp_congestion():
    """The kernel's TCP congestion control for new connections (this network namespace): Ray's
    gRPC and the tcp provider both follow it, and on this VM it moves both (docs/benchmarks-history.md,
    "TCP congestion control")."""
    return tcp_sysctl("tcp_congestion_control")


def machine():
    info = {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version(),
            "ray": ray.__version__, "numpy": np.__version__, "tcp_congestion_control": tcp_congestion()}
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(f.readline().split()[1]) / 2**20, 1)
        with open("/etc/os-release") as f:
            info["os"] = next((l.split("=", 1)[1].strip().strip('"') for l in f if l.startswith("PRETTY_NAME=")), "")
        with open("/proc/cpuinfo") as f:
            info["cpu_model"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), "")
    except OSError:
        pass
    return info


# ------------------------------------------------------------------------------------ CLI

def build_parser():
    p = argparse.ArgumentParser(prog="rayfabric bench objects", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="well under 2 minutes: sizes 1M,64M,256M, numpy only, few reps, 200 x 1M, fan cases at 64M")
    p.add_argument("--json", help="write every number to this file")
    p.add_argument("--plots", help="write PNG plots into this directory (needs matplotlib)")
    p.add_argument("--address", help="an existing Ray cluster (e.g. started with `ray start`); default: an "
                                     "embedded local cluster")
    p.add_argument("--provider", default=None, help=f"libfabric provider of the agents (default {DEFAULT_PROVIDER})")
    p.add_argument("--all-providers", action="store_true", help="rayfabric on " + ", ".join(ALL_PROVIDERS) +
                   " in turn (Ray's path measured once, in the first pass)")
    p.add_argument("--sizes", help="object sizes of the single-object case (default 64K,1M,16M,256M,1G)")
    p.add_argument("--kinds", help="numpy,bytes (default both; --quick: numpy)")
    p.add_argument("--cases", help="comma list of " + ",".join(CASES) + " (default all)")
    p.add_argument("--reps", type=int, help="repetitions per size and path (default: by size, fewer for big ones)")
    p.add_argument("--many", help="many-objects specs COUNTxSIZE,... (default 1000x1M,10000x64K; --quick 200x1M)")
    p.add_argument("--many-count", type=int, help="override the count of every --many spec (tiny test runs)")
    p.add_argument("--many-reps", type=int)
    p.add_argument("--fan-size", help="object size of fanout/fanin (default 256M; --quick 64M)")
    p.add_argument("--fan-consumers", type=int, default=4)
    p.add_argument("--fan-reps", type=int)
    p.add_argument("--nodes", type=int, default=3, help="nodes of the embedded cluster (default 3)")
    p.add_argument("--huge-pages", action="store_true",
                   help="the embedded cluster's plasma stores on 2 MiB huge pages (a hugetlbfs mount per node; needs "
                        "root; the pages and mounts are given back at exit)")
    p.add_argument("--store", help="object store per node of the embedded cluster (default: from the sizes)")
    p.add_argument("--touch", help="bytes of each node's store to fault in before timing (default 2 x the "
                                   "largest transfer, at most 2G; 0: none)")
    p.add_argument("--locations-per-owner", action="store_true",
                   help="consumers call Ray's get_object_locations once per owner from the start (the workaround "
                        "for Ray 2.60's GetLocationFromOwner race; otherwise used only after a consumer died)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the raw rayfabric-bench ceiling")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="measure nothing: print the table (and --plots, --json) again from earlier --json "
                        "files, merged in order (the first file's ceiling of each provider is used)")
    return p


def resolve(a):
    q = a.quick
    if a.huge_pages and a.address:
        raise SystemExit("--huge-pages applies to the embedded cluster: a cluster started with `ray start` cannot "
                         "put its stores on huge pages (only RayParams, e.g. ray.cluster_utils.Cluster, can)")
    a.sizes = [parse_size(s) for s in (a.sizes or ("1M,64M,256M" if q else "64K,1M,16M,256M,1G")).split(",") if s]
    a.kinds = [k for k in (a.kinds or ("numpy" if q else "numpy,bytes")).split(",") if k]
    for k in a.kinds:
        if k not in ("numpy", "bytes"):
            raise SystemExit(f"--kinds: unknown kind {k!r} (numpy, bytes)")
    a.cases = [c for c in (a.cases or ",".join(CASES)).split(",") if c]
    for c in a.cases:
        if c not in CASES:
            raise SystemExit(f"--cases: unknown case {c!r} ({', '.join(CASES)})")
    a.many = parse_many(a.many or ("200x1M" if q else "1000x1M,10000x64K"))
    if a.many_count:
        a.many = [(a.many_count, s) for _, s in a.many]
    a.fan_size = parse_size(a.fan_size or ("64M" if q else "256M"))
    fixed = a.reps

    def reps_for(size):
        if fixed:
            return fixed
        if q:
            return 5 if size <= MiB else 3 if size <= 64 * MiB else 2
        return 20 if size <= MiB else 10 if size <= 16 * MiB else 5 if size <= 256 * MiB else 3
    a.reps_for = reps_for
    a.many_reps = a.many_reps or fixed or (2 if q else 3)
    a.fan_reps = a.fan_reps or fixed or (2 if q else 4)
    a.providers = ALL_PROVIDERS if a.all_providers else [a.provider or os.environ.get("RAYFABRIC_PROVIDER") or DEFAULT_PROVIDER]
    biggest = max([s for s in a.sizes] + [c * s for c, s in a.many] + [a.fan_size])
    a.store_bytes = parse_size(a.store) if a.store else max(2 * GiB, int(2.5 * biggest) + 512 * MiB)
    a.touch_bytes = parse_size(a.touch) if a.touch is not None else min(2 * biggest, 2 * GiB)
    ceiling_sizes = set(a.sizes) if "single" in a.cases or "owned" in a.cases else set()
    if "many" in a.cases:
        ceiling_sizes |= {s for _, s in a.many}
    if "fanout" in a.cases or "fanin" in a.cases:
        ceiling_sizes.add(a.fan_size)
    a.ceiling_sizes = sorted(ceiling_sizes)
    if a.huge_pages:
        try:  # before the ceilings are measured: a run that cannot have its huge pages ends at once
            hugepages.check(hugepages.pages_for_stores(a.store_bytes, a.nodes))
        except hugepages.Unavailable as e:
            raise SystemExit(f"rayfabric bench --huge-pages: {e}") from e
    return a


def recorded_congestion(meta):
    """The TCP congestion control each run behind a JSON recorded (None: not recorded); for a
    --report's JSON, its parts' in order."""
    if meta.get("parts"):
        out = []
        for part in meta["parts"]:
            value = part.get("tcp_congestion_control")
            out += value if isinstance(value, list) else [value]
        return out
    return [(meta.get("machine") or {}).get("tcp_congestion_control")]


def report(a):
    """--report: the table, JSON and plots again from earlier --json files (merged in order)."""
    doc = {"meta": {"command": "rayfabric bench --report " + " ".join(a.report), "parts": []},
           "ceilings": {}, "results": [], "rows": [], "notes": [], "consumer_crashes": []}
    for path in a.report:
        with open(path) as f:
            part = json.load(f)
        doc["meta"]["parts"].append({"file": path, **{k: part["meta"].get(k) for k in
                                                      ("command", "started", "load_before", "load_after", "wall_s",
                                                       "own_locations", "pull_socket")},
                                     "tcp_congestion_control": recorded_congestion(part["meta"])})
        doc["meta"].setdefault("machine", part["meta"].get("machine"))
        doc["meta"].setdefault("cluster", part["meta"].get("cluster"))
        for p, c in part.get("ceilings", {}).items():
            doc["ceilings"].setdefault(p, c)
        doc["results"] += part["results"]
        doc["notes"] += part.get("notes", [])
        doc["consumer_crashes"] += part.get("consumer_crashes", [])
    doc["rows"] = pair_rows(doc["results"], doc["ceilings"])
    seen = [x for p in doc["meta"]["parts"] for x in p["tcp_congestion_control"]]
    congestion = (seen[0] if len(set(seen)) == 1 else
                  "differs between the files: " + ", ".join(str(x or "not recorded") for x in seen))
    if doc["meta"].get("machine"):
        doc["meta"]["machine"] = dict(doc["meta"]["machine"], tcp_congestion_control=congestion)
    print(format_table(doc["rows"], doc["ceilings"], congestion, where="recorded in the runs"))
    if a.plots:
        for f in plots(doc, a.plots, print):
            print("plot:", f)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
        print("json:", a.json)
    return 0


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.report:
        return report(args)
    a = resolve(args)
    progress = Progress(a.quiet)
    t_start = time.monotonic()
    doc = {"meta": {"command": "rayfabric bench " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": os.getloadavg(),
                    "machine": machine(), "quick": a.quick, "cluster": "address " + a.address if a.address else
                    f"embedded ray.cluster_utils.Cluster, {a.nodes} nodes on this host"
                    + (", plasma stores on 2 MiB huge pages" if a.huge_pages else ""),
                    # how the consumers locate what they own (RAYFABRIC_OWN_LOCATIONS; this process's view)
                    "own_locations": _pulls.OWN_LOCATIONS,
                    # how they ask this node's agent for pulls (RAYFABRIC_PULL_SOCKET)
                    "pull_socket": _pulls.PULL_SOCKET},
           "ceilings": {}, "results": [], "rows": [], "notes": []}
    if not a.no_ceiling:
        for p in a.providers:
            doc["ceilings"][p] = raw_ceiling(p, a.ceiling_sizes, progress)
    bench = Bench(a, progress)
    placement = {}
    try:
        bench.start()
        for i, provider in enumerate(a.providers):
            if i > 0:
                bench.stop_agents()
            used, _ = bench.start_agents(provider)
            placement[provider] = bench.run_cases(used, ["ray", "rayfabric"] if i == 0 else ["rayfabric"], a.cases)
        doc["agents"] = {n[:12]: {k: v for k, v in rec.items() if k in ("address", "provider", "domain", "pid")}
                         for n, rec in bench.agent.items()}
    finally:
        bench.shutdown()
    doc["results"] = bench.results
    doc["rows"] = pair_rows(bench.results, doc["ceilings"])
    doc["notes"] = bench.notes
    doc["consumer_crashes"] = bench.crashes
    doc["failures"] = bench.failures
    doc["meta"]["placement"] = {p: {k: (v[:12] if isinstance(v, str) else [x[:12] for x in v]) for k, v in pl.items()}
                                for p, pl in placement.items()}
    doc["meta"]["nodes"] = [n[:12] for n in bench.nodes]
    doc["meta"]["load_after"] = os.getloadavg()
    doc["meta"]["wall_s"] = round(time.monotonic() - t_start, 1)
    print()
    print(f"rayfabric bench: Ray {ray.__version__} object manager vs rayfabric, {doc['meta']['cluster']}; "
          f"GB/s = payload / get time in the consumer; CPU s/GB = raylet + rayfabricd + consumer workers "
          f"of the source / destination nodes")
    print(format_table(doc["rows"], doc["ceilings"], doc["meta"]["machine"]["tcp_congestion_control"]))
    for n in bench.notes:
        print("note:", n)
    for f in bench.failures:
        print(f"NOT MEASURED: {f['case']} {f['kind']} {f['count']}x{size_name(f['size'])}: {f['error'][:300]}")
    for c in bench.crashes:
        print(f"consumer worker died: {c['case']} {c['path']} attempt {c['attempt']}: {c['error'][:300]}")
    if a.plots:
        files = plots(doc, a.plots, print)
        doc["meta"]["plots"] = files
        for f in files:
            print("plot:", f)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
        print("json:", a.json)
    print(f"wall time {doc['meta']['wall_s']:.0f} s, load average before {doc['meta']['load_before'][0]:.2f}, "
          f"after {doc['meta']['load_after'][0]:.2f}")
    ok = doc["rows"] and all(r["bytes_ok"] for r in doc["rows"]) and not bench.failures
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
