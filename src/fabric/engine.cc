// The RMA engine: endpoint, address vector, completion queue, registration cache, chunked
// transfers and the progress thread that completes them (and serves remote one-sided operations
// on manual-progress providers).
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "fabric/fabric_error.h"
#include "fabric/fid.h"
#include "fabric/provider.h"
#include "rayfabric/fabric.h"
#include "rayfabric/log.h"

namespace rayfabric::fabric {

namespace {

using Clock = std::chrono::steady_clock;

// How long the progress thread blocks in the CQ wait object before it looks at deadlines.
constexpr int kProgressWaitMs = 20;
constexpr size_t kCqBatch = 64;

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

std::string MemlockHint() {
  struct rlimit rl {};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return "";
  return "; the locked-memory limit (ulimit -l) is " + HumanBytes(rl.rlim_cur) +
         ": raise it (ulimit -l unlimited, or LimitMEMLOCK=infinity for a systemd service)";
}

}  // namespace

// ------------------------------------------------------------------------------ transfer state

struct OpContext {
  struct fi_context2 fi_ctx;  // first member: libfabric hands back its address
  TransferState* owner = nullptr;
};

class TransferState {
 public:
  struct Chunk {
    void* local;
    size_t length;
    uint64_t remote_addr;
  };

  RmaOp op = RmaOp::kRead;
  PeerId peer = 0;
  fi_addr_t fi_addr = FI_ADDR_UNSPEC;
  uint64_t key = 0;
  std::shared_ptr<MemoryRegion> local_region;
  void* local_desc = nullptr;
  std::vector<Chunk> chunks;
  std::vector<OpContext> contexts;
  uint64_t total_bytes = 0;
  Clock::time_point deadline;
  std::string what;  // "fi_read of 64.0 MiB from peer 2"

  // Guarded by EngineCore::mu_.
  size_t next = 0;
  size_t inflight = 0;
  size_t completed = 0;
  bool failed = false;

  // Guarded by wait_mu: what waiters see.
  mutable std::mutex wait_mu;
  mutable std::condition_variable wait_cv;
  bool done = false;
  Status status;

  void Finish(Status s) {
    std::lock_guard<std::mutex> lock(wait_mu);
    if (done) return;
    done = true;
    status = std::move(s);
    wait_cv.notify_all();
  }
  bool Drained() const { return inflight == 0 && (failed || completed == chunks.size()); }
};

Status Transfer::Wait(std::chrono::milliseconds timeout) const {
  if (!state_) return InvalidArgument("Wait() on an empty Transfer");
  std::unique_lock<std::mutex> lock(state_->wait_mu);
  if (timeout == std::chrono::milliseconds::max()) {
    state_->wait_cv.wait(lock, [&] { return state_->done; });
  } else if (!state_->wait_cv.wait_for(lock, timeout, [&] { return state_->done; })) {
    return TimedOut(state_->what + " still running after waiting " +
                    std::to_string(timeout.count()) + " ms");
  }
  return state_->status;
}

bool Transfer::Done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->wait_mu);
  return state_->done;
}

uint64_t Transfer::bytes() const { return state_ ? state_->total_bytes : 0; }

