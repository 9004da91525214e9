// How many objects the processes of this node left to Ray's own transfer, and why, as they report
// it (ReportFallbacks, on the agent's local socket): `rayfabric status` shows it per node. Bounded
// whatever the reporters send: at most kMaxReasons distinct reasons (later ones are counted under
// kOtherReason), each cut to kMaxReasonBytes, counts saturating. Knows nothing of gRPC.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

namespace rayfabric::agent {

class FallbackCounts {
 public:
  static constexpr size_t kMaxReasons = 32;       // kOtherReason included
  static constexpr size_t kMaxReasonBytes = 120;  // the reporters send a class of at most 80
  static constexpr std::string_view kOtherReason = "(other reasons)";

  // Counts `objects` under `reason` (cleaned, see Clean); 0 objects counts nothing.
  void Add(std::string_view reason, uint64_t objects);
  // Reason -> objects, and their sum.
  std::map<std::string, uint64_t> ByReason() const;
  uint64_t total() const;

  // `reason` as it is kept: control characters replaced by spaces, cut to kMaxReasonBytes at a
  // UTF-8 character boundary, surrounding spaces trimmed; "unknown" if nothing is left.
  static std::string Clean(std::string_view reason);

 private:
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> by_reason_;
  uint64_t total_ = 0;
};

}  // namespace rayfabric::agent
