#include "agent/peer_service.h"

#include <string>

namespace rayfabric::agent {

grpc::Status PeerService::Info(grpc::ServerContext* context, const v1::InfoRequest* request,
                               v1::InfoReply* reply) {
  grpc::Status a = guard_.Authenticate(context, "Info");
  if (!a.ok()) return a;
  // Info answers any version, so that a mismatched peer can say which one it met.
  (void)request;
  *reply = guard_.agent().Info();
  return grpc::Status::OK;
}

grpc::Status PeerService::LeaseObjects(grpc::ServerContext* context,
                                       const v1::LeaseRequest* request, v1::LeaseReply* reply) {
  grpc::Status a = guard_.Authenticate(context, "LeaseObjects");
  if (!a.ok()) return a;
  grpc::Status v = guard_.CheckVersion(request->protocol_version(), "LeaseObjects");
  if (!v.ok()) return v;
  if (request->object_ids_size() == 0 || request->object_ids_size() > kMaxItemsPerRequest) {
    return guard_.Rejected("LeaseObjects needs 1.." + std::to_string(kMaxItemsPerRequest) +
                           " object ids, got " + std::to_string(request->object_ids_size()));
  }
  *reply = guard_.agent().Lease(*request, ServiceGuard::PeerHost(context->peer()));
  return grpc::Status::OK;
}

grpc::Status PeerService::ReleaseLeases(grpc::ServerContext* context,
                                        const v1::ReleaseRequest* request,
                                        v1::ReleaseReply* reply) {
  grpc::Status a = guard_.Authenticate(context, "ReleaseLeases");
  if (!a.ok()) return a;
  grpc::Status v = guard_.CheckVersion(request->protocol_version(), "ReleaseLeases");
  if (!v.ok()) return v;
  if (request->leases_size() > kMaxItemsPerRequest) {
    return guard_.Rejected("ReleaseLeases takes at most " + std::to_string(kMaxItemsPerRequest) +
                           " leases, got " + std::to_string(request->leases_size()));
  }
  *reply = guard_.agent().Release(*request);
  return grpc::Status::OK;
}

grpc::Status PeerService::GetStatus(grpc::ServerContext* context, const v1::StatusRequest* request,
                                    v1::StatusReply* reply) {
  grpc::Status a = guard_.Authenticate(context, "GetStatus");
  if (!a.ok()) return a;
  (void)request;
  *reply = guard_.agent().GetStatus();
  return grpc::Status::OK;
}

grpc::Status LegacyService::Info(grpc::ServerContext* context, const v1::InfoRequest* request,
                                 v1::InfoReply* reply) {
  grpc::Status a = guard_.Authenticate(context, "Info");
  if (!a.ok()) return a;
  (void)request;
  *reply = guard_.agent().Info();
  return grpc::Status::OK;
}

grpc::Status LegacyService::Refuse(grpc::ServerContext* context, const char* rpc,
                                   std::optional<Count> remote) {
  grpc::Status a = guard_.Authenticate(context, rpc);
  if (!a.ok()) return a;
  if (remote && !ServiceGuard::IsLocal(context->peer())) {
    return guard_.NotLocal(rpc, context->peer(), *remote);
  }
  return guard_.Rejected(std::string("rayfabric.v1.Agent/") + rpc +
                             ": this agent no longer serves protocol V2 (the service "
                             "rayfabric.v1.Agent); it speaks V" +
                             std::to_string(kProtocolVersion) +
                             " (rayfabric.v1.Peer, and rayfabric.v1.Local on its Unix socket): "
                             "run the same rayfabric version on every node",
                         grpc::StatusCode::FAILED_PRECONDITION);
}

}  // namespace rayfabric::agent
