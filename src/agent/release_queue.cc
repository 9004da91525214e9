#include "agent/release_queue.h"

#include <sched.h>

#include <algorithm>

#include "rayfabric/log.h"

namespace rayfabric::agent {

namespace v1 = ::rayfabric::v1;

ReleaseQueue::ReleaseQueue(PeerCalls& peers) : peers_(peers) {
  releaser_ = std::thread([this] { Loop(); });
}

ReleaseQueue::~ReleaseQueue() { Stop(); }

void ReleaseQueue::Queue(const std::string& source, v1::ReleaseRequest request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      RF_LOG(kWarn, "stopping: " << request.leases_size() << " leases at " << source
                                 << " not released: they expire by themselves");
      return;
    }
    queued_.push_back({source, std::move(request)});
  }
  queued_cv_.notify_one();
}

std::vector<ReleaseQueue::ToStart> ReleaseQueue::TakeQueuedLocked(const std::string* source) {
  std::vector<ToStart> taken;
  taken.reserve(queued_.size());  // no push_back below throws
  auto keep = queued_.begin();
  for (auto it = queued_.begin(); it != queued_.end(); ++it) {
    if (source != nullptr && it->source != *source) {
      if (keep != it) *keep = std::move(*it);
      ++keep;
      continue;
    }
    try {
      auto pending = std::make_unique<Pending>();
      pending->source = it->source;
      pending->request = std::move(it->request);
      // Made here, under the lock: Stop may cancel any call in flight, started yet or not.
      pending->call = peers_.NewCall();
      const uint64_t key = next_key_++;
      Pending* started = pending.get();
      in_flight_[key] = std::move(pending);  // owned by the table from here
      taken.push_back({key, started});
    } catch (const std::exception& e) {
      RF_LOG(kWarn, "releasing leases at " << it->source << " not started (" << e.what()
                                           << "): they expire by themselves");
    }
  }
  queued_.erase(keep, queued_.end());
  return taken;
}

void ReleaseQueue::StartQueuedTo(const std::string& source) {
  std::vector<ToStart> mine;
  std::vector<std::unique_ptr<Pending>> answered;  // freed here, outside a call's `done`
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {  // (once stopping, only Stop frees them: it may still be cancelling them)
      answered = std::move(answered_);
      answered_.clear();
    }
    mine = TakeQueuedLocked(&source);
  }
  answered.clear();
  Start(mine);
}

bool ReleaseQueue::PendingTo(const std::string& source) {
  std::lock_guard<std::mutex> lock(mu_);
  return std::any_of(in_flight_.begin(), in_flight_.end(),
                     [&](const auto& entry) { return entry.second->source == source; }) ||
         std::any_of(queued_.begin(), queued_.end(),
                     [&](const Queued& q) { return q.source == source; });
}

bool ReleaseQueue::WaitForReleasesTo(const std::string& source, Clock::time_point until,
                                     const std::function<bool()>& cancelled) {
  StartQueuedTo(source);
  std::unique_lock<std::mutex> lock(mu_);
  std::vector<uint64_t> awaited;
  for (const auto& [key, pending] : in_flight_) {
    if (pending->source == source) awaited.push_back(key);
  }
  const auto answered = [&] {
    return std::none_of(awaited.begin(), awaited.end(),
                        [&](uint64_t key) { return in_flight_.count(key) > 0; });
  };
  // In steps, so that a caller that went away is noticed.
  for (;;) {
    if (answered()) return Clock::now() < until;
    if (Clock::now() >= until) return false;
    answered_cv_.wait_until(lock, std::min(until, Clock::now() + std::chrono::milliseconds(100)),
                            answered);
    lock.unlock();
    const bool gone = cancelled && cancelled();
    lock.lock();
    if (gone) return false;
  }
}

