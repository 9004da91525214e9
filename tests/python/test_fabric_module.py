"""rayfabric._fabric, the engine inside a Python process (what rayfabric.rdt drives), without Ray:
two engines of this process read each other's registered buffers over a real provider (tcp), and
every bad input is refused with a FabricError that says what was wrong."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python"))
from rayfabric._native import fabric  # noqa: E402

f = fabric()
MiB = 1 << 20


@pytest.fixture(scope="module")
def pair():
    a = f.open_all({"provider": "tcp", "max_registration": "1M"}, "")[0]
    b = f.open_all({"provider": "tcp"}, "")[0]
    return a, b, b.add_peer(a.address())


def buffers(n, seed=0):
    src = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return src, np.zeros_like(src)


def test_batched_read_across_registration_slices(pair):
    a, b, peer = pair
    src, dst = buffers(5 * MiB + 123)  # six 1 MiB slices at the source
    rs = a.register(src.ctypes.data, src.nbytes, True)
    rd = b.register(dst.ctypes.data, dst.nbytes, False)
    half = src.nbytes // 2 + 7  # not on a slice boundary
    t = b.read(peer, [(rd, 0, rs.describe(), 0, half), (rd, half, rs.describe(), half, src.nbytes - half)])
    t.wait(30)
    assert t.done() and t.quiesced() and t.bytes == src.nbytes
    assert np.array_equal(src, dst)
    before = a.stats()["regions_registered"]
    rs.release()
    assert not rs.registered and a.stats()["regions_registered"] == before - 6
    with pytest.raises(RuntimeError, match="released"):
        rs.describe()


def test_bad_inputs_are_refused_with_the_reason(pair):
    a, b, peer = pair
    src, dst = buffers(4096, seed=1)
    rs = a.register(src.ctypes.data, src.nbytes, True)
    rd = b.register(dst.ctypes.data, dst.nbytes, False)
    desc = rs.describe()
    cases = [
        ([(rd, 0, desc[:-3], 0, 10)], "INVALID_ARGUMENT", "truncated"),
        ([(rd, 0, desc + b"x", 0, 10)], "INVALID_ARGUMENT", "trailing"),
        ([(rd, 4000, desc, 0, 200)], "OUT_OF_RANGE", "do not fit the local region"),
        ([(rd, 0, desc, 4000, 200)], "OUT_OF_RANGE", ""),
        ([(rd, 0, desc, 0)], "INVALID_ARGUMENT", "expected"),
    ]
    for items, code, words in cases:
        with pytest.raises(f.FabricError) as e:
            b.read(peer, items)
        assert e.value.code == code, (items, str(e.value))
        assert words in str(e.value)
    with pytest.raises(f.FabricError) as e:
        b.add_peer(b"\x03\x00\x00\x00abc")
    assert e.value.code == "INVALID_ARGUMENT" and "truncated" in str(e.value)
    with pytest.raises(f.FabricError) as e:
        a.register(0, 10, True)
    assert "empty buffer" in str(e.value)
    with pytest.raises(f.FabricError) as e:
        f.open_all({"no_such_setting": "1"}, "")
    assert "no_such_setting" in str(e.value)
    released = b.register(dst.ctypes.data, 16, False)
    released.release()
    with pytest.raises(f.FabricError, match="released"):
        b.read(peer, [(released, 0, desc, 0, 16)])


def test_a_provider_of_another_kind_is_refused():
    tcp = f.open_all({"provider": "tcp"}, "")[0]
    sockets = f.open_all({"provider": "sockets"}, "")[0]
    with pytest.raises(f.FabricError) as e:
        tcp.add_peer(sockets.address())
    assert e.value.code == "INVALID_ARGUMENT" and "sockets" in str(e.value)


def test_read_only_registration_refused_where_the_provider_does_not_enforce_access():
    shm = f.open_all({"provider": "shm"}, "")[0]
    assert not shm.enforces_access
    src, _ = buffers(4096)
    with pytest.raises(f.FabricError) as e:
        shm.register(src.ctypes.data, src.nbytes, True)
    assert e.value.code == "PERMISSION_DENIED" and "RAYFABRIC_ALLOW_UNPROTECTED_MEMORY" in str(e.value)
    shm.register(src.ctypes.data, src.nbytes, False).release()  # a local destination is fine
    allowed = f.open_all({"provider": "shm", "allow_unprotected_memory": "true"}, "")[0]
    allowed.register(src.ctypes.data, src.nbytes, True).release()


def test_regions_belong_to_their_engine_and_waits_are_bounded(pair):
    a, b, peer = pair
    src, dst = buffers(1 << 16, seed=2)
    rs = a.register(src.ctypes.data, src.nbytes, True)
    foreign = a.register(dst.ctypes.data, dst.nbytes, False)  # registered with the source's engine
    with pytest.raises(f.FabricError, match="another engine"):
        b.read(peer, [(foreign, 0, rs.describe(), 0, 16)])
    rd = b.register(dst.ctypes.data, dst.nbytes, False)
    with pytest.raises(f.FabricError, match="nothing to read"):
        b.read(peer, [(rd, 0, rs.describe(), 0, 0)])
    t = b.read(peer, [(rd, 0, rs.describe(), 0, src.nbytes)])
    assert t.wait_quiesced() is True  # no limit: until it is done
    t.wait(1e12)  # clamped, not overflowed
    assert np.array_equal(src, dst)
    with pytest.raises(f.FabricError, match="NaN"):
        t.wait(float("nan"))


def test_shm_peers_whose_names_differ_in_length_read_each_other():
    # shm names carry an endpoint index (the engine names them "fi_shm://rayfabric-<pid namespace>-
    # <pid>-<salt>-<n>", then shm appends ":<uid>:<n>"): peers' addresses differ in length
    # (FI_ADDR_STR), unlike every fixed-size format.
    opts = {"provider": "shm", "allow_unprotected_memory": "true", "max_rails": "1"}
    engines = [f.open_all(opts, "")[0] for _ in range(11)]
    short, long_ = engines[0], engines[-1]
    assert len(short.address()) != len(long_.address())
    src, dst = buffers(1 << 20, seed=5)
    rs = long_.register(src.ctypes.data, src.nbytes, True)
    rd = short.register(dst.ctypes.data, dst.nbytes, False)
    short.read(short.add_peer(long_.address()), [(rd, 0, rs.describe(), 0, src.nbytes)]).wait(30)
    assert np.array_equal(src, dst)
    with pytest.raises(f.FabricError, match="not a shm address"):
        short.add_peer(long_.address()[:-6] + b"\x00ab:0\x00")  # a NUL inside the name


def test_device_memory_where_the_provider_offers_it_and_a_clear_error_where_not():
    # FI_HMEM is asked for only when device_memory is set: shm offers it (registering CUDA memory
    # then depends on libfabric's CUDA support, absent from Debian's build: a clear error), tcp
    # does not (refused before libfabric is asked, saying to stage through host memory).
    host = np.zeros(1 << 16, dtype=np.uint8)
    plain = f.open_all({"provider": "shm"}, "")[0]
    assert not plain.device_memory and plain.device_memory_note == "host memory only"
    shm = f.open_all({"provider": "shm", "allow_unprotected_memory": "true"}, "", True)[0]
    assert shm.device_memory and "FI_HMEM offered by shm" in shm.device_memory_note
    shm.register(host.ctypes.data, host.nbytes, True).release()  # host memory as before
    tcp = f.open_all({"provider": "tcp"}, "", True)[0]
    assert not tcp.device_memory and "offers no FI_HMEM" in tcp.device_memory_note
    with pytest.raises(f.FabricError) as e:
        tcp.register(host.ctypes.data, host.nbytes, False, 0)
    assert e.value.code == "INVALID_ARGUMENT" and "stage the buffer through host memory" in str(e.value)
    try:
        shm.register(host.ctypes.data, host.nbytes, False, 0).release()
    except f.FabricError as e:  # no CUDA in this libfabric (or no GPU): said, with what to do
        assert "CUDA device 0 memory" in str(e) and "rayfabric doctor" in str(e), e
    else:  # a libfabric with CUDA accepted a host pointer as device memory: not expected here
        pytest.fail("a host buffer was registered as CUDA memory")
