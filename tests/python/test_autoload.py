"""The start-up hook's own logic (python/_rayfabric_autoload.py), each in a fresh interpreter that
runs it as site-packages' rayfabric-autoload.pth does (no cluster: test_autoload_real_ray and
test_wheel_install run it on real ones): the finder waits for `import ray` and leaves; a process
that never imports Ray keeps neither Ray nor rayfabric; in a Ray worker the setup hook is ours and
chains the job's; elsewhere ray.init is wrapped; the opt-out's values; the runtime_env the opt-out
gives a job, chaining a cluster's own RAY_RUNTIME_ENV_HOOK, and that hook set only during ray.init."""
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


def test_a_driver_gets_a_wrapped_init_and_the_finder_leaves():
    out, _ = run("import sys, ray\n"
                 "print(getattr(ray.init, '_rayfabric_autoload', False), ray.init.__name__, "
                 "any(type(f).__name__ == '_RayFinder' for f in sys.meta_path), 'rayfabric' in sys.modules)")
    assert out == ["True", "init", "False", "False"]


def test_a_worker_runs_our_setup_hook_and_chains_the_jobs():
    worker = "/x/ray/_private/workers/default_worker.py"
    code = ("import os, ray\nprint(os.environ.get('__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR'), "
            "os.environ.get('RAYFABRIC_AUTOLOAD_CHAINED_SETUP_HOOK'), getattr(ray.init, '_rayfabric_autoload', False))")
    out, _ = run(code, argv0=worker)
    assert out == ["_rayfabric_autoload.worker_setup", "None", "False"]
    out, _ = run(code, argv0=worker, env={"__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR": "their.hook"})
    assert out == ["_rayfabric_autoload.worker_setup", "their.hook", "False"]


def test_the_opt_out_values():
    out, err = run("for v in ['0', 'false', 'No', 'off', '', '1', 'true', 'yes', 'ON', 'maybe', 'maybe']:\n"
                   "    print(m.off({'RAYFABRIC_AUTOLOAD': v}))\n"
                   "print(m.off({}))")
    assert out == ["True"] * 4 + ["False"] * 5 + ["True", "True", "False"]
    # A value that is neither keeps it off, said once per process.
    assert err.count("RAYFABRIC_AUTOLOAD='maybe' is neither 1 nor 0: transparent mode stays off") == 1, err


def test_the_opt_out_reaches_the_jobs_workers_through_its_runtime_env():
    out, _ = run("import json\n"
                 "print(json.dumps(m.runtime_env_hook(None)))\n"
                 "print(json.dumps(m.runtime_env_hook({'env_vars': {'A': '1'}, 'pip': ['x']}), sort_keys=True))\n"
                 "print(json.dumps(m.runtime_env_hook({'env_vars': {'RAYFABRIC_AUTOLOAD': '1'}})))")
    assert out == ['{"env_vars":', '{"RAYFABRIC_AUTOLOAD":', '"0"}}',
                   '{"env_vars":', '{"A":', '"1",', '"RAYFABRIC_AUTOLOAD":', '"0"},', '"pip":', '["x"]}',
                   '{"env_vars":', '{"RAYFABRIC_AUTOLOAD":', '"1"}}']


def test_a_clusters_own_runtime_env_hook_is_chained_and_given_back():
    hook_dir = Path(__file__).resolve().parents[1] / "agent"
    code = ("import os, json, sys\n"
            f"sys.path.insert(0, {str(hook_dir)!r})\n"
            "print(m._set_env_hook(), os.environ['RAY_RUNTIME_ENV_HOOK'])\n"
            "print(m._set_env_hook())\n"  # already ours: nothing to set back twice
            "print(json.dumps(m.runtime_env_hook({}), sort_keys=True))\n"
            "m._unset_env_hook()\n"
            "print(os.environ.get('RAY_RUNTIME_ENV_HOOK'), os.environ.get('RAYFABRIC_AUTOLOAD_CHAINED_ENV_HOOK'))")
    out, _ = run(code, env={"RAY_RUNTIME_ENV_HOOK": "autoload_user_hooks.runtime_env_hook"})
    assert out == ["True", "_rayfabric_autoload.runtime_env_hook", "False",
                   '{"env_vars":', '{"MARKER":', '"their-env-hook",', '"RAYFABRIC_AUTOLOAD":', '"0"}}',
                   "autoload_user_hooks.runtime_env_hook", "None"]
    out, _ = run(code.replace("autoload_user_hooks", "x"))  # none before: none after
    assert out[-2:] == ["None", "None"]
