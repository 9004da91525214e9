#include "fabric/provider.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <strings.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sstream>

#include "fabric/fabric_error.h"
#include "rayfabric/json.h"

namespace rayfabric::fabric {
namespace {

// Which fabrics a node opens by default: one of each class that reaches other hosts.
enum class FabricClass { kRdma, kSockets, kOther };

// How a provider's target checks the key of an incoming RMA, and what fi_close() of a
// registration does to that key (ProviderProfile's key fields; see DecideKeyLifetime).
enum class KeyScheme {
  kUnknown,          // not checked against the provider's sources: promise nothing
  kVerifiedMap,      // keys verified in an MR map that fi_close() removes them from
  kVerbsMrCache,     // verbs: libfabric's MR cache, unless FI_MR_CACHE_* turns it off
  kEfaMrCache,       // efa: its MR cache without FI_MR_LOCAL, unless FI_EFA_MR_CACHE_ENABLE=0
  kUnchecked,        // shm: process_vm_readv/writev; no key is looked at
  kUtilityVerified,  // ofi_rxd: RMA emulated with messages, the utility verifies its own keys
};

// What rayfabric knows of each provider, as libfabric names it (a core provider, or
// "core;utility"): one row per provider, as libfabric's own *_attr.c and UCX's iface_query declare
// capabilities; every profile field that depends on the provider is computed from its row. The
// facts are libfabric 1.17's (the same code paths are in 1.18 - 1.20): verbs_domain.c /
// verbs_mr.c (ofi_mr_cache_init), util_mr_cache.c, util_mem_monitor.c, efa_domain.c, rxd_cq.c,
// tcpx_progress.c, xnet_progress.c, sock_progress.c, smr_*.c.
struct ProviderTraits {
  const char* name;
  int rank;  // higher is preferred; hardware RDMA first, then socket emulations
  bool rdma;
  FabricClass fabric_class;
  KeyScheme keys;
  // Under manual progress, bytes move only inside this process's libfabric calls (1.17's tcp
  // and net have no progress thread: tcpx_progress runs inside CQ reads and endpoint calls).
  bool progress_by_caller;
  // Names a shared resource of each endpoint after its source address, by default the pid.
  bool names_endpoint_by_pid;
  const char* note;
};

constexpr FabricClass kRdmaClass = FabricClass::kRdma;
constexpr FabricClass kSocketClass = FabricClass::kSockets;
constexpr FabricClass kOtherClass = FabricClass::kOther;

constexpr ProviderTraits kProviders[] = {
    {"cxi", 100, true, kRdmaClass, KeyScheme::kUnknown, false, false, "HPE Slingshot"},
    {"efa", 100, true, kRdmaClass, KeyScheme::kEfaMrCache, false, false,
     "AWS Elastic Fabric Adapter"},
    {"verbs;ofi_rxm", 90, true, kRdmaClass, KeyScheme::kVerbsMrCache, false, false,
     "InfiniBand / RoCE verbs under the RDM utility provider"},
    {"opx", 85, true, kRdmaClass, KeyScheme::kUnknown, false, false, "Omni-Path Express"},
    {"psm3", 80, true, kRdmaClass, KeyScheme::kUnknown, false, false, "Intel PSM3 (verbs-based)"},
    {"psm2", 80, true, kRdmaClass, KeyScheme::kUnknown, false, false, "Omni-Path PSM2"},
    {"verbs;ofi_rxd", 70, true, kRdmaClass, KeyScheme::kUtilityVerified, false, false,
     "verbs datagrams under the RDM utility provider"},
    {"tcp;ofi_rxm", 50, false, kSocketClass, KeyScheme::kVerifiedMap, true, false,
     "TCP sockets (no RDMA)"},
    {"tcp", 50, false, kSocketClass, KeyScheme::kVerifiedMap, true, false, "TCP sockets (no RDMA)"},
    {"net", 45, false, kSocketClass, KeyScheme::kVerifiedMap, true, false,
     "TCP sockets, native RDM (no RDMA)"},
    {"sockets", 30, false, kSocketClass, KeyScheme::kVerifiedMap, false, false,
     "legacy sockets provider (no RDMA)"},
    {"shm", 10, false, kOtherClass, KeyScheme::kUnchecked, false, true,
     "shared memory: same host only"},
    {"udp;ofi_rxd", 5, false, kOtherClass, KeyScheme::kUtilityVerified, false, false,
     "UDP datagrams (slow)"},
};

// The row of exactly `name`, or null for a provider not in the table.
const ProviderTraits* FindProvider(const std::string& name) {
  for (const ProviderTraits& row : kProviders) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

// The traits of any provider: its row; else, for a combination not in the table ("sockets;ofi_rxm",
// "verbs;ofi_foo"), unranked and not RDMA (so not opened by default as an RDMA fabric), with its
// core provider's keys, class and progress: the core's own row, or for a core listed only in
// combinations (verbs), the keys of its listed combination that is not ofi_rxd; ofi_rxd's keys
// where that is the utility. Else nothing known (KeyScheme::kUnknown, not opened by default).
ProviderTraits TraitsOf(const std::string& name) {
  if (const ProviderTraits* row = FindProvider(name)) return *row;
  const size_t semi = name.find(';');
  const std::string core_name = name.substr(0, semi);
  const bool rxd = semi != std::string::npos && name.substr(semi + 1) == "ofi_rxd";
  ProviderTraits out{nullptr, 1, false, kOtherClass, KeyScheme::kUnknown, false, false, nullptr};
  if (const ProviderTraits* core = FindProvider(core_name)) {
    out.fabric_class = core->fabric_class == kRdmaClass ? kOtherClass : core->fabric_class;
    out.keys = core->keys;
    out.progress_by_caller = core->progress_by_caller;
    out.names_endpoint_by_pid = core->names_endpoint_by_pid && !rxd;
  } else {
    for (const ProviderTraits& row : kProviders) {
      const std::string listed = row.name;
      if (listed.rfind(core_name + ";", 0) == 0 && row.keys != KeyScheme::kUtilityVerified) {
        out.keys = row.keys;
        break;
      }
    }
  }
  if (rxd) out.keys = KeyScheme::kUtilityVerified;
  return out;
}

bool IsLoopbackDomain(const std::string& domain) { return domain == "lo"; }

// libfabric reads its own FI_* variables with strtol(s, NULL, 0) and a bool parser that takes
// 0/false/no/off and 1/true/yes/on (src/var.c); these mirror it. We only read them.
const char* FiEnv(const char* name) { return std::getenv(name); }

int FiEnvBool(const char* name, int fallback) {
  const char* v = FiEnv(name);
  if (v == nullptr) return fallback;
  for (const char* f : {"0", "false", "no", "off"}) {
    if (strcasecmp(v, f) == 0) return 0;
  }
  for (const char* t : {"1", "true", "yes", "on"}) {
    if (strcasecmp(v, t) == 0) return 1;
  }
  return fallback;  // libfabric ignores a value it cannot parse
}

// KeyScheme::kVerbsMrCache: whether libfabric's MR cache is on (a NULL system monitor means no
// cache; max_cnt == 0 too), from the user's FI_* variables.
void DecideVerbsKeys(ProviderProfile& p) {
  const char* max_count = FiEnv("FI_MR_CACHE_MAX_COUNT");
  const char* monitor = FiEnv("FI_MR_CACHE_MONITOR");
  const bool monitor_off = monitor != nullptr && std::strcmp(monitor, "disabled") == 0;
  if (max_count != nullptr && std::strtol(max_count, nullptr, 0) == 0) {
    p.key_lifetime = "verbs MR cache off (FI_MR_CACHE_MAX_COUNT=" + std::string(max_count) +
                     "): fi_close() deregisters the ibv MR at once";
  } else if (monitor_off &&
             (!p.device_memory || FiEnvBool("FI_MR_CUDA_CACHE_MONITOR_ENABLED", 1) == 0)) {
    p.key_lifetime = "verbs MR cache off (FI_MR_CACHE_MONITOR=disabled" +
                     std::string(p.device_memory ? ", FI_MR_CUDA_CACHE_MONITOR_ENABLED=0" : "") +
                     "): fi_close() deregisters the ibv MR at once";
  } else if (monitor_off) {
    // FI_HMEM: CUDA registrations have a monitor of their own, which FI_MR_CACHE_MONITOR leaves on.
    p.mr_cache = true;
    p.key_lifetime =
        "verbs caches CUDA registrations (FI_MR_CACHE_MONITOR=disabled covers host memory only): "
        "set FI_MR_CUDA_CACHE_MONITOR_ENABLED=0 as well";
  } else {
    p.mr_cache = true;
    p.key_lifetime =
        "verbs registers through libfabric's MR cache: after fi_close() the ibv MR and its key "
        "stay valid until the cache evicts it (FI_MR_CACHE_MAX_COUNT, default 1024) or the pages "
        "are unmapped; set FI_MR_CACHE_MONITOR=disabled (and FI_MR_CUDA_CACHE_MONITOR_ENABLED=0) "
        "or FI_MR_CACHE_MAX_COUNT=0 to make deregistration revoke keys";
  }
  p.deregistration_revokes_keys = !p.mr_cache;
  p.enforces_access = !p.mr_cache;
  p.access_note = p.mr_cache
                      ? "the verbs MR cache registers every region with remote read, write and "
                        "atomic access, whatever was asked: set FI_MR_CACHE_MONITOR=disabled "
                        "(rayfabric's default) or FI_MR_CACHE_MAX_COUNT=0"
                      : "verbs without the MR cache registers with exactly the access asked for";
}

// KeyScheme::kEfaMrCache: efa opens its MR cache only without FI_MR_LOCAL and with
// FI_EFA_MR_CACHE_ENABLE.
void DecideEfaKeys(ProviderProfile& p) {
  if (p.local_desc) {
    p.key_lifetime = "efa with FI_MR_LOCAL opens no MR cache: fi_close() deregisters at once";
  } else if (FiEnvBool("FI_EFA_MR_CACHE_ENABLE", 1) == 0) {
    p.key_lifetime = "efa MR cache off (FI_EFA_MR_CACHE_ENABLE=0): fi_close() deregisters at once";
  } else {
    p.mr_cache = true;
    p.key_lifetime =
        "efa without FI_MR_LOCAL registers through libfabric's MR cache: keys outlive fi_close() "
        "until evicted; set FI_EFA_MR_CACHE_ENABLE=0 to make deregistration revoke keys";
  }
  p.deregistration_revokes_keys = !p.mr_cache;
  // From efa_mr.c (1.17), not run here: the device registration never grants remote write, and
  // emulated writes are checked against the region's access; but a device with RDMA read can
  // read every registration, local-only ones included.
  p.enforces_access = !p.mr_cache;
  p.access_note = p.mr_cache ? "efa MR cache on: access not known to be enforced"
                             : "efa: no remote write beyond what was asked (read: see docs)";
}

// Fills the key-lifetime and access fields of `p` (see ProviderProfile) from the provider's
// traits and the user's FI_* variables.
void DecideKeyLifetime(const ProviderTraits& traits, ProviderProfile& p) {
  const std::string& name = p.provider;
  const std::string core = name.substr(0, name.find(';'));
  p.checks_remote_keys = true;
  p.mr_cache = false;
  p.enforces_access = false;
  p.access_note = "not known for provider " + name + ": assume peers may write what they can key";
  switch (traits.keys) {
    case KeyScheme::kUtilityVerified:
      // The core provider's registrations are rxd's bounce buffers, never a user key.
      p.deregistration_revokes_keys = true;
      p.key_lifetime = "ofi_rxd verifies its own keys; fi_close() removes them at once";
      break;
    case KeyScheme::kVerbsMrCache:
      DecideVerbsKeys(p);
      break;
    case KeyScheme::kEfaMrCache:
      DecideEfaKeys(p);
      break;
    case KeyScheme::kUnchecked:
      p.checks_remote_keys = false;
      p.deregistration_revokes_keys = false;
      p.key_lifetime =
          core +
          " never checks RMA keys (process_vm_readv/writev): any same-host peer with the address "
          "can access the memory while it is mapped, registered or not";
      p.access_note = core + " checks neither keys nor access (process_vm_readv/writev)";
      break;
    case KeyScheme::kVerifiedMap:
      p.deregistration_revokes_keys = true;
      p.key_lifetime = core + " verifies keys in its MR map; fi_close() removes them at once";
      p.enforces_access = true;
      p.access_note = core + " checks each RMA's access against the region's (ofi_mr_verify)";
      break;
    case KeyScheme::kUnknown:
      // psm2, psm3, opx, cxi, usnic, ...: not checked against their sources; do not promise.
      p.deregistration_revokes_keys = false;
      p.key_lifetime =
          "not known for provider " + name + ": assume a deregistered key may stay valid";
      break;
  }
}

}  // namespace

std::unique_ptr<struct fi_info, InfoDeleter> EngineHints(const EngineOptions& options) {
  std::unique_ptr<struct fi_info, InfoDeleter> hints(fi_allocinfo());
  hints->ep_attr->type = FI_EP_RDM;
  hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ;
  if (options.remote_write) hints->caps |= FI_REMOTE_WRITE;
  // Every op carries a struct fi_context2 as its context, so both context modes are fine.
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT | FI_MR_RAW;
  hints->domain_attr->threading = FI_THREAD_SAFE;
  hints->domain_attr->av_type = FI_AV_UNSPEC;
  return hints;
}

ProviderProfile ProfileFromInfo(const struct fi_info* info) {
  ProviderProfile p;
  p.provider = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "";
  p.domain = info->domain_attr->name ? info->domain_attr->name : "";
  p.fabric = info->fabric_attr->name ? info->fabric_attr->name : "";
  const ProviderTraits traits = TraitsOf(p.provider);
  p.rdma = traits.rdma;
  uint64_t mode = static_cast<uint64_t>(info->domain_attr->mr_mode);
  p.mr_mode = mode;
  p.local_desc = (mode & FI_MR_LOCAL) != 0;
  p.virt_addr = (mode & FI_MR_VIRT_ADDR) != 0;
  p.prov_key = (mode & FI_MR_PROV_KEY) != 0;
  p.endpoint_mr = (mode & FI_MR_ENDPOINT) != 0;
  p.raw_key = (mode & FI_MR_RAW) != 0;
  p.allocated = (mode & FI_MR_ALLOCATED) != 0;
  p.key_size = info->domain_attr->mr_key_size;
  p.max_msg_size = info->ep_attr->max_msg_size;
  p.rma_iov_limit = info->tx_attr->rma_iov_limit;
  p.manual_progress = info->domain_attr->data_progress != FI_PROGRESS_AUTO;
  // Every provider not known to need this process's calls (unknown ones included) is assumed to
  // move bytes by itself (hardware RDMA, or a provider thread like sockets').
  p.bytes_move_without_progress = !(traits.progress_by_caller && p.manual_progress);
  p.thread_safe = info->domain_attr->threading == FI_THREAD_SAFE;
  p.string_address = info->addr_format == FI_ADDR_STR;
  p.device_memory = (info->caps & FI_HMEM) != 0;
  p.device_memory_note =
      p.device_memory ? "FI_HMEM offered: device buffers registered directly" : "host memory only";
  p.names_endpoint_by_pid = traits.names_endpoint_by_pid;
  DecideKeyLifetime(traits, p);
  return p;
}

uint64_t FabricAccess(uint32_t access) {
  uint64_t flags = 0;
  if (access & kLocalRead) flags |= FI_READ;
  if (access & kLocalWrite) flags |= FI_WRITE;
  if (access & kRemoteRead) flags |= FI_REMOTE_READ;
  if (access & kRemoteWrite) flags |= FI_REMOTE_WRITE;
  return flags;
}

namespace {

std::vector<std::string> SplitList(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    std::string item = list.substr(start, comma - start);
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (!item.empty()) out.push_back(item);
    start = comma + 1;
  }
  return out;
}

// The IP address of an fi_info entry's source address, "" when it has none (efa, shm, ...).
std::string SourceIp(const struct fi_info* info) {
  if (info->src_addr == nullptr) return "";
  char buf[INET6_ADDRSTRLEN] = {};
  const auto* sa = static_cast<const struct sockaddr*>(info->src_addr);
  if (sa->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const struct sockaddr_in*>(sa)->sin_addr, buf,
              sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const struct sockaddr_in6*>(sa)->sin6_addr, buf,
              sizeof(buf));
  }
  return buf;
}

// One fi_info entry and how well it fits.
struct Entry {
  const struct fi_info* info;
  std::string group;  // what it was selected for: a requested provider, or a fabric class
  ProviderCandidate candidate;
  int domain_score = 0;  // among domains of one provider: holds the node's IP, not loopback
  std::string domain_why;
};

}  // namespace

