#include "agent/agent.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include "rayfabric/hex.h"
#include "rayfabric/log.h"

// The agent: what it is made of, its lifetime, and what it reports. What it serves to peers is
// the LeaseServer's (lease_server.cc); what it fetches from them, the Puller's (puller.cc).
namespace rayfabric::agent {
namespace {

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
  NodeFabrics::Options open;
  RF_ASSIGN_OR_RETURN(open.engine, fabric::EngineSettings::FromConfig(options.config));
  open.engine.reset_undrained_endpoints = seams.reset_undrained_endpoints;
  open.listen_host = options.listen_host;
  open.exposure = options.config.GetString("exposure");
  open.allow_unprotected = options.config.GetBool("allow_unprotected_memory").value();
  open.stripe_min = options.config.GetBytes("stripe_min").value();
  RF_ASSIGN_OR_RETURN(auto fabrics, NodeFabrics::Open(open));
  return std::unique_ptr<Agent>(new Agent(std::move(options), std::move(seams),
                                          std::move(serve_store), std::move(pull_store),
                                          std::move(fabrics), max_lease_bytes_per_peer));
}

Agent::Agent(AgentOptions options, AgentSeams seams, StorePtr serve_store, StorePtr pull_store,
             std::unique_ptr<NodeFabrics> fabrics, uint64_t max_lease_bytes_per_peer)
    : options_(std::move(options)), peers_(std::move(seams.peers)), fabrics_(std::move(fabrics)) {
  const Config& config = options_.config;  // validated by Open
  StoreWarmer::Options warm;
  warm.background = config.GetBool("warm_store").value();
  warmer_ = std::make_unique<StoreWarmer>(warm, [this] {
    if (!ready_.load(std::memory_order_acquire)) return false;
    // Peers may be reading this node's objects, or a pull reads into it.
    return lease_server_->active() > 0 || puller_->busy();
  });
  try {
    MakeComponents(std::move(seams.connect_store), std::move(serve_store), std::move(pull_store),
                   max_lease_bytes_per_peer);
  } catch (...) {
    // The warmer's thread asks the components about their work: it stops before they go. (The
    // store connections then close as the members go; their callbacks find a stopped warmer.)
    warmer_->Stop();
    throw;
  }
}

void Agent::MakeComponents(StoreConnector connect_store, StorePtr serve_store, StorePtr pull_store,
                           uint64_t max_lease_bytes_per_peer) {
  const Config& config = options_.config;
  stores_ = std::make_unique<StoreConnections>(
      std::move(connect_store), std::move(serve_store), std::move(pull_store), counters_,
      [this](const plasma::SegmentInfo& s) { OnSegmentMapped(s); },
      [this](const plasma::SegmentInfo& s) { OnSegmentUnmapped(s); });
  // Segments mapped while Open checked the store are added here, later ones by the callback.
  for (const StorePtr& store : {stores_->Serve(), stores_->Pull()}) {
    for (const plasma::SegmentInfo& s : store->Segments()) OnSegmentMapped(s);
  }
  releases_ = std::make_unique<ReleaseQueue>(*peers_);
  LeaseServer::Options serve;
  serve.max_leases = static_cast<size_t>(config.GetInt("max_leases").value());
  serve.max_lease_bytes_per_peer = max_lease_bytes_per_peer;
  serve.default_ttl = std::chrono::milliseconds(config.GetInt("lease_ttl_ms").value());
  serve.max_ttl = std::chrono::milliseconds(config.GetInt("max_lease_ttl_ms").value());
  lease_server_ = std::make_unique<LeaseServer>(serve, *fabrics_, *stores_, counters_);
  Puller::Options pull;
  pull.requester = BytesToHex(options_.node_id);
  pull.create_timeout_ms = config.GetInt("create_timeout_ms").value();
  pull.op_timeout_ms = config.GetInt("op_timeout_ms").value();
  pull.drain_timeout_ms = config.GetInt("drain_timeout_ms").value();
  puller_ = std::make_unique<Puller>(std::move(pull), *fabrics_, *stores_, *peers_, *releases_,
                                     *warmer_, counters_);
  sweeper_ = std::thread([this] { SweepLoop(); });
  ready_.store(true, std::memory_order_release);
}

Agent::~Agent() {
  // Early-answered Pulls still reading: cut short and waited for.
  puller_->StopBackgroundPulls();
  // Queued releases are still started; those unanswered after the bound are cancelled (such a
  // source must not hold the agent's exit: its leases expire there anyway).
  releases_->Stop(kReleaseDrain);
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  sweeper_.join();
  lease_server_->UnpinAll();
  // The fabric endpoints close first (no read can land any more, quarantined ones included);
  // then the store connections go (the store aborts what is unsealed), while everything their
  // unmap callbacks touch is still alive.
  fabrics_->CloseEngines();
  puller_->ClearQuarantine();
  stores_->CloseAll();
  fabrics_->ForgetAll();
  warmer_->Stop();  // its thread ends; the object stays until the members go (after the Puller)
}

void Agent::OnSegmentMapped(const plasma::SegmentInfo& segment) {
  // A fallback segment holds one object on disk, gone with it: nothing to keep warm.
  if (!segment.fallback) warmer_->Add(segment.base, segment.size, segment.fd);
}

void Agent::OnSegmentUnmapped(const plasma::SegmentInfo& segment) {
  warmer_->Remove(segment.base);  // it maps no page of it any more
  // Runs before the segment is unmapped.
  fabrics_->Forget(segment.base);
}

v1::InfoReply Agent::Info() const {
  v1::InfoReply info;
  info.set_protocol_version(kProtocolVersion);
  info.set_agent_version("0.1.0");
  info.set_ray_version(options_.ray_version);
  info.set_node_id(options_.node_id);
  const fabric::Engine& best = fabrics_->best().engine();
  info.set_provider(best.profile().provider);
  info.set_domain(best.profile().domain);
  info.set_fabric_address(best.Address().bytes);
  info.set_provider_reason(best.report().reason);
  for (const Fabric& fab : fabrics_->all()) {
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
  info.set_exposure(WireExposure(fabrics_->best().exposure));
  info.set_max_lease_ttl_ms(static_cast<uint32_t>(lease_server_->max_ttl().count()));
  return info;
}

void Agent::SweepLoop() {
  std::unique_lock<std::mutex> lock(sweep_mu_);
  while (!stopping_) {
    sweep_cv_.wait_for(lock, std::chrono::milliseconds(100));
    lease_server_->ExpireLeases();
    puller_->Sweep();
    stores_->SweepRetired(
        [this](uint64_t generation) { return lease_server_->HoldsGeneration(generation); });
  }
}

v1::StatusReply Agent::GetStatus() const {
  v1::StatusReply s;
  *s.mutable_info() = Info();
  CountValues counts = counters_.Snapshot();
  const auto set = [&counts](Count count, uint64_t value) {
    counts[static_cast<size_t>(count)] = value;
  };
  set(Count::kLeasesActive, lease_server_->active());
  set(Count::kPinnedBytes, lease_server_->pinned_bytes());
  fabric::EngineStats stats;
  for (const Fabric& fab : fabrics_->all()) {
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
  puller_->LinksInto(s);
  return s;
}

void Agent::ReportFallbacks(const v1::ReportFallbacksRequest& request) {
  for (const v1::FallbackCount& f : request.fallbacks()) fallbacks_.Add(f.reason(), f.objects());
}

}  // namespace rayfabric::agent
