"""gRPC client of one rayfabricd (proto/rayfabric/v1/agent.proto), over generic unary calls: the
messages come from agent_pb2 (checked in, generated from the proto); no grpc codegen needed.

Channels are made the way Ray makes its own (ray._private.grpc_utils.init_grpc_channel): TLS when
RAY_USE_TLS is set, the cluster's token on every call when RAY_AUTH_MODE=token. `address` is
host:port (another node's agent) or unix:PATH (this node's agent). Each method belongs to the
service of its audience (agent.proto): Peer on both, Local (Pull, ReportFallbacks) on the Unix socket
only.

PullSocketClient asks this node's agent for pulls over its pull socket instead (plain framed
protobuf on a Unix socket, src/agent/pull_socket.h): the same request and reply, without gRPC's
~0.5 ms per call."""
import collections
import os
import socket
import struct
import threading
import time
import weakref

import grpc

from rayfabric import agent_pb2 as pb

PROTOCOL = pb.PROTOCOL_V3
# Each method's service (its full gRPC path is /rayfabric.v1.SERVICE/METHOD).
SERVICE_OF = {"Info": "Peer", "LeaseObjects": "Peer", "ReleaseLeases": "Peer", "GetStatus": "Peer",
              "Pull": "Local", "ReportFallbacks": "Local"}
_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]


def make_channel(address, insecure=False):
    """A channel with the Ray cluster's credentials (insecure=True: none, for tests that play a
    peer without them)."""
    if insecure:
        return grpc.insecure_channel(address, options=_OPTIONS)
    try:
        from ray._private.grpc_utils import init_grpc_channel  # Ray >= 2.52
    except ImportError:
        try:
            from ray._private.utils import init_grpc_channel  # Ray 2.49-2.51: TLS, no tokens yet
        except ImportError:
            return grpc.insecure_channel(address, options=_OPTIONS)
    options = list(_OPTIONS)
    if address.startswith("unix:"):
        # With TLS, a Unix socket has no host name to check the certificate against: the node's
        # own agent is checked as "localhost" (Ray's certificates name it).
        options.append(("grpc.ssl_target_name_override", "localhost"))
    return init_grpc_channel(address, options=options)


def cluster_authorization():
    """'Bearer <token>' when this (Ray) process uses the cluster's token authentication, else ''
    (what Ray's own channels send as `authorization`)."""
    try:
        from ray._private.authentication import authentication_utils
        from ray._raylet import AuthenticationTokenLoader
    except ImportError:  # a Ray without token authentication
        return ""
    if not authentication_utils.is_token_auth_enabled():
        return ""
    header = AuthenticationTokenLoader.instance().get_token_for_http_header()
    value = header.get("authorization") or header.get("Authorization") or ""
    return value if value.startswith("Bearer ") else ""


def method_path(method, service=None):
    """/rayfabric.v1.Peer/Info: the gRPC path of `method` (`service`: another one's, e.g. "Agent",
    protocol V2's, for tests that play an old caller)."""
    return f"/rayfabric.v1.{service or SERVICE_OF[method]}/{method}"


def counters(reply):
    """A StatusReply's counters and gauges as {name: value} (src/agent/counters.cc names them); a
    name the agent does not send (an older or newer one) reads as 0."""
    return collections.defaultdict(int, {c.name: c.value for c in reply.counters})


def exposure_name(value):
    """EXPOSURE_OBJECT -> "object" (what `rayfabric status` prints)."""
    return pb.Exposure.Name(value).replace("EXPOSURE_", "").lower()


def error_name(code):
    """ERROR_CODE_NOT_FOUND -> "NotFound" style names for logs and stats."""
    name = pb.ErrorCode.Name(code).replace("ERROR_CODE_", "")
    return "".join(part.capitalize() for part in name.split("_"))


def pull_request(items, timeout_s, answer_when_claimed=False, answer_within_s=None):
    """The PullRequest of AgentClient.pull / PullSocketClient.pull, and the caller's deadline."""
    req = pb.PullRequest(protocol_version=PROTOCOL, items=items, timeout_ms=int(timeout_s * 1000),
                         answer_when_claimed=answer_when_claimed)
    rpc_timeout = timeout_s + 10
    if answer_when_claimed and answer_within_s is not None:
        rpc_timeout = answer_within_s
    return req, rpc_timeout


