"""The agents' records in Ray's internal KV (namespace `rayfabric`): where each node's agent
listens (`agent:<node>`), the nodes where none could start and why (`unavailable:<node>`), and the
running jobs that said whether transparent mode is on in them (`job:<id>`). Read by whoever pulls
(rayfabric._pulls) and by `rayfabric status`; written by the agents' launcher (rayfabric._agents) and
the start-up hook. Records of nodes or jobs that are gone are deleted as they are read."""
import ray
from ray.experimental import internal_kv

# The names the start-up hook reads and writes too, and the one record parser (rayfabric._kv).
from rayfabric._kv import KV_JOB_PREFIX, KV_PREFIX, NAMESPACE, parse_record

# Nodes where no agent could start (e.g. no provider that reaches other hosts), with the reason:
# gets that involve them go Ray's path at once and say why.
KV_UNAVAILABLE = "unavailable:"


def alive_nodes():
    return [n["NodeID"] for n in ray.nodes() if n["Alive"]]


def unavailable():
    """{node_hex: why} of alive nodes where no agent could start."""
    alive = set(alive_nodes())
    out = {}
    for key in internal_kv._internal_kv_list(KV_UNAVAILABLE, namespace=NAMESPACE):
        key = key.decode() if isinstance(key, bytes) else key
        node = key[len(KV_UNAVAILABLE):]
        value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
        if node in alive and value:
            out[node] = value.decode(errors="replace") if isinstance(value, bytes) else value
    return out


def _live_records(prefix, keys, alive, required=()):
    """{name: record} of the KV's `keys` under `prefix` whose name is in `alive`; the others are
    deleted (what they describe has gone). Passed over: a value that is not a record, or one whose
    `required` fields are not strings (anyone who reaches the KV can write there)."""
    out = {}
    for key in keys:
        key = key.decode() if isinstance(key, bytes) else key
        if key[len(prefix):] not in alive:
            internal_kv._internal_kv_del(key, namespace=NAMESPACE)
            continue
        record = parse_record(internal_kv._internal_kv_get(key, namespace=NAMESPACE))
        if record is not None and all(isinstance(record.get(f), str) for f in required):
            out[key[len(prefix):]] = record
    return out


def published():
    """{node_hex: record} of every agent that published its address, on nodes still alive (the
    records of nodes that left are deleted: their agents went with them)."""
    alive = set(alive_nodes())
    return _live_records(KV_PREFIX, internal_kv._internal_kv_list(KV_PREFIX, namespace=NAMESPACE), alive,
                         required=("address", "local_socket"))


def jobs():
    """[record] of the running jobs whose drivers said whether transparent mode is on in them
    (rayfabric._kv.record_job), oldest first; the records of jobs that ended are deleted."""
    # The records first, then the job table: a job that starts in between is not taken for ended.
    keys = internal_kv._internal_kv_list(KV_JOB_PREFIX, namespace=NAMESPACE)
    try:
        alive = {j["JobID"] for j in ray._private.state.state.job_table() if not j.get("IsDead")}
    except Exception:  # noqa: BLE001 - the job table unreadable: say nothing rather than guess
        return []
    # (Each listed under the job its key names, whatever its record says.)
    records = [dict(r, job_id=job) for job, r in _live_records(KV_JOB_PREFIX, keys, alive).items()]
    return sorted(records, key=lambda r: r["started"] if isinstance(r.get("started"), (int, float)) else 0)