namespace {

// EngineOptions::device_memory: asks libfabric again for the same provider and domain with FI_HMEM
// (and FI_MR_HMEM, which providers that need descriptors for device buffers demand). Where it
// answers, the engine opens with that entry; otherwise `selected` stays as it was, noted.
void OfferDeviceMemory(SelectedProvider& selected, const EngineOptions& options) {
  const ProviderProfile& host = selected.report.chosen;
  auto hints = EngineHints(options);
  hints->caps |= FI_HMEM;
  hints->domain_attr->mr_mode |= FI_MR_HMEM;
  hints->fabric_attr->prov_name = strdup(host.provider.c_str());
  hints->domain_attr->name = strdup(host.domain.c_str());
  struct fi_info* raw = nullptr;
  const int ret = fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints.get(), &raw);
  std::unique_ptr<struct fi_info, InfoDeleter> infos(raw);
  const struct fi_info* chosen = selected.info.get();
  const struct fi_info* match = nullptr;
  for (const struct fi_info* i = ret == 0 ? infos.get() : nullptr; i != nullptr; i = i->next) {
    const bool same = i->fabric_attr->prov_name && host.provider == i->fabric_attr->prov_name &&
                      i->domain_attr->name && host.domain == i->domain_attr->name &&
                      (i->caps & FI_HMEM) != 0;
    // The same address the selection chose (the domain may hold several: the node's Ray IP
    // among them), so peers see the engine where they would without device memory.
    const bool same_address =
        i->addr_format == chosen->addr_format &&
        (chosen->src_addr == nullptr ||
         (i->src_addr != nullptr && i->src_addrlen == chosen->src_addrlen &&
          std::memcmp(i->src_addr, chosen->src_addr, chosen->src_addrlen) == 0));
    if (same && same_address) {
      match = i;
      break;
    }
  }
  if (match == nullptr) {
    selected.report.chosen.device_memory_note =
        host.provider + " offers no FI_HMEM" +
        (ret != 0 && ret != -FI_ENODATA ? " (fi_getinfo: " + std::string(fi_strerror(-ret)) + ")"
                                        : std::string()) +
        ": device buffers are staged through host memory";
    return;
  }
  selected.host_info = std::move(selected.info);
  selected.host_profile = selected.report.chosen;  // its note is set if it is ever opened
  selected.info.reset(fi_dupinfo(match));
  ProviderProfile upgraded = ProfileFromInfo(match);
  upgraded.device_memory_note =
      "FI_HMEM offered by " + host.provider + ": device (CUDA) buffers registered directly";
  selected.report.chosen = std::move(upgraded);
}

}  // namespace

