"""rayfabric as a Ray Direct Transport (RDT) backend: torch tensors returned by actor methods move
between actors by one-sided fi_read, with the engine running inside each actor's own process
(rayfabric._fabric), since tensors live in the actor's heap, not in plasma.

    import rayfabric.rdt
    rayfabric.rdt.enable()              # before the actor classes are defined

    @ray.remote(enable_tensor_transport=True)
    class Trainer:
        @ray.method(tensor_transport="RAYFABRIC")
        def weights(self): return {"w": torch.randn(4096, 4096)}

The source registers each tensor for remote read only (a registration of its own, released when
Ray garbage-collects the object, or when the last object holding the same buffer is collected);
the receiver allocates the destination tensors, registers them for its own reads and fi_reads them
over the best provider both processes have. The descriptors travel inside Ray's RDT metadata, i.e.
through the owner like any task result: whoever can read Ray's control plane can read the
registered tensors while they are registered (never write them: see docs/rdt.md)."""
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import ray

try:
    from ray.experimental.rdt.tensor_transport_manager import (
        CommunicatorMetadata,
        FetchRequest,
        TensorTransportManager,
        TensorTransportMetadata,
    )
except ImportError as e:  # Ray Direct Transport as used here: Ray 2.56.0 and later
    raise ImportError(f"rayfabric.rdt needs Ray 2.56.0 or later (Ray Direct Transport with "
                      f"fetch_multiple_tensors); this is Ray {ray.__version__}: {e}") from e

logger = logging.getLogger(__name__)

NAME = "RAYFABRIC"
# Destination tensors of one object share one allocation; each starts at a multiple of this.
_ALIGN = 64
# An abort that finds no read in flight fails a receive of that object starting within this time.
_ABORT_MEMORY_S = 10.0


@dataclass
class RayfabricTransportMetadata(TensorTransportMetadata):
    """What the receiver needs: the source's fabrics (provider, serialized address), best first,
    and per fabric one serialized remote range per tensor (b"" for an empty tensor)."""

    fabrics: Optional[List[Tuple[str, bytes]]] = None
    ranges: Optional[List[List[bytes]]] = None
    nbytes: Optional[List[int]] = None

    __eq__ = object.__eq__
    __hash__ = object.__hash__


@dataclass
class RayfabricCommunicatorMetadata(CommunicatorMetadata):
    """A one-sided read needs nothing from the owner."""


@dataclass
class RayfabricFetchRequest(FetchRequest):
    """A receive in flight: its transfer, and what must stay alive while any read may still land
    (the destination allocation and registrations). finish() releases them once the reads are over;
    a request dropped unfinished (Ray's timeout) cancels its reads and leaves that memory with the
    transport until they have drained."""

    transport: Any = None
    transfer: Any = None
    engine: Any = None
    nbytes: int = 0
    parts: int = 0
    held: Any = None
    copies: Any = None
    finished: bool = False

    def finish(self):
        if self.finished or self.transport is None:
            return
        self.finished = True
        self.transport._settle(self.obj_id, self.transfer, (self.held, self.tensors))
        slab, slab_region, regions = self.held
        if self.transfer is None or self.transfer.quiesced():
            for region in regions:
                region.release()
            if slab_region is not None:
                slab_region.release()

    def __del__(self):
        if not self.finished and self.transfer is not None:
            try:
                self.transfer.cancel("the receive was given up (ray.get timed out or was dropped)")
                self.finish()
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass


class _Registration:
    """One source buffer registered on every fabric of this process, shared by every object that
    holds it (count), released when the last of them is collected."""

    def __init__(self, tensor, regions):
        self.tensor = tensor  # the buffer(s) peers may read: kept alive while registered
        self.regions = regions
        self.count = 0


