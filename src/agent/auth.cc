#include "agent/auth.h"

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <strings.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace rayfabric::agent {
namespace {

constexpr char kAuthorization[] = "authorization";
constexpr char kBearer[] = "Bearer ";

std::string Trim(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return Trim(line);
}

Result<std::string> ReadFile(const char* env) {
  const char* path = std::getenv(env);
  if (path == nullptr || *path == '\0') {
    return InvalidArgument(std::string("RAY_USE_TLS is set but ") + env +
                           " is not: set RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY and "
                           "RAY_TLS_CA_CERT as for Ray itself");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return InvalidArgument(std::string(env) + "=" + path + " cannot be read");
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

bool Truthy(const char* v) {
  return v != nullptr && (strcasecmp(v, "1") == 0 || strcasecmp(v, "true") == 0);
}

}  // namespace

Result<Credentials> Credentials::FromEnvironment() {
  Credentials c;
  const char* mode = std::getenv("RAY_AUTH_MODE");
  const std::string auth_mode = mode ? mode : "";
  if (strcasecmp(auth_mode.c_str(), "token") == 0) {
    // Ray's precedence (ray/rpc/authentication/authentication_token_loader.cc).
    const char* env_token = std::getenv("RAY_AUTH_TOKEN");
    const char* env_path = std::getenv("RAY_AUTH_TOKEN_PATH");
    if (env_token != nullptr && *env_token != '\0') {
      c.token_ = Trim(env_token);
      c.token_source_ = "RAY_AUTH_TOKEN";
    } else if (env_path != nullptr && *env_path != '\0') {
      c.token_ = FirstLine(env_path);
      if (c.token_.empty()) {
        return InvalidArgument(std::string("RAY_AUTH_TOKEN_PATH=") + env_path +
                               " cannot be read or is empty");
      }
      c.token_source_ = std::string("RAY_AUTH_TOKEN_PATH=") + env_path;
    } else {
      const char* home = std::getenv("HOME");
      const std::string path = std::string(home ? home : ".") + "/.ray/auth_token";
      c.token_ = FirstLine(path);
      c.token_source_ = path;
    }
    if (c.token_.empty()) {
      return InvalidArgument(
          "RAY_AUTH_MODE=token but no token was found: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH, "
          "or write ~/.ray/auth_token (the same token as the Ray cluster's)");
    }
  } else if (!auth_mode.empty() && strcasecmp(auth_mode.c_str(), "disabled") != 0) {
    return InvalidArgument("RAY_AUTH_MODE=" + auth_mode +
                           " is not supported by rayfabric (it speaks 'token' and 'disabled')");
  }
  if (Truthy(std::getenv("RAY_USE_TLS"))) {
    c.tls_ = true;
    RF_ASSIGN_OR_RETURN(c.cert_chain_, ReadFile("RAY_TLS_SERVER_CERT"));
    RF_ASSIGN_OR_RETURN(c.private_key_, ReadFile("RAY_TLS_SERVER_KEY"));
    RF_ASSIGN_OR_RETURN(c.root_certs_, ReadFile("RAY_TLS_CA_CERT"));
  }
  return c;
}

std::string Credentials::Describe() const {
  std::string out = token_required() ? "token authentication (token from " + token_source_ + ")"
                                     : "NO token authentication (RAY_AUTH_MODE is not 'token')";
  out += tls_ ? ", TLS with client certificates (RAY_USE_TLS)" : ", no TLS (RAY_USE_TLS unset)";
  if (!token_required() && !tls_) {
    out +=
        ": like the Ray cluster, any host that reaches the agent's port can lease its objects; "
        "run it on a trusted network or enable Ray's token authentication";
  }
  return out;
}

std::shared_ptr<grpc::ServerCredentials> Credentials::ServerCredentials() const {
  if (!tls_) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = root_certs_;
  options.pem_key_cert_pairs.push_back({private_key_, cert_chain_});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> Credentials::ChannelCredentials() const {
  if (!tls_) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = root_certs_;
  options.pem_private_key = private_key_;
  options.pem_cert_chain = cert_chain_;
  return grpc::SslCredentials(options);
}

void Credentials::Authorize(grpc::ClientContext& context) const {
  if (token_required()) context.AddMetadata(kAuthorization, kBearer + token_);
}

Status Credentials::Check(const grpc::ServerContext& context) const {
  if (!token_required()) return Status::OK();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(kAuthorization);
  if (it == metadata.end()) {
    return PermissionDenied(
        "no authorization token: this agent requires the Ray cluster's token "
        "(RAY_AUTH_MODE=token); "
        "send gRPC metadata 'authorization: Bearer <token>'");
  }
  return CheckAuthorization(std::string(it->second.data(), it->second.size()));
}

Status Credentials::CheckAuthorization(const std::string& presented) const {
  if (!token_required()) return Status::OK();
  if (presented.empty()) {
    return PermissionDenied(
        "no authorization token: this agent requires the Ray cluster's token "
        "(RAY_AUTH_MODE=token); send 'Bearer <token>'");
  }
  if (!ConstantTimeEqual(presented, kBearer + token_)) {
    return PermissionDenied("the authorization token does not match this Ray cluster's token");
  }
  return Status::OK();
}

}  // namespace rayfabric::agent
