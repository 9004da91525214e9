"""The GPU checks of the RAYFABRIC tensor transport (python/rayfabric/rdt.py), for a machine with a
CUDA GPU: two processes, each with its own fabric engine (rayfabric._fabric) over a real libfabric
provider, move tensors the way Ray's RDT drives the transport (extract on the source, recv on the
receiver, garbage_collect), byte-verified (sha256 on both sides):

  gpu->gpu   CUDA tensors (float32 256 MiB, bf16, int64, a 0-d one) into CUDA tensors
  cpu->gpu   CPU tensors into CUDA target buffers
  gpu->cpu   CUDA tensors into CPU target buffers
  cpu->cpu   the same path as on the CPU-only machines, for comparison

and prints the time of each step (stage-out, read, copy-in), the path each side's bytes took
(`device`: CUDA memory registered as it is, FI_HMEM; `staged`: through pinned host memory; `host`:
a CPU tensor) and the registrations left. --expect device|staged|fallback makes the path part of
the verdict: `device` where the provider offers FI_HMEM and libfabric has CUDA (shm, verbs or efa
built with CUDA), `staged` where the provider has no FI_HMEM (tcp), `fallback` where it offers
FI_HMEM but libfabric cannot register CUDA memory (the transport then stages, and says why).

Ray itself does not travel to the GPU machine (its wheel is larger than what may be carried), so the
transport class is driven directly; with RAYFABRIC_RAY_STUB set, Ray's own interface module
(ray/experimental/rdt/tensor_transport_manager.py, copied from the installed Ray) is loaded from that
folder. Without a GPU (torch.cuda.is_available() false) only cpu->cpu runs, so that the harness can
be tried anywhere. Exit status 0 only when every case that ran matched.

    python3 tests/gpu/gpu_rdt_check.py [--mib 256]
"""
import argparse
import hashlib
import importlib.util
import multiprocessing as mp
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "..", "python", "rayfabric")


def load_transport():
    """rayfabric.rdt without rayfabric/__init__ (which needs a running Ray for its API)."""
    stub = os.environ.get("RAYFABRIC_RAY_STUB")
    if stub:
        sys.path.insert(0, stub)
    if "rayfabric" not in sys.modules:
        pkg = types.ModuleType("rayfabric")
        pkg.__path__ = [os.path.abspath(PKG)]
        pkg.bin_dir = lambda: os.environ.get("RAYFABRIC_BIN_DIR", os.path.join(PKG, "..", "..", "build"))
        sys.modules["rayfabric"] = pkg
    spec = importlib.util.spec_from_file_location("rayfabric.rdt", os.path.join(PKG, "rdt.py"))
    rdt = importlib.util.module_from_spec(spec)
    sys.modules["rayfabric.rdt"] = rdt
    spec.loader.exec_module(rdt)
    return rdt


def digest(tensors):
    import torch
    return [hashlib.sha256(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                           if t.numel() else b"").hexdigest() for t in tensors]


