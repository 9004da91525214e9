"""rayfabric installed as a user would: `pip install <repo>` into a fresh virtual environment (meson
builds the agent, the tools and rayfabric._fabric through meson-python and puts them inside the
package), then a cluster started with `ray start` from that environment, two nodes on this host,
with no PYTHONPATH, no RAYFABRIC_BIN_DIR and no build directory in sight (the commands run from an
empty folder): `rayfabric start` starts agents that are the package's own binary, and a driver moves
an object between the nodes by fi_read.

The environment sees the system's site-packages (Ray, numpy: already installed by
scripts/setup.sh, so nothing but rayfabric is downloaded or built); rayfabric itself is only in the
environment."""
import glob
import json
import os
import socket
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def venv():
    root = tempfile.mkdtemp(prefix="rf-wheel-")
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", os.path.join(root, "venv")], check=True)
    py = os.path.join(root, "venv", "bin", "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAYFABRIC_BIN_DIR")}
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
               "import rayfabric.doctor as d; print(d.find_engine_tool()[0])").stdout.strip()
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
