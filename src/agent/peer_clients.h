// gRPC stubs to other nodes' agents, one channel per address, created on first use, with the
// cluster's credentials (TLS when Ray uses it; the token on every call through Prepare).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "agent.grpc.pb.h"
#include "agent/auth.h"

namespace rayfabric::agent {

class PeerClients {
 public:
  explicit PeerClients(Credentials credentials) : credentials_(std::move(credentials)) {}

  std::shared_ptr<::rayfabric::v1::Agent::Stub> Get(const std::string& address);
  // Every outgoing call's context goes through here (it adds the token, if any).
  void Prepare(grpc::ClientContext& context) const { credentials_.Authorize(context); }

 private:
  Credentials credentials_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<::rayfabric::v1::Agent::Stub>> stubs_;
};

}  // namespace rayfabric::agent
