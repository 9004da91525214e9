"""rayfabric as a Ray Direct Transport backend (rayfabric.rdt), on a REAL 3-node Ray cluster: torch
CPU tensors returned by an actor method with tensor_transport="RAYFABRIC" are fi_read by the actor
that receives them, with the engine running inside each actor process (rayfabric._fabric).

  n0: source actors; n1: receiving actors; n2: a receiver whose fabric is restricted to a provider
  the sources do not have.

Every tensor is checked byte for byte (sha256 at the source and at the receiver); the receiver's
engine counters prove the bytes came by fi_read and not through Ray's object store; the source's
registrations are counted back to zero once the refs are gone; a source frozen and then killed in
the middle of a read gives the caller an error (no hang) and leaves the receiver usable."""
import hashlib
import os
import signal
import time

import pytest
import ray
from ray.cluster_utils import Cluster

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh installs it)")

import rayfabric  # noqa: E402
import rayfabric.rdt  # noqa: E402

from ray_test_cluster import on, use_this_checkout  # noqa: E402

MiB = 1 << 20
# Before any class uses the name: ray.method checks it when the class is defined, here and in the
# workers that import this module to run the actors.
rayfabric.rdt.enable()


@pytest.fixture(scope="module")
def cluster():
    use_this_checkout()
    # Workers import this module (the actor classes) from here.
    os.environ["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), os.environ["PYTHONPATH"]])
    os.environ["RAYFABRIC_OP_TIMEOUT_MS"] = "5000"  # a frozen source is declared failed in ~5 s
    os.environ["RAYFABRIC_DRAIN_TIMEOUT_MS"] = "1000"  # and its posted reads cut off 1 s later
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "resources": {"n0": 100}, "object_store_memory": 200 * MiB, "include_dashboard": False})
    for name in ("n1", "n2"):
        c.add_node(num_cpus=2, resources={name: 100}, object_store_memory=200 * MiB)
    ray.init(address=c.address, logging_level="ERROR")
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def digest(tensors):
    return [(tuple(t.shape), str(t.dtype), hashlib.sha256(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                                                            if t.numel() else b"").hexdigest()) for t in tensors]


def flatten(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for k in sorted(value) for t in flatten(value[k])]
    return [t for v in value for t in flatten(v)]


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Source:
    def __init__(self):
        self.made = {}

    def pid(self):
        return os.getpid()

    @ray.method(tensor_transport="RAYFABRIC")
    def make(self, kind, seed=0):
        g = torch.Generator().manual_seed(seed)
        if kind == "big":
            value = torch.randn(16 * MiB, generator=g)  # 64 MiB float32
        elif kind == "huge":
            value = torch.randint(0, 255, (256 * MiB,), dtype=torch.uint8, generator=g)
        elif kind == "list":
            value = [torch.randint(-9, 9, (3, 5), dtype=torch.int64, generator=g),
                     torch.rand(7, generator=g).half(), torch.rand(11, generator=g) > 0.5,
                     torch.tensor(3.5, dtype=torch.float64), torch.empty(0, 4),
                     torch.randn(1000, 333, generator=g)]
        elif kind == "dict":
            value = {"w": torch.randn(512, 1024, generator=g), "b": torch.randn(1024, generator=g),
                     "step": torch.tensor([seed], dtype=torch.int32)}
        else:
            raise ValueError(kind)
        self.made[(kind, seed)] = digest(flatten(value))
        return value

    def digest_of(self, kind, seed=0):
        return self.made[(kind, seed)]

    def rdt_stats(self):
        return rayfabric.rdt.transport_stats()


@ray.remote(num_cpus=0, enable_tensor_transport=True)
class Receiver:
    def consume(self, value):
        return digest(flatten(value)), type(value).__name__, sum(t.numel() * t.element_size() for t in flatten(value))

    def rdt_stats(self):
        return rayfabric.rdt.transport_stats()

    def ping(self):
        return "ok"


def bytes_read(stats):
    return sum(v["bytes_read"] for k, v in stats.items() if isinstance(v, dict))


@pytest.mark.parametrize("kind", ["big", "list", "dict"])
def test_tensors_arrive_byte_identical_by_fi_read(cluster, kind):
    src, dst = on("n0", Source).remote(), on("n1", Receiver).remote()
    ref = src.make.remote(kind, seed=7)
    ray.get(dst.ping.remote())
    before = ray.get(dst.rdt_stats.remote())
    got, type_name, payload = ray.get(dst.consume.remote(ref), timeout=120)
    want = ray.get(src.digest_of.remote(kind, 7))
    assert got == want
    assert type_name == {"big": "Tensor", "list": "list", "dict": "dict"}[kind]
    after = ray.get(dst.rdt_stats.remote())
    moved = bytes_read(after) - bytes_read(before)
    assert moved == payload, f"the receiver's engine read {moved} bytes, the tensors hold {payload}"
    del ref


