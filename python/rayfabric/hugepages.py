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

from rayfabric import doctor

HUGE_PAGE = 2 << 20
NR_HUGEPAGES = "/proc/sys/vm/nr_hugepages"

# Runs until its stdin reaches EOF: when `mounts` closes it, and equally when the caller dies,
# since it runs in a session of its own. Unmounts (waiting for the last raylet or agent to let go,
# lazily after 60 s), removes the mount points and puts vm.nr_hugepages back.
_JANITOR = r"""
import os, subprocess, sys, time
sys.stdin.read()
nr_hugepages, original, dirs = sys.argv[1], sys.argv[2], sys.argv[3:]
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
with open(nr_hugepages, "w") as f:
    f.write(original)
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


@contextlib.contextmanager
def mounts(names: Sequence[str], pages: int) -> Iterator[dict[str, str]]:
    """{name: hugetlbfs mount point} for each name, with `pages` more 2 MiB pages reserved; undone on
    exit. Raises Unavailable (before changing anything it could not undo) when this host cannot."""
    if os.geteuid() != 0:
        raise Unavailable("needs root: reserves huge pages (/proc/sys/vm/nr_hugepages) and mounts hugetlbfs")
    if "hugetlbfs" not in Path("/proc/filesystems").read_text():
        raise Unavailable("this kernel has no hugetlbfs")
    if meminfo()["Hugepagesize"] != HUGE_PAGE:
        raise Unavailable(f"the default huge page size is {meminfo()['Hugepagesize']} bytes, not 2 MiB")
    try:
        original = int(Path(NR_HUGEPAGES).read_text())
    except (OSError, ValueError) as e:
        raise Unavailable(f"cannot read {NR_HUGEPAGES}: {e}") from e
    dirs = {name: tempfile.mkdtemp(prefix=f"rayfabric-hugetlbfs-{name}-") for name in names}
    janitor = subprocess.Popen([sys.executable, "-c", _JANITOR, NR_HUGEPAGES, str(original), *dirs.values()],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        try:
            Path(NR_HUGEPAGES).write_text(str(original + pages))
        except OSError as e:
            raise Unavailable(f"cannot reserve huge pages ({NR_HUGEPAGES}): {e}") from e
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
