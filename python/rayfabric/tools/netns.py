"""Two Ray nodes on one host that talk only over links of their own: each node is started with
`ray start` in its own network namespace, and the namespaces are joined by veth pairs, one per
link, with addresses from documentation ranges (never the host's own networks). The first link
carries Ray (the nodes' IPs); the others are further interfaces (rails, or a side network). Links
can be shaped with `tc` to a rate, so that the wire, not this host's CPU, is the bottleneck.

Used by the tests (tests/agent/test_netns_interface.py) and `rayfabric bench rails`, `link`,
`broadcast`. Needs root
and iproute2; `NetnsPair.available()` says why not otherwise. Namespaces do not isolate PIDs:
Ray's processes are stopped by the namespaces' own PID lists, never by `ray stop`."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
NAMESPACES = ("rfnsA", "rfnsB")
# Link i: node A's device, node B's device, A's address, B's address (/24 each).
LINKS = (("rfa0", "rfb0", "198.51.100.1", "198.51.100.2"),
         ("rfa1", "rfb1", "203.0.113.1", "203.0.113.2"),
         ("rfa2", "rfb2", "198.18.0.1", "198.18.0.2"))


# The start of a driver that NetnsPair.run_driver runs (in node A's namespace): Ray joined, the
# configuration (argv[2]) read, nodes A and B by name, and the two tasks that make a fresh object on
# node B and hash it there (what the benchmarks check every transfer against).
PAIR_DRIVER_PRELUDE = r"""
import hashlib, json, os, sys, time
import numpy as np, ray, rayfabric
ray.init(address=sys.argv[1], logging_level="ERROR")
cfg = json.loads(sys.argv[2])
nodes = {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}
by_name = {("nA" if "nA" in n["Resources"] else "nB"): i for i, n in nodes.items()}

@ray.remote(num_cpus=0, resources={"nB": 0.01})
def make(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 256, size=nbytes, dtype=np.uint8)

@ray.remote(num_cpus=0, resources={"nB": 0.01})
def digest_at_source(refs):
    return hashlib.sha256(ray.get(refs[0]).tobytes()).hexdigest()
"""


# Driver code (a string, as above) that counts CPU per network namespace, for the benchmarks that
# report CPU seconds per GB: namespace_inodes({label: namespace name or None for the driver's own})
# -> {inode: label}; cpu_ticks(inodes) -> {label: {(pid, start time): user+sys ticks}} of every live
# process in those namespaces (namespaces do not isolate PIDs, so /proc lists them all);
# cpu_seconds_between(before, after) -> {label: seconds}. Processes that started in between count
# whole; those that exited in between are lost (nothing reads their last times): it can only
# undercount.
CPU_DRIVER_HELPERS = r"""
import os
TICK = os.sysconf("SC_CLK_TCK")

def namespace_inodes(labels):
    return {os.stat("/proc/self/ns/net" if ns is None else "/var/run/netns/" + ns).st_ino: label
            for label, ns in labels.items()}

def cpu_ticks(inodes):
    out = {label: {} for label in inodes.values()}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            label = inodes.get(os.stat(f"/proc/{pid}/ns/net").st_ino)
            if label is None:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[label][(pid, fields[19])] = int(fields[11]) + int(fields[12])
        except (OSError, IndexError, ValueError):
            continue  # exited while we looked
    return out

def cpu_seconds_between(before, after):
    return {label: sum(t - before.get(label, {}).get(k, 0) for k, t in ticks.items()) / TICK
            for label, ticks in after.items()}
"""


def sh(*args, check=True, timeout=120, env=None):
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env)
    if check and out.returncode != 0:
        raise RuntimeError(f"{args} -> {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


def in_ns(ns, *args, **kw):
    return sh("ip", "netns", "exec", ns, *args, **kw)


def _kill_namespace(ns):
    def pids():
        return subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids():
            try:
                os.kill(int(pid), sig)
            except (ProcessLookupError, ValueError):
                pass
        if not pids():
            break
        time.sleep(1.0 if sig == signal.SIGTERM else 0)


def teardown():
    for ns in NAMESPACES:
        _kill_namespace(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def _can_make_namespace(name, clean):
    """None if namespace `name` can be made here (after `clean()` removed leftovers of an earlier
    run of that layout), else why not."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2 (ip netns)"
    clean()
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None if probe.returncode == 0 else f"cannot create network namespaces here: {probe.stderr.strip()}"


ALLOWED_CONGESTION = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"