def test_registrations_released_when_refs_go(cluster):
    src, dst = on("n0", Source).remote(), on("n1", Receiver).remote()
    refs = [src.make.remote("dict", seed=s) for s in range(3)]
    for r in refs:
        ray.get(dst.consume.remote(r), timeout=120)
    held = ray.get(src.rdt_stats.remote())
    assert held["registered_buffers"] == 9 and held["objects"] == 3
    engines = [v for v in held.values() if isinstance(v, dict)]
    assert all(e["regions_registered"] >= 9 for e in engines)
    del refs, r
    deadline = time.time() + 60
    while time.time() < deadline:
        now = ray.get(src.rdt_stats.remote())
        if now["registered_buffers"] == 0 and now["objects"] == 0:
            break
        time.sleep(0.5)
    assert now["registered_buffers"] == 0 and now["objects"] == 0, now
    assert all(v["regions_registered"] == 0 for v in now.values() if isinstance(v, dict)), now


def test_source_killed_mid_read_fails_the_get_and_receiver_lives_on(cluster):
    src, dst = on("n0", Source).remote(), on("n1", Receiver).remote()
    ray.get(dst.consume.remote(src.make.remote("list", seed=1)), timeout=120)  # connected: reads get posted
    ref = src.make.remote("huge", seed=1)
    pid = ray.get(src.pid.remote())
    ray.get(src.digest_of.remote("huge", 1))  # the tensor exists and is registered
    os.kill(pid, signal.SIGSTOP)  # frozen: its engine serves no more reads
    started = time.time()
    pending = dst.consume.remote(ref)
    time.sleep(2)
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Exception) as caught:
        ray.get(pending, timeout=120)
    took = time.time() - started
    assert took < 90, f"the failed read took {took:.0f} s"
    print(f"source killed mid-read: {type(caught.value).__name__} after {took:.1f} s: "
          f"{str(caught.value).splitlines()[0][:200]}")
    # The receiver still works, with a new source.
    src2 = on("n0", Source).remote()
    got, _, _ = ray.get(dst.consume.remote(src2.make.remote("list", seed=3)), timeout=120)
    assert got == ray.get(src2.digest_of.remote("list", 3))


def test_no_shared_provider_is_a_clear_error(cluster):
    src = Source.options(resources={"n0": 0.01},
                         runtime_env={"env_vars": {"RAYFABRIC_PROVIDER": "tcp"}}).remote()
    dst = Receiver.options(resources={"n2": 0.01},
                           runtime_env={"env_vars": {"RAYFABRIC_PROVIDER": "sockets"}}).remote()
    ref = src.make.remote("list", seed=5)
    with pytest.raises(Exception) as caught:
        ray.get(dst.consume.remote(ref), timeout=120)
    assert "no fabric provider in common" in str(caught.value), str(caught.value)[:2000]
    assert "tcp" in str(caught.value) and "sockets" in str(caught.value)
    assert "RAYFABRIC_PROVIDER" in str(caught.value)  # what to do
    assert ray.get(dst.ping.remote()) == "ok"


def test_abort_transport_ends_a_stalled_read_at_once(cluster):
    """What Ray calls on the receiver when it gives up on a transfer (abort_transport): the reads
    posted to a frozen source (connected by an earlier object) are cancelled and, since the frozen
    peer cannot return them, cut off by an endpoint reset of the receiver's reading engine after
    the drain bound (1 s here), well before the engine's own 5 s operation timeout; the source,
    thawed, serves the same object again (its serving address did not change), and the
    receiver's engine counted the reads it posted and the reset."""
    src, dst = on("n0", Source).remote(), on("n1", Receiver).remote()
    ray.get(dst.consume.remote(src.make.remote("list", seed=2)), timeout=120)  # connected: reads get posted
    ref = src.make.remote("huge", seed=2)
    pid = ray.get(src.pid.remote())
    want = ray.get(src.digest_of.remote("huge", 2))
    ray.get(dst.ping.remote())
    os.kill(pid, signal.SIGSTOP)
    try:
        pending = dst.consume.remote(ref)
        time.sleep(1.5)

        def abort(self_actor, obj_id):
            from ray.experimental.rdt.util import get_tensor_transport_manager
            get_tensor_transport_manager("RAYFABRIC").abort_transport(obj_id, None)

        aborted_at = time.time()
        ray.get(dst.__ray_call__.options(concurrency_group="_ray_system_error").remote(abort, ref.hex()))
        with pytest.raises(Exception) as caught:
            ray.get(pending, timeout=60)
        took = time.time() - aborted_at
    finally:
        os.kill(pid, signal.SIGCONT)
    assert "aborted by Ray" in str(caught.value), str(caught.value)[:2000]
    assert took < 4, f"the aborted read took {took:.1f} s to fail"
    stats = ray.get(dst.rdt_stats.remote())
    reader = stats["read tcp;ofi_rxm"]
    assert reader["ops_posted"] > 0 and reader["transfers_failed"] >= 1, stats
    got, _, _ = ray.get(dst.consume.remote(ref), timeout=120)
    assert got == want