namespace {

// What the configuration asks of the selection.
struct SelectionRequest {
  std::vector<std::string> wanted;  // RAYFABRIC_PROVIDER's list (empty: rayfabric chooses)
  std::string want_domain;          // RAYFABRIC_DOMAIN's list, joined again (for messages)
  std::vector<std::string> want_domains;
  bool require_rdma = false;
  int64_t max_rails = 1;
  const char* fi_provider_env = nullptr;
  std::string filters;  // the request in one line, for errors

  // Where `domain` is in RAYFABRIC_DOMAIN's list, or -1.
  int ListedAt(const std::string& domain) const {
    auto it = std::find(want_domains.begin(), want_domains.end(), domain);
    return it == want_domains.end() ? -1 : static_cast<int>(it - want_domains.begin());
  }
};

std::string JoinList(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ",") + item;
  return out;
}

SelectionRequest RequestFrom(const EngineSettings& settings) {
  SelectionRequest req;
  req.wanted = settings.providers;
  req.want_domains = settings.domains;
  req.want_domain = JoinList(settings.domains);
  req.require_rdma = settings.require_rdma;
  req.max_rails = settings.max_rails;
  req.fi_provider_env = std::getenv("FI_PROVIDER");
  req.filters =
      std::string("provider='") + JoinList(settings.providers) + "' domain='" + req.want_domain +
      "'" + (req.fi_provider_env ? std::string(" FI_PROVIDER='") + req.fi_provider_env + "'" : "");
  return req;
}

}  // namespace

