"""Ray's plasma store on huge pages (Ray's `--plasma-directory` on hugetlbfs with `--huge-pages`), on a
REAL Ray: a 2-node ray.cluster_utils.Cluster whose stores are each mapped from a hugetlbfs mount of
their own (2 MiB pages), one rayfabric agent per node, objects pulled across by the fabric.

  n0 (head, the driver's node): agent with RAYFABRIC_EXPOSURE=arena (the whole huge-page arena
      registered, in 64 MiB slices, and leased)
  n1: agent with RAYFABRIC_EXPOSURE=object (a registration per leased object)

What Ray 2.60 does with huge_pages=True (src/ray/object_manager/plasma/{store_runner,dlmalloc}.cc,
measured here): dlmalloc's granularity becomes 1 GiB, so the store's one mapping is its size rounded
UP to a multiple of 1 GiB, plus 8 bytes (kMmapRegionsGap): a 512 MiB store maps 1 GiB + 8 B of
hugetlbfs and reserves 513 pages of 2 MiB at mmap time (HugePages_Rsvd; MAP_SHARED hugetlbfs
reserves, it does not fault). Not enough free pages -> the raylet's mmap fails with ENOMEM and it
dies at startup (RAY_CHECK in plasma_allocator.cc). No ftruncate on hugetlbfs (the mmap sizes the
file). Fallback allocations (store full) go to the session directory, not hugetlbfs: the objects
here stay well under the store size.

Asserted: each raylet maps its store from its own mount in 2 MiB pages (/proc/<pid>/smaps), the
pool's committed pages grew by the stores, the raylet logs say what `rayfabric doctor` reads; objects
of odd sizes (under one page, one page, 64 MiB + 12345 B, 150 MiB + 3 B) cross both ways byte for
byte, all by the fabric (the reader's counters and its agent's pulled / fabric-read bytes equal the
objects' plasma sizes, no fallback, no failed pull), the replicas are local to the reader, both
agents map their node's hugetlbfs arena in 2 MiB pages with at least the objects' bytes of them in
their page tables, and the pool's free pages dropped by both copies.

Needs root (it reserves pages in /proc/sys/vm/nr_hugepages and mounts hugetlbfs); skipped with the
reason otherwise, or when the pages cannot be reserved or mounted. The page count, the mounts and
their directories are restored by a janitor process whatever happens (teardown, SIGTERM, SIGKILL)."""
import hashlib
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

import rayfabric
from rayfabric.tools import doctor
from rayfabric.tools import hugepages as rayfabric_hugepages

from ray_test_cluster import node_ids, on, produce, use_this_checkout

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
HUGE_PAGE = 2 * MiB
NODES = ("n0", "n1")
STORE = 512 * MiB
# Ray maps round_up(STORE, 1 GiB) + 8 bytes per store on huge pages (see above): 513 pages here.
PAGES_PER_STORE = -(-STORE // GiB) * (GiB // HUGE_PAGE) + 1
PAGES_WANTED = len(NODES) * PAGES_PER_STORE + 64  # + slack
# A tiny one (under a huge page, odd size), exactly one huge page, one that crosses many huge pages
# and is not a multiple of 2 MiB, one that crosses several 64 MiB registration slices.
SIZES = [200 * KiB + 7, 2 * MiB, 64 * MiB + 12345, 150 * MiB + 3]
NODE_ENV = {"n0": {"RAYFABRIC_EXPOSURE": "arena"}, "n1": {"RAYFABRIC_EXPOSURE": "object"}}
AGENT_ENV = {"RAYFABRIC_OP_TIMEOUT_MS": "60000", "RAYFABRIC_MAX_REGISTRATION": "64M"}


meminfo = rayfabric_hugepages.meminfo


def committed_pages(mi):
    """Pages in use plus pages promised to mappings (reserved, not yet faulted)."""
    return mi["HugePages_Total"] - mi["HugePages_Free"] + mi["HugePages_Rsvd"]


def hugetlb_mappings(pid, under):
    """The mappings of process `pid` whose file lies in directory `under`, from /proc/pid/smaps:
    [{"path", "size", "page", "hugetlb" (bytes of huge pages this process has mapped)}]."""
    out, cur = [], None
    header = re.compile(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$")
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = header.match(line)
        if m:
            path = m.group(1)
            cur = {"path": path, "size": 0, "page": 0, "hugetlb": 0} if path.startswith(under + "/") else None
            if cur is not None:
                out.append(cur)
            continue
        if cur is None or ":" not in line:
            continue
        key, _, rest = line.partition(":")
        if key not in ("Size", "KernelPageSize", "Shared_Hugetlb", "Private_Hugetlb"):
            continue
        value = int(rest.split()[0]) * KiB  # "<n> kB"
        if key == "Size":
            cur["size"] = value
        elif key == "KernelPageSize":
            cur["page"] = value
        elif key in ("Shared_Hugetlb", "Private_Hugetlb"):
            cur["hugetlb"] += value
    return out


@pytest.fixture(scope="module")
def hugepages():
    """{node name: hugetlbfs mount}, with PAGES_WANTED more 2 MiB pages reserved; undone afterwards
    (rayfabric.tools.hugepages: a janitor process restores them however this process ends)."""
    try:
        with rayfabric_hugepages.mounts(NODES, PAGES_WANTED) as dirs:
            yield dirs
    except rayfabric_hugepages.Unavailable as e:
        pytest.skip(str(e))


def raylet_pids(c):
    """{node id hex: raylet pid} of the cluster's nodes."""
    return {n.node_id: n.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
            for n in c.list_all_nodes()}


@pytest.fixture(scope="module")
def cluster(hugepages):
    use_this_checkout()
    baseline = meminfo()
    c = None
    try:
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "resources": {"n0": 100}, "object_store_memory": STORE, "include_dashboard": False,
            "plasma_directory": hugepages["n0"], "huge_pages": True})
        c.add_node(num_cpus=1, resources={"n1": 100}, object_store_memory=STORE,
                   plasma_directory=hugepages["n1"], huge_pages=True)
        ray.init(address=c.address, logging_level="ERROR")
        c.wait_for_nodes()
        nodes = node_ids(NODES)
        records = rayfabric.init(provider=os.environ.get("RAYFABRIC_TEST_PROVIDER") or None, env=AGENT_ENV,
                                 node_env={nodes[k]: v for k, v in NODE_ENV.items()}, watch_new_nodes=False)
        yield {"cluster": c, "nodes": nodes, "records": records, "mounts": hugepages, "baseline": baseline,
               "raylets": raylet_pids(c)}
    finally:
        try:
            rayfabric.shutdown()
        except Exception:  # noqa: BLE001 - teardown goes on
            pass
        ray.shutdown()
        if c is not None:
            c.shutdown()


