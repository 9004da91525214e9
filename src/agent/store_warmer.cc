#include "agent/store_warmer.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "rayfabric/log.h"
#include "rayfabric/memory.h"

namespace rayfabric::agent {
namespace {
constexpr size_t kBitsPerWord = 64;
// Pages looked at between two checks of `busy`.
constexpr uint64_t kWindowBytes = 64ULL << 20;
// Pages mapped per system call: the call holds this process's mmap lock for reading, so a thread
// that must change the mappings (an mmap by malloc) waits at most for this much (~0.3 ms); `busy`
// and a waiting Remove are checked between two calls.
constexpr size_t kPopulateBytes = 1ULL << 20;
constexpr long kTmpfsMagic = 0x01021994;  // TMPFS_MAGIC (linux/magic.h)

// Only tmpfs files (/dev/shm, Ray's default) are warmed in the background: they tell which pages
// exist without touching a disk, and mapping their pages writes nothing back. On a disk file
// (Ray's store under /tmp) a writable mapping of a clean page dirties it for writeback.
bool WarmableFile(int fd) {
  struct statfs fs {};
  return fd >= 0 && ::fstatfs(fd, &fs) == 0 && static_cast<long>(fs.f_type) == kTmpfsMagic;
}
}  // namespace

StoreWarmer::StoreWarmer(Options options, std::function<bool()> busy)
    : options_(options), busy_(std::move(busy)), page_(static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
  if (options_.background) thread_ = std::thread([this] { Run(); });
}

StoreWarmer::~StoreWarmer() {
  Stop();
  for (auto& [base, seg] : segments_) {
    if (seg.fd >= 0) ::close(seg.fd);
  }
}

void StoreWarmer::Stop() {
  ++waiting_;  // a step under way ends at its next 1 MiB
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  --waiting_;
}

void StoreWarmer::Add(uint8_t* base, size_t size, int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  if (segments_.count(base) != 0) return;  // the same mapping, seen by the other connection
  Segment seg;
  seg.base = base;
  seg.size = size;
  seg.fd = options_.background && WarmableFile(fd) ? ::dup(fd) : -1;
  seg.mapped.assign((size / page_ + kBitsPerWord - 1) / kBitsPerWord, 0);
  segments_.emplace(base, std::move(seg));
  added_ = true;
  cv_.notify_all();
}

void StoreWarmer::Remove(uint8_t* base) {
  ++waiting_;                                  // the step under way ends at its next 1 MiB
  std::lock_guard<std::mutex> step(step_mu_);  // no background step is mapping its pages now
  --waiting_;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = segments_.find(base);
  if (it == segments_.end()) return;
  if (it->second.fd >= 0) ::close(it->second.fd);
  segments_.erase(it);
}

uint64_t StoreWarmer::bytes_warmed_in_background() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warmed_;
}

std::vector<std::pair<size_t, size_t>> StoreWarmer::Unmapped(const Segment& seg, size_t first,
                                                             size_t last) const {
  std::vector<std::pair<size_t, size_t>> runs;  // (offset, length) in bytes
  size_t p = first;
  while (p < last) {
    const uint64_t word = seg.mapped[p / kBitsPerWord];
    if (word == ~0ULL && p % kBitsPerWord == 0 && p + kBitsPerWord <= last) {
      p += kBitsPerWord;  // 64 mapped pages at once
      continue;
    }
    if ((word >> (p % kBitsPerWord)) & 1) {
      ++p;
      continue;
    }
    const size_t start = p;
    while (p < last && ((seg.mapped[p / kBitsPerWord] >> (p % kBitsPerWord)) & 1) == 0) ++p;
    runs.emplace_back(start * page_, (p - start) * page_);
  }
  return runs;
}

void StoreWarmer::Unmark(Segment& seg, size_t first, size_t last) {
  for (size_t p = first; p < last; ++p) {
    seg.mapped[p / kBitsPerWord] &= ~(1ULL << (p % kBitsPerWord));
  }
}

void StoreWarmer::Mark(Segment& seg, size_t first, size_t last) {
  for (size_t p = first; p < last; ++p) seg.mapped[p / kBitsPerWord] |= 1ULL << (p % kBitsPerWord);
}

Status StoreWarmer::Populate(uint8_t* addr, size_t length) {
  if (length == 0) return Status::OK();
  // warm_store=false: every pull maps its replica's pages itself, nothing remembered.
  if (!options_.background) return PopulateForWrite(addr, length);
  std::vector<std::pair<size_t, size_t>> runs;
  uint8_t* base = nullptr;
  size_t first = 0, last = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.upper_bound(addr);
    if (it != segments_.begin()) --it;
    if (it == segments_.end() || addr < it->first || addr + length > it->first + it->second.size) {
      return PopulateForWrite(addr, length);  // not a known segment: nothing to remember
    }
    const Segment& seg = it->second;
    base = seg.base;
    first = static_cast<size_t>(addr - base) / page_;
    last =
        std::min(seg.size / page_, (static_cast<size_t>(addr - base) + length + page_ - 1) / page_);
    runs = Unmapped(seg, first, last);
    // Marked before they are mapped, so that the background does not map them a second time
    // meanwhile; unmarked again if mapping fails.
    Mark(it->second, first, last);
  }
  for (const auto& [offset, bytes] : runs) {
    Status s = PopulateForWrite(base + offset, bytes);
    if (s.ok()) continue;
    // A caller's range lies inside a replica it holds: its segment cannot be unmapped meanwhile.
    std::lock_guard<std::mutex> lock(mu_);
    auto it = segments_.find(base);
    if (it != segments_.end()) {
      for (const auto& [off, len] : runs) Unmark(it->second, off / page_, (off + len) / page_);
    }
    return s;
  }
  return Status::OK();
}

