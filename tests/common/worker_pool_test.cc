// WorkerPool: a bounded number of threads runs any number of submitted works, all of them.
#include "rayfabric/worker_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>

namespace rayfabric {
namespace {

TEST(WorkerPool, RunsEveryWorkOnAtMostItsThreads) {
  WorkerPool pool(3);
  std::atomic<int> running{0}, most{0}, done{0};
  std::mutex mu;
  std::set<std::thread::id> seen;
  WorkerPool::Group group;
  for (int i = 0; i < 40; ++i) {
    group.Add();
    pool.Submit([&] {
      int now = ++running;
      int prev = most.load();
      while (now > prev && !most.compare_exchange_weak(prev, now)) {
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        seen.insert(std::this_thread::get_id());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      --running;
      ++done;
      group.Done();
    });
  }
  group.Wait();
  EXPECT_EQ(done.load(), 40);
  EXPECT_LE(most.load(), 3);
  EXPECT_LE(seen.size(), 3u);
}

TEST(WorkerPool, DestructorFinishesQueuedWork) {
  std::atomic<int> done{0};
  {
    WorkerPool pool(1);
    for (int i = 0; i < 10; ++i) pool.Submit([&] { ++done; });
  }
  EXPECT_EQ(done.load(), 10);
}

}  // namespace
}  // namespace rayfabric
