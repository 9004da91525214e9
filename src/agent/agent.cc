#include "agent/agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <system_error>

#include "rayfabric/log.h"
#include "rayfabric/memory.h"

// The agent: what it is made of (its fabrics, store connections, lease table, puller), its
// lifetime, the store segments it keeps registered, and what it reports. What it serves to peers
// is in lease_server.cc; what it fetches from them, in puller.cc.
namespace rayfabric::agent {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kReleaseDrain = std::chrono::seconds(2);

// How every one of the agent's store connections is made (the settings are validated by
// Agent::Open before the first).
StoreConnector PlasmaConnector(const AgentOptions& options) {
  plasma::ConnectOptions connect;
  connect.ray_version = options.ray_version;
  connect.request_timeout_ms = options.config.GetInt("store_timeout_ms").value();
  return PlasmaStoreConnector(options.plasma_socket, connect);
}

}  // namespace

Result<std::unique_ptr<Agent>> Agent::Open(AgentOptions options, AgentSeams seams) {
  if (options.node_id.size() != ObjectId::kSize) {
    return InvalidArgument(
        "the agent's node id must be a Ray NodeID (28 bytes, 56 hex digits), got " +
        std::to_string(options.node_id.size()) + " bytes");
  }
  // Every setting against the table, once, each bad one named with what it allows.
  RF_RETURN_IF_ERROR(options.config.Validate());
  if (!seams.connect_store) seams.connect_store = PlasmaConnector(options);
  if (seams.peers == nullptr) seams.peers = std::make_unique<GrpcPeerCalls>(options.credentials);
  RF_ASSIGN_OR_RETURN(StorePtr serve_store, seams.connect_store());
  RF_ASSIGN_OR_RETURN(StorePtr pull_store, seams.connect_store());
  // One host may pin at most this much of the store under leases.
  RF_ASSIGN_OR_RETURN(const uint64_t max_lease_bytes_per_peer,
                      options.config.GetBytesOrShare("max_lease_bytes_per_peer",
                                                     static_cast<uint64_t>(std::max<int64_t>(
                                                         serve_store->memory_capacity(), 0))));
  if (max_lease_bytes_per_peer == 0) {
    return InvalidArgument("max_lease_bytes_per_peer='" +
                           options.config.GetString("max_lease_bytes_per_peer") +
                           "' leaves no bytes of this node's store (" +
                           std::to_string(serve_store->memory_capacity()) +
                           " bytes): give a size (e.g. 8G) or a larger share");
  }
  RF_ASSIGN_OR_RETURN(bool allow_unprotected, options.config.GetBool("allow_unprotected_memory"));
  const std::string exposure = options.config.GetString("exposure");
  fabric::EngineOptions engine_options;
  engine_options.preferred_ip = options.listen_host;
  RF_ASSIGN_OR_RETURN(uint64_t stripe_min, options.config.GetBytes("stripe_min"));
  RF_ASSIGN_OR_RETURN(auto engines, fabric::Engine::OpenAll(options.config, engine_options));
  std::vector<Fabric> fabrics;
  for (auto& engine : engines) {
    const fabric::ProviderProfile& profile = engine->profile();
    if (!profile.enforces_access && !allow_unprotected) {
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
    fab.exposure = exposure == "object" || (exposure == "auto" && !profile.rdma) ? Exposure::kObject
                                                                                 : Exposure::kArena;
    if (fab.exposure == Exposure::kObject && !profile.deregistration_revokes_keys) {
      RF_LOG(kWarn, "exposure=object on " << profile.provider << ": a lease's key may outlive its "
                                          << "release (" << profile.key_lifetime << ")");
    }
    RF_LOG(kInfo, "fabric " << profile.provider << "/" << profile.domain << ": exposure "
                            << (fab.exposure == Exposure::kObject
                                    ? "object (a key per lease, for its bytes only)"
                                    : "arena (one read-only key for the store)")
                            << (exposure == "auto" ? " (auto, from the provider)" : ""));
    fab.rails.push_back(std::move(engine));
    fab.segments.emplace_back();
    fabrics.push_back(std::move(fab));
  }
  auto agent = std::unique_ptr<Agent>(new Agent(std::move(options), std::move(seams),
                                                std::move(serve_store), std::move(pull_store),
                                                std::move(fabrics), max_lease_bytes_per_peer));
  agent->stripe_min_ = stripe_min;
  return agent;
}

Agent::Agent(AgentOptions options, AgentSeams seams, StorePtr serve_store, StorePtr pull_store,
             std::vector<Fabric> fabrics, uint64_t max_lease_bytes_per_peer)
    : options_(std::move(options)),
      connect_store_(std::move(seams.connect_store)),
      peers_(std::move(seams.peers)),
      serve_store_(std::move(serve_store)),
      pull_store_(std::move(pull_store)),
      fabrics_(std::move(fabrics)),
      leases_(static_cast<size_t>(options_.config.GetInt("max_leases").value()),
              max_lease_bytes_per_peer),
      default_ttl_(options_.config.GetInt("lease_ttl_ms").value()),
      max_ttl_(options_.config.GetInt("max_lease_ttl_ms").value()),
      create_timeout_ms_(options_.config.GetInt("create_timeout_ms").value()),
      op_timeout_ms_(options_.config.GetInt("op_timeout_ms").value()),
      drain_timeout_ms_(options_.config.GetInt("drain_timeout_ms").value()) {
  StoreWarmer::Options warm;
  warm.background = options_.config.GetBool("warm_store").value();  // checked by Open
  warmer_ = std::make_unique<StoreWarmer>(warm, [this] {
    if (leases_.active() > 0) return true;  // peers may be reading this node's objects
    std::lock_guard<std::mutex> lock(in_flight_mu_);
    return !in_flight_.empty();
  });
  // Segments mapped while Open checked the store are added here, later ones by the callback.
  for (const StorePtr& store : {serve_store_, pull_store_}) {
    for (const plasma::SegmentInfo& s : store->Segments()) OnSegmentMapped(s);
  }
  WatchSegments(*serve_store_);
  WatchSegments(*pull_store_);
  releases_ = std::make_unique<ReleaseQueue>(*peers_);
  // (Should this throw, releases_ stops as the members go.)
  sweeper_ = std::thread([this] { SweepLoop(); });
}

Agent::~Agent() {
  {
    // Early-answered Pulls still reading: cut short (they stop at their next step) and waited for.
    std::unique_lock<std::mutex> lock(background_mu_);
    stopping_pulls_ = true;
    background_cv_.wait(lock, [this] { return background_pulls_ == 0; });
  }
  // Queued releases are still started; those unanswered after the bound are cancelled (such a
  // source must not hold the agent's exit: its leases expire there anyway).
  releases_->Stop(kReleaseDrain);
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  sweeper_.join();
  for (const LeasedObject& o : leases_.TakeAll()) Unpin(o);
  // The fabric endpoint closes first (no read can land any more, quarantined ones included);
  // then the store connections go (the store aborts what is unsealed), while everything their
  // unmap callbacks touch is still alive.
  for (Fabric& fab : fabrics_) {
    for (auto& rail : fab.rails) rail.reset();
  }
  {
    std::lock_guard<std::mutex> lock(quarantine_mu_);
    quarantine_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(stores_mu_);
    retired_serve_.clear();
    serve_store_.reset();
    pull_store_.reset();
  }
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    for (Fabric& fab : fabrics_) fab.segments.clear();  // every rail's
  }
  warmer_.reset();  // its thread stops; no store connection is left to report an unmap
}

