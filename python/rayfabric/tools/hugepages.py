"""Plasma stores on huge pages for a local Ray cluster (`rayfabric bench --huge-pages`, the tests):
2 MiB pages added to /proc/sys/vm/nr_hugepages and one hugetlbfs mount per node, all undone
afterwards by a janitor process that outlives the caller however it ends (teardown, SIGTERM,
SIGKILL). Ray's `plasma_directory` on such a mount with `huge_pages=True` maps the store from it
(only `RayParams`, e.g. `ray.cluster_utils.Cluster`, turns huge pages on: `ray start` cannot)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from rayfabric.tools import doctor

HUGE_PAGE = 2 << 20
NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"

# Runs until its stdin reaches EOF: when `mounts` closes it, and equally when the caller dies,
# since it runs in a session of its own. Unmounts (waiting for the last raylet or agent to let go,
# lazily after 60 s), removes the mount points, and takes back the pages `mounts` added (it says
# how many on stdin, once the kernel has them): the current count less those, not the count seen
# at the start, so that another user's reservation made meanwhile stays.
_JANITOR = r"""
import os, subprocess, sys, time
added = 0
for line in sys.stdin:
    if line.startswith("added "):
        added = int(line.split()[1])
nr_hugepages, dirs = sys.argv[1], sys.argv[2:]
deadline = time.monotonic() + 60
for d in dirs:
    while os.path.ismount(d) and subprocess.run(["umount", d], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            subprocess.run(["umount", "-l", d], capture_output=True)
            break
        time.sleep(0.5)
    try:
        os.rmdir(d)
    except OSError:
        pass
if added > 0:
    with open(nr_hugepages, "r+") as f:
        now = int(f.read())
        f.seek(0)
        f.write(str(max(0, now - added)))
"""


class Unavailable(Exception):
    """Huge pages cannot be set up here; the message says why and what would allow it."""


def meminfo() -> dict[str, int]:
    """HugePages_* counts (pages) and Hugepagesize (bytes) from /proc/meminfo."""
    mi = doctor.parse_meminfo(Path("/proc/meminfo").read_text())
    return {k: mi.get(k, 0) for k in ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "Hugepagesize")}


def pages_for_stores(store_bytes: int, stores: int) -> int:
    """The 2 MiB pages `stores` plasma stores of `store_bytes` each map on huge pages (Ray rounds each
    up to a multiple of 1 GiB, plus 8 bytes), and some slack."""
    return stores * doctor.plasma_hugepages(store_bytes, HUGE_PAGE) + 64


def check(pages: int = 0) -> None:
    """Raises Unavailable unless this host can reserve `pages` huge pages and mount hugetlbfs (the
    checks `mounts` makes before it changes anything)."""
    if os.geteuid() != 0:
        raise Unavailable("needs root: reserves huge pages (/proc/sys/vm/nr_hugepages) and mounts hugetlbfs")
    if "hugetlbfs" not in Path("/proc/filesystems").read_text():
        raise Unavailable("this kernel has no hugetlbfs")
    mi = doctor.parse_meminfo(Path("/proc/meminfo").read_text())
    if mi.get("Hugepagesize") != HUGE_PAGE:
        raise Unavailable(f"the default huge page size is {mi.get('Hugepagesize', 0)} bytes, not 2 MiB")
    available = mi.get("MemAvailable", 0)
    margin = 2 << 30  # what the raylets, agents and workers themselves need
    if pages * HUGE_PAGE > available - margin:
        raise Unavailable(f"{pages} huge pages ({pages * HUGE_PAGE >> 20} MiB) do not fit in this host's available "
                          f"memory ({available >> 20} MiB, {margin >> 20} MiB kept for the processes): use smaller "
                          f"stores (--store) or fewer nodes")


@contextlib.contextmanager
def mounts(names: Sequence[str], pages: int) -> Iterator[dict[str, str]]:
    """{name: hugetlbfs mount point} for each name, with `pages` more 2 MiB pages reserved; undone on
    exit. Raises Unavailable (before changing anything it could not undo) when this host cannot."""
    check(pages)
    try:
        original = int(Path(NR_HUGEPAGES).read_text())
    except (OSError, ValueError) as e:
        raise Unavailable(f"cannot read {NR_HUGEPAGES}: {e}") from e
    dirs: dict[str, str] = {}
    try:
        for name in names:
            dirs[name] = tempfile.mkdtemp(prefix=f"rayfabric-hugetlbfs-{name}-")
        janitor = subprocess.Popen([sys.executable, "-c", _JANITOR, NR_HUGEPAGES, *dirs.values()],
                                   stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True, text=True)
    except BaseException:
        for d in dirs.values():
            os.rmdir(d)
        raise
    try:
        try:
            Path(NR_HUGEPAGES).write_text(str(original + pages))
        except OSError as e:
            raise Unavailable(f"cannot reserve huge pages ({NR_HUGEPAGES}): {e}") from e
        finally:
            # What the kernel really added (it may find fewer free pages than asked for).
            janitor.stdin.write(f"added {max(0, int(Path(NR_HUGEPAGES).read_text()) - original)}\n")
            janitor.stdin.flush()
        mi = meminfo()
        usable = mi["HugePages_Free"] - mi["HugePages_Rsvd"]
        if usable < pages:
            raise Unavailable(f"only {usable} of the {pages} huge pages wanted are free after raising "
                              f"nr_hugepages by {pages} (memory too fragmented or too small)")
        for d in dirs.values():
            r = subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M", "none", d],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise Unavailable(f"mount -t hugetlbfs failed: {(r.stderr or r.stdout).strip()}")
        yield dirs
    finally:
        janitor.stdin.close()
        janitor.wait(timeout=120)
