"""One rayfabricd per Ray node, each started by a small detached Ray actor pinned to its node (so
that it lives exactly as long as the node and `ray stop` takes it down), each publishing its gRPC
address in Ray's internal KV under rayfabric/agent:<node id hex>."""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import ray
from ray.experimental import internal_kv
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfabric import _pulls, settings
from rayfabric._paths import bin_dir
# The records (and their names) are rayfabric._records' (the jobs' too: read them there).
from rayfabric._records import KV_PREFIX, KV_UNAVAILABLE, NAMESPACE, alive_nodes, published, unavailable
from rayfabric.launch_env import agent_fabric_env


def agent_binary():
    path = os.path.join(bin_dir(), "src", "agent", "rayfabricd")
    if not os.path.exists(path):
        raise FileNotFoundError(f"rayfabricd not found at {path}: build it (`meson setup build && ninja -C build`) "
                                f"or point RAYFABRIC_BIN_DIR at the meson build directory")
    return path


def _socket_path(node_hex):
    """The agent's local socket, in this node's Ray session directory (only the Ray user can reach
    it; a Unix socket path has at most 107 bytes, and the agent's pull socket beside it adds
    ".pull")."""
    try:
        session = ray._private.worker._global_node.get_session_dir_path()
    except Exception:  # noqa: BLE001 - not in a Ray process with a node
        session = tempfile.gettempdir()
    path = os.path.join(session, "sockets", f"rayfabric-{node_hex[:16]}.sock")
    if len(path.encode()) > 107 - len(".pull"):
        path = os.path.join(tempfile.gettempdir(), f"rayfabric-{os.getuid()}-{node_hex[:16]}.sock")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    return path


def cluster_credentials_env():
    """The Ray cluster's token settings as this (Ray) process resolved them, for the agent's
    environment: the agent then uses exactly the token Ray's own processes use. TLS settings
    (RAY_USE_TLS, RAY_TLS_*) reach the agent through the inherited environment, as they reach
    Ray's processes."""
    from rayfabric._client import cluster_authorization
    value = cluster_authorization()
    if not value:
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": value[len("Bearer "):]}


def _log_path(node_hex):
    try:
        logs = ray._private.worker._global_node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - not in a Ray process with a node: use /tmp
        logs = tempfile.gettempdir()
    return os.path.join(logs, f"rayfabricd-{node_hex[:12]}.log")


