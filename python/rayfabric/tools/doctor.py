"""rayfabric doctor: can this node move Ray objects by RDMA, and if not, exactly why.

Pure Python 3.11 standard library; runs without Ray or rayfabric built. Usage:

    python3 -m rayfabric.tools.doctor [--json] [--json-file PATH] [--store-bytes SIZE] [--fi-info PATH]
    python3 python/rayfabric/tools/doctor.py ...  # same, without installing anything

It reports
  * libfabric: version, providers (`fi_info -l`), the RDM endpoints that can do RMA
    (`fi_info -t FI_EP_RDM -c FI_RMA`) grouped by provider and domain;
  * the engine's own provider selection (`engine_selection()`: runs the C++ tool
    `rayfabric-fabric-info --json` from rayfabric.bin_dir() - $RAYFABRIC_BIN_DIR, else the
    source tree's build/, directly or under tools/fabric_info/ - or PATH), checked against what
    fi_info offers, and whether its RMA keys die with deregistration;
  * RDMA devices in /sys/class/infiniband: ports, state, link layer, rate, netdev, driver;
  * EFA: efa devices there, and `fi_info -p efa`;
  * RLIMIT_MEMLOCK against the plasma store size (--store-bytes; default: the plasma size
    the running Ray session's raylet logged, if any; else no comparison);
  * hugepages (/proc/meminfo).
Exit status: 0 when RDMA is usable (no 'error' finding), 1 when it is not, 2 on bad usage.

Every finding comes from a function that takes its inputs as arguments (check_*), so
tests feed them real-looking inputs (a temp dir laid out like /sys/class/infiniband,
fi_info text, /proc/meminfo text) and the probe functions (read_*/run_*) gather those
inputs on the real machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

SYSFS_IB = "/sys/class/infiniband"
RDMA_PROVIDERS = ("verbs", "efa")          # providers that move bytes by real RDMA
EFA_FI_INFO = "/opt/amazon/efa/bin/fi_info"  # where the EFA installer puts its libfabric
CAP_IPC_LOCK = 14
FI_TIMEOUT_S = 60                          # fi_info is slow in the Soft-RoCE guest (~2 s)
RXE_UNIVERSE_MAX = 64                      # measured: 64 works on rxe, the default 256 fails

ERROR, WARNING, INFO = "error", "warning", "info"

# The launch environment policy lives with the launcher (rayfabric.launch_env, standard library
# only); the doctor reports it. Run as a script (python3 python/rayfabric/tools/doctor.py), without
# the package: the library's file, in the folder above this one.
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # python/rayfabric/
if __package__:
    from rayfabric import settings as py_settings  # noqa: E402
    from rayfabric.launch_env import agent_fabric_env  # noqa: E402
else:
    sys.path.insert(0, PACKAGE_DIR)
    import settings as py_settings  # noqa: E402
    from launch_env import agent_fabric_env  # noqa: E402


@dataclasses.dataclass
class Finding:
    severity: str       # error: RDMA not usable; warning: works now but fragile; info
    code: str           # stable identifier, e.g. "no-rdma-devices"
    message: str        # what is wrong, with the numbers
    fix: str = ""       # what to change

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- helpers

def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    if n == resource.RLIM_INFINITY or n < 0:
        return "unlimited"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """'2G', '2GiB', '512m', '1.5T', '4096' -> bytes (binary units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 2G, 512MiB, 4096)")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
    return int(float(m.group(1)) * scale)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


# ----------------------------------------------------------------------------- RDMA devices

@dataclasses.dataclass
class Port:
    num: int
    state: str = ""         # "4: ACTIVE"
    phys_state: str = ""    # "5: LinkUp"
    link_layer: str = ""    # InfiniBand | Ethernet | Unknown
    rate: str = ""          # "100 Gb/sec (4X EDR)"
    netdevs: list[str] = dataclasses.field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.state.split(":")[-1].strip() in ("ACTIVE", "ACTIVE_DEFER")


@dataclasses.dataclass
class Device:
    name: str
    driver: str = ""        # kernel driver (device/driver link): mlx5_core, efa, ...; rxe has none
    node_type: str = ""
    parent: str = ""        # rxe/siw: the netdev it sits on
    ports: list[Port] = dataclasses.field(default_factory=list)

    @property
    def is_efa(self) -> bool:
        return self.driver == "efa" or self.name.startswith("efa")

    @property
    def is_soft(self) -> bool:  # Soft-RoCE / soft-iWARP
        return self.name.startswith(("rxe", "siw")) or self.driver in ("rdma_rxe", "siw")


def read_ib_devices(root: str | os.PathLike[str] = SYSFS_IB) -> list[Device] | None:
    """Devices under a directory laid out like /sys/class/infiniband; None if it does not exist."""
    root = Path(root)
    if not root.is_dir():
        return None
    devices = []
    for d in sorted(root.iterdir()):
        dev = Device(name=d.name)
        drv = d / "device" / "driver"
        if drv.exists() or drv.is_symlink():
            dev.driver = os.path.basename(os.path.realpath(drv))
        dev.node_type = _read(d / "node_type") or ""
        dev.parent = _read(d / "parent") or ""
        ports_dir = d / "ports"
        if ports_dir.is_dir():
            for p in sorted(ports_dir.iterdir(), key=lambda x: int(x.name) if x.name.isdigit() else 0):
                if not p.name.isdigit():
                    continue
                port = Port(num=int(p.name),
                            state=_read(p / "state") or "",
                            phys_state=_read(p / "phys_state") or "",
                            link_layer=_read(p / "link_layer") or "",
                            rate=_read(p / "rate") or "")
                ndevs = p / "gid_attrs" / "ndevs"
                if ndevs.is_dir():
                    port.netdevs = sorted({v for f in ndevs.iterdir() if (v := _read(f))})
                dev.ports.append(port)
        devices.append(dev)
    return devices


def check_rdma_devices(devices: list[Device] | None, sysfs: str = SYSFS_IB) -> list[Finding]:
    """No devices / no active port is an error; some ports down is a warning."""
    if devices is None:
        return [Finding(ERROR, "no-rdma-core",
                        f"no RDMA devices: {sysfs} does not exist (the kernel has no RDMA core, ib_core, loaded)",
                        "load the NIC's RDMA driver (mlx5_ib, efa, ...) or, for Soft-RoCE, "
                        "`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <eth>`; inside a container, "
                        "pass the devices through (--device /dev/infiniband, or the RDMA device plugin)")]
    if not devices:
        return [Finding(ERROR, "no-rdma-devices",
                        f"no RDMA devices: {sysfs} is empty",
                        "load rdma_rxe (`modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <eth>`) "
                        "or install the NIC driver (mlx5_ib, efa)")]
    out: list[Finding] = []
    active = [(d, p) for d in devices for p in d.ports if p.active]
    for d in devices:
        if not d.ports:
            out.append(Finding(WARNING, "device-no-ports", f"RDMA device {d.name} has no ports in sysfs",
                               "check `rdma link` / `ibv_devinfo`; the driver may be half-loaded"))
        for p in d.ports:
            if p.active:
                continue
            where = f"RDMA device {d.name} port {p.num} is not active (state {p.state or '?'}, phys {p.phys_state or '?'})"
            if p.state.endswith("INIT") and p.link_layer == "InfiniBand":
                fix = "the link is up but no subnet manager configured it: start opensm on one node of the fabric"
            elif p.link_layer == "Ethernet":
                nd = ", ".join(p.netdevs) or d.parent or "its netdev"
                fix = f"bring the Ethernet link up (`ip link set {nd} up`) and check cable/switch port"
            else:
                fix = "check the cable and switch port (`ibstat`, `rdma link`)"
            out.append(Finding(WARNING if active else ERROR, "port-not-active", where, fix))
    if not active and not any(f.severity == ERROR for f in out):
        out.append(Finding(ERROR, "no-active-port", "no RDMA device has an active port",
                           "bring a port up (see above)"))
    return out


