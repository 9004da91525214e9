"""rayfabric in Ray's own metrics: what the agents and `rayfabric.get` do appears on each node's
Prometheus endpoint (the node's metrics export port, next to Ray's object manager metrics; Ray
prefixes every name with `ray_`, counters end in `_total`), and so in Ray's Grafana.

From each node's agent (polled by the NodeAgent actor that hosts it, every
RAYFABRIC_METRICS_INTERVAL_S seconds, 5 by default, 0 = off), tagged with the node:
  rayfabric_objects_pulled, rayfabric_bytes_pulled    objects / bytes read by the fabric and sealed
  rayfabric_pulls{outcome}                            pulled, failed, stood_aside, already_local
  rayfabric_leases{event}                             granted, released, expired, refused
  rayfabric_bytes_served                              bytes leased to peers (what they read)
  rayfabric_requests_refused{why}                     rejected (malformed), unauthenticated
  rayfabric_endpoint_resets                           endpoints closed to cut off failed transfers
  rayfabric_leases_active, rayfabric_pinned_bytes     gauges: leases held by peers now, their bytes
  rayfabric_peer_bytes_pulled{peer,provider}          per source agent, with the provider the pair uses
  rayfabric_peer_pulls_failed{peer,provider}
  rayfabric_rail_bytes_read{provider,domain,rail}     per engine (one per NIC)
From every process that calls rayfabric.get:
  rayfabric_get_seconds{path}                         histogram of get latency; path: fabric (at least
                                                      one object moved by the fabric) or ray
  rayfabric_fallbacks{reason}                         objects sent to Ray's path, by reason (its text
                                                      before the first ':' and the error's name after
                                                      it if any, ids masked: reason_class)
A Grafana dashboard over these: docs/grafana-rayfabric.json."""
import logging
import re
import threading

from rayfabric import settings

log = logging.getLogger("rayfabric")

INTERVAL_S = settings.get("metrics_interval_s")

# The agent's counter (StatusReply.counters, by name) -> (metric, extra tags, description)
_AGENT_COUNTERS = (
    ("objects_pulled", "rayfabric_objects_pulled", {}, "objects this node's agent read by the fabric and sealed"),
    ("bytes_pulled", "rayfabric_bytes_pulled", {}, "bytes this node's agent read by the fabric and sealed"),
    ("objects_pulled", "rayfabric_pulls", {"outcome": "pulled"}, "pulls by outcome"),
    ("pulls_failed", "rayfabric_pulls", {"outcome": "failed"}, "pulls by outcome"),
    ("pulls_stood_aside", "rayfabric_pulls", {"outcome": "stood_aside"}, "pulls by outcome"),
    ("pulls_already_local", "rayfabric_pulls", {"outcome": "already_local"}, "pulls by outcome"),
    ("leases_granted", "rayfabric_leases", {"event": "granted"}, "leases by event"),
    ("leases_released", "rayfabric_leases", {"event": "released"}, "leases by event"),
    ("leases_expired", "rayfabric_leases", {"event": "expired"}, "leases by event"),
    ("leases_refused", "rayfabric_leases", {"event": "refused"}, "leases by event"),
    ("bytes_leased", "rayfabric_bytes_served", {}, "bytes of objects leased to peers (what they read)"),
    ("requests_rejected", "rayfabric_requests_refused", {"why": "rejected"}, "requests refused"),
    ("requests_unauthenticated", "rayfabric_requests_refused", {"why": "unauthenticated"}, "requests refused"),
    ("endpoint_resets", "rayfabric_endpoint_resets", {}, "endpoints closed to cut off failed transfers"),
)
_AGENT_GAUGES = (
    ("leases_active", "rayfabric_leases_active", "leases peers hold on this node's objects now"),
    ("pinned_bytes", "rayfabric_pinned_bytes", "bytes of this node's objects pinned by leases now"),
)
_GET_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60]


class _Deltas:
    """Ray's counters take increments; the agent reports totals (which restart at 0 with it)."""

    def __init__(self):
        self.last = {}

    def __call__(self, key, total):
        prev = self.last.get(key, 0)
        self.last[key] = total
        return total if total < prev else total - prev


