"""Tests for python/rayfabric/tools/doctor.py.

Every finding the doctor can print is produced here from real-looking inputs: a temp dir
laid out like /sys/class/infiniband (values as seen on Soft-RoCE rxe, mlx5 and EFA),
fi_info output as libfabric 1.17 prints it, /proc/meminfo text. The last tests run the
real doctor on this host (and the real fi_info) end to end.

Run: python3 -m pytest tests/python  (pytest only; the doctor itself needs nothing).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))

from rayfabric.tools import doctor  # noqa: E402
from rayfabric.tools.doctor import ERROR, INFO, WARNING, FiRun  # noqa: E402

DOCTOR = ROOT / "python" / "rayfabric" / "tools" / "doctor.py"
GiB, MiB = 1 << 30, 1 << 20
INF = resource.RLIM_INFINITY

# --------------------------------------------------------------------- real-looking inputs

RXE_PORT = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "Ethernet",
            "rate": "10 Gb/sec (1X FDR10)"}
MLX_IB_INIT = {"state": "2: INIT", "phys_state": "5: LinkUp", "link_layer": "InfiniBand",
               "rate": "200 Gb/sec (4X HDR)"}
MLX_ROCE_DOWN = {"state": "1: DOWN", "phys_state": "3: Disabled", "link_layer": "Ethernet",
                 "rate": "100 Gb/sec (4X EDR)"}
IB_DOWN = {"state": "1: DOWN", "phys_state": "2: Polling", "link_layer": "InfiniBand",
           "rate": "10 Gb/sec (4X SDR)"}
EFA_PORT = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "link_layer": "Unspecified",
            "rate": "100 Gb/sec (4X EDR)"}

FI_LIST_GUEST = """verbs:
    version: 117.0
ofi_rxm:
    version: 117.0
ofi_rxd:
    version: 117.0
shm:
    version: 117.0
tcp:
    version: 117.0
"""
FI_LIST_NO_RDMA = """ofi_rxm:
    version: 117.0
shm:
    version: 117.0
tcp:
    version: 117.0
sockets:
    version: 117.0
"""
FI_RDM_GUEST = """provider: verbs;ofi_rxm
    fabric: IB-0xfe80000000000000
    domain: rxe0
    version: 117.0
    type: FI_EP_RDM
    protocol: FI_PROTO_RXM
provider: verbs;ofi_rxm
    fabric: IB-0xfe80000000000000
    domain: rxe1
    version: 117.0
    type: FI_EP_RDM
    protocol: FI_PROTO_RXM
provider: tcp;ofi_rxm
    fabric: 10.77.0.0/24
    domain: veth0
    version: 117.0
    type: FI_EP_RDM
    protocol: FI_PROTO_RXM
"""
FI_RDM_TCP_ONLY = """provider: tcp;ofi_rxm
    fabric: 192.0.2.0/24
    domain: eth0
    version: 117.0
    type: FI_EP_RDM
    protocol: FI_PROTO_RXM
