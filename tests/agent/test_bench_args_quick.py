"""`rayfabric bench args` in a tiny form against its embedded 3-node cluster: both paths of each
case (a reduce, an actor's calls, actors' creation) run and verify every result; the
default-scheduled reduce ran every task where the hook predicted Ray would, its agent read the
blocks it lacked, and Ray's own object managers received none of their bytes (they received every
one on Ray's path); so for the created actors' arguments."""
import json
import os
import subprocess
import sys

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
MiB = 1 << 20


def test_reduce_and_actor_cases(tmp_path):
    out = tmp_path / "bench-args.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(PYTHON_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "rayfabric", "bench", "args", "--cases", "reduce,actor,create", "--blocks", "4",
           "--block-mib", "2", "--rounds", "1", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=500)
    assert p.returncode == 0, f"{cmd} -> {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    rows = {(r["case"], r["path"]): r for r in json.loads(out.read_text())["rows"]}
    assert sorted(rows) == [("actor", "ray"), ("actor", "rayfabric-sealed"), ("create", "ray"),
                            ("create", "rayfabric-sealed"), ("reduce", "ray"), ("reduce", "rayfabric-sealed")], sorted(rows)
    assert all(r["ok"] and r["seconds"] > 0 for r in rows.values()), rows
    ray_path, fabric = rows[("reduce", "ray")], rows[("reduce", "rayfabric-sealed")]
    assert fabric["tasks"] == 2 and fabric["ran_where_predicted"] == 2, fabric
    assert fabric["outcomes"]["objects_pulled"] == 2, fabric["outcomes"]
    assert ray_path["outcomes"]["objects_pulled"] == 0, ray_path["outcomes"]
    # Ray's path moves the 2 blocks that cross (2 x 2 MiB); with the fabric, Ray moves none of them.
    assert ray_path["ray_received"] >= 4 * MiB, ray_path
    assert fabric["ray_received"] < 1 * MiB, fabric
    assert rows[("actor", "rayfabric-sealed")]["outcomes"]["objects_pulled"] == 4
    # Actors created on the mapper node with the 4 blocks as constructor arguments: all 4 by the
    # fabric, none of their bytes by Ray's object managers (all 8 MiB on Ray's path).
    made_ray, made_fabric = rows[("create", "ray")], rows[("create", "rayfabric-sealed")]
    assert made_fabric["outcomes"]["objects_pulled"] == 4, made_fabric["outcomes"]
    assert None not in (made_ray["ray_received"], made_fabric["ray_received"]), "Ray's metric was not read"
    assert made_ray["ray_received"] >= 8 * MiB and made_fabric["ray_received"] < 1 * MiB, (made_ray, made_fabric)
    assert "ran where predicted" in p.stdout, p.stdout[-2000:]