// ------------------------------------------------------------------------------------ the core

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  ~EngineCore() {
    if (wake_fd_ >= 0) close(wake_fd_);
    // Reverse order of creation; memory regions are gone already (each holds a reference).
    ep_.reset();
    av_.reset();
    cq_.reset();
    domain_.reset();
    fabric_.reset();
  }

  Status Open(const Config& config);
  void StartProgress() { progress_ = std::thread([this] { ProgressLoop(); }); }
  void Stop();

  Result<std::shared_ptr<MemoryRegion>> Register(void* base, size_t length);
  void Deregister(MemoryRegion* region);
  Result<PeerId> AddPeer(const std::string& address);
  Result<Transfer> Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                         const std::shared_ptr<MemoryRegion>& local_region,
                         const std::vector<RmaSpan>& spans);
  std::string Address() const;
  EngineStats Stats() const;

  ProviderReport report_;
  ProviderProfile profile_;

 private:
  friend class MemoryRegion;
  void ProgressLoop();
  // Posts chunks of `t` until the window is full; requires mu_.
  void PumpLocked(TransferState& t);
  void FailLocked(TransferState& t, Status s);
  void OnCompletionLocked(OpContext* ctx);
  void ReapLocked();
  Result<uint64_t> RemoteKey(const RemoteRegion& remote);

  std::unique_ptr<struct fi_info, InfoDeleter> info_;
  Fid<struct fid_fabric> fabric_;
  Fid<struct fid_domain> domain_;
  Fid<struct fid_cq> cq_;
  Fid<struct fid_av> av_;
  Fid<struct fid_ep> ep_;
  bool cq_waitable_ = false;
  int cq_fd_ = -1;    // the CQ's wait fd (FI_GETWAIT), or -1: then the progress thread polls
  int wake_fd_ = -1;  // eventfd that wakes the progress thread (new work, shutdown)
  void Wake() {
    uint64_t one = 1;
    if (wake_fd_ >= 0 && write(wake_fd_, &one, sizeof(one)) < 0) RF_LOG(kDebug, "wake failed");
  }
  size_t chunk_size_ = 0;
  size_t max_inflight_ = 0;
  std::chrono::milliseconds op_timeout_{0};

  // Recursive: dropping the last reference to a region (inside a reaped transfer) deregisters it,
  // which takes this lock again on the same thread.
  mutable std::recursive_mutex mu_;
  std::vector<std::shared_ptr<TransferState>> active_;
  bool blocked_ = false;  // some post returned FI_EAGAIN: poll instead of blocking
  // PeerId indexes peer_table_; the fi_addr behind it changes when a broken connection is
  // re-established (some providers tear a connection down after any error on it).
  struct Peer {
    std::string address;
    fi_addr_t fi_addr;
    bool broken;
  };
  std::vector<Peer> peer_table_;
  std::map<std::string, PeerId> peers_;
  Status ReconnectLocked(Peer& peer);
  std::map<std::string, uint64_t> mapped_raw_keys_;
  struct CachedRegion {
    MemoryRegion* raw;
    std::weak_ptr<MemoryRegion> weak;
  };
  std::multimap<uintptr_t, CachedRegion> regions_;
  uint64_t next_key_ = 1;

  std::atomic<bool> stop_{false};
  std::thread progress_;

  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0}, ops_posted_{0}, ops_failed_{0},
      transfers_ok_{0}, transfers_failed_{0}, regions_registered_{0};
};

