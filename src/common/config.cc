#include "rayfabric/config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "rayfabric/json.h"

namespace rayfabric {

const std::vector<ConfigEntry>& ConfigTable() {
  static const std::vector<ConfigEntry> table = {
      {"provider", "RAYFABRIC_PROVIDER", Spec(SettingType::kList), "",
       "libfabric providers to use, a comma list (e.g. 'verbs;ofi_rxm,tcp;ofi_rxm', 'efa', "
       "'sockets'); empty: rank what fi_info offers (efa, verbs above tcp, tcp above sockets) and "
       "take the best RDMA provider plus the best socket provider. An agent opens them all and "
       "each pair of nodes uses the best one both have; single-engine tools use the first. "
       "FI_PROVIDER, if set, also restricts what libfabric offers."},
      {"domain", "RAYFABRIC_DOMAIN", Spec(SettingType::kList), "",
       "libfabric domain (NIC) names, a comma list, e.g. 'rxe0', 'mlx5_0,mlx5_1', 'eth0', for "
       "the providers that offer them: the first one a provider offers is its domain, the others "
       "it offers are further rails (large transfers are striped across them). Empty: the domain "
       "holding the node's IP (the agent's --listen host), else the first non-loopback one, plus "
       "on an RDMA provider every other domain of the same fabric (up to max_rails)."},
      {"max_rails", "RAYFABRIC_MAX_RAILS", IntIn(1, 64), "4",
       "the most domains (NICs) of one RDMA provider a node stripes across when RAYFABRIC_DOMAIN "
       "does not list them; 1: one NIC per provider. Socket providers use one interface unless "
       "RAYFABRIC_DOMAIN lists several."},
      {"stripe_min", "RAYFABRIC_STRIPE_MIN", BytesAtLeast(1), "4M",
       "the least bytes one rail moves of a striped transfer: a transfer of n bytes uses at most "
       "n / stripe_min rails (smaller ones use one)."},
      {"require_rdma", "RAYFABRIC_REQUIRE_RDMA", Spec(SettingType::kBool), "false",
       "fail at startup instead of falling back to a non-RDMA provider (tcp, sockets, shm, udp)."},
      {"chunk_size", "RAYFABRIC_CHUNK_SIZE", BytesAtLeast(1), "4M",
       "largest single fi_read/fi_write; capped by the provider's max_msg_size."},
      {"max_inflight", "RAYFABRIC_MAX_INFLIGHT", IntAtLeast(1), "16",
       "RMA operations kept in flight per transfer."},
      {"op_timeout_ms", "RAYFABRIC_OP_TIMEOUT_MS", IntAtLeast(1), "30000",
       "progress timeout: a transfer in which no operation completed for this long fails with "
       "TimedOut (dead or frozen peer, cut link); a large transfer on a slow link that keeps "
       "completing operations never times out."},
      {"drain_timeout_ms", "RAYFABRIC_DRAIN_TIMEOUT_MS", IntAtLeast(1), "5000",
       "after a transfer failed, how long its operations still in flight may take to come back "
       "before the engine resets its endpoint (closing every connection) so that none of them "
       "can write a byte afterwards."},
      {"progress_spin_us", "RAYFABRIC_PROGRESS_SPIN_US", IntIn(0, 100000), "0",
       "how long the engine's progress thread keeps polling the completion queue (yielding the "
       "CPU between polls) after a post or a completion before it blocks on its wait object, "
       "and a caller waiting for a transfer polls its state from the start of its wait: a "
       "completion within it is seen without a thread wake-up (tens of microseconds on a "
       "virtual machine), for a CPU held that long. 0 (the default): block at once. For nodes "
       "with cores to spare: on a 2-core VM, 50 made raw 4 KiB reads 2-5x and 64 KiB reads "
       "1.4-2.4x faster, and showed no gain on whole Ray gets."},
      {"max_registration", "RAYFABRIC_MAX_REGISTRATION", BytesAtLeast(1 << 20), "4G",
       "largest single memory registration: larger ranges (an object store's arena, a large "
       "object) are registered in slices of this size. 4G fits EFA (one registration with remote "
       "access is capped at 1M pages) and every NIC known; an object across two slices moves "
       "as two reads."},
      {"log_level", "RAYFABRIC_LOG_LEVEL", Choice("error|warn|info|debug"), "info",
       "error, warn, info or debug."},
      {"warm_store", "RAYFABRIC_WARM_STORE", Spec(SettingType::kBool), "true",
       "agent: map into the agent, in idle time, the store's pages that this node's processes "
       "already use (a worker's put, an earlier replica), and remember which are mapped, so that "
       "a replica written there takes no page fault and no mapping pass during its pull. Only a "
       "store on tmpfs (/dev/shm, Ray's default); nothing is allocated. Costs the page tables of "
       "what is mapped (2 MiB per GiB of store used), and while new store memory comes into use "
       "at most ~20% of a core, paused whenever the agent moves bytes. The agent's RSS then "
       "counts the store pages it maps (shared memory, counted once by the system). false: each "
       "pull maps its replica's pages itself."},
      {"exposure", "RAYFABRIC_EXPOSURE", Choice("object|arena|auto"), "auto",
       "agent: what a lease exposes. 'object': a registration (and key) of the leased object's "
       "bytes only, revoked at release or expiry; 'arena': one registration of the store's whole "
       "arena, read-only, for the agent's lifetime (no registration per lease); 'auto': object "
       "where registering costs nothing measurable (tcp, sockets, net: < 1 us at any size), arena "
       "on RDMA providers (verbs pins pages: ~0.1 ms + 41 us/MiB measured on Soft-RoCE)."},
      {"allow_unprotected_memory", "RAYFABRIC_ALLOW_UNPROTECTED_MEMORY", Spec(SettingType::kBool),
       "false",
       "agent: serve plasma memory even where the provider does not enforce registration access "
       "(verbs or efa with libfabric's MR cache on, shm): peers holding or guessing a key could "
       "then WRITE the store. Prefer FI_MR_CACHE_MONITOR=disabled (rayfabric's launcher sets "
       "it, with the device-memory monitors off, when no MR-cache variable is set)."},
      {"lease_ttl_ms", "RAYFABRIC_LEASE_TTL_MS", IntAtLeast(1), "60000",
       "agent: a lease a reader never released is unpinned after this long (it bounds how long a "
       "dead reader can hold objects in the store)."},
      {"max_lease_ttl_ms", "RAYFABRIC_MAX_LEASE_TTL_MS", IntAtLeast(1), "600000",
       "agent: the longest lease a reader may ask for; longer requests are clamped to it (a "
       "reader asks for as long as its pull may take)."},
      {"max_lease_bytes_per_peer", "RAYFABRIC_MAX_LEASE_BYTES_PER_PEER", BytesOrShareAtLeast(1),
       "50%",
       "agent: bytes of objects one peer host may hold pinned under leases at once, as a size "
       "(e.g. 8G) or a share of the store's memory (e.g. 50%); more are refused "
       "(RESOURCE_EXHAUSTED) so that one host cannot pin the whole store."},
      {"max_leases", "RAYFABRIC_MAX_LEASES", IntAtLeast(1), "65536",
       "agent: active leases per agent; more are refused (RESOURCE_EXHAUSTED) so that readers "
       "cannot pin the whole store."},
      {"store_timeout_ms", "RAYFABRIC_STORE_TIMEOUT_MS", IntAtLeast(1), "30000",
       "agent: a plasma store that does not answer a request for this long breaks that "
       "connection; the agent replaces it (a serving one stays open while leases granted on it "
       "live, so their pins do)."},
      {"create_timeout_ms", "RAYFABRIC_CREATE_TIMEOUT_MS", IntAtLeast(1), "10000",
       "agent: how long a pull waits for room in a full local store before it gives up (and the "
       "caller falls back to Ray's path)."},
  };
  return table;
}

const char* SettingTypeName(SettingType type) {
  switch (type) {
    case SettingType::kText:
      return "text";
    case SettingType::kList:
      return "list";
    case SettingType::kBool:
      return "bool";
    case SettingType::kInt:
      return "int";
    case SettingType::kBytes:
      return "bytes";
    case SettingType::kBytesOrShare:
      return "bytes or share";
    case SettingType::kChoice:
      return "choice";
  }
  return "text";
}

namespace {

std::vector<std::string> SplitChoices(const std::string& choices) {
  std::vector<std::string> each;
  size_t from = 0;
  for (size_t bar = choices.find('|'); bar != std::string::npos; bar = choices.find('|', from)) {
    each.push_back(choices.substr(from, bar - from));
    from = bar + 1;
  }
  each.push_back(choices.substr(from));
  return each;
}

// "object|arena|auto" as "object, arena or auto".
std::string ChoicesInWords(const std::string& choices) {
  const std::vector<std::string> each = SplitChoices(choices);
  std::string out;
  for (size_t i = 0; i < each.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == each.size() ? " or " : ", ") + each[i];
  }
  return out;
}

bool IsChoice(const std::string& value, const std::string& choices) {
  const std::vector<std::string> each = SplitChoices(choices);
  return std::find(each.begin(), each.end(), value) != each.end();
}

std::string SizeInWords(int64_t bytes) {
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

// The bound of `spec` in words ("at least 1", "in [1, 64]"); "" when unbounded.
std::string BoundInWords(const SettingSpec& spec, bool sizes) {
  const bool low = spec.min != std::numeric_limits<int64_t>::min();
  const bool high = spec.max != std::numeric_limits<int64_t>::max();
  auto word = [sizes](int64_t v) { return sizes ? SizeInWords(v) : std::to_string(v); };
  if (low && high) return "in [" + word(spec.min) + ", " + word(spec.max) + "]";
  if (low) return "at least " + word(spec.min);
  if (high) return "at most " + word(spec.max);
  return "";
}

// The share in "50%" as a fraction in (0, 1].
Result<double> ParseShare(const std::string& text) {
  char* end = nullptr;
  const double pct = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() - 1 || !(pct > 0) || pct > 100) {
    return InvalidArgument("a share must be in (0%, 100%]");
  }
  return pct / 100.0;
}

}  // namespace