"""
FI_EFA = """provider: efa
    fabric: efa
    domain: rdmap16s27-rdm
    version: 117.0
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
"""
NODATA = "fi_getinfo: -61"

MEMINFO = """MemTotal:       131899588 kB
MemFree:        120000000 kB
AnonHugePages:         0 kB
HugePages_Total:     512
HugePages_Free:      256
HugePages_Rsvd:        0
HugePages_Surp:        0
Hugepagesize:       2048 kB
Hugetlb:         1048576 kB
"""
MEMINFO_NONE = MEMINFO.replace("HugePages_Total:     512", "HugePages_Total:       0").replace(
    "HugePages_Free:      256", "HugePages_Free:        0")

STATUS_ROOT = "Name:\tpython3\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n"
STATUS_USER = "Name:\tpython3\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n"


def ok(out: str, argv=("fi_info",)) -> FiRun:
    return FiRun(list(argv), rc=0, out=out)


def make_sysfs(tmp: Path, devices: dict) -> Path:
    """devices: {name: {"ports": {1: {...}}, "driver": "efa"|None, "parent": "veth0"|None, "ndev": "eth0"}}"""
    root = tmp / "infiniband"
    root.mkdir()
    for name, spec in devices.items():
        d = root / name
        d.mkdir()
        (d / "node_type").write_text("1: CA\n")
        if spec.get("parent"):
            (d / "parent").write_text(spec["parent"] + "\n")
        if spec.get("driver"):
            target = tmp / "bus" / "drivers" / spec["driver"]
            target.mkdir(parents=True, exist_ok=True)
            (d / "device").mkdir()
            (d / "device" / "driver").symlink_to(target)
        if "ports" in spec:
            (d / "ports").mkdir()
        for num, port in spec.get("ports", {}).items():
            p = d / "ports" / str(num)
            p.mkdir()
            for k, v in port.items():
                (p / k).write_text(v + "\n")
            if spec.get("ndev"):
                (p / "gid_attrs" / "ndevs").mkdir(parents=True)
                for i in range(2):
                    (p / "gid_attrs" / "ndevs" / str(i)).write_text(spec["ndev"] + "\n")
    return root


def codes(findings, severity=None):
    return [f.code for f in findings if severity is None or f.severity == severity]


# --------------------------------------------------------------------- sysfs reading

def test_read_ib_devices_rxe_layout(tmp_path):
    root = make_sysfs(tmp_path, {"rxe0": {"ports": {1: RXE_PORT}, "parent": "veth0", "ndev": "veth0"},
                                 "rxe1": {"ports": {1: RXE_PORT}, "parent": "veth1", "ndev": "veth1"}})
    devs = doctor.read_ib_devices(root)
    assert [d.name for d in devs] == ["rxe0", "rxe1"]
    assert devs[0].parent == "veth0" and devs[0].is_soft and not devs[0].is_efa
    p = devs[0].ports[0]
    assert (p.num, p.state, p.link_layer, p.rate, p.netdevs) == (1, "4: ACTIVE", "Ethernet", "10 Gb/sec (1X FDR10)", ["veth0"])
    assert p.active
    assert doctor.check_rdma_devices(devs) == []


def test_read_ib_devices_efa_driver_symlink(tmp_path):
    root = make_sysfs(tmp_path, {"rdmap16s27": {"ports": {1: EFA_PORT}, "driver": "efa"}})
    (dev,) = doctor.read_ib_devices(root)
    assert dev.driver == "efa" and dev.is_efa


# --------------------------------------------------------------------- device findings

def test_no_rdma_core(tmp_path):
    devs = doctor.read_ib_devices(tmp_path / "does-not-exist")
    assert devs is None
    (f,) = doctor.check_rdma_devices(devs, str(tmp_path / "does-not-exist"))
    assert (f.severity, f.code) == (ERROR, "no-rdma-core")
    assert "no RDMA devices" in f.message and "rdma_rxe" in f.fix and "mlx5_ib" in f.fix


def test_no_rdma_devices_empty_dir(tmp_path):
    root = make_sysfs(tmp_path, {})
    (f,) = doctor.check_rdma_devices(doctor.read_ib_devices(root), str(root))
    assert (f.severity, f.code) == (ERROR, "no-rdma-devices")
    assert "load rdma_rxe" in f.fix and "install the NIC driver" in f.fix


def test_ib_port_init_means_no_subnet_manager(tmp_path):
    root = make_sysfs(tmp_path, {"mlx5_0": {"ports": {1: MLX_IB_INIT}, "driver": "mlx5_core"}})
    (f,) = doctor.check_rdma_devices(doctor.read_ib_devices(root))
    assert (f.severity, f.code) == (ERROR, "port-not-active")
    assert "mlx5_0 port 1" in f.message and "2: INIT" in f.message and "opensm" in f.fix


def test_roce_port_down_names_the_netdev(tmp_path):
    root = make_sysfs(tmp_path, {"mlx5_1": {"ports": {1: MLX_ROCE_DOWN}, "driver": "mlx5_core", "ndev": "ens1f1"}})
    (f,) = doctor.check_rdma_devices(doctor.read_ib_devices(root))
    assert (f.severity, f.code) == (ERROR, "port-not-active")
    assert "ip link set ens1f1 up" in f.fix


def test_ib_port_down_cable(tmp_path):
    root = make_sysfs(tmp_path, {"mlx4_0": {"ports": {1: IB_DOWN}}})
    (f,) = doctor.check_rdma_devices(doctor.read_ib_devices(root))
    assert f.code == "port-not-active" and "cable" in f.fix


def test_one_port_down_beside_an_active_one_is_a_warning(tmp_path):
    root = make_sysfs(tmp_path, {"mlx5_0": {"ports": {1: RXE_PORT, 2: MLX_ROCE_DOWN}, "ndev": "ens1f0"}})
    (f,) = doctor.check_rdma_devices(doctor.read_ib_devices(root))
    assert (f.severity, f.code) == (WARNING, "port-not-active") and "port 2" in f.message


def test_device_without_ports_and_no_active_port(tmp_path):
    root = make_sysfs(tmp_path, {"rxe0": {"ports": {}}})
    fs = doctor.check_rdma_devices(doctor.read_ib_devices(root))
    assert codes(fs) == ["device-no-ports", "no-active-port"]
    assert codes(fs, ERROR) == ["no-active-port"]


def test_no_uverbs_device_nodes(tmp_path):
    root = make_sysfs(tmp_path, {"rxe0": {"ports": {1: RXE_PORT}}})
    devs = doctor.read_ib_devices(root)
    dev_dir = tmp_path / "dev-infiniband"
    (f,) = doctor.check_uverbs(devs, dev_dir)                       # directory missing
    assert (f.severity, f.code) == (ERROR, "no-uverbs") and "modprobe ib_uverbs" in f.fix
    dev_dir.mkdir()
    (dev_dir / "rdma_cm").write_text("")
    assert codes(doctor.check_uverbs(devs, dev_dir)) == ["no-uverbs"]  # only rdma_cm
    (dev_dir / "uverbs0").write_text("")
    assert doctor.check_uverbs(devs, dev_dir) == []
    assert doctor.check_uverbs(None, dev_dir) == []


def test_rxe_universe_size(tmp_path):
    devs = doctor.read_ib_devices(make_sysfs(tmp_path, {"rxe0": {"ports": {1: RXE_PORT}}}))
    (f,) = doctor.check_rxe_universe(devs, {})
    assert (f.severity, f.code) == (WARNING, "rxe-universe-size")
    assert "unset (256)" in f.message and f.fix == "export FI_UNIVERSE_SIZE=64"
    assert codes(doctor.check_rxe_universe(devs, {"FI_UNIVERSE_SIZE": "128"})) == ["rxe-universe-size"]
    assert doctor.check_rxe_universe(devs, {"FI_UNIVERSE_SIZE": "64"}) == []


def test_rxe_universe_size_ignores_hardware(tmp_path):
    devs = doctor.read_ib_devices(make_sysfs(tmp_path, {"mlx5_0": {"ports": {1: RXE_PORT}, "driver": "mlx5_core"}}))
    assert doctor.check_rxe_universe(devs, {}) == []
    assert doctor.check_rxe_chunk(devs, {}) == []


def test_rxe_chunk_size(tmp_path):
    devs = doctor.read_ib_devices(make_sysfs(tmp_path, {"rxe0": {"ports": {1: RXE_PORT}}}))
    (f,) = doctor.check_rxe_chunk(devs, {})
    assert (f.severity, f.code) == (WARNING, "rxe-chunk-size")
    assert "unset (4M)" in f.message and f.fix == "export RAYFABRIC_CHUNK_SIZE=256K"
    assert codes(doctor.check_rxe_chunk(devs, {"RAYFABRIC_CHUNK_SIZE": "1M"})) == ["rxe-chunk-size"]
    assert doctor.check_rxe_chunk(devs, {"RAYFABRIC_CHUNK_SIZE": "256K"}) == []


# --------------------------------------------------------------------- libfabric findings

def test_libfabric_ok_in_guest():
    assert doctor.check_libfabric(ok(FI_LIST_GUEST), ok(FI_RDM_GUEST)) == []
    assert doctor.rdm_domains(doctor.parse_fi_info(FI_RDM_GUEST)) == {
        "verbs;ofi_rxm": ["rxe0", "rxe1"], "tcp;ofi_rxm": ["veth0"]}
    assert doctor.parse_fi_info_list(FI_LIST_GUEST) == ["verbs", "ofi_rxm", "ofi_rxd", "shm", "tcp"]


def test_no_fi_info_binary():
    run = doctor.run_fi_info(None, ["-l"])          # nothing found on PATH
    (f,) = doctor.check_libfabric(run, run)
    assert (f.severity, f.code) == (ERROR, "no-fi-info") and "libfabric-bin" in f.fix
    run = doctor.run_fi_info("/nonexistent/bin/fi_info", ["-l"])
    (f,) = doctor.check_libfabric(run, run)
    assert f.code == "no-fi-info" and "/nonexistent/bin/fi_info" in f.message


def test_fi_info_fails():
    bad = FiRun(["fi_info", "-l"], rc=127, out="fi_info: error while loading shared libraries: libfabric.so.1")
    (f,) = doctor.check_libfabric(bad, bad)
    assert (f.severity, f.code) == (ERROR, "fi-info-failed") and "libfabric.so.1" in f.message
    rdm_bad = FiRun(["fi_info", "-t", "FI_EP_RDM", "-c", "FI_RMA"], error="timed out after 60 s")
    (f,) = doctor.check_libfabric(ok(FI_LIST_GUEST), rdm_bad)
    assert f.code == "fi-info-failed" and "timed out" in f.message


def test_no_rdma_provider_with_devices():
    (f,) = doctor.check_libfabric(ok(FI_LIST_NO_RDMA), ok(FI_RDM_TCP_ONLY), have_devices=True)
    assert (f.severity, f.code) == (ERROR, "no-rdma-provider")
    assert "tcp" in f.message and "libfabric_prefix=/opt/amazon/efa" in f.fix


def test_no_rdma_provider_without_devices_is_only_noted():
    (f,) = doctor.check_libfabric(ok(FI_LIST_NO_RDMA), ok(FI_RDM_TCP_ONLY), have_devices=False)
    assert (f.severity, f.code) == (INFO, "no-rdma-provider-listed")


def test_rdma_provider_but_no_rdm_endpoint():
    (f,) = doctor.check_libfabric(ok(FI_LIST_GUEST), ok(FI_RDM_TCP_ONLY))
    assert (f.severity, f.code) == (ERROR, "no-rdma-rdm-endpoint") and "FI_LOG_LEVEL=warn" in f.fix
    nodata = FiRun(["fi_info"], rc=61, out=NODATA)
    assert codes(doctor.check_libfabric(ok(FI_LIST_GUEST), nodata)) == ["no-rdma-rdm-endpoint"]


def test_efa_facts_name_rdma_read_the_registration_cap_and_fork_safety(tmp_path):
    devs = doctor.read_ib_devices(make_sysfs(tmp_path, {"rdmap16s27": {"ports": {1: EFA_PORT}, "driver": "efa"}}))
    (f,) = doctor.check_efa_facts(devs, True, "p4d.24xlarge")
    assert (f.severity, f.code) == (INFO, "efa-facts")
    assert "p4d.24xlarge: the EFA device does RDMA read" in f.message
    assert "4 GiB" in f.message and "RAYFABRIC_MAX_REGISTRATION" in f.message
    assert "FI_EFA_FORK_SAFE" in f.message and "never forks" in f.message
    (f,) = doctor.check_efa_facts(devs, True, "c5n.18xlarge")
    assert "not known to have EFA RDMA read" in f.message and "emulates fi_read" in f.message
    (f,) = doctor.check_efa_facts(devs, True, "")
    assert "instance type unknown" in f.message
    assert doctor.check_efa_facts(devs, False, "p4d.24xlarge") == []      # no provider: check_efa says so
    assert doctor.check_efa_facts([], True, "p4d.24xlarge") == []        # no EFA device


def test_efa_device_without_efa_provider(tmp_path):
    devs = doctor.read_ib_devices(make_sysfs(tmp_path, {"rdmap16s27": {"ports": {1: EFA_PORT}, "driver": "efa"}}))
    (f,) = doctor.check_efa(devs, FiRun(["fi_info", "-p", "efa"], rc=61, out=NODATA))
    assert (f.severity, f.code) == (ERROR, "efa-no-provider")
    assert "rdmap16s27" in f.message and "/opt/amazon/efa" in f.fix
    assert doctor.check_efa(devs, ok(FI_EFA, ["fi_info", "-p", "efa"])) == []
    assert doctor.check_efa(None, FiRun(["fi_info"], rc=61, out=NODATA)) == []


# --------------------------------------------------------------------- memlock

def test_cap_ipc_lock_parsing():
    assert doctor.has_cap_ipc_lock(STATUS_ROOT)
    assert not doctor.has_cap_ipc_lock(STATUS_USER)
    assert doctor.has_cap_ipc_lock("CapEff:\t0000000000004000\n")      # only bit 14


def test_memlock_below_store_is_an_error_for_a_user():
    (f,) = doctor.check_memlock(8 * MiB, 8 * MiB, 2 * GiB, cap_ipc_lock=False)
    assert (f.severity, f.code) == (ERROR, "memlock-below-store")
    assert f.message.startswith("memlock limit 8 MiB < plasma 2 GiB")
    assert "hard limit 8 MiB too" in f.message
    assert "ulimit -l unlimited" in f.fix and "LimitMEMLOCK=infinity" in f.fix


def test_memlock_below_store_soft_only():
    (f,) = doctor.check_memlock(64 * MiB, INF, 2 * GiB, cap_ipc_lock=False)
    assert f.severity == ERROR and "hard limit" not in f.message


def test_memlock_below_store_with_cap_ipc_lock_is_a_warning():
    (f,) = doctor.check_memlock(8 * MiB, 8 * MiB, 2 * GiB, cap_ipc_lock=True)
    assert (f.severity, f.code) == (WARNING, "memlock-below-store") and "CAP_IPC_LOCK" in f.message


def test_memlock_low_without_store_size():
    (f,) = doctor.check_memlock(8 * MiB, 8 * MiB, None, cap_ipc_lock=False)
    assert (f.severity, f.code) == (WARNING, "memlock-low") and "--store-bytes" in f.message


def test_memlock_ok():
    assert doctor.check_memlock(INF, INF, 64 * GiB, cap_ipc_lock=False) == []
    assert doctor.check_memlock(4 * GiB, 4 * GiB, 2 * GiB, cap_ipc_lock=False) == []
    assert doctor.check_memlock(2 * GiB, 2 * GiB, None, cap_ipc_lock=False) == []


def test_parse_size_and_fmt():
    assert doctor.parse_size("2G") == doctor.parse_size("2GiB") == 2 * GiB
    assert doctor.parse_size("512m") == 512 * MiB and doctor.parse_size("4096") == 4096
    assert doctor.parse_size("1.5T") == 3 * (1 << 39)
    with pytest.raises(ValueError):
        doctor.parse_size("lots")
    assert doctor.fmt_bytes(8 * MiB) == "8 MiB" and doctor.fmt_bytes(INF) == "unlimited"


# --------------------------------------------------------------------- hugepages

def test_hugepages_parsing():
    mi = doctor.parse_meminfo(MEMINFO)
    assert doctor.hugepage_summary(mi) == {"HugePages_Total": 512, "HugePages_Free": 256, "HugePages_Rsvd": 0,
                                           "HugePages_Surp": 0, "Hugepagesize": 2 * MiB}
    assert doctor.check_hugepages(mi, 4 * GiB, want_huge=False) == []   # not asked for: no finding


def test_no_hugepages():
    (f,) = doctor.check_hugepages(doctor.parse_meminfo(MEMINFO_NONE), 2 * GiB, want_huge=True)
    assert (f.severity, f.code) == (ERROR, "no-hugepages") and "vm.nr_hugepages" in f.fix


def test_hugepages_short():
    # 512 total, 256 free. A 2 GiB store maps 2 GiB + 8 B: 1025 pages.
    (f,) = doctor.check_hugepages(doctor.parse_meminfo(MEMINFO), 2 * GiB, want_huge=True)
    assert (f.severity, f.code) == (ERROR, "hugepages-short")
    assert "maps 1025 hugepages" in f.message and "256 x 2 MiB = 512 MiB" in f.message
    assert "at least 1281" in f.fix
    # Ray rounds a store on hugepages up to 1 GiB (+ 8 B): 256 MiB needs 513 pages, not 128.
    (f,) = doctor.check_hugepages(doctor.parse_meminfo(MEMINFO), 256 * MiB, want_huge=True)
    assert "maps 513 hugepages" in f.message and "at least 769" in f.fix
    roomy = doctor.parse_meminfo(MEMINFO.replace("HugePages_Free:      256", "HugePages_Free:      513"))
    assert doctor.check_hugepages(roomy, 256 * MiB, want_huge=True) == []
    # Pages reserved by another mapping (a store already running) are not free to take.
    taken = doctor.parse_meminfo(MEMINFO.replace("HugePages_Free:      256", "HugePages_Free:      513")
                                 .replace("HugePages_Rsvd:        0", "HugePages_Rsvd:        1"))
    (f,) = doctor.check_hugepages(taken, 256 * MiB, want_huge=True)
    assert "but 512 are free and unreserved" in f.message
    # A store already running on hugepages reserved its pages when it mapped them: however full
    # it is (few free pages), nothing is short.
    assert doctor.check_hugepages(doctor.parse_meminfo(MEMINFO), 2 * GiB, want_huge=True, running=True) == []


def test_plasma_hugepages_as_ray_maps_them():
    """Measured on Ray 2.60 (tests/agent/test_hugepages_real_ray.py): create_and_mmap_buffer(1073741832)
    for a 256 MiB and a 512 MiB store; 2 MiB pages -> 513; the raylet's logged mapping gives the same."""
    for store in (256 * MiB, 512 * MiB, 1 * GiB, 1073741832):
        assert doctor.plasma_hugepages(store, 2 * MiB) == 513, store
    assert doctor.plasma_hugepages(1536 * MiB, 2 * MiB) == 1025
    assert doctor.plasma_hugepages(256 * MiB, 1 * GiB) == 2   # 1 GiB pages: 1 GiB + 8 B -> two