@ray.remote(num_cpus=0, max_restarts=0)
class NodeAgent:
    """Starts rayfabricd on its node and holds it: the agent exits with this actor's process."""

    def __init__(self, node_hex, provider=None, env=None):
        import concurrent.futures
        self.args = (node_hex, provider, env)
        # Argument reads (rayfabric.args): those calls wait for, one per call this actor serves at
        # once (max_concurrency below), apart from those nobody waits for (arguments still being
        # computed, each read waiting for its object to exist), which could otherwise fill them.
        self._waited_reads = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="rayfabric-args-waited")
        self._background_reads = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="rayfabric-args")
        self._launch(node_hex, provider, env)
        # The agent's counters in Ray's metrics (rayfabric.metrics), read from it by this process.
        from rayfabric import metrics
        interval = (settings.get("metrics_interval_s", env) if "RAYFABRIC_METRICS_INTERVAL_S" in (env or {})
                    else metrics.INTERVAL_S)
        self.metrics = metrics.AgentExporter(node_hex, self._status, interval) if interval > 0 else None

    def _status(self):
        return _pulls._client(self.record["address"]).status(timeout=5)

    def _launch(self, node_hex, provider, env):
        node = next((n for n in ray.nodes() if n["NodeID"] == node_hex and n["Alive"]), None)
        if node is None:
            raise RuntimeError(f"node {node_hex} is not alive in this Ray cluster")
        ip = node["NodeManagerAddress"]
        cmd = [agent_binary(), "--plasma-socket", node["ObjectStoreSocketName"], "--node-id", node_hex,
               "--listen", f"{ip}:0", "--local-socket", _socket_path(node_hex),
               "--ray-version", ray.__version__, "--exit-with-parent"]
        if provider:
            cmd += ["--provider", provider]
        self.log = _log_path(node_hex)
        proc_env = dict(os.environ)
        proc_env.update(cluster_credentials_env())
        proc_env.update(env or {})
        # libfabric 1.17's verbs MR cache registers every region writable by peers (and keeps
        # keys alive after deregistration): agents run without it unless the user chose a cache
        # setting (never overridden). See README, Security.
        proc_env = agent_fabric_env(proc_env)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=proc_env)
        line = self.proc.stdout.readline().decode(errors="replace").strip()
        if not line.startswith("RAYFABRICD_READY "):
            self.proc.wait(timeout=10)
            detail = f"exit status {self.proc.returncode}; see {self.log}"
            if line.startswith("RAYFABRICD_ERROR "):
                try:
                    err = json.loads(line.split(" ", 1)[1])
                    detail = f"{err['code']}: {err['error']}"
                except (ValueError, KeyError):
                    detail = line.split(" ", 1)[1]
            raise RuntimeError(f"rayfabricd did not start on node {node_hex[:12]}: {detail}")
        self.record = json.loads(line.split(" ", 1)[1])
        self.record.update({"node_id": node_hex, "log": self.log, "ip": ip})
        internal_kv._internal_kv_put(KV_PREFIX + node_hex, json.dumps(self.record), overwrite=True,
                                     namespace=NAMESPACE)

    def info(self):
        self.record["alive"] = self.proc.poll() is None
        return self.record

    def prefetch(self, wrapped_refs, claim=False, claim_wait_s=2.0):
        """Pulls call arguments bound for this node into its store by the fabric (rayfabric.args).
        claim=False: in the background, as soon as each exists; returns at once. The arguments
        exist and the call waits: claim="sealed" returns once they are read into this node's store
        (Ray's own pull then finds them here), or after claim_wait_s, the reads going on;
        claim=True returns once this node's agent has claimed them (created their replicas: Ray's
        pull does not wait for those, it moves the objects too)."""
        import concurrent.futures
        refs = wrapped_refs[0]
        if claim is True:
            try:
                # Answered within claim_wait_s (what is not claimed by then is left to race Ray's
                # pull); the reads themselves have the usual timeout.
                _pulls.prefetch(refs, timeout=_pulls.PULL_TIMEOUT_S, claim=True, answer_within_s=claim_wait_s)
            except Exception as e:  # noqa: BLE001 - counted; Ray's own pull delivers
                _pulls._fallback(f"argument prefetch failed: {type(e).__name__}: {e}", len(refs))
            return len(refs)

        def pull():
            try:
                _pulls.prefetch(refs, timeout=_pulls.PULL_TIMEOUT_S)
            except Exception as e:  # noqa: BLE001 - counted; Ray's own pull delivers
                _pulls._fallback(f"argument prefetch failed: {type(e).__name__}: {e}", len(refs))
        if claim != "sealed":
            self._background_reads.submit(pull)
            return len(refs)
        done = self._waited_reads.submit(pull)
        concurrent.futures.wait([done], timeout=claim_wait_s)
        return len(refs) if done.done() else 0  # 0: not all in yet (the read goes on)

    def prefetch_stats(self):
        """What this node's argument prefetches did (its rayfabric.stats())."""
        return _pulls.stats()

    def kill_agent(self, sig=9):
        """Tests: kill the rayfabricd process (not this actor)."""
        os.kill(self.proc.pid, sig)
        self.proc.wait(timeout=30)
        return self.proc.returncode

    def restart(self):
        """Relaunches rayfabricd if it died (tests; `rayfabric start` on a live cluster)."""
        if self.proc.poll() is None:
            return self.info()
        self._launch(*self.args)
        return self.info()

    def stop(self):
        if self.metrics is not None:
            self.metrics.stop()
        internal_kv._internal_kv_del(KV_PREFIX + self.record["node_id"], namespace=NAMESPACE)
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return True


def actor_name(node_hex):
    return f"rayfabric-agent-{node_hex}"