Result<EngineSettings> EngineSettings::FromConfig(const Config& config) {
  // Every setting against the table, once, before anything is opened: the getters then hold.
  RF_RETURN_IF_ERROR(config.Validate());
  EngineSettings s;
  s.providers = SplitList(config.GetString("provider"));
  s.domains = SplitList(config.GetString("domain"));
  s.require_rdma = config.GetBool("require_rdma").value();
  s.max_rails = static_cast<int>(config.GetInt("max_rails").value());
  s.chunk_size = config.GetBytes("chunk_size").value();
  s.max_inflight = static_cast<size_t>(config.GetInt("max_inflight").value());
  s.op_timeout = std::chrono::milliseconds(config.GetInt("op_timeout_ms").value());
  s.drain_timeout = std::chrono::milliseconds(config.GetInt("drain_timeout_ms").value());
  s.max_registration = config.GetBytes("max_registration").value();
  s.progress_spin = std::chrono::microseconds(config.GetInt("progress_spin_us").value());
  return s;
}

Status EngineSettings::Check() const {
  auto refuse = [](const std::string& what) {
    return InvalidArgument("engine settings: " + what +
                           " (made by hand? EngineSettings::FromConfig reads the table's)");
  };
  if (max_rails < 1) return refuse("max_rails " + std::to_string(max_rails) + " < 1");
  if (chunk_size == 0) return refuse("chunk_size 0");
  if (max_inflight == 0) return refuse("max_inflight 0");
  if (op_timeout.count() <= 0) return refuse("op_timeout not positive");
  if (drain_timeout.count() <= 0) return refuse("drain_timeout not positive");
  if (max_registration < 4096) return refuse("max_registration under one page");
  if (progress_spin.count() < 0) return refuse("progress_spin negative");
  return Status::OK();
}

