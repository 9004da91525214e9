// Transfers: spans split into chunks, a window of operations in flight, completions reaped by the
// progress thread (which also serves remote one-sided operations on manual-progress providers),
// a progress timeout, and the drain that keeps a failed transfer from being reported while any of
// its operations could still move a byte.
#include <poll.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "fabric/engine_core.h"
#include "fabric/fabric_error.h"
#include "rayfabric/log.h"

namespace rayfabric::fabric {
namespace {

// How long the progress thread blocks in the CQ wait object before it looks at deadlines.
constexpr int kProgressWaitMs = 20;
constexpr size_t kCqBatch = 64;

}  // namespace

// ---------------------------------------------------------------------------------- Transfer

Transfer Transfer::Join(const std::vector<Transfer>& transfers) {
  Transfer joined;
  for (const Transfer& t : transfers) {
    joined.parts_.insert(joined.parts_.end(), t.parts_.begin(), t.parts_.end());
  }
  return joined;
}

Transfer Transfer::Failed(const std::string& what, Status why) {
  auto state = std::make_shared<TransferState>();
  state->what = what;
  state->Finish(std::move(why), true);
  return Transfer(std::move(state));
}

Transfer Transfer::PartlyStarted(std::vector<Transfer> started, const std::string& what,
                                 const Status& why) {
  started.push_back(Failed(what, why.WithContext(what + " could not start")));
  Transfer joined = Join(started);
  joined.Cancel(what + " could not start: " + why.message());
  return joined;
}

Status Transfer::Wait(std::chrono::milliseconds timeout) const {
  if (parts_.empty()) return InvalidArgument("Wait() on an empty Transfer");
  const bool forever = timeout == std::chrono::milliseconds::max();
  const auto deadline = forever ? Clock::time_point::max() : Clock::now() + timeout;
  Status first_failure;
  // A short transfer completes within the spin more often than not: seen without a wake-up. One
  // bound for all parts, from the start of the wait.
  const auto spin_until = std::min(deadline, Clock::now() + parts_.front()->spin);
  for (const auto& state : parts_) {
    std::unique_lock<std::mutex> lock(state->wait_mu);
    if (!state->done && state->spin.count() > 0) {
      while (!state->done && Clock::now() < spin_until) {
        lock.unlock();
        sched_yield();
        lock.lock();
      }
    }
    if (forever) {
      state->wait_cv.wait(lock, [&] { return state->done; });
    } else if (!state->wait_cv.wait_until(lock, deadline, [&] { return state->done; })) {
      return TimedOut(state->what + " still running after waiting " +
                      std::to_string(timeout.count()) + " ms");
    }
    if (!state->status.ok() && first_failure.ok()) first_failure = state->status;
  }
  return first_failure;
}

bool Transfer::Done() const {
  for (const auto& state : parts_) {
    std::lock_guard<std::mutex> lock(state->wait_mu);
    if (!state->done) return false;
  }
  return true;
}

bool Transfer::Quiesced() const {
  for (const auto& state : parts_) {
    std::lock_guard<std::mutex> lock(state->wait_mu);
    if (!state->quiesced) return false;
  }
  return true;
}

bool Transfer::WaitQuiesced(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  for (const auto& state : parts_) {
    std::unique_lock<std::mutex> lock(state->wait_mu);
    if (!state->wait_cv.wait_until(lock, deadline, [&] { return state->quiesced; })) return false;
  }
  return true;
}

void Transfer::Cancel(const std::string& why) const {
  for (const auto& state : parts_) {
    if (auto core = state->core.lock()) core->Cancel(*state, why);
  }
}

uint64_t Transfer::bytes() const {
  uint64_t total = 0;
  for (const auto& state : parts_) total += state->total_bytes;
  return total;
}

// ------------------------------------------------------------------------------ EngineCore

Result<Transfer> EngineCore::Start(RmaOp op, PeerId peer, const RemoteRegion& remote,
                                   const std::shared_ptr<MemoryRegion>& local_region,
                                   const std::vector<RmaSpan>& spans) {
  const char* verb = op == RmaOp::kRead ? "fi_read" : "fi_write";
  if (!local_region) return InvalidArgument(std::string(verb) + ": no local memory region");
  if (spans.empty()) return InvalidArgument(std::string(verb) + ": nothing to transfer");
  const uint32_t needs = op == RmaOp::kRead ? kLocalRead : kLocalWrite;
  if ((local_region->access() & needs) == 0) {
    return InvalidArgument(
        std::string(verb) + ": the local region was not registered for " +
        (op == RmaOp::kRead ? "local read (kLocalRead)" : "local write (kLocalWrite)"));
  }
  auto t = std::make_shared<TransferState>();
  t->op = op;
  t->peer = peer;
  t->local_region = local_region;
  t->local_desc = local_region->local_desc();
  t->core = weak_from_this();
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
      t->chunks.push_back(
          {static_cast<char*>(s.local) + off, len, remote.address + s.remote_offset + off});
    }
    t->total_bytes += s.length;
  }
  t->contexts.resize(t->chunks.size());
  for (auto& c : t->contexts) c.owner = t.get();
  t->what = std::string(verb) + " of " + HumanBytes(t->total_bytes) + " with peer " +
            std::to_string(peer) + " over " + profile_.provider;

  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (peer >= peer_table_.size()) {
    return NotFound(std::string(verb) + ": unknown peer " + std::to_string(peer) +
                    " (AddPeer first)");
  }
  if (!eps_.ep) return Unavailable("the fabric endpoint is not open (a reset failed to reopen it)");
  if (peer_table_[peer].broken) RF_RETURN_IF_ERROR(ReconnectLocked(peer));
  t->fi_addr = peer_table_[peer].fi_addr;
  t->endpoint_generation = endpoint_generation_;
  RF_ASSIGN_OR_RETURN(t->key, RemoteKey(remote));
  t->last_progress = Clock::now();
  t->spin = spin_;
  active_.push_back(t);
  PumpLocked(*t);
  // (The progress thread looks at timeouts every kProgressWaitMs anyway.) Polling, it is woken
  // while the operations fly, to poll for their completions.
  bool wake = blocked_;
  if (spin_.count() > 0) {
    NoteActivity();
    wake = wake || sleeping_.load();
  }
  if (wake) Wake();
  ReapLocked();
  return Transfer(t);
}

