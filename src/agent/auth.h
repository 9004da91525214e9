// The control plane's credentials, decided the way Ray decides its own (so that rayfabric is
// never weaker than the cluster it serves):
// - token authentication when RAY_AUTH_MODE=token: the token from RAY_AUTH_TOKEN, else the file
//   RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token (first line, whitespace trimmed); every call
//   carries gRPC metadata `authorization: Bearer <token>`;
// - TLS when RAY_USE_TLS is 1/true: RAY_TLS_SERVER_CERT, RAY_TLS_SERVER_KEY and RAY_TLS_CA_CERT;
//   servers require client certificates signed by that CA, and clients present the same pair.
#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>

#include "rayfabric/status.h"

namespace grpc {
class ClientContext;
class ServerContext;
}  // namespace grpc

namespace rayfabric::agent {

class Credentials {
 public:
  // Reads RAY_AUTH_MODE, RAY_AUTH_TOKEN(_PATH), HOME, RAY_USE_TLS and RAY_TLS_*; a setting that
  // cannot be honoured (token mode without a token, an unreadable certificate) is an error.
  static Result<Credentials> FromEnvironment();
  // No token, no TLS (a cluster without Ray's authentication; tests of the insecure default).
  static Credentials Insecure() { return Credentials(); }

  bool token_required() const { return !token_.empty(); }
  bool tls() const { return tls_; }
  std::string Describe() const;  // one line for the log and `rayfabric doctor`

  std::shared_ptr<grpc::ServerCredentials> ServerCredentials() const;
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() const;
  // Adds the token (if any) to an outgoing call.
  void Authorize(grpc::ClientContext& context) const;
  // OK when the call carries the token (or none is required); else why not (UNAUTHENTICATED).
  Status Check(const grpc::ServerContext& context) const;
  // The same check of an `authorization` value ("Bearer <token>"; empty: none presented), for
  // the agent's local pull socket, which carries it in each request.
  Status CheckAuthorization(const std::string& presented) const;

 private:
  std::string token_;
  bool tls_ = false;
  std::string cert_chain_, private_key_, root_certs_;
  std::string token_source_;
};

}  // namespace rayfabric::agent