@ray.remote(num_cpus=0)
def fetch(refs):
    """On the reader's node: rayfabric.get, then the bytes' digests and this process's counters."""
    import rayfabric as rf
    before = rf.stats()
    values = rf.get(refs, timeout=120)
    after = rf.stats()
    return {"digests": [hashlib.sha256(v.tobytes()).hexdigest() for v in values],
            "sizes": [v.nbytes for v in values],
            "pulled": after["objects_pulled"] - before["objects_pulled"],
            "bytes": after["bytes_pulled"] - before["bytes_pulled"],
            "fallbacks": after["fallbacks"] - before["fallbacks"],
            "small": after["ray_path_small"] - before["ray_path_small"],
            "not_in_plasma": after["ray_path_not_in_plasma"] - before["ray_path_not_in_plasma"],
            "reasons": after["fallback_reasons"]}


def expected(nbytes, seed):
    return hashlib.sha256(np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)
                          .tobytes()).hexdigest()


def agent(cluster, name):
    return rayfabric.status()["agents"][cluster["nodes"][name]]


def wait_idle(timeout=30):
    deadline = time.time() + timeout
    while True:
        busy = {n[:8]: (a["leases_active"], a["pinned_bytes"]) for n, a in rayfabric.status()["agents"].items()
                if a.get("alive") and (a["leases_active"] or a["pinned_bytes"])}
        if not busy or time.time() > deadline:
            return busy
        time.sleep(0.2)


