// The store warmer against a real shared-memory file (memfd, tmpfs like /dev/shm) mapped twice
// in this process: "others" write through one mapping, the warmer's mapping is the other. What
// this process has mapped is read from the kernel (/proc/self/smaps Rss of that mapping), what the
// file holds from its allocated blocks: the warmer must map what others allocated, allocate
// nothing, and stand aside while the agent is busy.
#include "agent/store_warmer.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

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

// Exact byte counts assume 4 KiB shmem pages: with shmem transparent huge pages forced on, the
// kernel allocates and maps in 2 MiB units.
bool ShmemHugePages() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::string line;
  std::getline(f, line);
  return line.find("[always]") != std::string::npos || line.find("[force]") != std::string::npos ||
         line.find("[within_size]") != std::string::npos;
}

double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

StoreWarmer::Options Fast() {
  StoreWarmer::Options o;
  o.interval = std::chrono::milliseconds(10);
  return o;
}

TEST(StoreWarmer, MapsWhatOthersAllocatedAndAllocatesNothing) {
  if (ShmemHugePages()) GTEST_SKIP() << "shmem huge pages on: counts are in 2 MiB units";
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

// Stopped (as ~Agent does before the components go), the warmer asks `busy` no more and maps
// nothing by itself, while Add, Populate and Remove go on working for whoever still holds it.
TEST(StoreWarmer, StoppedItNeverAsksAndStillPopulates) {
  if (ShmemHugePages()) GTEST_SKIP() << "shmem huge pages on: counts are in 2 MiB units";
  SharedFile file;
  std::memset(file.others, 1, 8 * kMiB);
  std::atomic<int> asked{0};
  StoreWarmer warmer(Fast(), [&] {
    ++asked;
    return false;
  });
  warmer.Stop();
  const int asked_when_stopped = asked.load();
  warmer.Add(file.ours, kFile, file.fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(asked.load(), asked_when_stopped) << "busy asked after Stop";
  EXPECT_EQ(warmer.bytes_warmed_in_background(), 0u);
  EXPECT_EQ(MappedBytes(file.ours), 0u);
  ASSERT_TRUE(warmer.Populate(file.ours, 4 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 4 * kMiB);
  warmer.Remove(file.ours);
  warmer.Stop();  // twice: nothing more
}

TEST(StoreWarmer, PopulateMapsOnceAndRemembers) {
  if (ShmemHugePages()) GTEST_SKIP() << "shmem huge pages on: counts are in 2 MiB units";
  SharedFile file;
  StoreWarmer warmer(Fast(), [] { return false; });
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
  // The background found every page of the file already marked: it mapped none itself.
  EXPECT_EQ(warmer.bytes_warmed_in_background(), 0u);
  // After Remove the segment is unknown: Populate maps everything it is given, remembers nothing.
  warmer.Remove(file.ours);
  ASSERT_EQ(madvise(file.ours, kFile, MADV_DONTNEED), 0);
  ASSERT_TRUE(warmer.Populate(file.ours + 8 * kMiB, 16 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 16 * kMiB);
}

TEST(StoreWarmer, WithoutBackgroundEveryPullMapsItsPages) {
  SharedFile file;
  std::memset(file.others, 1, 8 * kMiB);
  StoreWarmer::Options o = Fast();
  o.background = false;  // warm_store=false
  StoreWarmer warmer(o, [] { return false; });
  warmer.Add(file.ours, kFile, file.fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(MappedBytes(file.ours), 0u);  // nothing in the background
  ASSERT_TRUE(warmer.Populate(file.ours, 4 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 4 * kMiB);
  ASSERT_EQ(madvise(file.ours, kFile, MADV_DONTNEED), 0);
  ASSERT_TRUE(warmer.Populate(file.ours, 4 * kMiB).ok());  // not remembered: mapped again
  EXPECT_EQ(MappedBytes(file.ours), 4 * kMiB);
  EXPECT_EQ(warmer.bytes_warmed_in_background(), 0u);
}

TEST(StoreWarmer, OnlyTmpfsFilesAreWarmedInTheBackground) {
  // A store on a disk filesystem (Ray's under /tmp when /dev/shm is small): a writable mapping of
  // its clean pages would dirty them for writeback, so the warmer leaves them to the pulls.
  char path[] = "store-warmer-test-XXXXXX";  // in the current directory (the build tree)
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  struct statfs fs {};
  ASSERT_EQ(fstatfs(fd, &fs), 0);
  if (fs.f_type == 0x01021994) {
    close(fd);
    GTEST_SKIP() << "the current directory is on tmpfs";
  }
  ASSERT_EQ(ftruncate(fd, 16 * kMiB), 0);
  std::vector<char> ones(8 * kMiB, 1);
  ASSERT_EQ(pwrite(fd, ones.data(), ones.size(), 0), static_cast<ssize_t>(ones.size()));
  auto* ours =
      static_cast<uint8_t*>(mmap(nullptr, 16 * kMiB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(ours, MAP_FAILED);
  {
    StoreWarmer warmer(Fast(), [] { return false; });
    warmer.Add(ours, 16 * kMiB, fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(warmer.bytes_warmed_in_background(), 0u);
    EXPECT_EQ(MappedBytes(ours), 0u);
    ASSERT_TRUE(warmer.Populate(ours, 2 * kMiB).ok());  // a pull still maps its own pages
    EXPECT_EQ(MappedBytes(ours), 2 * kMiB);
    warmer.Remove(ours);
  }
  munmap(ours, 16 * kMiB);
  close(fd);
}

TEST(StoreWarmer, SegmentOfPartialLastPageEndsItsPass) {
  // Ray's clients map the store's file minus 8 bytes: the last page is partial. The pass must end
  // there (and the warmer go quiet), not look at that page again and again.
  SharedFile file;
  std::memset(file.others, 1, kFile);
  StoreWarmer warmer(Fast(), [] { return false; });
  warmer.Add(file.ours, kFile - 8, file.fd);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ASSERT_TRUE(WaitFor([&] { return warmer.bytes_warmed_in_background() == kFile - page; },
                      std::chrono::seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double cpu0 = ProcessCpuSeconds();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_LT(ProcessCpuSeconds() - cpu0, 0.1);  // one fstat per 10 ms, not a spinning pass
  EXPECT_EQ(warmer.bytes_warmed_in_background(), kFile - page);
  warmer.Remove(file.ours);
}

TEST(StoreWarmer, PopulateOutsideSegmentsStillMaps) {
  SharedFile file;
  StoreWarmer warmer(Fast(), [] { return false; });
  ASSERT_TRUE(warmer.Populate(file.ours, 2 * kMiB).ok());
  EXPECT_EQ(MappedBytes(file.ours), 2 * kMiB);
}

}  // namespace
}  // namespace rayfabric::agent
