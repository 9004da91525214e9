"""Peer transfer engines side by side (issue 32): one-sided reads of the same sizes between two
processes on this host, through rayfabric's engine (rayfabric-bench: fi_read on libfabric),
Mooncake Transfer Engine (its TCP transport) and NIXL (its UCX backend; its LIBFABRIC plugin where
it loads), in one run, printed as one table.

  RAYFABRIC_BIN_DIR=build python3 bench/peer_engines.py [--sizes 4K,64K,1M,16M,64M]
                                                        [--engines rayfabric,mooncake,nixl]
                                                        [--json F]

Each engine: a target process registers a buffer filled with a known pattern; the initiator
registers its own and reads [0, size) of the target's, one read at a time, after a warm-up
(latency: the median read; bandwidth: the bytes of all reads over their time); its buffer is
cleared before each size and compared with the pattern after it. Two transports:
  tcp  every engine over TCP sockets on this host (rayfabric: tcp;ofi_rxm; Mooncake: tcp; NIXL:
       UCX with UCX_TLS=tcp);
  shm  each engine's own path between two processes of one host (rayfabric: libfabric's shm
       provider; NIXL: UCX's default choice there, shared memory and CMA; Mooncake: none).
An engine that is not installed, or does not load here, is a row that says why (install:
`pip install mooncake-transfer-engine-non-cuda nixl-cu12`; scripts/setup.sh does). Noisy shared
hosts: compare the engines of one run, not runs of different days."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MiB = 1 << 20
READ_BYTES = 256 * MiB  # per size: reads of `size` until about this much was read (10-2000 reads)
WARMUP = 3


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def label(size):
    for unit, n in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size % n == 0:
            return f"{size // n}{unit}"
    return str(size)


def pattern(n):
    import numpy as np
    return (np.arange(n, dtype=np.uint64) * 7 % 251).astype(np.uint8)


def reads_of(size):
    return max(10, min(2000, READ_BYTES // size))


def measure(read, local, size):
    """Times reads of `size` into `local` (cleared first); verified against the pattern."""
    import numpy as np
    local[:size] = 0
    for _ in range(WARMUP):
        read(size)
    n = reads_of(size)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        read(size)
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"size": size, "iters": n, "p50_us": times[n // 2] * 1e6, "gbps": size * n / sum(times) / 1e9,
            "verified": bool(np.array_equal(local[:size], pattern(size)))}


# --- Mooncake Transfer Engine -------------------------------------------------------------------
def mooncake_engine():
    from mooncake.engine import TransferEngine
    engine = TransferEngine()
    rc = engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize returned {rc}")
    return engine


def mooncake_target(nbytes):
    engine = mooncake_engine()
    buf = pattern(nbytes)
    if engine.register_memory(buf.ctypes.data, nbytes) != 0:
        raise RuntimeError("register_memory failed")
    return {"session": f"127.0.0.1:{engine.get_rpc_port()}", "addr": buf.ctypes.data}, (engine, buf)


def mooncake_initiator(target, sizes):
    import numpy as np
    engine = mooncake_engine()
    local = np.zeros(max(sizes), dtype=np.uint8)
    if engine.register_memory(local.ctypes.data, local.nbytes) != 0:
        raise RuntimeError("register_memory failed")

    def read(size):
        rc = engine.transfer_sync_read(target["session"], local.ctypes.data, target["addr"], size)
        if rc != 0:
            raise RuntimeError(f"transfer_sync_read of {size} bytes returned {rc}")
    return [measure(read, local, s) for s in sizes]


# --- NIXL -----------------------------------------------------------------------------------------
def nixl_api():
    try:
        from nixl_cu12._api import nixl_agent, nixl_agent_config
    except ImportError:
        from nixl._api import nixl_agent, nixl_agent_config
    return nixl_agent, nixl_agent_config


def nixl_new(name, backend):
    nixl_agent, nixl_agent_config = nixl_api()
    return nixl_agent(name, nixl_agent_config(backends=[backend]))


def nixl_target(nbytes, backend):
    agent = nixl_new("target", backend)
    buf = pattern(nbytes)
    agent.register_memory([(buf.ctypes.data, nbytes, 0, "")], "DRAM")
    return {"meta": agent.get_agent_metadata().hex(), "addr": buf.ctypes.data}, (agent, buf)


def nixl_initiator(target, sizes, backend):
    import numpy as np
    agent = nixl_new("initiator", backend)
    local = np.zeros(max(sizes), dtype=np.uint8)
    agent.register_memory([(local.ctypes.data, local.nbytes, 0, "")], "DRAM")
    peer = agent.add_remote_agent(bytes.fromhex(target["meta"]))
    rows = []
    for size in sizes:
        handle = agent.initialize_xfer("READ", agent.get_xfer_descs([(local.ctypes.data, size, 0)], "DRAM"),
                                       agent.get_xfer_descs([(target["addr"], size, 0)], "DRAM"), peer)

        def read(_size, handle=handle):
            state = agent.transfer(handle)
            while state != "DONE":
                if state == "ERR":
                    raise RuntimeError("NIXL transfer failed")
                state = agent.check_xfer_state(handle)
        rows.append(measure(read, local, size))
        agent.release_xfer_handle(handle)
    return rows


# --- The two processes ----------------------------------------------------------------------------
MARK = "PEER-ENGINES-TARGET "


def serve(engine, backend, nbytes):
    """The target: registers its buffer, says where on stdout, and lives until stdin closes."""
    if engine == "mooncake":
        where, keep = mooncake_target(nbytes)
    else:
        where, keep = nixl_target(nbytes, backend)
    print(MARK + json.dumps(where), flush=True)
    sys.stdin.read()
    del keep


def initiate(engine, backend, sizes, out):
    """The initiator: starts its target, reads from it, writes its rows to `out`."""
    target = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", engine, "--backend", backend,
                               "--bytes", str(max(sizes))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = target.stdout.readline()
        while line and not line.startswith(MARK):  # (the engines' own log lines)
            line = target.stdout.readline()
        if not line:
            raise RuntimeError(f"the {engine} target ended before it was ready (exit {target.wait()})")
        where = json.loads(line[len(MARK):])
        rows = mooncake_initiator(where, sizes) if engine == "mooncake" else nixl_initiator(where, sizes, backend)
    finally:
        target.stdin.close()
        target.wait(timeout=60)
    with open(out, "w") as f:
        json.dump(rows, f)


def run_python_engine(engine, backend, sizes, env_extra, timeout):
    """One engine's initiator in a process of its own (the engines' libraries never share one);
    its rows, or the reason it could not run."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.json")
        env = dict(os.environ, **env_extra)
        cmd = [sys.executable, os.path.abspath(__file__), "--initiate", engine, "--backend", backend,
               "--sizes", ",".join(map(str, sizes)), "--out", out]
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"did not finish within {timeout} s"
        if p.returncode != 0 or not os.path.exists(out):
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"failed (exit {p.returncode}): {tail[:300]}"
        with open(out) as f:
            return json.load(f), None


