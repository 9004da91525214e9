"""gRPC client of one rayfabricd (proto/rayfabric/v1/agent.proto), over generic unary calls: the
messages come from agent_pb2 (checked in, generated from the proto); no grpc codegen needed.

Channels are made the way Ray makes its own (ray._private.grpc_utils.init_grpc_channel): TLS when
RAY_USE_TLS is set, the cluster's token on every call when RAY_AUTH_MODE=token. `address` is
host:port (another node's agent) or unix:PATH (this node's agent, the only one that serves Pull)."""
import grpc

from rayfabric import agent_pb2 as pb

PROTOCOL = pb.PROTOCOL_V2
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


def error_name(code):
    """ERROR_CODE_NOT_FOUND -> "NotFound" style names for logs and stats."""
    name = pb.ErrorCode.Name(code).replace("ERROR_CODE_", "")
    return "".join(part.capitalize() for part in name.split("_"))


class AgentClient:
    def __init__(self, address, channel=None):
        self.address = address
        self._channel = channel if channel is not None else make_channel(address)

        def call(name, req, rep):
            return self._channel.unary_unary(f"/rayfabric.v1.Agent/{name}",
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
        req = pb.PullRequest(protocol_version=PROTOCOL, items=items, timeout_ms=int(timeout_s * 1000),
                             answer_when_claimed=answer_when_claimed)
        rpc_timeout = timeout_s + 10
        if answer_when_claimed and answer_within_s is not None:
            rpc_timeout = answer_within_s
        return self._pull(req, timeout=rpc_timeout)

    def status(self, timeout=10):
        return self._status(pb.StatusRequest(protocol_version=PROTOCOL), timeout=timeout)

    def report_fallbacks(self, counts, timeout=2, protocol_version=PROTOCOL):
        """counts: iterable of (reason, objects) this process left to Ray's path (local socket only)."""
        req = pb.ReportFallbacksRequest(protocol_version=protocol_version,
                                        fallbacks=[pb.FallbackCount(reason=r, objects=n) for r, n in counts])
        return self._report_fallbacks(req, timeout=timeout)

    def raw_call(self, method, payload, timeout=10):
        """Sends raw bytes to a method (tests of malformed requests)."""
        fn = self._channel.unary_unary(f"/rayfabric.v1.Agent/{method}",
                                       request_serializer=lambda b: b, response_deserializer=lambda b: b)
        return fn(payload, timeout=timeout)

    def close(self):
        self._channel.close()
