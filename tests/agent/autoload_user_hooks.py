"""A job's own hooks, as a user's cluster might have them, for test_autoload_real_ray: rayfabric's
start-up hook must keep them working."""
import os


def worker_setup():
    """A job's worker_process_setup_hook."""
    os.environ["MARKER"] = "their-setup-hook"


def runtime_env_hook(runtime_env):
    """A cluster's RAY_RUNTIME_ENV_HOOK: it adds an environment variable to every job."""
    env = dict(runtime_env or {})
    env["env_vars"] = dict(env.get("env_vars") or {}, MARKER="their-env-hook")
    return env
