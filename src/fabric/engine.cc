// The engine's public facade (include/rayfabric/fabric.h) over EngineCore; the work is done in
// endpoint.cc, memory.cc and transfer.cc.
#include "fabric/engine_core.h"
#include "rayfabric/log.h"

namespace rayfabric::fabric {

Engine::Engine(std::shared_ptr<EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() { core_->Stop(); }

Result<std::unique_ptr<Engine>> Engine::Open(const Config& config, const EngineOptions& options) {
  auto core = std::make_shared<EngineCore>();
  RF_RETURN_IF_ERROR(core->Open(config, options));
  core->StartProgress();
  RF_LOG(kInfo,
         "provider " << core->profile_.provider << " domain " << core->profile_.domain << ": "
                     << core->report_.reason
                     << (options.remote_write ? " (peers may write registered buffers)" : ""));
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

const ProviderReport& Engine::report() const { return core_->report_; }
const ProviderProfile& Engine::profile() const { return core_->profile_; }
std::string Engine::Address() const { return core_->Address(); }
Result<PeerId> Engine::AddPeer(const std::string& address) { return core_->AddPeer(address); }
Result<std::shared_ptr<MemoryRegion>> Engine::Register(void* base, size_t length, uint32_t access,
                                                       Sharing sharing) {
  return core_->Register(base, length, access, sharing);
}
Result<Transfer> Engine::Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                               const std::shared_ptr<MemoryRegion>& local_region,
                               const std::vector<RmaSpan>& spans) {
  return core_->Start(op, peer, remote, local_region, spans);
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
