// libfabric return codes and error completions -> Status, decided once, here.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_eq.h>

#include <string>

#include "rayfabric/status.h"

namespace rayfabric::fabric {

// `ret` is a negative libfabric return code; `what` says what was attempted ("fi_mr_reg of 4 GiB").
Status FabricStatus(int ret, const std::string& what);

// An error completion read with fi_cq_readerr, with the provider's own detail (fi_cq_strerror).
Status CompletionStatus(struct fid_cq* cq, const struct fi_cq_err_entry& err, const std::string& what);

}  // namespace rayfabric::fabric