def check_uverbs(devices: list[Device] | None, dev_dir: str | os.PathLike[str] = "/dev/infiniband") -> list[Finding]:
    """Devices in sysfs but no /dev/infiniband/uverbsN: verbs cannot open them (module or container)."""
    if not devices:
        return []
    d = Path(dev_dir)
    nodes = sorted(p.name for p in d.iterdir() if p.name.startswith("uverbs")) if d.is_dir() else []
    if nodes:
        return []
    return [Finding(ERROR, "no-uverbs",
                    f"RDMA device(s) {', '.join(x.name for x in devices)} in sysfs but no {d}/uverbs* device nodes: "
                    "user space (libibverbs, libfabric verbs/efa) cannot open them",
                    "`modprobe ib_uverbs` (and rdma_ucm); in a container, pass /dev/infiniband in "
                    "(docker --device=/dev/infiniband, Kubernetes RDMA device plugin)")]


def _soft_roce_setting_above(devices: list[Device] | None, env: Mapping[str, str], name: str,
                             parse: Callable[[str], int], default: tuple[int, str], most: int, code: str,
                             why: str, fix: str) -> list[Finding]:
    """A WARNING `code` where there is a Soft-RoCE device and setting `name` in `env` (parse(text);
    `default`, its value and how it is written, where unset or unreadable) is above `most`: `why`
    it matters, `fix` what to do."""
    soft = [d.name for d in devices or [] if d.is_soft]
    if not soft:
        return []
    raw = env.get(name, "")
    try:
        value = parse(raw) if raw else default[0]
    except ValueError:
        value = default[0]
    if value <= most:
        return []
    return [Finding(WARNING, code,
                    f"Soft-RoCE device(s) {', '.join(soft)} with {name}={raw or f'unset ({default[1]})'}: {why}", fix)]


def check_rxe_universe(devices: list[Device] | None, env: Mapping[str, str]) -> list[Finding]:
    """Soft-RoCE: verbs;ofi_rxm RDM endpoints fail at fi_enable with FI_UNIVERSE_SIZE 256."""
    return _soft_roce_setting_above(
        devices, env, "FI_UNIVERSE_SIZE", int, (256, "256"), RXE_UNIVERSE_MAX, "rxe-universe-size",
        "verbs;ofi_rxm RDM endpoints fail at fi_enable ('Unable to create verbs CQ'): rxm sizes its "
        "CQ beyond rxe's max_cqe (32767)",
        f"export FI_UNIVERSE_SIZE={RXE_UNIVERSE_MAX}")


RXE_CHUNK_MAX = 256 << 10                  # measured: rxe RDMA READs of >= 1 MiB stall


def check_rxe_chunk(devices: list[Device] | None, env: Mapping[str, str]) -> list[Finding]:
    """Soft-RoCE: RDMA READs of >= 1 MiB stall (completer retries); rayfabric reads 4 MiB chunks by default."""
    return _soft_roce_setting_above(
        devices, env, "RAYFABRIC_CHUNK_SIZE", parse_size, (4 << 20, "4M"), RXE_CHUNK_MAX, "rxe-chunk-size",
        "rxe stalls on RDMA READs of >= 1 MiB (ib_read_bw -s 1M never completes; rayfabric reads crawl at "
        "~0.45 MB/s and time out), 256 KiB reads run at ~11 MB/s",
        "export RAYFABRIC_CHUNK_SIZE=256K")


# ----------------------------------------------------------------------------- libfabric

@dataclasses.dataclass
class FiRun:
    """One fi_info invocation: argv, exit status, output; error when it could not run."""
    argv: list[str]
    rc: int | None = None
    out: str = ""
    error: str = ""

    @property
    def nodata(self) -> bool:   # fi_getinfo: -61 (FI_ENODATA): nothing matched
        return self.rc not in (0, None) and "-61" in self.out


def find_fi_info(explicit: str | None = None, env: Mapping[str, str] = os.environ) -> str | None:
    if explicit:
        return explicit
    return shutil.which("fi_info", path=env.get("PATH")) or (EFA_FI_INFO if os.access(EFA_FI_INFO, os.X_OK) else None)


def run_fi_info(fi_info: str | None, args: Sequence[str], timeout: float = FI_TIMEOUT_S,
                extra_env: Mapping[str, str] | None = None) -> FiRun:
    argv = [fi_info or "fi_info", *args]
    if not fi_info:
        return FiRun(argv, error="fi_info not found")
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **extra_env} if extra_env else None)
    except FileNotFoundError:
        return FiRun(argv, error=f"{fi_info} not found")
    except subprocess.TimeoutExpired:
        return FiRun(argv, error=f"timed out after {timeout:.0f} s")
    except OSError as e:
        return FiRun(argv, error=str(e))
    return FiRun(argv, rc=p.returncode, out=(p.stdout + p.stderr).strip())


def parse_fi_info_list(text: str) -> list[str]:
    """`fi_info -l` -> provider names ('verbs', 'tcp', 'ofi_rxm', ...)."""
    return [ln[:-1] for ln in text.splitlines() if ln and not ln[0].isspace() and ln.endswith(":")]


def parse_fi_info(text: str) -> list[dict[str, str]]:
    """`fi_info [-t ...]` default output -> one dict per entry (provider, fabric, domain, type, ...)."""
    entries: list[dict[str, str]] = []
    for ln in text.splitlines():
        m = re.match(r"^(\s*)(\w+):\s*(.*)$", ln)
        if not m:
            continue
        key, val = m.group(2), m.group(3).strip()
        if key == "provider" and not m.group(1):
            entries.append({"provider": val})
        elif entries:
            entries[-1].setdefault(key, val)
    return entries


def rdm_domains(entries: Iterable[Mapping[str, str]]) -> dict[str, list[str]]:
    """{provider: [domains]} in first-seen order."""
    out: dict[str, list[str]] = {}
    for e in entries:
        doms = out.setdefault(e.get("provider", "?"), [])
        d = e.get("domain", "?")
        if d not in doms:
            doms.append(d)
    return out


def is_rdma_provider(name: str) -> bool:
    core = name.split(";")[0]
    return core in RDMA_PROVIDERS


