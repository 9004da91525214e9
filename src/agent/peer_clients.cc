#include "agent/peer_clients.h"

#include <grpcpp/grpcpp.h>

#include <condition_variable>

namespace rayfabric::agent {
namespace {

// How often a waiting call asks whether its caller went away.
constexpr auto kCancelPoll = std::chrono::milliseconds(100);

}  // namespace

std::chrono::system_clock::time_point ToSystem(std::chrono::steady_clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             t - std::chrono::steady_clock::now());
}

grpc::Status CancellableCall(grpc::ClientContext& context, const std::function<bool()>& cancelled,
                             const std::function<void(std::function<void(grpc::Status)>)>& start) {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status result;
  start([&](grpc::Status s) {
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
      context.TryCancel();  // gRPC may run the callback inline: not under our lock
      lock.lock();
    }
  }
  return result;
}

std::shared_ptr<::rayfabric::v1::Peer::Stub> PeerClients::Get(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = stubs_.find(address);
  if (it != stubs_.end()) return it->second;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(address, credentials_.ChannelCredentials(), args);
  auto stub = std::shared_ptr<::rayfabric::v1::Peer::Stub>(::rayfabric::v1::Peer::NewStub(channel));
  stubs_[address] = stub;
  return stub;
}

}  // namespace rayfabric::agent
