// Fakes at the agent's two seams (src/agent/local_store.h, src/agent/peer_calls.h), so that its
// pull, lease and release logic runs without Ray: a node's store in this process's shared memory,
// and agents that call each other directly instead of over gRPC. Both keep the real contracts
// (pins, unsealed creates ended with their connection; `done` once); they add only what a real
// store or peer cannot be made to do on demand: a source whose lease replies are altered, lease
// calls or their replies lost in transit, releases that are answered late, and store connections
// that break (a store that stopped answering one client).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "agent/local_store.h"
#include "agent/peer_calls.h"

namespace rayfabric::agent::testing {

// One node's object store: a memfd segment, objects created into it (bump-allocated, never
// reused), shared by every connection the agent opens.
class FakeStoreNode : public std::enable_shared_from_this<FakeStoreNode> {
 public:
  explicit FakeStoreNode(size_t capacity) : capacity_(capacity) {
    fd_ = memfd_create("rayfabric-fake-store", 0);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(capacity)) != 0) abort();
    void* base = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (base == MAP_FAILED) abort();
    base_ = static_cast<uint8_t*>(base);
  }
  ~FakeStoreNode() {
    munmap(base_, capacity_);
    close(fd_);
  }

  // A sealed object, as a worker's put leaves it.
  void Put(const ObjectId& id, const std::string& bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    Object& o = objects_[id];
    o.offset = Allocate(bytes.size());
    o.size = bytes.size();
    o.sealed = true;
    std::memcpy(base_ + o.offset, bytes.data(), bytes.size());
  }
  // The sealed object's bytes ("" if it is not sealed here).
  std::string Read(const ObjectId& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(id);
    if (it == objects_.end() || !it->second.sealed) return "";
    return std::string(reinterpret_cast<const char*>(base_ + it->second.offset), it->second.size);
  }
  // Replicas aborted by any connection (a failed read's).
  int Aborts() {
    std::lock_guard<std::mutex> lock(mu_);
    return aborts_;
  }
  bool Exists(const ObjectId& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return objects_.count(id) > 0;
  }
  // Pins held on it by every connection (leases, unsealed creates).
  int Pins(const ObjectId& id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(id);
    return it == objects_.end() ? 0 : it->second.pins;
  }

  // The `serial`-th connection made to this store (0: the agent's serving one, 1: its pulling
  // one, as Agent::Open makes them) reports itself broken from now on, as one whose store did not
  // answer within store_timeout_ms; the others stay healthy.
  void BreakConnection(int serial) { broken_serial_ = serial; }
  // Connections open now (a retired one counts until it is closed).
  int Connections() const { return connections_.load(); }

  StoreConnector Connector();

 private:
  friend class FakeStoreConnection;
  struct Object {
    size_t offset = 0;
    size_t size = 0;
    bool sealed = false;
    int pins = 0;
    const void* creator = nullptr;  // the connection that created it, while unsealed
  };
  size_t Allocate(size_t bytes) {
    const size_t at = used_;
    used_ += (bytes + 63) / 64 * 64;
    if (used_ > capacity_) abort();  // a test that needs more asks for a larger store
    return at;
  }
  plasma::ObjectBuffer BufferOf(const ObjectId& id, const Object& o) const {
    plasma::ObjectBuffer b;
    b.id = id;
    b.found = true;
    b.data = base_ + o.offset;
    b.data_size = o.size;
    b.data_offset = o.offset;
    b.segment_base = base_;
    b.segment_size = capacity_;
    b.segment_fd = fd_;
    return b;
  }
  plasma::SegmentInfo Segment() const {
    return {/*store_fd=*/3, /*unique_fd_id=*/1, fd_,
            base_,          capacity_,          /*fallback=*/false};
  }

  const size_t capacity_;
  int fd_ = -1;
  uint8_t* base_ = nullptr;
  std::mutex mu_;
  size_t used_ = 0;
  int aborts_ = 0;
  std::map<ObjectId, Object> objects_;
  std::atomic<int> broken_serial_{-1};
  std::atomic<int> connections_{0};  // open now
  std::atomic<int> made_{0};         // ever made
};

class FakeStoreConnection final : public LocalStore {
 public:
  explicit FakeStoreConnection(std::shared_ptr<FakeStoreNode> node)
      : node_(std::move(node)), serial_(node_->made_++) {
    ++node_->connections_;
  }
  // As plasma does when a client goes: its pins are dropped and its unsealed creates aborted.
  ~FakeStoreConnection() override {
    --node_->connections_;
    std::lock_guard<std::mutex> lock(node_->mu_);
    for (auto& [id, count] : pins_) {
      auto it = node_->objects_.find(id);
      if (it != node_->objects_.end()) it->second.pins -= count;
    }
    for (auto it = node_->objects_.begin(); it != node_->objects_.end();) {
      it = it->second.creator == this ? node_->objects_.erase(it) : std::next(it);
    }
  }

