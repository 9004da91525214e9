"""What the start-up hook (python/_rayfabric_autoload.py, beside the package) shares with the
library about rayfabric's records in Ray's KV: their names, the record parser, and a driver's job
record (`job:<id>`: whether transparent mode is on in the job, which `rayfabric status` lists and
the job's workers read an opt-out from).

The standard library only at import, Ray inside the functions, nothing else of rayfabric: the hook
loads this file on its own (without the package, whose import brings the whole library) once a
process has imported Ray, and the library imports it as rayfabric._kv. The package never imports
the hook: its imports run one way, from the hook into the package."""
import json
import os
import sys
import time

NAMESPACE = "rayfabric"
KV_PREFIX = "agent:"  # an agent's record: where it listens (written by rayfabric._agents)
KV_JOB_PREFIX = "job:"  # a driver's job: whether transparent mode is on in it (rayfabric status)


def parse_record(value):
    """A record from the cluster's KV as a dict, or None for one that is not (anyone who reaches the
    KV can write there: a garbled or forged value counts as none, never fatal to its readers)."""
    try:
        record = json.loads(value) if value else None
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def job_record(job_id):
    """The record of job `job_id` ({} where there is none, or none that parses)."""
    from ray.experimental import internal_kv
    return parse_record(internal_kv._internal_kv_get(KV_JOB_PREFIX + job_id, namespace=NAMESPACE)) or {}


def connected_driver():
    """This process is a Ray driver connected to its cluster (not a worker, not Ray Client's)."""
    import ray
    worker = ray._private.worker.global_worker
    return getattr(worker, "mode", None) == ray._private.worker.SCRIPT_MODE \
        and getattr(worker, "core_worker", None) is not None and ray.is_initialized()


def record_job(mode, opted_out=None):
    """This driver's job in the cluster's KV, for `rayfabric status` and for the job's workers:
    whether transparent mode is on and how (a driver's own transparent.enable() records itself
    too), and (opted_out; None: as the record said) whether the job turned autoload off, which its
    workers read."""
    import ray
    from ray.experimental import internal_kv
    context = ray.get_runtime_context()
    job_id = context.get_job_id()
    if opted_out is None:
        opted_out = bool(job_record(job_id).get("autoload_off"))
    record = {"job_id": job_id, "mode": mode, "autoload_off": opted_out, "node_id": context.get_node_id(),
              "pid": os.getpid(), "entrypoint": " ".join(sys.argv)[:200] or "(interactive)",
              "started": time.time()}
    internal_kv._internal_kv_put(KV_JOB_PREFIX + record["job_id"], json.dumps(record), overwrite=True,
                                 namespace=NAMESPACE)
