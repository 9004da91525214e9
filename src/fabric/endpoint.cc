// The endpoint side of the engine: fabric and domain, the endpoint set (endpoint, address vector,
// completion queue), its reset, and the peers in the address vector.
#include <dirent.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <random>

#include "fabric/engine_core.h"
#include "fabric/fabric_error.h"
#include "rayfabric/log.h"

namespace rayfabric::fabric {

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = static_cast<double>(n);
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

namespace {

// The pid namespace's inode, "" when unknown: a process id means something only within its
// namespace, and /dev/shm may be shared across namespaces (containers with the host's IPC).
// Read once: a process does not change its pid namespace.
const std::string& PidNamespace() {
  static const std::string inode = [] {
    struct stat st {};
    if (stat("/proc/self/ns/pid", &st) != 0) return std::string();
    return std::to_string(static_cast<unsigned long long>(st.st_ino));
  }();
  return inode;
}

constexpr const char* kEndpointNamePrefix = "rayfabric-";

// A number drawn at random once per process: with the process id, it names this process among
// all that had its pid.
uint64_t ProcessSalt() {
  static const uint64_t salt = [] {
    uint64_t mixed =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    try {
      std::random_device random;
      mixed ^= (static_cast<uint64_t>(random()) << 32) ^ random();
    } catch (const std::exception&) {
      // No entropy source: the clock at first use still tells this process from an earlier one
      // that had its pid.
    }
    return mixed;
  }();
  return salt;
}

// "rayfabric-<pid namespace>-<pid>-<salt>-": what every endpoint name of this process starts with.
std::string ProcessEndpointPrefix(pid_t pid, uint64_t salt) {
  char prefix[128];
  const std::string& pid_namespace = PidNamespace();
  std::snprintf(prefix, sizeof(prefix), "%s%s-%d-%016llx-", kEndpointNamePrefix,
                pid_namespace.empty() ? "unknown" : pid_namespace.c_str(), static_cast<int>(pid),
                static_cast<unsigned long long>(salt));
  return prefix;
}

// A source address no process repeats, in the scheme of the provider's own ("fi_shm://"): the
// process's prefix and a count of its endpoints.
std::string UniqueEndpointName(const struct fi_info& info) {
  std::string scheme;
  if (info.src_addr != nullptr && info.src_addrlen > 0) {
    const char* own = static_cast<const char*>(info.src_addr);
    const std::string name(own, strnlen(own, info.src_addrlen));
    const size_t end = name.find("://");
    if (end != std::string::npos) scheme = name.substr(0, end + 3);
  }
  static std::atomic<uint64_t> endpoints{0};
  return scheme + ProcessEndpointPrefix(getpid(), ProcessSalt()) +
         std::to_string(endpoints.fetch_add(1));
}

// The regions of endpoints named above whose process is gone (SIGKILLed: the provider's own
// cleanup runs on SIGTERM and SIGINT only), removed once per process: each holds a few MiB of
// /dev/shm. Only names of this pid namespace whose process id no longer exists in it, or is this
// process's own under another salt (a process that had this pid before).
void RemoveRegionsOfDeadProcesses() {
  // Without the namespace a pid says nothing: another namespace's live process may hold it.
  if (PidNamespace().empty()) return;
  const std::string in_namespace = kEndpointNamePrefix + PidNamespace() + "-";
  const std::string mine = ProcessEndpointPrefix(getpid(), ProcessSalt());
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  size_t removed = 0;
  while (const struct dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, in_namespace.size(), in_namespace) != 0) continue;
    if (name.compare(0, mine.size(), mine) == 0) continue;
    const long pid = std::strtol(name.c_str() + in_namespace.size(), nullptr, 10);
    if (pid <= 0) continue;
    const bool dead = pid == getpid() || (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
    if (dead && unlinkat(dirfd(dir), name.c_str(), 0) == 0) ++removed;
  }
  closedir(dir);
  if (removed > 0) {
    RF_LOG(kInfo, "removed " << removed
                             << " shared-memory region(s) of rayfabric endpoints whose process "
                                "was killed (/dev/shm/"
                             << in_namespace << "*)");
  }
}

}  // namespace

EngineCore::~EngineCore() {
  if (wake_fd_ >= 0) close(wake_fd_);
  // Reverse order of creation; memory regions are gone already (each holds a reference).
  eps_.Close();
  domain_.reset();
  fabric_.reset();
}

