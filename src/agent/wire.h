// The protocol's error codes are rayfabric's StatusCode values: both ways here, and checked when
// the agent is compiled, so that neither enum can move without the other.
#pragma once

#include <cstdint>
#include <string>

#include "agent.pb.h"
#include "rayfabric/status.h"

namespace rayfabric::agent {

namespace v1 = ::rayfabric::v1;

inline constexpr uint32_t kProtocolVersion = v1::PROTOCOL_V3;
// The most objects (or leases) one request may name.
inline constexpr int kMaxItemsPerRequest = 100000;

// Why a request of `rpc` in protocol `version` is refused ("" when it is this agent's version).
inline std::string VersionRefusal(uint32_t version, const char* rpc) {
  if (version == kProtocolVersion) return "";
  return std::string(rpc) + ": protocol_version " + std::to_string(version) +
         " is not spoken by this agent (it speaks " + std::to_string(kProtocolVersion) +
         "); run the same rayfabric version on every node";
}

#define RAYFABRIC_SAME_CODE(wire, status) \
  static_assert(static_cast<int>(v1::wire) == static_cast<int>(StatusCode::status), #wire)
RAYFABRIC_SAME_CODE(ERROR_CODE_NONE, kOk);
RAYFABRIC_SAME_CODE(ERROR_CODE_INVALID_ARGUMENT, kInvalidArgument);
RAYFABRIC_SAME_CODE(ERROR_CODE_NOT_FOUND, kNotFound);
RAYFABRIC_SAME_CODE(ERROR_CODE_ALREADY_EXISTS, kAlreadyExists);
RAYFABRIC_SAME_CODE(ERROR_CODE_OUT_OF_RANGE, kOutOfRange);
RAYFABRIC_SAME_CODE(ERROR_CODE_PERMISSION_DENIED, kPermissionDenied);
RAYFABRIC_SAME_CODE(ERROR_CODE_RESOURCE_EXHAUSTED, kResourceExhausted);
RAYFABRIC_SAME_CODE(ERROR_CODE_TIMED_OUT, kTimedOut);
RAYFABRIC_SAME_CODE(ERROR_CODE_UNAVAILABLE, kUnavailable);
RAYFABRIC_SAME_CODE(ERROR_CODE_FABRIC_ERROR, kFabricError);
RAYFABRIC_SAME_CODE(ERROR_CODE_PROTOCOL_ERROR, kProtocolError);
RAYFABRIC_SAME_CODE(ERROR_CODE_VERSION_MISMATCH, kVersionMismatch);
RAYFABRIC_SAME_CODE(ERROR_CODE_ABORTED, kAborted);
RAYFABRIC_SAME_CODE(ERROR_CODE_INTERNAL, kInternal);
#undef RAYFABRIC_SAME_CODE
// No wire code without a StatusCode of its own.
static_assert(v1::ErrorCode_MAX == static_cast<int>(StatusCode::kInternal),
              "agent.proto's ErrorCode and rayfabric::StatusCode differ in length");

// A switch with no default: a StatusCode added without its wire code does not compile.
#pragma GCC diagnostic push
#pragma GCC diagnostic error "-Wswitch"
constexpr bool HasWireCode(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
    case StatusCode::kInvalidArgument:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
    case StatusCode::kOutOfRange:
    case StatusCode::kPermissionDenied:
    case StatusCode::kResourceExhausted:
    case StatusCode::kTimedOut:
    case StatusCode::kUnavailable:
    case StatusCode::kFabricError:
    case StatusCode::kProtocolError:
    case StatusCode::kVersionMismatch:
    case StatusCode::kAborted:
    case StatusCode::kInternal:
      return true;
  }
  return false;
}
#pragma GCC diagnostic pop

inline v1::ErrorCode ToErrorCode(StatusCode code) {
  return HasWireCode(code) ? static_cast<v1::ErrorCode>(code) : v1::ERROR_CODE_INTERNAL;
}

// A peer's code as a StatusCode: one this agent does not know (a newer or broken peer) is a
// protocol error; NONE is not an error, and is a protocol error where one was due.
inline StatusCode FromErrorCode(int code) {
  return code > 0 && code <= v1::ErrorCode_MAX ? static_cast<StatusCode>(code)
                                               : StatusCode::kProtocolError;
}

}  // namespace rayfabric::agent
