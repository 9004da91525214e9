// Keeps the agent's mapping of the store warm. A page of the store's shared file that some process
// of the node already uses (a worker's put, an earlier replica) still costs this process a fault,
// or a mapping pass, the first time a replica is written there: about 0.3 ms per MiB, a third of
// a 256 MiB pull's time on a 2-core host. The warmer maps such pages into the agent in idle time
// and remembers, per page, what this process has mapped, so that a pull maps only what is new.
// It knows nothing of Ray or libfabric: segments are (address, size, fd) of a MAP_SHARED file.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "rayfabric/status.h"

namespace rayfabric::agent {

class StoreWarmer {
 public:
  struct Options {
    bool background = true;  // map pages others allocated, in idle time (else: map per pull)
    // How often the store's files are checked for new pages (one fstat each).
    std::chrono::milliseconds interval{50};
    uint64_t bytes_per_step = 512ULL << 20;  // of a file looked at in one step
    // Mapped in one step at most: ~10 ms of one core, so while it warms a store the warmer takes
    // at most ~20% of a core from whatever else runs (Ray's own transfers included).
    uint64_t map_bytes_per_step = 32ULL << 20;
  };
  // `busy`: true while the agent moves bytes (a pull or a lease in flight); the warmer checks it
  // between two 1 MiB steps and then waits, so that it takes no core from a transfer.
  StoreWarmer(Options options, std::function<bool()> busy);
  ~StoreWarmer();  // Stop()
  // The background thread ends (returns once it has) and `busy` is never asked again. Add,
  // Remove and Populate go on working (segments and their mapped pages still remembered; nothing
  // mapped in the background): the warmer's owner stops it before what `busy` asks goes, and
  // keeps it while others still call Populate.
  void Stop();
  StoreWarmer(const StoreWarmer&) = delete;
  StoreWarmer& operator=(const StoreWarmer&) = delete;

  // A mapped store segment. Only files on tmpfs (/dev/shm, Ray's default) are warmed in the
  // background: they say which pages exist (SEEK_DATA) without reading a disk, and mapping their
  // pages allocates and writes back nothing. Others (a store under /tmp on disk, hugetlbfs) are
  // only remembered as pulls map them. The fd is duplicated; the caller keeps its own. Adding a
  // base already known (the other store connection's view of the same mapping) does nothing.
  void Add(uint8_t* base, size_t size, int fd);
  // Before the segment is unmapped: returns once no step of the warmer touches it (a step under
  // way stops at its next 1 MiB, well under a millisecond).
  void Remove(uint8_t* base);
  // Maps [addr, addr + length) writable in this process (PopulateForWrite), skipping the pages
  // already mapped through this warmer; remembers them. Ranges outside known segments are
  // populated and not remembered; with background off, every range is populated in full. A page
  // whose mapping the kernel dropped since (swap-out of the store) is not mapped again here: the
  // write into it takes a fault, which costs time and nothing else.
  Status Populate(uint8_t* addr, size_t length);
  uint64_t bytes_warmed_in_background() const;

 private:
  struct Segment {
    uint8_t* base = nullptr;
    size_t size = 0;
    int fd = -1;                   // our dup, -1 where the file is not warmed in the background
    int64_t blocks_seen = -1;      // the file's allocated blocks at the last check
    uint64_t cursor = 0;           // where the next background step looks
    std::vector<uint64_t> mapped;  // one bit per page: mapped in this process
  };
  struct StepResult {
    uint64_t mapped = 0;      // bytes mapped by this step
    bool pass_ended = false;  // every segment's pass came to its end in this step
  };
  void Run();
  // Whether any file's allocated blocks changed since the last call.
  bool FileGrew();
  // One step over the segments, bounded by bytes_per_step.
  StepResult Step();
  // Pages [first, last) of `seg` not yet marked, as byte runs; marks nothing.
  std::vector<std::pair<size_t, size_t>> Unmapped(const Segment& seg, size_t first,
                                                  size_t last) const;
  void Mark(Segment& seg, size_t first, size_t last);
  void Unmark(Segment& seg, size_t first, size_t last);

  const Options options_;
  const std::function<bool()> busy_;
  const size_t page_;
  std::atomic<int> waiting_{0};  // Remove or the destructor waits for step_mu_: steps end early
  std::mutex step_mu_;     // held while the background maps pages of a segment (Remove waits on it)
  mutable std::mutex mu_;  // guards segments_, stopping_, added_, failed_, warmed_
  std::condition_variable cv_;
  std::map<uint8_t*, Segment> segments_;
  bool stopping_ = false;
  bool added_ = false;   // a segment was added: a pass over it is due
  bool failed_ = false;  // MADV_POPULATE_WRITE refused (old kernel): the background stops
  uint64_t warmed_ = 0;
  std::thread thread_;
};

}  // namespace rayfabric::agent
