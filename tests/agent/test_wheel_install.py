"""rayfabric installed as a user would: `pip install <repo>` into a fresh virtual environment (meson
builds the agent, the tools and rayfabric._fabric through meson-python and puts them inside the
package), then a cluster started with `ray start` from that environment, two nodes on this host,
with no PYTHONPATH, no RAYFABRIC_BIN_DIR and no build directory in sight (the commands run from an
empty folder): `rayfabric start` starts agents that are the package's own binary, and a driver moves
an object between the nodes by fi_read. With no change to a job at all (the package's start-up
hook, rayfabric-autoload.pth): a driver that never mentions rayfabric moves its objects by the
fabric once agents run, by Ray's path alone before, and with RAYFABRIC_AUTOLOAD=0.

The environment sees the system's site-packages (Ray, numpy: already installed by
scripts/setup.sh, so nothing but rayfabric is downloaded or built); rayfabric itself is only in the
environment."""
import glob
import json
import os
import subprocess
import sys
import tempfile

import pytest

from local_ports import free_port

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def venv():
    root = tempfile.mkdtemp(prefix="rf-wheel-")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", os.path.join(root, "venv")], check=True)
    py = os.path.join(root, "venv", "bin", "python")
    # RAYFABRIC_AUTOLOAD: scripts/test.sh turns it off for the rest of the suite; a user has it unset.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAYFABRIC_BIN_DIR", "RAYFABRIC_AUTOLOAD")}
    env["HOME"] = root  # Ray keeps a token in ~/.ray: this cluster's own
    env["PATH"] = os.path.join(root, "venv", "bin") + os.pathsep + env["PATH"]
    out = subprocess.run([py, "-m", "pip", "install", "-q", REPO], capture_output=True, text=True, env=env,
                         cwd=root, timeout=1200)
    assert out.returncode == 0, f"pip install {REPO} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return {"root": root, "py": py, "env": env}