def check_libfabric(list_run: FiRun, rdm_run: FiRun, have_devices: bool = True) -> list[Finding]:
    """fi_info missing / failing, no RDMA provider built in, none with an RDM+RMA endpoint.

    libfabric lists verbs/efa in `fi_info -l` only when they find a usable device, so
    without devices (have_devices=False) their absence is expected and only noted.
    """
    if list_run.error or list_run.rc is None:
        return [Finding(ERROR, "no-fi-info",
                        f"cannot ask libfabric: `{' '.join(list_run.argv)}`: {list_run.error}",
                        "install libfabric's tools (Debian: apt-get install libfabric-bin), or pass "
                        "--fi-info /path/to/fi_info of the libfabric rayfabric is built against "
                        "(EFA installer: /opt/amazon/efa/bin/fi_info)")]
    if list_run.rc != 0:
        return [Finding(ERROR, "fi-info-failed",
                        f"`{' '.join(list_run.argv)}` exited {list_run.rc}: {list_run.out[-300:]}",
                        "check the libfabric installation (ldd $(which fi_info)); FI_PROVIDER/FI_PROVIDER_PATH "
                        "in the environment can hide providers")]
    providers = parse_fi_info_list(list_run.out)
    rdma = [p for p in providers if p in RDMA_PROVIDERS]
    if not rdma and not have_devices:
        return [Finding(INFO, "no-rdma-provider-listed",
                        "libfabric lists no verbs/efa provider: expected without RDMA devices (it lists them only "
                        "when they find a device); it has: " + (", ".join(providers) or "none"))]
    if not rdma:
        hidden = " (FI_PROVIDER is set in the environment and may exclude them)" if os.environ.get("FI_PROVIDER") else ""
        return [Finding(ERROR, "no-rdma-provider",
                        f"this libfabric has no RDMA provider (verbs or efa){hidden}; it has: {', '.join(providers) or 'none'}",
                        "use a libfabric built with verbs/efa: Debian's libfabric1 has both; on AWS build rayfabric "
                        "with -Dlibfabric_prefix=/opt/amazon/efa")]
    entries = [] if rdm_run.nodata else parse_fi_info(rdm_run.out)
    if rdm_run.error or (rdm_run.rc not in (0, None) and not rdm_run.nodata):
        return [Finding(ERROR, "fi-info-failed",
                        f"`{' '.join(rdm_run.argv)}` failed: {rdm_run.error or rdm_run.out[-300:]}",
                        "check the libfabric installation")]
    rdma_entries = [e for e in entries if is_rdma_provider(e.get("provider", ""))]
    if not rdma_entries and not have_devices:
        return []   # the device findings say why
    if not rdma_entries:
        return [Finding(ERROR, "no-rdma-rdm-endpoint",
                        f"libfabric has the {'/'.join(rdma)} provider(s) but none offers an RDM endpoint with RMA "
                        "on this node (no usable RDMA device/port for it)",
                        "fix the RDMA device findings above; FI_LOG_LEVEL=warn fi_info -p verbs shows why "
                        "the provider rejects the devices")]
    return []


def check_efa(devices: list[Device] | None, efa_run: FiRun) -> list[Finding]:
    """An EFA device without libfabric's efa provider is unusable for rayfabric."""
    efa_devs = [d.name for d in devices or [] if d.is_efa]
    efa_lf = bool(efa_run.rc == 0 and parse_fi_info(efa_run.out))
    if efa_devs and not efa_lf:
        return [Finding(ERROR, "efa-no-provider",
                        f"EFA device(s) {', '.join(efa_devs)} present but `{' '.join(efa_run.argv)}` finds no efa "
                        f"endpoint ({efa_run.error or efa_run.out[-200:] or 'no output'})",
                        "use the EFA installer's libfabric: build with -Dlibfabric_prefix=/opt/amazon/efa and run "
                        "with --fi-info /opt/amazon/efa/bin/fi_info; check the security group allows all traffic "
                        "to itself")]
    return []


# EC2 instance families by what their EFA devices do (AWS docs): RDMA read on these; others with
# EFA (m5n, c5n, r5n, ...) have none, and libfabric's efa provider emulates fi_read with messages.
EFA_RDMA_READ_FAMILIES = ("p4d", "p4de", "p5", "p5e", "p5en", "trn1", "trn1n", "trn2")
DMI_PRODUCT = "/sys/devices/virtual/dmi/id/product_name"   # the instance type on EC2 Nitro


def check_efa_facts(devices: list[Device] | None, efa_provider: bool, instance_type: str) -> list[Finding]:
    """What an EFA node should know: whether fi_read is the device's RDMA read or the provider's
    emulation, the 4 GiB registration cap, and fork safety."""
    efa_devs = [d.name for d in devices or [] if d.is_efa]
    if not efa_devs or not efa_provider:
        return []
    family = instance_type.split(".", 1)[0] if instance_type else ""
    if family in EFA_RDMA_READ_FAMILIES:
        read = f"{instance_type}: the EFA device does RDMA read, which fi_read uses (no CPU on the source)"
    elif family:
        read = (f"{instance_type}: not known to have EFA RDMA read (m5n, c5n and other non-GPU instances have "
                "none): libfabric's efa provider then emulates fi_read with messages, correct but with CPU "
                "work on both nodes and below line rate")
    else:
        read = ("instance type unknown: p4d/p5/trn1 EFA devices do RDMA read; m5n/c5n do not, and the efa "
                "provider emulates fi_read there (correct, slower)")
    return [Finding(INFO, "efa-facts",
                    f"EFA ({', '.join(efa_devs)}): {read}; one registration with remote access is capped at 1M "
                    "pages (4 GiB with 4 KiB pages): rayfabric registers in slices of RAYFABRIC_MAX_REGISTRATION "
                    "(4G); the efa provider aborts a process that forks after registering memory unless "
                    "FI_EFA_FORK_SAFE=1: rayfabricd never forks (it is started by a Ray actor before it "
                    "registers anything)",
                    "keep RAYFABRIC_MAX_REGISTRATION at 4G or below on EFA; use p4d/p5-class instances for "
                    "fi_read at line rate")]


# ----------------------------------------------------------------------------- memlock

def check_hmem_cuda(log_run: FiRun) -> list[Finding]:
    """Whether this libfabric can register CUDA memory (FI_HMEM_CUDA), from what `fi_info -l` logs at
    FI_LOG_LEVEL=info while libfabric initialises its memory interfaces."""
    if log_run.error or log_run.rc != 0:
        return []
    staged = ("GPU tensors of the RAYFABRIC tensor transport (rayfabric.rdt) are staged through "
              "pinned host memory, with a device copy at each end (device memory is registered directly "
              "only with a libfabric that has CUDA)")
    fix = ("for GPUDirect RDMA: a libfabric built with CUDA (e.g. the AWS EFA installer's, or "
           "--with-cuda) next to a NIC that can reach GPU memory; build rayfabric against it with "
           "-Dlibfabric_prefix")
    failed = re.search(r"Failed to initialize hmem iface FI_HMEM_CUDA[^\n]*", log_run.out)
    if re.search(r"Hmem iface FI_HMEM_CUDA not supported", log_run.out):
        return [Finding(INFO, "hmem-cuda-unsupported",
                        "this libfabric cannot register CUDA memory (FI_HMEM_CUDA not supported: built "
                        "without CUDA, or no CUDA runtime/driver found): " + staged, fix)]
    if failed:
        return [Finding(INFO, "hmem-cuda-failed", f"libfabric could not set up CUDA memory ({failed.group(0)}): "
                        + staged, fix)]
    if "hmem" not in log_run.out.lower():
        return []  # nothing logged about memory interfaces: say nothing rather than guess
    return [Finding(INFO, "hmem-cuda", "this libfabric initialised FI_HMEM_CUDA: the RAYFABRIC tensor transport "
                    "registers CUDA tensors directly on providers that offer FI_HMEM (verbs or efa built with "
                    "CUDA, shm) and stages them through pinned host memory on the others (tcp, sockets); "
                    "leave FI_MR_CACHE_MAX_COUNT unset or non-zero: shm (and efa, which opens shm inside) "
                    "cannot open its CUDA IPC cache without it (docs/rdt.md, GPU tensors)", "")]


