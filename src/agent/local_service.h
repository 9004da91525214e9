// The agent's node-local face (rayfabric.v1.Local): Pull, the verb that creates objects in this
// node's store (which workers then unpickle), and ReportFallbacks. rayfabricd registers it only on
// the agent's Unix socket; the network port has LocalRefused in its place, so that who may call it
// is decided by where it is served, not by a check each method has to remember.
#pragma once

#include "agent.grpc.pb.h"
#include "agent/service_guard.h"

namespace rayfabric::agent {

class LocalService final : public v1::Local::Service {
 public:
  explicit LocalService(ServiceGuard guard) : guard_(std::move(guard)) {}

  grpc::Status Pull(grpc::ServerContext*, const v1::PullRequest*, v1::PullReply*) override;
  grpc::Status ReportFallbacks(grpc::ServerContext*, const v1::ReportFallbacksRequest*,
                               v1::ReportFallbacksReply*) override;

 private:
  ServiceGuard guard_;
};

// Local's methods as the network port answers them: authenticated, counted, and refused
// (PERMISSION_DENIED, saying where they are served).
class LocalRefused final : public v1::Local::Service {
 public:
  explicit LocalRefused(ServiceGuard guard) : guard_(std::move(guard)) {}

  grpc::Status Pull(grpc::ServerContext*, const v1::PullRequest*, v1::PullReply*) override;
  grpc::Status ReportFallbacks(grpc::ServerContext*, const v1::ReportFallbacksRequest*,
                               v1::ReportFallbacksReply*) override;

 private:
  ServiceGuard guard_;
};

}  // namespace rayfabric::agent
