#include "agent/grpc_service.h"

#include <grpcpp/server_context.h>

#include <chrono>
#include <string>

#include "rayfabric/log.h"

namespace rayfabric::agent {
namespace {

constexpr int kMaxFallbacksPerReport = 1000;

// Refused requests are logged, but any host can send them: at most 10 lines a minute, so that a
// flood of forged or remote requests cannot fill the disk under Ray's log directory (each one is
// still counted in the status).
LogLimiter& RefusalLog() {
  static LogLimiter limiter(10, std::chrono::minutes(1));
  return limiter;
}

// The refusal of an RPC served only on the agent's local socket, asked by `peer` over the network.
grpc::Status NotLocal(const char* rpc, const std::string& peer) {
  RF_LOG_LIMITED(RefusalLog(), kWarn, rpc << " from " << peer << " refused: not a local process");
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      std::string(rpc) +
                          " is served only to processes of this node, on the agent's local socket "
                          "(its record's local_socket); " +
                          peer + " is not local");
}

// gRPC deadlines are system_clock; the agent's are steady_clock.
std::chrono::steady_clock::time_point DeadlineOf(const grpc::ServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return std::chrono::steady_clock::time_point::max();
  }
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             deadline - std::chrono::system_clock::now());
}

}  // namespace

std::string AgentService::PeerHost(const std::string& peer) {
  if (IsLocal(peer)) return "local";
  // ipv4:1.2.3.4:port, ipv6:[::1]:port
  std::string rest = peer.substr(peer.find(':') + 1);
  if (!rest.empty() && rest[0] == '[') return rest.substr(1, rest.find(']') - 1);
  return rest.substr(0, rest.rfind(':'));
}

bool AgentService::IsLocal(const std::string& peer) { return peer.rfind("unix:", 0) == 0; }

grpc::Status AgentService::Authenticate(const grpc::ServerContext* context, const char* rpc) {
  Status s = credentials_.Check(*context);
  if (s.ok()) return grpc::Status::OK;
  agent_->CountUnauthenticated();
  RF_LOG_LIMITED(RefusalLog(), kWarn,
                 rpc << " from " << context->peer() << " refused: " << s.message());
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(rpc) + ": " + s.message());
}

grpc::Status AgentService::CheckVersion(uint32_t version, const char* rpc) {
  std::string refusal = VersionRefusal(version, rpc);
  if (refusal.empty()) return grpc::Status::OK;
  agent_->CountRejectedRequest();
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, refusal);
}

grpc::Status AgentService::Info(grpc::ServerContext* context, const v1::InfoRequest* request,
                                v1::InfoReply* reply) {
  grpc::Status a = Authenticate(context, "Info");
  if (!a.ok()) return a;
  // Info answers any version, so that a mismatched peer can say which one it met.
  (void)request;
  *reply = agent_->Info();
  return grpc::Status::OK;
}

grpc::Status AgentService::LeaseObjects(grpc::ServerContext* context,
                                        const v1::LeaseRequest* request, v1::LeaseReply* reply) {
  grpc::Status a = Authenticate(context, "LeaseObjects");
  if (!a.ok()) return a;
  grpc::Status v = CheckVersion(request->protocol_version(), "LeaseObjects");
  if (!v.ok()) return v;
  if (request->object_ids_size() == 0 || request->object_ids_size() > kMaxItemsPerRequest) {
    agent_->CountRejectedRequest();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "LeaseObjects needs 1.." + std::to_string(kMaxItemsPerRequest) +
                            " object ids, got " + std::to_string(request->object_ids_size()));
  }
  *reply = agent_->Lease(*request, PeerHost(context->peer()));
  return grpc::Status::OK;
}

grpc::Status AgentService::ReleaseLeases(grpc::ServerContext* context,
                                         const v1::ReleaseRequest* request,
                                         v1::ReleaseReply* reply) {
  grpc::Status a = Authenticate(context, "ReleaseLeases");
  if (!a.ok()) return a;
  grpc::Status v = CheckVersion(request->protocol_version(), "ReleaseLeases");
  if (!v.ok()) return v;
  if (request->leases_size() > kMaxItemsPerRequest) {
    agent_->CountRejectedRequest();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "ReleaseLeases takes at most " + std::to_string(kMaxItemsPerRequest) +
                            " leases, got " + std::to_string(request->leases_size()));
  }
  *reply = agent_->Release(*request);
  return grpc::Status::OK;
}

grpc::Status AgentService::Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                                v1::PullReply* reply) {
  grpc::Status a = Authenticate(context, "Pull");
  if (!a.ok()) return a;
  // Pull creates and seals objects in this node's store (which workers then unpickle): only
  // processes of this node may ask, over the agent's Unix socket.
  if (!IsLocal(context->peer())) {
    agent_->CountRemotePull();
    return NotLocal("Pull", context->peer());
  }
  Status shape = agent_->CheckPullRequest(*request);
  if (!shape.ok()) {
    return grpc::Status(shape.code() == StatusCode::kVersionMismatch
                            ? grpc::StatusCode::FAILED_PRECONDITION
                            : grpc::StatusCode::INVALID_ARGUMENT,
                        shape.message());
  }
  *reply =
      agent_->Pull(*request, DeadlineOf(context), [context] { return context->IsCancelled(); });
  return grpc::Status::OK;
}

grpc::Status AgentService::GetStatus(grpc::ServerContext* context, const v1::StatusRequest* request,
                                     v1::StatusReply* reply) {
  grpc::Status a = Authenticate(context, "GetStatus");
  if (!a.ok()) return a;
  (void)request;
  *reply = agent_->GetStatus();
  return grpc::Status::OK;
}

grpc::Status AgentService::ReportFallbacks(grpc::ServerContext* context,
                                           const v1::ReportFallbacksRequest* request,
                                           v1::ReportFallbacksReply* reply) {
  grpc::Status a = Authenticate(context, "ReportFallbacks");
  if (!a.ok()) return a;
  // The counts describe this node's gets: only its own processes report them (as with Pull).
  if (!IsLocal(context->peer())) {
    agent_->CountRemoteReport();
    return NotLocal("ReportFallbacks", context->peer());
  }
  grpc::Status v = CheckVersion(request->protocol_version(), "ReportFallbacks");
  if (!v.ok()) return v;
  if (request->fallbacks_size() == 0 || request->fallbacks_size() > kMaxFallbacksPerReport) {
    agent_->CountRejectedRequest();
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "ReportFallbacks needs 1.." + std::to_string(kMaxFallbacksPerReport) +
                            " reasons, got " + std::to_string(request->fallbacks_size()));
  }
  (void)reply;
  agent_->ReportFallbacks(*request);
  return grpc::Status::OK;
}

}  // namespace rayfabric::agent