Status EngineCore::Open(const Config& config) {
  RF_ASSIGN_OR_RETURN(SelectedProvider selected, SelectProviderInfo(config));
  report_ = std::move(selected.report);
  profile_ = report_.chosen;
  info_ = std::move(selected.info);

  RF_ASSIGN_OR_RETURN(uint64_t chunk, config.GetBytes("chunk_size"));
  RF_ASSIGN_OR_RETURN(int64_t inflight, config.GetInt("max_inflight"));
  RF_ASSIGN_OR_RETURN(int64_t timeout_ms, config.GetInt("op_timeout_ms"));
  if (chunk == 0) return InvalidArgument("chunk_size must be > 0");
  if (inflight <= 0) return InvalidArgument("max_inflight must be > 0");
  if (timeout_ms <= 0) return InvalidArgument("op_timeout_ms must be > 0");
  chunk_size_ = std::min<uint64_t>(chunk, profile_.max_msg_size ? profile_.max_msg_size : chunk);
  max_inflight_ = static_cast<size_t>(inflight);
  op_timeout_ = std::chrono::milliseconds(timeout_ms);

  const std::string where = profile_.provider + "/" + profile_.domain;
  int ret = fi_fabric(info_->fabric_attr, fabric_.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_fabric(" + where + ")");
  ret = fi_domain(fabric_.get(), info_.get(), domain_.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_domain(" + where + ")");

  struct fi_cq_attr cq_attr {};
  cq_attr.format = FI_CQ_FORMAT_CONTEXT;
  cq_attr.size = std::max<size_t>(info_->tx_attr->size, 1024);
  // An fd wait object first: its blocking read honours the timeout on every provider tried
  // (shm's default yield-based wait did not, and spun forever in fi_cq_sread).
  for (enum fi_wait_obj wait : {FI_WAIT_FD, FI_WAIT_UNSPEC}) {
    cq_attr.wait_obj = wait;
    ret = fi_cq_open(domain_.get(), &cq_attr, cq_.out(), nullptr);
    if (ret == 0) break;
  }
  cq_waitable_ = ret == 0;
  if (ret == 0 && fi_control(&cq_.get()->fid, FI_GETWAIT, &cq_fd_) != 0) cq_fd_ = -1;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (ret) {
    // No wait object: the progress thread polls (busy, never sleeps).
    cq_attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(domain_.get(), &cq_attr, cq_.out(), nullptr);
    if (ret) return FabricStatus(ret, "fi_cq_open(" + where + ")");
  }

  struct fi_av_attr av_attr {};
  av_attr.type = info_->domain_attr->av_type == FI_AV_UNSPEC ? FI_AV_TABLE : info_->domain_attr->av_type;
  ret = fi_av_open(domain_.get(), &av_attr, av_.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_av_open(" + where + ")");

  ret = fi_endpoint(domain_.get(), info_.get(), ep_.out(), nullptr);
  if (ret) return FabricStatus(ret, "fi_endpoint(" + where + ")");
  ret = fi_ep_bind(ep_.get(), &av_.get()->fid, 0);
  if (ret) return FabricStatus(ret, "fi_ep_bind(av)");
  ret = fi_ep_bind(ep_.get(), &cq_.get()->fid, FI_TRANSMIT | FI_RECV);
  if (ret) return FabricStatus(ret, "fi_ep_bind(cq)");
  ret = fi_enable(ep_.get());
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

void EngineCore::Stop() {
  stop_ = true;
  Wake();
  if (progress_.joinable()) progress_.join();
  std::vector<std::shared_ptr<TransferState>> left;
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    left.swap(active_);
  }
  for (auto& t : left) t->Finish(Aborted(t->what + ": the engine shut down"));
}

std::string EngineCore::Address() const {
  char buf[256];
  size_t len = sizeof(buf);
  if (fi_getname(&ep_.get()->fid, buf, &len) != 0) return "";
  return std::string(buf, len);
}

Result<PeerId> EngineCore::AddPeer(const std::string& address) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second;
  size_t own = Address().size();
  if (address.empty() || address.size() != own) {
    return InvalidArgument("peer address of " + std::to_string(address.size()) +
                           " bytes does not match this provider's (" + profile_.provider + ", " +
                           std::to_string(own) + " bytes): does the peer use another provider?");
  }
  fi_addr_t fi_addr = FI_ADDR_UNSPEC;
  int ret = fi_av_insert(av_.get(), address.data(), 1, &fi_addr, 0, nullptr);
  if (ret != 1) return FabricStatus(ret < 0 ? ret : -FI_EINVAL, "fi_av_insert of a peer address");
  PeerId id = peer_table_.size();
  peer_table_.push_back({address, fi_addr, false});
  peers_[address] = id;
  return id;
}

Status EngineCore::ReconnectLocked(Peer& peer) {
  // Forget the old connection and let the provider make a new one on the next operation.
  fi_addr_t old = peer.fi_addr;
  int ret = fi_av_remove(av_.get(), &old, 1, 0);
  if (ret) RF_LOG(kDebug, "fi_av_remove: " << fi_strerror(-ret));
  fi_addr_t fresh = FI_ADDR_UNSPEC;
  ret = fi_av_insert(av_.get(), peer.address.data(), 1, &fresh, 0, nullptr);
  if (ret != 1) return FabricStatus(ret < 0 ? ret : -FI_EINVAL, "fi_av_insert (reconnect)");
  peer.fi_addr = fresh;
  peer.broken = false;
  return Status::OK();
}

Result<std::shared_ptr<MemoryRegion>> EngineCore::Register(void* base, size_t length) {
  if (base == nullptr || length == 0) return InvalidArgument("Register: empty region");
  const uintptr_t start = reinterpret_cast<uintptr_t>(base);
  // Regions looked at during the cache scan; released only after the lock, since dropping the
  // last reference deregisters (and edits regions_).
  std::vector<std::shared_ptr<MemoryRegion>> seen;
  std::lock_guard<std::recursive_mutex> lock(mu_);
  // Cache: a registered region that covers the whole range serves it.
  for (auto it = regions_.upper_bound(start); it != regions_.begin();) {
    --it;
    if (auto region = it->second.weak.lock()) {
      if (region->Contains(base, length)) return region;
      seen.push_back(std::move(region));
    }
  }
  std::shared_ptr<MemoryRegion> region(new MemoryRegion());
  region->core_ = shared_from_this();
  region->base_ = base;
  region->length_ = length;
  const uint64_t access = FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
  const uint64_t requested_key = profile_.prov_key ? 0 : next_key_++;
  int ret = fi_mr_reg(domain_.get(), base, length, access, 0, requested_key, 0, &region->mr_, nullptr);
  if (ret) {
    Status s = FabricStatus(ret, "fi_mr_reg of " + HumanBytes(length) + " on " + profile_.provider);
    region->core_.reset();
    region->mr_ = nullptr;
    if (s.code() == StatusCode::kResourceExhausted) return ResourceExhausted(s.message() + MemlockHint());
    return s;
  }
  if (profile_.endpoint_mr) {
    ret = fi_mr_bind(region->mr_, &ep_.get()->fid, 0);
    if (!ret) ret = fi_mr_enable(region->mr_);
    if (ret) {
      fi_close(&region->mr_->fid);
      region->mr_ = nullptr;
      region->core_.reset();
      return FabricStatus(ret, "binding a memory region to the endpoint (FI_MR_ENDPOINT)");
    }
  }
  region->key_ = fi_mr_key(region->mr_);
  if (profile_.raw_key) {
    uint64_t raw_base = 0;
    size_t key_size = profile_.key_size ? profile_.key_size : 64;
    std::string raw(key_size, '\0');
    ret = fi_mr_raw_attr(region->mr_, &raw_base, reinterpret_cast<uint8_t*>(raw.data()), &key_size, 0);
    if (ret) {
      fi_close(&region->mr_->fid);
      region->mr_ = nullptr;
      region->core_.reset();
      return FabricStatus(ret, "fi_mr_raw_attr");
    }
    raw.resize(key_size);
    region->raw_key_ = raw;
  }
  regions_.emplace(start, CachedRegion{region.get(), region});
  ++regions_registered_;
  return region;
}

void EngineCore::Deregister(MemoryRegion* region) {
  {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto range = regions_.equal_range(reinterpret_cast<uintptr_t>(region->base_));
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second.raw == region) {
        regions_.erase(it);
        break;
      }
    }
  }
  if (region->mr_ != nullptr) fi_close(&region->mr_->fid);
  --regions_registered_;
}

