// The agent's gRPC face: authenticates every call (the Ray cluster's token, when it uses one),
// keeps Pull and ReportFallbacks to this node's own processes (the local Unix socket), checks the
// protocol version and the shape of every request, then calls Agent. Nothing else lives here.
#pragma once

#include "agent.grpc.pb.h"
#include "agent/agent.h"
#include "agent/auth.h"

namespace rayfabric::agent {

class AgentService final : public v1::Agent::Service {
 public:
  AgentService(Agent* agent, Credentials credentials)
      : agent_(agent), credentials_(std::move(credentials)) {}

  grpc::Status Info(grpc::ServerContext*, const v1::InfoRequest*, v1::InfoReply*) override;
  grpc::Status LeaseObjects(grpc::ServerContext*, const v1::LeaseRequest*,
                            v1::LeaseReply*) override;
  grpc::Status ReleaseLeases(grpc::ServerContext*, const v1::ReleaseRequest*,
                             v1::ReleaseReply*) override;
  grpc::Status Pull(grpc::ServerContext*, const v1::PullRequest*, v1::PullReply*) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusReply*) override;
  grpc::Status ReportFallbacks(grpc::ServerContext*, const v1::ReportFallbacksRequest*,
                               v1::ReportFallbacksReply*) override;

  // The host part of a gRPC peer string ("ipv4:10.0.0.1:5000" -> "10.0.0.1", "unix:..." ->
  // "local"): who holds leases, for the per-requester bound.
  static std::string PeerHost(const std::string& peer);
  // True for calls that came over a Unix socket (processes of this node).
  static bool IsLocal(const std::string& peer);

 private:
  grpc::Status Authenticate(const grpc::ServerContext* context, const char* rpc);
  grpc::Status CheckVersion(uint32_t version, const char* rpc);
  Agent* agent_;
  Credentials credentials_;
};

}  // namespace rayfabric::agent
