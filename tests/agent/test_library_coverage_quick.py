"""bench/library_coverage.py in a tiny form (its embedded 3-node cluster, real Ray libraries): an
ActorPool and a tree reduce of default tasks, each as a job of its own on Ray's path and with
transparent mode, results identical run by run; the fabric moved the ActorPool's arguments and
Ray's object managers none of them (they moved every one on Ray's path)."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench", "library_coverage.py")
MiB = 1 << 20


def test_actor_pool_and_tree_reduce(tmp_path):
    out = tmp_path / "coverage.json"
    cmd = [sys.executable, BENCH, "--workloads", "actor-pool,tree-reduce", "--blocks", "4", "--block-mib", "2",
           "--reps", "1", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"{cmd} -> {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    doc = json.loads(out.read_text())
    assert not doc["failed"], doc["failed"]
    assert all(s["identical"] for s in doc["summary"].values()), doc["summary"]
    rows = {(r["workload"], r["way"]): r for r in doc["rows"]}
    fabric, ray_path = rows[("actor-pool", "rayfabric")], rows[("actor-pool", "ray")]
    assert fabric["fabric_bytes"] >= 4 * 2 * MiB, fabric
    assert fabric["ray_bytes"] < 1 * MiB, fabric
    assert ray_path["fabric_bytes"] == 0 and ray_path["ray_bytes"] >= 4 * 2 * MiB, ray_path
    assert "coverage" in p.stdout and "actor-pool" in p.stdout
