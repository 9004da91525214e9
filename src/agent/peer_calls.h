// What the agent asks of other nodes' agents (a lease, a release): the seam between the puller and
// the network. GrpcPeerCalls is the real one: one channel per address, created on first use, with
// the cluster's credentials (TLS when Ray uses it; the token on every call). The unit tests
// (tests/agent/agent_seams_test.cc) put agents face to face in one process through another.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "agent.grpc.pb.h"
#include "agent/auth.h"
#include "rayfabric/status.h"

namespace rayfabric::agent {

// The bound on one call to a peer agent (a lease, a release), within the pull's own deadline.
inline constexpr auto kPeerRpcTimeout = std::chrono::seconds(10);

// One call's state, kept alive by its caller until the call's `done` has run.
class PeerCall {
 public:
  virtual ~PeerCall() = default;
  // Asks the call to end now; its `done` then runs soon (with an error, unless it was answered).
  virtual void Cancel() = 0;
};

class PeerCalls {
 public:
  // The call's outcome, already said in rayfabric's terms (who was called, what to do).
  using Done = std::function<void(Status)>;
  virtual ~PeerCalls() = default;

  virtual std::unique_ptr<PeerCall> NewCall() = 0;
  // Each starts `call` to the agent at `address` (host:port), bounded by `deadline`. `done` runs
  // once, on any thread, possibly before the start returns; `request` and `reply` live until then.
  virtual void StartLease(PeerCall& call, const std::string& address,
                          const ::rayfabric::v1::LeaseRequest& request,
                          ::rayfabric::v1::LeaseReply& reply,
                          std::chrono::steady_clock::time_point deadline, Done done) = 0;
  virtual void StartRelease(PeerCall& call, const std::string& address,
                            const ::rayfabric::v1::ReleaseRequest& request,
                            ::rayfabric::v1::ReleaseReply& reply,
                            std::chrono::steady_clock::time_point deadline, Done done) = 0;
};

// Runs a call `start` starts on `call` and waits for it, cancelling it once `cancelled` says so
// (the pull's caller went away).
Status AwaitPeerCall(PeerCall& call, const std::function<bool()>& cancelled,
                     const std::function<void(PeerCalls::Done)>& start);

class GrpcPeerCalls final : public PeerCalls {
 public:
  explicit GrpcPeerCalls(Credentials credentials) : credentials_(std::move(credentials)) {}

  std::unique_ptr<PeerCall> NewCall() override;
  void StartLease(PeerCall& call, const std::string& address,
                  const ::rayfabric::v1::LeaseRequest& request, ::rayfabric::v1::LeaseReply& reply,
                  std::chrono::steady_clock::time_point deadline, Done done) override;
  void StartRelease(PeerCall& call, const std::string& address,
                    const ::rayfabric::v1::ReleaseRequest& request,
                    ::rayfabric::v1::ReleaseReply& reply,
                    std::chrono::steady_clock::time_point deadline, Done done) override;

 private:
  std::shared_ptr<::rayfabric::v1::Peer::Stub> StubFor(const std::string& address);
  // The call's context, with the cluster's credentials and `deadline`.
  grpc::ClientContext& Prepare(PeerCall& call,
                               std::chrono::steady_clock::time_point deadline) const;
  // gRPC's completion for `done`: the status said as `doing` + `address` when it failed.
  static std::function<void(grpc::Status)> Said(const char* doing, const std::string& address,
                                                Done done);

  Credentials credentials_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<::rayfabric::v1::Peer::Stub>> stubs_;
};

}  // namespace rayfabric::agent
