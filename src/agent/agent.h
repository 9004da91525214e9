// The node agent's logic (rayfabricd): composes this node's plasma store (src/plasma) and the
// fabric engine (src/fabric). It serves leases on local objects to remote readers and pulls
// remote objects into the local store by fi_read. The gRPC faces (peer_service.cc,
// local_service.cc) are thin adapters over these methods. It meets the world at two seams: the
// node's store (LocalStore) and other nodes' agents (PeerCalls).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent.pb.h"
#include "agent/auth.h"
#include "agent/counters.h"
#include "agent/fallback_counts.h"
#include "agent/lease_table.h"
#include "agent/local_store.h"
#include "agent/peer_calls.h"
#include "agent/release_queue.h"
#include "agent/store_warmer.h"
#include "agent/wire.h"
#include "rayfabric/config.h"
#include "rayfabric/fabric.h"
#include "rayfabric/plasma_client.h"
#include "rayfabric/status.h"
#include "rayfabric/worker_pool.h"

namespace rayfabric::agent {

namespace v1 = ::rayfabric::v1;

inline constexpr uint32_t kProtocolVersion = v1::PROTOCOL_V3;
// The most objects (or leases) one request may name.
inline constexpr int kMaxItemsPerRequest = 100000;

// Why a request of `rpc` in protocol `version` is refused ("" when it is this agent's version).
std::string VersionRefusal(uint32_t version, const char* rpc);

struct AgentOptions {
  std::string plasma_socket;
  std::string ray_version;  // ray.__version__ of the cluster: the plasma client checks it
  std::string node_id;      // 28 raw bytes: the Ray node this agent serves
  std::string listen_host;  // the node's IP (the --listen host): fabrics run on its interface
  Config config = Config::FromEnvironment();
  Credentials credentials = Credentials::Insecure();  // for calls to other agents
};

// Where the agent meets the world; each left empty is the real one. A unit test replaces them to
// run agents without Ray, and to inject what a real store or peer cannot be made to do.
struct AgentSeams {
  StoreConnector connect_store;      // empty: the plasma store at AgentOptions::plasma_socket
  std::unique_ptr<PeerCalls> peers;  // null: gRPC, with AgentOptions::credentials
};

class Agent {
 public:
  // Connects to the store (twice: one connection serves leases, one creates replicas, so that
  // a pull waiting for room in a full store never blocks serving) and opens one engine per
  // fabric this node speaks.
  static Result<std::unique_ptr<Agent>> Open(AgentOptions options, AgentSeams seams = {});
  ~Agent();  // unpins everything still leased

  v1::InfoReply Info() const;
  // `requester`: who asks (the peer's host, from the connection), for the per-requester bound.
  v1::LeaseReply Lease(const v1::LeaseRequest& request, const std::string& requester);
  v1::ReleaseReply Release(const v1::ReleaseRequest& request);
  // `deadline`: the caller's own (gRPC) deadline, if earlier than the request's timeout_ms;
  // `cancelled`: true once the caller went away (the pull then stops at its next step and cuts
  // its reads off).
  v1::PullReply Pull(
      const v1::PullRequest& request,
      std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max(),
      std::function<bool()> cancelled = nullptr);
  // The version and item count of a Pull, as every face that serves Pull checks them (gRPC's
  // local socket, the pull socket); counted when refused.
  Status CheckPullRequest(const v1::PullRequest& request);
  v1::StatusReply GetStatus() const;
  // What the processes of this node left to Ray's own transfer (GetStatus reports it).
  void ReportFallbacks(const v1::ReportFallbacksRequest& request);

  // What the service faces count (refusals decided before the agent is called).
  void CountRefusal(Count why) { counters_.Add(why); }

 private:
  struct Registered {
    fabric::RegisteredRange range;  // in slices of at most max_registration
  };
  struct PullJob;
  // A store connection. Whoever uses one keeps it alive for as long as anything of theirs is in
  // flight on it: a broken connection is replaced at once, but closed (and the store aborts its
  // unsealed replicas) only when the last user is done, never while a read may still land.
  using StorePtr = std::shared_ptr<LocalStore>;
  // What a lease exposes (config "exposure"): the whole arena, or the leased object's bytes only
  // through a registration of its own, held in lease_regions_ by lease id until the lease ends.
  enum class Exposure { kArena, kObject };
  static v1::Exposure WireExposure(Exposure exposure) {
    return exposure == Exposure::kObject ? v1::EXPOSURE_OBJECT : v1::EXPOSURE_ARENA;
  }
  // One fabric this node speaks: its engines, one per rail (domain; the first is the provider's
  // own, the others are further NICs large transfers stripe across), what a lease on it exposes,
  // and the store segments registered with each rail (by base; guarded by regions_mu_).
  struct Fabric {
    std::vector<std::unique_ptr<fabric::Engine>> rails;
    Exposure exposure = Exposure::kObject;
    std::vector<std::map<uint8_t*, Registered>> segments;  // per rail
    fabric::Engine& engine() const { return *rails.front(); }
    const std::string& provider() const { return engine().profile().provider; }
  };