namespace {

// An fi_info entry as a candidate: what it is, which group it competes in, how well its domain
// fits.
Entry EntryOf(const struct fi_info* info, const std::string& query, const EngineOptions& options) {
  Entry e;
  e.info = info;
  ProviderCandidate& c = e.candidate;
  c.provider = info->fabric_attr->prov_name ? info->fabric_attr->prov_name : "?";
  c.domain = info->domain_attr->name ? info->domain_attr->name : "?";
  c.ip = SourceIp(info);
  const ProviderTraits traits = TraitsOf(c.provider);
  c.rank = traits.rank;
  c.rdma = traits.rdma;
  if (!query.empty()) {
    e.group = query;
  } else {
    e.group = traits.fabric_class == FabricClass::kRdma      ? "rdma"
              : traits.fabric_class == FabricClass::kSockets ? "sockets"
                                                             : "";
  }
  // Loopback domains cannot reach other hosts: only picked if the node is known by a loopback
  // address (a one-host cluster) or nothing else is there.
  if (!options.preferred_ip.empty() && c.ip == options.preferred_ip) {
    e.domain_score = 2;
    e.domain_why = "holds the node's IP " + c.ip;
  } else if (!IsLoopbackDomain(c.domain)) {
    e.domain_score = 1;
    e.domain_why =
        options.preferred_ip.empty()
            ? "first non-loopback domain"
            : "no domain holds the node's IP " + options.preferred_ip + "; first non-loopback one";
  } else {
    e.domain_why = "loopback: only this host";
  }
  return e;
}

// Step 1: one fi_getinfo per requested provider (libfabric resolves "tcp" to "tcp;ofi_rxm"), or
// one for everything; `lists` keeps the entries alive.
Result<std::vector<Entry>> QueryEntries(
    const SelectionRequest& req, const EngineOptions& options,
    std::vector<std::unique_ptr<struct fi_info, InfoDeleter>>& lists) {
  std::vector<Entry> entries;
  const std::vector<std::string> queries =
      req.wanted.empty() ? std::vector<std::string>{""} : req.wanted;
  for (const std::string& query : queries) {
    auto hints = EngineHints(options);
    if (!query.empty()) hints->fabric_attr->prov_name = strdup(query.c_str());
    struct fi_info* raw = nullptr;
    const int ret = fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints.get(), &raw);
    std::unique_ptr<struct fi_info, InfoDeleter> infos(raw);
    if (ret == -FI_ENODATA || (ret == 0 && infos == nullptr)) {
      return NotFound(
          "no libfabric provider offers RDM endpoints with RMA read/write for " +
          (query.empty() ? req.filters : "provider '" + query + "' (" + req.filters + ")") +
          ". `fi_info -l` lists the installed providers; `rayfabric doctor` explains "
          "why an RDMA device is not usable; unset RAYFABRIC_PROVIDER/FI_PROVIDER to "
          "let rayfabric choose");
    }
    if (ret != 0) return FabricStatus(ret, "fi_getinfo(" + req.filters + ")");
    for (const struct fi_info* i = infos.get(); i != nullptr; i = i->next) {
      entries.push_back(EntryOf(i, query, options));
    }
    lists.push_back(std::move(infos));
  }
  return entries;
}

// Step 2: fi_info lists one entry per address (IPv4, IPv6) and mode combination: one candidate
// per provider and domain, its best-fitting entry.
std::vector<Entry> BestPerDomain(std::vector<Entry> entries) {
  std::vector<Entry> unique;
  for (Entry& e : entries) {
    auto same = std::find_if(unique.begin(), unique.end(), [&](const Entry& o) {
      return o.candidate.provider == e.candidate.provider &&
             o.candidate.domain == e.candidate.domain;
    });
    if (same == unique.end()) {
      unique.push_back(std::move(e));
    } else if (e.domain_score > same->domain_score) {
      *same = std::move(e);
    }
  }
  return unique;
}

