#include "agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <optional>

#include "rayfabric/log.h"

// A Pull's leases given back to their sources: queued by the Pull, started by the releaser thread
// (off the Pull's critical path), or at once where the same objects are leased again next.
namespace rayfabric::agent {

using Clock = std::chrono::steady_clock;

void Agent::QueueRelease(const std::string& source, v1::ReleaseRequest request) {
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    if (stopping_releases_) {
      RF_LOG(kWarn, "stopping: " << request.leases_size() << " leases at " << source
                                 << " not released: they expire by themselves");
      return;
    }
    releases_queued_.push_back({source, std::move(request)});
  }
  release_queue_cv_.notify_one();
}

void Agent::StartQueuedReleases(const std::string& source) {
  std::vector<QueuedRelease> mine;
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    auto theirs = std::stable_partition(releases_queued_.begin(), releases_queued_.end(),
                                        [&](const QueuedRelease& q) { return q.source != source; });
    std::move(theirs, releases_queued_.end(), std::back_inserter(mine));
    releases_queued_.erase(theirs, releases_queued_.end());
  }
  if (!mine.empty()) StartReleases(std::move(mine));
}

void Agent::ReleaseLoop() {
  // Waits as SCHED_BATCH (same share of the CPU, no wake-up preemption): woken by a Pull that is
  // about to answer, it lets that answer go out first. It starts the calls with the default
  // policy, which threads that gRPC may create from it then inherit.
  const int policy = sched_getscheduler(0);
  sched_param param{};
  auto set_policy = [&param](int to) { return sched_setscheduler(0, to, &param) == 0; };
  const bool batched = policy == SCHED_OTHER && set_policy(SCHED_BATCH);
  std::unique_lock<std::mutex> lock(release_mu_);
  for (;;) {
    release_queue_cv_.wait(lock,
                           [this] { return !releases_queued_.empty() || stopping_releases_; });
    if (releases_queued_.empty()) return;  // stopping, and every queued release started
    // Answered calls are freed here, never inside gRPC's callback.
    std::vector<std::unique_ptr<PendingRelease>> answered = std::move(releases_answered_);
    releases_answered_.clear();
    std::vector<QueuedRelease> queued = std::move(releases_queued_);
    releases_queued_.clear();
    lock.unlock();
    answered.clear();
    if (batched) set_policy(SCHED_OTHER);
    StartReleases(std::move(queued));
    if (batched) set_policy(SCHED_BATCH);
    lock.lock();
  }
}

void Agent::StartReleases(std::vector<QueuedRelease> queued) {
  for (QueuedRelease& q : queued) {
    const int leases = q.request.leases_size();
    const std::string source = q.source;
    std::optional<uint64_t> key;
    try {
      auto stub = peers_.Get(source);
      auto pending = std::make_unique<PendingRelease>();
      pending->source = std::move(q.source);
      pending->request = std::move(q.request);
      pending->context.set_deadline(ToSystem(Clock::now() + kPeerRpcTimeout));
      peers_.Prepare(pending->context);
      PendingRelease* call = pending.get();
      {
        std::lock_guard<std::mutex> lock(release_mu_);
        key = next_release_++;
        releases_in_flight_[*key] = std::move(pending);
      }
      // Not under release_mu_: gRPC may run the callback (which takes it) inline.
      stub->async()->ReleaseLeases(
          &call->context, &call->request, &call->reply,
          [this, key = *key, call](const grpc::Status& r) {
            if (!r.ok()) {
              RF_LOG(kWarn, "releasing " << call->request.leases_size() << " leases at "
                                         << call->source << " failed (" << r.error_message()
                                         << "): they expire by themselves");
            }
            std::lock_guard<std::mutex> lock(release_mu_);
            auto it = releases_in_flight_.find(key);
            if (it == releases_in_flight_.end()) return;  // its start threw: given up there
            releases_answered_.push_back(std::move(it->second));
            releases_in_flight_.erase(it);
            release_cv_.notify_all();  // the destructor may be waiting for the last one
          });
    } catch (const std::exception& e) {
      RF_LOG(kWarn, "releasing " << leases << " leases at " << source << " not started ("
                                 << e.what() << "): they expire by themselves");
      if (key.has_value()) {
        // Not in flight: no callback will come, and the exit must not wait for one.
        std::lock_guard<std::mutex> lock(release_mu_);
        auto it = releases_in_flight_.find(*key);
        if (it != releases_in_flight_.end()) {
          releases_answered_.push_back(std::move(it->second));
          releases_in_flight_.erase(it);
        }
        release_cv_.notify_all();
      }
    }
  }
}

void Agent::ReleaseBeforeLeasingAgain(const std::string& source, const v1::ReleaseRequest& release,
                                      const PullBounds& bounds) {
  StartQueuedReleases(source);
  grpc::ClientContext context;
  peers_.Prepare(context);
  context.set_deadline(ToSystem(std::min(bounds.deadline, Clock::now() + kPeerRpcTimeout)));
  v1::ReleaseReply reply;
  grpc::Status rpc = CancellableCall(
      context, [&bounds] { return bounds.Cancelled(); },
      [&](std::function<void(grpc::Status)> done) {
        peers_.Get(source)->async()->ReleaseLeases(&context, &release, &reply, std::move(done));
      });
  if (!rpc.ok()) {
    RF_LOG(kWarn, "releasing " << release.leases_size() << " leases at " << source
                               << " before leasing them again failed (" << rpc.error_message()
                               << "): they expire by themselves");
  }
}

}  // namespace rayfabric::agent
