// What every gRPC face of the agent checks before it calls Agent: the cluster's token, the
// protocol version, and who the caller is. Refusals are counted in the agent's status and logged
// (at most 10 lines a minute: any host can send them).
#pragma once

#include <chrono>
#include <string>

#include <grpcpp/server_context.h>

#include "agent/agent.h"
#include "agent/auth.h"

namespace rayfabric::agent {

class ServiceGuard {
 public:
  ServiceGuard(Agent* agent, Credentials credentials)
      : agent_(agent), credentials_(std::move(credentials)) {}

  Agent& agent() const { return *agent_; }
  // UNAUTHENTICATED without the cluster's token (when it uses one); counted.
  grpc::Status Authenticate(const grpc::ServerContext* context, const char* rpc) const;
  // FAILED_PRECONDITION for another protocol version; counted as rejected.
  grpc::Status CheckVersion(uint32_t version, const char* rpc) const;
  // A request refused for its shape (by default INVALID_ARGUMENT), counted as rejected.
  grpc::Status Rejected(const std::string& why,
                        grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT) const;
  // `rpc` is served only on the agent's Unix socket: PERMISSION_DENIED to a caller of the network
  // port, counted as `count`.
  grpc::Status NotLocal(const char* rpc, const std::string& peer, Count count) const;

  // The host part of a gRPC peer string ("ipv4:10.0.0.1:5000" -> "10.0.0.1", "unix:..." ->
  // "local"): who holds leases, for the per-requester bound.
  static std::string PeerHost(const std::string& peer);
  // True for calls that came over a Unix socket (processes of this node).
  static bool IsLocal(const std::string& peer);
  // The call's gRPC deadline on the agent's (steady) clock.
  static std::chrono::steady_clock::time_point DeadlineOf(const grpc::ServerContext* context);

 private:
  Agent* agent_;
  Credentials credentials_;
};

}  // namespace rayfabric::agent
