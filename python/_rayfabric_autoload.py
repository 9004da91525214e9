"""Transparent mode in every Ray job, with no change to the job (issue 30).

The installed package puts `rayfabric-autoload.pth` into site-packages; Python runs its one line
at start-up in every process of that environment: `import _rayfabric_autoload` (this file: the
standard library only, no Ray, no rayfabric) and at_startup(), which puts a finder in front of
sys.meta_path that waits for `import ray` (for any other import it compares one name). Nothing
else happens in a process that never imports Ray. Once Ray's package has been executed (rayfabric's
records in the KV, their names and a driver's job record, are read and written with
rayfabric/_kv.py, the standard library only, which this file loads on its own, not the package;
the package never imports this file):

- in a Ray worker process (Ray's default_worker.py): the worker's setup hook (the environment
  variable through which Ray runs a job's `worker_process_setup_hook` once the worker has
  connected) becomes worker_setup() below, which first runs the job's own setup hook if it has
  one, then wraps ray.get/ray.wait: at the worker's first call of either (inside a task, when its
  job is known) they turn transparent mode on if the cluster has rayfabric agents and the job did
  not opt out;
- in any other process: ray.init is wrapped; once it has connected a driver, driver_setup() turns
  transparent mode on if the cluster has agents, and writes the job's record (`rayfabric status`
  lists which jobs have it, and the job's workers read an opt-out from it).

A cluster without agents sees no change in behaviour: one read of the cluster's KV per process
(a driver's at connect, a worker's at its first ray.get/ray.wait), no import of the rayfabric package
(rayfabric/_kv.py alone, the standard library), no message,
the job's runtime_env untouched. A job opts out with
RAYFABRIC_AUTOLOAD=0 in its driver's environment (the driver's record then says so to the job's
workers, which read it before they turn anything on) or in its runtime_env's env_vars (the
workers' own environment). rayfabric.transparent.enable() still turns it on where a program asks.
Left alone: Ray's own processes (namespaces `_ray_internal*`, ray.init(_skip_env_hook=True)),
rayfabric's own commands (namespaces `rayfabric*`), Ray's spill/restore workers, Ray Client's
client side, `python -S`/`-I`."""
import os
import sys
import time

SWITCH = "RAYFABRIC_AUTOLOAD"
_WORKER_HOOK = "_rayfabric_autoload.worker_setup"
_CHAINED_SETUP = "RAYFABRIC_AUTOLOAD_CHAINED_SETUP_HOOK"  # the job's own worker setup hook
_OFF_VALUES = ("0", "false", "no", "off")
_ON_VALUES = ("", "1", "true", "yes", "on")
_LEFT_ALONE = ("_ray_internal", "rayfabric")  # namespaces: Ray's own processes, rayfabric's commands
_said = set()
_kv_loaded = []  # rayfabric/_kv.py, loaded on its own (_kv)


def at_startup():
    """From the .pth file: never raises, costs one list insert."""
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


def _kv():
    """rayfabric._kv (the KV's names, the record parser, a driver's job record): the library's own
    where it has been imported, else that file loaded on its own, from the package `import
    rayfabric` would find, without importing the package (that brings the whole library, which a
    process without agents never loads). Raises where there is no such package."""
    module = sys.modules.get("rayfabric._kv") or (_kv_loaded[0] if _kv_loaded else None)
    if module is None:
        import importlib.util
        package = importlib.util.find_spec("rayfabric")  # (a top-level name: imports nothing)
        paths = [os.path.join(d, "_kv.py") for d in (package and package.submodule_search_locations) or ()]
        path = next((p for p in paths if os.path.isfile(p)), None)
        if path is None:
            raise ModuleNotFoundError(
                "rayfabric's start-up hook is installed but its package is not importable here (no "
                "rayfabric/_kv.py on sys.path): reinstall rayfabric in this environment, or remove "
                "rayfabric-autoload.pth from site-packages")
        spec = importlib.util.spec_from_file_location("_rayfabric_autoload_kv", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _kv_loaded[:] = [module]
    return module


class _RayFinder:
    """Finds nothing itself: for `ray` it asks the finders behind it and hands out the spec with
    its loader wrapped, so that _after_ray_import runs once `ray` has been executed. It stays
    (every other name: one comparison), so that a find_spec("ray") that only probes whether Ray
    is installed does not use it up, and importlib.reload(ray) wraps the new ray.init too."""

    def find_spec(self, name, path=None, target=None):
        if name != "ray":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader)
        return spec


