#include "rayfabric/memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older C libraries lack the name
#endif

namespace rayfabric {

Status PopulateForWrite(void* addr, size_t length) {
  if (length == 0) return Status::OK();
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(addr) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(addr) + length + page - 1) & ~(page - 1);
  if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE) != 0) {
    const int err = errno;
    return Status(StatusCode::kUnavailable,
                  "madvise(MADV_POPULATE_WRITE) of " + std::to_string(end - begin) + " bytes: " +
                      std::strerror(err) + (err == EINVAL ? " (kernel older than 5.14?)" : ""));
  }
  return Status::OK();
}

}  // namespace rayfabric