  Agent(AgentOptions options, AgentSeams seams, StorePtr serve_store, StorePtr pull_store,
        std::vector<Fabric> fabrics, uint64_t max_lease_bytes_per_peer);

  // The fabric of `provider`, or null if this node does not speak it.
  Fabric* FabricFor(const std::string& provider);
  // "verbs;ofi_rxm/mlx5_0, tcp;ofi_rxm/eth0": what this node speaks, for errors.
  std::string FabricList() const;

  // The current connection for serving (leases) / pulling (replicas); a broken one is replaced
  // first. The serve store's generation numbers its connections: a lease pinned on an older
  // (retired) one is unpinned when that connection closes.
  StorePtr ServeStore(uint64_t* generation = nullptr);
  StorePtr PullStore();
  Result<StorePtr> ConnectStore();
  void WatchSegments(LocalStore& store);  // unmapped segments drop their registration

  // The registration of `fab`'s rail `rail` covering a mapped store segment (registered once, in
  // slices; dropped on unmap).
  Result<fabric::RegisteredRange> RegionFor(Fabric& fab, size_t rail, uint8_t* segment_base,
                                            size_t segment_size);
  void OnSegmentMapped(const plasma::SegmentInfo& segment);  // kept warm (warmer_)
  void OnSegmentUnmapped(const plasma::SegmentInfo& segment);
  // `rails`: on how many of `fab`'s rails a large object is described (as many as both have).
  void LeaseBatch(Fabric& fab, size_t rails, v1::LeaseReply& reply, const std::vector<int>& indices,
                  const std::vector<ObjectId>& ids, std::chrono::milliseconds ttl,
                  const std::string& requester);
  void GrantLease(Fabric& fab, size_t rails, v1::Lease& lease, const ObjectId& id,
                  const plasma::ObjectBuffer& obj, std::chrono::milliseconds ttl,
                  const std::string& requester, LocalStore& store, uint64_t generation);
  // Unpins a leased object, on the connection it was pinned on if that one still lives.
  void Unpin(const LeasedObject& object);
  // Lease's work, timed by Lease (the reply says how long the source took: LeaseReply.served_s).
  v1::LeaseReply LeaseAll(const v1::LeaseRequest& request, const std::string& requester);
  void RefuseLease(v1::Lease& lease, const Status& why);
  // An early-answered Pull's view of its items (answer_when_claimed): which are settled (claimed
  // here, or finished) and a copy of each one's result for the early reply.
  class ClaimWatch;
  // Nanoseconds one Pull spent per step, summed over its concurrently pulled sources.
  struct PullPhaseTimes {
    std::atomic<int64_t> lease{0}, lease_served{0}, create{0}, prepare{0}, post{0}, wait{0},
        seal{0};
    std::atomic<uint32_t> waves{0};
    // Adds the time since `since` to `step`; returns now (the start of the next step).
    static std::chrono::steady_clock::time_point Lap(std::atomic<int64_t>& step,
                                                     std::chrono::steady_clock::time_point since);
    void Into(v1::PullPhases& out) const;
  };
  // What bounds one Pull: its deadline, and whether its caller went away.
  struct PullBounds {
    std::chrono::steady_clock::time_point deadline;
    std::function<bool()> cancelled;  // may be empty
    ClaimWatch* claims = nullptr;     // set for an early-answered Pull
    PullPhaseTimes* phases = nullptr;
    // Asks `cancelled` at most every kCancelCheckEvery (gRPC's IsCancelled polls the call's
    // completion queue: tens of microseconds, once per object of a 10,000-object Pull before);
    // once cancelled, always.
    bool Cancelled() const;
    mutable std::atomic<bool> seen_cancelled{false};
    mutable std::atomic<int64_t> next_check_ns{0};
  };
  v1::PullReply RunPull(const v1::PullRequest& request,
                        std::chrono::steady_clock::time_point deadline,
                        std::function<bool()> cancelled, ClaimWatch* claims);
  // Reports to an early-answered Pull the jobs that are settled: created here, or finished.
  void Settle(const PullBounds& bounds, const std::vector<PullJob*>& jobs);
  // Pulls `jobs` from one source: leases them, reaches the source on the fabric it answered on,
  // reads them in waves, releases the leases. Objects whose reads failed on the fabric are pulled
  // again over the next provider both nodes share, if any (and that provider is skipped with this
  // source for kUnusableFor); objects the source refused for want of room for this node while
  // leases of this node's there were being given back are asked again once they are (once per
  // Pull). Each such try is an attempt, made in turn.
  void PullFromSource(const std::string& source, std::vector<PullJob*>& jobs,
                      const PullBounds& bounds);
  struct SourceAttempt {
    std::vector<PullJob*> jobs;
    std::set<std::string> excluded;  // providers not to offer (they failed in this Pull)
    bool room_retried = false;       // a refusal for room was asked again already
    bool after_releases = false;     // asked again for room: once this node's leases are back
  };
  // The lease step of an attempt: the source's reply, and when it was asked.
  struct SourceLease {
    Status status;
    v1::LeaseReply reply;
    std::chrono::steady_clock::time_point asked_at;
    bool releases_pending = false;  // this node's leases there were on their way back
  };
  // The source as a fabric peer, on the fabric it answered on, and on its further rails.
  struct SourcePeer {
    Status status;
    Fabric* fab = nullptr;
    fabric::PeerId peer = 0;
    std::vector<fabric::PeerId> rail_peers;  // rails 2, 3, ...
  };
  // One attempt, start to end; the attempts it leads to go onto `to_try`.
  void AttemptFromSource(const std::string& source, const SourceAttempt& attempt,
                         const PullBounds& bounds, PullPhaseTimes& phases,
                         std::vector<SourceAttempt>& to_try);
  SourceLease LeaseFromSource(const std::string& source, const SourceAttempt& attempt,
                              const PullBounds& bounds, PullPhaseTimes& phases);
  SourcePeer ConnectToSource(const std::string& source, const v1::LeaseReply& reply);
  // Takes `lease` (or its refusal) for `job`; true when it was refused for want of room and may
  // be asked again (`room_may_come`).
  bool AcceptLease(const std::string& source, PullJob& job, const v1::Lease& lease,
                   const SourcePeer& to, std::chrono::steady_clock::time_point asked_at,
                   bool room_may_come, LocalStore& store);
  // The reads that failed on `fab` (the attempt's fabric), to try over the next provider.
  std::optional<SourceAttempt> FailoverAttempt(const std::string& source,
                                               const SourceAttempt& attempt, const Fabric* fab);
  // Waits for this node's releases to `source`; false (each job keeping its refusal, settled)
  // when the Pull has no time for another attempt.
  bool ReadyToAskAgainForRoom(const std::string& source, const std::vector<PullJob*>& jobs,
                              const PullBounds& bounds);
  static bool TimeLeft(const PullBounds& bounds);
  static void ResetForAnotherAttempt(PullJob& job);
  // One source's side of a Pull, once leased: what StartReads and FinishReads share.
  struct SourceReads {
    const std::string& source;
    Fabric* fab;
    fabric::PeerId peer;
    const std::vector<fabric::PeerId>& rail_peers;
    StorePtr store;
    const PullBounds& bounds;
    PullPhaseTimes& phases;
  };
  // The jobs' reads in waves; `settled` are reported claimed to an early-answered Pull.
  void RunWaves(const SourceReads& reads, const std::vector<PullJob*>& jobs,
                const std::vector<PullJob*>& settled);
  // Whether `job`'s lease ends too soon to start its read; if so, its result says so.
  bool RefusedForLeaseEnd(PullJob& job, const std::string& source);
  // Creates the group's replicas (one store round trip) and starts each one's read; the started
  // jobs join `wave`. What fails is settled on its job.
  void StartReads(const SourceReads& reads, const std::vector<PullJob*>& group,
                  std::vector<PullJob*>& wave, uint64_t& wave_bytes);
  // Waits for each read of the wave; seals (and releases) the replicas read in full within their
  // leases, in groups; ends the others (EndFailedReplica).
  void FinishReads(const SourceReads& reads, const std::vector<PullJob*>& wave);
  // Providers whose reads from `source` failed lately (skipped until the time noted).
  std::set<std::string> UnusableWith(const std::string& source);
  void MarkUnusable(const std::string& source, const std::string& provider, const Status& why);
  // Ends a replica whose read did not succeed: aborted once nothing of the read can land any
  // more; if the engine could not drain it, kept unsealed (out of the store's reuse) until it
  // has, then aborted by the sweeper.
  void EndFailedReplica(PullJob& job, const StorePtr& store);
  void SweepQuarantine();
  void ReapAbandonedCreates();
  // Pulls `pending`, each object once: one already being pulled by a concurrent Pull is waited
  // for (the replica can be created only once), then found local, or pulled here if that failed.
  void PullOnce(std::vector<PullJob*> pending, const PullBounds& bounds);
  // ALREADY_LOCAL when the object is sealed in this node's store (asked only when a pull cannot
  // go on: a lease refused or a Create that found the object).
  bool AnsweredLocal(PullJob& job, LocalStore& store);
  void SweepLoop();
  // The margin a reader asks for beyond its own deadline, and (at most) how close to its lease's
  // end a read may still start.
  static constexpr std::chrono::seconds kLeaseMargin{2};