# --------------------------------------------------------------------- Ray / engine hook

# raylet.out lines as Ray 2.x writes them (this host, ray.cluster_utils.Cluster, 512 MiB store)
RAYLET_OUT = """[2026-12-02 19:27:58,137 I 12820 12820] (raylet) store_runner.cc:50: Allowing the Plasma store to use up to 0.536871GB of memory.
[2026-12-02 19:27:58,137 I 12820 12820] (raylet) store_runner.cc:66: Starting object store with directory /dev/shm, fallback /tmp/ray/session_2026-12-02_19-27-54_017726_12589, and huge page support disabled
[2026-12-02 19:27:58,138 I 12820 12830] (raylet) dlmalloc.cc:324: Setting dlmalloc config: plasma_directory=/dev/shm, fallback_directory=/tmp/ray/session_2026-12-02_19-27-54_017726_12589, hugepage_enabled=0, external_store=0
[2026-12-02 19:27:58,138 I 12820 12830] (raylet) dlmalloc.cc:153: create_and_mmap_buffer(536870920, /dev/shm/plasmaXXXXXX)
[2026-12-02 19:28:11,850 I 12820 12830] (raylet) dlmalloc.cc:153: create_and_mmap_buffer(537923592, /tmp/ray/session_2026-12-02_19-27-54_017726_12589/plasmaXXXXXX)
"""


