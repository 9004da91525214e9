// Memory helpers shared by the layers (no Ray, no libfabric here).
#pragma once

#include <cstddef>

#include "rayfabric/status.h"

namespace rayfabric {

// Maps every page of [addr, addr + length) writable in this process now, in one system call
// (MADV_POPULATE_WRITE, Linux >= 5.14), so that a transfer writing there does not take one
// page fault per 4 KiB page. The range is widened to page boundaries. Best effort: an error says
// why (older kernel, or memory that cannot be populated) and changes nothing. On a MAP_SHARED
// mapping (the plasma store's) it changes no byte either, so it may run while another thread or
// a NIC writes into the same pages; on a private mapping it would copy pages on write.
Status PopulateForWrite(void* addr, size_t length);

}  // namespace rayfabric
