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

namespace rayfabric::fabric {
namespace {

// The ranking, in one table: hardware RDMA first, then socket emulations. Providers not listed
// rank lowest and count as non-RDMA.
struct ProviderRank {
  const char* name;
  int rank;
  bool rdma;
  const char* note;
};

constexpr ProviderRank kRanks[] = {
    {"cxi", 100, true, "HPE Slingshot"},
    {"efa", 100, true, "AWS Elastic Fabric Adapter"},
    {"verbs;ofi_rxm", 90, true, "InfiniBand / RoCE verbs under the RDM utility provider"},
    {"opx", 85, true, "Omni-Path Express"},
    {"psm3", 80, true, "Intel PSM3 (verbs-based)"},
    {"psm2", 80, true, "Omni-Path PSM2"},
    {"verbs;ofi_rxd", 70, true, "verbs datagrams under the RDM utility provider"},
    {"tcp;ofi_rxm", 50, false, "TCP sockets (no RDMA)"},
    {"tcp", 50, false, "TCP sockets (no RDMA)"},
    {"net", 45, false, "TCP sockets, native RDM (no RDMA)"},
    {"sockets", 30, false, "legacy sockets provider (no RDMA)"},
    {"shm", 10, false, "shared memory: same host only"},
    {"udp;ofi_rxd", 5, false, "UDP datagrams (slow)"},
};

const ProviderRank* FindRank(const std::string& name) {
  for (const ProviderRank& r : kRanks) {
    if (name == r.name) return &r;
  }
  return nullptr;
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

// Fills the key-lifetime fields of `p` (see ProviderProfile) from the provider's name components
// and the user's FI_* variables, as libfabric 1.17 decides it (the same code paths are in 1.18 -
// 1.20): verbs_domain.c / verbs_mr.c (ofi_mr_cache_init; a NULL system monitor means no cache),
// util_mr_cache.c (max_cnt == 0 -> no cache), util_mem_monitor.c (FI_MR_CACHE_MAX_COUNT,
// FI_MR_CACHE_MONITOR=disabled), efa_domain.c (cache only without FI_MR_LOCAL and with
// FI_EFA_MR_CACHE_ENABLE), rxd_cq.c / tcpx_progress.c / xnet_progress.c / sock_progress.c (the
// target verifies the key in a map fi_close() removes it from), shm (no key check at all).
void DecideKeyLifetime(ProviderProfile& p) {
  const std::string& name = p.provider;
  const size_t semi = name.find(';');
  const std::string core = name.substr(0, semi);
  const std::string util = semi == std::string::npos ? "" : name.substr(semi + 1);
  p.checks_remote_keys = true;
  p.mr_cache = false;
  p.enforces_access = false;
  p.access_note = "not known for provider " + name + ": assume peers may write what they can key";
  if (util == "ofi_rxd") {
    // rxd emulates RMA with messages and verifies its own keys (ofi_mr_verify on its util MR map);
    // the core provider's registrations are rxd's bounce buffers, never a user key.
    p.deregistration_revokes_keys = true;
    p.key_lifetime = "ofi_rxd verifies its own keys; fi_close() removes them at once";
  } else if (core == "verbs") {
    const char* max_count = FiEnv("FI_MR_CACHE_MAX_COUNT");
    const char* monitor = FiEnv("FI_MR_CACHE_MONITOR");
    if (max_count != nullptr && std::strtol(max_count, nullptr, 0) == 0) {
      p.key_lifetime = "verbs MR cache off (FI_MR_CACHE_MAX_COUNT=" + std::string(max_count) +
                       "): fi_close() deregisters the ibv MR at once";
    } else if (monitor != nullptr && std::strcmp(monitor, "disabled") == 0 &&
               (!p.device_memory || FiEnvBool("FI_MR_CUDA_CACHE_MONITOR_ENABLED", 1) == 0)) {
      p.key_lifetime = "verbs MR cache off (FI_MR_CACHE_MONITOR=disabled" +
                       std::string(p.device_memory ? ", FI_MR_CUDA_CACHE_MONITOR_ENABLED=0" : "") +
                       "): fi_close() deregisters the ibv MR at once";
    } else if (monitor != nullptr && std::strcmp(monitor, "disabled") == 0) {
      // FI_HMEM: CUDA registrations have a monitor of their own, which FI_MR_CACHE_MONITOR leaves
      // on.
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
  } else if (core == "efa") {
    if (p.local_desc) {
      p.key_lifetime = "efa with FI_MR_LOCAL opens no MR cache: fi_close() deregisters at once";
    } else if (FiEnvBool("FI_EFA_MR_CACHE_ENABLE", 1) == 0) {
      p.key_lifetime =
          "efa MR cache off (FI_EFA_MR_CACHE_ENABLE=0): fi_close() deregisters at once";
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
  } else if (core == "shm") {
    p.checks_remote_keys = false;
    p.deregistration_revokes_keys = false;
    p.key_lifetime =
        "shm never checks RMA keys (process_vm_readv/writev): any same-host peer with the address "
        "can access the memory while it is mapped, registered or not";
    p.access_note = "shm checks neither keys nor access (process_vm_readv/writev)";
    p.names_endpoint_by_pid = true;
  } else if (core == "tcp" || core == "net" || core == "sockets") {
    p.deregistration_revokes_keys = true;
    p.key_lifetime = core + " verifies keys in its MR map; fi_close() removes them at once";
    p.enforces_access = true;
    p.access_note = core + " checks each RMA's access against the region's (ofi_mr_verify)";
  } else {
    // psm2, psm3, opx, cxi, usnic, ...: not checked against their sources; do not promise.
    p.deregistration_revokes_keys = false;
    p.key_lifetime =
        "not known for provider " + name + ": assume a deregistered key may stay valid";
  }
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
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
  const ProviderRank* rank = FindRank(p.provider);
  p.rdma = rank != nullptr && rank->rdma;
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
  // Known to move nothing without this process's progress calls: libfabric 1.17's tcp and net
  // (no progress thread of their own: tcpx_progress runs inside CQ reads and endpoint calls) under
  // ofi_rxm or alone. Everything else, unknown providers included, is assumed to move bytes by
  // itself (hardware RDMA, or a provider thread like sockets').
  const std::string core = p.provider.substr(0, p.provider.find(';'));
  p.bytes_move_without_progress = !((core == "tcp" || core == "net") && p.manual_progress);
  p.thread_safe = info->domain_attr->threading == FI_THREAD_SAFE;
  p.string_address = info->addr_format == FI_ADDR_STR;
  p.device_memory = (info->caps & FI_HMEM) != 0;
  p.device_memory_note =
      p.device_memory ? "FI_HMEM offered: device buffers registered directly" : "host memory only";
  DecideKeyLifetime(p);
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

// Which fabrics a node opens by default: one of each class that reaches other hosts.
enum class FabricClass { kRdma, kSockets, kOther };

FabricClass ClassOf(const std::string& provider) {
  const ProviderRank* rank = FindRank(provider);
  if (rank != nullptr && rank->rdma) return FabricClass::kRdma;
  const std::string core = provider.substr(0, provider.find(';'));
  if (core == "tcp" || core == "net" || core == "sockets") return FabricClass::kSockets;
  return FabricClass::kOther;  // shm (same host), udp (datagrams), unranked providers
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

Result<std::vector<SelectedProvider>> SelectFabrics(const Config& config,
                                                    const EngineOptions& options) {
  const std::vector<std::string> wanted = SplitList(config.GetString("provider"));
  const std::string want_domain = config.GetString("domain");
  RF_ASSIGN_OR_RETURN(bool require_rdma, config.GetBool("require_rdma"));
  const char* fi_provider_env = std::getenv("FI_PROVIDER");
  const std::string filters =
      std::string("provider='") + config.GetString("provider") + "' domain='" + want_domain + "'" +
      (fi_provider_env ? std::string(" FI_PROVIDER='") + fi_provider_env + "'" : "");

  // One fi_getinfo per requested provider (libfabric resolves "tcp" to "tcp;ofi_rxm"), or one
  // for everything.
  std::vector<std::unique_ptr<struct fi_info, InfoDeleter>> lists;
  std::vector<Entry> entries;
  const std::vector<std::string> queries = wanted.empty() ? std::vector<std::string>{""} : wanted;
  for (const std::string& query : queries) {
    auto hints = EngineHints(options);
    if (!query.empty()) hints->fabric_attr->prov_name = strdup(query.c_str());
    struct fi_info* raw = nullptr;
    int ret = fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints.get(), &raw);
    std::unique_ptr<struct fi_info, InfoDeleter> infos(raw);
    if (ret == -FI_ENODATA || (ret == 0 && infos == nullptr)) {
      return NotFound("no libfabric provider offers RDM endpoints with RMA read/write for " +
                      (query.empty() ? filters : "provider '" + query + "' (" + filters + ")") +
                      ". `fi_info -l` lists the installed providers; `rayfabric doctor` explains "
                      "why an RDMA device is not usable; unset RAYFABRIC_PROVIDER/FI_PROVIDER to "
                      "let rayfabric choose");
    }
    if (ret != 0) return FabricStatus(ret, "fi_getinfo(" + filters + ")");
    for (const struct fi_info* i = infos.get(); i != nullptr; i = i->next) {
      Entry e;
      e.info = i;
      ProviderCandidate& c = e.candidate;
      c.provider = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "?";
      c.domain = i->domain_attr->name ? i->domain_attr->name : "?";
      c.ip = SourceIp(i);
      const ProviderRank* rank = FindRank(c.provider);
      c.rank = rank ? rank->rank : 1;
      c.rdma = rank && rank->rdma;
      if (!query.empty()) {
        e.group = query;
      } else {
        const FabricClass cls = ClassOf(c.provider);
        e.group = cls == FabricClass::kRdma      ? "rdma"
                  : cls == FabricClass::kSockets ? "sockets"
                                                 : "";
      }
      // Loopback domains cannot reach other hosts: only picked if the node is known by a
      // loopback address (a one-host cluster) or nothing else is there.
      if (!options.preferred_ip.empty() && c.ip == options.preferred_ip) {
        e.domain_score = 2;
        e.domain_why = "holds the node's IP " + c.ip;
      } else if (!IsLoopbackDomain(c.domain)) {
        e.domain_score = 1;
        e.domain_why = options.preferred_ip.empty()
                           ? "first non-loopback domain"
                           : "no domain holds the node's IP " + options.preferred_ip +
                                 "; first non-loopback one";
      } else {
        e.domain_why = "loopback: only this host";
      }
      entries.push_back(std::move(e));
    }
    lists.push_back(std::move(infos));
  }

  // fi_info lists one entry per address (IPv4, IPv6) and mode combination: one candidate per
  // provider and domain, its best-fitting entry.
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

  // RAYFABRIC_DOMAIN (a comma list) applies to every provider that offers one of its domains:
  // that provider keeps exactly the listed domains it offers, the first listed one as its domain
  // and the others as further rails (utility providers like ofi_rxm over tcp ignore the domain
  // hint and list every domain: enforced here).
  const std::vector<std::string> want_domains = SplitList(want_domain);
  auto listed_at = [&](const std::string& domain) {
    auto it = std::find(want_domains.begin(), want_domains.end(), domain);
    return it == want_domains.end() ? -1 : static_cast<int>(it - want_domains.begin());
  };
  std::set<std::string> listed_providers;
  if (!want_domains.empty()) {
    for (const Entry& e : unique) {
      if (listed_at(e.candidate.domain) >= 0) listed_providers.insert(e.candidate.provider);
    }
    if (listed_providers.empty()) {
      std::string other_domains;
      for (const Entry& e : unique) {
        other_domains += " " + e.candidate.provider + "/" + e.candidate.domain;
      }
      return NotFound("no libfabric provider offers domain '" + want_domain + "' for " + filters +
                      " (offered instead:" + other_domains +
                      "). Set RAYFABRIC_DOMAIN to one of those, or unset it to let rayfabric "
                      "choose; `rayfabric doctor` lists every domain");
    }
    std::vector<Entry> kept;
    for (Entry& e : unique) {
      const int at = listed_at(e.candidate.domain);
      if (listed_providers.count(e.candidate.provider) > 0 && at < 0) continue;
      if (at >= 0) {
        e.domain_why = "requested by RAYFABRIC_DOMAIN";
        e.domain_score = 3 + static_cast<int>(want_domains.size()) - at;  // first listed wins
      }
      kept.push_back(std::move(e));
    }
    unique = std::move(kept);
  }
  RF_ASSIGN_OR_RETURN(int64_t max_rails, config.GetInt("max_rails"));
  if (max_rails < 1 || max_rails > 64) {
    return InvalidArgument("max_rails must be in [1, 64], got " + std::to_string(max_rails));
  }

  // The best entry of each group; groups ranked by their provider, best first.
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
    if (require_rdma && !c.rdma) {
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
  // Two requested names may resolve to one provider ("tcp" and "tcp;ofi_rxm"): opened once.
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
  if (distinct.empty()) {
    std::string seen;
    for (const Entry& e : unique) seen += " " + e.candidate.provider + "/" + e.candidate.domain;
    if (require_rdma) {
      return Unavailable("require_rdma is set but libfabric offers no RDMA provider (seen:" + seen +
                         "). Run `rayfabric doctor` to see why no RDMA device is usable, or "
                         "unset RAYFABRIC_REQUIRE_RDMA to allow the TCP fallback");
    }
    return NotFound("libfabric offers no provider that reaches other hosts (seen:" + seen +
                    "); name one in RAYFABRIC_PROVIDER to use it anyway");
  }

  // Rails: the further domains of each chosen provider. Listed in RAYFABRIC_DOMAIN: exactly those,
  // in list order. Otherwise, on an RDMA provider, its other non-loopback domains on the same
  // fabric (several HCAs or EFA devices of one network), up to max_rails; a socket provider's
  // interfaces are separate networks: one.
  auto fabric_name = [](const Entry* e) {
    return std::string(e->info->fabric_attr->name ? e->info->fabric_attr->name : "");
  };
  std::vector<std::vector<Entry*>> rails(distinct.size());
  for (size_t i = 0; i < distinct.size(); ++i) {
    Entry* primary = distinct[i];
    rails[i].push_back(primary);
    const bool listed = listed_providers.count(primary->candidate.provider) > 0;
    if (!listed && (!primary->candidate.rdma || max_rails <= 1)) continue;
    std::vector<Entry*> extra;
    for (Entry& e : unique) {
      if (&e == primary || e.candidate.provider != primary->candidate.provider) continue;
      if (!listed &&
          (IsLoopbackDomain(e.candidate.domain) || fabric_name(&e) != fabric_name(primary)))
        continue;
      extra.push_back(&e);
    }
    if (listed) {
      std::stable_sort(extra.begin(), extra.end(), [&](const Entry* a, const Entry* b) {
        return listed_at(a->candidate.domain) < listed_at(b->candidate.domain);
      });
    }
    for (Entry* e : extra) {
      if (!listed && rails[i].size() >= static_cast<size_t>(max_rails)) break;
      e->candidate.verdict =
          "chosen as rail " + std::to_string(rails[i].size() + 1) + " of " +
          primary->candidate.provider + " (" +
          (listed ? "requested by RAYFABRIC_DOMAIN"
                  : "same fabric " + fabric_name(e) + " as " + primary->candidate.domain) +
          ")";
      e->domain_why = e->candidate.verdict.substr(7);
      rails[i].push_back(e);
    }
  }

  std::vector<FabricSummary> fabrics;
  for (const auto& provider_rails : rails) {
    for (size_t k = 0; k < provider_rails.size(); ++k) {
      const Entry* e = provider_rails[k];
      fabrics.push_back({e->candidate.provider, e->candidate.domain, fabric_name(e),
                         e->candidate.rdma, static_cast<int>(k)});
    }
  }
  std::vector<ProviderCandidate> candidates;
  for (Entry& e : unique) {
    if (e.candidate.verdict.empty()) {
      auto it = std::find(distinct.begin(), distinct.end(), &e);
      if (it != distinct.end()) {
        e.candidate.verdict = "chosen (" + e.domain_why + ")";
      } else {
        auto winner = std::find_if(distinct.begin(), distinct.end(), [&](const Entry* o) {
          return o->group == e.group || o->candidate.provider == e.candidate.provider;
        });
        e.candidate.verdict = winner == distinct.end()
                                  ? "passed over"
                                  : "passed over: " + (*winner)->candidate.provider + "/" +
                                        (*winner)->candidate.domain + " fits better (" +
                                        (*winner)->domain_why + ")";
      }
    }
    candidates.push_back(e.candidate);
  }

  std::vector<SelectedProvider> out;
  for (const auto& provider_rails : rails) {
    for (size_t k = 1; k < provider_rails.size(); ++k) {
      const Entry* e = provider_rails[k];
      SelectedProvider s;
      s.report.chosen = ProfileFromInfo(e->info);
      s.report.candidates = candidates;
      s.report.fabrics = fabrics;
      s.report.reason =
          e->candidate.provider + " on domain " + e->candidate.domain + ": " + e->domain_why;
      s.rail = static_cast<int>(k);
      s.info.reset(fi_dupinfo(e->info));
      out.push_back(std::move(s));
    }
  }
  // Primaries first, each followed by its rails, in rank order.
  std::vector<SelectedProvider> ordered;
  size_t next_rail = 0;
  for (size_t i = 0; i < rails.size(); ++i) {
    const Entry* e = rails[i].front();
    SelectedProvider s;
    s.report.chosen = ProfileFromInfo(e->info);
    s.report.candidates = candidates;
    s.report.fabrics = fabrics;
    const ProviderRank* rank = FindRank(s.report.chosen.provider);
    std::string why = !wanted.empty()      ? "requested by RAYFABRIC_PROVIDER/--provider"
                      : fi_provider_env    ? "FI_PROVIDER restricts libfabric to it"
                      : e->group == "rdma" ? "highest ranked RDMA provider fi_info offers"
                      : distinct.size() > 1
                          ? "highest ranked socket provider: for peers without a shared RDMA fabric"
                          : "highest ranked of what fi_info offers";
    s.report.reason =
        s.report.chosen.provider + " on domain " + s.report.chosen.domain + ": " + why +
        "; domain: " + e->domain_why +
        (rank ? std::string(" (") + rank->note + ")" : std::string(" (unranked provider)")) +
        (s.report.chosen.rdma
             ? ""
             : "; NOT RDMA: the CPU copies every byte (socket or shared-memory emulation)");
    s.info.reset(fi_dupinfo(e->info));
    ordered.push_back(std::move(s));
    for (size_t k = 1; k < rails[i].size(); ++k) ordered.push_back(std::move(out[next_rail++]));
  }
  if (options.device_memory) {
    for (SelectedProvider& s : ordered) OfferDeviceMemory(s, options);
  }
  return ordered;
}

Result<SelectedProvider> SelectProviderInfo(const Config& config, const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(std::vector<SelectedProvider> all, SelectFabrics(config, options));
  return std::move(all.front());
}

Result<ProviderReport> SelectProvider(const Config& config, const EngineOptions& options) {
  RF_ASSIGN_OR_RETURN(SelectedProvider s, SelectProviderInfo(config, options));
  return std::move(s.report);
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