# Runs until its stdin reaches EOF: when CongestionAllowed closes it, and equally when the caller
# dies (SIGTERM, SIGKILL), since it runs in a session of its own. Then it writes back the list the
# run found, unless somebody else changed the setting meanwhile (it is no longer what the run wrote).
_CONGESTION_JANITOR = r"""
import sys
path, original, widened = sys.argv[1], sys.argv[2], sys.argv[3]
sys.stdin.read()
with open(path) as f:
    now = f.read().split()
if sorted(now) == sorted(widened.split()):
    with open(path, "w") as f:
        f.write(original)
"""


def read_allowed_congestion(path=ALLOWED_CONGESTION):
    """The names net.ipv4.tcp_allowed_congestion_control lists (what namespaces may choose)."""
    with open(path) as f:
        return f.read().split()


def write_allowed_congestion(names, path=ALLOWED_CONGESTION):
    with open(path, "w") as f:
        f.write(" ".join(names))


class CongestionAllowed:
    """Makes TCP congestion control `name` (one the kernel has: tcp_available_congestion_control)
    choosable in network namespaces for as long as it is entered: a namespace other than the
    initial one may take only what net.ipv4.tcp_allowed_congestion_control lists, a host-wide
    setting. Where `name` is listed already nothing changes; else it is added, and the list the
    run found is written back at exit by a janitor process that outlives the caller however it
    ends. `widened` says whether it was added, `before` is the list found, `after_exit` what the
    setting is once the janitor is done. Entering raises RuntimeError (nothing changed) when the
    setting cannot be read or written."""

    def __init__(self, name, path=ALLOWED_CONGESTION):
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise ValueError(f"TCP congestion control {name!r}: not a kernel module name")
        self.name, self.path = name, path
        self.before = self.widened_to = self.after_exit = None
        self.widened = False
        self._janitor = None

    def _read(self):
        return read_allowed_congestion(self.path)

    def __enter__(self):
        return self.apply()

    def __exit__(self, *exc):
        self.restore()

    def apply(self):
        """Adds the name to the list unless it is there (see the class)."""
        try:
            self.before = self._read()
        except OSError as e:
            raise RuntimeError(f"cannot read {self.path}: {e.strerror or e}") from e
        if self.name in self.before:
            return self
        self.widened_to = self.before + [self.name]
        wanted = " ".join(self.widened_to)
        # Started before the write, so that the list is restored even if this process dies right after it.
        self._janitor = subprocess.Popen([sys.executable, "-c", _CONGESTION_JANITOR, self.path, " ".join(self.before),
                                          wanted], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True, text=True)
        try:
            write_allowed_congestion(self.widened_to, self.path)
            if self.name not in self._read():
                raise OSError(f"the kernel did not take it (it lists {' '.join(self._read())})")
        except OSError as e:
            self._finish()
            raise RuntimeError(f"cannot add it to {self.path} for the run: {getattr(e, 'strerror', None) or e} "
                               f"(as root, `sysctl -w net.ipv4.tcp_allowed_congestion_control=\"{wanted}\"` "
                               "allows it)") from e
        self.widened = True
        return self

    def restore(self):
        """The list as the run found it, unless somebody else changed it meanwhile (see the class)."""
        if self.widened:
            self._finish()

    def _finish(self):
        if self._janitor is not None:
            self._janitor.stdin.close()
            self._janitor.wait(timeout=60)
            self._janitor = None
        try:
            self.after_exit = self._read()
        except OSError:
            self.after_exit = None


