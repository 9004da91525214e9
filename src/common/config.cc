#include "rayfabric/config.h"

#include <cctype>
#include <cstdlib>
#include <sstream>

namespace rayfabric {

const std::vector<ConfigEntry>& ConfigTable() {
  static const std::vector<ConfigEntry> table = {
      {"provider", "RAYFABRIC_PROVIDER", "",
       "libfabric providers to use, a comma list (e.g. 'verbs;ofi_rxm,tcp;ofi_rxm', 'efa', "
       "'sockets'); empty: rank what fi_info offers (efa, verbs above tcp, tcp above sockets) and "
       "take the best RDMA provider plus the best socket provider. An agent opens them all and "
       "each pair of nodes uses the best one both have; single-engine tools use the first. "
       "FI_PROVIDER, if set, also restricts what libfabric offers."},
      {"domain", "RAYFABRIC_DOMAIN", "",
       "libfabric domain (NIC) names, a comma list, e.g. 'rxe0', 'mlx5_0,mlx5_1', 'eth0', for "
       "the providers that offer them: the first one a provider offers is its domain, the others "
       "it offers are further rails (large transfers are striped across them). Empty: the domain "
       "holding the node's IP (the agent's --listen host), else the first non-loopback one, plus "
       "on an RDMA provider every other domain of the same fabric (up to max_rails)."},
      {"max_rails", "RAYFABRIC_MAX_RAILS", "4",
       "the most domains (NICs) of one RDMA provider a node stripes across when RAYFABRIC_DOMAIN "
       "does not list them; 1: one NIC per provider. Socket providers use one interface unless "
       "RAYFABRIC_DOMAIN lists several."},
      {"stripe_min", "RAYFABRIC_STRIPE_MIN", "4M",
       "the least bytes one rail moves of a striped transfer: a transfer of n bytes uses at most "
       "n / stripe_min rails (smaller ones use one)."},
      {"require_rdma", "RAYFABRIC_REQUIRE_RDMA", "false",
       "fail at startup instead of falling back to a non-RDMA provider (tcp, sockets, shm, udp)."},
      {"chunk_size", "RAYFABRIC_CHUNK_SIZE", "4M",
       "largest single fi_read/fi_write; capped by the provider's max_msg_size."},
      {"max_inflight", "RAYFABRIC_MAX_INFLIGHT", "16",
       "RMA operations kept in flight per transfer."},
      {"op_timeout_ms", "RAYFABRIC_OP_TIMEOUT_MS", "30000",
       "progress timeout: a transfer in which no operation completed for this long fails with "
       "TimedOut (dead or frozen peer, cut link); a large transfer on a slow link that keeps "
       "completing operations never times out."},
      {"drain_timeout_ms", "RAYFABRIC_DRAIN_TIMEOUT_MS", "5000",
       "after a transfer failed, how long its operations still in flight may take to come back "
       "before the engine resets its endpoint (closing every connection) so that none of them "
       "can write a byte afterwards."},
      {"max_registration", "RAYFABRIC_MAX_REGISTRATION", "4G",
       "largest single memory registration: larger ranges (an object store's arena, a large "
       "object) are registered in slices of this size. 4G fits EFA (one registration with remote "
       "access is capped at 1M pages) and every NIC known; an object across two slices moves "
       "as two reads."},
      {"log_level", "RAYFABRIC_LOG_LEVEL", "info", "error, warn, info or debug."},
      {"warm_store", "RAYFABRIC_WARM_STORE", "true",
       "agent: map into the agent, in idle time, the store's pages that this node's processes "
       "already use (a worker's put, an earlier replica), and remember which are mapped, so that "
       "a replica written there takes no page fault and no mapping pass during its pull. Only a "
       "store on tmpfs (/dev/shm, Ray's default); nothing is allocated. Costs the page tables of "
       "what is mapped (2 MiB per GiB of store used), and while new store memory comes into use "
       "at most ~20% of a core, paused whenever the agent moves bytes. The agent's RSS then "
       "counts the store pages it maps (shared memory, counted once by the system). false: each "
       "pull maps its replica's pages itself."},
      {"exposure", "RAYFABRIC_EXPOSURE", "auto",
       "agent: what a lease exposes. 'object': a registration (and key) of the leased object's "
       "bytes only, revoked at release or expiry; 'arena': one registration of the store's whole "
       "arena, read-only, for the agent's lifetime (no registration per lease); 'auto': object "
       "where registering costs nothing measurable (tcp, sockets, net: < 1 us at any size), arena "
       "on RDMA providers (verbs pins pages: ~0.1 ms + 41 us/MiB measured on Soft-RoCE)."},
      {"allow_unprotected_memory", "RAYFABRIC_ALLOW_UNPROTECTED_MEMORY", "false",
       "agent: serve plasma memory even where the provider does not enforce registration access "
       "(verbs or efa with libfabric's MR cache on, shm): peers holding or guessing a key could "
       "then WRITE the store. Prefer FI_MR_CACHE_MONITOR=disabled (rayfabric's launcher sets "
       "it, with the device-memory monitors off, when no MR-cache variable is set)."},
      {"lease_ttl_ms", "RAYFABRIC_LEASE_TTL_MS", "60000",
       "agent: a lease a reader never released is unpinned after this long (it bounds how long a "
       "dead reader can hold objects in the store)."},
      {"max_lease_ttl_ms", "RAYFABRIC_MAX_LEASE_TTL_MS", "600000",
       "agent: the longest lease a reader may ask for; longer requests are clamped to it (a "
       "reader asks for as long as its pull may take)."},
      {"max_lease_bytes_per_peer", "RAYFABRIC_MAX_LEASE_BYTES_PER_PEER", "50%",
       "agent: bytes of objects one peer host may hold pinned under leases at once, as a size "
       "(e.g. 8G) or a share of the store's memory (e.g. 50%); more are refused "
       "(RESOURCE_EXHAUSTED) so that one host cannot pin the whole store."},
      {"max_leases", "RAYFABRIC_MAX_LEASES", "65536",
       "agent: active leases per agent; more are refused (RESOURCE_EXHAUSTED) so that readers "
       "cannot pin the whole store."},
      {"store_timeout_ms", "RAYFABRIC_STORE_TIMEOUT_MS", "30000",
       "agent: a plasma store that does not answer a request for this long breaks that "
       "connection; the agent replaces it (a serving one stays open while leases granted on it "
       "live, so their pins do)."},
      {"create_timeout_ms", "RAYFABRIC_CREATE_TIMEOUT_MS", "10000",
       "agent: how long a pull waits for room in a full local store before it gives up (and the "
       "caller falls back to Ray's path)."},
  };
  return table;
}

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

std::string Config::Describe() const {
  std::ostringstream os;
  for (const ConfigEntry& e : ConfigTable()) {
    const Value& v = values_.at(e.name);
    os << e.name << " = '" << v.value << "' (" << v.source << ")\n";
  }
  return os.str();
}

}  // namespace rayfabric