def make_ray_session(tmp: Path, logs: dict, raylet_pid: bool) -> tuple[dict, Path]:
    session = tmp / "ray" / "session_2026-12-02_19-27-54_017726_12589"
    (session / "logs").mkdir(parents=True)
    for name, text in logs.items():
        (session / "logs" / name).write_text(text)
    (tmp / "ray" / "session_latest").symlink_to(session)
    proc = tmp / "proc"
    (proc / "1").mkdir(parents=True)
    (proc / "1" / "comm").write_text("init\n")
    if raylet_pid:
        (proc / "12820").mkdir()
        (proc / "12820" / "comm").write_text("raylet\n")
    return {"RAY_TMPDIR": str(tmp)}, proc


def test_parse_raylet_log():
    assert doctor.parse_raylet_log(RAYLET_OUT) == {"bytes": 536870920, "huge": False, "pid": 12820}
    allow_only = RAYLET_OUT.splitlines()[0].replace("0.536871GB", "2.147484GB")
    assert doctor.parse_raylet_log(allow_only) == {"bytes": 2147484000, "huge": None, "pid": 12820}
    huge = RAYLET_OUT.replace("support disabled", "support enabled")
    assert doctor.parse_raylet_log(huge)["huge"] is True
    assert doctor.parse_raylet_log("nothing") == {"bytes": None, "huge": None, "pid": None}


def test_ray_store_without_session(tmp_path):
    assert doctor.ray_store_bytes({"RAY_TMPDIR": str(tmp_path)}) == (None, "no Ray session on this node", None)


def test_ray_store_from_running_session(tmp_path):
    bigger = RAYLET_OUT.replace("536870920", "1073741832").replace(" 12820 ", " 12940 ")
    dead = RAYLET_OUT.replace("536870920", "4294967304").replace(" 12820 ", " 13000 ")
    env, proc = make_ray_session(tmp_path, {"raylet.out": RAYLET_OUT, "raylet.1.out": bigger, "raylet.2.out": dead,
                                            "raylet.err": "create_and_mmap_buffer(9999999999, x)"}, True)
    (proc / "12940").mkdir()
    (proc / "12940" / "comm").write_text("raylet\n")
    (proc / "13000").mkdir()
    (proc / "13000" / "comm").write_text("bash\n")              # pid reused by another program
    assert doctor.parse_raylet_log(bigger)["pid"] == 12940
    size, source, huge = doctor.ray_store_bytes(env, proc=str(proc))
    assert (size, huge) == (1073741832, False)
    assert "raylet.1.out" in source and "largest of 2 raylets" in source


def test_ray_store_stale_session_and_no_size(tmp_path):
    env, proc = make_ray_session(tmp_path, {"raylet.out": RAYLET_OUT}, raylet_pid=False)
    size, source, _ = doctor.ray_store_bytes(env, proc=str(proc))
    assert size is None and "is running (stale session)" in source
    (proc / "4242").mkdir()
    (proc / "4242" / "comm").write_text("raylet\n")                # somebody else's raylet
    assert doctor.ray_store_bytes(env, proc=str(proc))[0] is None
    (tmp_path / "ray" / "session_latest" / "logs" / "raylet.out").write_text("starting\n")
    size, source, _ = doctor.ray_store_bytes(env, proc=str(proc))
    assert size is None and source.startswith("no plasma size in")


def test_engine_selection_not_available(tmp_path):
    r = doctor.engine_selection({"PATH": str(tmp_path), "RAYFABRIC_BIN_DIR": str(tmp_path)})
    assert r["available"] is False and r["reason"].startswith("not available")


