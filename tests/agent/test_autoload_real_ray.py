"""Transparent mode with no change to the job (python/_rayfabric_autoload.py, issue 30), on a REAL
2-node Ray cluster from this checkout. An installed package puts rayfabric-autoload.pth into
site-packages (tests/agent/test_wheel_install.py checks that, with `ray start` nodes); here the
same file goes into a private user site (PYTHONUSERBASE, with a private HOME), so that it reaches
this cluster's processes (raylets, workers, the dashboard's job supervisor) and the drivers the
tests start, and nothing else on the host. The test process itself runs without it: it only
starts the cluster and the agents and reads their counters.

Every driver is tests/agent/plain_driver.py (it never mentions rayfabric): a 64 MiB result made
on n1 fetched on n0, another passed to an actor on n0. Each case checks the bytes the agents
pulled, the bytes' digests, and the mode of the driver and the actor (plain_driver.py):
  * a job with its own worker_process_setup_hook: theirs runs, and transparent mode too;
  * a cluster with its own RAY_RUNTIME_ENV_HOOK: kept, with autoload on and off;
  * the opt-out in the job's runtime_env (RAYFABRIC_AUTOLOAD=0 in env_vars): the driver and its
    workers stay Ray's; `rayfabric status` lists the job as off, and why;
  * `ray job submit`: the entrypoint's driver is in transparent mode, its bytes by the fabric;
  * Ray Data's iter_batches in an actor (its prefetching ray.wait): blocks by the fabric;
  * a driver connected before the agents started: Ray's path, then the fabric's;
  * a job keeps its own settings in its workers (namespace, a module beside the driver script)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import ray
from ray.cluster_utils import Cluster

import rayfabric

from local_ports import free_port
from ray_test_cluster import use_this_checkout

MiB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
DRIVER = os.path.join(HERE, "plain_driver.py")
ON = ["True", "True", "transparent", "transparent"]
OFF = ["True", "True", "ray", "ray"]


@pytest.fixture(scope="module")
def cluster():
    use_this_checkout()
    root = tempfile.mkdtemp(prefix="rf-autoload-")
    saved = {k: os.environ.get(k) for k in ("HOME", "PYTHONUSERBASE", "RAYFABRIC_AUTOLOAD")}
    os.environ.pop("RAYFABRIC_AUTOLOAD", None)  # scripts/test.sh turns it off for the rest of the suite
    os.environ["HOME"] = root
    os.environ["PYTHONUSERBASE"] = os.path.join(root, "userbase")
    user_site = subprocess.run([sys.executable, "-c", "import site; print(site.getusersitepackages())"],
                               capture_output=True, text=True, check=True).stdout.strip()
    assert user_site.startswith(root), user_site
    os.makedirs(user_site)
    shutil.copy(os.path.join(REPO, "python", "rayfabric-autoload.pth"), user_site)
    dashboard = free_port()
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"h": 100}, "object_store_memory": 400 * MiB, "include_dashboard": True,
        "dashboard_port": dashboard})
    try:
        c.add_node(num_cpus=1, resources={"w": 100}, object_store_memory=400 * MiB)
        ray.init(address=c.address, logging_level="ERROR", namespace="rayfabric-test")
        c.wait_for_nodes()
        rayfabric.init(watch_new_nodes=False)
        yield {"address": c.address, "dashboard": f"http://127.0.0.1:{dashboard}"}
    finally:
        rayfabric.shutdown()
        ray.shutdown()
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(root, ignore_errors=True)


def fabric_bytes():
    return sum(a.get("bytes_pulled", 0) for a in rayfabric.status()["agents"].values())


def plain_job(cluster, env=None, runtime_env=None):
    """Runs the plain driver; returns (RESULT fields, stderr, the jobs `rayfabric status` listed
    while it ran, the bytes the agents pulled meanwhile)."""
    before = fabric_bytes()
    args = [sys.executable, DRIVER, cluster["address"], "--wait-stdin"]
    if runtime_env is not None:
        args += ["--runtime-env", json.dumps(runtime_env)]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, **(env or {})))
    try:
        line = p.stdout.readline()
        assert line.startswith("RESULT"), line + p.communicate(timeout=60)[1][-3000:]
        jobs = rayfabric.status()["jobs"]
        _, err = p.communicate("\n", timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    return line.split()[1:], err, jobs, fabric_bytes() - before


def test_the_test_process_has_no_autoload():
    """The hook reaches this cluster's processes only (the test process started without it)."""
    assert not getattr(ray.init, "_rayfabric_autoload", False)