  AgentOptions options_;
  StoreConnector connect_store_;
  std::unique_ptr<PeerCalls> peers_;
  // This node's leases given back to their sources (off the Pulls' critical path); made once the
  // agent is, stopped by ~Agent before what the releases' calls use goes.
  std::unique_ptr<ReleaseQueue> releases_;
  std::mutex stores_mu_;
  StorePtr serve_store_;
  StorePtr pull_store_;
  uint64_t serve_generation_ = 1;
  // Broken serving connections kept open while leases granted on them (their pins) remain.
  std::vector<std::pair<uint64_t, StorePtr>> retired_serve_;
  void SweepRetiredStores();
  // Best first; a pair of nodes uses the best fabric both speak (the source picks, from the
  // reader's list). Fixed after Open.
  std::vector<Fabric> fabrics_;
  LeaseTable leases_;
  std::mutex lease_regions_mu_;
  std::map<uint64_t, std::vector<fabric::RegisteredRange>> lease_regions_;  // one per rail
  void DropLeaseRegion(uint64_t lease_id);

  uint64_t stripe_min_ = 0;  // config stripe_min: the least bytes one rail moves of a transfer
  std::chrono::milliseconds default_ttl_;
  std::chrono::milliseconds max_ttl_;
  int64_t create_timeout_ms_ = 10000;
  int64_t op_timeout_ms_ = 30000;
  int64_t drain_timeout_ms_ = 5000;