def _exe(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_engine_selection_runs_the_binary(tmp_path):
    # a stand-in for the not-yet-built C++ tool: exercises the hook's contract (--json on stdout)
    _exe(tmp_path / "rayfabric-fabric-info",
         'test "$1" = --json || exit 3\necho \'{"provider": "tcp;ofi_rxm", "domain": "lo"}\'\n')
    r = doctor.engine_selection({"PATH": "/usr/bin:/bin", "RAYFABRIC_BIN_DIR": str(tmp_path)})
    assert r == {"available": True, "binary": str(tmp_path / "rayfabric-fabric-info"),
                 "selection": {"provider": "tcp;ofi_rxm", "domain": "lo"}}


def test_engine_selection_failing_binary(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "RAYFABRIC_BIN_DIR": str(empty)}   # found on PATH
    _exe(tmp_path / "rayfabric-fabric-info", "echo 'fi_getinfo failed' >&2; exit 1\n")
    r = doctor.engine_selection(env)
    assert r["available"] is False and r["status"] == "failed"
    assert "exited 1" in r["reason"] and r["message"] == "fi_getinfo failed"
    _exe(tmp_path / "rayfabric-fabric-info", "echo not json\n")
    r = doctor.engine_selection(env)
    assert r["status"] == "error" and "no JSON" in r["reason"]
    _exe(tmp_path / "rayfabric-fabric-info", "echo 'unknown argument' >&2; exit 2\n")
    assert "exited 2: unknown argument" in doctor.engine_selection(env)["reason"]
    _exe(tmp_path / "rayfabric-fabric-info", "kill -SEGV $$\n")
    assert "killed by signal 11" in doctor.engine_selection(env)["reason"]
    _exe(tmp_path / "rayfabric-fabric-info", "sleep 5\n")
    r = doctor.engine_selection(env, timeout=0.5)
    assert r["status"] == "error" and "timed out" in r["reason"]
    (tmp_path / "rayfabric-fabric-info").write_bytes(b"\x7fELF garbage")         # not runnable
    r = doctor.engine_selection(env)
    assert r["status"] == "error" and "failed" in r["reason"]


def test_engine_tool_found_under_the_build_root(tmp_path):
    """RAYFABRIC_BIN_DIR = the meson build root: the tool is in tools/fabric_info/ under it."""
    sub = tmp_path / "tools" / "fabric_info"
    sub.mkdir(parents=True)
    _exe(sub / "rayfabric-fabric-info", "echo '{\"provider\": \"efa\", \"rdma\": true}'\n")
    _exe(tmp_path / "elsewhere", "")
    r = doctor.engine_selection({"PATH": "/usr/bin:/bin", "RAYFABRIC_BIN_DIR": str(tmp_path)})
    assert r["available"] and r["binary"] == str(sub / "rayfabric-fabric-info")
    # without RAYFABRIC_BIN_DIR: rayfabric.bin_dir()'s default, the source tree's build/
    assert doctor.default_bin_dir({}) == str(ROOT / "build")


def test_engine_tool_found_in_an_installed_package(tmp_path):
    """Installed from the wheel (no RAYFABRIC_BIN_DIR, no build/): the package's _bin/, where the
    wheel puts tools/fabric_info/rayfabric-fabric-info, as rayfabric.bin_dir() finds it."""
    package = tmp_path / "site-packages" / "rayfabric"
    (package / "_bin" / "tools" / "fabric_info").mkdir(parents=True)
    assert doctor.default_bin_dir({}, here=str(package)) == str(package / "_bin")
    assert doctor.default_bin_dir({"RAYFABRIC_BIN_DIR": "/x"}, here=str(package)) == "/x"
    import rayfabric
    assert rayfabric.bin_dir() == doctor.default_bin_dir()  # the same rule as the package's
    path, looked = doctor.find_engine_tool({"RAYFABRIC_BIN_DIR": str(tmp_path / "none"), "PATH": str(tmp_path)})
    assert path is None and looked[-1] == "PATH" and looked[1].endswith("tools/fabric_info/rayfabric-fabric-info")


# what rayfabric-fabric-info --json prints (ProviderReport::ToJson), as on the Soft-RoCE guest
SEL_VERBS = {"provider": "verbs;ofi_rxm", "domain": "rxe0", "rdma": True, "reason": "highest ranked",
             "checks_remote_keys": True, "mr_cache": True, "deregistration_revokes_keys": False,
             "key_lifetime": "verbs registers through libfabric's MR cache",
             "candidates": [{"provider": "verbs;ofi_rxm", "domain": "rxe0", "verdict": "chosen"},
                            {"provider": "tcp;ofi_rxm", "domain": "veth0", "verdict": "passed over"}]}
SEL_TCP = {"provider": "tcp;ofi_rxm", "domain": "eth0", "rdma": False, "reason": "highest ranked of what fi_info offers",
           "checks_remote_keys": True, "mr_cache": False, "deregistration_revokes_keys": True,
           "key_lifetime": "tcp verifies keys in its MR map"}


def sel(**kw):
    return {"available": True, "binary": "/b/rayfabric-fabric-info", "selection": {**SEL_VERBS, **kw}}


def test_check_engine_tool_missing():
    (f,) = doctor.check_engine({"available": False, "status": "missing", "reason": "not available: no x"}, True)
    assert (f.severity, f.code) == (INFO, "engine-tool-missing") and "ninja -C build" in f.fix


def test_check_engine_selection_failed_names_the_settings():
    es = {"available": False, "status": "failed", "reason": "not available: exited 1: x",
          "message": "rayfabric-fabric-info: no provider: Unavailable: require_rdma is set but ..."}
    (f,) = doctor.check_engine(es, False, {"RAYFABRIC_REQUIRE_RDMA": "1", "FI_PROVIDER": "tcp"})
    assert (f.severity, f.code) == (ERROR, "engine-selection-failed") and "require_rdma is set" in f.message
    assert "RAYFABRIC_REQUIRE_RDMA=1, FI_PROVIDER=tcp" in f.fix
    (f,) = doctor.check_engine(es, False, {})
    assert "fix the device/libfabric findings" in f.fix


def test_check_engine_tool_error():
    es = {"available": False, "status": "error", "binary": "/b/t", "reason": "not available: t printed no JSON"}
    (f,) = doctor.check_engine(es, True)
    assert (f.severity, f.code) == (WARNING, "engine-tool-error") and "/b/t --json" in f.fix


def test_check_engine_not_rdma():
    tcp = {"available": True, "binary": "/b/t", "selection": SEL_TCP}
    (f,) = doctor.check_engine(tcp, rdma_offered=True, env={})
    assert (f.severity, f.code) == (ERROR, "engine-not-rdma") and "tcp;ofi_rxm on eth0" in f.message
    assert "ldd /b/t" in f.fix and "libfabric_prefix" in f.fix
    (f,) = doctor.check_engine(tcp, rdma_offered=True, env={"RAYFABRIC_PROVIDER": "tcp"})
    assert (f.severity, f.code) == (WARNING, "engine-not-rdma") and f.fix == "unset RAYFABRIC_PROVIDER to let rayfabric use RDMA"
    assert doctor.check_engine(tcp, rdma_offered=False, env={}) == []        # nothing better on offer
    assert doctor.check_engine(sel(mr_cache=False, deregistration_revokes_keys=True), True, {}) == []


def test_check_engine_keys_outlive_deregistration():
    (f,) = doctor.check_engine(sel(), True, {})
    assert (f.severity, f.code) == (WARNING, "keys-outlive-deregistration") and "FI_MR_CACHE_MONITOR=disabled" in f.fix
    (f,) = doctor.check_engine(sel(provider="efa", domain="rdmap16s27-rdm"), True, {})
    assert "FI_EFA_MR_CACHE_ENABLE=0" in f.fix
    (f,) = doctor.check_engine(sel(provider="shm", rdma=False, mr_cache=False, checks_remote_keys=False), False, {})
    assert (f.severity, f.code) == (WARNING, "keys-outlive-deregistration") and "not checked" in f.message
    (f,) = doctor.check_engine(sel(provider="psm3", mr_cache=False), True, {})
    assert (f.severity, f.code) == (INFO, "keys-outlive-deregistration") and "not known" in f.message


def test_check_engine_access_not_enforced():
    (f, keys) = doctor.check_engine(sel(enforces_access=False, access_note="the verbs MR cache registers every region"),
                                    True, {})
    assert (f.severity, f.code) == (ERROR, "access-not-enforced") and "refuses to serve" in f.message
    assert "FI_MR_CACHE_MONITOR=disabled" in f.fix and keys.code == "keys-outlive-deregistration"
    (f, _) = doctor.check_engine(sel(enforces_access=False), True, {"RAYFABRIC_ALLOW_UNPROTECTED_MEMORY": "true"})
    assert (f.severity, f.code) == (WARNING, "access-not-enforced") and "serve anyway" in f.message
    assert doctor.check_engine(sel(enforces_access=True, mr_cache=False, deregistration_revokes_keys=True), True, {}) == []


def test_tcp_congestion_bbr():
    (f,) = doctor.check_tcp_congestion("bbr\n", "pfifo_fast", "tcp;ofi_rxm")
    assert (f.severity, f.code) == (WARNING, "tcp-congestion-bbr")
    assert "tcp;ofi_rxm connections" in f.message and "no fq qdisc" in f.message and "pfifo_fast" in f.message
    assert "congctl is not checked" in f.message and "over 5x the median" in f.message
    assert "congctl cubic" in f.fix and "net.ipv4.tcp_congestion_control=cubic" in f.fix
    assert "on every node" in f.fix and "/etc/sysctl.d/" in f.fix
    for core in ("sockets", "net;ofi_rxm"):                                 # every provider on kernel TCP
        (f,) = doctor.check_tcp_congestion("bbr", "fq", core)
        assert f.severity == WARNING and "default_qdisc is fq" in f.message
    (f,) = doctor.check_tcp_congestion("bbr", "fq_codel", "verbs;ofi_rxm")  # RDMA here; a TCP peer still
    assert (f.severity, f.code) == (INFO, "tcp-congestion-bbr") and "any peer" in f.message
    (f,) = doctor.check_tcp_congestion("bbr", None, None)                   # engine unknown, /proc unreadable
    assert f.severity == INFO and "provider is unknown" in f.message and "default_qdisc is unknown" in f.message
    (f,) = doctor.check_tcp_congestion("bbr3", "pfifo_fast", "xnet")        # the names of other kernels/libfabrics
    assert f.severity == WARNING and f.message.startswith("TCP congestion control is bbr3 ")
    assert doctor.check_tcp_congestion("cubic", "pfifo_fast", "tcp;ofi_rxm") == []
    assert doctor.check_tcp_congestion(None, None, "tcp;ofi_rxm") == []


def test_agent_fabric_env_turns_the_mr_cache_off_unless_the_user_chose():
    from rayfabric import launch_env
    # Off through the monitors, never FI_MR_CACHE_MAX_COUNT=0 (which also stops shm's CUDA IPC cache).
    assert launch_env.agent_fabric_env({"A": "1"}) == {"A": "1", "FI_MR_CACHE_MONITOR": "disabled",
                                                       "FI_MR_CUDA_CACHE_MONITOR_ENABLED": "0",
                                                       "FI_MR_ROCR_CACHE_MONITOR_ENABLED": "0",
                                                       "FI_MR_ZE_CACHE_MONITOR_ENABLED": "0"}
    for var in launch_env.MR_CACHE_VARIABLES:
        assert launch_env.agent_fabric_env({var: "7"}) == {var: "7"}
    # The doctor reports what the launcher does: the same policy, not a copy of it.
    assert doctor.agent_fabric_env is launch_env.agent_fabric_env


def test_check_control_plane():
    (f,) = doctor.check_control_plane({})
    assert (f.severity, f.code) == (WARNING, "control-plane-open") and "RAY_AUTH_MODE=token" in f.fix
    (f,) = doctor.check_control_plane({"RAY_AUTH_MODE": "token"})
    assert (f.severity, f.code) == (INFO, "control-plane") and "token" in f.message
    (f,) = doctor.check_control_plane({"RAY_USE_TLS": "1"})
    assert (f.severity, f.code) == (ERROR, "tls-incomplete") and "RAY_TLS_CA_CERT" in f.message
    tls = {"RAY_USE_TLS": "true", "RAY_TLS_SERVER_CERT": "c", "RAY_TLS_SERVER_KEY": "k", "RAY_TLS_CA_CERT": "a"}
    (f,) = doctor.check_control_plane({**tls, "RAY_AUTH_MODE": "token"})
    assert (f.severity, f.code) == (INFO, "control-plane") and "TLS" in f.message and "token" in f.message


# --------------------------------------------------------------------- real runs on this host

def run_doctor(*args):
    return subprocess.run([sys.executable, str(DOCTOR), *args], capture_output=True, text=True, timeout=300)


def test_real_run_on_this_host_json():
    p = run_doctor("--json", "--store-bytes", "2G")
    assert p.returncode in (0, 1), p.stderr
    r = json.loads(p.stdout)
    assert p.returncode == (0 if r["rdma_usable"] else 1)
    sysfs = Path(doctor.SYSFS_IB)
    if sysfs.is_dir():
        assert sorted(d["name"] for d in r["rdma_devices"]) == sorted(os.listdir(sysfs))
    else:
        assert r["rdma_devices"] is None
        assert "no-rdma-core" in [f["code"] for f in r["findings"]] and not r["rdma_usable"]
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert r["memlock"]["soft"] == (None if soft == INF else soft)
    assert r["plasma_store"] == {"bytes": 2 * GiB, "human": "2 GiB", "source": "--store-bytes"}
    if shutil.which("fi_info"):
        real = subprocess.run(["fi_info", "-l"], capture_output=True, text=True, timeout=120).stdout
        assert r["libfabric"]["providers"] == doctor.parse_fi_info_list(real)
        assert r["libfabric"]["version"]
    else:
        assert "no-fi-info" in [f["code"] for f in r["findings"]]
    assert r["engine_selection"]["available"] in (True, False)
    cc_file = Path(doctor.PROC_SYS) / doctor.TCP_CONGESTION
    cc = cc_file.read_text().strip() if cc_file.exists() else None
    assert ("tcp-congestion-bbr" in [f["code"] for f in r["findings"]]) == (cc or "").startswith("bbr")


def test_real_run_on_this_host_text():
    p = run_doctor()
    assert p.returncode in (0, 1), p.stderr
    assert p.stdout.startswith("rayfabric doctor\nlibfabric")
    last = p.stdout.strip().splitlines()[-1]
    assert last.startswith("OK: RDMA usable") if p.returncode == 0 else last.startswith("NOT OK: RDMA NOT usable")
    if not Path(doctor.SYSFS_IB).is_dir():
        assert "ERROR   no RDMA devices" in p.stdout and "-> load the NIC's RDMA driver" in p.stdout


def test_real_run_with_a_laid_out_sysfs_tree(tmp_path):
    """Real fi_info, a sysfs tree as on a RoCE host whose port is down and uverbs is not loaded."""
    root = make_sysfs(tmp_path, {"mlx5_0": {"ports": {1: MLX_ROCE_DOWN}, "driver": "mlx5_core", "ndev": "ens1f0"}})
    p = run_doctor("--json", "--sysfs", str(root), "--dev-dir", str(tmp_path / "no-dev"), "--store-bytes", "1G")
    r = json.loads(p.stdout)
    assert p.returncode == 1 and not r["rdma_usable"]
    got = [f["code"] for f in r["findings"]]
    assert "port-not-active" in got and "no-uverbs" in got
    assert r["rdma_devices"][0]["ports"][0]["netdevs"] == ["ens1f0"]


def _fake_guest(tmp_path: Path, selection: dict | None) -> tuple[list[str], dict]:
    """A node laid out like the Soft-RoCE guest: sysfs with rxe0/rxe1, uverbs nodes, an fi_info
    printing what the guest's fi_info prints, and a stand-in engine tool printing `selection`."""
    root = make_sysfs(tmp_path, {"rxe0": {"ports": {1: RXE_PORT}, "parent": "veth0", "ndev": "veth0"},
                                 "rxe1": {"ports": {1: RXE_PORT}, "parent": "veth1", "ndev": "veth1"}})
    dev = tmp_path / "dev-ib"
    dev.mkdir()
    (dev / "uverbs0").write_text("")
    (tmp_path / "list.txt").write_text(FI_LIST_GUEST)
    (tmp_path / "rdm.txt").write_text(FI_RDM_GUEST)
    fi = _exe(tmp_path / "fi_info", f"""case "$1" in
  --version) printf 'fi_info: 1.17.0\\nlibfabric: 1.17.0\\n';;
  -l) cat {tmp_path}/list.txt;;
  -t) cat {tmp_path}/rdm.txt;;
  *) echo 'fi_getinfo: -61'; exit 61;;
esac
""")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if selection is not None:
        (tmp_path / "sel.json").write_text(json.dumps(selection))
        _exe(bindir / "rayfabric-fabric-info", f"cat {tmp_path}/sel.json\n")
    env = {k: v for k, v in os.environ.items() if k not in doctor.ENGINE_SETTINGS}
    env.update(RAYFABRIC_BIN_DIR=str(bindir), FI_UNIVERSE_SIZE="64", RAYFABRIC_CHUNK_SIZE="256K")
    proc_sys = tmp_path / "proc-sys"        # the guest's kernel: cubic, as Debian ships it
    (proc_sys / "net" / "ipv4").mkdir(parents=True)
    (proc_sys / "net" / "ipv4" / "tcp_congestion_control").write_text("cubic\n")
    args = ["--json", "--sysfs", str(root), "--dev-dir", str(dev), "--proc-sys", str(proc_sys), "--fi-info", str(fi),
            "--store-bytes", "1M"]
    return args, env


def test_guest_like_node_with_the_engine_on_verbs(tmp_path):
    args, env = _fake_guest(tmp_path, SEL_VERBS)
    p = subprocess.run([sys.executable, str(DOCTOR), *args], capture_output=True, text=True, timeout=120, env=env)
    r = json.loads(p.stdout)
    assert p.returncode == 0 and r["rdma_usable"], p.stdout
    assert r["verdict"].endswith("the engine chooses verbs;ofi_rxm on rxe0")
    # (the fake guest's environment has no Ray token/TLS: the control plane is open, as Ray's)
    assert [f["code"] for f in r["findings"]] == ["keys-outlive-deregistration", "control-plane-open"]
    jf = tmp_path / "report.json"
    text = subprocess.run([sys.executable, str(DOCTOR), *args[1:], "--json-file", str(jf)], capture_output=True,
                          text=True, timeout=120, env=env).stdout
    assert json.loads(jf.read_text())["findings"] == r["findings"]           # text on stdout, JSON in the file
    assert "engine choice  verbs;ofi_rxm on rxe0 (RDMA; " in text
    assert "  keys         checked: yes, revoked by deregistration: NO (" in text
    assert "  passed over  tcp;ofi_rxm/veth0" in text


def test_guest_like_node_where_the_engine_picks_tcp(tmp_path):
    """fi_info offers verbs, the engine (another libfabric?) picks tcp: RDMA is NOT usable."""
    args, env = _fake_guest(tmp_path, SEL_TCP)
    p = subprocess.run([sys.executable, str(DOCTOR), *args], capture_output=True, text=True, timeout=120, env=env)
    r = json.loads(p.stdout)
    assert p.returncode == 1 and not r["rdma_usable"]
    assert [f["code"] for f in r["findings"]] == ["engine-not-rdma", "control-plane-open"]
    assert r["verdict"] == "RDMA NOT usable on this node: rayfabric would use tcp;ofi_rxm on eth0 (not RDMA) (or Ray's own path)"
    # The same node with its kernel at bbr: the engine's tcp connections are paced (read via --proc-sys).
    (tmp_path / "proc-sys" / "net" / "ipv4" / "tcp_congestion_control").write_text("bbr\n")
    (tmp_path / "proc-sys" / "net" / "core").mkdir()
    (tmp_path / "proc-sys" / "net" / "core" / "default_qdisc").write_text("pfifo_fast\n")
    p = subprocess.run([sys.executable, str(DOCTOR), *args], capture_output=True, text=True, timeout=120, env=env)
    r = json.loads(p.stdout)
    assert [f["code"] for f in r["findings"]] == ["engine-not-rdma", "control-plane-open", "tcp-congestion-bbr"]
    (f,) = [f for f in r["findings"] if f["code"] == "tcp-congestion-bbr"]
    assert f["severity"] == WARNING and "tcp;ofi_rxm connections" in f["message"] and "pfifo_fast" in f["message"]


def test_guest_like_node_without_the_engine_tool(tmp_path):
    args, env = _fake_guest(tmp_path, None)
    p = subprocess.run([sys.executable, str(DOCTOR), *args], capture_output=True, text=True, timeout=120, env=env)
    r = json.loads(p.stdout)
    assert p.returncode == 0 and [f["code"] for f in r["findings"]] == ["engine-tool-missing", "control-plane-open"]
    assert r["engine_selection"]["status"] == "missing"


# The real C++ tool, as meson built it (RAYFABRIC_BIN_DIR = the build root under `meson test`).
REAL_TOOL, _ = doctor.find_engine_tool(os.environ)
needs_tool = pytest.mark.skipif(REAL_TOOL is None, reason="rayfabric-fabric-info not built (ninja -C build)")


def _clean_env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in doctor.ENGINE_SETTINGS}
    env.update(kw)
    return env