Result<uint64_t> EngineCore::RemoteKey(const RemoteRegion& remote) {
  if (remote.raw_key.empty()) return remote.key;
  // FI_MR_RAW: the reader maps the owner's raw key to a local one, once per key.
  auto it = mapped_raw_keys_.find(remote.raw_key);
  if (it != mapped_raw_keys_.end()) return it->second;
  uint64_t key = 0;
  std::string raw = remote.raw_key;
  int ret = fi_mr_map_raw(domain_.get(), remote.address, reinterpret_cast<uint8_t*>(raw.data()),
                          raw.size(), &key, 0);
  if (ret) return FabricStatus(ret, "fi_mr_map_raw of a remote key");
  mapped_raw_keys_[remote.raw_key] = key;
  return key;
}

Result<Transfer> EngineCore::Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                                   const std::shared_ptr<MemoryRegion>& local_region,
                                   const std::vector<RmaSpan>& spans) {
  const char* verb = op == RmaOp::kRead ? "fi_read" : "fi_write";
  if (!local_region) return InvalidArgument(std::string(verb) + ": no local memory region");
  if (spans.empty()) return InvalidArgument(std::string(verb) + ": nothing to transfer");
  auto t = std::make_shared<TransferState>();
  t->op = op;
  t->peer = peer;
  t->local_region = local_region;
  t->local_desc = local_region->local_desc();
  for (const RmaSpan& s : spans) {
    if (s.length == 0) return InvalidArgument(std::string(verb) + ": zero-length span");
    if (!local_region->Contains(s.local, s.length)) {
      return OutOfRange(std::string(verb) + ": local buffer of " + HumanBytes(s.length) +
                        " lies outside its registered region");
    }
    if (s.remote_offset > remote.length || s.length > remote.length - s.remote_offset) {
      return OutOfRange(std::string(verb) + ": remote range [" + std::to_string(s.remote_offset) +
                        ", +" + std::to_string(s.length) + ") exceeds the remote region of " +
                        std::to_string(remote.length) + " bytes");
    }
    for (size_t off = 0; off < s.length; off += chunk_size_) {
      size_t len = std::min(chunk_size_, s.length - off);
      t->chunks.push_back({static_cast<char*>(s.local) + off, len, remote.address + s.remote_offset + off});
    }
    t->total_bytes += s.length;
  }
  t->contexts.resize(t->chunks.size());
  for (auto& c : t->contexts) c.owner = t.get();
  t->what = std::string(verb) + " of " + HumanBytes(t->total_bytes) + " with peer " +
            std::to_string(peer) + " over " + profile_.provider;
  t->deadline = Clock::now() + op_timeout_;

  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (peer >= peer_table_.size()) {
    return NotFound(std::string(verb) + ": unknown peer " + std::to_string(peer) + " (AddPeer first)");
  }
  if (peer_table_[peer].broken) RF_RETURN_IF_ERROR(ReconnectLocked(peer_table_[peer]));
  t->fi_addr = peer_table_[peer].fi_addr;
  RF_ASSIGN_OR_RETURN(t->key, RemoteKey(remote));
  active_.push_back(t);
  PumpLocked(*t);
  if (blocked_) Wake();
  ReapLocked();
  return Transfer(t);
}