  struct Quarantined {
    ObjectId id;
    fabric::Transfer transfer;
    StorePtr store;  // the connection that created the replica (kept open until it drains)
  };
  std::mutex quarantine_mu_;
  std::vector<Quarantined> quarantine_;

  std::mutex in_flight_mu_;
  std::condition_variable in_flight_cv_;
  std::set<ObjectId> in_flight_;  // objects some Pull is creating and reading right now

  std::mutex regions_mu_;  // guards every Fabric::segments

  // What this agent pulled from each source agent, and over which fabric (GetStatus).
  void RecordLink(const std::string& source, const v1::LeaseReply& lease_reply, const Fabric* fab,
                  const std::vector<PullJob*>& jobs);
  mutable std::mutex links_mu_;
  std::map<std::string, v1::PeerLink> links_;
  // Per source, providers whose reads failed at the fabric level (unreachable, timed out), until
  // when they are not offered to it (guarded by links_mu_).
  std::map<std::string, std::map<std::string, std::chrono::steady_clock::time_point>> unusable_;

  Counters counters_;
  FallbackCounts fallbacks_;
  std::atomic<bool> populate_warned_{false};
  // When this agent started serving: `rayfabric status` reports rates since then.
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();

  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stopping_ = false;
  std::thread sweeper_;

  // Per-source work of Pulls with several sources (the first source runs on the Pull's thread).
  WorkerPool source_pool_{8};
  // Early-answered Pulls still reading in the background; the agent waits for them at exit
  // (stopping_pulls_ cuts them short).
  std::mutex background_mu_;
  std::condition_variable background_cv_;
  int background_pulls_ = 0;
  std::atomic<bool> stopping_pulls_{false};
  // This process's mapping of the store, kept warm (config warm_store); stopped in ~Agent once
  // the store connections (whose unmaps it hears of) are gone.
  std::unique_ptr<StoreWarmer> warmer_;
};

}  // namespace rayfabric::agent
