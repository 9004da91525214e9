// The engine's insides, shared by its files (one per job): endpoint.cc (fabric, domain, the
// endpoint set and its reset, peers), memory.cc (registrations and descriptors), transfer.cc
// (chunked RMA, completions, progress thread, timeouts, drain), engine.cc (the public facade).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_endpoint.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fabric/fid.h"
#include "fabric/provider.h"
#include "rayfabric/fabric.h"

namespace rayfabric::fabric {

using Clock = std::chrono::steady_clock;

std::string HumanBytes(uint64_t n);

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
  uint64_t endpoint_generation = 0;  // the endpoint set its operations were posted on
  std::shared_ptr<MemoryRegion> local_region;
  void* local_desc = nullptr;
  std::vector<Chunk> chunks;
  std::vector<OpContext> contexts;
  uint64_t total_bytes = 0;
  std::string what;  // "fi_read of 64.0 MiB with peer 2 over tcp;ofi_rxm"
  std::weak_ptr<EngineCore> core;
  std::chrono::microseconds spin{0};  // a waiter polls `done` this long before it blocks

  // Guarded by EngineCore::mu_.
  size_t next = 0;
  size_t inflight = 0;
  size_t completed = 0;
  bool failed = false;
  Status failure;                   // what Wait() reports once the transfer is drained
  Clock::time_point last_progress;  // start, or the latest completion (progress timeout)
  Clock::time_point failed_at;      // drain bound starts here

  // Guarded by wait_mu: what waiters see.
  mutable std::mutex wait_mu;
  mutable std::condition_variable wait_cv;
  bool done = false;
  bool quiesced = false;  // no operation outstanding
  Status status;

  void Finish(Status s, bool now_quiesced) {
    std::lock_guard<std::mutex> lock(wait_mu);
    if (!done) {
      done = true;
      status = std::move(s);
    }
    quiesced = quiesced || now_quiesced;
    wait_cv.notify_all();
  }
  void MarkQuiesced() {
    std::lock_guard<std::mutex> lock(wait_mu);
    quiesced = true;
    wait_cv.notify_all();
  }
  bool Drained() const { return inflight == 0 && (failed || completed == chunks.size()); }
};

// The endpoint, its address vector and completion queue: what a reset replaces (registrations
// live in the domain and survive it).
struct EndpointSet {
  Fid<struct fid_cq> cq;
  Fid<struct fid_av> av;
  Fid<struct fid_ep> ep;
  int cq_fd = -1;  // the CQ's wait fd (FI_GETWAIT), or -1: then the progress thread polls
  void Close() {   // endpoint first: it is bound to the others
    ep.reset();
    av.reset();
    cq.reset();
    cq_fd = -1;
  }
  void Abandon() {  // never closed, never used again (see ResetEndpointLocked)
    (void)ep.release();
    (void)av.release();
    (void)cq.release();
    cq_fd = -1;
  }
};

class EngineCore : public std::enable_shared_from_this<EngineCore> {
 public:
  ~EngineCore();

  Status Open(SelectedProvider selected, const EngineSettings& settings,
              const EngineOptions& options);
  void StartProgress() {
    progress_ = std::thread([this] { ProgressLoop(); });
  }
  void Stop();

