// One error type for the whole project: a code, a message that says what went wrong and what to
// do about it, decided once where the failure happens and carried up unchanged.
#pragma once

#include <cassert>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <variant>

namespace rayfabric {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed
  kNotFound,           // unknown object, peer or region
  kAlreadyExists,      // e.g. the object exists already in the local store
  kOutOfRange,         // offset/length outside a registered or leased region
  kPermissionDenied,   // forged, revoked or expired key or lease
  kResourceExhausted,  // full store, memlock limit, queue full
  kTimedOut,           // an operation did not complete within its bound
  kUnavailable,        // dead peer, cut link, service not running
  kFabricError,        // libfabric reported an error that fits none of the above
  kProtocolError,      // a peer or store spoke something we do not understand
  kVersionMismatch,    // unsupported Ray / plasma / wire version
  kAborted,            // cancelled by shutdown or by the caller
  kInternal,           // a bug in rayfabric
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status OK() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Prefixes the message with what the caller was doing ("pull of object 1a2b..: ").
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status AlreadyExists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
inline Status TimedOut(std::string m) { return {StatusCode::kTimedOut, std::move(m)}; }
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status ProtocolError(std::string m) { return {StatusCode::kProtocolError, std::move(m)}; }
inline Status VersionMismatch(std::string m) { return {StatusCode::kVersionMismatch, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

// A value or the Status that says why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status carries no value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace rayfabric

#define RF_CONCAT_INNER(a, b) a##b
#define RF_CONCAT(a, b) RF_CONCAT_INNER(a, b)

#define RF_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::rayfabric::Status rf_status_ = (expr);      \
    if (!rf_status_.ok()) return rf_status_;      \
  } while (0)

#define RF_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define RF_ASSIGN_OR_RETURN(lhs, expr) \
  RF_ASSIGN_OR_RETURN_IMPL(RF_CONCAT(rf_result_, __LINE__), lhs, expr)
