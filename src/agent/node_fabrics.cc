#include "agent/node_fabrics.h"

#include "rayfabric/log.h"

namespace rayfabric::agent {

v1::Exposure WireExposure(Exposure exposure) {
  return exposure == Exposure::kObject ? v1::EXPOSURE_OBJECT : v1::EXPOSURE_ARENA;
}

Result<std::unique_ptr<NodeFabrics>> NodeFabrics::Open(const Options& options) {
  if (options.stripe_min == 0) return InvalidArgument("stripe_min 0: a rail must move some bytes");
  fabric::EngineOptions engine_options;
  engine_options.preferred_ip = options.listen_host;
  RF_ASSIGN_OR_RETURN(auto engines, fabric::Engine::OpenAll(options.engine, engine_options));
  std::vector<Fabric> fabrics;
  for (auto& engine : engines) {
    const fabric::ProviderProfile& profile = engine->profile();
    if (!profile.enforces_access && !options.allow_unprotected) {
      return PermissionDenied(
          "provider " + profile.provider + " does not enforce registration access (" +
          profile.access_note +
          "): peers holding or guessing a key could write this node's object store. Set "
          "FI_MR_CACHE_MONITOR=disabled for the agent (verbs/efa), choose another provider, or "
          "accept the risk with RAYFABRIC_ALLOW_UNPROTECTED_MEMORY=true");
    }
    // A further domain of the provider just opened: one more rail of that fabric.
    if (!fabrics.empty() && fabrics.back().provider() == profile.provider) {
      RF_LOG(kInfo, "fabric " << profile.provider << "/" << profile.domain << ": rail "
                              << fabrics.back().rails.size() + 1 << " of "
                              << fabrics.back().engine().profile().domain);
      fabrics.back().rails.push_back(std::move(engine));
      fabrics.back().segments.emplace_back();
      continue;
    }
    if (!profile.enforces_access) {
      RF_LOG(kWarn, "serving plasma memory on "
                        << profile.provider << " although it does not enforce access ("
                        << profile.access_note << "): allowed by allow_unprotected_memory");
    }
    // What a lease exposes: by default, what a registration costs on this provider decides.
    Fabric fab;
    fab.exposure = options.exposure == "object" || (options.exposure == "auto" && !profile.rdma)
                       ? Exposure::kObject
                       : Exposure::kArena;
    if (fab.exposure == Exposure::kObject && !profile.deregistration_revokes_keys) {
      RF_LOG(kWarn, "exposure=object on " << profile.provider << ": a lease's key may outlive its "
                                          << "release (" << profile.key_lifetime << ")");
    }
    RF_LOG(kInfo, "fabric " << profile.provider << "/" << profile.domain << ": exposure "
                            << (fab.exposure == Exposure::kObject
                                    ? "object (a key per lease, for its bytes only)"
                                    : "arena (one read-only key for the store)")
                            << (options.exposure == "auto" ? " (auto, from the provider)" : ""));
    fab.rails.push_back(std::move(engine));
    fab.segments.emplace_back();
    fabrics.push_back(std::move(fab));
  }
  return std::make_unique<NodeFabrics>(std::move(fabrics), options.stripe_min);
}

Fabric* NodeFabrics::For(const std::string& provider) {
  for (Fabric& fab : fabrics_) {
    if (fab.provider() == provider) return &fab;
  }
  return nullptr;
}

std::string NodeFabrics::List() const {
  std::string out;
  for (const Fabric& fab : fabrics_) {
    out += (out.empty() ? "" : ", ") + fab.provider() + "/" + fab.engine().profile().domain;
  }
  return out;
}

Result<fabric::RegisteredRange> NodeFabrics::RegionFor(Fabric& fab, size_t rail, uint8_t* base,
                                                       size_t size) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  std::map<uint8_t*, Fabric::Registered>& segments = fab.segments[rail];
  auto it = segments.find(base);
  if (it != segments.end() && it->second.range.Contains(base, size)) return it->second.range;
  // The whole segment (the store's arena: every later object in it is served or filled with no
  // new registration), with exactly what the two sides need: this process's fi_read writes
  // replicas into it (pulling), and with arena exposure peers may read it (serving). Never remote
  // write.
  const uint32_t access = fab.exposure == Exposure::kArena
                              ? fabric::kLocalRead | fabric::kRemoteRead
                              : fabric::kLocalRead;
  // Private: this map is the cache, and it forgets a segment when it is unmapped; the engine's
  // own cache could hand back a registration of memory unmapped since (a new segment mapped at
  // the same address), still alive while a transfer holds it.
  RF_ASSIGN_OR_RETURN(
      auto range, fab.rails[rail]->RegisterRange(base, size, access, fabric::Sharing::kPrivate));
  segments[base] = Fabric::Registered{range};
  return range;
}

void NodeFabrics::Forget(uint8_t* segment_base) {
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (Fabric& fab : fabrics_) {
    for (auto& segments : fab.segments) segments.erase(segment_base);
  }
}

void NodeFabrics::CloseEngines() {
  for (Fabric& fab : fabrics_) {
    for (auto& rail : fab.rails) rail.reset();
  }
}

void NodeFabrics::ForgetAll() {
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (Fabric& fab : fabrics_) fab.segments.clear();  // every rail's
}

}  // namespace rayfabric::agent
