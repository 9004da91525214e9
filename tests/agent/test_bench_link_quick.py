"""`rayfabric bench link --link 2gbit --quick --congestion NAME` as a user runs it (the CI form of
the link bench): two `ray start` nodes in network namespaces, one tc-shaped link, Ray and rayfabric
next to raw fi_read and TCP, every byte verified. NAME is an algorithm the kernel has other than
the host's default (cubic on Debian's kernel, where a fresh machine allows only `reno bbr` in
namespaces), run twice:
- only available (not in net.ipv4.tcp_allowed_congestion_control): the bench says it allows it for
  the run, the namespaces have it, and the list is what it was once the bench exits;
- allowed already: nothing is said of the list and nothing changes.
And once SIGTERM'd while its nodes run (as a timeout ends it): the namespaces are gone and the list
is set back. The host's own list is written back after every test, whatever happened.

Needs root and `ip netns` (skipped otherwise, with the reason)."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rayfabric.bench import link as bench_link
from rayfabric.tools import netns

ROOT = Path(__file__).resolve().parents[2]


read_allowed, write_allowed = netns.read_allowed_congestion, netns.write_allowed_congestion


@pytest.fixture
def spare():
    """(an algorithm the kernel has besides the host's default, the host's allowed list); the list
    is written back after the test."""
    why = netns.NetnsPair.available()
    if why:
        pytest.skip(why)
    if bench_link.congestion_list("allowed") is None:
        pytest.skip("this kernel has no per-namespace TCP congestion control")
    default = bench_link.tcp_sysctl("tcp_congestion_control")
    others = [n for n in bench_link.congestion_list("available") if n != default]
    if not others:
        pytest.skip(f"this kernel has no TCP congestion control besides {default}")
    host = read_allowed()
    yield others[-1], host
    write_allowed(host)


def bench(name, **kw):
    cmd = [sys.executable, "-m", "rayfabric", "bench", "link", "--link", "2gbit", "--quick", "--congestion", name]
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kw)


def finish(p, timeout=540):
    out, _ = p.communicate(timeout=timeout)
    print(out)
    return out


def assert_verified_run(p, out, name):
    assert p.returncode == 0, out
    assert f"  TCP congestion control in the namespaces: {name}\n" in out
    assert "bytes verified: all (4 gets, sha256 against the source's); rayfabric gets that did not move their " \
           "object by the fabric: 0" in out
    assert "raw ceiling not measured" not in out


def test_an_algorithm_only_available_is_allowed_for_the_run(spare):
    name, host = spare
    write_allowed([n for n in host if n != name])   # as a fresh machine has it
    before = read_allowed()
    p = bench(name)
    out = finish(p)
    assert_verified_run(p, out, name)
    assert (f"  --congestion {name}: the kernel has it, but network namespaces may choose only from "
            f"{', '.join(before)} (net.ipv4.tcp_allowed_congestion_control); allowed for this run (set to "
            f"\"{' '.join(before + [name])}\"), set back to \"{' '.join(before)}\" at exit\n") in out
    assert (f"net.ipv4.tcp_allowed_congestion_control set back to \"{' '.join(before)}\" (as before the run)\n"
            in out)
    assert read_allowed() == before


def test_an_algorithm_allowed_already_leaves_the_list_alone(spare):
    name, host = spare
    write_allowed(sorted(set(host) | {name}))
    before = read_allowed()
    p = bench(name)
    out = finish(p)
    assert_verified_run(p, out, name)
    assert "tcp_allowed_congestion_control" not in out
    assert read_allowed() == before


def test_a_run_ended_by_sigterm_tears_down_and_sets_the_list_back(spare):
    name, host = spare
    write_allowed([n for n in host if n != name])
    before = read_allowed()
    p = bench(name)
    seen = []
    try:
        for line in p.stdout:   # until both nodes run in their namespaces
            seen.append(line)
            if line.startswith("  TCP congestion control in the namespaces:"):
                break
        assert name in read_allowed(), "".join(seen)
        p.send_signal(signal.SIGTERM)
        out = "".join(seen) + finish(p, timeout=120)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM, out
    assert f"set back to \"{' '.join(before)}\" (as before the run)" in out
    assert read_allowed() == before
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in names for ns in netns.NAMESPACES), names
