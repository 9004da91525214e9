"""Fault injection for the agent tests: a gRPC front for a real agent that forwards every call
(so leases are real and the fabric reads succeed), with one hook that may hold or rewrite a call,
as a source whose host stopped answering, or a hostile one, would."""
import concurrent.futures

import grpc

from rayfabric._client import AgentClient


class AgentFront:
    """Listens on 127.0.0.1 (`address`: send the pulls there). Subclasses override forward()."""

    def __init__(self, target, threads=8):
        self.target = AgentClient(target)
        self.server = grpc.server(concurrent.futures.ThreadPoolExecutor(threads))
        self.server.add_generic_rpc_handlers((self,))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def forward(self, method, payload):
        """One call's reply: the real agent's, by default."""
        return self.target.raw_call(method, payload)

    def service(self, details):  # grpc.GenericRpcHandler
        method = details.method.rsplit("/", 1)[1]
        return grpc.unary_unary_rpc_method_handler(lambda payload, context: self.forward(method, payload))

    def close(self, grace=2):
        self.server.stop(grace=grace).wait()
