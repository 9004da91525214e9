// gRPC stubs to other nodes' agents, one channel per address, created on first use.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "agent.grpc.pb.h"

namespace rayfabric::agent {

class PeerClients {
 public:
  std::shared_ptr<::rayfabric::v1::Agent::Stub> Get(const std::string& address);

 private:
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<::rayfabric::v1::Agent::Stub>> stubs_;
};

}  // namespace rayfabric::agent
