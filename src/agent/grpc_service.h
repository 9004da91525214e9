// The agent's gRPC face: checks the protocol version and the shape of every request, then calls
// Agent. Nothing else lives here.
#pragma once

#include "agent.grpc.pb.h"
#include "agent/agent.h"

namespace rayfabric::agent {

class AgentService final : public v1::Agent::Service {
 public:
  explicit AgentService(Agent* agent) : agent_(agent) {}

  grpc::Status Info(grpc::ServerContext*, const v1::InfoRequest*, v1::InfoReply*) override;
  grpc::Status LeaseObjects(grpc::ServerContext*, const v1::LeaseRequest*,
                            v1::LeaseReply*) override;
  grpc::Status ReleaseLeases(grpc::ServerContext*, const v1::ReleaseRequest*,
                             v1::ReleaseReply*) override;
  grpc::Status Pull(grpc::ServerContext*, const v1::PullRequest*, v1::PullReply*) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusReply*) override;

 private:
  grpc::Status CheckVersion(uint32_t version, const char* rpc);
  Agent* agent_;
};

}  // namespace rayfabric::agent