  Result<std::vector<plasma::ObjectBuffer>> Get(const std::vector<ObjectId>& ids,
                                                int64_t /*timeout_ms*/) override {
    std::lock_guard<std::mutex> lock(node_->mu_);
    std::vector<plasma::ObjectBuffer> out;
    for (const ObjectId& id : ids) {
      auto it = node_->objects_.find(id);
      if (it == node_->objects_.end() || !it->second.sealed) {
        plasma::ObjectBuffer missing;
        missing.id = id;
        out.push_back(missing);
        continue;
      }
      PinLocked(id, it->second);
      out.push_back(node_->BufferOf(id, it->second));
    }
    return out;
  }
  Result<plasma::ObjectBuffer> GetOne(const ObjectId& id, int64_t timeout_ms) override {
    RF_ASSIGN_OR_RETURN(auto got, Get({id}, timeout_ms));
    if (!got[0].found) return NotSealed(id, timeout_ms);
    return got[0];
  }
  Status NotSealed(const ObjectId& id, int64_t /*timeout_ms*/) const override {
    return NotFound("object " + id.Hex() + " is not sealed in the fake store");
  }
  std::vector<Result<plasma::ObjectBuffer>> CreateMany(
      const std::vector<ObjectId>& ids,
      const std::vector<plasma::CreateOptions>& options) override {
    std::lock_guard<std::mutex> lock(node_->mu_);
    std::vector<Result<plasma::ObjectBuffer>> out;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (node_->objects_.count(ids[k]) > 0) {
        out.push_back(AlreadyExists("create of object " + ids[k].Hex() + ": it exists"));
        continue;
      }
      FakeStoreNode::Object& o = node_->objects_[ids[k]];
      o.size = options[k].data_size + options[k].metadata_size;
      o.offset = node_->Allocate(o.size);
      o.creator = this;
      PinLocked(ids[k], o);
      plasma::ObjectBuffer b = node_->BufferOf(ids[k], o);
      b.data_size = options[k].data_size;
      b.metadata_size = options[k].metadata_size;
      out.push_back(b);
    }
    return out;
  }
  Result<size_t> ReapAbandonedCreates() override { return size_t{0}; }
  size_t abandoned_creates() const override { return 0; }
  std::vector<Status> SealAndRelease(const std::vector<ObjectId>& ids) override {
    std::vector<Status> out;
    for (const ObjectId& id : ids) {
      std::lock_guard<std::mutex> lock(node_->mu_);
      auto it = node_->objects_.find(id);
      if (it == node_->objects_.end() || it->second.creator != this) {
        out.push_back(InvalidArgument("seal of object " + id.Hex() + ": not created here"));
        continue;
      }
      it->second.sealed = true;
      it->second.creator = nullptr;
      UnpinLocked(id, it->second);
      out.push_back(Status::OK());
    }
    return out;
  }
  Status Abort(const ObjectId& id) override {
    std::lock_guard<std::mutex> lock(node_->mu_);
    auto it = node_->objects_.find(id);
    if (it == node_->objects_.end() || it->second.creator != this) {
      return InvalidArgument("abort of object " + id.Hex() + ": not created here, or sealed");
    }
    UnpinLocked(id, it->second);
    node_->objects_.erase(it);
    ++node_->aborts_;
    return Status::OK();
  }
  Status Release(const ObjectId& id) override {
    std::lock_guard<std::mutex> lock(node_->mu_);
    auto it = node_->objects_.find(id);
    if (it == node_->objects_.end() || pins_[id] == 0) {
      return InvalidArgument("release of object " + id.Hex() + ": not held");
    }
    UnpinLocked(id, it->second);
    return Status::OK();
  }
  Result<bool> Contains(const ObjectId& id) override {
    std::lock_guard<std::mutex> lock(node_->mu_);
    auto it = node_->objects_.find(id);
    return it != node_->objects_.end() && it->second.sealed;
  }
  int64_t memory_capacity() const override { return static_cast<int64_t>(node_->capacity_); }
  bool healthy() const override { return serial_ != node_->broken_serial_.load(); }
  std::vector<plasma::SegmentInfo> Segments() const override { return {node_->Segment()}; }
  void SetSegmentCallbacks(SegmentCallback, SegmentCallback) override {}  // never unmaps

 private:
  void PinLocked(const ObjectId& id, FakeStoreNode::Object& o) {
    ++o.pins;
    ++pins_[id];
  }
  void UnpinLocked(const ObjectId& id, FakeStoreNode::Object& o) {
    --o.pins;
    --pins_[id];
  }

  std::shared_ptr<FakeStoreNode> node_;
  const int serial_;  // the how-manyth connection to the node this is (from 0)
  std::map<ObjectId, int> pins_;
};