def has_cap_ipc_lock(proc_status_text: str) -> bool:
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)", proc_status_text, re.MULTILINE)
    return bool(m and (int(m.group(1), 16) >> CAP_IPC_LOCK) & 1)


MEMLOCK_FIX = ("raise it for the user that runs Ray and rayfabricd: `ulimit -l unlimited` (shell, needs the hard "
               "limit), LimitMEMLOCK=infinity (systemd unit), `<user> - memlock unlimited` in "
               "/etc/security/limits.conf (new login), `--ulimit memlock=-1` (docker), "
               "securityContext IPC_LOCK / memlock limit (Kubernetes)")


def check_memlock(soft: int, hard: int, store_bytes: int | None, cap_ipc_lock: bool) -> list[Finding]:
    """Registering plasma pins it: RLIMIT_MEMLOCK must cover the store unless CAP_IPC_LOCK."""
    inf = resource.RLIM_INFINITY
    if soft == inf:
        return []
    if store_bytes is None:
        if soft >= 1 << 30:
            return []
        return [Finding(WARNING, "memlock-low",
                        f"memlock limit {fmt_bytes(soft)} (hard {fmt_bytes(hard)}) is below any useful plasma store "
                        "(store size unknown: pass --store-bytes or start Ray to compare)"
                        + ("; not enforced for this process (it has CAP_IPC_LOCK, e.g. root)" if cap_ipc_lock else ""),
                        MEMLOCK_FIX)]
    if soft >= store_bytes:
        return []
    msg = f"memlock limit {fmt_bytes(soft)} < plasma {fmt_bytes(store_bytes)}"
    if hard != inf and hard < store_bytes:
        msg += f" (hard limit {fmt_bytes(hard)} too: only root/limits.conf can raise it)"
    if cap_ipc_lock:
        return [Finding(WARNING, "memlock-below-store",
                        msg + ": not enforced for this process (it has CAP_IPC_LOCK, e.g. root), but rayfabricd run "
                        "as another user would fail to register the store", MEMLOCK_FIX)]
    return [Finding(ERROR, "memlock-below-store",
                    msg + ": registering the store with the NIC would fail (ENOMEM / fi_mr_reg -12)", MEMLOCK_FIX)]


# ----------------------------------------------------------------------------- hugepages

def parse_meminfo(text: str) -> dict[str, int]:
    """/proc/meminfo -> {key: value}; values in kB where the file says so, converted to bytes."""
    out: dict[str, int] = {}
    for ln in text.splitlines():
        m = re.match(r"^([\w()]+):\s+(\d+)(\s*kB)?", ln)
        if m:
            out[m.group(1)] = int(m.group(2)) * (1024 if m.group(3) else 1)
    return out


