#include "agent/service_guard.h"

#include "rayfabric/log.h"

namespace rayfabric::agent {
namespace {

// Refused requests are logged, but any host can send them: at most 10 lines a minute, so that a
// flood of forged or remote requests cannot fill the disk under Ray's log directory (each one is
// still counted in the status).
LogLimiter& RefusalLog() {
  static LogLimiter limiter(10, std::chrono::minutes(1));
  return limiter;
}

}  // namespace

grpc::Status ServiceGuard::Authenticate(const grpc::ServerContext* context, const char* rpc) const {
  Status s = credentials_.Check(*context);
  if (s.ok()) return grpc::Status::OK;
  agent_->CountRefusal(Count::kRequestsUnauthenticated);
  RF_LOG_LIMITED(RefusalLog(), kWarn,
                 rpc << " from " << context->peer() << " refused: " << s.message());
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(rpc) + ": " + s.message());
}

grpc::Status ServiceGuard::CheckVersion(uint32_t version, const char* rpc) const {
  std::string refusal = VersionRefusal(version, rpc);
  if (refusal.empty()) return grpc::Status::OK;
  agent_->CountRefusal(Count::kRequestsRejected);
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, refusal);
}

grpc::Status ServiceGuard::Rejected(const std::string& why, grpc::StatusCode code) const {
  agent_->CountRefusal(Count::kRequestsRejected);
  return grpc::Status(code, why);
}

grpc::Status ServiceGuard::NotLocal(const char* rpc, const std::string& peer, Count count) const {
  agent_->CountRefusal(count);
  RF_LOG_LIMITED(RefusalLog(), kWarn, rpc << " from " << peer << " refused: not a local process");
  return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                      std::string(rpc) +
                          " is served only to processes of this node, on the agent's local socket "
                          "(its record's local_socket); " +
                          peer + " is not local");
}

std::string ServiceGuard::PeerHost(const std::string& peer) {
  if (IsLocal(peer)) return "local";
  // ipv4:1.2.3.4:port, ipv6:[::1]:port
  std::string rest = peer.substr(peer.find(':') + 1);
  if (!rest.empty() && rest[0] == '[') return rest.substr(1, rest.find(']') - 1);
  return rest.substr(0, rest.rfind(':'));
}

bool ServiceGuard::IsLocal(const std::string& peer) { return peer.rfind("unix:", 0) == 0; }

std::chrono::steady_clock::time_point ServiceGuard::DeadlineOf(const grpc::ServerContext* context) {
  // gRPC deadlines are system_clock; the agent's are steady_clock.
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return std::chrono::steady_clock::time_point::max();
  }
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             deadline - std::chrono::system_clock::now());
}

}  // namespace rayfabric::agent
