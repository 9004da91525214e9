#include "rayfabric/memory.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <vector>

namespace rayfabric {
namespace {

size_t ResidentPages(void* addr, size_t length) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((length + page - 1) / page);
  EXPECT_EQ(mincore(addr, length, resident.data()), 0);
  size_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return n;
}

TEST(PopulateForWrite, MapsEveryPageOfASharedMappingInOneCall) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t length = 256 * page;
  void* mem = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  EXPECT_EQ(ResidentPages(mem, length), 0U);
  // An unaligned range inside the mapping is widened to whole pages.
  auto* bytes = static_cast<unsigned char*>(mem);
  ASSERT_TRUE(PopulateForWrite(bytes + 100, 100 * page).ok());
  EXPECT_EQ(ResidentPages(mem, length), 101U);
  ASSERT_TRUE(PopulateForWrite(mem, length).ok());
  EXPECT_EQ(ResidentPages(mem, length), 256U);
  munmap(mem, length);
}

TEST(PopulateForWrite, SaysWhyItCouldNotPopulate) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* mem = mmap(nullptr, 4 * page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  Status s = PopulateForWrite(mem, 4 * page);  // read-only: cannot be mapped writable
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("MADV_POPULATE_WRITE"), std::string::npos) << s.message();
  munmap(mem, 4 * page);
  EXPECT_TRUE(PopulateForWrite(mem, 0).ok());  // nothing to do
}

}  // namespace
}  // namespace rayfabric