void EngineCore::PumpLocked(TransferState& t) {
  while (!t.failed && t.next < t.chunks.size() && t.inflight < max_inflight_) {
    const auto& c = t.chunks[t.next];
    void* ctx = &t.contexts[t.next].fi_ctx;
    ssize_t ret;
    if (t.op == RmaOp::kRead) {
      ret = fi_read(ep_.get(), c.local, c.length, t.local_desc, t.fi_addr, c.remote_addr, t.key, ctx);
    } else {
      // Delivery complete: when the write completes, the bytes are in the target's memory, so a
      // notification sent afterwards (over any channel) never overtakes them.
      struct iovec iov = {c.local, c.length};
      struct fi_rma_iov rma_iov = {c.remote_addr, c.length, t.key};
      void* desc = t.local_desc;
      struct fi_msg_rma msg = {&iov, &desc, 1, t.fi_addr, &rma_iov, 1, ctx, 0};
      ret = fi_writemsg(ep_.get(), &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
    }
    if (ret == -FI_EAGAIN) {
      blocked_ = true;  // queue full: the progress thread retries after reaping completions
      return;
    }
    if (ret != 0) {
      FailLocked(t, FabricStatus(static_cast<int>(ret), "posting " + t.what));
      return;
    }
    ++t.next;
    ++t.inflight;
    ++ops_posted_;
  }
}

void EngineCore::FailLocked(TransferState& t, Status s) {
  if (!t.failed) {
    t.failed = true;
    ++transfers_failed_;
    t.Finish(std::move(s));
  }
}

void EngineCore::OnCompletionLocked(OpContext* ctx) {
  TransferState& t = *ctx->owner;
  --t.inflight;
  ++t.completed;
  if (t.failed) return;
  if (t.completed == t.chunks.size()) {
    (t.op == RmaOp::kRead ? bytes_read_ : bytes_written_) += t.total_bytes;
    ++transfers_ok_;
    t.Finish(Status::OK());
  } else {
    PumpLocked(t);
  }
}

void EngineCore::ReapLocked() {
  active_.erase(std::remove_if(active_.begin(), active_.end(),
                               [](const std::shared_ptr<TransferState>& t) { return t->Drained(); }),
                active_.end());
}

void EngineCore::ProgressLoop() {
  struct fi_cq_entry entries[kCqBatch];
  struct fid* cq_fid = &cq_.get()->fid;
  while (!stop_) {
    // Reading the CQ also drives the provider's progress, which is what lets remote peers'
    // one-sided operations on our memory complete on manual-progress providers.
    ssize_t n = fi_cq_read(cq_.get(), entries, kCqBatch);
    if (n == -FI_EAGAIN) {
      bool blocked;
      {
        std::lock_guard<std::recursive_mutex> lock(mu_);
        blocked = blocked_;
      }
      if (cq_fd_ >= 0 && !blocked) {
        // Nothing to do: block on the CQ's fd (and our wake fd) until the provider has work,
        // at most kProgressWaitMs so that deadlines are checked.
        if (fi_trywait(fabric_.get(), &cq_fid, 1) == FI_SUCCESS) {
          struct pollfd fds[2] = {{cq_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
          if (poll(fds, 2, kProgressWaitMs) > 0 && (fds[1].revents & POLLIN)) {
            uint64_t drained;
            if (read(wake_fd_, &drained, sizeof(drained)) < 0) drained = 0;
          }
        }
      } else {
        sched_yield();  // no wait fd: poll (never sleep) so progress stays prompt
      }
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) OnCompletionLocked(static_cast<OpContext*>(entries[i].op_context));
    } else if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err {};
      if (fi_cq_readerr(cq_.get(), &err, 0) > 0 && err.op_context != nullptr) {
        auto* ctx = static_cast<OpContext*>(err.op_context);
        TransferState& t = *ctx->owner;
        ++ops_failed_;
        if (t.peer < peer_table_.size() && peer_table_[t.peer].fi_addr == t.fi_addr) {
          peer_table_[t.peer].broken = true;
        }
        FailLocked(t, CompletionStatus(cq_.get(), err, t.what));
        --t.inflight;
        ++t.completed;
      }
    } else if (n != -FI_EAGAIN && n != 0) {
      RF_LOG(kWarn, "fi_cq_read: " << fi_strerror(static_cast<int>(-n)));
    }
    if (blocked_) {
      blocked_ = false;
      for (auto& t : active_) PumpLocked(*t);
    }
    const auto now = Clock::now();
    for (auto& t : active_) {
      if (!t->failed && now > t->deadline) {
        FailLocked(*t, TimedOut(t->what + " did not complete within op_timeout_ms=" +
                                std::to_string(op_timeout_.count()) +
                                " (dead peer or cut link?)"));
      }
    }
    ReapLocked();
  }
}

EngineStats EngineCore::Stats() const {
  EngineStats s;
  s.bytes_read = bytes_read_;
  s.bytes_written = bytes_written_;
  s.ops_posted = ops_posted_;
  s.ops_failed = ops_failed_;
  s.transfers_ok = transfers_ok_;
  s.transfers_failed = transfers_failed_;
  s.regions_registered = regions_registered_;
  std::lock_guard<std::recursive_mutex> lock(mu_);
  s.peers = peers_.size();
  return s;
}

// ------------------------------------------------------------------------------ MemoryRegion

MemoryRegion::~MemoryRegion() {
  if (core_) core_->Deregister(this);
}

bool MemoryRegion::Contains(const void* p, size_t len) const {
  auto a = reinterpret_cast<uintptr_t>(p);
  auto b = reinterpret_cast<uintptr_t>(base_);
  return a >= b && len <= length_ && a - b <= length_ - len;
}

RemoteRegion MemoryRegion::Describe() const {
  RemoteRegion r;
  r.address = core_->profile_.virt_addr ? reinterpret_cast<uint64_t>(base_) : 0;
  r.length = length_;
  r.key = key_;
  r.raw_key = raw_key_;
  return r;
}

void* MemoryRegion::local_desc() const { return mr_ ? fi_mr_desc(mr_) : nullptr; }

// ------------------------------------------------------------------------------ RemoteRegion

std::string RemoteRegion::Serialize() const {
  std::string out(24, '\0');
  std::memcpy(out.data(), &address, 8);
  std::memcpy(out.data() + 8, &length, 8);
  std::memcpy(out.data() + 16, &key, 8);
  return out + raw_key;
}

Result<RemoteRegion> RemoteRegion::Parse(const std::string& bytes) {
  if (bytes.size() < 24) {
    return InvalidArgument("remote region descriptor of " + std::to_string(bytes.size()) +
                           " bytes is too short (need at least 24)");
  }
  RemoteRegion r;
  std::memcpy(&r.address, bytes.data(), 8);
  std::memcpy(&r.length, bytes.data() + 8, 8);
  std::memcpy(&r.key, bytes.data() + 16, 8);
  r.raw_key = bytes.substr(24);
  return r;
}

// ------------------------------------------------------------------------------------ Engine

Engine::Engine(std::shared_ptr<EngineCore> core) : core_(std::move(core)) {}

Engine::~Engine() { core_->Stop(); }

Result<std::unique_ptr<Engine>> Engine::Open(const Config& config) {
  auto core = std::make_shared<EngineCore>();
  RF_RETURN_IF_ERROR(core->Open(config));
  core->StartProgress();
  RF_LOG(kInfo, "provider " << core->profile_.provider << " domain " << core->profile_.domain
                            << ": " << core->report_.reason);
  return std::unique_ptr<Engine>(new Engine(std::move(core)));
}

const ProviderReport& Engine::report() const { return core_->report_; }
const ProviderProfile& Engine::profile() const { return core_->profile_; }
std::string Engine::Address() const { return core_->Address(); }
Result<PeerId> Engine::AddPeer(const std::string& address) { return core_->AddPeer(address); }
Result<std::shared_ptr<MemoryRegion>> Engine::Register(void* base, size_t length) {
  return core_->Register(base, length);
}
Result<Transfer> Engine::Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                               const std::shared_ptr<MemoryRegion>& local_region,
                               const std::vector<RmaSpan>& spans) {
  return core_->Start(op, peer, remote, local_region, spans);
}

Status Engine::Read(PeerId peer, const RemoteRegion& remote, uint64_t remote_offset,
                    const std::shared_ptr<MemoryRegion>& local_region, void* local, size_t length) {
  RF_ASSIGN_OR_RETURN(Transfer t, Start(RmaOp::kRead, peer, remote, local_region,
                                        {RmaSpan{local, length, remote_offset}}));
  return t.Wait();
}

Status Engine::Write(PeerId peer, const RemoteRegion& remote, uint64_t remote_offset,
                     const std::shared_ptr<MemoryRegion>& local_region, const void* local,
                     size_t length) {
  RF_ASSIGN_OR_RETURN(Transfer t, Start(RmaOp::kWrite, peer, remote, local_region,
                                        {RmaSpan{const_cast<void*>(local), length, remote_offset}}));
  return t.Wait();
}

EngineStats Engine::stats() const { return core_->Stats(); }

}  // namespace rayfabric::fabric
