// Provider choice and everything provider-specific, decided from fi_info in one place.
#pragma once

#include <rdma/fabric.h>

#include <memory>

#include "fabric/fid.h"
#include "rayfabric/fabric.h"

namespace rayfabric::fabric {

struct SelectedProvider {
  ProviderReport report;
  std::unique_ptr<struct fi_info, InfoDeleter> info;  // a copy of the chosen fi_info
};

Result<SelectedProvider> SelectProviderInfo(const Config& config);

// The hints every rayfabric endpoint asks for: RDM, RMA both ways, thread-safe domain, and every
// mr_mode bit the engine knows how to honour.
std::unique_ptr<struct fi_info, InfoDeleter> EngineHints();

ProviderProfile ProfileFromInfo(const struct fi_info* info);

}  // namespace rayfabric::fabric
