// The engine's public facade (include/rayfabric/fabric.h) over EngineCore; the work is done in
// endpoint.cc, memory.cc and transfer.cc.
#include "fabric/engine_core.h"
#include "rayfabric/log.h"

namespace rayfabric::fabric {

Engine::Engine(std::shared_ptr<EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() { core_->Stop(); }

namespace {

Result<std::shared_ptr<EngineCore>> OpenCore(SelectedProvider selected,
                                             const EngineSettings& settings,
                                             const EngineOptions& options) {
  auto core = std::make_shared<EngineCore>();
  RF_RETURN_IF_ERROR(core->Open(std::move(selected), settings, options));
  core->StartProgress();
  RF_LOG(kInfo,
         "provider " << core->profile_.provider << " domain " << core->profile_.domain << ": "
                     << core->report_.reason
                     << (options.remote_write ? " (peers may write registered buffers)" : ""));
  return core;
}

// OpenCore, and where the selection was upgraded to FI_HMEM and that endpoint does not open, the
// same provider and domain without it (device buffers are then staged by the caller).
Result<std::shared_ptr<EngineCore>> OpenSelected(SelectedProvider selected,
                                                 const EngineSettings& settings,
                                                 const EngineOptions& options) {
  SelectedProvider host;
  if (selected.host_info) {
    host.report = selected.report;
    host.report.chosen = selected.host_profile;
    host.info = std::move(selected.host_info);
    host.rail = selected.rail;
  }
  auto core = OpenCore(std::move(selected), settings, options);
  if (core.ok() || !host.info) return core;
  host.report.chosen.device_memory_note =
      "FI_HMEM offered, but the endpoint did not open with it (" + core.status().ToString() +
      "): host memory only";
  RF_LOG(kWarn, host.report.chosen.provider << "/" << host.report.chosen.domain << ": "
                                            << host.report.chosen.device_memory_note);
  return OpenCore(std::move(host), settings, options);
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Open(const EngineSettings& settings,
                                             const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(SelectedProvider selected, SelectProviderInfo(settings, options));
  RF_ASSIGN_OR_RETURN(auto core, OpenSelected(std::move(selected), settings, options));
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

Result<std::vector<std::unique_ptr<Engine>>> Engine::OpenAll(const EngineSettings& settings,
                                                             const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(std::vector<SelectedProvider> all, SelectFabrics(settings, options));
  std::vector<std::unique_ptr<Engine>> engines;
  for (SelectedProvider& selected : all) {
    const std::string what = selected.report.chosen.provider + "/" + selected.report.chosen.domain;
    auto core = OpenSelected(std::move(selected), settings, options);
    if (!core.ok()) return core.status().WithContext("opening " + what);
    engines.push_back(std::unique_ptr<Engine>(new Engine(std::move(*core))));
  }
  return engines;
}

Result<std::unique_ptr<Engine>> Engine::Open(const Config& config, const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(const EngineSettings settings, EngineSettings::FromConfig(config));
  return Open(settings, options);
}

Result<std::vector<std::unique_ptr<Engine>>> Engine::OpenAll(const Config& config,
                                                             const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(const EngineSettings settings, EngineSettings::FromConfig(config));
  return OpenAll(settings, options);
}

const ProviderReport& Engine::report() const { return core_->report_; }
const ProviderProfile& Engine::profile() const { return core_->profile_; }
FabricAddress Engine::Address() const { return core_->Address(); }
Result<PeerId> Engine::AddPeer(const FabricAddress& address) { return core_->AddPeer(address); }
Result<std::shared_ptr<MemoryRegion>> Engine::Register(void* base, size_t length, uint32_t access,
                                                       Sharing sharing,
                                                       const MemoryLocation& location) {
  return core_->Register(base, length, access, sharing, location);
}
Result<Transfer> Engine::Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                               const std::shared_ptr<MemoryRegion>& local_region,
                               const std::vector<RmaSpan>& spans) {
  return core_->Start(op, peer, remote, local_region, spans);
}

Result<RegisteredRange> Engine::RegisterRange(void* base, size_t length, uint32_t access,
                                              Sharing sharing, const MemoryLocation& location) {
  return core_->RegisterRange(base, length, access, sharing, location);
}
Result<Transfer> Engine::StartRange(RmaOp op, PeerId peer, const std::vector<RemoteSlice>& remote,
                                    const RegisteredRange& local_range, void* local,
                                    size_t length) {
  return core_->StartRange(op, peer, remote, local_range, local, length);
}

Status Engine::Read(PeerId peer, const RemoteRegion& remote, uint64_t remote_offset,
                    const std::shared_ptr<MemoryRegion>& local_region, void* local, size_t length) {
  RF_ASSIGN_OR_RETURN(Transfer t, Start(RmaOp::kRead, peer, remote, local_region,
                                        {RmaSpan{local, length, remote_offset}}));
  return t.Wait();
}

Status Engine::Write(PeerId peer, const RemoteRegion& remote, uint64_t remote_offset,
                     const std::shared_ptr<MemoryRegion>& local_region, const void* local,
                     size_t length) {
  RF_ASSIGN_OR_RETURN(Transfer t,
                      Start(RmaOp::kWrite, peer, remote, local_region,
                            {RmaSpan{const_cast<void*>(local), length, remote_offset}}));
  return t.Wait();
}

EngineStats Engine::stats() const { return core_->Stats(); }

}  // namespace rayfabric::fabric