class _HookedLoader:
    """Ray's own loader, and _after_ray_import once it has executed `ray` (a reload too)."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):  # get_resource_reader, is_package, get_filename, ...
        if name == "_loader":  # (copy and unpickling look before __init__ has run)
            raise AttributeError(name)
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            _after_ray_import(module)
        except Exception as e:  # noqa: BLE001 - Ray works as if rayfabric were not installed
            _say(f"transparent mode not set up in this process: {type(e).__name__}: {e}")


def _after_ray_import(ray):
    if os.path.basename(sys.argv[0] if sys.argv else "") == "default_worker.py":
        from ray._private import ray_constants
        name = getattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR", None)
        if name is None or any(a.endswith(("SPILL_WORKER", "RESTORE_WORKER")) for a in sys.argv):
            return  # a Ray without worker setup hooks (< 2.8), or one of Ray's spill/restore workers
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
        connected = ray.is_initialized()  # (ignore_reinit_error=True: nothing new to set up)
        context = init(*args, **kwargs)
        if not connected and not kwargs.get("_skip_env_hook"):  # Ray's own processes: the dashboard, Client's proxy
            driver_setup()
        return context

    autoload_init._rayfabric_autoload = True
    ray.init = autoload_init


def worker_setup():
    """The worker setup hook of every Ray worker (see the module's doc). Raises only for the
    job's own hook, as Ray would."""
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
    if off(os.environ):
        return
    # Nothing of the job's settings is read here: before its first task a worker has none yet, and
    # Ray keeps the first answer it gives for good (the job's namespace, code search path and
    # logging config would be lost). The job's id is in the worker's environment where Ray started
    # the worker for a job; where it started it before any (nil: its first job's prestarted
    # workers), the wrappers decide at the worker's first ray.get/ray.wait, inside a task.
    job_id = os.environ.get("RAY_JOB_ID", "")
    if not job_id.strip("f"):
        _arm()
        return
    try:
        if not _agents_published():
            _arm()  # agents may start later
        elif not _kv().job_record(job_id).get("autoload_off"):
            _turn_on()
    except Exception as e:  # noqa: BLE001 - the worker runs on Ray's path
        _say(f"transparent mode not turned on in this worker: {type(e).__name__}: {e}")


def driver_setup():
    """After ray.init has connected a driver: transparent mode on where the cluster has agents,
    and the job's record for `rayfabric status`. Never raises."""
    try:
        import ray
        kv = _kv()
        if not kv.connected_driver():
            return  # Ray Client, or not connected
        job_env = (ray.get_runtime_context().runtime_env or {}).get("env_vars") or {}
        if off(job_env):
            # Its workers have it in their environment; the record is for `rayfabric status`.
            if _agents_published():
                kv.record_job(f"off: {SWITCH}=0 in the job's runtime_env", opted_out=True)
            return
        if off(os.environ):
            # Written even where no agent runs yet, before any task of the job exists: its workers
            # read it before they turn anything on.
            kv.record_job(f"off: {SWITCH}=0 in the driver's environment", opted_out=True)
            return
        if _left_alone():
            return
        if not _agents_published():
            _arm()  # a cluster without rayfabric: nothing changes unless agents start later
        elif not _turn_on("on: the installed package (autoload)"):
            kv.record_job("off: transparent mode could not start (see the driver's stderr)")
    except Exception as e:  # noqa: BLE001 - the job runs on Ray's path
        _say(f"transparent mode not turned on in this driver: {type(e).__name__}: {e}")


def _left_alone():
    import ray
    return (ray.get_runtime_context().namespace or "").startswith(_LEFT_ALONE)


def _agents_published():
    from ray.experimental import internal_kv
    kv = _kv()
    return bool(internal_kv._internal_kv_list(kv.KV_PREFIX, namespace=kv.NAMESPACE))


def _job_opted_out():
    """Whether this worker's job's driver said RAYFABRIC_AUTOLOAD=0 (its record). Read inside a
    task (the job is known then)."""
    import ray
    return bool(_kv().job_record(ray.get_runtime_context().get_job_id()).get("autoload_off"))


# A worker decides at its first ray.get or ray.wait, and a process that found no agents (a driver
# connected before `rayfabric start`) looks again at its calls: the first look is waited for (at
# most _FIRST_WAIT_S; not in an event loop, where that call is Ray's), later ones run in the
# background (a call that blocks anyway waits for one in flight), every _RECHECK_FIRST_S at
# first, doubling up to _RECHECK_MAX_S, and only while the process calls get or wait.
_FIRST_WAIT_S = 1.0
_RECHECK_FIRST_S = 5.0
_RECHECK_MAX_S = 60.0
_armed = {"originals": {}, "at": 0.0, "every": 0.0, "check": None, "targets": None}


def _arm():
    """ray.get and ray.wait, unchanged, but each looks (see _FIRST_WAIT_S) whether agents have
    started; once they have, transparent mode replaces both, and the wrappers (a reference someone
    kept) call what replaced them, as looked up then, never ray.<name> again: whatever wraps them
    later cannot make them call themselves."""
    import functools

    import ray
    _armed.update(at=0.0, every=0.0, targets=None)
    for name in ("get", "wait"):
        original = getattr(ray, name)
        if getattr(original, "_rayfabric_original", None) is not None:
            continue
        _armed["originals"][name] = original

        def armed(*args, _name=name, _original=original, **kwargs):
            if _armed["targets"] is None and (_armed["check"] is not None
                                              or time.monotonic() - _armed["at"] >= _armed["every"]):
                _look_again(_may_wait(_name, args, kwargs))
            targets = _armed["targets"]
            return (targets[_name] if targets else _original)(*args, **kwargs)

        functools.update_wrapper(armed, original)
        armed._rayfabric_original = original
        setattr(ray, name, armed)


def _may_wait(name, args, kwargs):
    """How long the call may wait for a look: "first" (the first look only: a poll, timeout=0,
    whose thread may pause once, as Ray Data's prefetch thread), "any" (a get or a wait with a
    timeout other than 0: the first look and one in flight), or "" (in a running event loop:
    never)."""
    try:
        import asyncio
        asyncio.get_running_loop()
        return ""
    except RuntimeError:
        pass
    return "first" if kwargs.get("timeout") == 0 else "any"  # (get and wait take timeout as a keyword only)


def _look_again(wait):
    import threading
    with _armed.setdefault("lock", threading.Lock()):
        check, started, first = _armed["check"], False, _armed["every"] == 0.0
        if check is None:
            if not first and time.monotonic() - _armed["at"] < _armed["every"]:
                return
            _armed["every"] = min(_RECHECK_MAX_S, 2 * _armed["every"] or _RECHECK_FIRST_S)
            _armed["at"] = time.monotonic()
            check = threading.Thread(target=_check_and_turn_on, name="rayfabric-autoload", daemon=True)
            _armed["check"], started = check, True
            check.start()
    # A call waits (at most _FIRST_WAIT_S) for the first look (its job's first objects should not
    # go Ray's way for want of a look), and one that blocks anyway for a look already in flight (it
    # may be turning transparent mode on); a later look it starts itself runs in the background.
    if (wait and first) or (wait == "any" and not started):
        check.join(_FIRST_WAIT_S)


def _check_and_turn_on():
    try:
        if not _agents_published():
            return
        if _kv().connected_driver():
            driver = True  # (a driver that opted out never armed)
        else:
            driver = False
            # In a task now: the job is known (see worker_setup).
            if _left_alone() or _job_opted_out():
                _disarm({})
                return
        # The wrappers stay in place meanwhile (importing rayfabric takes a moment): a call that
        # may block waits for this (_look_again), the others are Ray's until it is done.
        on = _turn_on("on: the installed package (autoload; agents started after the driver)" if driver else None)
        targets = {}
        if on:  # what transparent mode put in place (not ray.<name>: that may wrap a wrapper of ours)
            from rayfabric import transparent, waits
            targets = {"get": transparent._get, **({"wait": waits._wait} if waits.installed() else {})}
        _disarm(targets)
        if driver and not on:
            _kv().record_job("off: transparent mode could not start (see the driver's stderr)")
    except Exception as e:  # noqa: BLE001 - Ray's path
        _say(f"transparent mode not turned on in this process: {type(e).__name__}: {e}")
    finally:
        _armed.update(at=time.monotonic(), check=None)


def _disarm(targets):
    """Ray's own ray.get/ray.wait back where they are still the wrappers; `targets` (Ray's own
    for what it leaves out) for the wrappers someone kept; None: not yet."""
    import ray
    for name, original in _armed["originals"].items():
        if getattr(getattr(ray, name), "_rayfabric_original", None) is original:
            setattr(ray, name, original)
    if targets is not None:
        _armed["targets"] = {name: targets.get(name, original) for name, original in _armed["originals"].items()}


def _turn_on(record=None):
    """transparent.enable(); `record`: how a driver's job record says it was turned on."""
    try:
        from rayfabric import transparent
        return bool(transparent.enable(record=record))
    except Exception as e:  # noqa: BLE001 - Ray's path, said once
        _say(f"transparent mode not turned on in this process: {type(e).__name__}: {e}")
        return False

