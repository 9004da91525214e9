"""rayfabric.rdt's bookkeeping for CUDA tensors, on a machine without a GPU. A CUDA tensor cannot
exist here, so CUDA tensors and the fabric engines are stood in for by fakes, only to drive the
transport's choices: which buffer each engine registers (device memory where the engine has
FI_HMEM, a pinned copy elsewhere), what a retried extract keeps, when device memory is given up and
when an error is raised instead, what a failed receive releases. The bytes themselves are checked
for real by tests/gpu/device-check.sh on a GPU machine and by tests/rdt on real Ray clusters."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
pytest.importorskip("ray.experimental.rdt.tensor_transport_manager")
from rayfabric import rdt  # noqa: E402
from rayfabric._native import fabric  # noqa: E402

FabricError = fabric().FabricError


class Region:
    def __init__(self, engine, ptr, device):
        self.engine, self.ptr, self.device, self.released = engine, ptr, device, False
        engine.live.append(self)

    def release(self):
        if not self.released:
            self.released = True
            self.engine.live.remove(self)

    def describe(self):
        return b"%s:%d" % (self.engine.provider.encode(), self.ptr)


class Engine:
    """A fabric engine as rdt.py sees it; `fail_device` makes device registrations fail with that
    FabricError code (as a libfabric without CUDA does: NOT_FOUND)."""

    def __init__(self, provider, device_memory, fail_device=None, fail_read=False):
        self.provider, self.device_memory = provider, device_memory
        self.device_memory_note = "FI_HMEM offered" if device_memory else "host memory only"
        self.fail_device, self.fail_read = fail_device, fail_read
        self.live, self.calls = [], []

    def register(self, ptr, n, remote_read, cuda_device=-1):
        self.calls.append((ptr, n, remote_read, cuda_device))
        if cuda_device >= 0 and self.fail_device:
            error = FabricError(f"{self.fail_device}: fi_mr_regattr of CUDA device 0 memory failed")
            error.code = self.fail_device
            raise error
        return Region(self, ptr, cuda_device)

    def address(self):
        return self.provider.encode()

    def add_peer(self, address):
        return 7

    def read(self, peer, items):
        if self.fail_read:
            error = FabricError("UNAVAILABLE: the peer is gone")
            error.code = "UNAVAILABLE"
            raise error
        raise AssertionError("not reached in these tests")

    def stats(self):
        return {"regions_registered": len(self.live)}


class FakeCuda:
    """A CPU tensor that says it lives on CUDA device 0."""

    def __init__(self, t):
        self.t = t
        self.device = torch.device("cuda", 0)

    def __getattr__(self, name):
        return getattr(self.t, name)


@pytest.fixture
def no_gpu_needed(monkeypatch):
    empty = torch.empty

    def fake_empty(*args, pin_memory=False, device=None, **kwargs):
        t = empty(*args, **kwargs)
        return FakeCuda(t) if device == "cuda" else t

    monkeypatch.setattr(torch, "empty", fake_empty)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def transport(*engines, role="serve"):
    t = rdt.RayfabricTensorTransport()
    t._engines[role] = list(engines)
    return t


def tensor(n=1024, seed=0):
    return FakeCuda(torch.arange(seed, seed + n, dtype=torch.float32))


def test_a_retried_extract_of_a_staged_tensor_keeps_the_registration_it_describes(no_gpu_needed):
    tcp = Engine("tcp", device_memory=False)
    tr = transport(tcp)
    tr.extract_tensor_transport_metadata("obj", [tensor()])
    meta = tr.extract_tensor_transport_metadata("obj", [tensor()])  # Ray retries the task
    assert len(tcp.live) == 1 and meta.ranges[0][0] == tcp.live[0].describe()
    assert len(tr._registrations) == 1 and next(iter(tr._registrations.values())).count == 1
    tr.garbage_collect("obj", meta, [])
    assert tcp.live == [] and tr._registrations == {}


def test_device_memory_on_the_engines_that_offer_it_a_copy_on_the_others(no_gpu_needed):
    verbs, tcp = Engine("verbs;ofi_rxm", device_memory=True), Engine("tcp", device_memory=False)
    tr = transport(verbs, tcp)
    t = tensor()
    meta = tr.extract_tensor_transport_metadata("obj", [t])
    (v,), (c,) = verbs.live, tcp.live
    assert (v.ptr, v.device) == (t.data_ptr(), 0)             # the tensor itself, as CUDA memory
    assert c.ptr != t.data_ptr() and c.device == -1            # a host copy on tcp
    assert meta.ranges == [[v.describe()], [c.describe()]]
    assert tr.stats()["bytes_sent_staged"] == t.numel() * 4 and tr.stats()["device_memory_failed"] is None


def test_where_every_engine_has_device_memory_one_registration_serves_every_object(no_gpu_needed):
    verbs = Engine("verbs;ofi_rxm", device_memory=True)
    tr = transport(verbs)
    t = tensor()
    m1 = tr.extract_tensor_transport_metadata("a", [t])
    m2 = tr.extract_tensor_transport_metadata("b", [t])
    assert len(verbs.live) == 1 and verbs.live[0].device == 0 and m1.ranges == m2.ranges
    assert tr.stats()["bytes_sent_from_device"] == 2 * t.numel() * 4 and tr.stats()["bytes_sent_staged"] == 0
    tr.garbage_collect("a", m1, [])
    assert len(verbs.live) == 1
    tr.garbage_collect("b", m2, [])
    assert verbs.live == []


def test_a_libfabric_without_cuda_is_given_up_once_and_staged(no_gpu_needed):
    shm = Engine("shm", device_memory=True, fail_device="NOT_FOUND")
    tr = transport(shm)
    meta = tr.extract_tensor_transport_metadata("obj", [tensor()])
    (region,) = shm.live
    assert region.device == -1 and meta.ranges == [[region.describe()]]
    assert "fi_mr_regattr" in tr.stats()["device_memory_failed"]
    tr.extract_tensor_transport_metadata("next", [tensor(seed=5)])
    assert sum(1 for call in shm.calls if call[3] >= 0) == 1  # not asked again


@pytest.mark.parametrize("code", ["RESOURCE_EXHAUSTED", "PERMISSION_DENIED"])
def test_other_registration_failures_are_raised_not_turned_into_staging(no_gpu_needed, code):
    verbs = Engine("verbs;ofi_rxm", device_memory=True, fail_device=code)
    tr = transport(verbs)
    with pytest.raises(FabricError) as e:
        tr.extract_tensor_transport_metadata("obj", [tensor()])
    assert e.value.code == code and tr.stats()["device_memory_failed"] is None
    assert verbs.live == [] and tr._registrations == {} and tr._objects == {}


def test_a_receive_that_fails_before_any_read_releases_what_it_registered(no_gpu_needed):
    source = transport(Engine("verbs;ofi_rxm", device_memory=True))
    meta = source.extract_tensor_transport_metadata("obj", [tensor(), tensor(64, seed=3)])
    verbs = Engine("verbs;ofi_rxm", device_memory=True, fail_read=True)
    receiver = transport(verbs, role="read")
    with pytest.raises(FabricError, match="the peer is gone"):
        receiver.fetch_multiple_tensors("obj", meta, rdt.RayfabricCommunicatorMetadata())
    assert [call[3] for call in verbs.calls] == [0, 0]  # both straight into device memory
    assert verbs.live == []
    assert receiver.stats()["bytes_received_into_device"] == 0  # counted once reads are posted