inline StoreConnector FakeStoreNode::Connector() {
  std::shared_ptr<FakeStoreNode> self = shared_from_this();
  return [self]() -> Result<std::shared_ptr<LocalStore>> {
    return std::shared_ptr<LocalStore>(std::make_shared<FakeStoreConnection>(self));
  };
}

// Agents of one test, by address, calling each other's Lease and Release directly.
struct FakeNetwork {
  std::mutex mu;
  std::map<std::string, Agent*> agents;
  // Alters what a source answers (a source that describes its fabric wrongly, say).
  std::function<void(const std::string& source, v1::LeaseReply&)> tamper_lease;
  // A lease call's outcome before it reaches the source (not OK: the call failed in transit, as
  // GrpcPeerCalls says such a failure; the source never sees it).
  std::function<Status(const std::string& source)> fail_lease;
  // The same after the source granted the lease: its reply is lost on the way back.
  std::function<Status(const std::string& source)> lose_lease_reply;
  // Releases are answered this much later, on a thread of their own.
  std::chrono::milliseconds release_delay{0};
  int leases_asked = 0;
  int releases_delivered = 0;

  Agent* At(const std::string& address) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = agents.find(address);
    return it == agents.end() ? nullptr : it->second;
  }
};

class FakePeerCalls final : public PeerCalls {
 public:
  // `self`: the calling agent's host, as the source sees it (the per-requester bound).
  FakePeerCalls(std::shared_ptr<FakeNetwork> network, std::string self)
      : network_(std::move(network)), self_(std::move(self)) {}
  ~FakePeerCalls() override {
    for (std::thread& t : late_) t.join();
  }

  class Call final : public PeerCall {
   public:
    void Cancel() override {}  // every call here is answered at once or after release_delay
  };
  std::unique_ptr<PeerCall> NewCall() override { return std::make_unique<Call>(); }

  void StartLease(PeerCall&, const std::string& address, const v1::LeaseRequest& request,
                  v1::LeaseReply& reply, std::chrono::steady_clock::time_point,
                  Done done) override {
    Agent* source = network_->At(address);
    if (source == nullptr) return done(Unavailable("no agent at " + address));
    std::function<void(const std::string&, v1::LeaseReply&)> tamper;
    std::function<Status(const std::string&)> fail;
    std::function<Status(const std::string&)> lose;
    {
      std::lock_guard<std::mutex> lock(network_->mu);
      ++network_->leases_asked;
      tamper = network_->tamper_lease;
      fail = network_->fail_lease;
      lose = network_->lose_lease_reply;
    }
    if (Status failed = fail ? fail(address) : Status::OK(); !failed.ok()) return done(failed);
    reply = source->Lease(request, self_);
    if (Status lost = lose ? lose(address) : Status::OK(); !lost.ok()) {
      reply.Clear();
      return done(lost);
    }
    if (tamper) tamper(address, reply);
    done(Status::OK());
  }
  void StartRelease(PeerCall&, const std::string& address, const v1::ReleaseRequest& request,
                    v1::ReleaseReply& reply, std::chrono::steady_clock::time_point,
                    Done done) override {
    Agent* source = network_->At(address);
    if (source == nullptr) return done(Unavailable("no agent at " + address));
    auto deliver = [network = network_, source, &request, &reply, done = std::move(done)] {
      reply = source->Release(request);
      {
        std::lock_guard<std::mutex> lock(network->mu);
        ++network->releases_delivered;
      }
      done(Status::OK());
    };
    std::chrono::milliseconds delay;
    {
      std::lock_guard<std::mutex> lock(network_->mu);
      delay = network_->release_delay;
    }
    if (delay.count() == 0) return deliver();
    std::lock_guard<std::mutex> lock(mu_);
    late_.emplace_back([delay, deliver = std::move(deliver)] {
      std::this_thread::sleep_for(delay);
      deliver();
    });
  }

 private:
  std::shared_ptr<FakeNetwork> network_;
  std::string self_;
  std::mutex mu_;
  std::vector<std::thread> late_;
};

}  // namespace rayfabric::agent::testing