Status EngineCore::Open(SelectedProvider selected, const EngineSettings& settings,
                        const EngineOptions& options) {
  report_ = std::move(selected.report);
  profile_ = report_.chosen;
  info_ = std::move(selected.info);
  remote_write_ = options.remote_write;

  spin_ = settings.progress_spin;
  // Slices start at multiples of it from the range's base: page-aligned bases stay page-aligned.
  profile_.max_registration_bytes = settings.max_registration & ~static_cast<uint64_t>(4095);
  report_.chosen.max_registration_bytes = profile_.max_registration_bytes;
  // Each is within its bounds: EngineSettings::FromConfig validated the configuration.
  chunk_size_ = std::min<uint64_t>(
      settings.chunk_size, profile_.max_msg_size ? profile_.max_msg_size : settings.chunk_size);
  max_inflight_ = settings.max_inflight;
  op_timeout_ = settings.op_timeout;
  drain_timeout_ = settings.drain_timeout;
  // Registrations bound to an endpoint would die with it: such providers are never reset.
  can_reset_ = !profile_.endpoint_mr && settings.reset_undrained_endpoints;

  const std::string where = profile_.provider + "/" + profile_.domain;
  int ret = fi_fabric(info_->fabric_attr, fabric_.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_fabric(" + where + ")");
  ret = fi_domain(fabric_.get(), info_.get(), domain_.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_domain(" + where + ")");
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return OpenEndpointLocked(eps_);
}

Status EngineCore::OpenEndpointLocked(EndpointSet& set) {
  const std::string where = profile_.provider + "/" + profile_.domain;
  struct fi_cq_attr cq_attr {};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.size = std::max<size_t>(info_->tx_attr->size, 1024);
  // An fd wait object first: its blocking read honours the timeout on every provider tried
  // (shm's default yield-based wait did not, and spun forever in fi_cq_sread).
  int ret = 0;
  for (enum fi_wait_obj wait : {FI_WAIT_FD, FI_WAIT_UNSPEC}) {
    cq_attr.wait_obj = wait;
    ret = fi_cq_open(domain_.get(), &cq_attr, set.cq.out(), nullptr);
    if (ret == 0) break;
  }
  if (ret == 0 && fi_control(&set.cq.get()->fid, FI_GETWAIT, &set.cq_fd) != 0) set.cq_fd = -1;
  if (ret) {
    // No wait object: the progress thread polls (busy, never sleeps).
    cq_attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(domain_.get(), &cq_attr, set.cq.out(), nullptr);
    if (ret) return FabricStatus(ret, "fi_cq_open(" + where + ")");
  }

  struct fi_av_attr av_attr {};
  av_attr.type =
      info_->domain_attr->av_type == FI_AV_UNSPEC ? FI_AV_TABLE : info_->domain_attr->av_type;
  ret = fi_av_open(domain_.get(), &av_attr, set.av.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_av_open(" + where + ")");

  // A provider that would name the endpoint's shared resource after the process id (shm) gets a
  // name of its own: a region a killed process left under this pid would fail fi_enable (EBUSY).
  std::unique_ptr<struct fi_info, InfoDeleter> named;
  struct fi_info* endpoint_info = info_.get();
  if (profile_.names_endpoint_by_pid) {
    static std::once_flag swept;
    std::call_once(swept, RemoveRegionsOfDeadProcesses);
    named.reset(fi_dupinfo(info_.get()));
    const std::string name = UniqueEndpointName(*info_);
    char* address = named ? strdup(name.c_str()) : nullptr;
    if (address == nullptr) return ResourceExhausted("no memory to name an endpoint of " + where);
    free(named->src_addr);
    named->src_addr = address;
    named->src_addrlen = name.size() + 1;
    endpoint_info = named.get();
  }
  ret = fi_endpoint(domain_.get(), endpoint_info, set.ep.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_endpoint(" + where + ")");
  ret = fi_ep_bind(set.ep.get(), &set.av.get()->fid, 0);
  if (ret) return FabricStatus(ret, "fi_ep_bind(av)");
  ret = fi_ep_bind(set.ep.get(), &set.cq.get()->fid, FI_TRANSMIT | FI_RECV);
  if (ret) return FabricStatus(ret, "fi_ep_bind(cq)");
  ret = fi_enable(set.ep.get());
  if (ret) {
    Status s = FabricStatus(ret, "fi_enable(" + where + ")");
    if (profile_.rdma) {
      // rxm sizes its verbs CQ as (rx+tx) x FI_UNIVERSE_SIZE, beyond small devices' max_cqe.
      return Status(s.code(), s.message() +
                                  ". On Soft-RoCE (rxe) or other devices with a small max_cqe, "
                                  "set FI_UNIVERSE_SIZE=64 (or the number of peers you need)");
    }
    return s;
  }
  return Status::OK();
}

void EngineCore::ResetEndpointLocked(const std::string& why) {
  // libfabric 1.17 has no per-peer way to stop an RMA operation once posted: fi_cancel covers
  // receives only, fi_av_remove leaves rxm's connection up (unless the user set
  // FI_AV_REMOVE_CLEANUP), and the sockets provider keeps its connections after removal.
  // Closing the endpoint closes every connection (rxm closes each msg endpoint: the tcp socket,
  // or the verbs QP), after which no posted operation can move a byte. The completion queue goes
  // with it, so no stale completion can name a transfer that was already reported.
  RF_LOG(kWarn, "resetting the fabric endpoint (" << why << "): " << active_.size()
                                                  << " transfers in flight fail; peers reconnect");
  const std::string old_address = AddressLocked();
  if (profile_.bytes_move_without_progress) {
    eps_.Close();
  } else {
    // On a software provider with manual progress (tcp, net) nothing moves a byte unless this
    // process drives that endpoint's progress, which it never does again: abandoning the set
    // cuts its transfers off as surely as closing it. Closing is what we must not do there:
    // libfabric 1.17's tcp provider crashes (SIGSEGV) when an endpoint is closed while a read
    // response is half received (an rx entry freed twice; fixed upstream in 1.18), which is
    // exactly the state a frozen peer leaves it in. Seen in 8 of 12 runs of the frozen-peer test.
    eps_.Abandon();
    ++abandoned_endpoints_;
  }
  ++endpoint_generation_;
  ++resets_;
  for (auto& t : active_) {
    if (!t->failed) {
      t->failed = true;
      ++transfers_failed_;
      t->failure = Aborted(t->what + ": the fabric endpoint was reset (" + why + ")");
    }
    t->inflight = 0;
    t->Finish(t->failure, true);
  }
  active_.clear();
  blocked_ = false;
  for (Peer& p : peer_table_) p.broken = true;
  mapped_raw_keys_.clear();
  Status s = OpenEndpointLocked(eps_);
  if (!s.ok()) {
    // Nothing can be sent any more; every Start fails with this until the engine is reopened.
    RF_LOG(kError, "reopening the fabric endpoint after a reset failed: " << s);
  } else {
    RF_LOG(kInfo, "fabric endpoint reopened; address changed: "
                      << (AddressLocked() != old_address ? "yes" : "no"));
  }
  Wake();
}

void EngineCore::Stop() {
  stop_ = true;
  Wake();
  if (progress_.joinable()) progress_.join();
  std::vector<std::shared_ptr<TransferState>> left;
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    left.swap(active_);
  }
  // The endpoint set closes with the core (after this): nothing posted moves afterwards.
  for (auto& t : left) t->Finish(Aborted(t->what + ": the engine shut down"), false);
}

void EngineCore::Wake() {
  uint64_t one = 1;
  if (wake_fd_ >= 0 && write(wake_fd_, &one, sizeof(one)) < 0) RF_LOG(kDebug, "wake failed");
}

FabricAddress EngineCore::Address() const {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  return {profile_.provider, profile_.fabric, profile_.domain, AddressLocked()};
}

std::string EngineCore::AddressLocked() const {
  if (!eps_.ep) return "";
  char buf[256];
  size_t len = sizeof(buf);
  if (fi_getname(&eps_.ep.get()->fid, buf, &len) != 0) return "";
  return std::string(buf, len);
}

Result<PeerId> EngineCore::AddPeer(const FabricAddress& peer) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  // The provider first: addresses of different providers can look alike (sockets and
  // tcp;ofi_rxm both use a sockaddr_in) and would be inserted, and every operation then fail.
  if (peer.provider != profile_.provider) {
    return InvalidArgument("peer address of provider " + peer.Describe() +
                           " given to an engine of provider " + profile_.provider + "/" +
                           profile_.domain +
                           ": a pair of nodes can only use a provider both of them have");
  }
  const std::string& address = peer.bytes;
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second;
  if (!eps_.ep) return Unavailable("the fabric endpoint is not open (a reset failed to reopen it)");
  const std::string own = AddressLocked();
  bool fits = !address.empty() && address.size() == own.size();
  std::string expected = std::to_string(own.size()) + " bytes";
  if (profile_.string_address) {
    // A name in this provider's scheme ("fi_shm://"), NUL-terminated, no NUL inside, no longer
    // than AddressLocked reads.
    constexpr size_t kMaxStringAddress = 256;
    const size_t scheme_end = own.find("://");
    const std::string scheme = scheme_end == std::string::npos ? "" : own.substr(0, scheme_end + 3);
    fits = address.size() > scheme.size() && address.size() <= kMaxStringAddress &&
           address.compare(0, scheme.size(), scheme) == 0 && address.back() == '\0' &&
           address.find('\0') == address.size() - 1;
    expected = "a NUL-terminated name starting with '" + scheme + "', at most " +
               std::to_string(kMaxStringAddress) + " bytes";
  }
  if (!fits) {
    return InvalidArgument("peer address of " + std::to_string(address.size()) +
                           " bytes is not a " + profile_.provider + " address (" + expected +
                           " here)");
  }
  fi_addr_t fi_addr = FI_ADDR_UNSPEC;
  int ret = fi_av_insert(eps_.av.get(), address.data(), 1, &fi_addr, 0, nullptr);
  if (ret != 1) {
    return FabricStatus(ret < 0 ? ret : -FI_EINVAL,
                        "fi_av_insert of the address of peer " + peer.Describe());
  }
  PeerId id = peer_table_.size();
  peer_table_.push_back({address, fi_addr, false, endpoint_generation_});
  peers_[address] = id;
  return id;
}

Status EngineCore::ReconnectLocked(PeerId id) {
  Peer& peer = peer_table_[id];
  if (!eps_.ep) return Unavailable("the fabric endpoint is not open (a reset failed to reopen it)");
  // Forget the old connection (if it is in this endpoint's address vector) and let the provider
  // make a new one on the next operation.
  if (peer.generation == endpoint_generation_) {
    fi_addr_t old = peer.fi_addr;
    int ret = fi_av_remove(eps_.av.get(), &old, 1, 0);
    if (ret) RF_LOG(kDebug, "fi_av_remove: " << fi_strerror(-ret));
  }
  fi_addr_t fresh = FI_ADDR_UNSPEC;
  int ret = fi_av_insert(eps_.av.get(), peer.address.data(), 1, &fresh, 0, nullptr);
  if (ret != 1) return FabricStatus(ret < 0 ? ret : -FI_EINVAL, "fi_av_insert (reconnect)");
  peer.fi_addr = fresh;
  peer.broken = false;
  peer.generation = endpoint_generation_;
  return Status::OK();
}

}  // namespace rayfabric::fabric

namespace rayfabric::fabric {

std::string FabricAddress::Describe() const { return provider + "/" + domain; }

// Four length-prefixed fields (32-bit little-endian lengths): provider, fabric, domain, bytes.
std::string FabricAddress::Serialize() const {
  std::string out;
  for (const std::string* field : {&provider, &fabric, &domain, &bytes}) {
    const uint32_t n = static_cast<uint32_t>(field->size());
    out.append(reinterpret_cast<const char*>(&n), sizeof(n));
    out += *field;
  }
  return out;
}

Result<FabricAddress> FabricAddress::Parse(const std::string& serialized) {
  FabricAddress a;
  size_t at = 0;
  for (std::string* field : {&a.provider, &a.fabric, &a.domain, &a.bytes}) {
    uint32_t n = 0;
    if (serialized.size() - at < sizeof(n)) {
      return InvalidArgument("fabric address of " + std::to_string(serialized.size()) +
                             " bytes is truncated");
    }
    std::memcpy(&n, serialized.data() + at, sizeof(n));
    at += sizeof(n);
    if (serialized.size() - at < n) {
      return InvalidArgument("fabric address of " + std::to_string(serialized.size()) +
                             " bytes is truncated");
    }
    *field = serialized.substr(at, n);
    at += n;
  }
  if (at != serialized.size()) return InvalidArgument("fabric address has trailing bytes");
  return a;
}

}  // namespace rayfabric::fabric
