"""Opt-in transparent mode: `ray.get` of remote plasma objects goes through the local agent.

In the driver:      rayfabric.transparent.enable()
In every worker:    ray.init(..., runtime_env={"worker_process_setup_hook":
                                              "rayfabric.transparent.enable"})
                    (or rayfabric.transparent.runtime_env() merged into yours)

Explicit ray.get calls are routed, and so are the ObjectRef arguments of calls whose destination
node is known at submission (actor method calls, node-affinity and placement-group tasks:
rayfabric.args), and the objects of ray.wait(..., fetch_local=True) (Ray Data's prefetcher,
ActorPool: rayfabric.waits); any failure falls back to Ray's path, so results are always what Ray
returns. Off in a process: RAYFABRIC_ARGS=0 (arguments), RAYFABRIC_WAITS=0 (waits)."""
import os

import ray

from rayfabric import _kv, _paths, _pulls, api, settings

_original_get = None


def _get(object_refs, *, timeout=None, **ray_options):
    """ray.get in transparent mode. `ray_options`: Ray's own keywords (Ray 2.60's
    _use_object_store, an RDT object by the object store), passed on; a get that sets one is Ray's
    alone."""
    refs = object_refs
    if _original_get is None:  # disabled: a reference to _get kept from before is Ray's get
        return _pulls._ray_get(object_refs, timeout=timeout, **ray_options)
    if not any(ray_options.values()) and (isinstance(refs, ray.ObjectRef) or (isinstance(refs, (list, tuple)) and refs and
                                                                all(isinstance(r, ray.ObjectRef) for r in refs))):
        try:
            api.prefetch(refs, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - never break ray.get
            _pulls._fallback(f"transparent prefetch failed: {type(e).__name__}: {e}")
    return _original_get(object_refs, timeout=timeout, **ray_options)


def enable(arguments=True, waits=True, record=None):
    """Routes ray.get through rayfabric in this process, (arguments=True) asks the destination
    node of each call with a known one to pull its ObjectRef arguments, and (waits=True) pulls
    what ray.wait(fetch_local=True) waits for by the fabric (idempotent). In a driver, its job's
    record for `rayfabric status` says it is on (`record`: how; the start-up hook says its own)."""
    global _original_get
    # Read first (the settings of the hooks included): a bad value refuses before anything is replaced.
    waits = waits and settings.get("waits")
    arguments = arguments and settings.get("args")
    if arguments:
        from rayfabric import args
    try:
        if _original_get is None:
            _original_get = _pulls._ray_get
            ray.get = _get
        if arguments:
            args.install()
        if waits:
            from rayfabric import waits as waits_hook
            waits_hook.install()
    except BaseException:
        disable()  # all or nothing: a half-installed hook would contradict the job's record
        raise
    _record_driver(record or "on: rayfabric.transparent.enable()")
    return True


def _record_driver(mode):
    """A driver's job says in the cluster's KV that it has transparent mode (`rayfabric status`)."""
    try:
        if _kv.connected_driver():
            _kv.record_job(mode)
    except Exception as e:  # noqa: BLE001 - a missing record changes no transfer
        _pulls.log.debug("rayfabric: the job's record was not written: %s", e)


def disable():
    global _original_get
    if _original_get is not None:
        ray.get = _original_get
        _original_get = None
    from rayfabric import args, waits
    args.uninstall()
    waits.uninstall()


def enabled():
    return _original_get is not None


def runtime_env():
    """A runtime_env that turns transparent mode on in every worker of a job."""
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH", "")
    return {"worker_process_setup_hook": "rayfabric.transparent.enable",
            "env_vars": {"PYTHONPATH": pkg_root + (os.pathsep + path if path else ""),
                         "RAYFABRIC_BIN_DIR": _paths.bin_dir()}}