def installed(module):
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_rayfabric(provider, sizes, timeout, env_extra):
    bin_dir = os.environ.get("RAYFABRIC_BIN_DIR", "build")
    exe = next((p for p in (os.path.join(bin_dir, "bench", "rayfabric-bench"), os.path.join(bin_dir, "rayfabric-bench"),
                            shutil.which("rayfabric-bench") or "") if p and os.path.exists(p)), None)
    if exe is None:
        return None, f"rayfabric-bench not found under RAYFABRIC_BIN_DIR={bin_dir} (build it: ninja -C build)"
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rf.json")
        cmd = [exe, "--provider", provider, "--op", "read", "--verify", "--sizes", ",".join(label(s) for s in sizes),
               "--json", out]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, **env_extra))
        except subprocess.TimeoutExpired:
            return None, f"did not finish within {timeout} s"
        if p.returncode != 0 or not os.path.exists(out):
            tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"failed (exit {p.returncode}): {tail[:300]}"
        with open(out) as f:
            report = json.load(f)
    return [{"size": r["size"], "iters": r["iters"], "p50_us": r["p50_us"], "gbps": r["gbps"],
             "verified": r["verified"]} for r in report["results"]], None


def nixl_libfabric_loads():
    """Why NIXL's LIBFABRIC plugin does not load here, or None if it does."""
    try:
        nixl_agent, nixl_agent_config = nixl_api()
        agent = nixl_agent("probe", nixl_agent_config(backends=[]))
        if "LIBFABRIC" not in agent.get_plugin_list():
            return "NIXL has no LIBFABRIC plugin here"
        agent.create_backend("LIBFABRIC", {})
        return None
    except Exception as e:  # noqa: BLE001 - said in the table
        plugin_dir = None
        try:
            import nixl_cu12
            base = os.path.dirname(os.path.dirname(nixl_cu12.__file__))
            plugin_dir = os.path.join(base, ".nixl_cu12.mesonpy.libs", "plugins")
        except ImportError:
            pass
        why = f"{type(e).__name__}: {e}"
        lib = os.path.join(plugin_dir or "", "libplugin_LIBFABRIC.so")
        if plugin_dir and os.path.exists(lib) and shutil.which("ldd"):
            ldd = subprocess.run(["ldd", lib], capture_output=True, text=True)
            missing = [ln.split()[0] for ln in ldd.stdout.splitlines() if "=> not found" in ln]
            # ("version `FABRIC_1.10' not found (required by ...)": the node's libfabric is older)
            versions = sorted({ln.split("`")[1].split("'")[0] for ln in (ldd.stdout + ldd.stderr).splitlines()
                               if "version `" in ln})
            if missing or versions:
                why = "its plugin does not load: needs " + ", ".join(
                    missing + [f"a libfabric with symbol version {v}" for v in versions])
        return why