def test_a_plain_job_moves_its_bytes_by_the_fabric(cluster):
    result, err, jobs, moved = plain_job(cluster)
    assert result == ON + ["-"], (result, err[-2000:])
    assert moved >= 2 * 64 * MiB, moved
    assert [j["mode"] for j in jobs] == ["on: the installed package (autoload)"], jobs


def test_their_worker_setup_hook_still_runs(cluster):
    result, err, _, moved = plain_job(cluster, runtime_env={"worker_process_setup_hook": "autoload_user_hooks.worker_setup"})
    assert result == ON + ["their-setup-hook"], (result, err[-2000:])
    assert moved >= 2 * 64 * MiB, moved


def test_their_runtime_env_hook_is_kept(cluster):
    hook = {"RAY_RUNTIME_ENV_HOOK": "autoload_user_hooks.runtime_env_hook"}
    result, err, _, moved = plain_job(cluster, env=hook)
    assert result == ON + ["their-env-hook"], (result, err[-2000:])
    assert moved >= 2 * 64 * MiB, moved
    # Off in the driver's environment: theirs still runs, and the opt-out reaches the workers.
    result, err, jobs, moved = plain_job(cluster, env=dict(hook, RAYFABRIC_AUTOLOAD="0"))
    assert result == OFF + ["their-env-hook"], (result, err[-2000:])
    assert moved == 0, moved
    assert [j["mode"] for j in jobs] == ["off: RAYFABRIC_AUTOLOAD=0 in the driver's environment"], jobs


def test_opt_out_in_the_jobs_runtime_env(cluster):
    result, err, jobs, moved = plain_job(cluster, runtime_env={"env_vars": {"RAYFABRIC_AUTOLOAD": "0"}})
    assert result == OFF + ["-"], (result, err[-2000:])
    assert moved == 0, moved
    assert [j["mode"] for j in jobs] == ["off: RAYFABRIC_AUTOLOAD=0 in the job's runtime_env"], jobs
    assert "rayfabric" not in err, err[-2000:]


def test_a_bad_setting_keeps_the_driver_on_rays_path_and_says_why(cluster):
    """transparent.enable() refuses a bad RAYFABRIC_ARGS_WAIT_FOR before it replaces anything: the
    driver runs on Ray's path, its stderr says why once, and `rayfabric status` lists the job as
    off. (The variable is the driver's own: its workers, which Ray starts without it, still turn
    transparent mode on; the driver submits its calls unhooked, so nothing moves by the fabric.)"""
    result, err, jobs, moved = plain_job(cluster, env={"RAYFABRIC_ARGS_WAIT_FOR": "soon"})
    assert result[:3] == ["True", "True", "ray+rayfabric"], (result, err[-2000:])
    assert moved == 0, moved
    assert [j["mode"] for j in jobs] == ["off: transparent mode could not start (see the driver's stderr)"], jobs
    why = ("rayfabric: transparent mode not turned on in this process: ValueError: RAYFABRIC_ARGS_WAIT_FOR='soon': "
           "use sealed (the default: a call waits until its arguments are in the destination's store) or claimed")
    assert err.count(why) == 1, err[-3000:]


