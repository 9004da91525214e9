// The pull side of the agent: a Pull's objects leased from their source agents (PeerCalls), created
// in this node's store (StoreConnections), read over the fabric (NodeFabrics), sealed, or aborted
// and quarantined; the leases are given back through the ReleaseQueue. The gRPC local face
// (local_service.cc) and the pull socket call it through Agent.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "agent.pb.h"
#include "agent/counters.h"
#include "agent/node_fabrics.h"
#include "agent/peer_calls.h"
#include "agent/release_queue.h"
#include "agent/store_connections.h"
#include "agent/store_warmer.h"
#include "rayfabric/object_id.h"
#include "rayfabric/status.h"
#include "rayfabric/worker_pool.h"

namespace rayfabric::agent {

class Puller {
 public:
  struct Options {
    std::string requester;              // this node's id in hex, as the sources know it
    int64_t create_timeout_ms = 10000;  // config create_timeout_ms
    int64_t op_timeout_ms = 30000;      // config op_timeout_ms: a Pull without timeout_ms
    int64_t drain_timeout_ms = 5000;    // config drain_timeout_ms
  };
  Puller(Options options, NodeFabrics& fabrics, StoreConnections& stores, PeerCalls& peers,
         ReleaseQueue& releases, StoreWarmer& warmer, Counters& counters);
  Puller(const Puller&) = delete;
  Puller& operator=(const Puller&) = delete;

  // `deadline`: the caller's own (gRPC) deadline, if earlier than the request's timeout_ms;
  // `cancelled`: true once the caller went away (the pull then stops at its next step and cuts
  // its reads off).
  v1::PullReply Pull(const v1::PullRequest& request, std::chrono::steady_clock::time_point deadline,
                     std::function<bool()> cancelled);
  // The version and item count of a Pull, as every face that serves Pull checks them (gRPC's
  // local socket, the pull socket); counted when refused.
  Status CheckPullRequest(const v1::PullRequest& request);
  // Aborts the quarantined replicas whose reads drained, and the replicas whose create was given
  // up on a full store once the store fulfils it (the agent's sweeper, every 100 ms).
  void Sweep();
  // True while some Pull creates and reads objects (the warmer then waits).
  bool busy();
  // What this node pulled from each source, and over which fabric (GetStatus).
  void LinksInto(v1::StatusReply& out) const;
  // At shutdown: early-answered Pulls still reading are cut short (they stop at their next step)
  // and waited for; later Pulls are refused.
  void StopBackgroundPulls();
  // At shutdown, once the engines are closed (no read can land any more): quarantined replicas
  // are let go (their connection then aborts them).
  void ClearQuarantine();

 private:
  struct PullJob;
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
  // When a Pull's own bound ends: its timeout_ms from now, or op_timeout_ms where it gives none.
  std::chrono::steady_clock::time_point OwnDeadline(const v1::PullRequest& request) const;
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
  void ForgetUnusable(const std::string& source, const std::vector<std::string>& providers);
  // The providers a lease request to `source` offers: this node's, but those tried in this Pull
  // (`excluded`) and, unless `with_unusable`, those that failed with `source` lately (unless that
  // leaves none). `skipped`: those left out for that alone.
  void OfferProviders(v1::LeaseRequest& request, const std::string& source,
                      const std::set<std::string>& excluded, bool with_unusable,
                      std::vector<std::string>& skipped);
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
  // The margin a reader asks for beyond its own deadline, and (at most) how close to its lease's
  // end a read may still start.
  static constexpr std::chrono::seconds kLeaseMargin{2};
  // What this node pulled from `source`, and over which fabric.
  void RecordLink(const std::string& source, const v1::LeaseReply& lease_reply, const Fabric* fab,
                  const std::vector<PullJob*>& jobs);

  const Options options_;
  NodeFabrics& fabrics_;
  StoreConnections& stores_;
  PeerCalls& peers_;
  ReleaseQueue& releases_;
  StoreWarmer& warmer_;
  Counters& counters_;

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

  mutable std::mutex links_mu_;
  std::map<std::string, v1::PeerLink> links_;
  // Per source, providers whose reads failed at the fabric level (unreachable, timed out), until
  // when they are not offered to it (guarded by links_mu_).
  std::map<std::string, std::map<std::string, std::chrono::steady_clock::time_point>> unusable_;

  std::atomic<bool> populate_warned_{false};

  // Per-source work of Pulls with several sources (the first source runs on the Pull's thread).
  WorkerPool source_pool_{8};
  // Early-answered Pulls still reading in the background; waited for at shutdown
  // (stopping_pulls_ cuts them short).
  std::mutex background_mu_;
  std::condition_variable background_cv_;
  int background_pulls_ = 0;
  std::atomic<bool> stopping_pulls_{false};
};

}  // namespace rayfabric::agent
