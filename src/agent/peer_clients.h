// gRPC stubs to other nodes' agents, one channel per address, created on first use, with the
// cluster's credentials (TLS when Ray uses it; the token on every call through Prepare).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "agent.grpc.pb.h"
#include "agent/auth.h"

namespace rayfabric::agent {

// The bound on one call to a peer agent (a lease, a release), within the pull's own deadline.
inline constexpr auto kPeerRpcTimeout = std::chrono::seconds(10);

// gRPC deadlines are system_clock; ours are steady_clock.
std::chrono::system_clock::time_point ToSystem(std::chrono::steady_clock::time_point t);

// Runs one asynchronous unary call (`start` hands gRPC its completion callback) and waits for it,
// cancelling it if `cancelled` says so (the pull's caller went away) or its deadline passes.
grpc::Status CancellableCall(grpc::ClientContext& context, const std::function<bool()>& cancelled,
                             const std::function<void(std::function<void(grpc::Status)>)>& start);

class PeerClients {
 public:
  explicit PeerClients(Credentials credentials) : credentials_(std::move(credentials)) {}

  std::shared_ptr<::rayfabric::v1::Peer::Stub> Get(const std::string& address);
  // Every outgoing call's context goes through here (it adds the token, if any).
  void Prepare(grpc::ClientContext& context) const { credentials_.Authorize(context); }

 private:
  Credentials credentials_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<::rayfabric::v1::Peer::Stub>> stubs_;
};

}  // namespace rayfabric::agent