def _worker_env():
    """What the agent actor's worker needs to import this package and find the binaries."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": pkg_root + (os.pathsep + path if path else ""), "RAYFABRIC_BIN_DIR": bin_dir()}


def start_on(node_hex, provider=None, env=None):
    """Starts (or finds) the agent actor of one node; returns its record (address, provider...)."""
    actor = NodeAgent.options(
        name=actor_name(node_hex), namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        # Claims of call arguments (rayfabric.args) from many callers at once, each bounded.
        max_concurrency=16,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_hex, soft=False),
        runtime_env={"env_vars": _worker_env()}).remote(node_hex, provider, env)
    return ray.get(actor.info.remote(), timeout=120)


def actor_of(node_hex):
    return ray.get_actor(actor_name(node_hex), namespace=NAMESPACE)


def env_for(node_hex, env=None, node_env=None):
    """The agent environment of one node: `env` (every node) updated by `node_env[node_hex]`
    (e.g. {"RAYFABRIC_DOMAIN": "mlx5_1"} for one node); None when both are empty."""
    own = (node_env or {}).get(node_hex)
    if not own:
        return env
    return {**(env or {}), **own}


def _startup_error(e):
    """The agent's own one-line reason out of Ray's actor-creation error around it."""
    text = str(e)
    at = text.rfind("rayfabricd did not start on node")
    if at >= 0:
        return text[at:].splitlines()[0].replace("\x1b[39m", "").strip()
    return text.strip().splitlines()[-1] if text.strip() else type(e).__name__


def start_all(provider=None, env=None, node_env=None):
    """Starts agents on every alive node, in parallel; returns {node_hex: record}. A node whose
    agent cannot start (no usable provider, a bad setting) is recorded as unavailable with the
    reason and warned about: its objects move by Ray's own path. Raises only if no node could start
    one (then nothing would move by the fabric at all)."""
    records = {}
    errors = {}
    threads = []

    def one(node):
        try:
            records[node] = start_on(node, provider, env_for(node, env, node_env))
        except Exception as e:  # noqa: BLE001 - reported per node below
            errors[node] = _startup_error(e)
    for node in alive_nodes():
        t = threading.Thread(target=one, args=(node,))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    for node in records:
        internal_kv._internal_kv_del(KV_UNAVAILABLE + node, namespace=NAMESPACE)
    for node, e in errors.items():
        internal_kv._internal_kv_put(KV_UNAVAILABLE + node, str(e)[:1000], overwrite=True, namespace=NAMESPACE)
    if errors:
        msg = "; ".join(f"{n[:12]}: {e}" for n, e in errors.items())
        if not records:
            raise RuntimeError(f"rayfabric agents failed to start on {len(errors)} node(s): {msg}")
        print(f"rayfabric: WARNING: no agent on {len(errors)} node(s); their objects move by Ray's own "
              f"path: {msg}", file=sys.stderr)
    return records


def stop_all():
    for key in internal_kv._internal_kv_list(KV_UNAVAILABLE, namespace=NAMESPACE):
        internal_kv._internal_kv_del(key.decode() if isinstance(key, bytes) else key, namespace=NAMESPACE)
    stopped = 0
    for node in alive_nodes():
        try:
            actor = actor_of(node)
        except ValueError:
            continue
        try:
            ray.get(actor.stop.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - the actor may be gone with its node
            pass
        ray.kill(actor)
        stopped += 1
    return stopped


class NodeWatcher(threading.Thread):
    """Starts agents on nodes that join after init(), until shutdown() or until this process
    leaves Ray (ray.shutdown(): then it ends without a word; the next init() starts another)."""

    def __init__(self, provider, env, interval_s=2.0, node_env=None):
        super().__init__(daemon=True, name="rayfabric-node-watcher")
        self.provider, self.env, self.interval_s = provider, env, interval_s
        self.node_env = node_env
        self.stopped = threading.Event()

    def run(self):
        said = set()
        while not self.stopped.wait(self.interval_s):
            if not ray.is_initialized():
                return
            try:
                known = published()
                failed = unavailable()
                for node in alive_nodes():
                    if node not in known and node not in failed:
                        start_on(node, self.provider, env_for(node, self.env, self.node_env))
            except Exception as e:  # noqa: BLE001 - keep watching; say why once per failure
                if not ray.is_initialized():
                    return  # Ray shut down while this round ran: nothing to say
                if str(e) not in said:
                    said.add(str(e))
                    print(f"rayfabric: could not start an agent on a new node: {e}", file=sys.stderr)
                time.sleep(self.interval_s)
