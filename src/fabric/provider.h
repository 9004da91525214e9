// Provider choice and everything provider-specific, decided from fi_info in one place.
#pragma once

#include <rdma/fabric.h>

#include <memory>
#include <vector>

#include "fabric/fid.h"
#include "rayfabric/fabric.h"

namespace rayfabric::fabric {

struct SelectedProvider {
  ProviderReport report;
  std::unique_ptr<struct fi_info, InfoDeleter> info;  // a copy of the chosen fi_info
  int rail = 0;  // 0: its provider's domain; 1..: a further domain of the same provider
  // Where `info` was upgraded to FI_HMEM (EngineOptions::device_memory): the entry and profile
  // without it, opened instead if the endpoint cannot be opened with FI_HMEM.
  std::unique_ptr<struct fi_info, InfoDeleter> host_info;
  ProviderProfile host_profile;
};

// Every fabric the configuration asks for, best first (see SelectProvider); the first alone.
Result<std::vector<SelectedProvider>> SelectFabrics(const EngineSettings& settings,
                                                    const EngineOptions& options);
Result<SelectedProvider> SelectProviderInfo(const EngineSettings& settings,
                                            const EngineOptions& options);

// The hints every rayfabric endpoint asks for: RDM, RMA read (and write as initiator), remote read
// (remote write only when `options.remote_write`), thread-safe domain, and every mr_mode bit the
// engine knows how to honour.
std::unique_ptr<struct fi_info, InfoDeleter> EngineHints(const EngineOptions& options);

// fi_mr_reg access flags for Access bits.
uint64_t FabricAccess(uint32_t access);

ProviderProfile ProfileFromInfo(const struct fi_info* info);

}  // namespace rayfabric::fabric
