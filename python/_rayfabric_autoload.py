"""Transparent mode in every Ray job, with no change to the job (issue 30).

The installed package puts `rayfabric-autoload.pth` into site-packages; Python runs its one line
at start-up in every process of that environment: `import _rayfabric_autoload` (this file: the
standard library only, no Ray, no rayfabric) and at_startup(), which puts a finder in front of
sys.meta_path that waits for `import ray`. Nothing else happens in a process that never imports
Ray, and the finder leaves once Ray is imported. When Ray has been imported:

- in a Ray worker process (Ray's default_worker.py): the worker's setup hook (the one
  `runtime_env={"worker_process_setup_hook": ...}` sets, an environment variable Ray reads after
  the worker connects) becomes worker_setup() below, which first runs the job's own setup hook if
  it has one, then turns transparent mode on if the cluster has rayfabric agents;
- in any other process: ray.init is wrapped; once it has connected a driver, driver_setup() turns
  transparent mode on if the cluster has agents, and writes the job's record (`rayfabric status`
  lists which jobs have it).

A cluster without agents sees no change: one read of the cluster's KV per process, then nothing
(no rayfabric import, no message). A job opts out with RAYFABRIC_AUTOLOAD=0 in its driver's
environment or in its runtime_env's env_vars: either way the driver and all the job's workers
stay Ray's alone (the driver's setting reaches the workers through the job's runtime_env:
Ray's RAY_RUNTIME_ENV_HOOK, set only while that ray.init runs). rayfabric.transparent.enable()
still turns it on where a program asks for it. Not reached: `python -S`/`-I` (no site-packages
start-up), drivers under `uv run` (Ray skips runtime-env hooks there), Ray Client's client side."""
import os
import sys

SWITCH = "RAYFABRIC_AUTOLOAD"
KV_NAMESPACE = "rayfabric"  # rayfabric._agents keeps its records under these
KV_AGENT_PREFIX = "agent:"
KV_JOB_PREFIX = "job:"
_WORKER_HOOK = "_rayfabric_autoload.worker_setup"
_ENV_HOOK = "_rayfabric_autoload.runtime_env_hook"
_CHAINED_SETUP = "RAYFABRIC_AUTOLOAD_CHAINED_SETUP_HOOK"    # the job's own worker setup hook
_CHAINED_ENV_HOOK = "RAYFABRIC_AUTOLOAD_CHAINED_ENV_HOOK"  # a RAY_RUNTIME_ENV_HOOK set before ours
_OFF_VALUES = ("0", "false", "no", "off")
_ON_VALUES = ("", "1", "true", "yes", "on")
_said = set()


