// A fixed set of threads running submitted work in order (no Ray, no libfabric). The agent runs a
// Pull's per-source work on one, so that a request naming many sources cannot start a thread each.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace rayfabric {

class WorkerPool {
 public:
  explicit WorkerPool(size_t threads);
  ~WorkerPool();  // runs what was submitted, then joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Submit(std::function<void()> work);
  size_t threads() const { return threads_.size(); }

  // Waits for a group of submitted works: Add() before each Submit, the work calls Done().
  class Group {
   public:
    void Add(size_t n = 1);
    void Done();
    void Wait();

   private:
    std::mutex mu_;
    std::condition_variable cv_;
    size_t pending_ = 0;
  };

 private:
  void Run();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace rayfabric
