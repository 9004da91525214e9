// The store warmer against a real shared-memory file (memfd, tmpfs like /dev/shm) mapped twice
// in this process: "others" write through one mapping, the warmer's mapping is the other. What
// this process has mapped is read from the kernel (/proc/self/smaps Rss of that mapping), what the
// file holds from its allocated blocks: the warmer must map what others allocated, allocate
// nothing, and stand aside while the agent is busy.
#include "agent/store_warmer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

namespace rayfabric::agent {
namespace {

constexpr size_t kMiB = 1 << 20;
constexpr size_t kFile = 64 * kMiB;

// Resident bytes of the mapping that starts at `base` (the kernel's count of mapped pages).
size_t MappedBytes(const void* base) {
  std::ifstream smaps("/proc/self/smaps");
  char head[32];
  std::snprintf(head, sizeof(head), "%lx-", reinterpret_cast<unsigned long>(base));
  std::string line;
  bool in = false;
  while (std::getline(smaps, line)) {
    if (line.rfind(head, 0) == 0) {
      in = true;
    } else if (in && line.rfind("Rss:", 0) == 0) {
      std::istringstream fields(line.substr(4));
      size_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

size_t AllocatedBytes(int fd) {
  struct stat st {};
  fstat(fd, &st);
  return static_cast<size_t>(st.st_blocks) * 512;
}

struct SharedFile {
  int fd = -1;
  uint8_t* others = nullptr;  // how the node's other processes see the file
  uint8_t* ours = nullptr;    // the agent's mapping
  SharedFile() {
    fd = memfd_create("rayfabric-store-warmer-test", 0);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kFile), 0);
    others = static_cast<uint8_t*>(mmap(nullptr, kFile, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ours = static_cast<uint8_t*>(mmap(nullptr, kFile, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  }
  ~SharedFile() {
    munmap(others, kFile);
    munmap(ours, kFile);
    close(fd);
  }
};

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

StoreWarmer::Options Fast() {
  StoreWarmer::Options o;
  o.interval = std::chrono::milliseconds(10);
  return o;
}

TEST(StoreWarmer, MapsWhatOthersAllocatedAndAllocatesNothing) {
  SharedFile file;
  std::memset(file.others, 1, 8 * kMiB);              // a worker's put at the start
  std::memset(file.others + 40 * kMiB, 2, 4 * kMiB);  // and one further on
  ASSERT_EQ(AllocatedBytes(file.fd), 12 * kMiB);
  ASSERT_EQ(MappedBytes(file.ours), 0u);
  StoreWarmer warmer(Fast(), [] { return false; });
  warmer.Add(file.ours, kFile, file.fd);
  ASSERT_TRUE(WaitFor([&] { return warmer.bytes_warmed_in_background() >= 12 * kMiB; },
                      std::chrono::seconds(10)));
  EXPECT_EQ(warmer.bytes_warmed_in_background(), 12 * kMiB);
  EXPECT_EQ(MappedBytes(file.ours), 12 * kMiB);   // mapped in our mapping now
  EXPECT_EQ(AllocatedBytes(file.fd), 12 * kMiB);  // and not a page of the holes allocated
  // Later puts: the file grows, and the new pages are found with no call.
  std::memset(file.others + 20 * kMiB, 3, 2 * kMiB);
  ASSERT_TRUE(WaitFor([&] { return warmer.bytes_warmed_in_background() >= 14 * kMiB; },
                      std::chrono::seconds(10)));
  EXPECT_EQ(MappedBytes(file.ours), 14 * kMiB);
  EXPECT_EQ(file.ours[20 * kMiB], 3);  // the same bytes, seen through our mapping
  warmer.Remove(file.ours);
}

TEST(StoreWarmer, StandsAsideWhileBusy) {
  SharedFile file;
  std::memset(file.others, 1, 16 * kMiB);
  std::atomic<bool> busy{true};
  StoreWarmer warmer(Fast(), [&] { return busy.load(); });
  warmer.Add(file.ours, kFile, file.fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(warmer.bytes_warmed_in_background(), 0u);
  EXPECT_EQ(MappedBytes(file.ours), 0u);
  busy = false;
  EXPECT_TRUE(WaitFor([&] { return warmer.bytes_warmed_in_background() == 16 * kMiB; },
                      std::chrono::seconds(10)));
}

TEST(StoreWarmer, PopulateMapsOnceAndRemembers) {
  SharedFile file;
  StoreWarmer::Options o = Fast();
  o.background = false;  // warm_store=false: pulls still remember what they mapped
  StoreWarmer warmer(o, [] { return false; });
  warmer.Add(file.ours, kFile, file.fd);
  ASSERT_TRUE(warmer.Populate(file.ours + 8 * kMiB + 100, 16 * kMiB).ok());
  // Widened to pages: [8 MiB, 24 MiB + one page), allocated (a replica is written there) and
  // mapped.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(MappedBytes(file.ours), 16 * kMiB + page);
  EXPECT_EQ(AllocatedBytes(file.fd), 16 * kMiB + page);
  // Mapped pages are remembered: dropping our page tables (MADV_DONTNEED keeps a shared file's
  // bytes) and populating the same range again maps nothing, which shows it was skipped.
  ASSERT_EQ(madvise(file.ours, kFile, MADV_DONTNEED), 0);
  ASSERT_EQ(MappedBytes(file.ours), 0u);
  ASSERT_TRUE(warmer.Populate(file.ours + 8 * kMiB, 16 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 0u);
  // A range that is partly new maps only the new part.
  ASSERT_TRUE(warmer.Populate(file.ours + 20 * kMiB, 8 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 4 * kMiB - page);
  // No background thread: nothing else was mapped.
  EXPECT_EQ(warmer.bytes_warmed_in_background(), 0u);
  // After Remove the segment is unknown: Populate maps everything it is given, remembers nothing.
  warmer.Remove(file.ours);
  ASSERT_EQ(madvise(file.ours, kFile, MADV_DONTNEED), 0);
  ASSERT_TRUE(warmer.Populate(file.ours + 8 * kMiB, 16 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 16 * kMiB);
}

TEST(StoreWarmer, PopulateOutsideSegmentsStillMaps) {
  SharedFile file;
  StoreWarmer warmer(Fast(), [] { return false; });
  ASSERT_TRUE(warmer.Populate(file.ours, 2 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 2 * kMiB);
}

}  // namespace
}  // namespace rayfabric::agent