// Step 3: RAYFABRIC_DOMAIN (a comma list) applies to every provider that offers one of its
// domains: that provider keeps exactly the listed domains it offers, the first listed one as its
// domain and the others as further rails (utility providers like ofi_rxm over tcp ignore the
// domain hint and list every domain: enforced here). Returns the providers it applies to.
Result<std::set<std::string>> ApplyDomainList(const SelectionRequest& req,
                                              std::vector<Entry>& unique) {
  std::set<std::string> listed_providers;
  if (req.want_domains.empty()) return listed_providers;
  for (const Entry& e : unique) {
    if (req.ListedAt(e.candidate.domain) >= 0) listed_providers.insert(e.candidate.provider);
  }
  if (listed_providers.empty()) {
    std::string other_domains;
    for (const Entry& e : unique) {
      other_domains += " " + e.candidate.provider + "/" + e.candidate.domain;
    }
    return NotFound("no libfabric provider offers domain '" + req.want_domain + "' for " +
                    req.filters + " (offered instead:" + other_domains +
                    "). Set RAYFABRIC_DOMAIN to one of those, or unset it to let rayfabric "
                    "choose; `rayfabric doctor` lists every domain");
  }
  std::vector<Entry> kept;
  for (Entry& e : unique) {
    const int at = req.ListedAt(e.candidate.domain);
    if (listed_providers.count(e.candidate.provider) > 0 && at < 0) continue;
    if (at >= 0) {
      e.domain_why = "requested by RAYFABRIC_DOMAIN";
      e.domain_score = 3 + static_cast<int>(req.want_domains.size()) - at;  // first listed wins
    }
    kept.push_back(std::move(e));
  }
  unique = std::move(kept);
  return listed_providers;
}

// Step 4: the best entry of each group, each provider once ("tcp" and "tcp;ofi_rxm" may resolve
// to one), ranked by provider, best first.
Result<std::vector<Entry*>> ChoosePrimaries(const SelectionRequest& req,
                                            std::vector<Entry>& unique) {
  auto score = [](const Entry& e) { return e.candidate.rank * 1000 + e.domain_score; };
  std::vector<Entry*> chosen;
  for (Entry& e : unique) {
    ProviderCandidate& c = e.candidate;
    if (e.group.empty()) {
      c.verdict =
          "passed over: not opened by default (same host or datagrams only); name it in "
          "RAYFABRIC_PROVIDER to use it";
      continue;
    }
    if (req.require_rdma && !c.rdma) {
      c.verdict = "passed over: not RDMA and require_rdma is set";
      continue;
    }
    auto best = std::find_if(chosen.begin(), chosen.end(),
                             [&](const Entry* o) { return o->group == e.group; });
    if (best == chosen.end()) {
      chosen.push_back(&e);
    } else if (score(e) > score(**best)) {
      *best = &e;
    }
  }
  std::vector<Entry*> distinct;
  for (Entry* e : chosen) {
    if (std::none_of(distinct.begin(), distinct.end(), [&](const Entry* o) {
          return o->candidate.provider == e->candidate.provider;
        })) {
      distinct.push_back(e);
    }
  }
  std::stable_sort(distinct.begin(), distinct.end(), [](const Entry* a, const Entry* b) {
    return a->candidate.rank > b->candidate.rank;
  });
  if (!distinct.empty()) return distinct;
  std::string seen;
  for (const Entry& e : unique) seen += " " + e.candidate.provider + "/" + e.candidate.domain;
  if (req.require_rdma) {
    return Unavailable("require_rdma is set but libfabric offers no RDMA provider (seen:" + seen +
                       "). Run `rayfabric doctor` to see why no RDMA device is usable, or "
                       "unset RAYFABRIC_REQUIRE_RDMA to allow the TCP fallback");
  }
  return NotFound("libfabric offers no provider that reaches other hosts (seen:" + seen +
                  "); name one in RAYFABRIC_PROVIDER to use it anyway");
}

std::string FabricName(const Entry* e) {
  return e->info->fabric_attr->name ? e->info->fabric_attr->name : "";
}

// Step 5: each primary's rails (itself first, then its further domains). Listed in
// RAYFABRIC_DOMAIN: exactly those, in list order. Otherwise, on an RDMA provider, its other
// non-loopback domains on the same fabric (several HCAs or EFA devices of one network), up to
// max_rails; a socket provider's interfaces are separate networks: one.
std::vector<std::vector<Entry*>> ChooseRails(const SelectionRequest& req,
                                             const std::vector<Entry*>& primaries,
                                             std::vector<Entry>& unique,
                                             const std::set<std::string>& listed_providers) {
  std::vector<std::vector<Entry*>> rails(primaries.size());
  for (size_t i = 0; i < primaries.size(); ++i) {
    Entry* primary = primaries[i];
    rails[i].push_back(primary);
    const bool listed = listed_providers.count(primary->candidate.provider) > 0;
    if (!listed && (!primary->candidate.rdma || req.max_rails <= 1)) continue;
    std::vector<Entry*> extra;
    for (Entry& e : unique) {
      if (&e == primary || e.candidate.provider != primary->candidate.provider) continue;
      if (!listed &&
          (IsLoopbackDomain(e.candidate.domain) || FabricName(&e) != FabricName(primary)))
        continue;
      extra.push_back(&e);
    }
    if (listed) {
      std::stable_sort(extra.begin(), extra.end(), [&](const Entry* a, const Entry* b) {
        return req.ListedAt(a->candidate.domain) < req.ListedAt(b->candidate.domain);
      });
    }
    for (Entry* e : extra) {
      if (!listed && rails[i].size() >= static_cast<size_t>(req.max_rails)) break;
      e->candidate.verdict =
          "chosen as rail " + std::to_string(rails[i].size() + 1) + " of " +
          primary->candidate.provider + " (" +
          (listed ? "requested by RAYFABRIC_DOMAIN"
                  : "same fabric " + FabricName(e) + " as " + primary->candidate.domain) +
          ")";
      e->domain_why = e->candidate.verdict.substr(7);
      rails[i].push_back(e);
    }
  }
  return rails;
}

