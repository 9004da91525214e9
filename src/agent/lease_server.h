// The serve side of the agent: leases on this node's objects for a peer's reads (pinned in the
// store, registered or described on this node's fabric), their release and their expiry. It meets
// the store through StoreConnections and the fabrics through NodeFabrics; the gRPC peer face
// (peer_service.cc) calls it through Agent.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "agent.pb.h"
#include "agent/counters.h"
#include "agent/lease_table.h"
#include "agent/node_fabrics.h"
#include "agent/store_connections.h"
#include "rayfabric/object_id.h"
#include "rayfabric/plasma_client.h"

namespace rayfabric::agent {

class LeaseServer {
 public:
  struct Options {
    size_t max_leases = 0;                    // config max_leases
    uint64_t max_lease_bytes_per_peer = 0;    // config max_lease_bytes_per_peer, in bytes
    std::chrono::milliseconds default_ttl{};  // config lease_ttl_ms
    std::chrono::milliseconds max_ttl{};      // config max_lease_ttl_ms
  };
  LeaseServer(Options options, NodeFabrics& fabrics, StoreConnections& stores, Counters& counters);
  LeaseServer(const LeaseServer&) = delete;
  LeaseServer& operator=(const LeaseServer&) = delete;

  // `requester`: who asks (the peer's host, from the connection), for the per-requester bound.
  // The reply says how long this side took (LeaseReply.served_s).
  v1::LeaseReply Lease(const v1::LeaseRequest& request, const std::string& requester);
  v1::ReleaseReply Release(const v1::ReleaseRequest& request);
  // Unpins every lease past its end (the agent's sweeper, every 100 ms).
  void ExpireLeases();
  // At shutdown: unpins everything still leased.
  void UnpinAll();

  size_t active() const { return leases_.active(); }
  uint64_t pinned_bytes() const { return leases_.pinned_bytes(); }
  bool HoldsGeneration(uint64_t store_generation) const {
    return leases_.HoldsGeneration(store_generation);
  }
  std::chrono::milliseconds max_ttl() const { return options_.max_ttl; }

 private:
  v1::LeaseReply LeaseAll(const v1::LeaseRequest& request, const std::string& requester);
  // `rails`: on how many of `fab`'s rails a large object is described (as many as both have).
  void LeaseBatch(Fabric& fab, size_t rails, v1::LeaseReply& reply, const std::vector<int>& indices,
                  const std::vector<ObjectId>& ids, std::chrono::milliseconds ttl,
                  const std::string& requester);
  void GrantLease(Fabric& fab, size_t rails, v1::Lease& lease, const ObjectId& id,
                  const plasma::ObjectBuffer& obj, std::chrono::milliseconds ttl,
                  const std::string& requester, LocalStore& store, uint64_t generation);
  void RefuseLease(v1::Lease& lease, const Status& why);
  // Unpins a leased object, on the connection it was pinned on if that one still lives.
  void Unpin(const LeasedObject& object);
  void DropLeaseRegion(uint64_t lease_id);

  const Options options_;
  NodeFabrics& fabrics_;
  StoreConnections& stores_;
  Counters& counters_;
  LeaseTable leases_;
  // With object exposure, each lease's own registration, one per rail, by lease id, until the
  // lease ends.
  std::mutex lease_regions_mu_;
  std::map<uint64_t, std::vector<fabric::RegisteredRange>> lease_regions_;
};

}  // namespace rayfabric::agent
