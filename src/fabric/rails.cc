// Pairing two nodes' fabrics, and striping: one transfer spread across several rails (domains of
// one provider, a NIC each), so that a node with several HCAs or EFA devices reaches their summed
// bandwidth.
#include <algorithm>
#include <string>
#include <vector>

#include "rayfabric/fabric.h"

namespace rayfabric::fabric {

namespace {
// Stripe boundaries fall on multiples of this (whole pages, and whole chunks for most sizes).
constexpr uint64_t kStripeAlign = 64 << 10;
}  // namespace

Result<std::vector<RemoteSlice>> SubSlices(const std::vector<RemoteSlice>& slices, uint64_t offset,
                                           uint64_t length) {
  std::vector<RemoteSlice> out;
  uint64_t at = 0;
  uint64_t found = 0;
  for (const RemoteSlice& slice : slices) {
    const uint64_t begin = at;
    const uint64_t end = at + slice.length;
    at = end;
    const uint64_t from = std::max(offset, begin);
    const uint64_t to = std::min(offset + length, end);
    if (from >= to) continue;
    out.push_back({slice.region, slice.offset + (from - begin), to - from});
    found += to - from;
  }
  if (found != length) {
    return OutOfRange("the remote range holds " + std::to_string(at) + " bytes: [" +
                      std::to_string(offset) + ", +" + std::to_string(length) +
                      ") is not inside it");
  }
  return out;
}

int ChooseShared(const std::vector<std::string>& mine, const std::vector<std::string>& theirs) {
  for (size_t i = 0; i < mine.size(); ++i) {
    if (std::find(theirs.begin(), theirs.end(), mine[i]) != theirs.end()) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

size_t RailsFor(uint64_t length, size_t rails, uint64_t min_stripe) {
  if (rails <= 1) return 1;
  if (min_stripe == 0) return rails;
  return static_cast<size_t>(std::clamp<uint64_t>(length / min_stripe, 1, rails));
}

Result<Transfer> StartStriped(RmaOp op, const std::vector<Rail>& rails, void* local, size_t length,
                              uint64_t min_stripe) {
  if (rails.empty()) return InvalidArgument("a striped transfer needs at least one rail");
  const size_t used = RailsFor(length, rails.size(), min_stripe);
  for (size_t i = 0; i < used; ++i) {
    const Rail& rail = rails[i];
    if (rail.engine == nullptr || rail.remote == nullptr || rail.local == nullptr) {
      return InvalidArgument("rail " + std::to_string(i + 1) + " of a striped transfer is empty");
    }
    if (i > 0 && rail.engine->profile().provider != rails[0].engine->profile().provider) {
      return InvalidArgument(
          "rails of one transfer must share a provider: " + rails[0].engine->profile().provider +
          " and " + rail.engine->profile().provider);
    }
  }
  if (used == 1) {
    return rails[0].engine->StartRange(op, rails[0].peer, *rails[0].remote, *rails[0].local, local,
                                       length);
  }
  std::vector<Transfer> parts;
  uint64_t from = 0;
  for (size_t i = 0; i < used; ++i) {
    const Rail& rail = rails[i];
    const uint64_t to =
        i + 1 == used ? length : length / used * (i + 1) / kStripeAlign * kStripeAlign;
    if (to <= from) continue;
    const std::string what = "stripe " + std::to_string(i + 1) + " of " + std::to_string(used) +
                             " (domain " + rail.engine->profile().domain + ")";
    auto remote = SubSlices(*rail.remote, from, to - from);
    Result<Transfer> part =
        remote.ok() ? rail.engine->StartRange(op, rail.peer, *remote, *rail.local,
                                              static_cast<char*>(local) + from, to - from)
                    : Result<Transfer>(remote.status());
    if (!part.ok()) {
      if (parts.empty()) return part.status().WithContext(what);
      return Transfer::PartlyStarted(std::move(parts), what, part.status());
    }
    parts.push_back(*part);
    from = to;
  }
  return Transfer::Join(parts);
}

}  // namespace rayfabric::fabric