  Result<std::shared_ptr<MemoryRegion>> Register(void* base, size_t length, uint32_t access,
                                                 Sharing sharing, const MemoryLocation& location);
  void Deregister(MemoryRegion* region);
  Result<PeerId> AddPeer(const FabricAddress& address);
  Result<Transfer> Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                         const std::shared_ptr<MemoryRegion>& local_region,
                         const std::vector<RmaSpan>& spans);
  Result<RegisteredRange> RegisterRange(void* base, size_t length, uint32_t access, Sharing sharing,
                                        const MemoryLocation& location);
  Result<Transfer> StartRange(RmaOp op, PeerId peer, const std::vector<RemoteSlice>& remote,
                              const RegisteredRange& local_range, void* local, size_t length);
  void Cancel(TransferState& t, const std::string& why);
  FabricAddress Address() const;
  EngineStats Stats() const;

  ProviderReport report_;
  ProviderProfile profile_;

 private:
  friend class MemoryRegion;
  // endpoint.cc
  Status OpenEndpointLocked(EndpointSet& set);
  // Closes the endpoint set (which ends every connection: no operation posted on it can move a
  // byte afterwards) and opens a new one; every transfer still active is failed and quiesced.
  void ResetEndpointLocked(const std::string& why);
  Status ReconnectLocked(PeerId peer);
  std::string AddressLocked() const;
  // transfer.cc
  void ProgressLoop();
  void PumpLocked(TransferState& t);
  void FailLocked(TransferState& t, Status s);
  void OnCompletionLocked(OpContext* ctx, bool ok, Status error);
  void CheckTimeoutsLocked();
  void ReapLocked();
  // memory.cc
  Result<uint64_t> RemoteKey(const RemoteRegion& remote);
  Status RegisterWithKey(MemoryRegion& region, uint64_t fi_access);

  void Wake();

  std::unique_ptr<struct fi_info, InfoDeleter> info_;
  Fid<struct fid_fabric> fabric_;
  Fid<struct fid_domain> domain_;
  EndpointSet eps_;
  uint64_t endpoint_generation_ = 0;
  size_t abandoned_endpoints_ = 0;
  bool can_reset_ = true;  // false where registrations are bound to the endpoint (FI_MR_ENDPOINT),
                           // or where EngineSettings::reset_undrained_endpoints says so
  bool remote_write_ = false;
  int wake_fd_ = -1;  // eventfd that wakes the progress thread (new work, shutdown)
  size_t chunk_size_ = 0;
  size_t max_inflight_ = 0;
  std::chrono::milliseconds op_timeout_{0};
  std::chrono::milliseconds drain_timeout_{0};
  // Config progress_spin_us: the progress thread polls the CQ this long after the latest post or
  // completion (last_activity_ns_, steady clock) before it blocks; a post while it is blocked
  // (sleeping_) wakes it, so that the wake-up overlaps the operation's flight.
  std::chrono::microseconds spin_{0};
  std::atomic<int64_t> last_activity_ns_{0};
  std::atomic<bool> sleeping_{false};
  static int64_t NowNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void NoteActivity() { last_activity_ns_.store(NowNs()); }
  // Within spin_ of the latest post or completion.
  bool Recent() const {
    return NowNs() < last_activity_ns_.load() +
                         std::chrono::duration_cast<std::chrono::nanoseconds>(spin_).count();
  }

  // Recursive: dropping the last reference to a region (inside a reaped transfer) deregisters it,
  // which takes this lock again on the same thread.
  mutable std::recursive_mutex mu_;
  std::vector<std::shared_ptr<TransferState>> active_;
  // Some post returned FI_EAGAIN: poll instead of blocking. Written under mu_; atomic because
  // the progress thread's polling loop reads it without.
  std::atomic<bool> blocked_{false};
  // PeerId indexes peer_table_; the fi_addr behind it changes when a broken connection is
  // re-established (some providers tear a connection down after any error on it) and after an
  // endpoint reset (then the peer is not in the new address vector until it is used again).
  struct Peer {
    std::string address;
    fi_addr_t fi_addr;
    bool broken;
    uint64_t generation;  // endpoint set whose address vector holds fi_addr
  };
  std::vector<Peer> peer_table_;
  std::map<std::string, PeerId> peers_;
  std::map<std::string, uint64_t> mapped_raw_keys_;
  struct CachedRegion {
    MemoryRegion* raw;
    std::weak_ptr<MemoryRegion> weak;
  };
  std::multimap<uintptr_t, CachedRegion> regions_;

  std::atomic<bool> stop_{false};
  std::thread progress_;

  std::atomic<uint64_t> bytes_read_{0}, bytes_written_{0}, ops_posted_{0}, ops_failed_{0},
      transfers_ok_{0}, transfers_failed_{0}, regions_registered_{0}, resets_{0}, undrained_{0};
};

}  // namespace rayfabric::fabric