Agent::Fabric* Agent::FabricFor(const std::string& provider) {
  for (Fabric& fab : fabrics_) {
    if (fab.provider() == provider) return &fab;
  }
  return nullptr;
}

std::string Agent::FabricList() const {
  std::string out;
  for (const Fabric& fab : fabrics_) {
    out += (out.empty() ? "" : ", ") + fab.provider() + "/" + fab.engine().profile().domain;
  }
  return out;
}

void Agent::WatchSegments(LocalStore& store) {
  store.SetSegmentCallbacks([this](const plasma::SegmentInfo& s) { OnSegmentMapped(s); },
                            [this](const plasma::SegmentInfo& s) { OnSegmentUnmapped(s); });
}

void Agent::OnSegmentMapped(const plasma::SegmentInfo& segment) {
  // A fallback segment holds one object on disk, gone with it: nothing to keep warm.
  if (warmer_ && !segment.fallback) warmer_->Add(segment.base, segment.size, segment.fd);
}

Result<Agent::StorePtr> Agent::ConnectStore() {
  RF_ASSIGN_OR_RETURN(StorePtr store, connect_store_());
  WatchSegments(*store);
  return store;
}

Agent::StorePtr Agent::ServeStore(uint64_t* generation) {
  std::lock_guard<std::mutex> lock(stores_mu_);
  if (!serve_store_->healthy()) {
    auto fresh = ConnectStore();
    if (fresh.ok()) {
      // The old connection holds the pins of the leases granted on it: it is retired, not closed,
      // and stays open (so its pins stay) until none of its leases is left and nobody uses it
      // (SweepRetiredStores). Readers of those leases go on safely until their TTL.
      StorePtr old = std::exchange(serve_store_, *fresh);
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
  return serve_store_;
}

Agent::StorePtr Agent::PullStore() {
  std::lock_guard<std::mutex> lock(stores_mu_);
  if (!pull_store_->healthy()) {
    auto fresh = ConnectStore();
    if (fresh.ok()) {
      // In-flight pulls keep the old connection (and their replicas) until their reads drained.
      pull_store_ = *fresh;
      counters_.Add(Count::kStoreReconnects);
      RF_LOG(kWarn, "pulling store connection replaced after an error");
    } else {
      RF_LOG(kWarn, "reconnecting to the store failed: " << fresh.status());
    }
  }
  return pull_store_;
}

void Agent::SweepRetiredStores() {
  std::vector<StorePtr> closing;
  {
    std::lock_guard<std::mutex> lock(stores_mu_);
    for (auto it = retired_serve_.begin(); it != retired_serve_.end();) {
      // Nobody else holds it (a lease batch granting on it would) and no lease of it is left.
      if (it->second.use_count() == 1 && !leases_.HoldsGeneration(it->first)) {
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

void Agent::OnSegmentUnmapped(const plasma::SegmentInfo& segment) {
  if (warmer_) warmer_->Remove(segment.base);  // it maps no page of it any more
  // Runs before the segment is unmapped: drop our registration so that no stale region can be
  // found at this address again.
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (Fabric& fab : fabrics_) {
    for (auto& segments : fab.segments) segments.erase(segment.base);
  }
}

v1::InfoReply Agent::Info() const {
  v1::InfoReply info;
  info.set_protocol_version(kProtocolVersion);
  info.set_agent_version("0.1.0");
  info.set_ray_version(options_.ray_version);
  info.set_node_id(options_.node_id);
  const fabric::Engine& best = fabrics_.front().engine();
  info.set_provider(best.profile().provider);
  info.set_domain(best.profile().domain);
  info.set_fabric_address(best.Address().bytes);
  info.set_provider_reason(best.report().reason);
  for (const Fabric& fab : fabrics_) {
    v1::FabricInfo* f = info.add_fabrics();
    const fabric::FabricAddress address = fab.engine().Address();
    f->set_provider(address.provider);
    f->set_fabric(address.fabric);
    f->set_domain(address.domain);
    f->set_address(address.bytes);
    f->set_rdma(fab.engine().profile().rdma);
    f->set_reason(fab.engine().report().reason);
    f->set_exposure(WireExposure(fab.exposure));
    for (size_t k = 1; k < fab.rails.size(); ++k) {
      f->add_rail_domains(fab.rails[k]->profile().domain);
    }
  }
  info.set_pid(static_cast<int32_t>(getpid()));
  info.set_token_auth(options_.credentials.token_required());
  info.set_tls(options_.credentials.tls());
  info.set_exposure(WireExposure(fabrics_.front().exposure));
  info.set_max_lease_ttl_ms(static_cast<uint32_t>(max_ttl_.count()));
  return info;
}

void Agent::SweepLoop() {
  std::unique_lock<std::mutex> lock(sweep_mu_);
  while (!stopping_) {
    sweep_cv_.wait_for(lock, std::chrono::milliseconds(100));
    for (const LeasedObject& o : leases_.TakeExpired()) {
      counters_.Add(Count::kLeasesExpired);
      RF_LOG(kWarn, "lease on object " << o.object.Hex() << " expired unreleased: unpinned");
      Unpin(o);
    }
    SweepQuarantine();
    ReapAbandonedCreates();
    SweepRetiredStores();
  }
}

std::string VersionRefusal(uint32_t version, const char* rpc) {
  if (version == kProtocolVersion) return "";
  return std::string(rpc) + ": protocol_version " + std::to_string(version) +
         " is not spoken by this agent (it speaks " + std::to_string(kProtocolVersion) +
         "); run the same rayfabric version on every node";
}

v1::StatusReply Agent::GetStatus() const {
  v1::StatusReply s;
  *s.mutable_info() = Info();
  CountValues counts = counters_.Snapshot();
  const auto set = [&counts](Count count, uint64_t value) {
    counts[static_cast<size_t>(count)] = value;
  };
  set(Count::kLeasesActive, leases_.active());
  set(Count::kPinnedBytes, leases_.pinned_bytes());
  fabric::EngineStats stats;
  for (const Fabric& fab : fabrics_) {
    for (size_t k = 0; k < fab.rails.size(); ++k) {
      const fabric::EngineStats one = fab.rails[k]->stats();
      stats.bytes_read += one.bytes_read;
      stats.regions_registered += one.regions_registered;
      stats.endpoint_resets += one.endpoint_resets;
      v1::RailStat* rail = s.add_rails();
      rail->set_provider(fab.provider());
      rail->set_domain(fab.rails[k]->profile().domain);
      rail->set_rail(static_cast<uint32_t>(k + 1));
      rail->set_bytes_read(one.bytes_read);
    }
  }
  set(Count::kFabricBytesRead, stats.bytes_read);
  set(Count::kRegisteredRegions, stats.regions_registered);
  set(Count::kEndpointResets, stats.endpoint_resets);
  set(Count::kFallbacks, fallbacks_.total());
  Counters::Into(counts, s);
  s.set_uptime_ms(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::steady_clock::now() - started_)
                                            .count()));
  for (const auto& [reason, objects] : fallbacks_.ByReason()) {
    v1::FallbackCount* f = s.add_fallback_reasons();
    f->set_reason(reason);
    f->set_objects(objects);
  }
  std::lock_guard<std::mutex> lock(links_mu_);
  for (const auto& [source, link] : links_) *s.add_peer_links() = link;
  return s;
}

void Agent::ReportFallbacks(const v1::ReportFallbacksRequest& request) {
  for (const v1::FallbackCount& f : request.fallbacks()) fallbacks_.Add(f.reason(), f.objects());
}

}  // namespace rayfabric::agent