Result<Transfer> EngineCore::StartRange(RmaOp op, PeerId peer,
                                        const std::vector<RemoteSlice>& remote,
                                        const RegisteredRange& local_range, void* local,
                                        size_t length) {
  const char* verb = op == RmaOp::kRead ? "fi_read" : "fi_write";
  uint64_t remote_total = 0;
  for (const RemoteSlice& r : remote) {
    if (r.length == 0 || r.offset > r.region.length || r.length > r.region.length - r.offset) {
      return OutOfRange(std::string(verb) + ": remote slice [" + std::to_string(r.offset) + ", +" +
                        std::to_string(r.length) + ") exceeds its region of " +
                        std::to_string(r.region.length) + " bytes");
    }
    remote_total += r.length;
  }
  if (remote_total != length) {
    return OutOfRange(std::string(verb) + ": the remote slices hold " +
                      std::to_string(remote_total) + " bytes, the local buffer " +
                      std::to_string(length));
  }
  if (!local_range.Contains(local, length)) {
    return OutOfRange(std::string(verb) + ": local buffer of " + HumanBytes(length) +
                      " lies outside its registered range");
  }
  // Pieces that lie in one remote and one local registration each, in order.
  std::vector<Transfer> parts;
  char* at = static_cast<char*>(local);
  for (const RemoteSlice& r : remote) {
    uint64_t done = 0;
    while (done < r.length) {
      std::shared_ptr<MemoryRegion> slice;
      for (const auto& candidate : local_range.slices) {
        if (candidate->Contains(at, 1)) slice = candidate;
      }
      if (!slice) return Internal(std::string(verb) + ": no local slice holds a byte of the range");
      const uint64_t local_left =
          static_cast<uint64_t>(static_cast<char*>(slice->base()) + slice->length() - at);
      const uint64_t n = std::min(r.length - done, local_left);
      auto part = Start(op, peer, r.region, slice, {{at, static_cast<size_t>(n), r.offset + done}});
      if (!part.ok()) {
        if (parts.empty()) return part.status();  // nothing posted
        return Transfer::PartlyStarted(std::move(parts), "a later part of the range",
                                       part.status());
      }
      parts.push_back(*part);
      at += n;
      done += n;
    }
  }
  return Transfer::Join(parts);
}