class RayfabricTensorTransport(TensorTransportManager):
    def __init__(self):
        self._lock = threading.RLock()
        self._engines = {}  # role ("serve", "read") -> engines, one per provider, best first
        self._peers: Dict[Tuple[int, bytes], int] = {}
        self._registrations: Dict[Tuple[int, int], _Registration] = {}
        self._objects: Dict[str, List[Tuple[int, int]]] = {}  # obj_id -> registration keys
        self._inflight: Dict[str, Any] = {}  # obj_id -> transfer being received
        self._aborted: Dict[str, float] = {}  # obj_id -> when Ray aborted it before its read began
        # Destinations of reads that failed without draining: kept so late bytes land in memory
        # nobody else uses (never handed to the user).
        self._undrained = []
        self._actors_with_transport = set()  # actor ids (hex) whose engines opened
        # CUDA buffers registered as they are (FI_HMEM) where the engine offers it, until a
        # registration fails (a libfabric without CUDA): then staged through pinned host memory.
        self._device_memory_failed = None  # why direct registration of device memory was given up
        self._bytes = {"sent_from_device": 0, "sent_staged": 0, "received_into_device": 0,
                       "received_staged": 0}

    # ------------------------------------------------------------------ the engines

    def engines(self, role="serve"):
        """This process's fabrics, opened once per role: the agent's selection (RAYFABRIC_*
        settings), one engine per provider, its first domain (max_rails=1: no striping of tensors
        yet). Serving (registrations peers read) and reading use separate engines: a read that
        fails without draining resets its engine's endpoint, which changes its address, and the
        addresses already handed out in RDT metadata must stay valid."""
        with self._lock:
            if role not in self._engines:
                from rayfabric._native import fabric
                from rayfabric.launch_env import agent_fabric_env

                # As for the agents: libfabric's verbs/efa MR cache would widen a read-only
                # registration to remote write; it is turned off unless the user set it (before
                # libfabric first reads its environment in this process).
                for name, value in agent_fabric_env(os.environ).items():
                    os.environ.setdefault(name, value)
                module = fabric()
                try:
                    ip = ray.util.get_node_ip_address()
                except Exception:  # noqa: BLE001 - outside a Ray process
                    ip = ""
                engines, seen = [], set()
                for engine in module.open_all({"max_rails": "1"}, ip, True):
                    if engine.provider not in seen:
                        seen.add(engine.provider)
                        engines.append(engine)
                self._engines[role] = engines
                logger.info("rayfabric RDT %s engines: %s", role,
                            ", ".join(f"{e.provider}/{e.domain} (device memory: {e.device_memory_note})"
                                      for e in engines))
            return self._engines[role]

    def stats(self):
        """Per provider: the engine's counters, and this transport's live registrations."""
        with self._lock:
            out = {}
            for role, engines in self._engines.items():
                for e in engines:
                    out[f"{role} {e.provider}"] = e.stats()
            out["registered_buffers"] = len(self._registrations)
            out["objects"] = len(self._objects)
            for role, engines in self._engines.items():
                for e in engines:
                    out[f"device_memory {role} {e.provider}"] = e.device_memory_note
            out["device_memory_failed"] = self._device_memory_failed
            out.update({f"bytes_{k}": v for k, v in self._bytes.items()})
            return out

    def _device_memory_ok(self, engine) -> bool:
        """Whether CUDA buffers are registered directly with `engine` (it has FI_HMEM, and device
        memory was not given up in this process)."""
        return engine.device_memory and self._device_memory_failed is None

    def _give_up_device_memory(self, error):
        if self._device_memory_failed is None:
            logger.warning("rayfabric RDT: registering CUDA memory failed (%s); CUDA tensors are "
                           "staged through pinned host memory from now on in this process", error)
        self._device_memory_failed = str(error)

    # ------------------------------------------------------------------ the interface

    def tensor_transport_backend(self) -> str:
        return NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor) -> bool:
        def __rayfabric_available__(self_actor) -> bool:
            from ray.experimental.rdt.util import get_tensor_transport_manager

            try:
                return bool(get_tensor_transport_manager(NAME).engines())
            except Exception:  # noqa: BLE001 - not importable or no provider: say no
                logger.warning("rayfabric RDT transport unavailable in this actor", exc_info=True)
                return False

        # Ray asks before every call of a RAYFABRIC method; an actor whose engines opened keeps
        # them for its life, so one round trip per actor is enough.
        actor_id = actor._ray_actor_id.hex()
        if actor_id in self._actors_with_transport:
            return True
        ok = ray.get(actor.__ray_call__.options(concurrency_group="_ray_system").remote(
            __rayfabric_available__))
        if ok:
            with self._lock:
                self._actors_with_transport.add(actor_id)
        return ok

    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: List[Any]) -> RayfabricTransportMetadata:
        import torch

        tensor_meta, nbytes, keys = [], [], []
        device = None
        for t in rdt_object:
            if t.device.type not in ("cpu", "cuda"):
                raise ValueError(f"the RAYFABRIC tensor transport moves cpu and cuda tensors; got one on {t.device}")
            if device is not None and t.device.type != device.type:
                raise ValueError("all tensors of one RDT object must be on the same device type "
                                 f"(got {device.type} and {t.device.type})")
            if not t.is_contiguous():
                raise ValueError("the RAYFABRIC tensor transport needs contiguous tensors: call .contiguous() "
                                 "on the tensor before returning it")
            device = t.device
            tensor_meta.append((t.shape, t.dtype))
            nbytes.append(t.numel() * t.element_size())
        # Lazy conj/neg bits: the stored bytes are not the values; resolved (by kernels, on a GPU)
        # before the synchronization below, so that what peers read is final.
        resolved = [t.resolve_conj().resolve_neg() if t.is_conj() or t.is_neg() else t for t in rdt_object]
        if device is not None and device.type == "cuda":
            # The kernels that produced the tensors must be done before peers read or we stage them.
            for d in {t.device for t in resolved}:
                torch.cuda.synchronize(d)
        with self._lock:
            engines = self.engines() if rdt_object else []
            ranges = [[] for _ in engines]
            try:
                for i, (t, n) in enumerate(zip(resolved, nbytes)):
                    if n == 0:
                        for per_fabric in ranges:
                            per_fabric.append(b"")
                        continue
                    if t.device.type == "cuda":
                        key, reg = self._register_cuda_source(t, n, engines)
                    else:
                        key = ("cpu", t.data_ptr(), n)
                        reg = self._registrations.get(key)
                        if reg is None:
                            reg = self._register_source([t] * len(engines), n, engines)
                            self._registrations[key] = reg
                    reg.count += 1
                    keys.append(key)
                    for per_fabric, region in zip(ranges, reg.regions):
                        per_fabric.append(region.describe())
            except BaseException:
                self._release(keys)
                raise
            # A retried task extracts the same object again: the earlier registrations go.
            self._release(self._objects.pop(obj_id, []))
            self._objects[obj_id] = keys
            fabrics = [(e.provider, e.address()) for e in engines]
        return RayfabricTransportMetadata(tensor_meta=tensor_meta, tensor_device=device.type if device else None,
                                          fabrics=fabrics, ranges=ranges, nbytes=nbytes)

    def get_communicator_metadata(self, src_actor, dst_actor, backend: Optional[str] = None):
        return RayfabricCommunicatorMetadata()

    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata, communicator_metadata,
                              target_buffers: Optional[List[Any]] = None) -> List[Any]:
        request = self.fetch_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata,
                                              target_buffers)
        return self.wait_fetch_complete(request)

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata, communicator_metadata,
                               target_buffers: Optional[List[Any]] = None) -> "RayfabricFetchRequest":
        """Posts every read and returns at once; wait_fetch_complete waits (with Ray's timeout)."""
        import torch

        meta = tensor_transport_metadata
        assert isinstance(meta, RayfabricTransportMetadata), type(meta)
        if not meta.tensor_meta:
            return RayfabricFetchRequest(obj_id=obj_id, tensors=[])
        engine, index = self._shared_engine(meta, self.engines("read"))
        peer = self._peer(engine, meta.fabrics[index][1])
        to_cuda = meta.tensor_device == "cuda"
        # Where each tensor lands: a CPU target buffer that fits exactly is read into directly, and
        # so is a GPU tensor where the engine registers device memory (FI_HMEM); everything else
        # is read into one allocation (the slab: pinned when some of it is then copied to a GPU),
        # of which CPU results are views and GPU results copies. The slab holds only what needs it.
        targets = []
        for i, (shape, dtype) in enumerate(meta.tensor_meta):
            target = target_buffers[i] if target_buffers and i < len(target_buffers) else None
            if target is not None and (not target.is_contiguous() or target.dtype != dtype
                                       or tuple(target.shape) != tuple(shape)):
                target = None  # does not fit: a fresh tensor instead, as Ray allows
            targets.append(target)
        direct = [t is not None and t.device.type == "cpu" and n > 0 for t, n in zip(targets, meta.nbytes)]
        to_gpu = [not d and n > 0 and (t.device.type == "cuda" if t is not None else to_cuda)
                  for t, n, d in zip(targets, meta.nbytes, direct)]
        # FI_HMEM: tensors bound for a GPU are read straight into device memory.
        on_device = self._device_destinations(engine, meta, targets, to_gpu)
        for i, (out, region) in on_device.items():
            direct[i], to_gpu[i] = True, False
        offsets, total = [], 0
        for n, d in zip(meta.nbytes, direct):
            offsets.append(total)
            if not d:
                total += (n + _ALIGN - 1) // _ALIGN * _ALIGN
        slab_region, regions = None, []
        try:
            pinned = torch.cuda.is_available() and any(to_gpu)
            slab = torch.empty(total, dtype=torch.uint8, pin_memory=pinned) if total else None
            slab_region = engine.register(slab.data_ptr(), total, False) if total else None
            tensors, items, copies = [], [], []
            for i, ((shape, dtype), n) in enumerate(zip(meta.tensor_meta, meta.nbytes)):
                target = targets[i]
                if i in on_device:
                    out, region = on_device[i]
                    regions.append(region)
                    tensors.append(out)
                    items.append((region, 0, meta.ranges[index][i], 0, n))
                    continue
                if direct[i]:
                    region = engine.register(target.data_ptr(), n, False)
                    regions.append(region)
                    tensors.append(target)
                    items.append((region, 0, meta.ranges[index][i], 0, n))
                    continue
                view = slab[offsets[i]:offsets[i] + n].view(dtype).reshape(shape) if n else None
                if n:
                    items.append((slab_region, offsets[i], meta.ranges[index][i], 0, n))
                if target is not None:
                    copies.append((target, view))
                    tensors.append(target)
                elif to_cuda:
                    out = torch.empty(shape, dtype=dtype, device="cuda")
                    copies.append((out, view))
                    tensors.append(out)
                else:
                    tensors.append(view if n else torch.empty(shape, dtype=dtype))
            with self._lock:
                aborted_at = self._aborted.pop(obj_id, None)
                if aborted_at is not None and time.monotonic() - aborted_at < _ABORT_MEMORY_S:
                    raise RuntimeError(f"rayfabric: the transfer of {obj_id} was aborted")
                transfer = engine.read(peer, items) if items else None
                if transfer is not None:
                    self._inflight[obj_id] = transfer
        except BaseException:
            # Nothing was posted: the registrations made for this receive go now, not with the
            # exception's traceback (Ray may keep it).
            for region in regions + [r for _, r in on_device.values() if r not in regions]:
                region.release()
            if slab_region is not None:
                slab_region.release()
            raise
        with self._lock:  # reads posted: how the bytes of GPU-bound tensors go
            self._bytes["received_into_device"] += sum(meta.nbytes[i] for i in on_device)
            self._bytes["received_staged"] += sum(n for n, g in zip(meta.nbytes, to_gpu) if g)
        return RayfabricFetchRequest(obj_id=obj_id, tensors=tensors, transport=self, transfer=transfer,
                                     engine=engine, nbytes=sum(meta.nbytes), parts=len(items),
                                     held=(slab, slab_region, regions), copies=copies)

    def wait_fetch_complete(self, fetch_request, timeout: float = -1) -> List[Any]:
        """The tensors once every byte arrived. TimeoutError when `timeout` (s; -1: none) passes
        first (the reads go on; dropping the request cancels them); RuntimeError when a read
        failed (only once drained: nothing lands later in memory handed out)."""
        import torch

        req = fetch_request
        assert isinstance(req, RayfabricFetchRequest), type(req)
        if req.transfer is None or req.finished:
            return req.tensors
        try:
            req.transfer.wait(None if timeout is None or timeout < 0 else timeout)
        except TimeoutError:
            raise TimeoutError(f"rayfabric: reading {req.obj_id} not done within {timeout} s") from None
        except Exception as e:
            req.finish()
            raise RuntimeError(f"rayfabric: reading {req.obj_id} ({req.nbytes} bytes in {req.parts} tensors) "
                               f"from {req.engine.provider} peer failed: {e}") from e
        req.finish()
        for out, view in req.copies:
            if view is not None:
                out.copy_(view, non_blocking=True)
        for device in {out.device for out, _ in req.copies if out.device.type == "cuda"}:
            torch.cuda.synchronize(device)
        return req.tensors

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("RAYFABRIC is one-sided: the receiver reads, the source never sends")

    def garbage_collect(self, obj_id: str, tensor_transport_meta, tensors):
        with self._lock:
            self._release(self._objects.pop(obj_id, []))

    def abort_transport(self, obj_id: str, communicator_metadata):
        with self._lock:
            transfer = self._inflight.get(obj_id)
            if transfer is None:
                # Not started yet (or over): a receive that begins soon after fails at once.
                self._aborted[obj_id] = time.monotonic()
                return
        transfer.cancel("aborted by Ray (abort_transport)")

    # ------------------------------------------------------------------ helpers

    def _settle(self, obj_id, transfer, held):
        """A receive is over (done, failed or given up): no longer abortable; if reads may still
        land (not drained), what they write stays referenced here."""
        with self._lock:
            if self._inflight.get(obj_id) is transfer:
                self._inflight.pop(obj_id, None)
            self._undrained = [u for u in self._undrained if not u[0].quiesced()]
            if transfer is not None and not transfer.quiesced():
                self._undrained.append((transfer, held))

    @staticmethod
    def _register_source(buffers, n, engines, devices=None):
        """buffers[k] registered for remote read on engines[k] (all or none); devices[k]: the CUDA
        ordinal of a device buffer, -1 for host memory."""
        regions = []
        try:
            for k, e in enumerate(engines):
                regions.append(e.register(buffers[k].data_ptr(), n, True, devices[k] if devices else -1))
        except BaseException:
            for region in regions:
                region.release()
            raise
        return _Registration(buffers, regions)

    _staged_serial = 0

    def _register_cuda_source(self, t, n, engines):
        """(key, registration) of a CUDA tensor: the device memory itself on the engines that register
        device memory (FI_HMEM), a pinned host copy taken now on the others (tcp, sockets; all of
        them once device memory failed here). A registration holding a copy belongs to this extract
        alone (a fresh key each time: a retried extract never releases its own); one of device
        memory only is shared by every object holding the buffer."""
        import torch

        direct = [self._device_memory_ok(e) for e in engines]
        if all(direct):
            key = ("cuda", t.data_ptr(), n)
            if key in self._registrations:
                self._bytes["sent_from_device"] += n
                return key, self._registrations[key]
        while True:
            staged = None
            buffers = []
            for d in direct:
                if not d and staged is None:
                    staged = torch.empty(n, dtype=torch.uint8, pin_memory=True)
                    staged.copy_(t.reshape(-1).view(torch.uint8))
                buffers.append(t if d else staged)
            devices = [t.device.index if d else -1 for d in direct]
            try:
                reg = self._register_source(buffers, n, engines, devices)
                break
            except Exception as e:  # noqa: BLE001
                if not any(direct) or not self._device_memory_unsupported(e):
                    raise
                self._give_up_device_memory(e)  # then stage on every engine
                direct = [False] * len(engines)
        if staged is None:
            key = ("cuda", t.data_ptr(), n)
        else:
            RayfabricTensorTransport._staged_serial += 1
            key = ("staged", RayfabricTensorTransport._staged_serial)
        self._registrations[key] = reg
        self._bytes["sent_from_device" if staged is None else "sent_staged"] += n
        return key, reg

    @staticmethod
    def _device_memory_unsupported(error) -> bool:
        """A registration of device memory this libfabric or engine cannot do at all (then staging
        is the answer); other failures (memlock, out of memory, access refused) are raised."""
        return getattr(error, "code", None) in ("NOT_FOUND", "INVALID_ARGUMENT", "FABRIC_ERROR")

    def _release(self, keys):
        for key in keys:
            reg = self._registrations.get(key)
            if reg is None:
                continue
            reg.count -= 1
            if reg.count == 0:
                for region in reg.regions:
                    region.release()
                del self._registrations[key]

    def _device_destinations(self, engine, meta, targets, to_gpu):
        """{tensor index: (cuda tensor, its registration)} for the tensors bound for a GPU, when
        `engine` registers device memory (empty otherwise, or if a registration fails: then they
        are staged, and so are later ones)."""
        import torch

        wanted = [i for i, g in enumerate(to_gpu) if g]
        if not wanted or not self._device_memory_ok(engine):
            return {}
        out = {}
        try:
            for i in wanted:
                shape, dtype = meta.tensor_meta[i]
                t = targets[i] if targets[i] is not None else torch.empty(shape, dtype=dtype, device="cuda")
                out[i] = (t, engine.register(t.data_ptr(), meta.nbytes[i], False, t.device.index))
            # The fabric writes outside CUDA's stream order: kernels still queued on memory the
            # caching allocator handed back (or on a target buffer) must be done first.
            for d in {t.device for t, _ in out.values()}:
                torch.cuda.synchronize(d)
        except BaseException as e:
            for _, region in out.values():
                region.release()
            if not self._device_memory_unsupported(e):
                raise
            self._give_up_device_memory(e)  # stage these and later ones
            return {}
        return out

    def _shared_engine(self, meta, engines):
        theirs = [provider for provider, _ in meta.fabrics or []]
        for engine in engines:
            if engine.provider in theirs:
                return engine, theirs.index(engine.provider)
        raise RuntimeError(f"rayfabric: no fabric provider in common: this actor has "
                           f"[{', '.join(e.provider for e in engines)}], the source has [{', '.join(theirs)}]; "
                           f"give both actors a provider they share (RAYFABRIC_PROVIDER in their runtime_env), "
                           f"or use another tensor transport")

    def _peer(self, engine, address: bytes) -> int:
        key = (id(engine), address)
        with self._lock:
            if key not in self._peers:
                self._peers[key] = engine.add_peer(address)
            return self._peers[key]


def enable():
    """Registers the transport with Ray as "RAYFABRIC" (in the driver, before creating the actors
    that use it). Calling it again is harmless."""
    import torch
    from ray.experimental.rdt import util

    if NAME in util.transport_manager_info:
        return
    util.register_tensor_transport(NAME, ["cpu", "cuda"], RayfabricTensorTransport, torch.Tensor)


def transport_stats() -> Dict[str, Any]:
    """This process's RAYFABRIC counters (call inside an actor, e.g. through __ray_call__)."""
    from ray.experimental.rdt.util import get_tensor_transport_manager

    return get_tensor_transport_manager(NAME).stats()
