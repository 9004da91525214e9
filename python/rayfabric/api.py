"""rayfabric's Python API: init / get / prefetch / broadcast / status / stats / shutdown (see the
package docstring). Agents are started by rayfabric._agents, objects moved by rayfabric._pulls,
broadcast in rayfabric._broadcast; this module composes them."""
import ray

from rayfabric import _agents, _pulls, _records
from rayfabric import agent_pb2 as pb
from rayfabric._broadcast import broadcast
from rayfabric._client import counters, exposure_name
from rayfabric._pulls import get, prefetch, stats

__all__ = ["broadcast", "get", "init", "prefetch", "shutdown", "stats", "status"]  # the API (rayfabric's __init__)
_watcher = None


def init(provider=None, watch_new_nodes=True, env=None, node_env=None):
    """Makes sure an agent runs on every alive node (and, with watch_new_nodes, on nodes that join
    later). Call after ray.init(). `env`: extra environment of every agent (RAYFABRIC_*, FI_*);
    `node_env`: {node_id_hex: {VAR: value}} merged over `env` for that node's agent only (e.g. a
    different RAYFABRIC_DOMAIN per node). Returns {node_id_hex: agent record}."""
    global _watcher
    if not ray.is_initialized():
        raise RuntimeError("rayfabric.init() needs a connected Ray: call ray.init() first")
    records = _agents.start_all(provider, env, node_env)
    if watch_new_nodes and (_watcher is None or not _watcher.is_alive()):
        _watcher = _agents.NodeWatcher(provider, env, node_env=node_env)
        _watcher.start()
    _pulls.refresh_agents()
    return records


def shutdown():
    """Stops the agents of every node (the cluster keeps running)."""
    global _watcher
    if _watcher is not None:
        _watcher.stopped.set()
        _watcher = None
    _pulls.forget_agents()
    return _agents.stop_all()


def status(timeout=10):
    """{"agents": {node_hex: {counters...}}, "jobs": [running jobs that said whether transparent
    mode is on in them], "local": stats()} from every published agent."""
    out = {}
    for node, rec in _agents.published().items():
        try:
            s = _pulls._client(rec["address"]).status(timeout=timeout)
            d = dict(counters(s))  # a plain dict, as for a dead agent
            d.update({"address": rec["address"], "provider": s.info.provider, "domain": s.info.domain,
                      "pid": s.info.pid, "alive": True, "uptime_ms": s.uptime_ms,
                      "exposure": exposure_name(s.info.exposure),
                      "token_auth": s.info.token_auth, "tls": s.info.tls,
                      "fabrics": [{"provider": f.provider, "domain": f.domain, "rdma": f.rdma,
                                   "exposure": exposure_name(f.exposure),
                                   "rail_domains": list(f.rail_domains),
                                   "address": f.address.hex()}
                                  for f in s.info.fabrics],
                      "rails": [{f.name: getattr(r, f.name) for f in pb.RailStat.DESCRIPTOR.fields}
                                for r in s.rails],
                      "peer_links": [{f.name: getattr(link, f.name) for f in pb.PeerLink.DESCRIPTOR.fields}
                                     for link in s.peer_links],
                      # objects this node's processes left to Ray's path: in all ("fallbacks"), by reason
                      "fallback_reasons": {f.reason: f.objects for f in s.fallback_reasons}})
        except Exception as e:  # noqa: BLE001 - report the dead agent, keep going
            d = {"address": rec["address"], "alive": False, "error": str(e)[:200]}
        out[node] = d
    for node, why in _agents.unavailable().items():
        out.setdefault(node, {"alive": False, "error": "no agent could start here: " + why[:300]})
    _coverage(out)
    return {"agents": out, "jobs": _records.jobs(), "local": stats()}


def _coverage(agents):
    """Per node with a live agent: the bytes Ray's own object manager received there
    ("ray_bytes_received", Ray's metric, None where it cannot be read) beside the fabric's, and
    "coverage" = fabric / (fabric + Ray's) of the bytes that came into the node from others, since
    the agent and the raylet started (None while nothing came in, or Ray's metric is unknown)."""
    import concurrent.futures

    from rayfabric import metrics

    live = [node for node, d in agents.items() if d.get("alive")]
    for node in live:
        agents[node].update(ray_bytes_received=None, coverage=None)
    try:
        nodes = {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}
    except Exception:  # noqa: BLE001 - the GCS unreachable: Ray's side unknown
        return
    # All nodes at once, 3 s in all: a node whose endpoint hangs is left unknown.
    pool = concurrent.futures.ThreadPoolExecutor(max(1, min(16, len(live))))
    futures = {pool.submit(metrics.ray_bytes_received, nodes[node]): node for node in live if node in nodes}
    done, _ = concurrent.futures.wait(futures, timeout=3.0)
    pool.shutdown(wait=False)
    for future in done:
        d, received = agents[futures[future]], future.result()
        moved = None if received is None else d["bytes_pulled"] + received
        d.update(ray_bytes_received=received, coverage=d["bytes_pulled"] / moved if moved else None)
