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
  // Widen to page boundaries by pointer arithmetic (keeps the pointer's provenance).
  const uintptr_t head = reinterpret_cast<uintptr_t>(addr) & (page - 1);
  char* begin = static_cast<char*>(addr) - head;
  const size_t span = (head + length + page - 1) & ~(page - 1);
  if (madvise(begin, span, MADV_POPULATE_WRITE) != 0) {
    const int err = errno;
    return Status(StatusCode::kUnavailable,
                  "madvise(MADV_POPULATE_WRITE) of " + std::to_string(span) + " bytes: " +
                      std::strerror(err) + (err == EINVAL ? " (kernel older than 5.14?)" : ""));
  }
  return Status::OK();
}

}  // namespace rayfabric