CASES = [  # (engine, transport, how)
    ("rayfabric", "tcp", "tcp;ofi_rxm"),
    # (its peers poll for completions; rayfabric blocks on a wait fd unless told to poll first)
    ("rayfabric", "tcp", "tcp;ofi_rxm, RAYFABRIC_PROGRESS_SPIN_US=50"),
    ("mooncake", "tcp", "tcp"),
    ("nixl", "tcp", "UCX, UCX_TLS=tcp"),
    ("rayfabric", "shm", "shm"),
    ("nixl", "shm", "UCX, its default here"),
    ("nixl", "libfabric", "LIBFABRIC"),
]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="4K,64K,1M,16M,64M")
    p.add_argument("--engines", default="rayfabric,mooncake,nixl")
    p.add_argument("--transports", default="tcp,shm")
    p.add_argument("--timeout", type=int, default=300, help="seconds per engine and transport")
    p.add_argument("--json")
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--initiate", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="UCX", help=argparse.SUPPRESS)
    p.add_argument("--bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    # The engines' processes end without the interpreter's teardown: NIXL 1.5.1 crashes in it
    # (after its rows are written), and it is not what is measured.
    if a.serve:
        serve(a.serve, a.backend, a.bytes)
        sys.stdout.flush()
        os._exit(0)
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    if a.initiate:
        initiate(a.initiate, a.backend, sizes, a.out)
        sys.stdout.flush()
        os._exit(0)
    engines, transports = a.engines.split(","), a.transports.split(",")
    results = []
    for engine, transport, how in CASES:
        if engine not in engines or (transport not in transports and not (transport == "libfabric" and "tcp" in
                                                                            transports)):
            continue
        rows, why = None, None
        if engine == "rayfabric":
            provider, _, spin = how.partition(", ")
            rows, why = run_rayfabric(provider, sizes, a.timeout, dict([spin.split("=")]) if spin else {})
        elif engine == "mooncake":
            if not installed("mooncake"):
                why = "not installed (pip install mooncake-transfer-engine-non-cuda)"
            else:
                rows, why = run_python_engine("mooncake", "", sizes, {}, a.timeout)
        elif not (installed("nixl_cu12") or installed("nixl")):
            why = "not installed (pip install nixl-cu12)"
        elif transport == "libfabric":
            why = nixl_libfabric_loads()
            if why is None:
                rows, why = run_python_engine("nixl", "LIBFABRIC", sizes, {"FI_PROVIDER": "tcp"}, a.timeout)
        else:
            env = {"UCX_TLS": "tcp"} if transport == "tcp" else {}
            rows, why = run_python_engine("nixl", "UCX", sizes, env, a.timeout)
        results.append({"engine": engine, "transport": transport, "how": how, "rows": rows, "skipped": why})
        state = "ok" if rows else f"skipped: {why}"
        print(f"{engine:9s} {transport:9s} ({how}): {state}", flush=True)

    print()
    ran = [r for r in results if r["rows"]]
    def name(r):
        return r["engine"] + " " + r["transport"] + (" spin" if "SPIN" in r["how"] else "")
    head = f"{'size':>6s}" + "".join(f" | {name(r):>20s}" for r in ran)
    print("median read (us) / GB/s over all reads; * = bytes differ from the target's")
    print(head)
    for i, size in enumerate(sizes):
        cells = []
        for r in ran:
            row = r["rows"][i]
            cells.append(f"{row['p50_us']:9.1f} / {row['gbps']:6.3f}{'' if row['verified'] else '*'}")
        print(f"{label(size):>6s}" + "".join(f" | {c:>20s}" for c in cells))
    for r in results:
        if not r["rows"]:
            print(f"{r['engine']} {r['transport']} ({r['how']}): {r['skipped']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"sizes": sizes, "host": os.uname().nodename, "cpus": os.cpu_count(),
                       "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "results": results}, f, indent=1)
    bad = [r for r in ran if not all(row["verified"] for row in r["rows"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
