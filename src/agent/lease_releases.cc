#include "agent/agent.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <vector>

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

std::vector<Agent::ReleaseToStart> Agent::TakeQueuedLocked(const std::string* source) {
  std::vector<ReleaseToStart> taken;
  taken.reserve(releases_queued_.size());  // no push_back below throws
  auto keep = releases_queued_.begin();
  for (auto it = releases_queued_.begin(); it != releases_queued_.end(); ++it) {
    if (source != nullptr && it->source != *source) {
      if (keep != it) *keep = std::move(*it);
      ++keep;
      continue;
    }
    try {
      auto call = std::make_unique<PendingRelease>();
      call->source = it->source;
      call->request = std::move(it->request);
      // Made here, under the lock: ~Agent may cancel any call in flight, started yet or not.
      call->call = peers_->NewCall();
      const uint64_t key = next_release_++;
      PendingRelease* started = call.get();
      releases_in_flight_[key] = std::move(call);  // owned by the table from here
      taken.push_back({key, started});
    } catch (const std::exception& e) {
      RF_LOG(kWarn, "releasing leases at " << it->source << " not started (" << e.what()
                                           << "): they expire by themselves");
    }
  }
  releases_queued_.erase(keep, releases_queued_.end());
  return taken;
}

void Agent::StartQueuedReleases(const std::string& source) {
  std::vector<ReleaseToStart> mine;
  std::vector<std::unique_ptr<PendingRelease>> answered;  // freed here, outside gRPC's callback
  {
    std::lock_guard<std::mutex> lock(release_mu_);
    answered = std::move(releases_answered_);
    releases_answered_.clear();
    mine = TakeQueuedLocked(&source);
  }
  answered.clear();
  StartReleases(mine);
}

bool Agent::ReleasesPendingTo(const std::string& source) {
  std::lock_guard<std::mutex> lock(release_mu_);
  return std::any_of(releases_in_flight_.begin(), releases_in_flight_.end(),
                     [&](const auto& entry) { return entry.second->source == source; }) ||
         std::any_of(releases_queued_.begin(), releases_queued_.end(),
                     [&](const QueuedRelease& q) { return q.source == source; });
}

bool Agent::WaitForReleasesTo(const std::string& source, const PullBounds& bounds) {
  StartQueuedReleases(source);
  // Those on their way now, not those later Pulls start meanwhile; until a lease could still be
  // asked and read within the Pull's deadline.
  const Clock::time_point until =
      std::min(bounds.deadline - kLeaseMargin, Clock::now() + kPeerRpcTimeout);
  std::unique_lock<std::mutex> lock(release_mu_);
  std::vector<uint64_t> awaited;
  for (const auto& [key, call] : releases_in_flight_) {
    if (call->source == source) awaited.push_back(key);
  }
  const auto answered = [&] {
    return std::none_of(awaited.begin(), awaited.end(),
                        [&](uint64_t key) { return releases_in_flight_.count(key) > 0; });
  };
  // In steps, so that a caller that went away is noticed.
  for (;;) {
    if (answered()) return Clock::now() < until;
    if (Clock::now() >= until) return false;
    release_cv_.wait_until(lock, std::min(until, Clock::now() + std::chrono::milliseconds(100)),
                           answered);
    lock.unlock();
    const bool cancelled = bounds.Cancelled();
    lock.lock();
    if (cancelled) return false;
  }
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
    // In flight from now on (a Pull that asks whether releases are pending sees them).
    std::vector<ReleaseToStart> to_start = TakeQueuedLocked(nullptr);
    lock.unlock();
    answered.clear();
    if (batched) set_policy(SCHED_OTHER);
    StartReleases(to_start);
    if (batched) set_policy(SCHED_BATCH);
    lock.lock();
  }
}

void Agent::StartReleases(const std::vector<ReleaseToStart>& calls) {
  for (const auto& [key, pending] : calls) {
    try {
      // Not under release_mu_: the call may run its `done` (which takes it) inline.
      peers_->StartRelease(*pending->call, pending->source, pending->request, pending->reply,
                           Clock::now() + kPeerRpcTimeout,
                           [this, key = key, pending = pending](const Status& released) {
                             if (!released.ok()) {
                               RF_LOG(kWarn, pending->request.leases_size()
                                                 << " leases not released: " << released
                                                 << "; they expire by themselves");
                             }
                             RetireRelease(key);
                           });
    } catch (const std::exception& e) {
      RF_LOG(kWarn, "releasing " << pending->request.leases_size() << " leases at "
                                 << pending->source << " not started (" << e.what()
                                 << "): they expire by themselves");
      // No callback will come, and neither the exit nor a Pull may wait for one.
      RetireRelease(key);
    }
  }
}

void Agent::RetireRelease(uint64_t key) {
  std::lock_guard<std::mutex> lock(release_mu_);
  auto it = releases_in_flight_.find(key);
  if (it == releases_in_flight_.end()) return;          // retired already (its start threw)
  releases_answered_.push_back(std::move(it->second));  // freed outside gRPC's callback
  releases_in_flight_.erase(it);
  release_cv_.notify_all();  // the destructor or a Pull may be waiting for it
}

void Agent::ReleaseBeforeLeasingAgain(const std::string& source, const v1::ReleaseRequest& release,
                                      const PullBounds& bounds) {
  StartQueuedReleases(source);
  std::unique_ptr<PeerCall> call = peers_->NewCall();
  v1::ReleaseReply reply;
  const Status released = AwaitPeerCall(
      *call, [&bounds] { return bounds.Cancelled(); },
      [&](PeerCalls::Done done) {
        peers_->StartRelease(*call, source, release, reply,
                             std::min(bounds.deadline, Clock::now() + kPeerRpcTimeout),
                             std::move(done));
      });
  if (!released.ok()) {
    RF_LOG(kWarn, "releasing " << release.leases_size()
                               << " leases before leasing them again failed (" << released
                               << "): they expire by themselves");
  }
}

}  // namespace rayfabric::agent