def test_retried_extract_and_empty_objects_in_one_process():
    """Without a cluster, the transport driven as Ray's RDT store drives it: a task retried (the same
    object extracted twice) leaves one set of registrations, released by one garbage_collect; an
    object of empty tensors only is received without any read."""
    transport = rayfabric.rdt.RayfabricTensorTransport()
    t = torch.arange(1 << 16, dtype=torch.float32)
    first = transport.extract_tensor_transport_metadata("obj-retried", [t])
    second = transport.extract_tensor_transport_metadata("obj-retried", [t])
    assert transport.stats()["registered_buffers"] == 1
    transport.garbage_collect("obj-retried", second, [t])
    stats = transport.stats()
    assert stats["registered_buffers"] == 0 and stats["objects"] == 0, stats
    assert all(v["regions_registered"] == 0 for v in stats.values() if isinstance(v, dict)), stats
    del first
    meta = transport.extract_tensor_transport_metadata("obj-empty", [torch.empty(0), torch.empty(3, 0)])
    got = transport.recv_multiple_tensors("obj-empty", meta, rayfabric.rdt.RayfabricCommunicatorMetadata())
    assert [tuple(x.shape) for x in got] == [(0,), (3, 0)]
    transport.garbage_collect("obj-empty", meta, [])


def test_ray_get_timeout_bounds_a_stalled_read_in_the_driver(cluster):
    """ray.get(ref, timeout=1) of a RAYFABRIC object in the driver, from a frozen source: Ray's
    GetTimeoutError after about a second (the read posted through fetch_multiple_tensors, waited
    for in wait_fetch_complete with Ray's deadline, then given up and cancelled), not the engine's
    5 s operation timeout; thawed, the same object then arrives whole in the driver."""
    src = on("n0", Source).remote()
    ref = src.make.remote("huge", seed=4)
    pid = ray.get(src.pid.remote())
    want = ray.get(src.digest_of.remote("huge", 4))
    warm = src.make.remote("list", seed=4)
    ray.get(warm, timeout=120)  # the driver's reading engine is connected to the source
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.time()
        with pytest.raises(ray.exceptions.GetTimeoutError):
            ray.get(ref, timeout=1)
        took = time.time() - started
    finally:
        os.kill(pid, signal.SIGCONT)
    assert took < 3.5, f"ray.get(timeout=1) returned after {took:.1f} s"
    before = bytes_read(rayfabric.rdt.transport_stats())
    value = ray.get(ref, timeout=120)
    assert digest(flatten(value)) == want
    moved = bytes_read(rayfabric.rdt.transport_stats()) - before
    assert moved == 256 * MiB, f"the driver's engine read {moved} bytes: not the fabric path?"


def test_target_buffers_in_one_process():
    """Ray hands the receive pre-allocated buffers when the user asked for them: a CPU buffer that
    fits is read into directly (the same memory comes back), one that does not fit is replaced by a
    fresh tensor; the bytes are right either way."""
    transport = rayfabric.rdt.RayfabricTensorTransport()
    src = [torch.arange(1 << 18, dtype=torch.float32), torch.arange(1000, dtype=torch.int64)]
    meta = transport.extract_tensor_transport_metadata("obj-targets", src)
    fits = torch.empty(1 << 18, dtype=torch.float32)
    wrong = torch.empty(999, dtype=torch.int64)
    got = transport.recv_multiple_tensors("obj-targets", meta, rayfabric.rdt.RayfabricCommunicatorMetadata(),
                                          [fits, wrong])
    assert got[0].data_ptr() == fits.data_ptr() and torch.equal(got[0], src[0])
    assert got[1].data_ptr() != wrong.data_ptr() and torch.equal(got[1], src[1])
    transport.garbage_collect("obj-targets", meta, src)
