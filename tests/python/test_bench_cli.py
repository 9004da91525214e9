"""`rayfabric bench --link` refuses what it cannot do before it makes any namespace; `rayfabric
bench --report` says what TCP congestion control the runs it merges recorded."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

import pytest  # noqa: E402

from rayfabric import bench_link, netns  # noqa: E402


def run_bench(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "rayfabric", "bench", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def run(*args):
    return run_bench("--link", *args)


needs_lists = pytest.mark.skipif(bench_link.congestion_list("allowed") is None,
                                 reason="this kernel has no per-namespace TCP congestion control")


@needs_lists
def test_the_kernels_congestion_controls_are_read():
    available, allowed = bench_link.congestion_list("available"), bench_link.congestion_list("allowed")
    assert set(allowed) <= set(available)
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        assert f.read().strip() in available   # the namespace's own is always one of them
    assert bench_link.congestion_refusal(allowed[0]) is None


@needs_lists
def test_an_unknown_congestion_control_is_refused_with_what_the_kernel_offers():
    why = bench_link.congestion_refusal("no_such_cc")
    assert why.startswith("this kernel offers ") and "modprobe tcp_no_such_cc" in why
    for name in bench_link.congestion_list("available"):
        assert name in why
    p = run("2gbit", "--quick", "--congestion", "no_such_cc")
    if p.returncode == 77:
        pytest.skip(p.stdout.strip())   # not root / no ip netns: refused later, as the skip says
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"--congestion no_such_cc: {why}" in p.stderr and "Traceback" not in p.stderr


def test_a_congestion_control_namespaces_may_not_choose_is_refused_with_the_fix(monkeypatch):
    lists = {"available": ["reno", "cubic", "bbr"], "allowed": ["reno", "cubic"]}
    monkeypatch.setattr(bench_link, "congestion_list", lambda kind: lists[kind])
    why = bench_link.congestion_refusal("bbr")
    assert why == ("network namespaces may choose only from reno, cubic (tcp_allowed_congestion_control; "
                   "`sysctl -w net.ipv4.tcp_allowed_congestion_control=\"reno cubic bbr\"` allows it)")
    assert bench_link.congestion_refusal("cubic") is None
    monkeypatch.setattr(bench_link, "congestion_list", lambda kind: None)
    assert "kernel before 4.15" in bench_link.congestion_refusal("cubic")


def test_bad_sizes_and_reps_are_refused_before_anything_starts():
    for args, said in ((["--sizes", "64X"], "--sizes '64X': use sizes such as 64M,512M"),
                       (["--sizes", ","], "give at least one size above zero"),
                       (["--reps", "0"], "--reps: at least 1")):
        p = run("2gbit", *args)
        assert p.returncode == 2 and said in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)
    p = run("", "--sizes", "1M")
    assert p.returncode == 2 and "--link: no rate given" in p.stderr


def test_report_says_when_its_runs_differ(tmp_path):
    files = []
    for i, cc in enumerate(("bbr", "cubic", None)):
        machine = {"cpus": 2} if cc is None else {"cpus": 2, "tcp_congestion_control": cc}
        f = tmp_path / f"run{i}.json"
        f.write_text(json.dumps({"meta": {"command": "bench", "machine": machine}, "ceilings": {}, "results": []}))
        files.append(str(f))
    p = run_bench("--report", files[0], files[0], "--json", str(tmp_path / "same.json"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("TCP congestion control recorded in the runs: bbr\n")
    p = run_bench("--report", files[0], files[1], files[2], "--json", str(tmp_path / "merged.json"))
    assert p.returncode == 0, p.stderr
    said = "differs between the files: bbr, cubic, not recorded"
    assert p.stdout.startswith(f"TCP congestion control recorded in the runs: {said}\n")
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["meta"]["machine"]["tcp_congestion_control"] == said
    # a report of reports keeps what its parts recorded
    p = run_bench("--report", str(tmp_path / "merged.json"), str(tmp_path / "same.json"))
    assert p.stdout.startswith("TCP congestion control recorded in the runs: differs between the files: "
                               "bbr, cubic, not recorded, bbr, bbr\n")


def test_a_bad_rate_is_refused_before_anything_starts():
    p = run("10gbit,fast", "--sizes", "1M")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--link: rate 'fast': use e.g. 500mbit, 1gbit, 10gbit" in p.stderr and "Traceback" not in p.stderr


def test_a_namespace_that_refuses_the_congestion_control_is_a_clear_error():
    """The kernel itself refusing the write (here: no such algorithm), in a namespace of its own."""
    pair = netns.NetnsPair(links=1, congestion="not_a_real_cc")
    with pytest.raises(RuntimeError, match="not a kernel module name"):
        netns.NetnsPair(links=1, congestion="cubic; touch /x")._set_congestion("unused")
    if os.geteuid() != 0 or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        pytest.skip("needs root and ip netns")
    ns = "rfcctest"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        with pytest.raises(RuntimeError) as e:
            pair._set_congestion(ns)
        said = str(e.value)
        assert said.startswith(f"cannot set TCP congestion control not_a_real_cc in namespace {ns}: ")
        assert "tcp_allowed_congestion_control lists" in said
        assert bench_link.congestion_in(ns) == bench_link.tcp_sysctl("tcp_congestion_control")  # left as it was
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