class AgentExporter:
    """Mirrors one node's agent counters into Ray's metrics, from the process hosting it."""

    def __init__(self, node_hex, status_fn, interval_s=INTERVAL_S):
        from ray.util import metrics
        self.node = node_hex[:12]
        self.status_fn = status_fn
        self.interval_s = interval_s
        self.delta = _Deltas()
        self.counters = {}
        for _, name, tags, desc in _AGENT_COUNTERS:
            if name not in self.counters:
                self.counters[name] = metrics.Counter(name, description=desc, tag_keys=("node", *tags))
        self.gauges = {name: metrics.Gauge(name, description=desc, tag_keys=("node",))
                       for _, name, desc in _AGENT_GAUGES}
        self.peer_bytes = metrics.Counter("rayfabric_peer_bytes_pulled", tag_keys=("node", "peer", "provider"),
                                          description="bytes pulled from each source agent")
        self.peer_failed = metrics.Counter("rayfabric_peer_pulls_failed", tag_keys=("node", "peer", "provider"),
                                           description="failed pulls from each source agent")
        self.rail_bytes = metrics.Counter("rayfabric_rail_bytes_read", tag_keys=("node", "provider", "domain", "rail"),
                                          description="bytes read by each engine (one per NIC)")
        self._stop = threading.Event()
        self._warned = False
        self._thread = threading.Thread(target=self._loop, name="rayfabric-metrics", daemon=True)
        self._thread.start()

    def _inc(self, metric, key, total, tags):
        n = self.delta(key, total)
        if n > 0:
            metric.inc(n, tags=tags)

    def export(self, s):
        node = {"node": self.node}
        values = {c.name: c.value for c in s.counters}  # a name this agent lacks reads as 0
        for field, name, tags, _ in _AGENT_COUNTERS:
            self._inc(self.counters[name], (name, field), values.get(field, 0), {**node, **tags})
        for field, name, _ in _AGENT_GAUGES:
            self.gauges[name].set(values.get(field, 0), tags=node)
        for link in s.peer_links:
            tags = {**node, "peer": link.peer, "provider": link.provider or "none"}
            self._inc(self.peer_bytes, ("peer_bytes", link.peer, link.provider), link.bytes_pulled, tags)
            self._inc(self.peer_failed, ("peer_failed", link.peer, link.provider), link.pulls_failed, tags)
        for rail in s.rails:
            tags = {**node, "provider": rail.provider, "domain": rail.domain, "rail": str(rail.rail)}
            self._inc(self.rail_bytes, ("rail", rail.provider, rail.domain), rail.bytes_read, tags)

    def _loop(self):
        while not self._stop.wait(self.interval_s):
            try:
                self.export(self.status_fn())
            except Exception as e:  # noqa: BLE001 - an agent restarting, a dead one: next round
                if not self._warned:
                    self._warned = True
                    log.warning("rayfabric: metrics of node %s not exported this round: %s", self.node, e)

    def stop(self):
        self._stop.set()


_get_metrics = None
_get_lock = threading.Lock()


def _worker_metrics():
    """The get-side metrics, made once per process (None outside a Ray process, or if Ray's metrics
    cannot be made)."""
    global _get_metrics
    with _get_lock:
        if _get_metrics is None:
            try:
                from ray.util import metrics
                _get_metrics = (
                    metrics.Histogram("rayfabric_get_seconds", boundaries=_GET_BUCKETS, tag_keys=("path",),
                                      description="rayfabric.get latency; path fabric: it moved at least "
                                                  "one object by the fabric"),
                    metrics.Counter("rayfabric_fallbacks", tag_keys=("reason",),
                                    description="objects rayfabric.get left to Ray's own transfer, by reason"))
            except Exception:  # noqa: BLE001 - not in a Ray process: nothing to export to
                _get_metrics = ()
        return _get_metrics or None


_IDS = re.compile(r"[0-9a-f]{8,}")
# "pull failed: Unavailable: ...", "argument prefetch failed: TypeError: ...": the error's name.
_ERROR_NAME = re.compile(r"\s*([A-Z][A-Za-z0-9_.]*)\s*:")


def reason_class(reason):
    """A bounded label for a fallback reason: its text before the first ':' (and the error's name
    when one follows: "pull failed: Unavailable"), ids masked, at most 80 characters. Also what
    each worker reports to its node's agent (`rayfabric status`)."""
    head, _, rest = reason.partition(":")
    name = _ERROR_NAME.match(rest)
    if name:
        head = f"{head.strip()}: {name.group(1)}"
    return _IDS.sub("*", head.strip())[:80] or "unknown"


def observe_get(seconds, via_fabric):
    m = _worker_metrics()
    if m:
        m[0].observe(seconds, tags={"path": "fabric" if via_fabric else "ray"})


def count_fallback(reason, count):
    m = _worker_metrics()
    if m and count > 0:
        m[1].inc(count, tags={"reason": reason_class(reason)})


def ray_bytes_received(node, timeout=2.0):
    """Bytes Ray's own object manager on `node` (a ray.nodes() entry) received from other nodes
    since its raylet started (its ray_object_manager_bytes{Type="Received"} gauge, thrown-away
    chunks included), read from the node's Prometheus endpoint; None where that endpoint or the
    metric is not there (a cluster without Ray's metrics agent, or before its first report)."""
    import urllib.request

    port = node.get("MetricsExportPort")
    if not port:
        return None
    try:
        text = urllib.request.urlopen(f"http://{node['NodeManagerAddress']}:{port}/metrics",
                                      timeout=timeout).read().decode()
        total = None
        for line in text.splitlines():
            m = re.match(r'^ray_object_manager_bytes\{(.*)\} (\S+)$', line)
            if m and 'Type="Received"' in m.group(1):
                total = (total or 0.0) + float(m.group(2))
        return None if total is None else int(total)
    except Exception:  # noqa: BLE001 - any broken or odd endpoint: unknown, never a failed status
        return None
