"""Peer transfer engines side by side (issue 32): one-sided reads of the same sizes between two
processes on this host, through rayfabric's engine (rayfabric-bench: fi_read on libfabric),
Mooncake Transfer Engine (its TCP transport) and NIXL (its UCX backend; its LIBFABRIC plugin where
it loads), in one run, printed as one table.

  RAYFABRIC_BIN_DIR=build python3 bench/peer_engines.py [--sizes 4K,64K,1M,16M,64M]
                                                        [--engines rayfabric,mooncake,nixl]
                                                        [--json F]

Each engine: a target process registers a buffer filled with a pattern that encodes each byte's
position; the initiator registers its own and reads [0, size) of the target's, one read at a time:
one warm-up read, then the same number of timed reads on every engine (10-2000, about 256 MiB a
size; latency: the median read; bandwidth: the bytes of all timed reads over their time). Then
the initiator's buffer is cleared, read once more and compared with the pattern (rayfabric-bench,
run once per size in a fresh process, compares its buffer after the timed reads). Every engine
reaches its target at 127.0.0.1 (rayfabric on tcp with RAYFABRIC_DOMAIN=lo; UCX chooses its own
interfaces among those UCX_TLS allows). Two transports:
  tcp  every engine over TCP sockets on this host (rayfabric: tcp;ofi_rxm; Mooncake: tcp; NIXL:
       UCX with UCX_TLS=tcp);
  shm  each engine's own path between two processes of one host (rayfabric: libfabric's shm
       provider; NIXL: UCX's default choice there, shared memory and CMA; Mooncake: none).
An engine that is not installed, or does not load here, is a row that says why (install:
`pip install mooncake-transfer-engine-non-cuda nixl-cu12`; scripts/setup.sh does). The exit
status is 1 when rayfabric's own engine failed or any engine read wrong bytes (a peer engine that
fails is said in the table). Noisy shared hosts: compare the engines of one run, not runs of
different days."""
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
WARMUP = 1  # as rayfabric-bench does
MARK_WAIT_S = 60  # how long a target may take to say where its buffer is


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
    """Bytes that differ with their position (no short period: a read from a wrong offset fails)."""
    import numpy as np
    i = np.arange(n, dtype=np.uint64)
    return ((i * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(56)).astype(np.uint8)


def reads_of(size):
    return max(10, min(2000, READ_BYTES // size))


def measure(read, local, size):
    """Times reads of `size` into `local`; then one more into a cleared buffer, verified."""
    import numpy as np
    for _ in range(WARMUP):
        read(size)
    n = reads_of(size)
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        read(size)
        times.append(time.perf_counter() - t0)
    times.sort()
    local[:size] = 0
    read(size)
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
    """The target: registers its buffer, says where on stdout, and lives until stdin closes.
    Returns what must stay alive until the process ends (without the engine's teardown)."""
    if engine == "mooncake":
        where, keep = mooncake_target(nbytes)
    else:
        where, keep = nixl_target(nbytes, backend)
    print(MARK + json.dumps(where), flush=True)
    sys.stdin.read()
    return keep


def target_address(target, engine):
    """The target's MARK line, waited for at most MARK_WAIT_S; its stdout drained from then on
    (the engines log there), so that it never blocks on a full pipe."""
    import queue
    import threading
    lines = queue.Queue()

    def drain():
        for line in target.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=drain, daemon=True).start()
    deadline = time.monotonic() + MARK_WAIT_S
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"the {engine} target did not say where its buffer is within {MARK_WAIT_S} s")
        if line is None:
            raise RuntimeError(f"the {engine} target ended before it was ready (exit {target.wait()})")
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])


def initiate(engine, backend, sizes, out):
    """The initiator: starts its target, reads from it, writes its rows to `out`."""
    target = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", engine, "--backend", backend,
                               "--bytes", str(max(sizes))],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        where = target_address(target, engine)
        rows = mooncake_initiator(where, sizes) if engine == "mooncake" else nixl_initiator(where, sizes, backend)
        target.stdin.close()
        target.wait(timeout=60)
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()
    with open(out, "w") as f:
        json.dump(rows, f)


def run_python_engine(engine, backend, sizes, env_extra, timeout):
    """One engine's initiator in a process of its own (the engines' libraries never share one);
    its rows, or the reason it could not run."""
    return run_for_json(lambda out: [sys.executable, os.path.abspath(__file__), "--initiate", engine,
                                     "--backend", backend, "--sizes", ",".join(map(str, sizes)), "--out", out],
                        dict(os.environ, **env_extra), timeout)


def run_for_json(make_cmd, env, timeout):
    """Runs make_cmd(path) and reads the JSON it wrote at path: (what it wrote, None) or (None, why)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        try:
            p = subprocess.run(make_cmd(out), env=env, capture_output=True, text=True, timeout=timeout)
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
    """rayfabric-bench, once per size (a fresh buffer each time), with the other engines' read
    counts; its rows, or why not."""
    bin_dir = os.environ.get("RAYFABRIC_BIN_DIR", "build")
    exe = next((p for p in (os.path.join(bin_dir, "bench", "rayfabric-bench"), os.path.join(bin_dir, "rayfabric-bench"),
                            shutil.which("rayfabric-bench") or "") if p and os.path.exists(p)), None)
    if exe is None:
        return None, f"rayfabric-bench not found under RAYFABRIC_BIN_DIR={bin_dir} (build it: ninja -C build)"
    env = dict(os.environ, **env_extra)
    if provider.startswith("tcp"):
        env.setdefault("RAYFABRIC_DOMAIN", "lo")  # (127.0.0.1, as the others)
    rows = []
    for size in sizes:
        report, why = run_for_json(lambda out: [exe, "--provider", provider, "--op", "read", "--verify",
                                                "--sizes", label(size), "--iters", str(reads_of(size)),
                                                "--json", out], env, timeout)
        if report is None:
            return None, why
        r = report["results"][0]
        rows.append({"size": r["size"], "iters": r["iters"], "p50_us": r["p50_us"], "gbps": r["gbps"],
                     "verified": r["verified"], "domain": report["engine"].get("domain")})
    return rows, None


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
        alive = serve(a.serve, a.backend, a.bytes)  # (until the process ends)
        sys.stdout.flush()
        os._exit(0 if alive is not None else 1)
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
    own_failed = [r for r in results if r["engine"] == "rayfabric" and not r["rows"]]
    return 1 if bad or own_failed else 0


if __name__ == "__main__":
    sys.exit(main())
