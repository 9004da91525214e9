#include "agent/lease_table.h"

#include <algorithm>
#include <random>

namespace rayfabric::agent {
namespace {

constexpr size_t kExpiredRing = 4096;

std::string RandomToken() {
  // std::random_device reads the kernel's CSPRNG on Linux (getrandom / /dev/urandom).
  static thread_local std::random_device device;
  std::string token(LeaseTable::kTokenBytes, '\0');
  for (size_t i = 0; i < token.size(); i += 4) {
    uint32_t r = device();
    for (size_t j = 0; j < 4 && i + j < token.size(); ++j)
      token[i + j] = static_cast<char>(r >> (8 * j));
  }
  return token;
}

bool ConstantTimeEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

Result<LeaseGrant> LeaseTable::Grant(const LeasedObject& object, std::chrono::milliseconds ttl,
                                     Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (leases_.size() >= max_leases_) {
    return ResourceExhausted("this agent already holds " + std::to_string(leases_.size()) +
                             " leases (max_leases / RAYFABRIC_MAX_LEASES); release some or retry");
  }
  uint64_t& held = bytes_by_requester_[object.requester];
  // A requester that holds nothing may always lease one object, however large (else an object
  // above the bound could never move); beyond that, the bound holds.
  if (held > 0 &&
      (object.bytes > max_bytes_per_requester_ || held > max_bytes_per_requester_ - object.bytes)) {
    const uint64_t already = held;
    if (held == 0) bytes_by_requester_.erase(object.requester);
    return ResourceExhausted("requester " + object.requester + " already holds " +
                             std::to_string(already) + " bytes leased here; " +
                             std::to_string(object.bytes) + " more would pass the bound of " +
                             std::to_string(max_bytes_per_requester_) +
                             " per requester (RAYFABRIC_MAX_LEASE_BYTES_PER_PEER): release "
                             "leases first");
  }
  LeaseGrant grant{next_id_++, RandomToken()};
  LeasedObject stored = object;
  stored.lease_id = grant.id;
  leases_.emplace(grant.id, Entry{stored, grant.token, now + ttl});
  pinned_bytes_ += object.bytes;
  held += object.bytes;
  return grant;
}

void LeaseTable::UnpinLocked(const LeasedObject& object) {
  pinned_bytes_ -= object.bytes;
  auto it = bytes_by_requester_.find(object.requester);
  if (it != bytes_by_requester_.end()) {
    it->second -= object.bytes;
    if (it->second == 0) bytes_by_requester_.erase(it);
  }
}

Result<LeasedObject> LeaseTable::Release(uint64_t id, const std::string& token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) {
    const bool expired =
        std::find(expired_ring_.begin(), expired_ring_.end(), id) != expired_ring_.end();
    return NotFound("lease " + std::to_string(id) +
                    (expired ? " expired before it was released (its object was unpinned); "
                               "read faster or ask for a longer ttl_ms"
                             : " is unknown to this agent (never granted, already released, "
                               "or granted by an agent that restarted)"));
  }
  if (!ConstantTimeEqual(it->second.token, token)) {
    return PermissionDenied("lease " + std::to_string(id) +
                            ": the token does not match the one granted (forged or corrupted "
                            "lease); the lease stays until its holder releases it or it expires");
  }
  LeasedObject object = it->second.object;
  UnpinLocked(object);
  leases_.erase(it);
  return object;
}

std::vector<LeasedObject> LeaseTable::TakeExpired(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LeasedObject> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.expires <= now) {
      out.push_back(it->second.object);
      UnpinLocked(it->second.object);
      if (expired_ring_.size() < kExpiredRing) {
        expired_ring_.push_back(it->first);
      } else {
        expired_ring_[expired_next_++ % kExpiredRing] = it->first;
      }
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<LeasedObject> LeaseTable::TakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LeasedObject> out;
  for (auto& [id, entry] : leases_) out.push_back(entry.object);
  leases_.clear();
  pinned_bytes_ = 0;
  bytes_by_requester_.clear();
  return out;
}

size_t LeaseTable::active() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leases_.size();
}

uint64_t LeaseTable::pinned_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pinned_bytes_;
}

uint64_t LeaseTable::pinned_bytes_of(const std::string& requester) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = bytes_by_requester_.find(requester);
  return it == bytes_by_requester_.end() ? 0 : it->second;
}

bool LeaseTable::HoldsGeneration(uint64_t store_generation) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, entry] : leases_) {
    if (entry.object.store_generation == store_generation) return true;
  }
  return false;
}

bool LeaseTable::RecentlyExpired(uint64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::find(expired_ring_.begin(), expired_ring_.end(), id) != expired_ring_.end();
}

}  // namespace rayfabric::agent