void ReleaseQueue::Loop() {
  // Waits as SCHED_BATCH (same share of the CPU, no wake-up preemption): woken by a Pull that is
  // about to answer, it lets that answer go out first. It starts the calls with the default
  // policy, which threads that gRPC may create from it then inherit.
  const int policy = sched_getscheduler(0);
  sched_param param{};
  auto set_policy = [&param](int to) { return sched_setscheduler(0, to, &param) == 0; };
  const bool batched = policy == SCHED_OTHER && set_policy(SCHED_BATCH);
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    queued_cv_.wait(lock, [this] { return !queued_.empty() || stopping_; });
    if (queued_.empty()) return;  // stopping, and every queued release started
    // Answered calls are freed here, never inside a call's `done`.
    std::vector<std::unique_ptr<Pending>> answered = std::move(answered_);
    answered_.clear();
    // In flight from now on (a Pull that asks whether releases are pending sees them).
    std::vector<ToStart> to_start = TakeQueuedLocked(nullptr);
    lock.unlock();
    answered.clear();
    if (batched) set_policy(SCHED_OTHER);
    Start(to_start);
    if (batched) set_policy(SCHED_BATCH);
    lock.lock();
  }
}

void ReleaseQueue::Start(const std::vector<ToStart>& calls) {
  for (const auto& [key, pending] : calls) {
    try {
      // Not under mu_: the call may run its `done` (which takes it) inline.
      peers_.StartRelease(*pending->call, pending->source, pending->request, pending->reply,
                          Clock::now() + kPeerRpcTimeout,
                          [this, key = key, pending = pending](const Status& released) {
                            if (!released.ok()) {
                              RF_LOG(kWarn, pending->request.leases_size()
                                                << " leases not released: " << released
                                                << "; they expire by themselves");
                            }
                            Retire(key);
                          });
    } catch (const std::exception& e) {
      RF_LOG(kWarn, "releasing " << pending->request.leases_size() << " leases at "
                                 << pending->source << " not started (" << e.what()
                                 << "): they expire by themselves");
      // No `done` will come, and neither Stop nor a Pull may wait for one.
      Retire(key);
    }
  }
}

void ReleaseQueue::Retire(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = in_flight_.find(key);
  if (it == in_flight_.end()) return;          // retired already (its start threw)
  answered_.push_back(std::move(it->second));  // freed outside the call's `done`
  in_flight_.erase(it);
  answered_cv_.notify_all();  // Stop or a Pull may be waiting for it
}

void ReleaseQueue::ReleaseNow(const std::string& source, const v1::ReleaseRequest& request,
                              Clock::time_point deadline, const std::function<bool()>& cancelled) {
  StartQueuedTo(source);
  std::unique_ptr<PeerCall> call = peers_.NewCall();
  v1::ReleaseReply reply;
  const Status released = AwaitPeerCall(*call, cancelled, [&](PeerCalls::Done done) {
    peers_.StartRelease(*call, source, request, reply,
                        std::min(deadline, Clock::now() + kPeerRpcTimeout), std::move(done));
  });
  if (!released.ok()) {
    RF_LOG(kWarn, "releasing " << request.leases_size()
                               << " leases before leasing them again failed (" << released
                               << "): they expire by themselves");
  }
}

void ReleaseQueue::Stop(std::chrono::milliseconds drain) {
  {
    // No release is queued from now on; the releaser starts those queued already, and ends.
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = stopping_ = true;
  }
  queued_cv_.notify_all();
  if (releaser_.joinable()) releaser_.join();
  auto unanswered = [this] { return in_flight_.empty(); };
  std::vector<Pending*> to_cancel;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!answered_cv_.wait_for(lock, drain, unanswered)) {
      int leases = 0;
      for (const auto& [key, pending] : in_flight_) {
        leases += pending->request.leases_size();
        to_cancel.push_back(pending.get());
      }
      RF_LOG(kWarn, "stopping: " << leases << " leases in " << in_flight_.size()
                                 << " release requests unanswered after the shutdown bound: "
                                    "cancelled, they expire at their sources by themselves");
    }
  }
  // Outside the lock: a cancelled call may run its `done` inline, and that takes the lock. The
  // calls stay allocated (answered ones move to answered_, freed only below).
  for (Pending* pending : to_cancel) pending->call->Cancel();
  std::unique_lock<std::mutex> lock(mu_);
  answered_cv_.wait(lock, unanswered);  // a cancelled call still runs its `done`, at once
  answered_.clear();
}

}  // namespace rayfabric::agent
