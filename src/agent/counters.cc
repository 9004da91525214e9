#include "agent/counters.h"

namespace rayfabric::agent {
namespace {

constexpr CountInfo kCounts[] = {
    {Count::kObjectsPulled, "objects_pulled", false, "objects read by the fabric and sealed here"},
    {Count::kBytesPulled, "bytes_pulled", false, "bytes that arrived by fi_read and were sealed"},
    {Count::kPullsFailed, "pulls_failed", false,
     "objects a Pull did not seal (the caller falls back to Ray's path)"},
    {Count::kPullsStoodAside, "pulls_stood_aside", false,
     "objects being created here already (Ray's own pull): left to it"},
    {Count::kPullsAlreadyLocal, "pulls_already_local", false,
     "objects sealed here before the Pull started"},
    {Count::kPullsLeaseExpired, "pulls_lease_expired", false,
     "reads not started or not finished within their lease: nothing sealed"},
    {Count::kPullsAskedAgainForRoom, "pulls_asked_again_for_room", false,
     "Pulls that asked a source again for objects refused for want of room, once this node's "
     "leases there were given back"},
    {Count::kPullsRefusedRemote, "pulls_refused_remote", false,
     "Pulls asked over the network port (refused: Local is served on the Unix socket only)"},
    {Count::kLeasesGranted, "leases_granted", false, "leases granted to readers"},
    {Count::kLeasesReleased, "leases_released", false, "leases their readers gave back"},
    {Count::kLeasesExpired, "leases_expired", false, "leases unpinned at their TTL, unreleased"},
    {Count::kLeasesRefused, "leases_refused", false,
     "lease requests refused (not sealed here, a bound, a bad id)"},
    {Count::kLeasesSizeMismatch, "leases_size_mismatch", false,
     "leases a source described with other sizes than Ray's directory: refused"},
    {Count::kBytesLeased, "bytes_leased", false,
     "bytes of objects handed out under leases (what peers read)"},
    {Count::kRequestsRejected, "requests_rejected", false, "malformed or wrong-version requests"},
    {Count::kRequestsUnauthenticated, "requests_unauthenticated", false,
     "requests without the cluster's token, or with a wrong one"},
    {Count::kReportsRefusedRemote, "reports_refused_remote", false,
     "ReportFallbacks asked over the network port (refused)"},
    {Count::kReplicasQuarantined, "replicas_quarantined", false,
     "failed reads whose replicas were kept unsealed until the engine drained them"},
    {Count::kStoreReconnects, "store_reconnects", false,
     "store connections replaced after an error"},
    {Count::kAbandonedCreatesAborted, "abandoned_creates_aborted", false,
     "replicas created after their Pull gave up on a full store: aborted"},
    {Count::kLeasesActive, "leases_active", true, "leases peers hold on this node's objects now"},
    {Count::kPinnedBytes, "pinned_bytes", true, "bytes of objects pinned by active leases now"},
    {Count::kFabricBytesRead, "fabric_bytes_read", false,
     "bytes this node's engines read (every rail)"},
    {Count::kRegisteredRegions, "registered_regions", true,
     "memory registrations this node's engines hold now"},
    {Count::kEndpointResets, "endpoint_resets", false,
     "endpoints closed to cut off failed transfers"},
    {Count::kFallbacks, "fallbacks", false,
     "objects this node's processes left to Ray's own transfer (as they reported them)"},
};

// Each row sits at its count's index, and every count has one.
constexpr bool InEnumOrder() {
  for (size_t i = 0; i < sizeof(kCounts) / sizeof(kCounts[0]); ++i) {
    if (static_cast<size_t>(kCounts[i].count) != i) return false;
  }
  return sizeof(kCounts) / sizeof(kCounts[0]) == kNumCounts;
}
static_assert(InEnumOrder(), "kCounts must list every Count once, in enum order");

}  // namespace

const CountInfo& InfoOf(Count count) { return kCounts[static_cast<size_t>(count)]; }

CountValues Counters::Snapshot() const {
  CountValues out{};
  for (size_t i = 0; i < kNumCounts; ++i) out[i] = values_[i].load(std::memory_order_relaxed);
  return out;
}

void Counters::Into(const CountValues& values, v1::StatusReply& reply) {
  for (const CountInfo& row : kCounts) {
    v1::Counter* counter = reply.add_counters();
    counter->set_name(row.name);
    counter->set_value(values[static_cast<size_t>(row.count)]);
    counter->set_gauge(row.gauge);
  }
}

}  // namespace rayfabric::agent
