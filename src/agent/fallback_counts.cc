#include "agent/fallback_counts.h"

#include <limits>

namespace rayfabric::agent {
namespace {

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max()
                                                      : a + b;
}

}  // namespace

std::string FallbackCounts::Clean(std::string_view reason) {
  size_t end = reason.size();
  if (end > kMaxReasonBytes) {
    end = kMaxReasonBytes;
    // Never cut inside a UTF-8 sequence: back up over continuation bytes (10xxxxxx) to the start
    // of the character that did not fit whole.
    while (end > 0 && (static_cast<unsigned char>(reason[end]) & 0xC0) == 0x80) --end;
  }
  std::string out(reason.substr(0, end));
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7F) c = ' ';
  }
  const size_t first = out.find_first_not_of(' ');
  if (first == std::string::npos) return "unknown";
  out.erase(out.find_last_not_of(' ') + 1);
  out.erase(0, first);
  return out;
}

void FallbackCounts::Add(std::string_view reason, uint64_t objects) {
  if (objects == 0) return;
  std::string key = Clean(reason);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_reason_.find(key);
  if (it == by_reason_.end()) {
    // New reasons fill the table up to one short of the bound: the last place is kOtherReason's.
    const std::string other(kOtherReason);
    const size_t room = by_reason_.count(other) != 0 ? kMaxReasons : kMaxReasons - 1;
    if (by_reason_.size() >= room) key = other;
    it = by_reason_.emplace(std::move(key), 0).first;
  }
  it->second = SaturatingAdd(it->second, objects);
  total_ = SaturatingAdd(total_, objects);
}

std::map<std::string, uint64_t> FallbackCounts::ByReason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_reason_;
}

uint64_t FallbackCounts::total() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

}  // namespace rayfabric::agent
