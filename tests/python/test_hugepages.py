"""rayfabric.tools.hugepages (what `rayfabric bench --huge-pages` and the huge-page agent test stand
on): pages reserved and hugetlbfs mounted for real, and everything given back, at a normal exit and
when the process that asked is SIGKILLed; the refusals say why.

Run: python3 -m pytest tests/python/test_hugepages.py (as root for the reserving tests)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from rayfabric.tools import hugepages  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": str(ROOT / "python")}


def nr_hugepages():
    return int(Path(hugepages.NR_HUGEPAGES).read_text())


def wait_until(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_bench_refuses_huge_pages_on_a_cluster_it_did_not_start():
    r = subprocess.run([sys.executable, "-m", "rayfabric", "bench", "--huge-pages", "--address", "127.0.0.1:1"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode != 0
    assert "--huge-pages applies to the embedded cluster" in r.stderr, r.stderr


def test_without_root_nothing_is_changed_and_the_reason_is_given():
    # As root: imported first (Ray's files may be readable by root only), then root dropped.
    code = ("import os\n"
            "from rayfabric.tools import hugepages\n"
            "if os.geteuid() == 0:\n"
            "    os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
            "try:\n"
            "    with hugepages.mounts(['a'], 4):\n"
            "        print('MOUNTED')\n"
            "except hugepages.Unavailable as e:\n"
            "    print('UNAVAILABLE', e)\n")
    cmd = [sys.executable, "-c", code]
    before = nr_hugepages()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "UNAVAILABLE needs root: reserves huge pages" in r.stdout, (r.stdout, r.stderr)
    assert nr_hugepages() == before


def reserving():
    """Skips unless this host lets the test reserve and mount (root, hugetlbfs, 2 MiB pages)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: reserves huge pages and mounts hugetlbfs")
    if "hugetlbfs" not in Path("/proc/filesystems").read_text():
        pytest.skip("this kernel has no hugetlbfs")


def test_pages_and_mounts_are_given_back_at_exit():
    reserving()
    before = nr_hugepages()
    try:
        with hugepages.mounts(["a", "b"], 8) as dirs:
            assert set(dirs) == {"a", "b"}
            for d in dirs.values():
                assert os.path.ismount(d), d
                # A file there is backed by 2 MiB pages: one page, whatever was asked.
                f = Path(d) / "probe"
                with open(f, "wb") as out:
                    os.posix_fallocate(out.fileno(), 0, 4096)
                assert f.stat().st_blocks * 512 == hugepages.HUGE_PAGE
                f.unlink()
            assert nr_hugepages() == before + 8
    except hugepages.Unavailable as e:
        pytest.skip(str(e))
    assert nr_hugepages() == before
    for d in dirs.values():
        assert not os.path.exists(d), d


def test_a_killed_owner_leaves_nothing_behind():
    """The janitor outlives the process that reserved: SIGKILL it while mounted, and the mounts and
    pages are still given back."""
    reserving()
    before = nr_hugepages()
    code = ("import sys, time\n"
            "from rayfabric.tools import hugepages\n"
            "try:\n"
            "    with hugepages.mounts(['k'], 4) as dirs:\n"
            "        print('MOUNTED', dirs['k'], flush=True)\n"
            "        time.sleep(600)\n"
            "except hugepages.Unavailable as e:\n"
            "    print('UNAVAILABLE', e, flush=True)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=ENV)
    try:
        line = p.stdout.readline().split(maxsplit=1)
        if line and line[0] == "UNAVAILABLE":
            pytest.skip(line[1].strip())
        assert line and line[0] == "MOUNTED", line
        mount = line[1].strip()
        assert os.path.ismount(mount)
        assert nr_hugepages() == before + 4
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert wait_until(lambda: not os.path.exists(mount) and nr_hugepages() == before), \
        (os.path.exists(mount), nr_hugepages(), before)


def test_another_reservation_made_meanwhile_stays():
    """What is given back is what was added, not the count seen at the start: pages another user
    reserved while the mounts were up stay reserved."""
    reserving()
    before = nr_hugepages()
    try:
        with hugepages.mounts(["c"], 6):
            Path(hugepages.NR_HUGEPAGES).write_text(str(nr_hugepages() + 3))  # someone else's
    except hugepages.Unavailable as e:
        pytest.skip(str(e))
    finally:
        after = nr_hugepages()
        Path(hugepages.NR_HUGEPAGES).write_text(str(before))
    assert after == before + 3, (before, after)


def test_more_pages_than_memory_are_refused_before_anything_changes():
    reserving()
    before = nr_hugepages()
    available = int(next(ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                         if ln.startswith("MemAvailable:"))) * 1024
    with pytest.raises(hugepages.Unavailable, match="do not fit in this host's available memory"):
        with hugepages.mounts(["d"], available // hugepages.HUGE_PAGE + 1):
            pass
    assert nr_hugepages() == before


def test_a_reservation_the_kernel_refuses_changes_nothing_and_says_why(tmp_path):
    """The write to nr_hugepages fails for real: the child runs in a mount namespace of its own
    where /proc/sys is read-only. It gets the kernel's reason; no page is reserved, nothing is
    mounted, and its mount points are gone."""
    reserving()
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare --mount is not available here")
    code = ("from rayfabric.tools import hugepages\n"
            "try:\n"
            "    with hugepages.mounts(['e', 'f'], 4):\n"
            "        print('MOUNTED')\n"
            "except hugepages.Unavailable as e:\n"
            "    print('UNAVAILABLE', e)\n")
    read_only_proc_sys = "mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys && exec \"$@\""
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", read_only_proc_sys, "sh",
           sys.executable, "-c", code]
    before = nr_hugepages()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**ENV, "TMPDIR": str(tmp_path)}, timeout=120)
    if r.returncode != 0 and "mount" in r.stderr and "UNAVAILABLE" not in r.stdout:
        pytest.skip(f"/proc/sys cannot be made read-only in a mount namespace here: {r.stderr.strip()[:200]}")
    assert r.returncode == 0, r.stderr
    assert "UNAVAILABLE cannot reserve huge pages (/proc/sys/vm/nr_hugepages)" in r.stdout, (r.stdout, r.stderr)
    assert "Read-only file system" in r.stdout, r.stdout
    assert nr_hugepages() == before
    assert list(tmp_path.iterdir()) == []  # the mount points made for e and f are removed