def test_every_store_is_mapped_from_its_own_hugetlbfs(cluster):
    """Each raylet maps its store from its node's hugetlbfs mount, in 2 MiB pages, and the pages
    are reserved in the kernel's pool; the raylet's log says so where `rayfabric doctor` reads it."""
    nodes, mounts, raylets = cluster["nodes"], cluster["mounts"], cluster["raylets"]
    for name in NODES:
        pid = raylets[nodes[name]]
        maps = hugetlb_mappings(pid, mounts[name])
        assert maps, f"raylet {pid} of {name} maps nothing from {mounts[name]}"
        for m in maps:
            assert m["page"] == HUGE_PAGE, m
            assert re.search(r"/plasma\w{6} \(deleted\)$", m["path"]), m
        # The arena: the store's size rounded up to 1 GiB, + 8 bytes -> one more page.
        assert max(m["size"] for m in maps) >= STORE, maps
    # Each store reserved (or faulted) its pages from the pool: at least the store's size each.
    grown = committed_pages(meminfo()) - committed_pages(cluster["baseline"])
    assert grown >= len(NODES) * STORE // HUGE_PAGE, (grown, meminfo(), cluster["baseline"])
    # What `rayfabric doctor` reads from the raylet logs: huge pages on, the mapping's size.
    logs = Path(ray._private.worker.global_worker.node.get_session_dir_path()) / "logs"
    seen = {}
    for f in logs.glob("raylet*.out"):
        r = doctor.parse_raylet_log(f.read_text(errors="replace"))
        seen[r["pid"]] = r
    for name in NODES:
        r = seen.get(raylets[nodes[name]])
        assert r is not None and r["huge"] is True, (name, seen)
        assert r["bytes"] == -(-STORE // GiB) * GiB + 8, r  # round_up(STORE, 1 GiB) + 8
        # ... and the pages the doctor says such a store needs are what it took.
        assert doctor.plasma_hugepages(r["bytes"], HUGE_PAGE) == doctor.plasma_hugepages(STORE, HUGE_PAGE) \
            == PAGES_PER_STORE, r


@pytest.mark.parametrize("src,dst", [("n0", "n1"), ("n1", "n0")])
def test_objects_cross_between_huge_page_stores_by_the_fabric(cluster, src, dst):
    nodes, mounts = cluster["nodes"], cluster["mounts"]
    seeds = [1000 * (src == "n1") + k for k in range(len(SIZES))]
    refs = [on(src, produce).remote(n, s) for n, s in zip(SIZES, seeds)]
    ready, _ = ray.wait(refs, num_returns=len(refs), fetch_local=False, timeout=120)
    assert len(ready) == len(refs)
    # The raylet tells the owner where a sealed object is asynchronously: wait for it, bounded.
    deadline = time.monotonic() + 30
    while True:
        locations = ray.experimental.get_object_locations(refs)
        if all(locations[r]["node_ids"] for r in refs) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert all(locations[r]["node_ids"] == [nodes[src]] for r in refs), locations
    in_plasma = sum(locations[r]["object_size"] for r in refs)
    before_src, before_dst = agent(cluster, src), agent(cluster, dst)

    out = ray.get(on(dst, fetch).remote(refs), timeout=300)

    after_src, after_dst = agent(cluster, src), agent(cluster, dst)
    # Every byte, every object.
    assert out["sizes"] == SIZES
    assert out["digests"] == [expected(n, s) for n, s in zip(SIZES, seeds)]
    # All of them by the fabric, none by Ray's path.
    assert out["pulled"] == len(SIZES) and out["bytes"] == in_plasma, out
    assert out["fallbacks"] == 0 and out["small"] == 0 and out["not_in_plasma"] == 0, out
    assert after_dst["objects_pulled"] - before_dst["objects_pulled"] == len(SIZES)
    assert after_dst["bytes_pulled"] - before_dst["bytes_pulled"] == in_plasma
    assert after_dst["fabric_bytes_read"] - before_dst["fabric_bytes_read"] == in_plasma
    assert after_dst["pulls_failed"] == before_dst["pulls_failed"], after_dst
    assert after_src["leases_granted"] - before_src["leases_granted"] >= len(SIZES)
    assert after_src["exposure"] == NODE_ENV[src]["RAYFABRIC_EXPOSURE"], after_src
    links = {link["peer"]: link for link in after_dst["peer_links"]}
    link = links[cluster["records"][nodes[src]]["address"]]
    assert link["objects_pulled"] >= len(SIZES) and link["pulls_failed"] == 0, link
    # The replicas are in the reader's huge-page store (Ray finds them local) ...
    locations = ray.experimental.get_object_locations(refs)
    assert all(nodes[dst] in locations[r]["node_ids"] for r in refs), locations
    # ... and both agents did their work in huge pages: each maps its node's hugetlbfs arena with
    # 2 MiB pages and has at least the objects' bytes of them in its page tables (the reader wrote
    # the replicas there; the source read the objects from there).
    for name, pid in ((src, after_src["pid"]), (dst, after_dst["pid"])):
        maps = hugetlb_mappings(pid, mounts[name])
        assert maps and all(m["page"] == HUGE_PAGE for m in maps), (name, maps)
        assert sum(m["hugetlb"] for m in maps) >= in_plasma, (name, maps)
    # Pages were faulted from the pool since the cluster started: the objects on the source and
    # their replicas on the reader, in two different stores.
    dropped = cluster["baseline"]["HugePages_Free"] - meminfo()["HugePages_Free"]
    assert dropped >= 2 * (sum(SIZES) // HUGE_PAGE), (dropped, meminfo())
    print(f"\n{src}->{dst}: {len(SIZES)} objects, {in_plasma} B by {after_dst['provider']}; huge pages mapped "
          f"by the agents: {src} {sum(m['hugetlb'] for m in hugetlb_mappings(after_src['pid'], mounts[src])) >> 20} MiB, "
          f"{dst} {sum(m['hugetlb'] for m in hugetlb_mappings(after_dst['pid'], mounts[dst])) >> 20} MiB; "
          f"pool {meminfo()}")
    del refs
    assert wait_idle() == {}