def run(v, *args, check=True, timeout=180):
    out = subprocess.run(list(args), capture_output=True, text=True, env=v["env"], cwd=v["root"], timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{args} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def test_installed_package_holds_its_binaries(venv):
    where = run(venv, venv["py"], "-c",
                "import rayfabric, rayfabric._native as n; print(rayfabric.__file__); print(rayfabric.bin_dir()); "
                "print(n.fabric().__file__)").stdout.split()
    pkg = os.path.dirname(where[0])
    assert pkg.startswith(venv["root"]) and "site-packages" in pkg, where
    assert where[1] == os.path.join(pkg, "_bin"), where
    assert where[2].startswith(pkg), where
    for rel in ("src/agent/rayfabricd", "tools/fabric_info/rayfabric-fabric-info", "bench/rayfabric-bench"):
        assert os.access(os.path.join(pkg, "_bin", rel), os.X_OK), rel
    assert os.path.exists(os.path.join(venv["root"], "venv", "bin", "rayfabric"))  # the console script
    # `rayfabric doctor` asks the engine through the tool the package holds (not PATH, not build/)
    tool = run(venv, venv["py"], "-c",
               "import rayfabric.tools.doctor as d; print(d.find_engine_tool()[0])").stdout.strip()
    assert tool == os.path.join(pkg, "_bin", "tools", "fabric_info", "rayfabric-fabric-info"), tool


DRIVER = r"""
import sys, numpy as np, ray, rayfabric
ray.init(address=sys.argv[1], logging_level="ERROR")
@ray.remote(num_cpus=0, resources={"w": 0.01})
def make():
    return np.arange(32 << 20, dtype=np.uint8)
value = rayfabric.get(make.remote(), timeout=120)
assert int(value.sum()) == int(np.arange(32 << 20, dtype=np.uint8).sum())
st = rayfabric.stats()
print("PULLED", st["objects_pulled"], st["bytes_pulled"], st["fallbacks"])
"""


def test_ray_start_cluster_finds_the_agent_in_the_package(venv):
    py, port = venv["py"], free_port()
    ray_cli = [py, "-m", "ray.scripts.scripts"]
    common = ["--num-cpus", "1", "--object-store-memory", str(300 << 20), "--disable-usage-stats"]
    address = f"127.0.0.1:{port}"
    try:
        run(venv, *ray_cli, "start", "--head", "--port", str(port), "--temp-dir", os.path.join(venv["root"], "ray"),
            "--include-dashboard", "false", "--resources", json.dumps({"h": 10}), *common)
        run(venv, *ray_cli, "start", "--address", address, "--resources", json.dumps({"w": 10}), *common)
        rayfabric_cli = os.path.join(venv["root"], "venv", "bin", "rayfabric")
        start = run(venv, rayfabric_cli, "start", "--address", address, "--provider", "tcp;ofi_rxm")
        assert "2 agent(s) running" in start.stdout, start.stdout
        # The agents are the package's own binary.
        pkg_agent = glob.glob(os.path.join(venv["root"], "venv", "lib", "python*", "site-packages", "rayfabric",
                                           "_bin", "src", "agent", "rayfabricd"))
        assert pkg_agent, "no rayfabricd inside the installed package"
        agents = []
        for exe in glob.glob("/proc/[0-9]*/exe"):
            try:
                target = os.readlink(exe)
            except OSError:
                continue
            if os.path.basename(target) == "rayfabricd":
                agents.append(target)
        assert agents and all(os.path.realpath(a) == os.path.realpath(pkg_agent[0]) for a in agents), agents
        got = run(venv, py, "-c", DRIVER, address)
        pulled = next(line for line in got.stdout.splitlines() if line.startswith("PULLED")).split()
        assert pulled[1] == "1" and int(pulled[2]) >= 32 << 20 and pulled[3] == "0", got.stdout + got.stderr
        stop = run(venv, rayfabric_cli, "stop", "--address", address)
        assert "stopped 2 agent(s)" in stop.stdout
    finally:
        run(venv, *ray_cli, "stop", "--force", check=False)


def test_readme_main_job_from_the_installed_package(venv, tmp_path):
    """README's main job (`rayfabric demo`: a 2-node local cluster, an array both ways through Ray and
    through rayfabric) from the installed package, in an empty folder, with no PYTHONPATH and no
    build directory: both paths move the bytes, rayfabric's by fi_read."""
    out = tmp_path / "demo.json"
    got = run(venv, os.path.join(venv["root"], "venv", "bin", "rayfabric"), "demo", "--size-mb", "64",
              "--json", str(out), timeout=600)
    results = json.loads(out.read_text())
    assert {(r["direction"], r["path"]) for r in results} == {
        (d, p) for d in ("node_a->node_b", "node_b->node_a") for p in ("ray", "rayfabric")}, results
    assert all(r["fingerprint_ok"] for r in results), results
    assert all(r["copy"]["fabric_bytes"] >= 64 << 20 and not r["copy"]["fallbacks"]
               for r in results if r["path"] == "rayfabric"), results
    assert "speed-up" in got.stdout, got.stdout


# A driver that never mentions rayfabric (tests/agent/plain_driver.py).
PLAIN_DRIVER = os.path.join(REPO, "tests", "agent", "plain_driver.py")


def _fabric_bytes(v, cli, address):
    st = json.loads(run(v, cli, "status", "--address", address, "--json").stdout)
    return sum(a.get("bytes_pulled", 0) for a in st["agents"].values()), st


def _plain_job(v, address, cli=None, env=None):
    """Runs PLAIN_DRIVER; returns (its RESULT fields, its stderr, `rayfabric status` while it ran)."""
    p = subprocess.Popen([v["py"], PLAIN_DRIVER, address, "--wait-stdin"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=dict(v["env"], **(env or {})), cwd=v["root"])
    try:
        line = p.stdout.readline()
        assert line.startswith("RESULT"), line + p.communicate(timeout=60)[1][-3000:]
        st = json.loads(run(v, cli, "status", "--address", address, "--json").stdout) if cli else None
        _, err = p.communicate("\n", timeout=60)
    finally:
        p.kill()
    assert p.returncode == 0, err[-3000:]
    return line.split()[1:], err, st


def test_a_job_that_never_mentions_rayfabric(venv):
    py, port = venv["py"], free_port()
    ray_cli = [py, "-m", "ray.scripts.scripts"]
    cli = os.path.join(venv["root"], "venv", "bin", "rayfabric")
    common = ["--num-cpus", "1", "--object-store-memory", str(400 << 20), "--disable-usage-stats"]
    address = f"127.0.0.1:{port}"
    site = glob.glob(os.path.join(venv["root"], "venv", "lib", "python*", "site-packages"))[0]
    assert os.path.exists(os.path.join(site, "rayfabric-autoload.pth")), os.listdir(site)
    # The start-up hook costs a process that never imports Ray nothing but the finder it leaves.
    probe = run(venv, py, "-c", "import sys; print('ray' in sys.modules, "
                "[type(f).__name__ for f in sys.meta_path].count('_RayFinder'))").stdout.split()
    assert probe == ["False", "1"], probe
    try:
        run(venv, *ray_cli, "start", "--head", "--port", str(port), "--temp-dir", os.path.join(venv["root"], "ray2"),
            "--include-dashboard", "false", "--resources", json.dumps({"h": 10}), *common)
        run(venv, *ray_cli, "start", "--address", address, "--resources", json.dumps({"w": 10}), *common)
        # No agents: the job runs as it would without rayfabric (Ray's path, rayfabric not even
        # imported, no word from it); its driver and actor only look for agents at their gets.
        result, err, _ = _plain_job(venv, address)
        assert result == ["True", "True", "armed", "armed", "-"], result
        assert "rayfabric" not in err, err[-2000:]
        start = run(venv, cli, "start", "--address", address, "--provider", "tcp;ofi_rxm")
        assert "2 agent(s) running" in start.stdout, start.stdout
        # Agents: the same job, unchanged, is in transparent mode in its driver and its actor;
        # both 64 MiB objects come by the fabric, identical.
        before, _ = _fabric_bytes(venv, cli, address)
        result, err, st = _plain_job(venv, address, cli)
        after, _ = _fabric_bytes(venv, cli, address)
        assert result == ["True", "True", "transparent", "transparent", "-"], (result, err[-2000:])
        assert after - before >= 2 * (64 << 20), (before, after, err[-2000:])
        (job,) = st["jobs"]
        assert job["mode"] == "on: the installed package (autoload)", st["jobs"]
        # Opted out in the driver's environment: the driver and the job's workers keep Ray's path.
        result, err, st = _plain_job(venv, address, cli, env={"RAYFABRIC_AUTOLOAD": "0"})
        again, _ = _fabric_bytes(venv, cli, address)
        assert result == ["True", "True", "ray", "ray", "-"], (result, err[-2000:])
        assert again == after, (after, again)
        assert [j["mode"] for j in st["jobs"]] == ["off: RAYFABRIC_AUTOLOAD=0 in the driver's environment"], st
        # A value that is neither on nor off keeps it off, and says so.
        result, err, _ = _plain_job(venv, address, env={"RAYFABRIC_AUTOLOAD": "maybe"})
        assert result[2:] == ["ray", "ray", "-"], result
        assert "RAYFABRIC_AUTOLOAD='maybe' is neither 1 nor 0" in err, err[-2000:]
        stop = run(venv, cli, "stop", "--address", address)
        assert "stopped 2 agent(s)" in stop.stdout
        # Agents stopped: Ray's path again, silently.
        result, err, _ = _plain_job(venv, address)
        assert result == ["True", "True", "armed", "armed", "-"], result
        assert "rayfabric" not in err, err[-2000:]
    finally:
        run(venv, *ray_cli, "stop", "--force", check=False)
