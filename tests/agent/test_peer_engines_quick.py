"""bench/peer_engines.py in a tiny form: one-sided reads of 4 KiB and 1 MiB between two processes
through rayfabric's engine (tcp;ofi_rxm and shm) and, where they are installed and load here, the
peer engines (Mooncake Transfer Engine, NIXL): every engine that ran read exactly the target's
bytes; one that did not run says why; the table has a row per size."""
import importlib.util
import json
import os
import subprocess
import sys


def installed(module):
    return importlib.util.find_spec(module) is not None


BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peer_engines.py")


def test_peer_engines_side_by_side(tmp_path):
    out = tmp_path / "peer-engines.json"
    cmd = [sys.executable, BENCH, "--sizes", "4K,1M", "--timeout", "60", "--json", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, f"{cmd} -> {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    print(p.stdout)
    results = json.loads(out.read_text())["results"]
    ran = {(r["engine"], r["how"]): r for r in results if r["rows"]}
    assert {("rayfabric", "tcp;ofi_rxm"), ("rayfabric", "tcp;ofi_rxm, RAYFABRIC_PROGRESS_SPIN_US=50"),
            ("rayfabric", "shm")} <= set(ran), results
    # A peer engine installed here (scripts/setup.sh installs both) must have run over TCP.
    if installed("mooncake"):
        assert ("mooncake", "tcp") in ran, results
    if installed("nixl_cu12"):
        assert ("nixl", "UCX, UCX_TLS=tcp") in ran, results
    for r in ran.values():
        assert [row["size"] for row in r["rows"]] == [4096, 1 << 20], r
        assert all(row["verified"] and row["iters"] >= 10 and row["gbps"] > 0 for row in r["rows"]), r
    for r in results:
        if not r["rows"]:
            assert r["skipped"], r  # never silently absent
    assert "   4K |" in p.stdout and "   1M |" in p.stdout, p.stdout