// Step 6: every candidate with its verdict (why it was chosen, or what fit better).
std::vector<ProviderCandidate> Verdicts(std::vector<Entry>& unique,
                                        const std::vector<Entry*>& primaries) {
  std::vector<ProviderCandidate> candidates;
  for (Entry& e : unique) {
    if (e.candidate.verdict.empty()) {
      if (std::find(primaries.begin(), primaries.end(), &e) != primaries.end()) {
        e.candidate.verdict = "chosen (" + e.domain_why + ")";
      } else {
        auto winner = std::find_if(primaries.begin(), primaries.end(), [&](const Entry* o) {
          return o->group == e.group || o->candidate.provider == e.candidate.provider;
        });
        e.candidate.verdict = winner == primaries.end()
                                  ? "passed over"
                                  : "passed over: " + (*winner)->candidate.provider + "/" +
                                        (*winner)->candidate.domain + " fits better (" +
                                        (*winner)->domain_why + ")";
      }
    }
    candidates.push_back(e.candidate);
  }
  return candidates;
}

// Why a primary was chosen, in one line.
std::string PrimaryReason(const SelectionRequest& req, const Entry& e, const ProviderProfile& p,
                          size_t primaries) {
  const ProviderTraits* row = FindProvider(p.provider);
  const std::string why = !req.wanted.empty()   ? "requested by RAYFABRIC_PROVIDER/--provider"
                          : req.fi_provider_env ? "FI_PROVIDER restricts libfabric to it"
                          : e.group == "rdma"   ? "highest ranked RDMA provider fi_info offers"
                          : primaries > 1 ? "highest ranked socket provider: for peers without "
                                            "a shared RDMA fabric"
                                          : "highest ranked of what fi_info offers";
  return p.provider + " on domain " + p.domain + ": " + why + "; domain: " + e.domain_why +
         (row ? std::string(" (") + row->note + ")" : std::string(" (unranked provider)")) +
         (p.rdma ? ""
                 : "; NOT RDMA: the CPU copies every byte (socket or shared-memory emulation)");
}

// Step 7: the selection, primaries first (in rank order), each followed by its rails.
std::vector<SelectedProvider> Assemble(const SelectionRequest& req,
                                       const std::vector<std::vector<Entry*>>& rails,
                                       const std::vector<ProviderCandidate>& candidates) {
  std::vector<FabricSummary> fabrics;
  for (const auto& provider_rails : rails) {
    for (size_t k = 0; k < provider_rails.size(); ++k) {
      const Entry* e = provider_rails[k];
      fabrics.push_back({e->candidate.provider, e->candidate.domain, FabricName(e),
                         e->candidate.rdma, static_cast<int>(k)});
    }
  }
  std::vector<SelectedProvider> ordered;
  for (const auto& provider_rails : rails) {
    for (size_t k = 0; k < provider_rails.size(); ++k) {
      const Entry* e = provider_rails[k];
      SelectedProvider s;
      s.report.chosen = ProfileFromInfo(e->info);
      s.report.candidates = candidates;
      s.report.fabrics = fabrics;
      s.report.reason = k == 0 ? PrimaryReason(req, *e, s.report.chosen, rails.size())
                               : e->candidate.provider + " on domain " + e->candidate.domain +
                                     ": " + e->domain_why;
      s.rail = static_cast<int>(k);
      s.info.reset(fi_dupinfo(e->info));
      ordered.push_back(std::move(s));
    }
  }
  return ordered;
}

}  // namespace

Result<std::vector<SelectedProvider>> SelectFabrics(const EngineSettings& settings,
                                                    const EngineOptions& options) {
  RF_RETURN_IF_ERROR(settings.Check());
  const SelectionRequest req = RequestFrom(settings);
  std::vector<std::unique_ptr<struct fi_info, InfoDeleter>> lists;  // what the entries point into
  RF_ASSIGN_OR_RETURN(std::vector<Entry> entries, QueryEntries(req, options, lists));
  std::vector<Entry> unique = BestPerDomain(std::move(entries));
  RF_ASSIGN_OR_RETURN(const std::set<std::string> listed_providers, ApplyDomainList(req, unique));
  RF_ASSIGN_OR_RETURN(const std::vector<Entry*> primaries, ChoosePrimaries(req, unique));
  const std::vector<std::vector<Entry*>> rails =
      ChooseRails(req, primaries, unique, listed_providers);
  std::vector<SelectedProvider> selected = Assemble(req, rails, Verdicts(unique, primaries));
  if (options.device_memory) {
    for (SelectedProvider& s : selected) OfferDeviceMemory(s, options);
  }
  return selected;
}

