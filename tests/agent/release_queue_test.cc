// The release queue (src/agent/release_queue.h) on its own: its calls go to a peer that holds
// each release until the test answers it, or until it is cancelled. That is the one thing no real
// peer does on demand (answer this call now, that one never); the queue's ordering, waits,
// bounds and shutdown are what is under test.
#include "agent/release_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <set>
#include <thread>

namespace rayfabric::agent {
namespace {

namespace v1 = ::rayfabric::v1;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

class HeldPeerCalls final : public PeerCalls {
 public:
  class Call final : public PeerCall {
   public:
    explicit Call(HeldPeerCalls& owner) : owner_(owner) {}
    void Cancel() override { owner_.CancelCall(this); }

   private:
    HeldPeerCalls& owner_;
  };
  struct Started {
    std::string source;
    int leases;
  };

  std::unique_ptr<PeerCall> NewCall() override { return std::make_unique<Call>(*this); }
  void StartLease(PeerCall&, const std::string&, const v1::LeaseRequest&, v1::LeaseReply&,
                  Clock::time_point, Done done) override {
    ADD_FAILURE() << "the release queue asked for a lease";
    done(Internal("not a lease"));
  }
  void StartRelease(PeerCall& call, const std::string& address, const v1::ReleaseRequest& request,
                    v1::ReleaseReply&, Clock::time_point, Done done) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_.push_back({address, request.leases_size()});
      cv_.notify_all();
      if (cancelled_before_start_.erase(&call) == 0) {
        held_.push_back({&call, address, request.leases_size(), std::move(done)});
        return;
      }
    }
    // Cancelled before it started: it ends at once, as a gRPC call does.
    ++cancelled_;
    done(Aborted("releasing leases: cancelled"));
  }

  // Answers the oldest held release to `source` (of `leases` leases, if given; false: none held).
  bool Answer(const std::string& source, int leases = -1) {
    Done done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& h) {
        return h.source == source && (leases < 0 || h.leases == leases);
      });
      if (it == held_.end()) return false;
      done = std::move(it->done);
      held_.erase(it);
    }
    done(Status::OK());
    return true;
  }
  // Waits (at most 2 s) until `n` releases were started in all.
  std::vector<Started> StartedAtLeast(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(2), [&] { return started_.size() >= n; });
    return started_;
  }
  size_t started() {
    std::lock_guard<std::mutex> lock(mu_);
    return started_.size();
  }
  int cancelled() const { return cancelled_.load(); }

 private:
  struct Held {
    PeerCall* call;
    std::string source;
    int leases;
    Done done;
  };
  void CancelCall(PeerCall* call) {
    Done done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it =
          std::find_if(held_.begin(), held_.end(), [&](const Held& h) { return h.call == call; });
      if (it == held_.end()) {
        // Not started yet (or answered already: then it never starts again either).
        cancelled_before_start_.insert(call);
        return;
      }
      done = std::move(it->done);
      held_.erase(it);
    }
    ++cancelled_;
    done(Aborted("releasing leases: cancelled"));  // inline, as gRPC may
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Held> held_;
  std::set<PeerCall*> cancelled_before_start_;
  std::vector<Started> started_;
  std::atomic<int> cancelled_{0};
};

v1::ReleaseRequest ReleaseOf(int leases) {
  v1::ReleaseRequest request;
  for (int i = 0; i < leases; ++i) request.add_leases()->set_lease_id(static_cast<uint64_t>(i + 1));
  return request;
}

// Waits (at most a second) until `done` holds.
bool Eventually(const std::function<bool()>& done) {
  const auto until = Clock::now() + std::chrono::seconds(1);
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(2));
  }
  return true;
}

// A queued release is started by the queue's own thread; it is pending until its source answers,
// each source on its own.
TEST(ReleaseQueue, StartsQueuedReleasesOnItsOwnThreadAndTracksEachSource) {
  HeldPeerCalls peers;
  ReleaseQueue queue(peers);
  queue.Queue("a", ReleaseOf(1));
  queue.Queue("b", ReleaseOf(2));
  const auto started = peers.StartedAtLeast(2);
  ASSERT_EQ(started.size(), 2u) << "queued releases were not started";
  EXPECT_TRUE(queue.PendingTo("a") && queue.PendingTo("b"));
  EXPECT_FALSE(queue.PendingTo("c"));
  ASSERT_TRUE(peers.Answer("a"));
  EXPECT_TRUE(Eventually([&] { return !queue.PendingTo("a"); }));
  EXPECT_TRUE(queue.PendingTo("b")) << "an answer from one source settled another's";
  ASSERT_TRUE(peers.Answer("b"));
  EXPECT_TRUE(Eventually([&] { return !queue.PendingTo("b"); }));
}

