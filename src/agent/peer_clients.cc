#include "agent/peer_clients.h"

#include <grpcpp/grpcpp.h>

namespace rayfabric::agent {

std::shared_ptr<::rayfabric::v1::Agent::Stub> PeerClients::Get(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, credentials_.ChannelCredentials(), args);
  auto stub =
      std::shared_ptr<::rayfabric::v1::Agent::Stub>(::rayfabric::v1::Agent::NewStub(channel));
  stubs_[address] = stub;
  return stub;
}

}  // namespace rayfabric::agent
