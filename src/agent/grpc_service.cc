#include "agent/grpc_service.h"

#include <string>

namespace rayfabric::agent {
namespace {

constexpr int kMaxItemsPerRequest = 100000;

}  // namespace

grpc::Status AgentService::CheckVersion(uint32_t version, const char* rpc) {
  if (version == kProtocolVersion) return grpc::Status::OK;
  agent_->CountRejectedRequest();
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      std::string(rpc) + ": protocol_version " + std::to_string(version) +
                          " is not spoken by this agent (it speaks " +
                          std::to_string(kProtocolVersion) +
                          "); run the same rayfabric version on every node");
}

grpc::Status AgentService::Info(grpc::ServerContext*, const v1::InfoRequest* request,
                                v1::InfoReply* reply) {
  // Info answers any version, so that a mismatched peer can say which one it met.
  (void)request;
  *reply = agent_->Info();
  return grpc::Status::OK;
}

grpc::Status AgentService::LeaseObjects(grpc::ServerContext*, const v1::LeaseRequest* request,
                                        v1::LeaseReply* reply) {
  grpc::Status v = CheckVersion(request->protocol_version(), "LeaseObjects");
  if (!v.ok()) return v;
  if (request->object_ids_size() == 0 || request->object_ids_size() > kMaxItemsPerRequest) {
    agent_->CountRejectedRequest();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "LeaseObjects needs 1.." + std::to_string(kMaxItemsPerRequest) +
                            " object ids, got " + std::to_string(request->object_ids_size()));
  }
  *reply = agent_->Lease(*request);
  return grpc::Status::OK;
}

grpc::Status AgentService::ReleaseLeases(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                         v1::ReleaseReply* reply) {
  grpc::Status v = CheckVersion(request->protocol_version(), "ReleaseLeases");
  if (!v.ok()) return v;
  *reply = agent_->Release(*request);
  return grpc::Status::OK;
}

grpc::Status AgentService::Pull(grpc::ServerContext*, const v1::PullRequest* request,
                                v1::PullReply* reply) {
  grpc::Status v = CheckVersion(request->protocol_version(), "Pull");
  if (!v.ok()) return v;
  if (request->items_size() == 0 || request->items_size() > kMaxItemsPerRequest) {
    agent_->CountRejectedRequest();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "Pull needs 1.." + std::to_string(kMaxItemsPerRequest) + " items, got " +
                            std::to_string(request->items_size()));
  }
  *reply = agent_->Pull(*request);
  return grpc::Status::OK;
}

grpc::Status AgentService::GetStatus(grpc::ServerContext*, const v1::StatusRequest* request,
                                     v1::StatusReply* reply) {
  (void)request;
  *reply = agent_->GetStatus();
  return grpc::Status::OK;
}

}  // namespace rayfabric::agent