Config Config::FromEnvironment() {
  Config config;
  for (const ConfigEntry& e : ConfigTable()) {
    const char* env = std::getenv(e.env);
    if (env != nullptr) {
      config.values_[e.name] = {env, std::string("env ") + e.env};
    } else {
      config.values_[e.name] = {e.default_value, "default"};
    }
  }
  return config;
}

Status Config::Set(const std::string& name, const std::string& value) {
  auto it = values_.find(name);
  if (it == values_.end()) {
    std::string known;
    for (const auto& [setting, value] : values_) known += (known.empty() ? "" : ", ") + setting;
    return InvalidArgument("unknown setting '" + name + "'; the settings are " + known +
                           " (README.md, Configuration)");
  }
  it->second = {value, "override"};
  return Status::OK();
}

std::string Config::SourceOf(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second.source;
}

Status Config::Check(const ConfigEntry& entry) const {
  const std::string& value = GetString(entry.name);
  const SettingSpec& spec = entry.spec;
  Status bad;
  int64_t number = 0;
  bool bounded = false;  // a number to check against the spec's bounds
  switch (spec.type) {
    case SettingType::kText:
    case SettingType::kList:
      return Status::OK();
    case SettingType::kBool:
      bad = GetBool(entry.name).status();
      break;
    case SettingType::kChoice:
      if (!IsChoice(value, spec.choices)) {
        bad = InvalidArgument(std::string(entry.name) + "='" + value + "': use " +
                              ChoicesInWords(spec.choices));
      }
      break;
    case SettingType::kInt: {
      auto v = GetInt(entry.name);
      bad = v.status();
      if (v.ok()) number = *v, bounded = true;
      break;
    }
    case SettingType::kBytesOrShare:
      if (!value.empty() && value.back() == '%') {
        auto share = ParseShare(value);
        if (!share.ok()) {
          bad = InvalidArgument(std::string(entry.name) + "='" + value +
                                "': " + share.status().message());
        }
        break;
      }
      [[fallthrough]];
    case SettingType::kBytes: {
      auto v = GetBytes(entry.name);
      bad = v.status();
      if (v.ok()) {
        if (*v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          bad = InvalidArgument("setting " + std::string(entry.name) + "='" + value +
                                "' is too large");
        } else {
          number = static_cast<int64_t>(*v), bounded = true;
        }
      }
      break;
    }
  }
  if (bad.ok() && bounded && (number < spec.min || number > spec.max)) {
    const bool sizes = spec.type != SettingType::kInt;
    bad = InvalidArgument(std::string(entry.name) + "='" + value + "' must be " +
                          BoundInWords(spec, sizes));
  }
  if (bad.ok()) return bad;
  const std::string source = SourceOf(entry.name);
  return InvalidArgument(bad.message() + " (" +
                         (source == "override"  ? std::string("given as --") + entry.name
                          : source == "default" ? std::string("the default")
                                                : "from " + source) +
                         ")");
}

