#include "agent/puller.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "agent/wire.h"
#include "rayfabric/hex.h"
#include "rayfabric/log.h"
#include "rayfabric/memory.h"
#include "rayfabric/object_id.h"

// The pull side: a Pull's objects leased from their source agents, created here, read over the
// fabric, sealed (or aborted and quarantined); the leases are given back through the ReleaseQueue
// (release_queue.h).
namespace rayfabric::agent {
namespace {

using Clock = std::chrono::steady_clock;

// Objects created locally and read at once are bounded per wave, so that a large pull does not
// fill the local store with unsealed replicas before any of them is sealed.
constexpr size_t kWaveObjects = 512;
constexpr uint64_t kWaveBytes = 1ULL << 30;
// Replicas created (and later sealed) with one store round trip: the reads of one group start
// while the next group is created.
constexpr size_t kCreateGroup = 64;
// A replica's pages mapped before its read is posted (PopulateForWrite); the rest while it runs.
constexpr uint64_t kPopulateAhead = 8ULL << 20;
constexpr uint64_t kPopulateStep = 64ULL << 20;

std::string ShortHex(const std::string& binary) { return BytesToHex(binary).substr(0, 16); }

void SetError(v1::PullResult& r, const Status& s) {
  r.set_outcome(v1::FAILED);
  r.set_error_code(ToErrorCode(s.code()));
  r.set_error(s.message());
}

// How often a pull looks whether its caller went away.
constexpr auto kCancelPoll = std::chrono::milliseconds(100);
// How often a Pull asks whether its caller went away, at most (PullBounds::Cancelled).
constexpr auto kCancelCheckEvery = std::chrono::milliseconds(5);
// Early-answered Pulls (answer_when_claimed) reading in the background at once, at most.
constexpr int kMaxBackgroundPulls = 64;
// An early answer leaves the caller's deadline this much time to travel.
constexpr auto kReplyMargin = std::chrono::milliseconds(250);
// A provider whose reads from a source all failed is not offered to that source for this long.
constexpr auto kUnusableFor = std::chrono::seconds(60);

// Where a lease says the object's bytes lie, checked to add up to exactly `size` bytes (a source
// that describes more or less is refused: never a replica of its choosing).
Status ParseSlices(const v1::Lease& lease, uint64_t size, std::vector<fabric::RemoteSlice>& out) {
  out.clear();
  if (lease.slices_size() == 0) {  // a source that predates slices: one region holds it all
    RF_ASSIGN_OR_RETURN(fabric::RemoteRegion region, fabric::RemoteRegion::Parse(lease.region()));
    out.push_back({region, lease.offset(), size});
    return Status::OK();
  }
  uint64_t total = 0;
  for (const v1::LeaseSlice& slice : lease.slices()) {
    RF_ASSIGN_OR_RETURN(fabric::RemoteRegion region, fabric::RemoteRegion::Parse(slice.region()));
    if (slice.length() == 0 || slice.length() > size - std::min(total, size)) {
      return OutOfRange("its slices describe more than the object's " + std::to_string(size) +
                        " bytes: refused");
    }
    total += slice.length();
    out.push_back({region, slice.offset(), slice.length()});
  }
  if (total != size) {
    return OutOfRange("its slices describe " + std::to_string(total) + " of the object's " +
                      std::to_string(size) + " bytes: refused");
  }
  return Status::OK();
}

}  // namespace

// One object of a Pull: its request, its result, and what it holds while in flight.
struct Puller::PullJob {
  size_t index = 0;  // in the Pull's items
  const v1::PullItem* item = nullptr;
  v1::PullResult* result = nullptr;
  ObjectId id;
  v1::Lease lease;
  bool leased = false;
  bool created = false;
  plasma::ObjectBuffer replica;
  std::vector<fabric::RemoteSlice> remote;  // where the leased bytes lie at the source, in order
  // The same bytes on the source's further rails (2, 3, ...) this node can pair with.
  std::vector<std::vector<fabric::RemoteSlice>> rail_remote;
  fabric::Transfer transfer;
  size_t rails_used = 0;       // rails its read striped across
  bool fabric_failed = false;  // its read failed on the fabric (to try over another provider)
  Clock::time_point started;
  Clock::time_point lease_expires;  // by our clock, counted from before the lease was asked
};

Puller::Puller(Options options, NodeFabrics& fabrics, StoreConnections& stores, PeerCalls& peers,
               ReleaseQueue& releases, StoreWarmer& warmer, Counters& counters)
    : options_(std::move(options)),
      fabrics_(fabrics),
      stores_(stores),
      peers_(peers),
      releases_(releases),
      warmer_(warmer),
      counters_(counters) {}

void Puller::Sweep() {
  SweepQuarantine();
  ReapAbandonedCreates();
}

bool Puller::busy() {
  std::lock_guard<std::mutex> lock(in_flight_mu_);
  return !in_flight_.empty();
}

void Puller::LinksInto(v1::StatusReply& out) const {
  std::lock_guard<std::mutex> lock(links_mu_);
  for (const auto& [source, link] : links_) *out.add_peer_links() = link;
}

void Puller::StopBackgroundPulls() {
  std::unique_lock<std::mutex> lock(background_mu_);
  stopping_pulls_ = true;
  background_cv_.wait(lock, [this] { return background_pulls_ == 0; });
}

void Puller::ClearQuarantine() {
  std::lock_guard<std::mutex> lock(quarantine_mu_);
  quarantine_.clear();
}

void Puller::ReapAbandonedCreates() {
  StorePtr store = stores_.Pull();
  if (store->abandoned_creates() == 0) return;
  auto aborted = store->ReapAbandonedCreates();
  if (aborted.ok() && *aborted > 0) {
    counters_.Add(Count::kAbandonedCreatesAborted, *aborted);
    RF_LOG(kInfo, *aborted << " replica(s) whose create was given up while the store was full "
                              "were created since, and aborted");
  }
}

void Puller::SweepQuarantine() {
  std::vector<Quarantined> drained;
  {
    std::lock_guard<std::mutex> lock(quarantine_mu_);
    for (auto it = quarantine_.begin(); it != quarantine_.end();) {
      if (it->transfer.Quiesced()) {
        drained.push_back(std::move(*it));
        it = quarantine_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Quarantined& q : drained) {
    RF_LOG(kInfo, "replica of object " << q.id.Hex() << ": its failed read has drained; aborted");
    (void)q.store->Abort(q.id);
  }
}

void Puller::EndFailedReplica(PullJob& job, const StorePtr& store) {
  // Nothing of a failed read may land in memory the store reuses: the engine reports a failed
  // transfer only once its operations are drained (or its endpoint was reset). Where it could do
  // neither, the replica stays created and unsealed, which keeps the store from reusing it.
  if (!job.transfer.Done()) {
    job.transfer.Cancel("the pull gave up on it");
    (void)job.transfer.Wait(std::chrono::milliseconds(options_.drain_timeout_ms + 5000));
  }
  if (job.transfer.Quiesced()) {
    (void)store->Abort(job.id);
  } else {
    counters_.Add(Count::kReplicasQuarantined);
    RF_LOG(kWarn, "replica of object " << job.id.Hex()
                                       << " kept unsealed: its failed read still has operations "
                                          "outstanding (aborted once they drain)");
    std::lock_guard<std::mutex> lock(quarantine_mu_);
    quarantine_.push_back({job.id, job.transfer, store});
  }
  job.created = false;
}

class Puller::ClaimWatch {
 public:
  explicit ClaimWatch(size_t n) : results_(n), settled_(n, false) {}

  void Settle(size_t index, const v1::PullResult& result, bool claimed) {
    std::lock_guard<std::mutex> lock(mu_);
    results_[index] = result;
    if (claimed) results_[index].set_outcome(v1::CLAIMED);
    if (!settled_[index]) {
      settled_[index] = true;
      ++count_;
    }
    cv_.notify_all();
  }
  void Finish() {
    std::lock_guard<std::mutex> lock(mu_);
    finished_ = true;
    cv_.notify_all();
  }
  // What is known when every item is settled, the pull ended, `deadline` passed, or the caller
  // went away.
  v1::PullReply Wait(Clock::time_point deadline, const std::function<bool()>& cancelled) {
    std::unique_lock<std::mutex> lock(mu_);
    auto settled = [&] { return finished_ || count_ == results_.size(); };
    while (!settled() && Clock::now() < deadline && !(cancelled && cancelled())) {
      cv_.wait_until(lock, std::min(deadline, Clock::now() + kCancelPoll), settled);
    }
    v1::PullReply reply;
    for (size_t i = 0; i < results_.size(); ++i) {
      v1::PullResult* r = reply.add_results();
      *r = results_[i];
      if (!settled_[i]) {
        SetError(*r, TimedOut("not claimed by the caller's deadline; the pull goes on"));
      }
    }
    return reply;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<v1::PullResult> results_;
  std::vector<bool> settled_;
  size_t count_ = 0;
  bool finished_ = false;
};

void Puller::Settle(const PullBounds& bounds, const std::vector<PullJob*>& jobs) {
  if (bounds.claims == nullptr) return;
  for (const PullJob* job : jobs) {
    if (job->created) {
      bounds.claims->Settle(job->index, *job->result, true);
    } else if (job->result->outcome() != v1::PULL_OUTCOME_UNSPECIFIED) {
      bounds.claims->Settle(job->index, *job->result, false);
    }
  }
}

Status Puller::CheckPullRequest(const v1::PullRequest& request) {
  std::string refusal = VersionRefusal(request.protocol_version(), "Pull");
  if (!refusal.empty()) {
    counters_.Add(Count::kRequestsRejected);
    return Status(StatusCode::kVersionMismatch, refusal);
  }
  if (request.items_size() == 0 || request.items_size() > kMaxItemsPerRequest) {
    counters_.Add(Count::kRequestsRejected);
    return InvalidArgument("Pull needs 1.." + std::to_string(kMaxItemsPerRequest) + " items, got " +
                           std::to_string(request.items_size()));
  }
  return Status::OK();
}

namespace {

// A lease reply that refused every object before choosing a fabric: the source speaks none of the
// providers the request offered (LeaseServer: "no fabric in common").
bool NoFabricInCommon(const v1::LeaseReply& reply) {
  return reply.provider().empty() && reply.leases_size() > 0 &&
         std::all_of(reply.leases().begin(), reply.leases().end(), [](const v1::Lease& lease) {
           return lease.error_code() != v1::ERROR_CODE_NONE;
         });
}

}  // namespace

Clock::time_point Puller::OwnDeadline(const v1::PullRequest& request) const {
  const int64_t bound = request.timeout_ms() > 0 ? request.timeout_ms() : options_.op_timeout_ms;
  return Clock::now() + std::chrono::milliseconds(bound);
}

v1::PullReply Puller::Pull(const v1::PullRequest& request, Clock::time_point caller_deadline,
                           std::function<bool()> cancelled) {
  if (!request.answer_when_claimed()) {
    return RunPull(request, caller_deadline, std::move(cancelled), nullptr);
  }
  // Answered once every object is claimed; the reads go on here, bounded by the request's own
  // timeout (not by the caller, who has its answer by then), and are cut short at exit.
  const auto deadline = OwnDeadline(request);
  auto copy = std::make_shared<v1::PullRequest>(request);
  auto watch = std::make_shared<ClaimWatch>(static_cast<size_t>(request.items_size()));
  {
    std::lock_guard<std::mutex> lock(background_mu_);
    if (stopping_pulls_) {
      v1::PullReply reply;
      for (const v1::PullItem& item : request.items()) {
        v1::PullResult* r = reply.add_results();
        r->set_object_id(item.object_id());
        SetError(*r, Aborted("the agent is stopping"));
      }
      return reply;
    }
    if (background_pulls_ >= kMaxBackgroundPulls) {
      // Bounded like the gRPC handler threads it stands in for: past the bound, answered when
      // done.
      return RunPull(request, caller_deadline, std::move(cancelled), nullptr);
    }
    ++background_pulls_;
  }
  auto ended = [this] {
    std::lock_guard<std::mutex> lock(background_mu_);
    --background_pulls_;
    background_cv_.notify_all();
  };
  try {
    std::thread([this, copy, watch, deadline, ended] {
      (void)RunPull(
          *copy, deadline, [this] { return stopping_pulls_.load(); }, watch.get());
      watch->Finish();
      ended();
    }).detach();
  } catch (const std::system_error& e) {
    ended();
    RF_LOG(kWarn, "no thread for an early-answered pull (" << e.what() << "): answered when done");
    return RunPull(request, caller_deadline, std::move(cancelled), nullptr);
  }
  // Answered a moment before the caller's own deadline, so that the answer reaches it.
  const auto answer_by = caller_deadline - deadline > kReplyMargin
                             ? deadline
                             : std::min(deadline, caller_deadline - kReplyMargin);
  v1::PullReply reply = watch->Wait(answer_by, cancelled);
  reply.set_provider(fabrics_.best().provider());
  return reply;
}

v1::PullReply Puller::RunPull(const v1::PullRequest& request, Clock::time_point caller_deadline,
                              std::function<bool()> cancelled, ClaimWatch* claims) {
  const Clock::time_point began = Clock::now();
  v1::PullReply reply;
  // The best fabric; each result says which one its read used.
  reply.set_provider(fabrics_.best().provider());
  const auto deadline = std::min(caller_deadline, OwnDeadline(request));
  std::vector<PullJob> jobs(static_cast<size_t>(request.items_size()));
  std::vector<PullJob*> pending;
  for (int i = 0; i < request.items_size(); ++i) {
    PullJob& job = jobs[static_cast<size_t>(i)];
    job.index = static_cast<size_t>(i);
    job.item = &request.items(i);
    job.result = reply.add_results();
    job.result->set_object_id(job.item->object_id());
    auto id = ObjectId::FromBinary(job.item->object_id());
    if (!id.ok()) {
      SetError(*job.result, id.status());
      continue;
    }
    job.id = *id;
    if (job.item->source_agent().empty()) {
      SetError(*job.result,
               InvalidArgument("pull of object " + id->Hex() + ": no source_agent given"));
      continue;
    }
    if (job.item->object_size() == 0) {
      SetError(*job.result, InvalidArgument("pull of object " + id->Hex() +
                                            ": no object_size (data + metadata bytes, from "
                                            "Ray's object directory) given"));
      continue;
    }
    // Not asked of the store first: callers send what is not local, and Create answers
    // AlreadyExists for what is (one store round trip per object saved).
    pending.push_back(&job);
  }
  PullPhaseTimes phases;
  PullOnce(std::move(pending), PullBounds{deadline, std::move(cancelled), claims, &phases});
  phases.Into(*reply.mutable_phases());
  reply.mutable_phases()->set_total_s(std::chrono::duration<double>(Clock::now() - began).count());
  if (claims != nullptr) {
    std::vector<PullJob*> all;
    for (PullJob& job : jobs) all.push_back(&job);
    Settle(PullBounds{deadline, nullptr, claims}, all);
  }
  for (const PullJob& job : jobs) {
    if (job.result->outcome() == v1::FAILED) {
      counters_.Add(Count::kPullsFailed);
      RF_LOG(kWarn, "pull of object " << ShortHex(job.item->object_id())
                                      << " failed: " << v1::ErrorCode_Name(job.result->error_code())
                                      << ": " << job.result->error());
    }
  }
  return reply;
}

bool Puller::PullBounds::Cancelled() const {
  if (!cancelled) return false;
  if (seen_cancelled.load(std::memory_order_relaxed)) return true;
  const int64_t now =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  int64_t due = next_check_ns.load(std::memory_order_relaxed);
  if (now < due || !next_check_ns.compare_exchange_strong(
                       due, now + std::chrono::nanoseconds(kCancelCheckEvery).count())) {
    return false;  // asked lately (or by another thread just now)
  }
  if (!cancelled()) return false;
  seen_cancelled = true;
  return true;
}

Clock::time_point Puller::PullPhaseTimes::Lap(std::atomic<int64_t>& step, Clock::time_point since) {
  const Clock::time_point now = Clock::now();
  step += std::chrono::duration_cast<std::chrono::nanoseconds>(now - since).count();
  return now;
}

void Puller::PullPhaseTimes::Into(v1::PullPhases& out) const {
  constexpr double kNs = 1e-9;
  out.set_lease_s(static_cast<double>(lease.load()) * kNs);
  out.set_lease_served_s(static_cast<double>(lease_served.load()) * kNs);
  out.set_create_s(static_cast<double>(create.load()) * kNs);
  out.set_prepare_s(static_cast<double>(prepare.load()) * kNs);
  out.set_post_s(static_cast<double>(post.load()) * kNs);
  out.set_wait_s(static_cast<double>(wait.load()) * kNs);
  out.set_seal_s(static_cast<double>(seal.load()) * kNs);
  out.set_waves(waves.load());
}

bool Puller::AnsweredLocal(PullJob& job, LocalStore& store) {
  auto local = store.Contains(job.id);
  if (!local.ok() || !*local) return false;
  job.result->set_outcome(v1::ALREADY_LOCAL);
  counters_.Add(Count::kPullsAlreadyLocal);
  return true;
}

void Puller::PullOnce(std::vector<PullJob*> pending, const PullBounds& bounds) {
  const Clock::time_point deadline = bounds.deadline;
  while (!pending.empty()) {
    std::map<std::string, std::vector<PullJob*>> by_source;
    std::vector<PullJob*> waiting;
    {
      std::lock_guard<std::mutex> lock(in_flight_mu_);
      for (PullJob* job : pending) {
        if (in_flight_.insert(job->id).second) {
          by_source[job->item->source_agent()].push_back(job);
        } else {
          waiting.push_back(job);
        }
      }
    }
    pending.clear();
    // Being created by another Pull of this agent: claimed already.
    if (bounds.claims != nullptr) {
      for (PullJob* job : waiting) bounds.claims->Settle(job->index, *job->result, true);
    }
    // Sources are pulled concurrently (fan-in): each has its own lease and reads; the store
    // connection and the engine serialize what must be. The others run on the agent's bounded
    // pool, the first on this thread.
    WorkerPool::Group others;
    for (auto it = by_source.begin(); it != by_source.end(); ++it) {
      if (it == by_source.begin()) continue;
      others.Add();
      source_pool_.Submit([this, it, &bounds, &others] {
        PullFromSource(it->first, it->second, bounds);
        others.Done();
      });
    }
    if (!by_source.empty()) {
      PullFromSource(by_source.begin()->first, by_source.begin()->second, bounds);
    }
    others.Wait();
    {
      std::lock_guard<std::mutex> lock(in_flight_mu_);
      for (auto& [source, group] : by_source) {
        for (PullJob* job : group) in_flight_.erase(job->id);
      }
    }
    in_flight_cv_.notify_all();
    if (waiting.empty()) return;

    std::vector<bool> still_in_flight(waiting.size());
    {
      std::unique_lock<std::mutex> lock(in_flight_mu_);
      auto none_in_flight = [&] {
        return std::none_of(waiting.begin(), waiting.end(),
                            [&](PullJob* job) { return in_flight_.count(job->id) > 0; });
      };
      // In steps, so that a caller that went away is noticed.
      while (!none_in_flight() && Clock::now() < deadline && !bounds.Cancelled()) {
        in_flight_cv_.wait_until(lock, std::min(deadline, Clock::now() + kCancelPoll),
                                 none_in_flight);
      }
      for (size_t i = 0; i < waiting.size(); ++i) {
        still_in_flight[i] = in_flight_.count(waiting[i]->id) > 0;
      }
    }
    for (size_t i = 0; i < waiting.size(); ++i) {
      PullJob* job = waiting[i];
      if (still_in_flight[i]) {
        // Still arriving by another pull at our deadline: Ray's get waits for that replica.
        job->result->set_outcome(v1::STOOD_ASIDE);
        counters_.Add(Count::kPullsStoodAside);
        continue;
      }
      if (AnsweredLocal(*job, *stores_.Pull())) continue;
      if (Clock::now() < deadline) {
        pending.push_back(job);  // the other pull failed: try ourselves
      } else {
        SetError(*job->result, TimedOut("object " + job->id.Hex() +
                                        " was being pulled by another request that failed, "
                                        "and this pull's deadline has passed"));
      }
    }
  }
}

std::set<std::string> Puller::UnusableWith(const std::string& source) {
  std::set<std::string> out;
  std::lock_guard<std::mutex> lock(links_mu_);
  auto it = unusable_.find(source);
  if (it == unusable_.end()) return out;
  const Clock::time_point now = Clock::now();
  for (auto p = it->second.begin(); p != it->second.end();) {
    if (p->second <= now) {
      p = it->second.erase(p);
    } else {
      out.insert(p->first);
      ++p;
    }
  }
  return out;
}

void Puller::MarkUnusable(const std::string& source, const std::string& provider,
                          const Status& why) {
  // What later pulls from that source really do: this node's other providers are offered first
  // (which of them the source speaks is its answer's to say), or, where there is none, the same.
  std::string others;
  for (const Fabric& fab : fabrics_.all()) {
    if (fab.provider() != provider) others += (others.empty() ? "" : ", ") + fab.provider();
  }
  const std::string then =
      others.empty()
          ? provider + " is this node's only provider: later pulls from that agent go on using it"
          : "for " +
                std::to_string(
                    std::chrono::duration_cast<std::chrono::seconds>(kUnusableFor).count()) +
                " s later pulls from that agent offer " + others + " first (" + provider +
                " again where the agent shares none of them)";
  RF_LOG(kWarn, "reads from the agent at " << source << " over " << provider << " failed ("
                                           << why.message().substr(0, 200) << "): " << then);
  std::lock_guard<std::mutex> lock(links_mu_);
  unusable_[source][provider] = Clock::now() + kUnusableFor;
}

void Puller::ForgetUnusable(const std::string& source, const std::vector<std::string>& providers) {
  std::lock_guard<std::mutex> lock(links_mu_);
  auto it = unusable_.find(source);
  if (it == unusable_.end()) return;
  for (const std::string& provider : providers) it->second.erase(provider);
}

void Puller::OfferProviders(v1::LeaseRequest& request, const std::string& source,
                            const std::set<std::string>& excluded, bool with_unusable,
                            std::vector<std::string>& skipped) {
  skipped.clear();
  const std::set<std::string> unusable =
      with_unusable ? std::set<std::string>{} : UnusableWith(source);
  // (Unless that leaves none: the failure may have passed.)
  const bool all_unusable =
      std::all_of(fabrics_.all().begin(), fabrics_.all().end(), [&](const Fabric& fab) {
        return excluded.count(fab.provider()) > 0 || unusable.count(fab.provider()) > 0;
      });
  for (const Fabric& fab : fabrics_.all()) {
    if (excluded.count(fab.provider()) > 0) continue;
    if (!all_unusable && unusable.count(fab.provider()) > 0) {
      skipped.push_back(fab.provider());
      continue;
    }
    request.add_reader_providers(fab.provider());
    request.add_reader_rails(static_cast<uint32_t>(fab.rails.size()));
  }
}

void Puller::PullFromSource(const std::string& source, std::vector<PullJob*>& jobs,
                            const PullBounds& bounds) {
  PullPhaseTimes scratch;  // a Pull without a caller that reads them
  PullPhaseTimes& phases = bounds.phases != nullptr ? *bounds.phases : scratch;
  // Depth first, as the attempts were made: a failover's own further attempts go before the
  // room retry of the attempt that failed over.
  std::vector<SourceAttempt> to_try;
  to_try.push_back({jobs, {}, false, false});
  while (!to_try.empty()) {
    SourceAttempt attempt = std::move(to_try.back());
    to_try.pop_back();
    if (attempt.after_releases && !ReadyToAskAgainForRoom(source, attempt.jobs, bounds)) continue;
    AttemptFromSource(source, attempt, bounds, phases, to_try);
  }
}

bool Puller::ReadyToAskAgainForRoom(const std::string& source, const std::vector<PullJob*>& jobs,
                                    const PullBounds& bounds) {
  // Each keeps its refusal unless it is asked again.
  // Those on their way now, until a lease could still be asked and read within the Pull's deadline.
  const Clock::time_point until =
      std::min(bounds.deadline - kLeaseMargin, Clock::now() + kPeerRpcTimeout);
  if (!TimeLeft(bounds) ||
      !releases_.WaitForReleasesTo(source, until, [&bounds] { return bounds.Cancelled(); }) ||
      !TimeLeft(bounds)) {
    Settle(bounds, jobs);
    return false;
  }
  for (PullJob* job : jobs) ResetForAnotherAttempt(*job);
  counters_.Add(Count::kPullsAskedAgainForRoom);
  RF_LOG(kInfo, jobs.size() << " object(s) refused by " << source
                            << " for want of room: asked again, this node's leases there given "
                               "back");
  return true;
}

bool Puller::TimeLeft(const PullBounds& bounds) {
  return !bounds.Cancelled() && Clock::now() + kLeaseMargin <= bounds.deadline;
}

void Puller::ResetForAnotherAttempt(PullJob& job) {
  const std::string object_id = job.result->object_id();
  job.result->Clear();
  job.result->set_object_id(object_id);
  job.lease.Clear();
  job.leased = false;
  job.remote.clear();
  job.rail_remote.clear();
  job.transfer = fabric::Transfer();
  job.rails_used = 0;
  job.fabric_failed = false;
}

Puller::SourceLease Puller::LeaseFromSource(const std::string& source, const SourceAttempt& attempt,
                                            const PullBounds& bounds, PullPhaseTimes& phases) {
  // Every object in one request, for as long as this pull may take (the source clamps it to its
  // max_lease_ttl_ms; the reply says what it granted).
  v1::LeaseRequest request;
  request.set_protocol_version(kProtocolVersion);
  request.set_requester(options_.requester);
  const auto wanted = std::chrono::duration_cast<std::chrono::milliseconds>(
      bounds.deadline - Clock::now() + kLeaseMargin);
  request.set_ttl_ms(static_cast<uint32_t>(
      std::clamp<int64_t>(wanted.count(), 1, std::numeric_limits<uint32_t>::max())));
  for (PullJob* job : attempt.jobs) request.add_object_ids(job->id.Binary());
  std::vector<std::string> skipped;
  OfferProviders(request, source, attempt.excluded, false, skipped);
  SourceLease leased;
  auto ask = [&] {
    std::unique_ptr<PeerCall> call = peers_.NewCall();
    // A lease to a source first starts every release still queued for it (release_queue.h).
    releases_.StartQueuedTo(source);
    // Earlier leases of this node's at the source not yet given back: a refusal for want of room
    // may be theirs (asked again, once they are).
    leased.releases_pending = releases_.PendingTo(source);
    // Lease expiries are counted from before the request left: by our clock they end no later
    // than by the source's.
    leased.asked_at = Clock::now();
    leased.status = AwaitPeerCall(
        *call, [&bounds] { return bounds.Cancelled(); },
        [&](PeerCalls::Done done) {
          peers_.StartLease(*call, source, request, leased.reply,
                            std::min(bounds.deadline, Clock::now() + kPeerRpcTimeout),
                            std::move(done));
        });
  };
  ask();
  const Clock::time_point first_asked = leased.asked_at;  // the lease phase: both round trips
  if (leased.status.ok() && !skipped.empty() && NoFabricInCommon(leased.reply)) {
    // The source speaks none of the others: a provider that failed with it lately is all the pair
    // has. Asked again with it, and no longer skipped with this source.
    RF_LOG(kInfo, "the agent at " << source << " shares no other provider with this node: "
                                  << skipped.front() << " offered again");
    ForgetUnusable(source, skipped);
    request.clear_reader_providers();
    request.clear_reader_rails();
    OfferProviders(request, source, attempt.excluded, true, skipped);
    leased.reply.Clear();
    ask();
  }
  const Clock::time_point answered = PullPhaseTimes::Lap(phases.lease, first_asked);
  // The source's word for its own part, believed no further than this round trip (NaN, negative
  // or too large from a broken or hostile source: counted as the whole round trip at most).
  if (leased.status.ok() && leased.reply.served_s() > 0) {
    const auto round_trip_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(answered - leased.asked_at).count();
    phases.lease_served += static_cast<int64_t>(
        std::min(leased.reply.served_s() * 1e9, static_cast<double>(round_trip_ns)));
  }
  const size_t asked = attempt.jobs.size();
  if (leased.status.ok() && leased.reply.leases_size() != static_cast<int>(asked)) {
    leased.status = ProtocolError("the agent at " + source + " answered " +
                                  std::to_string(leased.reply.leases_size()) + " leases for " +
                                  std::to_string(asked) + " objects");
    // Whatever it granted is given back (it would count against this node's bound until its TTL).
    v1::ReleaseRequest release;
    release.set_protocol_version(kProtocolVersion);
    for (const v1::Lease& lease : leased.reply.leases()) {
      if (lease.error_code() != v1::ERROR_CODE_NONE || lease.lease_id() == 0) continue;
      v1::LeaseRef* ref = release.add_leases();
      ref->set_lease_id(lease.lease_id());
      ref->set_token(lease.token());
    }
    if (release.leases_size() > 0) releases_.Queue(source, std::move(release));
  }
  return leased;
}

Puller::SourcePeer Puller::ConnectToSource(const std::string& source, const v1::LeaseReply& reply) {
  // The source answered on the best fabric both nodes speak; its address names the provider, and
  // only this node's engine of that provider may insert it.
  SourcePeer to;
  to.fab = fabrics_.For(reply.provider());
  if (to.fab == nullptr) {
    to.status =
        Unavailable("the agent at " + source + " answered on provider '" + reply.provider() +
                    "', which this node does not speak (" + fabrics_.List() + ")");
    return to;
  }
  auto added = to.fab->engine().AddPeer(
      {reply.provider(), reply.fabric(), reply.domain(), reply.fabric_address()});
  if (!added.ok()) {
    to.status = added.status().WithContext("adding the agent at " + source + " as a fabric peer");
    return to;
  }
  to.peer = *added;
  // The source's further rails, each on this node's rail of the same rank: as many as both have
  // (a rail that cannot be added ends the list: large objects then stripe across fewer).
  for (int k = 0; k < reply.rails_size() && static_cast<size_t>(k) + 1 < to.fab->rails.size();
       ++k) {
    const v1::RailAddress& rail = reply.rails(k);
    auto rail_peer = to.fab->rails[k + 1]->AddPeer(
        {reply.provider(), rail.fabric(), rail.domain(), rail.address()});
    if (!rail_peer.ok()) {
      RF_LOG(kWarn, "rail " << k + 2 << " to the agent at " << source
                            << " not used: " << rail_peer.status());
      break;
    }
    to.rail_peers.push_back(*rail_peer);
  }
  return to;
}

bool Puller::AcceptLease(const std::string& source, PullJob& job, const v1::Lease& lease,
                         const SourcePeer& to, Clock::time_point asked_at, bool room_may_come,
                         LocalStore& store) {
  job.lease = lease;
  if (job.lease.error_code() != v1::ERROR_CODE_NONE) {
    if (AnsweredLocal(job, store)) return false;
    // The source's reason, as its code (NotFound: not there; ResourceExhausted: its bounds).
    const StatusCode why = FromErrorCode(job.lease.error_code());
    SetError(
        *job.result,
        Status(why, "the agent at " + source + " refused a lease on object " + job.id.Hex() + ": " +
                        v1::ErrorCode_Name(job.lease.error_code()) + ": " + job.lease.error()));
    return room_may_come && job.lease.error_code() == v1::ERROR_CODE_RESOURCE_EXHAUSTED;
  }
  job.leased = true;
  job.lease_expires = asked_at + std::chrono::milliseconds(job.lease.expires_in_ms());
  const uint64_t leased_size = job.lease.data_size() + job.lease.metadata_size();
  if (job.lease.data_size() > leased_size || leased_size != job.item->object_size()) {
    // The source describes an object of another size than Ray's directory does: never create
    // (and seal) a replica of its choosing.
    counters_.Add(Count::kLeasesSizeMismatch);
    SetError(*job.result, OutOfRange("the agent at " + source + " leased object " + job.id.Hex() +
                                     " as " + std::to_string(job.lease.data_size()) + " + " +
                                     std::to_string(job.lease.metadata_size()) +
                                     " bytes, but Ray's directory says " +
                                     std::to_string(job.item->object_size()) + ": refused"));
    return false;
  }
  Status described = ParseSlices(job.lease, leased_size, job.remote);
  job.rail_remote.clear();
  for (int k = 0; described.ok() && k < job.lease.rails_size() &&
                  static_cast<size_t>(k) < to.rail_peers.size();
       ++k) {
    // A further rail's slices are checked like the first rail's: exactly the object's bytes.
    v1::Lease on_rail;
    *on_rail.mutable_slices() = job.lease.rails(k).slices();
    std::vector<fabric::RemoteSlice> slices;
    described = on_rail.slices_size() == 0 ? OutOfRange("it describes none of the object's bytes")
                                           : ParseSlices(on_rail, leased_size, slices);
    if (!described.ok()) described = described.WithContext("on rail " + std::to_string(k + 2));
    job.rail_remote.push_back(std::move(slices));
  }
  if (!described.ok()) {
    counters_.Add(Count::kLeasesSizeMismatch);
    SetError(*job.result,
             described.WithContext("the agent at " + source + " leased object " + job.id.Hex()));
    return false;
  }
  if (!to.status.ok()) {
    SetError(*job.result, to.status);
    job.fabric_failed = true;
  }
  return false;
}

void Puller::RunWaves(const SourceReads& reads, const std::vector<PullJob*>& jobs,
                      const std::vector<PullJob*>& settled) {
  // Create the replicas and start their reads, a group at a time (the next group's creates
  // overlap this group's reads); then wait for each read, sealing in groups.
  size_t next = 0;
  while (next < jobs.size()) {
    std::vector<PullJob*> wave;
    uint64_t wave_bytes = 0;
    while (next < jobs.size() && wave.size() < kWaveObjects && wave_bytes < kWaveBytes) {
      std::vector<PullJob*> group;
      uint64_t group_bytes = 0;
      for (; next < jobs.size() && group.size() < kCreateGroup &&
             wave.size() + group.size() < kWaveObjects && wave_bytes + group_bytes < kWaveBytes;
           ++next) {
        PullJob& job = *jobs[next];
        if (!job.leased || job.result->outcome() == v1::FAILED) continue;
        if (reads.bounds.Cancelled()) {
          SetError(*job.result, Aborted("the caller cancelled the pull"));
          continue;
        }
        if (RefusedForLeaseEnd(job, reads.source)) continue;
        group.push_back(&job);
        group_bytes += job.lease.data_size() + job.lease.metadata_size();
      }
      StartReads(reads, group, wave, wave_bytes);
    }
    Settle(reads.bounds, settled);  // this wave's replicas are created: claimed
    ++reads.phases.waves;
    FinishReads(reads, wave);
  }
}

void Puller::AttemptFromSource(const std::string& source, const SourceAttempt& attempt,
                               const PullBounds& bounds, PullPhaseTimes& phases,
                               std::vector<SourceAttempt>& to_try) {
  // This connection creates, seals or aborts every replica of this attempt's objects, and stays
  // open while any of their reads may land (see StorePtr); each attempt takes the current one (a
  // broken one is replaced by then).
  const StorePtr store = stores_.Pull();
  const std::vector<PullJob*>& jobs = attempt.jobs;
  // 1. Lease every object from the source agent in one request.
  const SourceLease leased = LeaseFromSource(source, attempt, bounds, phases);
  if (!leased.status.ok()) {
    for (PullJob* job : jobs) {
      if (!AnsweredLocal(*job, *store)) SetError(*job->result, leased.status);
    }
    RecordLink(source, leased.reply, nullptr, jobs);
    Settle(bounds, jobs);
    return;
  }
  const v1::LeaseReply& reply = leased.reply;
  // 2. Reach it on the fabric it answered on, with as many rails as both have.
  const SourcePeer to = ConnectToSource(source, reply);
  // 3. Take each lease, or the source's refusal. A refusal for want of room may pass once this
  //    node's leases there are given back: earlier Pulls' still on their way, or this one's, once
  //    read. Asked again then, once per Pull.
  const bool room_may_come =
      !attempt.room_retried && to.status.ok() &&
      (leased.releases_pending ||
       std::any_of(reply.leases().begin(), reply.leases().end(), [](const v1::Lease& lease) {
         return lease.error_code() == v1::ERROR_CODE_NONE;
       }));
  std::vector<PullJob*> refused_for_room;  // not settled yet: they may be pulled after all
  std::vector<PullJob*> settled;           // the others
  for (size_t i = 0; i < jobs.size(); ++i) {
    const bool may_ask_again = AcceptLease(source, *jobs[i], reply.leases(static_cast<int>(i)), to,
                                           leased.asked_at, room_may_come, *store);
    jobs[i]->result->set_provider(reply.provider());
    (may_ask_again ? refused_for_room : settled).push_back(jobs[i]);
  }
  Settle(bounds, settled);
  // 4. Read them, in waves.
  const SourceReads reads{source, to.fab, to.peer, to.rail_peers, store, bounds, phases};
  RunWaves(reads, jobs, settled);
  RecordLink(source, reply, to.fab, settled);  // not (yet) those that may be asked again
  // 5. Release every lease we got, whatever happened; and what goes again, to the same source.
  v1::ReleaseRequest release;
  release.set_protocol_version(kProtocolVersion);
  for (PullJob* job : jobs) {
    if (!job->leased) continue;
    v1::LeaseRef* ref = release.add_leases();
    ref->set_lease_id(job->lease.lease_id());
    ref->set_token(job->lease.token());
  }
  std::optional<SourceAttempt> failover = FailoverAttempt(source, attempt, to.fab);
  if ((!failover && refused_for_room.empty()) || !TimeLeft(bounds)) {
    Settle(bounds, refused_for_room);  // failed: not asked again
    if (release.leases_size() > 0) releases_.Queue(source, std::move(release));
    return;
  }
  // The same source is leased again next: this attempt's leases are released (and answered)
  // first, so that the source does not count them twice against what this node may hold.
  if (release.leases_size() > 0) {
    releases_.ReleaseNow(source, release, bounds.deadline,
                         [&bounds] { return bounds.Cancelled(); });
  }
  // Objects refused for want of room go once the failover (if any) is done, and this node's
  // leases there are given back.
  const bool room_retry = !refused_for_room.empty();
  if (room_retry) to_try.push_back({std::move(refused_for_room), attempt.excluded, true, true});
  if (failover && TimeLeft(bounds)) {
    for (PullJob* job : failover->jobs) ResetForAnotherAttempt(*job);
    failover->room_retried = attempt.room_retried || room_retry;
    RF_LOG(kInfo, failover->jobs.size()
                      << " object(s) from " << source << " failed over " << to.fab->provider()
                      << ": trying the next provider both nodes have");
    to_try.push_back(std::move(*failover));
  }
}

std::optional<Puller::SourceAttempt> Puller::FailoverAttempt(const std::string& source,
                                                             const SourceAttempt& attempt,
                                                             const Fabric* fab) {
  // Reads that failed on this fabric go again over the next provider both nodes share, if there
  // is one; a provider none of whose reads worked is skipped with this source for a while
  // (unreachable between the two: e.g. verbs across two IB subnets).
  if (fab == nullptr) return std::nullopt;
  SourceAttempt again{{}, attempt.excluded, attempt.room_retried, false};
  Status why;
  bool any_pulled = false;
  for (PullJob* job : attempt.jobs) {
    any_pulled = any_pulled || job->result->outcome() == v1::PULLED;
    if (job->fabric_failed && job->result->outcome() == v1::FAILED) {
      if (again.jobs.empty()) {
        why = Status(FromErrorCode(job->result->error_code()), job->result->error());
      }
      again.jobs.push_back(job);
    }
  }
  if (again.jobs.empty()) return std::nullopt;
  if (!any_pulled) MarkUnusable(source, fab->provider(), why);
  // Each provider is tried once per Pull (a source that answers on one it was not offered gets no
  // second try on it).
  const bool another =
      again.excluded.insert(fab->provider()).second &&
      std::any_of(fabrics_.all().begin(), fabrics_.all().end(),
                  [&](const Fabric& other) { return again.excluded.count(other.provider()) == 0; });
  if (!another) return std::nullopt;
  return again;
}

bool Puller::RefusedForLeaseEnd(PullJob& job, const std::string& source) {
  // A read is not started close to its lease's end (the seal would be refused anyway if it
  // finished after it): within 2 s, or a quarter of a shorter lease.
  const auto margin = std::min<Clock::duration>(
      kLeaseMargin, std::chrono::milliseconds(job.lease.expires_in_ms()) / 4);
  if (Clock::now() + margin <= job.lease_expires) return false;
  counters_.Add(Count::kPullsLeaseExpired);
  SetError(*job.result, TimedOut("the lease on object " + job.id.Hex() + " from " + source +
                                 " is about to expire: not read"));
  return true;
}

void Puller::StartReads(const SourceReads& reads, const std::vector<PullJob*>& group,
                        std::vector<PullJob*>& wave, uint64_t& wave_bytes) {
  if (group.empty()) return;
  Fabric& fab = *reads.fab;
  std::vector<ObjectId> ids;
  std::vector<plasma::CreateOptions> creates;
  const auto left_ms = std::max<int64_t>(
      1, std::chrono::duration_cast<std::chrono::milliseconds>(reads.bounds.deadline - Clock::now())
             .count());
  for (PullJob* job : group) {
    plasma::CreateOptions create;
    create.owner.node_id = job->item->owner().node_id();
    create.owner.ip_address = job->item->owner().ip_address();
    create.owner.port = job->item->owner().port();
    create.owner.worker_id = job->item->owner().worker_id();
    create.data_size = job->lease.data_size();
    create.metadata_size = job->lease.metadata_size();
    create.timeout_ms = std::min<int64_t>(options_.create_timeout_ms, left_ms);
    ids.push_back(job->id);
    creates.push_back(create);
  }
  const Clock::time_point created_from = Clock::now();
  std::vector<Result<plasma::ObjectBuffer>> replicas = reads.store->CreateMany(ids, creates);
  Clock::time_point step = PullPhaseTimes::Lap(reads.phases.create, created_from);
  for (size_t i = 0; i < group.size(); ++i) {
    PullJob& job = *group[i];
    job.started = created_from;
    Result<plasma::ObjectBuffer>& replica = replicas[i];
    if (!replica.ok()) {
      if (replica.status().code() == StatusCode::kAlreadyExists) {
        // Sealed here already, or Ray (or another pull) is creating it: leave it to them.
        if (!AnsweredLocal(job, *reads.store)) {
          job.result->set_outcome(v1::STOOD_ASIDE);
          counters_.Add(Count::kPullsStoodAside);
        }
      } else {
        SetError(*job.result, replica.status().WithContext("creating the local replica"));
      }
      step = PullPhaseTimes::Lap(reads.phases.create, step);
      continue;
    }
    job.created = true;
    job.replica = *replica;
    if (RefusedForLeaseEnd(job, reads.source)) {
      // The group's creates may have waited for room in the store: not read after all.
      (void)reads.store->Abort(job.id);
      job.created = false;
      step = PullPhaseTimes::Lap(reads.phases.create, step);
      continue;
    }
    const uint64_t bytes = job.lease.data_size() + job.lease.metadata_size();
    // One local registration per rail the read stripes across (the replica's segment on each).
    const size_t rails = fabric::RailsFor(bytes, 1 + job.rail_remote.size(), fabrics_.stripe_min());
    std::vector<fabric::RegisteredRange> local(rails);
    Status s;
    for (size_t k = 0; k < rails && s.ok(); ++k) {
      auto region = fabrics_.RegionFor(fab, k, job.replica.segment_base, job.replica.segment_size);
      s = region.status();
      if (region.ok()) local[k] = std::move(*region);
    }
    // The replica's pages may be new to this process's mapping of the store: map them
    // (MADV_POPULATE_WRITE: no byte of the shared mapping changes, whoever writes it meanwhile)
    // rather than take a fault per page while the provider writes into them. One rail writes
    // from the start: only its first pages are mapped before the read is posted, the rest while
    // the first bytes travel (mapping runs at several GB/s, ahead of the provider's writes).
    const size_t populate_first = rails == 1 ? std::min<uint64_t>(bytes, kPopulateAhead) : bytes;
    auto populate = [&](size_t from, size_t length) {
      Status populated = warmer_.Populate(job.replica.data + from, length);
      if (!populated.ok() && !populate_warned_.exchange(true)) {
        RF_LOG(kInfo, "replicas are not populated before reads: " << populated.message());
      }
    };
    if (s.ok()) {
      populate(0, populate_first);
      step = PullPhaseTimes::Lap(reads.phases.prepare, step);
      std::vector<fabric::Rail> stripes(rails);
      for (size_t k = 0; k < rails; ++k) {
        stripes[k] = {fab.rails[k].get(), k == 0 ? reads.peer : reads.rail_peers[k - 1],
                      k == 0 ? &job.remote : &job.rail_remote[k - 1], &local[k]};
      }
      auto started = fabric::StartStriped(fabric::RmaOp::kRead, stripes, job.replica.data, bytes,
                                          fabrics_.stripe_min());
      step = PullPhaseTimes::Lap(reads.phases.post, step);
      job.rails_used = rails;
      s = started.status();
      if (started.ok()) job.transfer = *started;
      job.fabric_failed = !started.ok();  // not a local registration: the fabric refused it
      // In steps: a read that already ended (failed at once, or done) or a caller that went
      // away needs no more of it.
      for (size_t from = populate_first; started.ok() && from < bytes; from += kPopulateStep) {
        if (job.transfer.Done() || reads.bounds.Cancelled()) break;
        populate(from, std::min<uint64_t>(kPopulateStep, bytes - from));
      }
    }
    step = PullPhaseTimes::Lap(reads.phases.prepare, step);
    if (!s.ok()) {
      // Nothing was posted: the replica can go at once.
      SetError(*job.result,
               s.WithContext("fi_read of object " + job.id.Hex() + " from " + reads.source));
      (void)reads.store->Abort(job.id);
      job.created = false;
      continue;
    }
    wave.push_back(&job);
    wave_bytes += bytes;
  }
}

void Puller::FinishReads(const SourceReads& reads, const std::vector<PullJob*>& wave) {
  std::vector<PullJob*> done;  // read in full within their leases: sealed together
  auto seal = [&] {
    if (done.empty()) return;
    const Clock::time_point sealed_from = Clock::now();
    std::vector<ObjectId> ids;
    for (PullJob* job : done) ids.push_back(job->id);
    std::vector<Status> sealed = reads.store->SealAndRelease(ids);
    PullPhaseTimes::Lap(reads.phases.seal, sealed_from);
    for (size_t i = 0; i < done.size(); ++i) {
      PullJob& job = *done[i];
      if (sealed[i].ok()) {
        const uint64_t bytes = job.lease.data_size() + job.lease.metadata_size();
        job.result->set_outcome(v1::PULLED);
        job.result->set_bytes(bytes);
        job.result->set_seconds(std::chrono::duration<double>(Clock::now() - job.started).count());
        counters_.Add(Count::kObjectsPulled);
        counters_.Add(Count::kBytesPulled, bytes);
        job.created = false;
      } else {
        SetError(*job.result, sealed[i].WithContext("sealing the replica of object " +
                                                    job.id.Hex() + " read from " + reads.source));
        EndFailedReplica(job, reads.store);
      }
    }
    done.clear();
  };
  for (PullJob* job : wave) {
    // What finished is sealed before waiting on a read still under way (Ray's gets of those
    // objects need not wait for the rest), and in groups (one store round trip per group).
    if (done.size() >= kCreateGroup || (!done.empty() && !job->transfer.Done())) seal();
    const Clock::time_point waited_from = Clock::now();
    // In steps, so that a caller that went away is noticed (its reads are then cut off).
    Status s;
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(reads.bounds.deadline -
                                                                        Clock::now());
      s = job->transfer.Wait(
          std::clamp(left, std::chrono::milliseconds(1),
                     std::chrono::duration_cast<std::chrono::milliseconds>(kCancelPoll)));
      if (job->transfer.Done() || Clock::now() >= reads.bounds.deadline) break;
      if (reads.bounds.Cancelled()) {
        s = Aborted("the caller cancelled the pull");
        break;
      }
    }
    PullPhaseTimes::Lap(reads.phases.wait, waited_from);
    // Failed by itself (an error, or no progress for op_timeout_ms), not cut short by us.
    job->fabric_failed = !s.ok() && job->transfer.Done();
    if (s.ok() && Clock::now() >= job->lease_expires) {
      // The read finished, but maybe after the source unpinned the object: its bytes may be
      // another object's. Never seal them.
      counters_.Add(Count::kPullsLeaseExpired);
      s = TimedOut("the read of object " + job->id.Hex() + " from " + reads.source +
                   " finished after its lease expired: not sealed");
    }
    if (s.ok()) {
      done.push_back(job);
      continue;
    }
    // Never seal bytes we did not get, and never let a late byte of this read land in memory
    // the store hands out again.
    SetError(*job->result,
             s.WithContext("fi_read of object " + job->id.Hex() + " from " + reads.source));
    EndFailedReplica(*job, reads.store);
  }
  seal();
}

void Puller::RecordLink(const std::string& source, const v1::LeaseReply& lease_reply,
                        const Fabric* fab, const std::vector<PullJob*>& jobs) {
  std::lock_guard<std::mutex> lock(links_mu_);
  v1::PeerLink& link = links_[source];
  link.set_peer(source);
  if (fab != nullptr) {
    link.set_provider(fab->provider());
    link.set_domain(fab->engine().profile().domain);
    link.set_peer_domain(lease_reply.domain());
  }
  for (const PullJob* job : jobs) {
    if (job->rails_used > 0) link.set_rails(static_cast<uint32_t>(job->rails_used));
  }
  link.clear_unusable_providers();
  auto unusable = unusable_.find(source);
  if (unusable != unusable_.end()) {
    for (const auto& [provider, until] : unusable->second) {
      if (until > Clock::now()) link.add_unusable_providers(provider);
    }
  }
  for (const PullJob* job : jobs) {
    if (job->result->outcome() == v1::PULLED) {
      link.set_objects_pulled(link.objects_pulled() + 1);
      link.set_bytes_pulled(link.bytes_pulled() + job->result->bytes());
    } else if (job->result->outcome() == v1::FAILED) {
      link.set_pulls_failed(link.pulls_failed() + 1);
      link.set_last_error(job->result->error().substr(0, 300));
    }
  }
}

}  // namespace rayfabric::agent
