// Leases an agent hands to remote readers: which object is pinned for whom, until when. A lease is
// identified by a number and proven by a random token, so a reader cannot release (or extend)
// another reader's lease by guessing ids. Knows nothing of plasma or gRPC: the agent unpins what
// Release/Expire hand back.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "rayfabric/object_id.h"
#include "rayfabric/status.h"

namespace rayfabric::agent {

struct LeaseGrant {
  uint64_t id = 0;
  std::string token;  // kTokenBytes random bytes
};

struct LeasedObject {
  ObjectId object;
  uint64_t bytes = 0;     // data + metadata, for the pinned-bytes counters
  std::string requester;  // who holds it (the peer's host), for the per-requester byte bound
  uint64_t store_generation = 0;  // the store connection it is pinned on (the agent's numbering)
  uint64_t lease_id = 0;          // set by the table (Release, TakeExpired and TakeAll return it)
};

class LeaseTable {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kTokenBytes = 16;

  explicit LeaseTable(size_t max_leases,
                      uint64_t max_bytes_per_requester = std::numeric_limits<uint64_t>::max())
      : max_leases_(max_leases), max_bytes_per_requester_(max_bytes_per_requester) {}

  // ResourceExhausted when max_leases are active, or when a requester that already holds leases
  // would hold more than max_bytes_per_requester pinned (one host cannot pin the whole store; a
  // requester holding nothing may lease one object of any size).
  Result<LeaseGrant> Grant(const LeasedObject& object, std::chrono::milliseconds ttl,
                           Clock::time_point now = Clock::now());
  // The released lease's object; NotFound for an unknown or expired lease, PermissionDenied for
  // a token that does not match (the lease stays).
  Result<LeasedObject> Release(uint64_t id, const std::string& token);
  // Removes and returns every lease whose expiry is at or before `now`.
  std::vector<LeasedObject> TakeExpired(Clock::time_point now = Clock::now());
  // Removes and returns everything (shutdown).
  std::vector<LeasedObject> TakeAll();

  size_t active() const;
  uint64_t pinned_bytes() const;
  uint64_t pinned_bytes_of(const std::string& requester) const;
  // True while a lease pinned on that store connection (generation) is active.
  bool HoldsGeneration(uint64_t store_generation) const;
  // Lease expired ids are remembered (bounded) so that a late Release says "expired".
  bool RecentlyExpired(uint64_t id) const;

 private:
  struct Entry {
    LeasedObject object;
    std::string token;
    Clock::time_point expires;
  };
  mutable std::mutex mu_;
  void UnpinLocked(const LeasedObject& object);
  size_t max_leases_;
  uint64_t max_bytes_per_requester_;
  uint64_t next_id_ = 1;
  uint64_t pinned_bytes_ = 0;
  std::unordered_map<std::string, uint64_t> bytes_by_requester_;
  std::unordered_map<uint64_t, Entry> leases_;
  std::vector<uint64_t> expired_ring_;  // last few expired ids, for a clear error
  size_t expired_next_ = 0;
};

}  // namespace rayfabric::agent