def shape_device(ns, dev, rate):
    """`dev` in namespace `ns` limited to `rate` (tc's units) on egress, or unshaped with None."""
    in_ns(ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
    if rate:
        # burst: a few ms of the rate (tbf needs at least one MTU per timer tick).
        in_ns(ns, "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate,
              "burst", "512kb", "latency", "50ms")


class _RayNodes:
    """What both layouts share: the driver runs in the head's namespace; a context manager."""

    head_ns = None

    def run_driver(self, code, *args, extra_env=None, timeout=600):
        """Runs `python -c code address args...` in the head node's namespace; returns its stdout."""
        env = dict(self.env, **(extra_env or {}))
        return in_ns(self.head_ns, sys.executable, "-c", code, self.address, *args, env=env,
                     timeout=timeout).stdout

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()  # what start() made before it failed
            raise

    def __exit__(self, *exc):
        self.stop()

    def _remove_temp(self):
        if self.env and self.env.get("HOME", "").startswith(tempfile.gettempdir()):
            shutil.rmtree(self.env["HOME"], ignore_errors=True)


class NetnsPair(_RayNodes):
    """Node A (head, resource "nA") and node B (resource "nB"), `links` veth pairs between them.
    Link 0 is created first and carries Ray; later links are created after it (libfabric lists the
    newest interface first, which is what the interface tests need)."""

    head_ns = NAMESPACES[0]

    def __init__(self, links=2, store_bytes=300 * MiB, congestion=None):
        if not 1 <= links <= len(LINKS):
            raise ValueError(f"links must be 1..{len(LINKS)}")
        self.links = LINKS[:links]
        self.store_bytes = store_bytes
        self.congestion = congestion  # TCP congestion control of both namespaces (None: the host's)
        self.env = None
        self.address = f"{LINKS[0][2]}:6379"

    @staticmethod
    def available():
        """None if namespaces can be made here, else why not."""
        return _can_make_namespace(NAMESPACES[0], teardown)

    def start(self):
        teardown()
        for ns in NAMESPACES:
            sh("ip", "netns", "add", ns)
            if self.congestion:  # before any connection is made: each keeps what it started with
                self._set_congestion(ns)
        for dev_a, dev_b, ip_a, ip_b in self.links:
            sh("ip", "link", "add", dev_a, "type", "veth", "peer", "name", dev_b)
            sh("ip", "link", "set", dev_a, "netns", NAMESPACES[0])
            sh("ip", "link", "set", dev_b, "netns", NAMESPACES[1])
            in_ns(NAMESPACES[0], "ip", "addr", "add", f"{ip_a}/24", "dev", dev_a)
            in_ns(NAMESPACES[1], "ip", "addr", "add", f"{ip_b}/24", "dev", dev_b)
            in_ns(NAMESPACES[0], "ip", "link", "set", dev_a, "up")
            in_ns(NAMESPACES[1], "ip", "link", "set", dev_b, "up")
        for ns in NAMESPACES:
            in_ns(ns, "ip", "link", "set", "lo", "up")
        tmp = tempfile.mkdtemp(prefix="rf-netns-")
        self.env = dict(os.environ, HOME=tmp, RAY_AUTH_MODE="disabled")
        common = ["--num-cpus", "1", "--object-store-memory", str(self.store_bytes), "--disable-usage-stats"]
        in_ns(NAMESPACES[0], "ray", "start", "--head", "--node-ip-address", LINKS[0][2], "--port", "6379",
              "--temp-dir", tmp, "--include-dashboard", "false", "--resources", json.dumps({"nA": 10}),
              *common, env=self.env, timeout=180)
        in_ns(NAMESPACES[1], "ray", "start", "--address", self.address, "--node-ip-address", LINKS[0][3],
              "--resources", json.dumps({"nB": 10}), *common, env=self.env, timeout=180)
        return self

    def _set_congestion(self, ns):
        if not re.fullmatch(r"[a-z0-9_]+", self.congestion):
            raise RuntimeError(f"TCP congestion control {self.congestion!r}: not a kernel module name")
        out = in_ns(ns, "sh", "-c", f"echo {self.congestion} > /proc/sys/net/ipv4/tcp_congestion_control",
                    check=False)
        if out.returncode != 0:
            raise RuntimeError(f"cannot set TCP congestion control {self.congestion} in namespace {ns}: "
                               f"{out.stderr.strip() or out.stdout.strip()} (a namespace may choose only what "
                               "/proc/sys/net/ipv4/tcp_allowed_congestion_control lists)")

    def shape(self, rate):
        """Every link limited to `rate` (tc's units, e.g. "1gbit") in both directions, or unshaped
        with rate None."""
        for dev_a, dev_b, _, _ in self.links:
            for ns, dev in ((NAMESPACES[0], dev_a), (NAMESPACES[1], dev_b)):
                shape_device(ns, dev, rate)

    def stop(self):
        teardown()
        self._remove_temp()


def cannot_run(layout, prog):
    """77 (meson's "skipped") where `layout` (NetnsPair, NetnsStar) cannot be set up here, having
    said why as `prog`; else None."""
    why = layout.available()
    if why:
        print(f"{prog}: cannot run here: {why}")
        return 77
    return None


def add_shaped_bench_options(p, link, link_help, reps, quick_help):
    """A benchmark's options on shaped links, to argparse parser `p`: --link (a tc rate, default
    `link`), --size-mib, --reps (default `reps`), --quick, --json."""
    p.add_argument("--link", default=link, help=link_help)
    p.add_argument("--size-mib", type=int, default=256)
    p.add_argument("--reps", type=int, default=reps)
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--json", help="write the rows here")


def run_driver_shaped(layout, rate, code, cfg, timeout):
    """A benchmark's run on a namespaced cluster: `layout` (a NetnsPair or NetnsStar, not started)
    started, its links shaped to `rate`, the driver `code` run in its head's namespace with `cfg`
    (as JSON) and this process's PYTHONPATH and RAYFABRIC_BIN_DIR, the layout torn down however
    that ends. Returns the rows the driver printed on its `RESULT ` line."""
    extra = {k: os.environ[k] for k in ("PYTHONPATH", "RAYFABRIC_BIN_DIR") if k in os.environ}
    try:
        layout.start()
        layout.shape(rate)
        out = layout.run_driver(code, json.dumps(cfg), extra_env=extra, timeout=timeout)
    finally:
        layout.stop()
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


def rate_bits(rate):
    """tc rate text ("1gbit", "500mbit") in bits per second."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * scale
    raise ValueError(f"rate {rate!r}: use e.g. 500mbit, 1gbit, 10gbit")


STAR_HUB = "rfbchub"
STAR_PREFIX = "rfbc"


def star_teardown(nodes=8):
    for ns in [f"{STAR_PREFIX}{i}" for i in range(nodes)] + [STAR_HUB]:
        _kill_namespace(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class NetnsStar(_RayNodes):
    """`nodes` Ray nodes (node i: namespace rfbc<i>, resource "n<i>", address 198.51.100.<10+i>),
    each joined by its own veth pair to a bridge in a hub namespace: a switch with one port per
    node. shape() limits every node's port in both directions, so a node's link, not the switch, is
    what several readers of one source share. Node 0 is the head."""

    head_ns = f"{STAR_PREFIX}0"

    def __init__(self, nodes=4, store_bytes=300 * MiB):
        if not 2 <= nodes <= 8:
            raise ValueError("nodes must be 2..8")
        self.nodes = nodes
        self.store_bytes = store_bytes
        self.env = None
        self.ips = [f"198.51.100.{10 + i}" for i in range(nodes)]
        self.address = f"{self.ips[0]}:6379"

    @staticmethod
    def available():
        """None if namespaces can be made here, else why not (probing a name of its own)."""
        return _can_make_namespace(STAR_HUB, star_teardown)

    def ns(self, i):
        return f"{STAR_PREFIX}{i}"

    def start(self):
        star_teardown()
        sh("ip", "netns", "add", STAR_HUB)
        in_ns(STAR_HUB, "ip", "link", "add", "rfbr0", "type", "bridge")
        in_ns(STAR_HUB, "ip", "link", "set", "rfbr0", "up")
        for i in range(self.nodes):
            ns = self.ns(i)
            sh("ip", "netns", "add", ns)
            # Made inside the namespaces: nothing is ever left in the host's own.
            sh("ip", "link", "add", f"rfn{i}", "netns", ns, "type", "veth", "peer", "name", f"rfh{i}",
               "netns", STAR_HUB)
            in_ns(STAR_HUB, "ip", "link", "set", f"rfh{i}", "master", "rfbr0")
            in_ns(STAR_HUB, "ip", "link", "set", f"rfh{i}", "up")
            in_ns(ns, "ip", "addr", "add", f"{self.ips[i]}/24", "dev", f"rfn{i}")
            in_ns(ns, "ip", "link", "set", f"rfn{i}", "up")
            in_ns(ns, "ip", "link", "set", "lo", "up")
        tmp = tempfile.mkdtemp(prefix="rf-netns-star-")
        self.env = dict(os.environ, HOME=tmp, RAY_AUTH_MODE="disabled")
        common = ["--num-cpus", "1", "--object-store-memory", str(self.store_bytes), "--disable-usage-stats"]
        in_ns(self.ns(0), "ray", "start", "--head", "--node-ip-address", self.ips[0], "--port", "6379",
              "--temp-dir", tmp, "--include-dashboard", "false", "--resources", json.dumps({"n0": 10}),
              *common, env=self.env, timeout=180)
        for i in range(1, self.nodes):
            in_ns(self.ns(i), "ray", "start", "--address", self.address, "--node-ip-address", self.ips[i],
                  "--resources", json.dumps({f"n{i}": 10}), *common, env=self.env, timeout=180)
        return self

    def shape(self, rate):
        """Every node's port limited to `rate` both ways (its veth end, and the switch's)."""
        for i in range(self.nodes):
            for ns, dev in ((self.ns(i), f"rfn{i}"), (STAR_HUB, f"rfh{i}")):
                shape_device(ns, dev, rate)

    def stop(self):
        star_teardown()
        self._remove_temp()