@needs_tool
def test_real_engine_tool_agrees_with_the_doctor():
    env = _clean_env()
    own = subprocess.run([REAL_TOOL, "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert own.returncode == 0, own.stderr
    direct = json.loads(own.stdout)
    es = doctor.engine_selection(env)
    assert es["available"] and es["binary"] == REAL_TOOL and es["selection"] == direct
    for k in ("provider", "domain", "rdma", "reason", "checks_remote_keys", "mr_cache",
              "deregistration_revokes_keys", "key_lifetime", "fabrics", "candidates"):
        assert k in direct, k
    # one chosen candidate per fabric an agent opens (its best RDMA and its best socket provider)
    chosen = [f'{c["provider"]}/{c["domain"]}' for c in direct["candidates"] if c["verdict"].startswith("chosen")]
    assert chosen and sorted(chosen) == sorted(f'{f["provider"]}/{f["domain"]}' for f in direct["fabrics"])
    text = subprocess.run([REAL_TOOL], capture_output=True, text=True, timeout=120, env=env).stdout
    assert text.startswith(f"provider {direct['provider']} domain {direct['domain']} (")
    assert "deregistration_revokes_keys=" in text
    if not Path(doctor.SYSFS_IB).is_dir():                  # this host: no RDMA -> a socket provider
        assert direct["rdma"] is False and doctor.check_engine(es, False, env) == []


@needs_tool
def test_real_engine_tool_flags_and_failures():
    env = _clean_env()
    p = subprocess.run([REAL_TOOL, "--json", "--provider", "no-such-provider"], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 1 and "NotFound" in p.stderr and "provider='no-such-provider'" in p.stderr
    p = subprocess.run([REAL_TOOL, "--bogus"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2 and "usage:" in p.stderr
    if Path(doctor.SYSFS_IB).is_dir():
        pytest.skip("this host has RDMA devices: require_rdma would succeed")
    es = doctor.engine_selection(_clean_env(RAYFABRIC_REQUIRE_RDMA="1"))
    assert es["status"] == "failed" and "require_rdma is set" in es["message"]
    (f,) = doctor.check_engine(es, False, {"RAYFABRIC_REQUIRE_RDMA": "1"})
    assert (f.severity, f.code) == (ERROR, "engine-selection-failed")
    p = run_doctor_env(_clean_env(RAYFABRIC_REQUIRE_RDMA="1"), "--json", "--store-bytes", "1M")
    assert p.returncode == 1 and "engine-selection-failed" in [x["code"] for x in json.loads(p.stdout)["findings"]]


def run_doctor_env(env, *args):
    return subprocess.run([sys.executable, str(DOCTOR), *args], capture_output=True, text=True, timeout=300, env=env)


def test_every_finding_code_has_a_test():
    """Each code doctor.py can emit (Finding(<severity>, "<code>", ...)) is asserted somewhere here."""
    src = DOCTOR.read_text()
    emitted = set(re.findall(r'Finding\([^"]*?"([a-z0-9-]+)"', src))
    assert len(emitted) >= 20, emitted
    here = Path(__file__).read_text()
    untested = sorted(c for c in emitted if f'"{c}"' not in here)
    assert not untested, f"findings without a test: {untested}"


def test_runs_by_path_on_the_standard_library_alone(tmp_path):
    """As a script by its path, from elsewhere, with no site-packages (-S) and no PYTHONPATH or
    current folder (-I): it finds the library modules it reports from beside its own folder."""
    p = subprocess.run([sys.executable, "-I", "-S", str(DOCTOR), "--json", "--store-bytes", "1M"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode in (0, 1), p.stderr
    assert json.loads(p.stdout)["findings"], p.stdout[:500]


def test_bad_store_bytes_is_a_usage_error():
    p = run_doctor("--store-bytes", "lots")
    assert p.returncode == 2 and "not a size" in p.stderr


def _python_with_ray():
    for py in (sys.executable, shutil.which("python3"), shutil.which("python")):
        if py and subprocess.run([py, "-c", "import ray"], capture_output=True, timeout=120).returncode == 0:
            return py
    return None


@pytest.mark.skipif(os.environ.get("RAYFABRIC_TEST_NO_RAY") == "1", reason="RAYFABRIC_TEST_NO_RAY=1")
def test_real_ray_session_store_size():
    """A real single-node Ray (own temp dir, 96 MiB store): the doctor reads its plasma size."""
    py = _python_with_ray()
    if py is None:
        pytest.skip("no python with ray on this machine")
    import tempfile
    tmp = tempfile.mkdtemp(prefix="rfd", dir="/tmp")   # short: Ray's socket paths have a length limit
    try:
        script = (
            "import json, subprocess, sys, ray\n"
            "ray.init(num_cpus=1, object_store_memory=96 * 1024 * 1024, include_dashboard=False,\n"
            "         logging_level='ERROR')  # RAY_TMPDIR: the session lands in <tmp>/ray/\n"
            "p = subprocess.run([sys.executable, sys.argv[1], '--json'], capture_output=True, text=True)\n"
            "ray.shutdown()\n"
            "print(p.stdout)\n")
        # RAY_AUTH_MODE unset, a new local ray.init() turns token mode on and leaves a token in
        # ~/.ray/auth_token, which every later `ray start --head` on this host then picks up.
        env = dict(os.environ, RAY_TMPDIR=tmp, RAY_AUTH_MODE="disabled")
        p = subprocess.run([py, "-c", script, str(DOCTOR)], capture_output=True, text=True,
                           timeout=240, env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        r = json.loads(p.stdout[p.stdout.index("{"):])
        store = r["plasma_store"]
        assert store["bytes"] is not None and abs(store["bytes"] - 96 * MiB) <= 4096, store
        assert "raylet.out" in store["source"]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- CUDA memory (FI_HMEM)

def test_hmem_cuda_from_libfabric_init_log():
    """What `FI_LOG_LEVEL=info fi_info -l` logs about CUDA memory decides the finding: Debian's
    1.17 (no CUDA), a CUDA build whose runtime failed, one that initialised, and silence."""
    unsupported = ("libfabric:23926:1796390611::core:core:ofi_hmem_init():247<info> Hmem iface FI_HMEM_CUDA not supported\n"
                   "libfabric:23926:1796390611::core:core:ofi_hmem_init():247<info> Hmem iface FI_HMEM_ROCR not supported\n")
    [f] = doctor.check_hmem_cuda(FiRun(["fi_info", "-l"], rc=0, out=unsupported))
    assert f.code == "hmem-cuda-unsupported" and "staged through pinned host memory" in f.message
    assert "-Dlibfabric_prefix" in f.fix
    failed = ("libfabric:1:2::core:core:ofi_hmem_init():250<warn> Failed to initialize hmem iface FI_HMEM_CUDA: "
              "No such device\n")
    [f] = doctor.check_hmem_cuda(FiRun(["fi_info", "-l"], rc=0, out=failed))
    assert f.code == "hmem-cuda-failed" and "No such device" in f.message
    ok = "libfabric:1:2::core:core:ofi_hmem_init():247<info> Hmem iface FI_HMEM_ROCR not supported\n"
    [f] = doctor.check_hmem_cuda(FiRun(["fi_info", "-l"], rc=0, out=ok))
    assert f.code == "hmem-cuda" and "registers CUDA tensors directly on providers that offer FI_HMEM" in f.message
    assert doctor.check_hmem_cuda(FiRun(["fi_info", "-l"], rc=0, out="tcp\nsockets\n")) == []
    assert doctor.check_hmem_cuda(FiRun(["fi_info", "-l"], error="fi_info not found")) == []


def test_hmem_cuda_on_this_host():
    """This host's libfabric, for real: Debian's 1.17 reports FI_HMEM_CUDA unsupported."""
    fi = doctor.find_fi_info()
    if not fi:
        pytest.skip("no fi_info here")
    run = doctor.run_fi_info(fi, ["-l"], extra_env={"FI_LOG_LEVEL": "info"})
    findings = doctor.check_hmem_cuda(run)
    assert findings and findings[0].code.startswith("hmem-cuda"), run.out[-2000:]