def hugepage_summary(meminfo: Mapping[str, int]) -> dict[str, Any]:
    keys = ("HugePages_Total", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp", "Hugepagesize")
    return {k: meminfo.get(k) for k in keys}


def plasma_hugepages(store_bytes: int, page_size: int) -> int:
    """Huge pages one Ray 2.60 plasma store maps with --huge-pages: its allocator's granularity is
    then 1 GiB, so the store's one mapping is its size rounded UP to a multiple of 1 GiB, plus 8
    bytes (kMmapRegionsGap): a 256 MiB or a 1 GiB store maps 1 GiB + 8 B (513 pages of 2 MiB), all
    reserved at mmap (the raylet dies at startup if they are not free). `store_bytes` may be the
    configured size or the mapping the raylet logged (create_and_mmap_buffer: already + 8)."""
    gib = 1 << 30
    mapped = -(-max(store_bytes - 8, 1) // gib) * gib + 8
    return -(-mapped // page_size)


def check_hugepages(meminfo: Mapping[str, int], store_bytes: int | None, want_huge: bool,
                    running: bool = False) -> list[Finding]:
    """Only matters when Ray's plasma is asked to use hugepages (--huge-pages). `running`: the store
    already runs on hugepages (its raylet log says so): its pages were reserved when it mapped
    them, so free pages say nothing about it (they drop as it fills)."""
    if not want_huge:
        return []
    total, free, size = meminfo.get("HugePages_Total", 0), meminfo.get("HugePages_Free", 0), meminfo.get("Hugepagesize", 0)
    if total == 0:
        return [Finding(ERROR, "no-hugepages", "plasma hugepages requested but HugePages_Total is 0",
                        "reserve them: `sysctl vm.nr_hugepages=<per store: its size rounded up to 1 GiB, "
                        "/ Hugepagesize, + 1>` and mount hugetlbfs "
                        "(`mount -t hugetlbfs none /mnt/hugepages`), or do not use --huge-pages")]
    # Pages promised to mappings (HugePages_Rsvd) are counted as free but are not there to take.
    usable = free - meminfo.get("HugePages_Rsvd", 0)
    need = plasma_hugepages(store_bytes, size) if store_bytes is not None and size else 0
    if not running and usable < need:
        return [Finding(ERROR, "hugepages-short",
                        f"plasma {fmt_bytes(store_bytes)} maps {need} hugepages (Ray rounds the store up to "
                        f"1 GiB + 8 B on hugepages) but {usable} are free and unreserved "
                        f"({usable} x {fmt_bytes(size)} = {fmt_bytes(usable * size)})",
                        f"raise vm.nr_hugepages to at least {total + need - usable}")]
    return []


# ----------------------------------------------------------------------------- Ray store size

RAYLET_MMAP = re.compile(r"create_and_mmap_buffer\((\d+), ")
RAYLET_ALLOW = re.compile(r"Allowing the Plasma store to use up to ([0-9.]+)GB")
RAYLET_HUGE = re.compile(r"huge page support (enabled|disabled)")
RAYLET_PID = re.compile(r"^\[[0-9-]+ [0-9:,]+ [A-Z] (\d+) \d+\] \(raylet\)", re.MULTILINE)


def parse_raylet_log(text: str) -> dict[str, Any]:
    """One raylet.out -> {"bytes": plasma capacity or None, "huge": True/False/None, "pid": raylet pid}.

    The raylet logs `create_and_mmap_buffer(<bytes>, /dev/shm/plasmaXXXXXX)` for its store
    (the first one; later ones are fallback allocations) and, before it, `Allowing the Plasma
    store to use up to <x>GB of memory` (GB = 1e9, rounded) and `... huge page support enabled`.
    """
    m = RAYLET_MMAP.search(text)
    a = RAYLET_ALLOW.search(text)
    h = RAYLET_HUGE.search(text)
    size = int(m.group(1)) if m else (int(float(a.group(1)) * 1e9) if a else None)
    p = RAYLET_PID.search(text)
    return {"bytes": size, "huge": (h.group(1) == "enabled") if h else None, "pid": int(p.group(1)) if p else None}


def ray_session_dir(env: Mapping[str, str] = os.environ) -> Path | None:
    base = Path(env.get("RAY_TMPDIR", "/tmp")) / "ray" / "session_latest"
    return base if base.exists() else None


def raylet_running(pid: int | None, proc: str | os.PathLike[str] = "/proc") -> bool:
    return pid is not None and _read(Path(proc) / str(pid) / "comm") == "raylet"


def ray_store_bytes(env: Mapping[str, str] = os.environ, proc: str = "/proc") -> tuple[int | None, str, bool | None]:
    """The local Ray node's plasma size from its raylet log: (bytes, source, hugepages) or (None, why, None).

    Reads the latest session's logs/raylet*.out; it does not connect to the cluster. Several
    raylets on one machine (ray.cluster_utils.Cluster) -> the largest store.
    """
    session = ray_session_dir(env)
    if session is None:
        return None, "no Ray session on this node", None
    found = [(f.name, parse_raylet_log(_read(f) or "")) for f in sorted((session / "logs").glob("raylet*.out"))]
    found = [(n, r) for n, r in found if r["bytes"]]
    if not found:
        return None, f"no plasma size in {session}/logs/raylet*.out", None
    found = [(n, r) for n, r in found if raylet_running(r["pid"], proc)]
    if not found:
        return None, f"no raylet of the Ray session {session.resolve().name} is running (stale session)", None
    name, best = max(found, key=lambda x: x[1]["bytes"])
    more = f", largest of {len(found)} raylets" if len(found) > 1 else ""
    return best["bytes"], f"Ray plasma of the running session ({session.resolve().name}/logs/{name}{more})", best["huge"]


# ----------------------------------------------------------------------------- engine hook

ENGINE_TOOL = "rayfabric-fabric-info"
ENGINE_TOOL_SUBDIR = os.path.join("tools", "fabric_info")   # where meson builds it under the build root
ENGINE_SETTINGS = ("RAYFABRIC_PROVIDER", "RAYFABRIC_DOMAIN", "RAYFABRIC_REQUIRE_RDMA", "FI_PROVIDER")


def default_bin_dir(env: Mapping[str, str] = os.environ,
                    here: str = PACKAGE_DIR) -> str:
    """rayfabric.bin_dir(): $RAYFABRIC_BIN_DIR, else the installed package's _bin/ (the wheel),
    else the source tree's build/ (`here` is the package's folder, python/rayfabric/). Repeated here (not imported) so
    that the doctor runs as a plain script, without the package on sys.path."""
    if env.get("RAYFABRIC_BIN_DIR"):
        return env["RAYFABRIC_BIN_DIR"]
    if os.path.isdir(os.path.join(here, "_bin")):
        return os.path.join(here, "_bin")
    return os.path.abspath(os.path.join(here, "..", "..", "build"))


def find_engine_tool(env: Mapping[str, str] = os.environ) -> tuple[str | None, list[str]]:
    """(path or None, places looked at): bin_dir()/ and bin_dir()/tools/fabric_info/, then PATH."""
    base = default_bin_dir(env)
    looked = [os.path.join(base, ENGINE_TOOL), os.path.join(base, ENGINE_TOOL_SUBDIR, ENGINE_TOOL)]
    for cand in looked:
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand, looked
    looked.append("PATH")
    return shutil.which(ENGINE_TOOL, path=env.get("PATH")), looked


def engine_selection(env: Mapping[str, str] = os.environ, timeout: float = 60) -> dict[str, Any]:
    """What the C++ engine itself would choose: `rayfabric-fabric-info --json`.

    Looked up in rayfabric.bin_dir() ($RAYFABRIC_BIN_DIR, else the source tree's build/; the
    binary itself or tools/fabric_info/ under it), then PATH. It runs the engine's own provider
    selection with `env` (RAYFABRIC_PROVIDER, RAYFABRIC_DOMAIN, RAYFABRIC_REQUIRE_RDMA, FI_*).
    Returns {"available": True, "binary": path, "selection": <its JSON>}, or {"available": False,
    "reason": "not available: ...", "status": "missing" | "failed" | "error", ...}: missing = no
    binary; failed = it ran and found no provider (exit 1, the engine's message); error = it could
    not run, timed out, died, or printed no JSON.
    """
    path, looked = find_engine_tool(env)
    if path is None:
        return {"available": False, "status": "missing",
                "reason": f"not available: no {ENGINE_TOOL} in RAYFABRIC_BIN_DIR or PATH (looked in "
                          f"{', '.join(looked)})"}
    try:
        p = subprocess.run([path, "--json"], capture_output=True, text=True, timeout=timeout, env=dict(env))
    except subprocess.TimeoutExpired:
        return {"available": False, "status": "error", "binary": path,
                "reason": f"not available: {ENGINE_TOOL} failed: timed out after {timeout:.0f} s"}
    except OSError as e:
        return {"available": False, "status": "error", "binary": path,
                "reason": f"not available: {ENGINE_TOOL} failed: {e}"}
    err = p.stderr.strip()[-1000:]
    if p.returncode == 1:
        return {"available": False, "status": "failed", "binary": path, "message": err,
                "reason": f"not available: {ENGINE_TOOL} exited 1: {err}"}
    if p.returncode != 0:
        how = f"killed by signal {-p.returncode}" if p.returncode < 0 else f"exited {p.returncode}"
        return {"available": False, "status": "error", "binary": path,
                "reason": f"not available: {ENGINE_TOOL} {how}: {err}"}
    try:
        return {"available": True, "binary": path, "selection": json.loads(p.stdout)}
    except ValueError:
        return {"available": False, "status": "error", "binary": path,
                "reason": f"not available: {ENGINE_TOOL} printed no JSON"}


def check_engine(es: Mapping[str, Any], rdma_offered: bool, env: Mapping[str, str] = os.environ) -> list[Finding]:
    """The engine's own choice against what fi_info offers, and what its keys are worth.

    rdma_offered: fi_info lists an RDMA provider with an RDM+RMA endpoint and no other finding
    is an error (the node looks RDMA-capable).
    """
    if not es.get("available"):
        status = es.get("status", "missing")
        if status == "missing":
            return [Finding(INFO, "engine-tool-missing",
                            f"cannot ask the engine which provider it would choose: {es['reason']}",
                            "build rayfabric (`ninja -C build` builds build/tools/fabric_info/"
                            f"{ENGINE_TOOL}) or point RAYFABRIC_BIN_DIR at the build directory")]
        if status == "failed":
            set_vars = [f"{v}={env[v]}" for v in ENGINE_SETTINGS if env.get(v)]
            return [Finding(ERROR, "engine-selection-failed",
                            f"the engine would not start here: {es.get('message') or es['reason']}",
                            ("unset or fix " + ", ".join(set_vars) if set_vars else
                             "fix the device/libfabric findings above")
                            + f"; `{ENGINE_TOOL}` shows the candidates it saw")]
        return [Finding(WARNING, "engine-tool-error",
                        f"{es['reason']}: the engine's own choice is unknown",
                        f"run `{es.get('binary', ENGINE_TOOL)} --json` by hand; rebuild rayfabric "
                        "(`ninja -C build`) if it crashes")]
    sel = es["selection"]
    out: list[Finding] = []
    prov, dom = sel.get("provider", "?"), sel.get("domain", "?")
    if rdma_offered and not sel.get("rdma"):
        asked = [f"{v}={env[v]}" for v in ENGINE_SETTINGS if env.get(v)]
        if asked:
            out.append(Finding(WARNING, "engine-not-rdma",
                               f"RDMA is offered here, but the engine chooses {prov} on {dom} (not RDMA) because "
                               f"{', '.join(asked)} asks for it",
                               "unset " + ", ".join(a.split("=")[0] for a in asked) + " to let rayfabric use RDMA"))
        else:
            out.append(Finding(ERROR, "engine-not-rdma",
                               f"fi_info offers RDMA, but the engine chooses {prov} on {dom} (not RDMA): "
                               f"{sel.get('reason', '')}",
                               "rayfabric may be linked against another libfabric than this fi_info (check "
                               f"`ldd {es.get('binary', ENGINE_TOOL)} | grep fabric`; build with "
                               "-Dlibfabric_prefix=... and pass --fi-info from the same prefix)"))
    if sel.get("enforces_access") is False:
        note = sel.get("access_note", "")
        allowed = env.get("RAYFABRIC_ALLOW_UNPROTECTED_MEMORY", "").lower() in ("1", "true", "yes", "on")
        out.append(Finding(WARNING if allowed else ERROR, "access-not-enforced",
                           f"{prov}: a registration may grant peers more than asked, write included ({note}); "
                           + ("RAYFABRIC_ALLOW_UNPROTECTED_MEMORY lets the agent serve anyway" if allowed
                              else "the agent refuses to serve plasma memory on it"),
                           "leave the MR cache variables unset (agents then run with FI_MR_CACHE_MONITOR=disabled "
                           "and the device-memory monitors off) or set FI_MR_CACHE_MONITOR=disabled; for shm, "
                           "choose another provider"))
    if sel.get("deregistration_revokes_keys") is False:
        life = sel.get("key_lifetime", "")
        core = prov.split(";")[0]
        if sel.get("mr_cache"):
            var = "FI_EFA_MR_CACHE_ENABLE=0" if core == "efa" else "FI_MR_CACHE_MONITOR=disabled"
            out.append(Finding(WARNING, "keys-outlive-deregistration",
                               f"{prov}: a deregistered region's key keeps working ({life})",
                               f"for multi-tenant nodes or the per-object registration mode, export {var} for "
                               "rayfabricd (rayfabric registers the plasma store once, so the cache buys little)"))
        elif sel.get("checks_remote_keys") is False:
            out.append(Finding(WARNING, "keys-outlive-deregistration",
                               f"{prov}: RMA keys are not checked at all ({life})",
                               "shm reaches only processes on this host of the same user; do not share the node "
                               "between tenants with one uid"))
        else:
            out.append(Finding(INFO, "keys-outlive-deregistration",
                               f"{prov}: whether deregistration revokes keys is not known ({life})",
                               "treat keys as valid until the memory is unmapped"))
    return out


def check_control_plane(env: Mapping[str, str]) -> list[Finding]:
    """How the agents' gRPC is protected: as the Ray cluster's own (token, TLS), read from Ray's
    environment variables."""
    token = env.get("RAY_AUTH_MODE", "").lower() == "token"
    tls = env.get("RAY_USE_TLS", "0").lower() in ("1", "true")
    if tls:
        missing = [v for v in ("RAY_TLS_SERVER_CERT", "RAY_TLS_SERVER_KEY", "RAY_TLS_CA_CERT") if not env.get(v)]
        if missing:
            return [Finding(ERROR, "tls-incomplete", f"RAY_USE_TLS is set but {', '.join(missing)} is not",
                            "set RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY and RAY_TLS_CA_CERT as for Ray itself")]
    if not token and not tls:
        return [Finding(WARNING, "control-plane-open",
                        "no token authentication (RAY_AUTH_MODE is not 'token') and no TLS: like this Ray "
                        "cluster, any host that reaches an agent's port can lease objects and read the node's "
                        "object store (never write it, never create objects)",
                        "enable Ray's token authentication (RAY_AUTH_MODE=token; `ray get-auth-token --generate`) "
                        "and/or TLS (RAY_USE_TLS=1 with RAY_TLS_*); rayfabric follows it")]
    return [Finding(INFO, "control-plane",
                    "agents require " + " and ".join(x for x, on in (("the cluster's token", token),
                                                                      ("TLS with client certificates", tls)) if on),
                    "")]


PROC_SYS = "/proc/sys"
TCP_CONGESTION = "net/ipv4/tcp_congestion_control"   # under PROC_SYS
DEFAULT_QDISC = "net/core/default_qdisc"
TCP_CARRIED = ("tcp", "net", "xnet", "sockets")  # core providers on kernel TCP (net was xnet in 1.16-1.17)


def check_tcp_congestion(congestion: str | None, default_qdisc: str | None, provider: str | None) -> list[Finding]:
    """BBR paces every TCP connection's sends, inside TCP itself where the interface has no fq
    qdisc (loopback never has one). Measured on the development VM over loopback, tcp;ofi_rxm
    (docs/benchmarks-history.md, "TCP congestion control"): 1 MiB reads held back after idle, large reads
    a third slower than with cubic. Only the host's default is read: a route's own `congctl` is
    not (the message says so).

    provider: the engine's chosen provider ("tcp;ofi_rxm"), None when unknown. A warning when the
    node's objects travel on TCP, a note otherwise (a peer without this node's RDMA fabric still
    pairs with it over TCP).
    """
    congestion = (congestion or "").strip()
    if not congestion.startswith("bbr"):  # bbr, and the bbr2/bbr3 of some kernels
        return []
    core = (provider or "").split(";")[0]
    on_tcp = core in TCP_CARRIED
    qdisc = (default_qdisc or "").strip() or "unknown"
    whose = (f"the engine's {provider} connections included" if on_tcp else
             "those of any peer this node reaches over a TCP provider included" if provider else
             "the engine's provider is unknown here; TCP providers' connections included")
    msg = (f"TCP congestion control is {congestion} (net.ipv4.tcp_congestion_control: the default of the "
           f"network namespace doctor runs in, the host's unless that is a container's; a route's own congctl "
           f"is not checked): every TCP connection's sends are paced, by TCP itself where the "
           f"interface has no fq qdisc (loopback never has one; net.core.default_qdisc is {qdisc}), {whose}; "
           "measured over loopback on a 2-vCPU VM (tcp;ofi_rxm, rayfabric-bench): 256 MiB reads at "
           "3.4-3.9 GB/s against 5.3-5.5 with cubic, and of 1,000 1 MiB reads after 10 ms of idle 3-11 "
           "took over 5x the median (up to 10-30 ms; none with cubic)")
    fix = ("on every node (an fi_read's bytes are sent by the source node): `ip route change ROUTE congctl "
           "cubic` for the fabric's routes only (nodes of one host: the `local ADDR` route in `ip route show "
           "table local`; the kernel recreates that route, without congctl, when the address is added again), "
           "or `sysctl -w net.ipv4.tcp_congestion_control=cubic` for every TCP flow of the host (a file in "
           "/etc/sysctl.d/ keeps it across reboots); either applies to connections made afterwards (restart "
           "the agents); compare with `rayfabric-bench --op read --gap-us 10000` before and after (Ray's "
           "own object transfer rides TCP too)")
    return [Finding(WARNING if on_tcp else INFO, "tcp-congestion-bbr", msg, fix)]


# ----------------------------------------------------------------------------- report

def diagnose(*, sysfs: str = SYSFS_IB, dev_dir: str = "/dev/infiniband", proc_sys: str = PROC_SYS,
             fi_info: str | None = None, store_bytes: int | None = None,
             store_source: str = "", want_huge: bool = False, huge_running: bool = False,
             env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """Gather everything on this machine and evaluate it; returns the JSON-able report."""
    fi = find_fi_info(fi_info, env)
    version_run = run_fi_info(fi, ["--version"])
    list_run = run_fi_info(fi, ["-l"])
    rdm_run = run_fi_info(fi, ["-t", "FI_EP_RDM", "-c", "FI_RMA"])
    efa_run = run_fi_info(fi, ["-p", "efa"])
    hmem_run = run_fi_info(fi, ["-l"], extra_env={"FI_LOG_LEVEL": "info"})
    devices = read_ib_devices(sysfs)
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    cap = has_cap_ipc_lock(_read(Path("/proc/self/status")) or "")
    meminfo = parse_meminfo(_read(Path("/proc/meminfo")) or "")

    findings = (check_rdma_devices(devices, sysfs) + check_uverbs(devices, dev_dir) + check_libfabric(list_run, rdm_run, bool(devices))
                + check_efa(devices, efa_run)
                + check_efa_facts(devices, bool(efa_run.rc == 0 and parse_fi_info(efa_run.out)),
                                  (_read(Path(DMI_PRODUCT)) or "").strip())
                + check_rxe_universe(devices, env) + check_rxe_chunk(devices, env)
                + check_memlock(soft, hard, store_bytes, cap) + check_hugepages(meminfo, store_bytes, want_huge, huge_running)
                + check_hmem_cuda(hmem_run))
    entries = [] if rdm_run.nodata else parse_fi_info(rdm_run.out)
    by_prov = rdm_domains(entries)
    rdma_sel = {p: d for p, d in by_prov.items() if is_rdma_provider(p)}
    # The engine as an agent would run it (the launcher's environment defaults included).
    agent_env = agent_fabric_env(env)
    es = engine_selection(agent_env)
    findings += check_engine(es, bool(rdma_sel) and not any(f.severity == ERROR for f in findings), agent_env)
    findings += check_control_plane(env)
    findings += check_tcp_congestion(_read(Path(proc_sys) / TCP_CONGESTION), _read(Path(proc_sys) / DEFAULT_QDISC),
                                     es["selection"].get("provider") if es["available"] else None)
    usable = not any(f.severity == ERROR for f in findings)
    engine = ""
    if es["available"]:
        sel = es["selection"]
        engine = f"; the engine chooses {sel.get('provider')} on {sel.get('domain')}"
    efa_devs = [d.name for d in devices or [] if d.is_efa]
    return {
        "rdma_usable": usable,
        "verdict": ("RDMA usable: " + "; ".join(f"{p} on {', '.join(d)}" for p, d in rdma_sel.items()) + engine
                    if usable
                    else "RDMA NOT usable on this node: rayfabric would use " + (
                        f"{es['selection'].get('provider')} on {es['selection'].get('domain')}"
                        + ("" if es["selection"].get("rdma") else " (not RDMA)") if es["available"]
                        else "a TCP provider") + " (or Ray's own path)"),
        "findings": [f.to_dict() for f in findings],
        "libfabric": {
            "fi_info": fi,
            "version": version_run.out.splitlines()[1].split(":", 1)[1].strip()
                        if version_run.rc == 0 and len(version_run.out.splitlines()) > 1 else None,
            "providers": parse_fi_info_list(list_run.out) if list_run.rc == 0 else [],
            "rdm_rma_domains": by_prov,
        },
        "engine_selection": es,
        "rdma_devices": None if devices is None else [dataclasses.asdict(d) for d in devices],
        "efa": {"devices": efa_devs,
                "libfabric_efa": bool(efa_run.rc == 0 and parse_fi_info(efa_run.out)),
                "fi_info_p_efa": efa_run.error or ("ok" if efa_run.rc == 0 else f"exit {efa_run.rc}: {efa_run.out[-120:]}")},
        "memlock": {"soft": None if soft == resource.RLIM_INFINITY else soft,
                    "hard": None if hard == resource.RLIM_INFINITY else hard,
                    "soft_h": fmt_bytes(soft), "hard_h": fmt_bytes(hard), "cap_ipc_lock": cap},
        "plasma_store": {"bytes": store_bytes, "human": fmt_bytes(store_bytes) if store_bytes else None,
                         "source": store_source},
        "hugepages": hugepage_summary(meminfo),
    }


def render_text(r: Mapping[str, Any]) -> str:
    L: list[str] = []
    lf = r["libfabric"]
    L.append("rayfabric doctor")
    L.append(f"libfabric      {lf['version'] or '?'} ({lf['fi_info'] or 'fi_info not found'})")
    L.append(f"  providers    {', '.join(lf['providers']) or 'none'}")
    L.append("  RDM + RMA endpoints (fi_info -t FI_EP_RDM -c FI_RMA):")
    for p, doms in lf["rdm_rma_domains"].items():
        L.append(f"    {p:<18} {', '.join(doms)}{'   [RDMA]' if is_rdma_provider(p) else ''}")
    if not lf["rdm_rma_domains"]:
        L.append("    none")
    es = r["engine_selection"]
    if es["available"]:
        sel = es["selection"]
        L.append(f"engine choice  {sel.get('provider')} on {sel.get('domain')} "
                 f"({'RDMA' if sel.get('rdma') else 'not RDMA'}; {es['binary']})")
        L.append(f"  why          {sel.get('reason', '')}")
        if "deregistration_revokes_keys" in sel:
            L.append(f"  keys         checked: {'yes' if sel.get('checks_remote_keys') else 'NO'}, revoked by "
                     f"deregistration: {'yes' if sel['deregistration_revokes_keys'] else 'NO'} "
                     f"({sel.get('key_lifetime', '')})")
        fabrics = [f"{f.get('provider')}/{f.get('domain')}" for f in sel.get("fabrics", [])]
        if fabrics:
            L.append(f"  fabrics      {', '.join(fabrics)} (an agent opens them all; each peer gets "
                     "the best one both nodes have)")
        others = [f"{c.get('provider')}/{c.get('domain')}" for c in sel.get("candidates", [])
                  if not str(c.get("verdict", "")).startswith("chosen")]
        if others:
            L.append(f"  passed over  {', '.join(others)}")
    else:
        L.append("engine choice  " + es["reason"])
    devs = r["rdma_devices"]
    if devs is None:
        L.append(f"RDMA devices   none ({SYSFS_IB} does not exist)")
    elif not devs:
        L.append(f"RDMA devices   none ({SYSFS_IB} is empty)")
    else:
        L.append("RDMA devices")
        for d in devs:
            extra = ", ".join(x for x in (f"driver {d['driver']}" if d["driver"] else "",
                                          f"on {d['parent']}" if d["parent"] else "") if x)
            L.append(f"  {d['name']}{f' ({extra})' if extra else ''}")
            for p in d["ports"]:
                L.append(f"    port {p['num']}: {p['state']} / {p['phys_state']}, {p['link_layer']}, {p['rate']}"
                         + (f", netdev {', '.join(p['netdevs'])}" if p["netdevs"] else ""))
    e = r["efa"]
    L.append(f"EFA            devices: {', '.join(e['devices']) or 'none'}; libfabric efa provider: "
             f"{'yes' if e['libfabric_efa'] else 'no'}")
    m = r["memlock"]
    L.append(f"memlock        soft {m['soft_h']}, hard {m['hard_h']}"
             + (" (CAP_IPC_LOCK: limit not enforced for this process)" if m["cap_ipc_lock"] else ""))
    ps = r["plasma_store"]
    L.append(f"plasma store   {ps['human'] or 'not compared'} ({ps['source']})")
    h = r["hugepages"]
    L.append(f"hugepages      total {h['HugePages_Total']}, free {h['HugePages_Free']}, size {fmt_bytes(h['Hugepagesize'])}")
    L.append("")
    for f in r["findings"]:
        L.append(f"{f['severity'].upper():<8}{f['message']}")
        if f["fix"]:
            L.append(f"        -> {f['fix']}")
    if r["findings"]:
        L.append("")
    L.append(("OK: " if r["rdma_usable"] else "NOT OK: ") + r["verdict"])
    return "\n".join(L)


def settings_report(env: Mapping[str, str] = os.environ, timeout: float = 60) -> dict[str, Any]:
    """Every setting: the C++ table's (the agent's and the engine's: `rayfabric-fabric-info
    --settings --json`) and the Python package's (rayfabric.settings), each with its type, what it
    allows, its default, its value in `env` and, when that value is bad, why."""
    engine: list[dict[str, Any]] | None = None
    engine_error = ""
    path, looked = find_engine_tool(env)
    if path is None:
        engine_error = f"no {ENGINE_TOOL} in RAYFABRIC_BIN_DIR or PATH (looked in {', '.join(looked)})"
    else:
        try:
            p = subprocess.run([path, "--settings", "--json"], capture_output=True, text=True,
                               timeout=timeout, env=dict(env))
            engine = json.loads(p.stdout)
            engine_error = p.stderr.strip()[-2000:] if p.returncode != 0 else ""
        except (OSError, subprocess.TimeoutExpired, ValueError) as e:
            engine_error = f"{ENGINE_TOOL} --settings failed: {e}"
    python = []
    for st in py_settings.TABLE:
        row = {"name": st.name, "env": st.env, "type": st.type, "allows": py_settings.allows(st),
               "default": st.default, "value": env.get(st.env, st.default),
               "source": f"env {st.env}" if st.env in env else "default", "doc": st.doc, "error": ""}
        try:
            py_settings.get(st.name, env)
        except ValueError as e:
            row["error"] = str(e)
        python.append(row)
    return {"engine": engine, "engine_error": engine_error, "python": python,
            "valid": not engine_error and all(not r["error"] for r in python)}


def render_settings(report: dict[str, Any]) -> str:
    """The settings report as `ucx_info -c` lists its own: doc, what it allows and the default as
    comments, then ENV=value."""
    out = ["# The agent's and the engine's settings (C++: settings.json's agent rows)", ""]
    for row in report["engine"] or []:
        out += [f"# {row['doc']}", f"# {row['type']}: {row['allows']}; default '{row['default']}'"
                + ("" if row["source"] == "default" else f"; set by {row['source']}"),
                f"{row['env']}={row['value']}", ""]
    if report["engine_error"]:
        out += [f"# {'NOT VALID' if report['engine'] is not None else 'NOT LISTED'}: {report['engine_error']}", ""]
    out += ["# The Python package's settings (settings.json's python rows)", ""]
    for row in report["python"]:
        out += [f"# {row['doc']}", f"# {row['type']}: {row['allows']}"
                + ("" if row["source"] == "default" else f"; set by {row['source']}"),
                f"{row['env']}={row['value']}"] + ([f"# NOT VALID: {row['error']}"] if row["error"] else []) + [""]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rayfabric doctor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--json-file", metavar="PATH", help="also write the JSON report to PATH (keeps the text output)")
    ap.add_argument("--store-bytes", help="plasma store size to check memlock against (e.g. 2G); "
                    "default: the running Ray session's plasma size (from its raylet log)")
    ap.add_argument("--huge-pages", action="store_true", help="plasma will use hugepages: check they are reserved "
                    "(default: when the running Ray's raylet log says huge page support is enabled)")
    ap.add_argument("--fi-info", help="fi_info of the libfabric rayfabric uses (default: PATH, then "
                    + EFA_FI_INFO + ")")
    ap.add_argument("--settings", action="store_true", help="list every setting (the agent's, the engine's and "
                    "the Python package's) with its type, what it allows, its default and its value here, "
                    "as ucx_info -c does; exit 1 when one is not valid")
    ap.add_argument("--sysfs", default=SYSFS_IB, help=argparse.SUPPRESS)          # tests: a laid-out tree
    ap.add_argument("--dev-dir", default="/dev/infiniband", help=argparse.SUPPRESS)
    ap.add_argument("--proc-sys", default=PROC_SYS, help=argparse.SUPPRESS)         # tests: a laid-out tree
    a = ap.parse_args(argv)
    if a.settings:
        report = settings_report()
        print(json.dumps(report, indent=2) if a.json else render_settings(report))
        return 0 if report["valid"] else 1
    if a.store_bytes:
        try:
            store, source = parse_size(a.store_bytes), "--store-bytes"
        except ValueError as e:
            ap.error(str(e))
        ray_huge = None
    else:
        store, source, ray_huge = ray_store_bytes()
    want_huge = a.huge_pages or bool(ray_huge)
    r = diagnose(sysfs=a.sysfs, dev_dir=a.dev_dir, proc_sys=a.proc_sys, fi_info=a.fi_info, store_bytes=store, store_source=source,
                 want_huge=want_huge, huge_running=bool(ray_huge))
    print(json.dumps(r, indent=2) if a.json else render_text(r))
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(r, indent=2) + "\n")
    return 0 if r["rdma_usable"] else 1


if __name__ == "__main__":
    sys.exit(main())