// A wait for the releases to a source ends when those on their way are answered, at its bound,
// or as soon as its caller goes away.
TEST(ReleaseQueue, WaitsForTheReleasesOnTheirWayWithinABound) {
  HeldPeerCalls peers;
  ReleaseQueue queue(peers);
  queue.Queue("a", ReleaseOf(1));
  ASSERT_EQ(peers.StartedAtLeast(1).size(), 1u);
  Clock::time_point t0 = Clock::now();
  std::thread answerer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    peers.Answer("a");
  });
  EXPECT_TRUE(queue.WaitForReleasesTo("a", Clock::now() + std::chrono::seconds(5), nullptr));
  EXPECT_GE(Clock::now() - t0, milliseconds(90));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  answerer.join();

  queue.Queue("a", ReleaseOf(1));  // never answered
  t0 = Clock::now();
  EXPECT_FALSE(queue.WaitForReleasesTo("a", Clock::now() + milliseconds(200), nullptr));
  EXPECT_GE(Clock::now() - t0, milliseconds(190));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));

  t0 = Clock::now();
  EXPECT_FALSE(queue.WaitForReleasesTo("a", Clock::now() + std::chrono::seconds(30),
                                       [t0] { return Clock::now() - t0 > milliseconds(150); }));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(1)) << "a caller that went away still waited";
  // Nothing on its way to "b": no wait at all.
  t0 = Clock::now();
  EXPECT_TRUE(queue.WaitForReleasesTo("b", Clock::now() + std::chrono::seconds(5), nullptr));
  EXPECT_LT(Clock::now() - t0, milliseconds(500));
  peers.Answer("a");
}

// A release made now (the same objects are leased again next) starts those queued for the same
// source too, and waits for its own answer only.
TEST(ReleaseQueue, AReleaseMadeNowWaitsForItsOwnAnswer) {
  HeldPeerCalls peers;
  ReleaseQueue queue(peers);
  queue.Queue("a", ReleaseOf(1));
  std::atomic<bool> returned{false};
  std::thread now([&] {
    queue.ReleaseNow("a", ReleaseOf(3), Clock::now() + std::chrono::seconds(5), nullptr);
    returned = true;
  });
  EXPECT_EQ(peers.StartedAtLeast(2).size(), 2u);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_FALSE(returned) << "ReleaseNow returned before its answer";
  EXPECT_TRUE(peers.Answer("a", 3));  // the one made now; the queued one still held
  EXPECT_TRUE(Eventually([&] { return returned.load(); }))
      << "ReleaseNow waited for another answer";
  EXPECT_TRUE(queue.PendingTo("a")) << "the queued release is still unanswered";
  EXPECT_TRUE(peers.Answer("a", 1));
  EXPECT_TRUE(Eventually([&] { return !queue.PendingTo("a"); }));
  peers.Answer("a", 3);  // (had ReleaseNow's call not been answered above: it waits no more)
  now.join();
}

// Stopping: what is queued is still started; what is unanswered after the drain is cancelled,
// and its end awaited; nothing is queued afterwards.
TEST(ReleaseQueue, StopCancelsWhatIsUnansweredAfterTheDrain) {
  HeldPeerCalls peers;
  ReleaseQueue queue(peers);
  queue.Queue("a", ReleaseOf(2));
  queue.Queue("b", ReleaseOf(1));
  ASSERT_EQ(peers.StartedAtLeast(2).size(), 2u);
  ASSERT_TRUE(peers.Answer("b"));
  const Clock::time_point t0 = Clock::now();
  queue.Stop(milliseconds(200));
  EXPECT_GE(Clock::now() - t0, milliseconds(190));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_EQ(peers.cancelled(), 1) << "the unanswered release was not cancelled";
  EXPECT_FALSE(queue.PendingTo("a"));
  queue.Queue("a", ReleaseOf(1));
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(peers.started(), 2u) << "a release queued after Stop was started";
  queue.Stop();  // idempotent
}

// A peer that never answers and a queue stopped while it holds twenty calls: Stop returns soon
// after its drain, every call cancelled and ended.
TEST(ReleaseQueue, StopEndsEveryCallItCancels) {
  HeldPeerCalls peers;
  auto queue = std::make_unique<ReleaseQueue>(peers);
  for (int i = 0; i < 20; ++i) queue->Queue("a", ReleaseOf(1));
  const Clock::time_point t0 = Clock::now();
  queue->Stop(milliseconds(100));
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(2));
  EXPECT_FALSE(queue->PendingTo("a"));
  EXPECT_EQ(peers.cancelled(), static_cast<int>(peers.started()));
  queue.reset();
}

}  // namespace
}  // namespace rayfabric::agent