class AgentClient:
    def __init__(self, address, channel=None):
        self.address = address
        self._channel = channel if channel is not None else make_channel(address)

        def call(name, req, rep):
            return self._channel.unary_unary(method_path(name),
                                             request_serializer=req.SerializeToString,
                                             response_deserializer=rep.FromString)
        self._info = call("Info", pb.InfoRequest, pb.InfoReply)
        self._lease = call("LeaseObjects", pb.LeaseRequest, pb.LeaseReply)
        self._release = call("ReleaseLeases", pb.ReleaseRequest, pb.ReleaseReply)
        self._pull = call("Pull", pb.PullRequest, pb.PullReply)
        self._status = call("GetStatus", pb.StatusRequest, pb.StatusReply)
        self._report_fallbacks = call("ReportFallbacks", pb.ReportFallbacksRequest, pb.ReportFallbacksReply)

    def info(self, timeout=10):
        return self._info(pb.InfoRequest(protocol_version=PROTOCOL), timeout=timeout)

    def lease(self, object_ids, ttl_ms=0, timeout=10, protocol_version=PROTOCOL, reader_providers=()):
        """reader_providers: the providers the reader speaks (empty: the source's best fabric)."""
        return self._lease(pb.LeaseRequest(protocol_version=protocol_version, object_ids=object_ids,
                                           ttl_ms=ttl_ms, requester="python",
                                           reader_providers=list(reader_providers)), timeout=timeout)

    def release(self, leases, timeout=10):
        """leases: iterable of (lease_id, token)."""
        refs = [pb.LeaseRef(lease_id=i, token=t) for i, t in leases]
        return self._release(pb.ReleaseRequest(protocol_version=PROTOCOL, leases=refs), timeout=timeout)

    def pull(self, items, timeout_s, answer_when_claimed=False, answer_within_s=None):
        """items: list of pb.PullItem. The agent bounds its own work by timeout_s; the RPC gets a
        few seconds more so that its answer (with per-object errors) arrives. answer_when_claimed:
        the answer comes once every object is claimed (CLAIMED), the reads go on; answer_within_s
        bounds that answer (what is not claimed by then is reported TIMED_OUT, and goes on)."""
        req, rpc_timeout = pull_request(items, timeout_s, answer_when_claimed, answer_within_s)
        return self._pull(req, timeout=rpc_timeout)

    def status(self, timeout=10):
        return self._status(pb.StatusRequest(protocol_version=PROTOCOL), timeout=timeout)

    def counters(self, timeout=10):
        """The agent's counters and gauges now, by name."""
        return counters(self.status(timeout=timeout))

    def report_fallbacks(self, counts, timeout=2, protocol_version=PROTOCOL):
        """counts: iterable of (reason, objects) this process left to Ray's path (local socket only)."""
        req = pb.ReportFallbacksRequest(protocol_version=protocol_version,
                                        fallbacks=[pb.FallbackCount(reason=r, objects=n) for r, n in counts])
        return self._report_fallbacks(req, timeout=timeout)

    def raw_call(self, method, payload, timeout=10, service=None, metadata=None):
        """Sends raw bytes to a method (tests of malformed requests; `service`: as method_path)."""
        fn = self._channel.unary_unary(method_path(method, service),
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return fn(payload, timeout=timeout, metadata=metadata)

    def close(self):
        self._channel.close()


PULL_SOCKET_MAGIC = b"RFP1"


def pull_socket_frame(payload, deadline_ms, authorization=b"", *, magic=PULL_SOCKET_MAGIC,
                      authorization_len=None, body_len=None):
    """One pull-socket request (src/agent/pull_socket.h): "RFP1" | u32 deadline_ms |
    u32 authorization_len | u32 body_len | authorization | body, little-endian. `magic` and the two
    lengths can be set apart from what follows (tests that play a hostile caller)."""
    return struct.pack("<4sIII", magic, deadline_ms,
                       len(authorization) if authorization_len is None else authorization_len,
                       len(payload) if body_len is None else body_len) + authorization + payload


_PULL_SOCKET_CLIENTS = weakref.WeakSet()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: [c._after_fork() for c in list(_PULL_SOCKET_CLIENTS)])
_GRPC_CODES = {c.value[0]: c for c in grpc.StatusCode}


class PullSocketError(Exception):
    """The agent refused a request on its pull socket (or did not answer): `code()` as a gRPC
    error's (its .name), `error_code` the agent's ErrorCode (0 when it did not answer)."""

    class _Code:
        def __init__(self, name):
            self.name = name

    def __init__(self, error_code, message, name=None):
        super().__init__(message)
        self.error_code = error_code
        self._name = name or (error_name(error_code) if error_code else "Unavailable")

    def code(self):
        return self._Code(self._name)

    def details(self):
        return str(self)


class PullSocketUnavailable(PullSocketError):
    """The pull socket could not be used (no connection could be made, or the agent's bound on
    connections): gRPC's local socket may still serve the pull. Nothing was answered; a request
    may have reached an agent that died meanwhile (a pull asked twice is read once)."""


class PullSocketImpostor(PullSocketError):
    """The process listening on the pull socket is of another user (not root): nothing was sent
    to it, and nothing should go to its sibling gRPC socket either (whoever could bind one path
    could bind the other)."""


def _recv_exact(sock, n, deadline):
    chunks = []
    while n > 0:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout("timed out")
        sock.settimeout(left)
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("the agent closed its pull socket before its answer ended")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _peer_uid(sock):
    cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3I", cred)[1]


