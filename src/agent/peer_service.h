// The agent's network face (rayfabric.v1.Peer): what other nodes' agents and operators' tools
// call, on the network port and the local socket alike. And protocol V2's single service
// (rayfabric.v1.Agent), kept only so that an agent or client of V2 is told clearly what it met.
#pragma once

#include <optional>

#include "agent.grpc.pb.h"
#include "agent/service_guard.h"

namespace rayfabric::agent {

class PeerService final : public v1::Peer::Service {
 public:
  explicit PeerService(ServiceGuard guard) : guard_(std::move(guard)) {}

  grpc::Status Info(grpc::ServerContext*, const v1::InfoRequest*, v1::InfoReply*) override;
  grpc::Status LeaseObjects(grpc::ServerContext*, const v1::LeaseRequest*,
                            v1::LeaseReply*) override;
  grpc::Status ReleaseLeases(grpc::ServerContext*, const v1::ReleaseRequest*,
                             v1::ReleaseReply*) override;
  grpc::Status GetStatus(grpc::ServerContext*, const v1::StatusRequest*, v1::StatusReply*) override;

 private:
  ServiceGuard guard_;
};

// Info answers (a V2 peer then names the mismatch itself, from protocol_version); every other
// method is refused with FAILED_PRECONDITION, naming the version this agent speaks; Pull and
// ReportFallbacks from the network are refused as remote ones first (PERMISSION_DENIED, counted).
class LegacyService final : public v1::Agent::Service {
 public:
  explicit LegacyService(ServiceGuard guard) : guard_(std::move(guard)) {}

  grpc::Status Info(grpc::ServerContext*, const v1::InfoRequest*, v1::InfoReply*) override;
  grpc::Status LeaseObjects(grpc::ServerContext* context, const v1::LeaseRequest*,
                            v1::LeaseReply*) override {
    return Refuse(context, "LeaseObjects");
  }
  grpc::Status ReleaseLeases(grpc::ServerContext* context, const v1::ReleaseRequest*,
                             v1::ReleaseReply*) override {
    return Refuse(context, "ReleaseLeases");
  }
  grpc::Status Pull(grpc::ServerContext* context, const v1::PullRequest*, v1::PullReply*) override {
    return Refuse(context, "Pull", Count::kPullsRefusedRemote);
  }
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::StatusRequest*,
                         v1::StatusReply*) override {
    return Refuse(context, "GetStatus");
  }
  grpc::Status ReportFallbacks(grpc::ServerContext* context, const v1::ReportFallbacksRequest*,
                               v1::ReportFallbacksReply*) override {
    return Refuse(context, "ReportFallbacks", Count::kReportsRefusedRemote);
  }

 private:
  // `remote`: for a method served only on the local socket, what a network caller is counted as
  // (a remote Pull is one, whatever its version).
  grpc::Status Refuse(grpc::ServerContext* context, const char* rpc,
                      std::optional<Count> remote = std::nullopt);
  ServiceGuard guard_;
};

}  // namespace rayfabric::agent