Status Config::Validate() const {
  std::string errors;
  for (const ConfigEntry& entry : ConfigTable()) {
    Status s = Check(entry);
    if (!s.ok()) errors += (errors.empty() ? "" : "; ") + s.message();
  }
  if (errors.empty()) return Status::OK();
  return InvalidArgument(
      errors + " (README.md, Configuration; `rayfabric doctor --settings` lists them all)");
}

Result<uint64_t> Config::GetBytesOrShare(const std::string& name, uint64_t whole) const {
  const std::string value = GetString(name);
  if (value.empty() || value.back() != '%') return GetBytes(name);
  auto share = ParseShare(value);
  if (!share.ok()) {
    return InvalidArgument("setting " + name + "='" + value + "': " + share.status().message());
  }
  return static_cast<uint64_t>(*share * static_cast<double>(whole));
}

std::string Config::GetString(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::string() : it->second.value;
}

Result<int64_t> Config::GetInt(const std::string& name) const {
  std::string text = GetString(name);
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end == nullptr || *end != '\0') {
    return InvalidArgument("setting " + name + "='" + text + "' is not an integer");
  }
  return static_cast<int64_t>(v);
}

Result<uint64_t> ParseBytes(const std::string& text) {
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) {
    return InvalidArgument("'" + text + "' is not a size (examples: 4096, 64K, 4M, 1G)");
  }
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  std::string suffix(end);
  uint64_t mult = 1;
  if (suffix.empty() || suffix == "B") {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KiB") {
    mult = 1ULL << 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MiB") {
    mult = 1ULL << 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GiB") {
    mult = 1ULL << 30;
  } else {
    return InvalidArgument("'" + text + "' has an unknown size suffix (use K, M or G)");
  }
  return static_cast<uint64_t>(v) * mult;
}