def test_ray_job_submit(cluster):
    before = fabric_bytes()
    out = subprocess.run(["ray", "job", "submit", "--address", cluster["dashboard"], "--", sys.executable, DRIVER,
                          "auto"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT")]
    assert line.split()[1:] == ON + ["-"], out.stdout[-3000:]
    assert fabric_bytes() - before >= 2 * 64 * MiB


RAY_DATA = r"""
import sys, numpy as np, ray
ray.init(address=sys.argv[1], logging_level="ERROR")
ray.data.DataContext.get_current().execution_options.verbose_progress = False
@ray.remote(num_cpus=0, resources={"w": 0.01})
def block(i):
    import pandas as pd
    return pd.DataFrame({"x": [np.full(8 << 20, i % 251, dtype=np.uint8)]})
@ray.remote(num_cpus=0, resources={"h": 0.01})
class Trainer:
    def consume(self, ds):
        sums = [int(b["x"][0].sum()) for b in ds.iter_batches(batch_size=1, batch_format="numpy", prefetch_batches=4)]
        import sys
        transparent = sys.modules.get("rayfabric.transparent")
        on = transparent is not None and transparent.enabled()
        stats = sys.modules["rayfabric.api"].stats() if on else {}
        return sums, "transparent" if on else "ray", stats
blocks = [block.remote(i) for i in range(12)]
ray.wait(blocks, num_returns=len(blocks), fetch_local=False)
ds = ray.data.from_pandas_refs(blocks)
sums, where, stats = ray.get(Trainer.remote().consume.remote(ds))
print("DATA", sorted(sums) == sorted((i % 251) * (8 << 20) for i in range(12)), where, flush=True)
print("STATS", {k: v for k, v in stats.items() if v}, flush=True)
"""


def test_ray_data_iter_batches_without_an_import(cluster):
    before = fabric_bytes()
    out = subprocess.run([sys.executable, "-c", RAY_DATA, cluster["address"]], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("DATA")]
    assert line.split()[1:] == ["True", "transparent"], out.stdout[-2000:] + out.stderr[-2000:]
    moved = fabric_bytes() - before
    agents = {n[:8]: a.get("fallback_reasons") for n, a in rayfabric.status()["agents"].items()}
    # At least 9 of the 12 blocks by the fabric. In two full-suite runs on 2026-12-07 (not when this
    # module ran alone, nor after library_coverage_quick) exactly 10 came by the fabric and 2 by Ray's
    # path, for a reason not yet attributed: the worker's stats and the agents' fallback reasons
    # print below when fewer than 11 come.
    assert moved >= 0.75 * 12 * 8 * MiB, (moved, out.stdout[-3000:], agents)
    if moved < 0.9 * 12 * 8 * MiB:
        print(f"only {moved} fabric bytes of {12 * 8 * MiB}: {out.stdout[-3000:]} {agents}")


def test_a_driver_connected_before_the_agents_started(cluster):
    """A notebook connected before `rayfabric start`: Ray's path, then transparent mode once the
    agents are there (its next gets look again), listed as such."""
    rayfabric.shutdown()
    try:
        p = subprocess.Popen([sys.executable, DRIVER, cluster["address"], "--wait-stdin", "--second-round"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        assert line.split()[1:] == ["True", "True", "armed", "armed", "-"], line + p.stderr.read()[-2000:]
    finally:
        rayfabric.init(watch_new_nodes=False)
    before = fabric_bytes()
    try:
        out, err = p.communicate("\n", timeout=120)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    (second,) = [x for x in out.splitlines() if x.startswith("RESULT2")]
    assert second.split()[1:4] == ["True", "True", "transparent"], (second, err[-2000:])
    assert fabric_bytes() - before >= 2 * 64 * MiB


JOB_WITH_A_MODULE = r"""
import sys, numpy as np, ray
from helpers import block, whereabouts  # beside this script, no working_dir: Ray's code search path
ray.init(address=sys.argv[1], logging_level="ERROR", namespace="their-namespace")
ref = ray.remote(num_cpus=0, resources={"w": 0.01})(block).remote(64 << 20)
value = ray.get(ref, _use_object_store=False)  # a keyword of Ray 2.60's own get
ns, got = ray.get(ray.remote(num_cpus=0, resources={"h": 0.01})(whereabouts).remote([ref]))
print("JOB", int(value.sum()) == int(block(64 << 20).sum()), ns, got, flush=True)
"""

HELPERS = r"""
import numpy as np, ray
def block(n):
    return np.arange(n, dtype=np.uint8)
def whereabouts(wrapped):
    import sys
    value = ray.get(wrapped[0])
    transparent = sys.modules.get("rayfabric.transparent")
    mode = "transparent" if transparent is not None and transparent.enabled() else "ray"
    return ray.get_runtime_context().namespace, mode + ":" + str(int(value.sum()) == int(block(len(value)).sum()))
"""


def test_a_job_keeps_its_settings_in_its_workers(cluster, tmp_path):
    """The hook reads nothing of a job in a worker before its first task (Ray would keep that
    empty answer): the job's namespace, and its driver's folder on the workers' path (a module
    beside the script, imported by the tasks), are there; Ray's own get keywords pass through."""
    (tmp_path / "job.py").write_text(JOB_WITH_A_MODULE)
    (tmp_path / "helpers.py").write_text(HELPERS)
    before = fabric_bytes()
    out = subprocess.run([sys.executable, str(tmp_path / "job.py"), cluster["address"]], capture_output=True,
                         text=True, timeout=300, cwd="/")
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("JOB")]
    assert line.split()[1:] == ["True", "their-namespace", "transparent:True"], out.stdout + out.stderr[-2000:]
    assert fabric_bytes() - before >= 64 * MiB
