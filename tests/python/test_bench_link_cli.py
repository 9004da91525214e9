"""`rayfabric bench --link` refuses what it cannot do before it makes any namespace."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from rayfabric import bench_link  # noqa: E402


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "rayfabric", "bench", "--link", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_the_kernels_congestion_controls_are_read():
    offered = bench_link.available_congestion()
    with open("/proc/sys/net/ipv4/tcp_congestion_control") as f:
        assert f.read().strip() in offered   # the host's own is always one of them


def test_an_unknown_congestion_control_is_refused_with_what_the_kernel_offers():
    p = run("2gbit", "--quick", "--congestion", "no-such-cc")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--congestion no-such-cc: this kernel offers" in p.stderr
    for name in bench_link.available_congestion():
        assert name in p.stderr
    assert "tcp_available_congestion_control" in p.stderr and "modprobe tcp_<name>" in p.stderr


def test_a_bad_rate_is_refused_before_anything_starts():
    p = run("10gbit,fast", "--sizes", "1M")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--link: rate 'fast': use e.g. 500mbit, 1gbit, 10gbit" in p.stderr and "Traceback" not in p.stderr
