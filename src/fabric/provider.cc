#include "fabric/provider.h"

#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>

#include <strings.h>
#include <algorithm>
#include <cstdlib>
#include <cstring>
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
    } else if (monitor != nullptr && std::strcmp(monitor, "disabled") == 0) {
      p.key_lifetime =
          "verbs MR cache off (FI_MR_CACHE_MONITOR=disabled): fi_close() deregisters the ibv MR at "
          "once";
    } else {
      p.mr_cache = true;
      p.key_lifetime =
          "verbs registers through libfabric's MR cache: after fi_close() the ibv MR and its key "
          "stay valid until the cache evicts it (FI_MR_CACHE_MAX_COUNT, default 1024) or the pages "
          "are unmapped; set FI_MR_CACHE_MAX_COUNT=0 to make deregistration revoke keys";
    }
    p.deregistration_revokes_keys = !p.mr_cache;
    p.enforces_access = !p.mr_cache;
    p.access_note = p.mr_cache
                        ? "the verbs MR cache registers every region with remote read, write and "
                          "atomic access, whatever was asked: set FI_MR_CACHE_MAX_COUNT=0"
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

Result<SelectedProvider> SelectProviderInfo(const Config& config, const EngineOptions& options) {
  const std::string want_provider = config.GetString("provider");
  const std::string want_domain = config.GetString("domain");
  RF_ASSIGN_OR_RETURN(bool require_rdma, config.GetBool("require_rdma"));

  auto hints = EngineHints(options);
  if (!want_provider.empty()) hints->fabric_attr->prov_name = strdup(want_provider.c_str());
  if (!want_domain.empty()) hints->domain_attr->name = strdup(want_domain.c_str());

  struct fi_info* raw = nullptr;
  int ret = fi_getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints.get(), &raw);
  std::unique_ptr<struct fi_info, InfoDeleter> infos(raw);
  const char* fi_provider_env = std::getenv("FI_PROVIDER");
  std::string filters =
      std::string("provider='") + want_provider + "' domain='" + want_domain + "'" +
      (fi_provider_env ? std::string(" FI_PROVIDER='") + fi_provider_env + "'" : "");
  if (ret == -FI_ENODATA || (ret == 0 && infos == nullptr)) {
    return NotFound("no libfabric provider offers RDM endpoints with RMA read/write for " +
                    filters +
                    ". `fi_info -l` lists the installed providers; `rayfabric doctor` explains why "
                    "an RDMA device is not usable; unset RAYFABRIC_PROVIDER/FI_PROVIDER to let "
                    "rayfabric choose");
  }
  if (ret != 0) return FabricStatus(ret, "fi_getinfo(" + filters + ")");

  ProviderReport report;
  const struct fi_info* best = nullptr;
  int best_score = -1;
  std::string other_domains;  // what fi_info offered on domains other than the requested one
  for (const struct fi_info* i = infos.get(); i != nullptr; i = i->next) {
    ProviderCandidate c;
    c.provider = i->fabric_attr->prov_name ? i->fabric_attr->prov_name : "?";
    c.domain = i->domain_attr->name ? i->domain_attr->name : "?";
    bool duplicate = std::any_of(report.candidates.begin(), report.candidates.end(),
                                 [&](const ProviderCandidate& o) {
                                   return o.provider == c.provider && o.domain == c.domain;
                                 });
    if (duplicate) continue;  // fi_info lists one entry per address format / mode combination
    // Utility providers (ofi_rxm over tcp in libfabric 1.17) ignore the domain name hint and
    // list every domain: the requested domain is enforced here.
    if (!want_domain.empty() && c.domain != want_domain) {
      other_domains += " " + c.provider + "/" + c.domain;
      continue;
    }
    const ProviderRank* rank = FindRank(c.provider);
    c.rank = rank ? rank->rank : 1;
    c.rdma = rank && rank->rdma;
    // Loopback domains cannot reach other hosts: only pick them if nothing else is there.
    int score = c.rank * 2 + (IsLoopbackDomain(c.domain) && want_domain.empty() ? 0 : 1);
    if (require_rdma && !c.rdma) {
      c.verdict = "passed over: not RDMA and require_rdma is set";
    } else if (score > best_score) {
      best_score = score;
      best = i;
    }
    report.candidates.push_back(c);
  }
  if (report.candidates.empty()) {
    return NotFound("no libfabric provider offers domain '" + want_domain + "' for " + filters +
                    " (offered instead:" + other_domains +
                    "). Set RAYFABRIC_DOMAIN to one of those, or unset it to let rayfabric "
                    "choose; `rayfabric doctor` lists every domain");
  }
  if (best == nullptr) {
    std::string seen;
    for (const auto& c : report.candidates) seen += " " + c.provider + "/" + c.domain;
    return Unavailable("require_rdma is set but libfabric offers no RDMA provider (seen:" + seen +
                       "). Run `rayfabric doctor` to see why no RDMA device is usable, or unset "
                       "RAYFABRIC_REQUIRE_RDMA to allow the TCP fallback");
  }
  report.chosen = ProfileFromInfo(best);
  for (auto& c : report.candidates) {
    if (!c.verdict.empty()) continue;
    if (c.provider == report.chosen.provider && c.domain == report.chosen.domain) {
      c.verdict = "chosen";
    } else if (IsLoopbackDomain(c.domain) && want_domain.empty()) {
      c.verdict = "passed over: loopback domain cannot reach other hosts";
    } else {
      c.verdict = "passed over: ranks below " + report.chosen.provider + "/" + report.chosen.domain;
    }
  }
  const ProviderRank* rank = FindRank(report.chosen.provider);
  std::string why = !want_provider.empty() ? "requested by RAYFABRIC_PROVIDER/--provider"
                    : fi_provider_env      ? "FI_PROVIDER restricts libfabric to it"
                                           : "highest ranked of what fi_info offers";
  report.reason =
      report.chosen.provider + " on domain " + report.chosen.domain + ": " + why +
      (want_domain.empty() ? "" : "; domain requested by RAYFABRIC_DOMAIN") +
      (rank ? std::string(" (") + rank->note + ")" : std::string(" (unranked provider)")) +
      (report.chosen.rdma
           ? ""
           : "; NOT RDMA: the CPU copies every byte (socket or shared-memory emulation)");
  SelectedProvider out;
  out.report = std::move(report);
  out.info.reset(fi_dupinfo(best));
  return out;
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
  for (const auto& c : candidates) {
    os << "  candidate " << c.provider << "/" << c.domain << " rank " << c.rank
       << (c.rdma ? " rdma" : "") << ": " << c.verdict << "\n";
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
     << JsonEscape(p.access_note) << "\",\"candidates\":[";
  for (size_t i = 0; i < candidates.size(); ++i) {
    const auto& c = candidates[i];
    os << (i ? "," : "") << "{\"provider\":\"" << JsonEscape(c.provider) << "\",\"domain\":\""
       << JsonEscape(c.domain) << "\",\"rank\":" << c.rank
       << ",\"rdma\":" << (c.rdma ? "true" : "false") << ",\"verdict\":\"" << JsonEscape(c.verdict)
       << "\"}";
  }
  os << "]}";
  return os.str();
}

}  // namespace rayfabric::fabric
