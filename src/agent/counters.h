// The agent's counters and gauges, as the status names them (StatusReply.counters): one table says
// what each one counts; the totals the agent keeps itself are atomics here, the others (gauges, the
// engines' totals) are read from their owners when the status is asked.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "agent.pb.h"

namespace rayfabric::agent {

enum class Count : uint8_t {
  kObjectsPulled,
  kBytesPulled,
  kPullsFailed,
  kPullsStoodAside,
  kPullsAlreadyLocal,
  kPullsLeaseExpired,
  kPullsAskedAgainForRoom,
  kPullsRefusedRemote,
  kLeasesGranted,
  kLeasesReleased,
  kLeasesExpired,
  kLeasesRefused,
  kLeasesSizeMismatch,
  kBytesLeased,
  kRequestsRejected,
  kRequestsUnauthenticated,
  kReportsRefusedRemote,
  kReplicasQuarantined,
  kStoreReconnects,
  kAbandonedCreatesAborted,
  // Read from their owners when the status is asked (never Add-ed).
  kLeasesActive,
  kPinnedBytes,
  kFabricBytesRead,
  kRegisteredRegions,
  kEndpointResets,
  kFallbacks,
  kNumCounts,  // not a counter
};

inline constexpr size_t kNumCounts = static_cast<size_t>(Count::kNumCounts);

struct CountInfo {
  Count count;
  const char* name;  // the status's name for it (stable: tools and dashboards read it)
  bool gauge;        // a value now, not a total since the agent started
  const char* doc;
};

// The row of `count` (every Count has one, in enum order: checked at compile time in counters.cc).
const CountInfo& InfoOf(Count count);

// Every count's value, for one status.
using CountValues = std::array<uint64_t, kNumCounts>;

class Counters {
 public:
  void Add(Count count, uint64_t n = 1) {
    values_[static_cast<size_t>(count)].fetch_add(n, std::memory_order_relaxed);
  }
  uint64_t Get(Count count) const {
    return values_[static_cast<size_t>(count)].load(std::memory_order_relaxed);
  }
  // The totals kept here; the owners' values are 0 until the caller sets them.
  CountValues Snapshot() const;
  // Every count into `reply.counters`, by name, in the table's order.
  static void Into(const CountValues& values, v1::StatusReply& reply);

 private:
  std::array<std::atomic<uint64_t>, kNumCounts> values_{};
};

}  // namespace rayfabric::agent
