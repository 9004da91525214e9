// The fabrics this node speaks, best first, and the store segments registered with each of their
// rails. A pair of nodes uses the best fabric both speak (the source picks, from the reader's
// list). Shared by the lease server (it registers and describes what it serves) and the puller
// (it registers the replicas it reads into); knows nothing of leases or pulls.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "agent.pb.h"
#include "rayfabric/fabric.h"
#include "rayfabric/status.h"

namespace rayfabric::agent {

namespace v1 = ::rayfabric::v1;

// What a lease exposes (config "exposure"): the whole arena, or the leased object's bytes only
// through a registration of its own, held by the lease server until the lease ends.
enum class Exposure { kArena, kObject };
v1::Exposure WireExposure(Exposure exposure);

// One fabric this node speaks: its engines, one per rail (domain; the first is the provider's
// own, the others are further NICs large transfers stripe across), what a lease on it exposes,
// and the store segments registered with each rail (by base; guarded by NodeFabrics).
struct Fabric {
  struct Registered {
    fabric::RegisteredRange range;  // in slices of at most max_registration
  };
  std::vector<std::unique_ptr<fabric::Engine>> rails;
  Exposure exposure = Exposure::kObject;
  std::vector<std::map<uint8_t*, Registered>> segments;  // per rail
  fabric::Engine& engine() const { return *rails.front(); }
  const std::string& provider() const { return engine().profile().provider; }
};

class NodeFabrics {
 public:
  // Opens one engine per fabric (and rail) the configuration allows on this node, each fabric's
  // exposure decided from its provider's profile. Refused (PermissionDenied) where a provider
  // does not enforce registration access and allow_unprotected_memory is off.
  struct Options {
    fabric::EngineSettings engine;
    std::string listen_host;  // the node's IP: each provider's domain holding it is chosen
    std::string exposure;     // config exposure: "object", "arena" or "auto" (from the provider)
    bool allow_unprotected = false;  // config allow_unprotected_memory
    uint64_t stripe_min = 0;         // config stripe_min
  };
  static Result<std::unique_ptr<NodeFabrics>> Open(const Options& options);
  NodeFabrics(std::vector<Fabric> fabrics, uint64_t stripe_min)
      : fabrics_(std::move(fabrics)), stripe_min_(stripe_min) {}
  NodeFabrics(const NodeFabrics&) = delete;
  NodeFabrics& operator=(const NodeFabrics&) = delete;

  // Fixed after Open: never empty, best first.
  std::vector<Fabric>& all() { return fabrics_; }
  const std::vector<Fabric>& all() const { return fabrics_; }
  const Fabric& best() const { return fabrics_.front(); }
  // The fabric of `provider`, or null if this node does not speak it.
  Fabric* For(const std::string& provider);
  // "verbs;ofi_rxm/mlx5_0, tcp;ofi_rxm/eth0": what this node speaks, for errors.
  std::string List() const;
  // Config stripe_min: the least bytes one rail moves of a transfer.
  uint64_t stripe_min() const { return stripe_min_; }

  // The registration of `fab`'s rail `rail` covering a mapped store segment (registered once, in
  // slices; forgotten when the segment is unmapped).
  Result<fabric::RegisteredRange> RegionFor(Fabric& fab, size_t rail, uint8_t* segment_base,
                                            size_t segment_size);
  // Before a segment is unmapped: its registrations are dropped, so that no stale region can be
  // found at this address again.
  void Forget(uint8_t* segment_base);
  // At shutdown: every endpoint closes (no read can land any more), then, once the store
  // connections are gone, every segment's registration.
  void CloseEngines();
  void ForgetAll();

 private:
  std::vector<Fabric> fabrics_;
  const uint64_t stripe_min_;
  std::mutex regions_mu_;  // guards every Fabric::segments
};

}  // namespace rayfabric::agent
