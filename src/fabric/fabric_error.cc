#include "fabric/fabric_error.h"

#include <rdma/fi_errno.h>

namespace rayfabric::fabric {
namespace {

StatusCode CodeFor(int err) {
  switch (err) {
    case FI_ETIMEDOUT:
      return StatusCode::kTimedOut;
    case FI_ECONNREFUSED:
    case FI_ECONNRESET:
    case FI_ECONNABORTED:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ENETDOWN:
    case FI_ENOTCONN:
    case FI_ESHUTDOWN:
    case FI_EADDRNOTAVAIL:
      return StatusCode::kUnavailable;
    case FI_EACCES:
    case FI_EPERM:
    case FI_EKEYREJECTED:
      return StatusCode::kPermissionDenied;
    case FI_ENOMEM:
    case FI_ENOSPC:
    case FI_EMFILE:
    case FI_ETOOSMALL:
      return StatusCode::kResourceExhausted;
    case FI_ENODATA:
    case FI_ENOENT:
    case FI_ENOSYS:
      return StatusCode::kNotFound;
    case FI_EINVAL:
      return StatusCode::kInvalidArgument;
    case FI_ECANCELED:
      return StatusCode::kAborted;
    default:
      return StatusCode::kFabricError;
  }
}

}  // namespace

Status FabricStatus(int ret, const std::string& what) {
  int err = ret < 0 ? -ret : ret;
  return Status(CodeFor(err), what + " failed: " + fi_strerror(err) + " (" + std::to_string(-err) + ")");
}

Status CompletionStatus(struct fid_cq* cq, const struct fi_cq_err_entry& err, const std::string& what) {
  std::string detail;
  if (err.prov_errno != 0) {
    char buf[256] = {0};
    const char* s = fi_cq_strerror(cq, err.prov_errno, err.err_data, buf, sizeof(buf));
    detail = std::string("; provider says: ") + (s ? s : buf) + " (prov_errno " +
             std::to_string(err.prov_errno) + ")";
  }
  return Status(CodeFor(err.err), what + " failed: " + fi_strerror(err.err) + detail);
}

}  // namespace rayfabric::fabric
