#include "agent/store_connections.h"

#include "rayfabric/log.h"

namespace rayfabric::agent {

StoreConnections::StoreConnections(StoreConnector connect, StorePtr serve, StorePtr pull,
                                   Counters& counters, SegmentCallback on_mapped,
                                   SegmentCallback on_unmapped)
    : connect_(std::move(connect)),
      counters_(counters),
      on_mapped_(std::move(on_mapped)),
      on_unmapped_(std::move(on_unmapped)),
      serve_(std::move(serve)),
      pull_(std::move(pull)) {
  Watch(*serve_);
  Watch(*pull_);
}

void StoreConnections::Watch(LocalStore& store) {
  store.SetSegmentCallbacks(on_mapped_, on_unmapped_);
}

Result<StorePtr> StoreConnections::Connect() {
  RF_ASSIGN_OR_RETURN(StorePtr store, connect_());
  Watch(*store);
  return store;
}

StorePtr StoreConnections::Serve(uint64_t* generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!serve_->healthy()) {
    auto fresh = Connect();
    if (fresh.ok()) {
      // The old connection holds the pins of the leases granted on it: it is retired, not closed,
      // and stays open (so its pins stay) until none of its leases is left and nobody uses it
      // (SweepRetired). Readers of those leases go on safely until their TTL.
      StorePtr old = std::exchange(serve_, *fresh);
      retired_serve_.push_back({serve_generation_, std::move(old)});
      ++serve_generation_;
      counters_.Add(Count::kStoreReconnects);
      RF_LOG(kWarn,
             "serving store connection replaced after an error; the old one is kept open "
             "until its leases end");
    } else {
      RF_LOG(kWarn, "reconnecting to the store failed: " << fresh.status());
    }
  }
  if (generation != nullptr) *generation = serve_generation_;
  return serve_;
}

StorePtr StoreConnections::Pull() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!pull_->healthy()) {
    auto fresh = Connect();
    if (fresh.ok()) {
      // In-flight pulls keep the old connection (and their replicas) until their reads drained.
      pull_ = *fresh;
      counters_.Add(Count::kStoreReconnects);
      RF_LOG(kWarn, "pulling store connection replaced after an error");
    } else {
      RF_LOG(kWarn, "reconnecting to the store failed: " << fresh.status());
    }
  }
  return pull_;
}

void StoreConnections::SweepRetired(const std::function<bool(uint64_t)>& holds_generation) {
  std::vector<StorePtr> closing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = retired_serve_.begin(); it != retired_serve_.end();) {
      // Nobody else holds it (a lease batch granting on it would) and no lease of it is left.
      if (it->second.use_count() == 1 && !holds_generation(it->first)) {
        closing.push_back(std::move(it->second));
        it = retired_serve_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Closed outside the lock (the store then drops that connection's pins).
  if (!closing.empty()) RF_LOG(kInfo, closing.size() << " retired store connection(s) closed");
}

void StoreConnections::CloseAll() {
  std::lock_guard<std::mutex> lock(mu_);
  retired_serve_.clear();
  serve_.reset();
  pull_.reset();
}

}  // namespace rayfabric::agent