def at_startup():
    """From the .pth file: never raises, costs one environment read and one list insert."""
    try:
        if "ray" not in sys.modules and not any(isinstance(f, _RayFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _RayFinder())
    except Exception:  # noqa: BLE001 - a start-up hook must never break Python
        pass


def off(env):
    """Whether RAYFABRIC_AUTOLOAD in `env` (a mapping) turns autoload off. A value that is neither
    on nor off is off, said once: a typo must not turn on what the job tried to turn off."""
    value = str(env.get(SWITCH, "1")).strip().lower()
    if value in _ON_VALUES:
        return False
    if value not in _OFF_VALUES:
        _say(f"{SWITCH}={value!r} is neither 1 nor 0: transparent mode stays off "
             f"(use {SWITCH}=1, the default, or {SWITCH}=0)")
    return True


def _say(message):
    if message not in _said:
        _said.add(message)
        print("rayfabric: " + message, file=sys.stderr)


class _RayFinder:
    """Finds nothing itself: for `ray` it asks the finders behind it and wraps the loader so that
    _after_ray_import runs once `ray` has been executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "ray":
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_hook(module):
            exec_module(module)
            try:
                _after_ray_import(module)
            except Exception as e:  # noqa: BLE001 - Ray works as if rayfabric were not installed
                _say(f"transparent mode not set up in this process: {type(e).__name__}: {e}")

        loader.exec_module = exec_then_hook
        return spec


def _after_ray_import(ray):
    if os.path.basename(sys.argv[0] if sys.argv else "") == "default_worker.py":
        from ray._private import ray_constants
        name = getattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", None)
        if name is None:  # a Ray without worker setup hooks (< 2.8)
            return
        theirs = os.environ.get(name)
        if theirs and theirs != _WORKER_HOOK:
            os.environ[_CHAINED_SETUP] = theirs
        os.environ[name] = _WORKER_HOOK
        return
    init = getattr(ray, "init", None)
    if init is None or getattr(init, "_rayfabric_autoload", False):
        return
    import functools

    @functools.wraps(init)
    def autoload_init(*args, **kwargs):
        # Turned off in the driver's environment: the job's runtime_env carries it to the workers.
        hook_set = off(os.environ) and _set_env_hook()
        try:
            context = init(*args, **kwargs)
        finally:
            if hook_set:
                _unset_env_hook()
        driver_setup()
        return context

    autoload_init._rayfabric_autoload = True
    ray.init = autoload_init


def _set_env_hook():
    theirs = os.environ.get("RAY_RUNTIME_ENV_HOOK")
    if theirs == _ENV_HOOK:
        return False
    if theirs:
        os.environ[_CHAINED_ENV_HOOK] = theirs
    os.environ["RAY_RUNTIME_ENV_HOOK"] = _ENV_HOOK
    return True


def _unset_env_hook():
    theirs = os.environ.pop(_CHAINED_ENV_HOOK, None)
    if theirs:
        os.environ["RAY_RUNTIME_ENV_HOOK"] = theirs
    else:
        os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)


def runtime_env_hook(runtime_env):
    """RAY_RUNTIME_ENV_HOOK while an opted-out driver's ray.init runs: the job's runtime_env gets
    RAYFABRIC_AUTOLOAD=0 (unless it says otherwise), so that its workers stay Ray's too."""
    theirs = os.environ.get(_CHAINED_ENV_HOOK)
    if theirs:
        module, _, attr = theirs.rpartition(".")
        runtime_env = getattr(__import__(module, fromlist=[attr]), attr)(runtime_env)
    env = dict(runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    env_vars.setdefault(SWITCH, "0")
    env["env_vars"] = env_vars
    return env


def worker_setup():
    """The worker setup hook of every Ray worker (see the module's doc)."""
    from ray._private import ray_constants
    name = ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR
    theirs = os.environ.pop(_CHAINED_SETUP, None)
    # What the worker's children inherit is what Ray gave it.
    if theirs:
        os.environ[name] = theirs
    else:
        os.environ.pop(name, None)
    if theirs:
        from ray._private.runtime_env.setup_hook import load_and_execute_setup_hook
        error = load_and_execute_setup_hook(theirs)
        if error is not None:
            raise RuntimeError(error)  # Ray ends the worker with the job's own hook's error
    if not off(os.environ):
        _turn_on() or _arm()


def driver_setup():
    """After ray.init has connected a driver: transparent mode on where the cluster has agents,
    and the job's record for `rayfabric status`. Never raises."""
    try:
        import ray
        worker = ray._private.worker.global_worker
        if getattr(worker, "mode", None) != ray._private.worker.SCRIPT_MODE or getattr(worker, "core_worker", None) is None:
            return  # Ray Client, or not connected
        if (ray.get_runtime_context().namespace or "").startswith("rayfabric"):
            return  # rayfabric's own commands (rayfabric-cli, rayfabric-bench) choose for themselves
        job_env = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
        why_off = next((where for where, env in (("the driver's environment", os.environ),
                                                  ("the job's runtime_env", job_env)) if off(env)), None)
        if not _agents_published():
            if why_off is None:
                _arm()  # a cluster without rayfabric: nothing changes unless agents start later
            return
        on = why_off is None and _turn_on()
        record_job("on: the installed package (autoload)" if on else
                   f"off: {SWITCH}=0 in {why_off}" if why_off else "off: transparent mode could not start")
    except Exception as e:  # noqa: BLE001 - the job runs on Ray's path
        _say(f"transparent mode not turned on in this driver: {type(e).__name__}: {e}")


def _agents_published():
    from ray.experimental import internal_kv
    return bool(internal_kv._internal_kv_list(KV_AGENT_PREFIX, namespace=KV_NAMESPACE))


# A process that found no agents (a worker Ray started before `rayfabric start`, or long before
# its job: Ray prestarts workers) looks again at its first ray.get or ray.wait, waiting at most
# _FIRST_WAIT_S for the cluster's KV (else that call is Ray's); after that in the background, the
# caller never waits, every _RECHECK_FIRST_S at first, doubling up to _RECHECK_MAX_S.
_FIRST_WAIT_S = 1.0
_RECHECK_FIRST_S = 5.0
_RECHECK_MAX_S = 60.0
_armed = {"originals": {}, "at": 0.0, "every": 0.0, "check": None}


def _arm():
    """ray.get and ray.wait, unchanged, but each looks (see _RECHECK_S) whether agents have started;
    once they have, transparent mode replaces both. The wrappers keep Ray's names and module."""
    import functools

    import ray
    _armed.update(at=0.0, every=0.0)  # the first call looks at once: a worker may wait long for its first task
    for name in ("get", "wait"):
        original = getattr(ray, name)
        if getattr(original, "_rayfabric_original", None) is not None:
            continue
        _armed["originals"][name] = original

        def armed(*args, _name=name, _original=original, **kwargs):
            current = getattr(ray, _name)
            if getattr(current, "_rayfabric_original", None) is None:
                return current(*args, **kwargs)  # transparent mode took over (a reference kept from before)
            _look_again()
            current = getattr(ray, _name)
            target = _original if getattr(current, "_rayfabric_original", None) is not None else current
            return target(*args, **kwargs)

        functools.update_wrapper(armed, original)
        armed._rayfabric_original = original
        setattr(ray, name, armed)


def _disarm():
    import ray
    for name, original in _armed["originals"].items():
        if getattr(getattr(ray, name), "_rayfabric_original", None) is original:
            setattr(ray, name, original)
    _armed["originals"].clear()


def _look_again():
    import threading
    import time
    with _armed.setdefault("lock", threading.Lock()):
        first = _armed["every"] == 0.0
        if _armed["check"] is not None or time.monotonic() - _armed["at"] < _armed["every"]:
            return
        _armed["every"] = min(_RECHECK_MAX_S, 2 * _armed["every"] or _RECHECK_FIRST_S)
        check = threading.Thread(target=_check_and_turn_on, name="rayfabric-autoload", daemon=True)
        _armed["check"] = check
        check.start()
    if first:
        check.join(_FIRST_WAIT_S)


def _check_and_turn_on():
    try:
        if _agents_published():
            _disarm()
            on = _turn_on()
            import ray
            if on and ray._private.worker.global_worker.mode == ray._private.worker.SCRIPT_MODE:
                record_job("on: the installed package (autoload; agents started after the driver)")
    except Exception as e:  # noqa: BLE001 - Ray's path
        _say(f"transparent mode not turned on in this process: {type(e).__name__}: {e}")
    finally:
        import time
        _armed.update(at=time.monotonic(), check=None)


def _turn_on():
    try:
        if not _agents_published():
            return False
        from rayfabric import transparent
        return bool(transparent.enable())
    except Exception as e:  # noqa: BLE001 - Ray's path, said once
        _say(f"transparent mode not turned on in this process: {type(e).__name__}: {e}")
        return False


def record_job(mode):
    """This driver's job in the cluster's KV, for `rayfabric status`: whether transparent mode is
    on and how (a driver's own transparent.enable() records itself too)."""
    import json
    import time

    import ray
    from ray.experimental import internal_kv
    context = ray.get_runtime_context()
    record = {"job_id": context.get_job_id(), "mode": mode, "node_id": context.get_node_id(),
              "pid": os.getpid(), "entrypoint": " ".join(sys.argv)[:200] or "(interactive)",
              "started": time.time()}
    internal_kv._internal_kv_put(KV_JOB_PREFIX + record["job_id"], json.dumps(record), overwrite=True,
                                 namespace=KV_NAMESPACE)