def make(device, mib, seed):
    import torch
    g = torch.Generator(device="cpu").manual_seed(seed)
    cpu = [torch.randn(mib * (1 << 20) // 4, generator=g), torch.randn(1000, 333, generator=g).bfloat16(),
           torch.randint(-5, 5, (17, 3), dtype=torch.int64, generator=g), torch.tensor(2.5, dtype=torch.float64),
           torch.empty(0, 8)]
    return [t.to(device) for t in cpu]


def path_of(before, after, direction):
    """How one side's bytes went in one case: device, staged, host (or mixed)."""
    keys = (("sent_from_device", "sent_staged") if direction == "send"
            else ("received_into_device", "received_staged"))
    device, staged = (after["bytes_" + k] - before["bytes_" + k] for k in keys)
    return "device" if device and not staged else "staged" if staged and not device else \
        "host" if not device and not staged else "mixed"


def source(conn, cases, mib):
    rdt = load_transport()
    transport = rdt.RayfabricTensorTransport()
    engines = transport.engines()
    conn.send([f"{e.provider}/{e.domain} (device memory: {e.device_memory_note})" for e in engines])
    for name, src_device, _ in cases:
        tensors = make(src_device, mib, seed=len(name))
        before = transport.stats()
        start = time.perf_counter()
        meta = transport.extract_tensor_transport_metadata(name, tensors)
        staged = time.perf_counter() - start
        after = transport.stats()
        conn.send((name, meta, digest(tensors), staged, path_of(before, after, "send"),
                   after["device_memory_failed"]))
        assert conn.recv() == "done"
        transport.garbage_collect(name, meta, tensors)
    stats = transport.stats()
    conn.send(("left", stats["registered_buffers"], stats["objects"],
               sum(v["regions_registered"] for v in stats.values() if isinstance(v, dict))))


def receive(conn, dst_device):
    import torch
    rdt = load_transport()
    transport = rdt.RayfabricTensorTransport()
    transport.engines()
    name, meta, want = conn.recv()[:3]
    targets = None
    if dst_device != meta.tensor_device:  # the other device: into target buffers of that device
        targets = [torch.empty(shape, dtype=dtype, device=dst_device) for shape, dtype in meta.tensor_meta]
    before = transport.stats()
    start = time.perf_counter()
    got = transport.recv_multiple_tensors(name, meta, rdt.RayfabricCommunicatorMetadata(), targets)
    took = time.perf_counter() - start
    after = transport.stats()
    devices = sorted({t.device.type for t in got})
    ok = digest(got) == want and devices == [dst_device]
    conn.send(("result", ok, devices, took, sum(meta.nbytes), path_of(before, after, "recv"),
               after["device_memory_failed"]))
    conn.recv()


def recv(conn, what, timeout_s=90):
    """A message from a child process, or an error naming what did not come (never a hang)."""
    if not conn.poll(timeout_s):
        raise TimeoutError(f"no {what} within {timeout_s} s")
    return conn.recv()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--expect", choices=["device", "staged", "fallback"],
                        help="the path CUDA tensors must take (default: any)")
    args = parser.parse_args()
    import torch
    gpu = torch.cuda.is_available()
    cases = [("cpu->cpu", "cpu", "cpu")]
    if gpu:
        print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
        cases = [("gpu->gpu", "cuda", "cuda"), ("cpu->gpu", "cpu", "cuda"), ("gpu->cpu", "cuda", "cpu")] + cases
    else:
        print("no CUDA GPU here: only cpu->cpu runs")
    load_transport()  # the metadata passes through this process
    ctx = mp.get_context("spawn")
    src_conn, src_end = ctx.Pipe()
    src = ctx.Process(target=source, args=(src_end, cases, args.mib))
    src.start()
    print("source fabrics:", recv(src_conn, "source start"))
    failures = 0
    print(f"{'case':10} {'bytes':>12} {'stage-out s':>11} {'recv s':>8} {'GB/s':>6} {'send':>7} {'recv':>7}  result")
    for name, _, dst_device in cases:
        dst_conn, dst_end = ctx.Pipe()
        dst = ctx.Process(target=receive, args=(dst_end, dst_device))
        dst.start()
        print(f"{name}: extracting", flush=True)
        msg = recv(src_conn, f"{name} metadata from the source")
        dst_conn.send(msg)
        print(f"{name}: receiving", flush=True)
        _, ok, devices, took, nbytes, recv_path, recv_failed = recv(dst_conn, f"{name} result from the receiver")
        dst_conn.send("bye")
        dst.join(60)
        src_conn.send("done")
        send_path, send_failed = msg[4], msg[5]
        verdict = "bytes identical" if ok else "MISMATCH"
        if args.expect:
            want = "staged" if args.expect == "fallback" else args.expect
            sides = [(p, f, dev) for p, f, dev in ((send_path, send_failed, name.split("->")[0]),
                                                    (recv_path, recv_failed, name.split("->")[1]))]
            for p, failed, dev in sides:
                want_here = want if dev == "gpu" else "host"
                if p != want_here or (args.expect == "fallback" and dev == "gpu" and not failed):
                    ok = False
                    verdict += f"; {dev} side took path {p}, expected {want_here}"
                if dev == "gpu" and failed and args.expect != "fallback":
                    ok = False
                    verdict += f"; device memory given up: {failed}"
        failures += not ok
        print(f"{name:10} {nbytes:12d} {msg[3]:11.3f} {took:8.3f} {nbytes / took / 1e9:6.2f} {send_path:>7} "
              f"{recv_path:>7}  {verdict} on {devices}")
        for side, failed in (("source", send_failed), ("receiver", recv_failed)):
            if failed and name == cases[0][0]:
                print(f"  {side}: device memory given up: {failed}")
    _, buffers, objects, regions = recv(src_conn, "the source's registration count")
    src.join(60)
    print(f"source after garbage_collect: {buffers} buffers, {objects} objects, {regions} regions registered")
    failures += (buffers, objects, regions) != (0, 0, 0)
    print("PASS" if failures == 0 else f"FAIL ({failures})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