class PullSocketClient:
    """Pull over this node's agent's pull socket. Connections are kept and reused, one per
    call under way (threads of one process pull concurrently). Nothing is sent to a socket that
    a process of another user (not root) listens on: the request carries the cluster's token."""

    def __init__(self, path, authorization=None):
        self.path = path
        self._authorization = (cluster_authorization() if authorization is None else authorization).encode()
        self._idle = []
        self._lock = threading.Lock()
        _PULL_SOCKET_CLIENTS.add(self)

    def _after_fork(self):
        # The parent's connections are not this process's; the lock may have been held by a
        # thread that does not exist here.
        self._idle = []
        self._lock = threading.Lock()

    def _take(self, deadline):
        """(a connection, whether it was kept from an earlier call)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # Bounded: an agent that stopped accepting (frozen, its backlog full) answers nothing.
            sock.settimeout(max(0.001, min(2.0, deadline - time.monotonic())))
            sock.connect(self.path)
            uid = _peer_uid(sock)
        except OSError as e:
            sock.close()
            raise PullSocketUnavailable(0, f"cannot connect to the agent's pull socket {self.path}: {e}") from e
        if uid not in (os.getuid(), 0):
            sock.close()
            raise PullSocketImpostor(pb.ERROR_CODE_PERMISSION_DENIED,
                                     f"{self.path} is served by a process of uid {uid}, not of this user "
                                     f"({os.getuid()}) or root: nothing sent to it")
        return sock, False

    @staticmethod
    def _refusal(sock, deadline):
        """The answer already waiting after a failed send (the agent refused the connection and
        closed it before reading), or None."""
        try:
            head = _recv_exact(sock, 8, min(deadline, time.monotonic() + 1.0))
            code, n = struct.unpack("<II", head)
            return code, _recv_exact(sock, n, min(deadline, time.monotonic() + 1.0))
        except OSError:
            return None

    def call(self, payload, timeout, authorization=None):
        """One framed request (`payload`: a serialized PullRequest); returns (code, reply bytes).
        One deadline for the whole call. A kept connection that the agent closed meanwhile (idle,
        or it restarted) is replaced, within that deadline."""
        deadline = time.monotonic() + timeout
        auth = self._authorization if authorization is None else authorization
        while True:
            sock, kept = self._take(deadline)
            # The caller's deadline as it stands now (a retry has less of it left).
            left_ms = int((deadline - time.monotonic()) * 1000)
            frame = pull_socket_frame(payload, min(2**32 - 1, max(1, left_ms)), auth)
            try:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                sock.sendall(frame)
            except socket.timeout as e:
                sock.close()
                raise PullSocketError(0, f"no answer on {self.path} within {timeout:.1f} s", "DeadlineExceeded") from e
            except OSError as e:
                answer = self._refusal(sock, deadline)
                sock.close()
                if answer is not None:
                    return answer
                if kept:
                    continue  # closed while idle: a fresh connection (PullSocketUnavailable if none)
                raise PullSocketUnavailable(0, f"pull socket {self.path}: {e}") from e
            try:
                head = _recv_exact(sock, 8, deadline)
            except socket.timeout as e:
                sock.close()  # the agent sees the hang-up and cuts the pull short
                raise PullSocketError(0, f"no answer on {self.path} within {timeout:.1f} s", "DeadlineExceeded") from e
            except OSError as e:
                sock.close()
                if kept:
                    continue  # closed while idle, before it read the request: asked again
                raise PullSocketError(0, f"pull socket {self.path}: {e}") from e
            code, n = struct.unpack("<II", head)
            try:
                body = _recv_exact(sock, n, deadline)
            except OSError as e:
                sock.close()
                raise PullSocketError(0, f"pull socket {self.path}: the answer was cut: {e}") from e
            break
        if code == 0:
            with self._lock:
                self._idle.append(sock)
        else:
            sock.close()  # the agent closes after most refusals; start afresh either way
        return code, body

    def pull(self, items, timeout_s, answer_when_claimed=False, answer_within_s=None):
        """As AgentClient.pull; a refusal raises PullSocketError with the agent's reason (the
        agent's bound on connections: PullSocketUnavailable, gRPC's local socket may serve)."""
        req, rpc_timeout = pull_request(items, timeout_s, answer_when_claimed, answer_within_s)
        code, body = self.call(req.SerializeToString(), rpc_timeout)
        if code == pb.ERROR_CODE_RESOURCE_EXHAUSTED:
            raise PullSocketUnavailable(code, body.decode(errors="replace"))
        if code != 0:
            raise PullSocketError(code, body.decode(errors="replace"))
        return pb.PullReply.FromString(body)

    def close(self):
        with self._lock:
            for sock in self._idle:
                sock.close()
            self._idle = []