StoreWarmer::StepResult StoreWarmer::Step() {
  std::lock_guard<std::mutex> step(step_mu_);
  std::vector<uint8_t*> bases;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [base, seg] : segments_) {
      if (seg.fd >= 0) bases.push_back(base);
    }
  }
  uint64_t budget = options_.bytes_per_step;
  StepResult result;
  result.pass_ended = true;
  std::vector<unsigned char> resident;
  // The segments in order, from each one's cursor, while the step's budget lasts (the store has
  // one arena; fallback files are never added).
  for (uint8_t* base : bases) {
    bool wrapped = false;
    while (budget > 0 && !wrapped) {
      if ((busy_ && busy_()) || waiting_ > 0) {  // a transfer started: it gets the cores
        result.pass_ended = false;
        return result;
      }
      std::vector<std::pair<size_t, size_t>> runs;
      size_t from = 0, to = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = segments_.find(base);
        if (it == segments_.end()) break;
        Segment& seg = it->second;
        // Skip the file's holes (pages nobody allocated) without looking at them page by page.
        off_t data = ::lseek(seg.fd, static_cast<off_t>(seg.cursor), SEEK_DATA);
        if (data < 0 && errno != ENXIO) data = static_cast<off_t>(seg.cursor);
        // Past the last whole page counts as the end (a partial last page is never warmed).
        if (data < 0 || static_cast<size_t>(data) / page_ >= seg.size / page_) {
          seg.cursor = 0;  // a pass over this segment is complete
          wrapped = true;
          continue;
        }
        from = static_cast<size_t>(data) / page_;
        to = std::min(seg.size / page_,
                      from + std::max<size_t>(1, std::min(budget, kWindowBytes) / page_));
        runs = Unmapped(seg, from, to);
        seg.cursor = to * page_;
      }
      budget -= std::min<uint64_t>(budget, (to - from) * page_);
      for (const auto& [offset, bytes] : runs) {
        if (waiting_ > 0) break;  // a segment goes, or the warmer stops: the rest does not matter
        // Only pages the file already has (resident): mapping a hole would allocate store memory.
        resident.resize(bytes / page_);
        if (::mincore(base + offset, bytes, resident.data()) != 0) continue;
        size_t p = 0;
        while (p < resident.size()) {
          if ((resident[p] & 1) == 0) {
            ++p;
            continue;
          }
          if (waiting_ > 0 || (busy_ && busy_())) {
            // Cut short: this window is looked at again from its start in the next step.
            std::lock_guard<std::mutex> lock(mu_);
            auto it = segments_.find(base);
            if (it != segments_.end()) it->second.cursor = from * page_;
            result.pass_ended = false;
            return result;
          }
          size_t q = p;
          while (q < resident.size() && (resident[q] & 1) && (q - p) * page_ < kPopulateBytes) ++q;
          Status s = PopulateForWrite(base + offset + p * page_, (q - p) * page_);
          if (!s.ok()) {
            std::lock_guard<std::mutex> lock(mu_);
            if (warmed_ == 0) {  // never worked here (a kernel older than 5.14): give up once
              RF_LOG(kInfo, "the store's pages are not mapped ahead of pulls: " << s.message());
              failed_ = true;
              return result;
            }
            RF_LOG(kDebug,
                   "store warmer: skipped " << (q - p) * page_ << " bytes: " << s.message());
            p = q;  // these pages stay unmarked; a pull maps them itself
            continue;
          }
          std::lock_guard<std::mutex> lock(mu_);
          auto it = segments_.find(base);
          if (it != segments_.end()) Mark(it->second, offset / page_ + p, offset / page_ + q);
          warmed_ += (q - p) * page_;
          result.mapped += (q - p) * page_;
          p = q;
          if (result.mapped >= options_.map_bytes_per_step) {
            // Enough for one step: the rest of this window in the next one.
            if (it != segments_.end()) it->second.cursor = (offset / page_ + q) * page_;
            result.pass_ended = false;
            return result;
          }
        }
      }
    }
    if (!wrapped) result.pass_ended = false;
  }
  return result;
}

bool StoreWarmer::FileGrew() {
  bool grew = false;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [base, seg] : segments_) {
    struct stat st {};
    if (seg.fd < 0 || ::fstat(seg.fd, &st) != 0) continue;
    const int64_t blocks = static_cast<int64_t>(st.st_blocks);
    if (blocks != seg.blocks_seen) grew = true;
    seg.blocks_seen = blocks;
  }
  return grew;
}

void StoreWarmer::Run() {
  // A page, once mapped here, stays mapped, even when the store reuses it for another object:
  // new work appears only when the file gains pages (its allocated blocks grow). So: one fstat
  // per interval, and a pass over the segments, step by step, after each growth.
  bool scanning = false;
  bool again = false;  // the file grew during a pass: one more after it
  for (;;) {
    bool added = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, options_.interval, [this] { return stopping_ || added_; });
      if (stopping_ || failed_) return;
      added = std::exchange(added_, false);
    }
    if (FileGrew() || added) (scanning ? again : scanning) = true;
    if (!scanning || (busy_ && busy_())) continue;
    if (Step().pass_ended) scanning = std::exchange(again, false);
  }
}

}  // namespace rayfabric::agent
