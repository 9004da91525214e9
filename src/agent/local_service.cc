#include "agent/local_service.h"

#include <string>

namespace rayfabric::agent {
namespace {

constexpr int kMaxFallbacksPerReport = 1000;

}  // namespace

grpc::Status LocalService::Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                                v1::PullReply* reply) {
  grpc::Status a = guard_.Authenticate(context, "Pull");
  if (!a.ok()) return a;
  // Registered on the Unix socket alone; checked again, at no cost, should that ever change.
  if (!ServiceGuard::IsLocal(context->peer())) {
    return guard_.NotLocal("Pull", context->peer(), Count::kPullsRefusedRemote);
  }
  Status shape = guard_.agent().CheckPullRequest(*request);  // counted when refused
  if (!shape.ok()) {
    return grpc::Status(shape.code() == StatusCode::kVersionMismatch
                            ? grpc::StatusCode::FAILED_PRECONDITION
                            : grpc::StatusCode::INVALID_ARGUMENT,
                        shape.message());
  }
  *reply = guard_.agent().Pull(*request, ServiceGuard::DeadlineOf(context),
                               [context] { return context->IsCancelled(); });
  return grpc::Status::OK;
}

grpc::Status LocalService::ReportFallbacks(grpc::ServerContext* context,
                                           const v1::ReportFallbacksRequest* request,
                                           v1::ReportFallbacksReply* reply) {
  grpc::Status a = guard_.Authenticate(context, "ReportFallbacks");
  if (!a.ok()) return a;
  if (!ServiceGuard::IsLocal(context->peer())) {
    return guard_.NotLocal("ReportFallbacks", context->peer(), Count::kReportsRefusedRemote);
  }
  grpc::Status v = guard_.CheckVersion(request->protocol_version(), "ReportFallbacks");
  if (!v.ok()) return v;
  if (request->fallbacks_size() == 0 || request->fallbacks_size() > kMaxFallbacksPerReport) {
    return guard_.Rejected("ReportFallbacks needs 1.." + std::to_string(kMaxFallbacksPerReport) +
                           " reasons, got " + std::to_string(request->fallbacks_size()));
  }
  (void)reply;
  guard_.agent().ReportFallbacks(*request);
  return grpc::Status::OK;
}

grpc::Status LocalRefused::Pull(grpc::ServerContext* context, const v1::PullRequest* request,
                                v1::PullReply* reply) {
  (void)request;
  (void)reply;
  grpc::Status a = guard_.Authenticate(context, "Pull");
  if (!a.ok()) return a;
  return guard_.NotLocal("Pull", context->peer(), Count::kPullsRefusedRemote);
}

grpc::Status LocalRefused::ReportFallbacks(grpc::ServerContext* context,
                                           const v1::ReportFallbacksRequest* request,
                                           v1::ReportFallbacksReply* reply) {
  (void)request;
  (void)reply;
  grpc::Status a = guard_.Authenticate(context, "ReportFallbacks");
  if (!a.ok()) return a;
  return guard_.NotLocal("ReportFallbacks", context->peer(), Count::kReportsRefusedRemote);
}

}  // namespace rayfabric::agent