void EngineCore::PumpLocked(TransferState& t) {
  while (!t.failed && t.next < t.chunks.size() && t.inflight < max_inflight_) {
    const auto& c = t.chunks[t.next];
    void* ctx = &t.contexts[t.next].fi_ctx;
    ssize_t ret;
    if (t.op == RmaOp::kRead) {
      ret = fi_read(eps_.ep.get(), c.local, c.length, t.local_desc, t.fi_addr, c.remote_addr, t.key,
                    ctx);
    } else {
      // Delivery complete: when the write completes, the bytes are in the target's memory, so a
      // notification sent afterwards (over any channel) never overtakes them.
      struct iovec iov = {c.local, c.length};
      struct fi_rma_iov rma_iov = {c.remote_addr, c.length, t.key};
      void* desc = t.local_desc;
      struct fi_msg_rma msg = {&iov, &desc, 1, t.fi_addr, &rma_iov, 1, ctx, 0};
      ret = fi_writemsg(eps_.ep.get(), &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
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
    t.failure = std::move(s);
    t.failed_at = Clock::now();
    ++transfers_failed_;
  }
  // Reported only once nothing of it is outstanding (else CheckTimeoutsLocked drains it).
  if (t.inflight == 0) t.Finish(t.failure, true);
}

void EngineCore::Cancel(TransferState& t, const std::string& why) {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  if (t.failed || t.completed == t.chunks.size()) return;
  FailLocked(t, Aborted(t.what + " cancelled: " + why));
  Wake();
}

void EngineCore::OnCompletionLocked(OpContext* ctx, bool ok, Status error) {
  TransferState& t = *ctx->owner;
  if (t.inflight == 0) {
    RF_LOG(kWarn, "completion for " << t.what << " with nothing outstanding: ignored");
    return;
  }
  --t.inflight;
  ++t.completed;
  t.last_progress = Clock::now();
  if (!ok) {
    ++ops_failed_;
    FailLocked(t, std::move(error));
    return;
  }
  if (t.failed) {
    if (t.inflight == 0) t.Finish(t.failure, true);
    return;
  }
  if (t.completed == t.chunks.size()) {
    (t.op == RmaOp::kRead ? bytes_read_ : bytes_written_) += t.total_bytes;
    ++transfers_ok_;
    t.Finish(Status::OK(), true);
  } else {
    PumpLocked(t);
  }
}

void EngineCore::CheckTimeoutsLocked() {
  const auto now = Clock::now();
  std::string reset_reason;
  for (auto& t : active_) {
    if (!t->failed && now - t->last_progress > op_timeout_) {
      FailLocked(*t, TimedOut(t->what + ": no operation completed for op_timeout_ms=" +
                              std::to_string(op_timeout_.count()) + " (dead peer or cut link?)"));
    }
    if (!t->failed || t->inflight == 0 || now - t->failed_at <= drain_timeout_) continue;
    const std::string outstanding = std::to_string(t->inflight) + " operations of " + t->what +
                                    " still outstanding " + std::to_string(drain_timeout_.count()) +
                                    " ms after it failed";
    if (can_reset_) {
      reset_reason = outstanding;
    } else if (!t->Drained()) {
      // No reset possible: say so once; the caller keeps the buffer out of reuse (Quiesced()).
      bool first = false;
      {
        std::lock_guard<std::mutex> lock(t->wait_mu);
        first = !t->done;
      }
      if (first) {
        ++undrained_;
        t->Finish(Status(t->failure.code(),
                         t->failure.message() + " (" + outstanding +
                             "; the local buffer may still be written until they complete)"),
                  false);
      }
    }
  }
  if (!reset_reason.empty()) ResetEndpointLocked(reset_reason);
}

void EngineCore::ReapLocked() {
  active_.erase(
      std::remove_if(active_.begin(), active_.end(),
                     [](const std::shared_ptr<TransferState>& t) { return t->Drained(); }),
      active_.end());
}

void EngineCore::ProgressLoop() {
  struct fi_cq_entry entries[kCqBatch];
  while (!stop_) {
    // Only this thread closes or replaces the endpoint set (ResetEndpointLocked runs here), so
    // the CQ read below stays valid outside the lock.
    struct fid_cq* cq = nullptr;
    int cq_fd = -1;
    bool blocked = false;
    {
      std::lock_guard<std::recursive_mutex> lock(mu_);
      cq = eps_.cq.get();
      cq_fd = eps_.cq_fd;
      blocked = blocked_;
    }
    ssize_t n = -FI_EAGAIN;
    // Reading the CQ also drives the provider's progress, which is what lets remote peers'
    // one-sided operations on our memory complete on manual-progress providers.
    if (cq != nullptr) n = fi_cq_read(cq, entries, kCqBatch);
    if (n == -FI_EAGAIN && cq != nullptr && spin_.count() > 0 && !blocked) {
      // Shortly after activity: poll on (yielding), so that what completes next (a reply, the
      // next request of a stream, a peer's read on manual progress) needs no wake-up. A post
      // that could not go (blocked_, read here without the lock) ends it: the loop below posts
      // it again.
      while (n == -FI_EAGAIN && !stop_ && Recent() && !blocked_.load(std::memory_order_relaxed)) {
        sched_yield();
        n = fi_cq_read(cq, entries, kCqBatch);
      }
    }
    if (n > 0 && spin_.count() > 0) NoteActivity();
    if (n == -FI_EAGAIN) {
      struct fid* cq_fid = cq != nullptr ? &cq->fid : nullptr;
      if ((cq_fd >= 0 || cq == nullptr) && !blocked) {
        // Nothing to do: block on the CQ's fd (and our wake fd) until the provider has work,
        // at most kProgressWaitMs so that timeouts are checked. (Said before activity is looked
        // at again, as Start notes activity before it looks at sleeping_: a post in between is
        // seen by one of the two, and either the thread polls on or the post wakes it.)
        sleeping_.store(true);
        const bool poll_on = spin_.count() > 0 && Recent();
        if (!poll_on && (cq == nullptr || fi_trywait(fabric_.get(), &cq_fid, 1) == FI_SUCCESS)) {
          struct pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {cq_fd, POLLIN, 0}};
          const int woke = poll(fds, cq_fd >= 0 ? 2 : 1, kProgressWaitMs);
          if (woke > 0 && (fds[0].revents & POLLIN)) {
            uint64_t drained;
            if (read(wake_fd_, &drained, sizeof(drained)) < 0) drained = 0;
          }
          // Woken by the CQ: something arrived (a peer's request, a reply); poll on after it.
          if (woke > 0 && spin_.count() > 0) NoteActivity();
        }
        sleeping_.store(false);
      } else {
        sched_yield();  // no wait fd: poll (never sleep) so progress stays prompt
      }
    }
    std::lock_guard<std::recursive_mutex> lock(mu_);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        OnCompletionLocked(static_cast<OpContext*>(entries[i].op_context), true, Status::OK());
      }
    } else if (n == -FI_EAVAIL) {
      struct fi_cq_err_entry err {};
      if (fi_cq_readerr(cq, &err, 0) > 0 && err.op_context != nullptr) {
        auto* ctx = static_cast<OpContext*>(err.op_context);
        TransferState& t = *ctx->owner;
        if (t.peer < peer_table_.size() && peer_table_[t.peer].fi_addr == t.fi_addr &&
            peer_table_[t.peer].generation == t.endpoint_generation) {
          peer_table_[t.peer].broken = true;  // some providers drop a connection after any error
        }
        OnCompletionLocked(ctx, false, CompletionStatus(cq, err, t.what));
      }
    } else if (n != -FI_EAGAIN && n != 0) {
      RF_LOG(kWarn, "fi_cq_read: " << fi_strerror(static_cast<int>(-n)));
    }
    if (blocked_) {
      blocked_ = false;
      for (auto& t : active_) PumpLocked(*t);
    }
    CheckTimeoutsLocked();
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
  s.endpoint_resets = resets_;
  s.transfers_undrained = undrained_;
  std::lock_guard<std::recursive_mutex> lock(mu_);
  s.peers = peers_.size();
  return s;
}

}  // namespace rayfabric::fabric
