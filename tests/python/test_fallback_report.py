"""rayfabric.api's fallback reports to the node's agent (ReportFallbacks), where they fail: they must
never slow or fail the get that fell back. The reports that arrive are checked against real agents
in tests/agent/test_fallback_status_real_ray.py.

Run: python3 -m pytest tests/python/test_fallback_report.py"""
import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from rayfabric import _pulls, api, metrics  # noqa: E402


def wait_for(condition, timeout):
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@pytest.fixture
def silent_agent():
    """A Unix socket that accepts connections and never answers (a hung agent)."""
    path = os.path.join(tempfile.mkdtemp(prefix="rf-hung-"), "agent.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except socket.timeout:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield "unix:" + path
    stop.set()
    t.join()
    for c in held:
        c.close()
    server.close()


def failed():
    return api.stats()["fallback_reports_failed"]


def test_a_hung_agent_delays_no_fallback(silent_agent, monkeypatch):
    monkeypatch.setattr(_pulls._FallbackReporter, "TIMEOUT_S", 1.0)
    reporter = _pulls._FallbackReporter(address_fn=lambda: silent_agent)
    before = failed()
    t0 = time.monotonic()
    for i in range(1000):
        reporter.add(f"pull failed: Unavailable {i % 3}", 1)
    assert time.monotonic() - t0 < 0.5, "adding a report waited for the agent"
    # The first report hangs until its timeout, then is dropped and counted; the rest follow it.
    assert wait_for(lambda: failed() > before, 10), "the hung report was not given up"
    assert wait_for(reporter.idle, 10)


def test_no_agent_here_is_counted_not_raised(monkeypatch):
    reporter = _pulls._FallbackReporter(address_fn=lambda: None)
    before = failed()
    reporter.add("no rayfabric agent on this node (*)", 2)
    assert wait_for(reporter.idle, 10) and failed() == before + 1
    # A socket path with nothing behind it: refused at once, counted, and looked up again next time.
    reporter.address = "unix:" + os.path.join(tempfile.mkdtemp(prefix="rf-none-"), "nothing.sock")
    reporter.add("pull failed: Unavailable", 1)
    assert wait_for(reporter.idle, 10) and failed() == before + 2
    assert reporter.address is None


def test_flush_at_exit_does_not_ask_ray(monkeypatch):
    asked = []
    reporter = _pulls._FallbackReporter(address_fn=lambda: asked.append(1))
    with reporter._cv:  # pending, no thread yet: as at exit before the thread ran
        reporter._pending["pull failed: Aborted"] = 1
    before = failed()
    reporter.flush()
    assert asked == [] and failed() == before + 1 and not reporter._pending


def test_pending_reasons_are_bounded():
    reporter = _pulls._FallbackReporter(address_fn=lambda: None)
    with reporter._cv:  # hold the reporter's thread off while filling
        reporter._thread = threading.current_thread()  # looks alive: add starts no thread
        for i in range(_pulls._FallbackReporter.MAX_PENDING * 2):
            reporter.add(f"reason {i}", 1)
        pending = dict(reporter._pending)
    assert len(pending) == _pulls._FallbackReporter.MAX_PENDING + 1
    assert pending[_pulls._FallbackReporter.OTHER] == _pulls._FallbackReporter.MAX_PENDING


@pytest.mark.parametrize("reason, label", [
    ("pull failed: ResourceExhausted: store full: 512 MiB", "pull failed: ResourceExhausted"),
    ("no rayfabric agent on this node (0123456789ab): rayfabric.init()", "no rayfabric agent on this node (*)"),
    ("no fabric shared with the node(s) holding the object: this node speaks tcp;ofi_rxm; 0123456789ab speaks "
     "sockets", "no fabric shared with the node(s) holding the object"),
    ("local agent did not answer (UNAVAILABLE): unix:/tmp/x.sock", "local agent did not answer (UNAVAILABLE)"),
    ("unexpected error before the pull: RuntimeError: boom", "unexpected error before the pull: RuntimeError"),
    ("", "unknown"),
])
def test_reason_class(reason, label):
    assert metrics.reason_class(reason) == label


def test_a_malformed_report_timeout_is_refused_with_what_it_allows():
    # Read when rayfabric.api is imported: refused there, naming the variable, as every setting of
    # python/rayfabric/settings.py is (under transparent mode the start-up hook says so, and the
    # process keeps Ray's path).
    import subprocess
    for bad in ("abc", "-1"):
        out = subprocess.run([sys.executable, "-c", "import rayfabric.api, rayfabric._pulls as a; print(a._FallbackReporter.TIMEOUT_S)"],
                             env=dict(os.environ, PYTHONPATH=str(ROOT / "python"),
                                      RAYFABRIC_FALLBACK_REPORT_TIMEOUT_S=bad),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode != 0, out
        assert f"RAYFABRIC_FALLBACK_REPORT_TIMEOUT_S={bad!r}: use seconds, >= 0 (default '2')" in out.stderr, out
    out = subprocess.run([sys.executable, "-c", "import rayfabric.api, rayfabric._pulls as a; print(a._FallbackReporter.TIMEOUT_S)"],
                         env=dict(os.environ, PYTHONPATH=str(ROOT / "python"), RAYFABRIC_FALLBACK_REPORT_TIMEOUT_S="0.5"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "0.5", out