Result<uint64_t> Config::GetBytes(const std::string& name) const {
  auto r = ParseBytes(GetString(name));
  if (!r.ok()) return r.status().WithContext("setting " + name);
  return r;
}

Result<bool> Config::GetBool(const std::string& name) const {
  std::string t = GetString(name);
  if (t == "1" || t == "true" || t == "yes" || t == "on") return true;
  if (t == "0" || t == "false" || t == "no" || t == "off" || t.empty()) return false;
  return InvalidArgument("setting " + name + "='" + t + "' is not a boolean (true/false)");
}

namespace {
// What `spec` allows, in words ("an integer in [1, 64]", "object, arena or auto").
std::string AllowsInWords(const SettingSpec& spec) {
  switch (spec.type) {
    case SettingType::kText:
      return "text";
    case SettingType::kList:
      return "a comma list";
    case SettingType::kBool:
      return "true or false";
    case SettingType::kChoice:
      return ChoicesInWords(spec.choices);
    case SettingType::kInt: {
      const std::string bound = BoundInWords(spec, false);
      return "an integer" + (bound.empty() ? "" : " " + bound);
    }
    case SettingType::kBytes:
    case SettingType::kBytesOrShare: {
      const std::string bound = BoundInWords(spec, true);
      return std::string("a size (4096, 64K, 4M, 1G)") +
             (spec.type == SettingType::kBytesOrShare ? " or a share (50%)" : "") +
             (bound.empty() ? "" : ", " + bound);
    }
  }
  return "text";
}
}  // namespace

namespace {
// `text` as comment lines ("# ...") of at most ~100 characters, broken between words.
std::string AsComment(const std::string& text) {
  std::string out;
  std::string line;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    if (!line.empty() && line.size() + 1 + word.size() > 98) {
      out += "# " + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + "# " + line + "\n";
}
}  // namespace

std::string Config::Listing() const {
  std::ostringstream os;
  for (const ConfigEntry& e : ConfigTable()) {
    const Value& v = values_.at(e.name);
    os << AsComment(e.doc) << "# " << AllowsInWords(e.spec) << "; default '" << e.default_value
       << "'" << (v.source == "default" ? "" : "; set by " + v.source) << "\n"
       << e.env << "=" << v.value << "\n\n";
  }
  return os.str();
}

std::string Config::ListingJson() const {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const ConfigEntry& e : ConfigTable()) {
    const Value& v = values_.at(e.name);
    os << (first ? "" : ",") << "{\"name\":\"" << e.name << "\",\"env\":\"" << e.env
       << "\",\"type\":\"" << SettingTypeName(e.spec.type) << "\",\"allows\":\""
       << JsonEscape(AllowsInWords(e.spec)) << "\",\"default\":\"" << JsonEscape(e.default_value)
       << "\",\"value\":\"" << JsonEscape(v.value) << "\",\"source\":\"" << JsonEscape(v.source)
       << "\",\"doc\":\"" << JsonEscape(e.doc) << "\"}";
    first = false;
  }
  os << "]";
  return os.str();
}

std::string Config::Describe() const {
  std::ostringstream os;
  for (const ConfigEntry& e : ConfigTable()) {
    const Value& v = values_.at(e.name);
    os << e.name << " = '" << v.value << "' (" << v.source << ")\n";
  }
  return os.str();
}

}  // namespace rayfabric