Result<SelectedProvider> SelectProviderInfo(const EngineSettings& settings,
                                            const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(std::vector<SelectedProvider> all, SelectFabrics(settings, options));
  return std::move(all.front());
}

Result<ProviderReport> SelectProvider(const EngineSettings& settings,
                                      const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(SelectedProvider s, SelectProviderInfo(settings, options));
  return std::move(s.report);
}

Result<ProviderReport> SelectProvider(const Config& config, const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(const EngineSettings settings, EngineSettings::FromConfig(config));
  return SelectProvider(settings, options);
}

std::string ProviderReport::ToString() const {
  std::ostringstream os;
  const ProviderProfile& p = chosen;
  os << "provider " << p.provider << " domain " << p.domain << " (" << reason << ")\n";
  os << "  mr_mode:" << (p.local_desc ? " FI_MR_LOCAL" : "")
     << (p.virt_addr ? " FI_MR_VIRT_ADDR" : "") << (p.allocated ? " FI_MR_ALLOCATED" : "")
     << (p.prov_key ? " FI_MR_PROV_KEY" : "") << (p.endpoint_mr ? " FI_MR_ENDPOINT" : "")
     << (p.raw_key ? " FI_MR_RAW" : "") << " key_size=" << p.key_size
     << " max_msg_size=" << p.max_msg_size << " rma_iov_limit=" << p.rma_iov_limit
     << " progress=" << (p.manual_progress ? "manual" : "auto")
     << " cut=" << (p.bytes_move_without_progress ? "close" : "abandon") << "\n";
  os << "  keys: checked=" << (p.checks_remote_keys ? "yes" : "NO")
     << " mr_cache=" << (p.mr_cache ? "yes" : "no")
     << " deregistration_revokes_keys=" << (p.deregistration_revokes_keys ? "yes" : "NO") << " ("
     << p.key_lifetime << ")\n";
  os << "  access: enforced=" << (p.enforces_access ? "yes" : "NO") << " (" << p.access_note
     << ")\n";
  os << "  device memory: " << (p.device_memory ? "yes" : "no") << " (" << p.device_memory_note
     << ")\n";
  os << "  fabrics opened by an agent:";
  for (const auto& f : fabrics) {
    os << " " << f.provider << "/" << f.domain
       << (f.rail > 0 ? " (rail " + std::to_string(f.rail + 1) + ")" : "");
  }
  os << "\n";
  for (const auto& c : candidates) {
    os << "  candidate " << c.provider << "/" << c.domain << (c.ip.empty() ? "" : " " + c.ip)
       << " rank " << c.rank << (c.rdma ? " rdma" : "") << ": " << c.verdict << "\n";
  }
  return os.str();
}

std::string ProviderReport::ToJson() const {
  std::ostringstream os;
  const ProviderProfile& p = chosen;
  os << "{\"provider\":\"" << JsonEscape(p.provider) << "\",\"domain\":\"" << JsonEscape(p.domain)
     << "\",\"fabric\":\"" << JsonEscape(p.fabric) << "\",\"rdma\":" << (p.rdma ? "true" : "false")
     << ",\"reason\":\"" << JsonEscape(reason) << "\",\"mr_mode\":" << p.mr_mode
     << ",\"key_size\":" << p.key_size << ",\"max_msg_size\":" << p.max_msg_size
     << ",\"rma_iov_limit\":" << p.rma_iov_limit
     << ",\"manual_progress\":" << (p.manual_progress ? "true" : "false")
     << ",\"checks_remote_keys\":" << (p.checks_remote_keys ? "true" : "false")
     << ",\"mr_cache\":" << (p.mr_cache ? "true" : "false")
     << ",\"deregistration_revokes_keys\":" << (p.deregistration_revokes_keys ? "true" : "false")
     << ",\"key_lifetime\":\"" << JsonEscape(p.key_lifetime)
     << "\",\"enforces_access\":" << (p.enforces_access ? "true" : "false") << ",\"access_note\":\""
     << JsonEscape(p.access_note) << "\",\"fabrics\":[";
  for (size_t i = 0; i < fabrics.size(); ++i) {
    const auto& f = fabrics[i];
    os << (i ? "," : "") << "{\"provider\":\"" << JsonEscape(f.provider) << "\",\"domain\":\""
       << JsonEscape(f.domain) << "\",\"fabric\":\"" << JsonEscape(f.fabric)
       << "\",\"rdma\":" << (f.rdma ? "true" : "false") << ",\"rail\":" << f.rail << "}";
  }
  os << "],\"candidates\":[";
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& c = candidates[i];
    os << (i ? "," : "") << "{\"provider\":\"" << JsonEscape(c.provider) << "\",\"domain\":\""
       << JsonEscape(c.domain) << "\",\"ip\":\"" << JsonEscape(c.ip) << "\",\"rank\":" << c.rank
       << ",\"rdma\":" << (c.rdma ? "true" : "false") << ",\"verdict\":\"" << JsonEscape(c.verdict)
       << "\"}";
  }
  os << "]}";
  return os.str();
}

}  // namespace rayfabric::fabric
