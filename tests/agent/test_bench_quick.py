"""`rayfabric bench` in a tiny mode against its embedded 3-node cluster: every case and size has
positive throughput on both paths, the provider, verified bytes, and rayfabric really moved the
objects by the fabric (no fallback to Ray's path)."""
import importlib
import json
import os
import subprocess
import sys

import pytest

PROVIDER = (os.environ.get("RAYFABRIC_TEST_PROVIDERS") or "tcp;ofi_rxm").split(",")[0]
PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "bench.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(PYTHON_DIR) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "rayfabric", "bench", "--provider", PROVIDER, "--sizes", "1M", "--kinds", "numpy",
           "--reps", "2", "--cases", "single,owned,many", "--many-count", "20", "--touch", "0", "--store", "1G",
           "--json", str(out), "--plots", str(tmp / "plots")]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, f"{cmd} -> {p.returncode}\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    with open(out) as f:
        doc = json.load(f)
    return {"doc": doc, "stdout": p.stdout, "plots": tmp / "plots"}


def test_every_case_and_size_has_both_paths(report):
    rows = report["doc"]["rows"]
    got = sorted((r["case"], r["count"], r["size"]) for r in rows)
    assert got == [("many", 20, 64 << 10), ("many", 20, 1 << 20), ("owned", 1, 1 << 20), ("single", 1, 1 << 20)], got
    for r in rows:
        for path in ("ray", "rayfabric"):
            res = r[path]
            assert res["path"] == path and res["gbps"] > 0 and res["e2e_gbps"] > 0, (path, res)
            assert res["p50_ms"] > 0 and res["p99_ms"] >= res["p50_ms"], res
            assert res["verified_reps"] >= 1 and res["bytes_ok"] is True, (path, res)
            assert res["cpu_s_per_gb"]["src"] >= 0 and res["cpu_s_per_gb"]["dst"] >= 0
        assert r["provider"] == PROVIDER and r["rayfabric"]["provider"] == PROVIDER
        assert r["bytes_ok"] is True and r["ratio"] > 0


def test_rayfabric_moved_the_bytes_by_the_fabric(report):
    for r in report["doc"]["rows"]:
        fab = r["rayfabric"]["fabric"]
        assert fab["fallbacks"] == 0, fab
        assert fab["objects_pulled"] == fab["objects_requested"] == r["count"] * r["rayfabric"]["reps"], fab
        assert fab["bytes_pulled"] >= r["size"] * fab["objects_pulled"], fab


def test_ceiling_table_and_plots(report):
    doc = report["doc"]
    ceiling = doc["ceilings"][PROVIDER]
    assert "error" not in ceiling, ceiling
    assert ceiling["tcp_stream_gbps"] > 0 and ceiling["memcpy_gbps"] > 0
    for r in doc["rows"]:
        assert r["ceiling_gbps"] > 0 and r["fraction_of_ceiling"] > 0, r
    assert f"provider {PROVIDER}" in report["stdout"] and "rf/Ray" in report["stdout"]
    # the host's TCP congestion control, which moves both paths on TCP (docs/benchmarks.md)
    cc_file = "/proc/sys/net/ipv4/tcp_congestion_control"
    congestion = None
    if os.path.exists(cc_file):
        with open(cc_file) as f:
            congestion = f.read().strip()
    assert doc["meta"]["machine"]["tcp_congestion_control"] == congestion
    if congestion:
        assert f"TCP congestion control on this host: {congestion}" in report["stdout"]
    try:
        importlib.import_module("matplotlib")  # as the bench does: plots only where it imports
    except ImportError:
        assert "plots skipped: matplotlib is not installed" in report["stdout"]
        return
    assert sorted(p.name for p in report["plots"].iterdir()) == ["bench_cases.png", "bench_latency.png",
                                                                 "bench_throughput.png"]
