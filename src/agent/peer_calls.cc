#include "agent/peer_calls.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>

namespace rayfabric::agent {
namespace {

namespace v1 = ::rayfabric::v1;

// How often a waiting call asks whether its caller went away.
constexpr auto kCancelPoll = std::chrono::milliseconds(100);

// gRPC deadlines are system_clock; ours are steady_clock.
std::chrono::system_clock::time_point ToSystem(std::chrono::steady_clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             t - std::chrono::steady_clock::now());
}

// A failed call to another agent, said as what it means here.
Status FromGrpc(const grpc::Status& s, const std::string& what) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return Unavailable(what + ": " + s.error_message() +
                         " (is rayfabricd running on that node? `rayfabric status`)");
    case grpc::StatusCode::FAILED_PRECONDITION:
      return VersionMismatch(what + ": " + s.error_message());
    case grpc::StatusCode::UNIMPLEMENTED:  // an agent older than protocol V3 (no Peer service)
      return VersionMismatch(what +
                             ": it does not serve rayfabric.v1.Peer (protocol V3), so it "
                             "runs an older rayfabric (" +
                             s.error_message() + "); run the same rayfabric version on every node");
    case grpc::StatusCode::CANCELLED:  // cut short here: the caller went away, or shutdown
      return Aborted(what + ": cancelled (" + s.error_message() + ")");
    case grpc::StatusCode::INVALID_ARGUMENT:
      return InvalidArgument(what + ": " + s.error_message());
    case grpc::StatusCode::UNAUTHENTICATED:
      return PermissionDenied(what + ": " + s.error_message() +
                              " (do both nodes use the same Ray cluster token?)");
    default:
      return ProtocolError(what + ": gRPC " + std::to_string(s.error_code()) + ": " +
                           s.error_message());
  }
}

class GrpcCall final : public PeerCall {
 public:
  void Cancel() override { context.TryCancel(); }
  grpc::ClientContext context;
};

}  // namespace

Status AwaitPeerCall(PeerCall& call, const std::function<bool()>& cancelled,
                     const std::function<void(PeerCalls::Done)>& start) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status result;
  start([&](Status s) {
    std::lock_guard<std::mutex> lock(mu);
    result = std::move(s);
    done = true;
    cv.notify_all();
  });
  std::unique_lock<std::mutex> lock(mu);
  bool sent_cancel = false;
  while (!cv.wait_for(lock, kCancelPoll, [&] { return done; })) {
    if (!sent_cancel && cancelled && cancelled()) {
      sent_cancel = true;
      lock.unlock();
      call.Cancel();  // the call may run `done` inline: not under our lock
      lock.lock();
    }
  }
  return result;
}

std::unique_ptr<PeerCall> GrpcPeerCalls::NewCall() { return std::make_unique<GrpcCall>(); }

grpc::ClientContext& GrpcPeerCalls::Prepare(PeerCall& call,
                                            std::chrono::steady_clock::time_point deadline) const {
  grpc::ClientContext& context = static_cast<GrpcCall&>(call).context;
  credentials_.Authorize(context);
  context.set_deadline(ToSystem(deadline));
  return context;
}

std::function<void(grpc::Status)> GrpcPeerCalls::Said(const char* doing, const std::string& address,
                                                      Done done) {
  // The words of a failure are made only for one (not on every answered call).
  return [doing, address, done = std::move(done)](const grpc::Status& s) {
    done(s.ok() ? Status::OK() : FromGrpc(s, doing + address));
  };
}

void GrpcPeerCalls::StartLease(PeerCall& call, const std::string& address,
                               const v1::LeaseRequest& request, v1::LeaseReply& reply,
                               std::chrono::steady_clock::time_point deadline, Done done) {
  StubFor(address)->async()->LeaseObjects(
      &Prepare(call, deadline), &request, &reply,
      Said("leasing from the agent at ", address, std::move(done)));
}

void GrpcPeerCalls::StartRelease(PeerCall& call, const std::string& address,
                                 const v1::ReleaseRequest& request, v1::ReleaseReply& reply,
                                 std::chrono::steady_clock::time_point deadline, Done done) {
  StubFor(address)->async()->ReleaseLeases(
      &Prepare(call, deadline), &request, &reply,
      Said("releasing leases at the agent at ", address, std::move(done)));
}

std::shared_ptr<v1::Peer::Stub> GrpcPeerCalls::StubFor(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, credentials_.ChannelCredentials(), args);
  auto stub = std::shared_ptr<v1::Peer::Stub>(v1::Peer::NewStub(channel));
  stubs_[address] = stub;
  return stub;
}

}  // namespace rayfabric::agent
