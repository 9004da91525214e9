// The agent's two connections to its node's store: one serves leases, one creates replicas, so
// that a pull waiting for room in a full store never blocks serving. Each is replaced when it
// breaks (a store that did not answer within store_timeout_ms, a protocol error). Knows nothing of
// fabrics, leases or pulls.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "agent/counters.h"
#include "agent/local_store.h"

namespace rayfabric::agent {

// A store connection. Whoever uses one keeps it alive for as long as anything of theirs is in
// flight on it: a broken connection is replaced at once, but closed (and the store aborts its
// unsealed replicas) only when the last user is done, never while a read may still land.
using StorePtr = std::shared_ptr<LocalStore>;

class StoreConnections {
 public:
  using SegmentCallback = std::function<void(const plasma::SegmentInfo&)>;
  // `on_mapped`/`on_unmapped` are told of every segment any connection maps or unmaps, the
  // replacements' included (those of `serve` and `pull` from now on; the caller adds those they
  // mapped before).
  StoreConnections(StoreConnector connect, StorePtr serve, StorePtr pull, Counters& counters,
                   SegmentCallback on_mapped, SegmentCallback on_unmapped);
  StoreConnections(const StoreConnections&) = delete;
  StoreConnections& operator=(const StoreConnections&) = delete;

  // The current connection for serving (leases) / pulling (replicas); a broken one is replaced
  // first. The serving connections are numbered (`generation`): a lease pinned on an older
  // (retired) one is unpinned when that connection closes.
  StorePtr Serve(uint64_t* generation = nullptr);
  StorePtr Pull();
  // Closes the retired serving connections nobody uses and none of whose leases is left
  // (`holds_generation`: whether a lease pinned on that generation is active).
  void SweepRetired(const std::function<bool(uint64_t)>& holds_generation);
  // At shutdown: every connection closes (the store aborts what is unsealed).
  void CloseAll();

 private:
  Result<StorePtr> Connect();
  void Watch(LocalStore& store);

  const StoreConnector connect_;
  Counters& counters_;
  const SegmentCallback on_mapped_;
  const SegmentCallback on_unmapped_;
  std::mutex mu_;
  StorePtr serve_;
  StorePtr pull_;
  uint64_t serve_generation_ = 1;
  // Broken serving connections kept open while leases granted on them (their pins) remain.
  std::vector<std::pair<uint64_t, StorePtr>> retired_serve_;
};

}  // namespace rayfabric::agent
