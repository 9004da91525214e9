"""The start-up hook's own logic (python/_rayfabric_autoload.py), each in a fresh interpreter that
runs it as site-packages' rayfabric-autoload.pth does (no cluster: test_autoload_real_ray and
test_wheel_install run it on real ones): the finder waits for `import ray` and leaves; a process
that never imports Ray keeps neither Ray nor rayfabric; in a Ray worker the setup hook is ours and
chains the job's (not in spill/restore workers); elsewhere ray.init is wrapped; a probe for Ray
and a reload; the wrappers of a process without agents, wrapped again by someone else; which calls
may wait for the first look; the opt-out's values; the KV records' code shared with rayfabric; a .pth
whose module is missing."""
import os
import subprocess
import sys
from pathlib import Path

PYTHON_DIR = str(Path(__file__).resolve().parents[2] / "python")
STARTUP = "import _rayfabric_autoload as m; m.at_startup()\n"


def run(code, env=None, argv0=None):
    full = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    for k in ("RAYFABRIC_AUTOLOAD", "RAY_RUNTIME_ENV_HOOK", "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"):
        full.pop(k, None)
    full.update(env or {})
    prelude = f"import sys; sys.argv[0] = {argv0!r}\n" if argv0 else ""
    out = subprocess.run([sys.executable, "-c", prelude + STARTUP + code], capture_output=True, text=True,
                         env=full, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split(), out.stderr


def test_a_process_that_never_imports_ray_keeps_nothing_of_it():
    out, err = run("import json, sys\n"
                   "print('ray' in sys.modules, 'rayfabric' in sys.modules, "
                   "sum(type(f).__name__ == '_RayFinder' for f in sys.meta_path))\n"
                   "m.at_startup()\n"  # twice (two site dirs): still one finder
                   "print(sum(type(f).__name__ == '_RayFinder' for f in sys.meta_path))")
    assert out == ["False", "False", "1", "1"] and err == ""


def test_a_driver_gets_a_wrapped_init_and_nothing_of_rayfabric():
    out, _ = run("import sys, ray\n"
                 "print(getattr(ray.init, '_rayfabric_autoload', False), ray.init.__name__, "
                 "'rayfabric' in sys.modules)")
    assert out == ["True", "init", "False"]


def test_a_worker_runs_our_setup_hook_and_chains_the_jobs():
    worker = "/x/ray/_private/workers/default_worker.py"
    code = ("import os, ray\nprint(os.environ.get('__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR'), "
            "os.environ.get('RAYFABRIC_AUTOLOAD_CHAINED_SETUP_HOOK'), getattr(ray.init, '_rayfabric_autoload', False))")
    out, _ = run(code, argv0=worker)
    assert out == ["_rayfabric_autoload.worker_setup", "None", "False"]
    out, _ = run(code, argv0=worker, env={"__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR": "their.hook"})
    assert out == ["_rayfabric_autoload.worker_setup", "their.hook", "False"]
    # Ray's spill/restore workers are left alone.
    out, _ = run(code.replace("import os, ray", "import os, sys; sys.argv.append('--worker-type=SPILL_WORKER'); import ray"),
                 argv0=worker)
    assert out == ["None", "None", "False"]


def test_the_opt_out_values():
    out, err = run("for v in ['0', 'false', 'No', 'off', '', '1', 'true', 'yes', 'ON', 'maybe', 'maybe']:\n"
                   "    print(m.off({'RAYFABRIC_AUTOLOAD': v}))\n"
                   "print(m.off({}))")
    assert out == ["True"] * 4 + ["False"] * 5 + ["True", "True", "False"]
    # A value that is neither keeps it off, said once per process.
    assert err.count("RAYFABRIC_AUTOLOAD='maybe' is neither 1 nor 0: transparent mode stays off") == 1, err


def test_a_probe_for_ray_does_not_use_the_hook_up_and_a_reload_keeps_it():
    out, _ = run("import importlib, importlib.util, sys\n"
                 "spec = importlib.util.find_spec('ray')\n"  # "is Ray installed?"
                 "import ray\n"
                 "print(getattr(ray.init, '_rayfabric_autoload', False), type(ray.__spec__.loader).__name__, "
                 "ray.__spec__.loader.is_package('ray'))\n"
                 "import copy; copy.copy(ray.__spec__.loader)\n"  # (no recursion before __init__)
                 "importlib.reload(ray)\n"
                 "print(getattr(ray.init, '_rayfabric_autoload', False))")
    assert out == ["True", "_HookedLoader", "True", "True"]


def test_the_wrappers_of_a_process_without_agents_never_call_themselves():
    """Armed (no agents yet), then wrapped by someone else (a profiler, rayfabric's own bench), then
    handed what replaced them: a call through the outer wrapper reaches the replacement once."""
    out, _ = run("import ray\n"
                 "originals = (ray.get, ray.wait)\n"
                 "m._arm()\n"
                 "print(ray.get._rayfabric_original is originals[0], ray.wait.__name__, ray.wait.__module__)\n"
                 "inner = ray.wait\n"
                 "ray.wait = lambda *a, **k: inner(*a, **k)\n"
                 "calls = []\n"
                 "m._disarm({'wait': lambda *a, **k: calls.append(a) or 'replaced'})\n"
                 "print(ray.wait('x'), len(calls), ray.get is originals[0])")
    assert out == ["True", "wait", "ray._private.worker", "replaced", "1", "True"]


def test_which_calls_may_wait_for_the_first_look():
    out, _ = run("print(m._may_wait('get', ([],), {}), m._may_wait('wait', ([],), {'timeout': 0}), "
                 "m._may_wait('wait', ([],), {'timeout': 1}), m._may_wait('wait', ([],), {}))\n"
                 "import asyncio\n"
                 "async def f():\n"
                 "    return m._may_wait('get', ([],), {})\n"
                 "print(repr(asyncio.run(f())))")
    assert out == ["any", "first", "any", "any", "''"]


def test_the_kv_names_and_records_are_rayfabrics():
    """The hook reads and writes rayfabric's KV records with the library's rayfabric/_kv.py, loaded
    on its own before the package is imported (nothing of it imported), the library's own after."""
    out, _ = run("import sys, ray\n"
                 "kv = m._kv()\n"
                 "print(kv.__file__.endswith('/rayfabric/_kv.py'), 'rayfabric' in sys.modules, m._kv() is kv, "
                 "kv.parse_record('{not json') is None, kv.parse_record('[1]') is None, kv.parse_record('{\"a\": 1}'))\n"
                 "from rayfabric import _records\n"
                 "print((kv.NAMESPACE, kv.KV_PREFIX, kv.KV_JOB_PREFIX) == "
                 "(_records.NAMESPACE, _records.KV_PREFIX, _records.KV_JOB_PREFIX), m._kv() is sys.modules['rayfabric._kv'])")
    assert out == ["True", "False", "True", "True", "True", "{'a':", "1}", "True", "True"]


def test_a_pth_whose_module_is_missing_says_nothing():
    pth = (Path(__file__).resolve().parents[2] / "python" / "rayfabric-autoload.pth").read_text()
    out = subprocess.run([sys.executable, "-c", pth], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
