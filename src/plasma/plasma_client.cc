#include "rayfabric/plasma_client.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "common/unix_socket.h"
#include "plasma/protocol.h"
#include "rayfabric/log.h"

namespace rayfabric::plasma {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kRayIdSize = 28;  // NodeID and WorkerID, like ObjectID, are 28 bytes in Ray
// The store maps each segment with 8 bytes more than it hands out (Ray's kMmapRegionsGap);
// clients map mmap_size - 8.
constexpr int64_t kMmapRegionsGap = 8;
// The store aborts (FATAL) when it cannot create a fallback file (e.g. ftruncate: EFBIG), so
// disk-fallback objects are bounded well below any filesystem's file size limit.
constexpr uint64_t kMaxFallbackObjectBytes = 1ull << 40;
constexpr int64_t kMaxSegmentBytes = 1ll << 50;
constexpr size_t kMaxIdsPerGet = 100000;
constexpr int64_t kMaxTimeoutMs = 24ll * 3600 * 1000;
constexpr auto kCreateRetryInterval = std::chrono::milliseconds(10);  // what Ray's client waits
// Requests written back to back before their replies are read (CreateMany, SealAndRelease):
// a few KiB each way, far below a Unix socket's buffer, so neither side blocks writing while the
// other does.
constexpr size_t kPipelineDepth = 64;

std::string Short(const ObjectId& id) { return id.Hex().substr(0, 16) + ".."; }

bool AddOverflows(uint64_t a, uint64_t b) { return a > UINT64_MAX - b; }

// The store's files mapped once per process: every connection of this process to the store
// receives the same file (its own fd for it); mapping it once means one address range, so the
// fabric layer registers it once (the agent's two connections used to map and register the
// store's arena twice). Keyed by the file (device, inode) and size; refcounted by connections.
class SharedMappings {
 public:
  static SharedMappings& Instance() {
    static SharedMappings instance;
    return instance;
  }

  Result<uint8_t*> Map(int fd, size_t size) {
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      return ResourceExhausted(std::string("fstat of a plasma segment failed: ") +
                               std::strerror(errno));
    }
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{st.st_dev, st.st_ino, size};
    auto it = by_file_.find(key);
    if (it != by_file_.end()) {
      ++it->second.refs;
      return it->second.base;
    }
    void* base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      return ResourceExhausted("mmap of a plasma segment (" + std::to_string(size) +
                               " bytes) failed: " + std::strerror(errno));
    }
    by_file_[key] = Entry{static_cast<uint8_t*>(base), 1};
    return static_cast<uint8_t*>(base);
  }

  // Drops one connection's use of the mapping. The last one runs `before_unmap` (e.g. the
  // fabric deregisters the memory) and then unmaps it.
  void Unmap(uint8_t* base, size_t size, const std::function<void()>& before_unmap) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = by_file_.begin(); it != by_file_.end(); ++it) {
      if (it->second.base != base || std::get<2>(it->first) != size) continue;
      if (--it->second.refs > 0) return;
      if (before_unmap) before_unmap();
      ::munmap(base, size);
      by_file_.erase(it);
      return;
    }
  }

 private:
  using Key = std::tuple<dev_t, ino_t, size_t>;
  struct Entry {
    uint8_t* base;
    int refs;
  };
  std::mutex mu_;
  std::map<Key, Entry> by_file_;
};

}  // namespace

const std::vector<std::string>& SupportedRayVersions() {
  // Every release whose raylet speaks exactly 2.60.0's protocol for what this client sends and
  // reads (compared in the raylet binaries of each wheel; docs/plasma.md "Ray releases").
  static const std::vector<std::string> kVersions = {
      "2.49.0", "2.49.1", "2.49.2", "2.50.0", "2.50.1", "2.51.0", "2.51.1", "2.51.2",
      "2.52.0", "2.52.1", "2.53.0", "2.54.0", "2.54.1", "2.55.0", "2.55.1", "2.56.0",
      "2.56.1", "2.57.0", "2.57.1", "2.58.0", "2.58.1", "2.59.0", "2.60.0"};
  return kVersions;
}

bool IsSupportedRayVersion(std::string_view ray_version) {
  const auto& v = SupportedRayVersions();
  return std::find(v.begin(), v.end(), ray_version) != v.end();
}

class PlasmaClient::Impl {
 public:
  Impl(UnixStream stream, ConnectOptions options)
      : stream_(std::move(stream)), options_(std::move(options)) {}

  ~Impl() {
    // Closing the socket first lets the store drop our references (and abort what we created
    // but never sealed) before the memory disappears from this process.
    stream_.Close();
    // The owner is told before the memory goes, and only if it goes (another connection may
    // still map the file).
    for (auto& [key, seg] : segments_) Unmap(key, seg);
  }

  // `deadline`: the one the connect itself had (connect and handshake: one request_timeout_ms).
  Result<int64_t> Handshake(Clock::time_point deadline) {
    std::lock_guard<std::mutex> lock(mu_);
    RF_ASSIGN_OR_RETURN(std::vector<uint8_t> payload,
                        Roundtrip(MessageType::kConnectRequest, EncodeConnectRequest(),
                                  MessageType::kConnectReply, deadline));
    auto reply = DecodeConnectReply(payload);
    if (!reply.ok()) return Fail(reply.status());
    return reply->memory_capacity;
  }

  Result<std::vector<ObjectBuffer>> Get(const std::vector<ObjectId>& ids, int64_t timeout_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    RF_RETURN_IF_ERROR(CheckHealthy());
    if (ids.empty() || ids.size() > kMaxIdsPerGet) {
      return InvalidArgument("Get needs 1.." + std::to_string(kMaxIdsPerGet) + " ids, got " +
                             std::to_string(ids.size()));
    }
    if (timeout_ms < 0 || timeout_ms > kMaxTimeoutMs) {
      // -1 (wait forever) would hold this connection, and its lock, without bound.
      return InvalidArgument("Get timeout_ms must be in [0, " + std::to_string(kMaxTimeoutMs) +
                             "], got " + std::to_string(timeout_ms));
    }
    std::set<ObjectId> seen;
    for (const ObjectId& id : ids) {
      RF_RETURN_IF_ERROR(CheckId(id, "Get"));
      if (!seen.insert(id).second) {
        return InvalidArgument("Get lists object " + id.Hex() + " twice");
      }
      auto it = held_.find(id);
      if (it != held_.end() && !it->second.sealed) {
        return InvalidArgument("Get of object " + id.Hex() +
                               " that this client created and has not sealed: Seal it first");
      }
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms) +
                    std::chrono::milliseconds(options_.request_timeout_ms);
    RF_ASSIGN_OR_RETURN(std::vector<uint8_t> payload,
                        Roundtrip(MessageType::kGetRequest, EncodeGetRequest(ids, timeout_ms),
                                  MessageType::kGetReply, deadline));
    auto decoded = DecodeGetReply(payload);
    if (!decoded.ok()) return Fail(decoded.status());
    GetReply& reply = *decoded;
    if (reply.object_ids.size() != ids.size()) {
      return Fail(ProtocolError("GetReply lists " + std::to_string(reply.object_ids.size()) +
                                " objects for a request of " + std::to_string(ids.size())));
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      if (reply.object_ids[i] != ids[i].Binary()) {
        return Fail(
            ProtocolError("GetReply object " + std::to_string(i) + " is not the one requested"));
      }
    }
    // The store sends an fd after the reply for each listed segment it has not sent on this
    // connection before; receive exactly those, in order.
    for (size_t i = 0; i < reply.segments.size(); ++i) {
      bool fallback = false;
      for (const ObjectSpec& spec : reply.objects) {
        if (spec.found() && spec.segment_index == reply.segments[i].store_fd &&
            spec.unique_fd_id == reply.segments[i].unique_fd_id) {
          fallback = fallback || spec.fallback_allocated;
        }
      }
      RF_RETURN_IF_ERROR(EnsureSegment(reply.segments[i], reply.mmap_sizes[i], fallback, deadline));
    }
    // Record every pin the store now holds for us before anything can fail, so that Release
    // (or closing the connection) stays correct.
    for (size_t i = 0; i < ids.size(); ++i) {
      const ObjectSpec& spec = reply.objects[i];
      if (!spec.found()) continue;
      SegmentKey key{spec.segment_index, spec.unique_fd_id};
      auto [it, inserted] = held_.try_emplace(ids[i]);
      if (inserted) {
        it->second = Held{false, true, 0, key, spec.fallback_allocated};
        if (spec.fallback_allocated) ++fallback_users_[key];
      }
      ++it->second.local_refs;
    }
    std::vector<ObjectBuffer> out;
    out.reserve(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) {
      const ObjectSpec& spec = reply.objects[i];
      if (!spec.found()) {
        ObjectBuffer missing;
        missing.id = ids[i];
        out.push_back(missing);
        continue;
      }
      RF_ASSIGN_OR_RETURN(ObjectBuffer buffer, MakeBuffer(ids[i], spec));
      out.push_back(buffer);
    }
    return out;
  }

  Result<ObjectBuffer> Create(const ObjectId& id, const CreateOptions& o, int64_t capacity) {
    std::vector<Result<ObjectBuffer>> one = CreateMany({id}, {o}, capacity);
    return std::move(one.front());
  }

  // Every Create request of the batch is written before any reply is read (the store answers
  // each in order, at once: the object, an error, or "queued" while it makes room), in groups of
  // kPipelineDepth so that neither side's socket buffer can fill while the other writes.
  std::vector<Result<ObjectBuffer>> CreateMany(const std::vector<ObjectId>& ids,
                                               const std::vector<CreateOptions>& options,
                                               int64_t capacity) {
    std::vector<Result<ObjectBuffer>> out;
    out.reserve(ids.size());
    if (options.size() != ids.size()) {
      for (size_t k = 0; k < ids.size(); ++k) {
        out.emplace_back(InvalidArgument("CreateMany needs one CreateOptions per id"));
      }
      return out;
    }
    for (size_t k = 0; k < ids.size(); ++k) out.emplace_back(Internal("create not sent"));
    std::unique_lock<std::mutex> lock(mu_);
    for (size_t first = 0; first < ids.size(); first += kPipelineDepth) {
      CreateGroup(lock, ids, options, capacity, first, std::min(ids.size(), first + kPipelineDepth),
                  out);
    }
    return out;
  }

  Status CheckCreate(const ObjectId& id, const CreateOptions& o, int64_t capacity) const {
    RF_RETURN_IF_ERROR(CheckHealthy());
    RF_RETURN_IF_ERROR(CheckId(id, "Create"));
    RF_RETURN_IF_ERROR(CheckOwner(o.owner));
    if (held_.count(id) != 0) {
      return InvalidArgument("Create of object " + id.Hex() +
                             " that this client already holds (created or got); release it first");
    }
    if (creating_.count(id) != 0 || abandoned_.count(id) != 0) {
      return AlreadyExists("create of object " + Short(id) +
                           ": an earlier create of it on this connection is still queued in the "
                           "store (it is aborted as soon as the store fulfils it)");
    }
    if (AddOverflows(o.data_size, o.metadata_size) || o.data_size + o.metadata_size == 0 ||
        o.data_size + o.metadata_size > kMaxFallbackObjectBytes) {
      return InvalidArgument("Create of object " + id.Hex() + " with data_size " +
                             std::to_string(o.data_size) + " + metadata_size " +
                             std::to_string(o.metadata_size) + ": the total must be in [1, 2^40]");
    }
    const uint64_t total = o.data_size + o.metadata_size;
    if (!o.allow_disk_fallback && capacity > 0 && total > static_cast<uint64_t>(capacity)) {
      return ResourceExhausted("create of object " + Short(id) +
                               ": object store full: " + std::to_string(total) +
                               " bytes can never fit in this node's "
                               "object store of " +
                               std::to_string(capacity) +
                               " bytes; raise object_store_memory, allow disk fallback, or let "
                               "Ray move this object");
    }
    if (o.timeout_ms < 0 || o.timeout_ms > kMaxTimeoutMs) {
      return InvalidArgument("Create timeout_ms must be in [0, " + std::to_string(kMaxTimeoutMs) +
                             "], got " + std::to_string(o.timeout_ms));
    }
    return Status::OK();
  }

  static std::string CreateWhat(const ObjectId& id, const CreateOptions& o, int64_t capacity) {
    return "create of object " + Short(id) + " (" + std::to_string(o.data_size + o.metadata_size) +
           " bytes, store capacity " + std::to_string(capacity) + ")";
  }

  void CreateGroup(std::unique_lock<std::mutex>& lock, const std::vector<ObjectId>& ids,
                   const std::vector<CreateOptions>& options, int64_t capacity, size_t first,
                   size_t end, std::vector<Result<ObjectBuffer>>& out) {
    std::vector<size_t> sent;
    std::vector<uint8_t> message;
    const auto started = Clock::now();
    for (size_t k = first; k < end; ++k) {
      Status ok = CheckCreate(ids[k], options[k], capacity);
      if (!ok.ok()) {
        out[k] = ok;
        continue;
      }
      const CreateOptions& o = options[k];
      CreateRequestFields fields;
      fields.object_id = ids[k];
      fields.owner_node_id = o.owner.node_id;
      fields.owner_ip_address = o.owner.ip_address;
      fields.owner_port = o.owner.port;
      fields.owner_worker_id = o.owner.worker_id;
      fields.data_size = o.data_size;
      fields.metadata_size = o.metadata_size;
      fields.source = ObjectSource::kReceivedFromRemoteRaylet;
      fields.try_immediately = o.allow_disk_fallback;
      AppendMessage(message, MessageType::kCreateRequest, EncodeCreateRequest(fields));
      creating_.insert(ids[k]);  // also refuses the same id later in this batch
      sent.push_back(k);
    }
    if (sent.empty()) return;
    std::vector<std::pair<size_t, uint64_t>> queued =
        ReadCreateReplies(ids, options, capacity, sent, SendBytes(message, RequestDeadline()), out);
    ContinueQueuedCreates(lock, ids, options, capacity, started, std::move(queued), out);
  }

  // Reads the CreateReply of each request `sent` (ids[k] for k in sent, in order; `sent_status`
  // says whether they went out) into out[k], or returns it with the request id to retry with
  // when the store queued it.
  std::vector<std::pair<size_t, uint64_t>> ReadCreateReplies(
      const std::vector<ObjectId>& ids, const std::vector<CreateOptions>& options, int64_t capacity,
      const std::vector<size_t>& sent, Status sent_status, std::vector<Result<ObjectBuffer>>& out) {
    std::vector<std::pair<size_t, uint64_t>> queued;
    Status s = std::move(sent_status);
    for (size_t k : sent) {
      const ObjectId& id = ids[k];
      const CreateOptions& o = options[k];
      // Once the connection broke, the replies still due can no longer be read.
      auto payload = s.ok() ? Receive(MessageType::kCreateReply, RequestDeadline())
                            : Result<std::vector<uint8_t>>(s);
      if (!payload.ok()) {
        s = payload.status();
        out[k] = s;
        creating_.erase(id);
        continue;
      }
      auto taken =
          TakeCreateReply(id, *payload, o.data_size, o.metadata_size, CreateWhat(id, o, capacity));
      if (taken.ok() && *taken) {
        queued.emplace_back(k, **taken);  // still waiting for room
        continue;
      }
      // The object, or the store's refusal (the connection stays usable unless it broke).
      out[k] = taken.ok() ? MakeBuffer(id, last_created_) : Result<ObjectBuffer>(taken.status());
      s = CheckHealthy();
      creating_.erase(id);
    }
    return queued;
  }

  // Polls the creates the store queued (it is making room: eviction, spilling, fallback), all
  // of them every kCreateRetryInterval (their retries pipelined; the lock released in between so
  // that other requests on this connection go through), each until it is fulfilled, refused, or
  // its timeout since `started` would pass before the next poll.
  void ContinueQueuedCreates(std::unique_lock<std::mutex>& lock, const std::vector<ObjectId>& ids,
                             const std::vector<CreateOptions>& options, int64_t capacity,
                             Clock::time_point started,
                             std::vector<std::pair<size_t, uint64_t>> waiting,
                             std::vector<Result<ObjectBuffer>>& out) {
    while (!waiting.empty()) {
      std::vector<size_t> polled;
      std::vector<uint8_t> message;
      const auto now = Clock::now();
      for (const auto& [k, request_id] : waiting) {
        const CreateOptions& o = options[k];
        if (now + kCreateRetryInterval <= started + std::chrono::milliseconds(o.timeout_ms)) {
          polled.push_back(k);
          AppendMessage(message, MessageType::kCreateRetryRequest,
                        EncodeCreateRetryRequest(ids[k], request_id));
          continue;
        }
        // The request cannot be withdrawn short of closing the connection, which would also
        // abort every other replica of this connection while its bytes may still be arriving.
        // It stays queued; ReapAbandonedCreates aborts the object once the store fulfils it.
        abandoned_[ids[k]] = request_id;
        out[k] = ResourceExhausted(
            CreateWhat(ids[k], o, capacity) +
            ": object store full: the store found no room within " + std::to_string(o.timeout_ms) +
            " ms while evicting/spilling; retry later, free objects, or let Ray move it");
        creating_.erase(ids[k]);
      }
      if (polled.empty()) return;
      lock.unlock();
      std::this_thread::sleep_for(kCreateRetryInterval);
      lock.lock();
      waiting = ReadCreateReplies(ids, options, capacity, polled,
                                  SendBytes(message, RequestDeadline()), out);
    }
  }

  // Asks the store about every create given up at its timeout; aborts those it has fulfilled
  // since. Returns how many were aborted.
  Result<size_t> ReapAbandonedCreates() {
    std::lock_guard<std::mutex> lock(mu_);
    RF_RETURN_IF_ERROR(CheckHealthy());
    size_t aborted = 0;
    for (auto it = abandoned_.begin(); it != abandoned_.end();) {
      const ObjectId id = it->first;
      const std::string what = "abandoned create of object " + Short(id);
      RF_ASSIGN_OR_RETURN(
          std::vector<uint8_t> payload,
          Roundtrip(MessageType::kCreateRetryRequest, EncodeCreateRetryRequest(id, it->second),
                    MessageType::kCreateReply, RequestDeadline()));
      auto queued = TakeCreateReply(id, payload, std::nullopt, std::nullopt, what);
      if (queued.ok() && *queued) {
        it->second = **queued;  // still waiting for room
        ++it;
        continue;
      }
      it = abandoned_.erase(it);
      if (!queued.ok()) {
        if (!CheckHealthy().ok()) return queued.status();
        continue;  // the store gave up on it (an error reply): nothing was created
      }
      RF_RETURN_IF_ERROR(AbortLocked(id));
      ++aborted;
    }
    return aborted;
  }

  size_t abandoned_creates() const {
    std::lock_guard<std::mutex> lock(mu_);
    return abandoned_.size();
  }

  Status Seal(const ObjectId& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return SealGroup({id}, 0, 1, /*release=*/false).front();
  }

  // Seal of each object, then Release of those sealed, pipelined in groups as CreateMany is.
  std::vector<Status> SealAndRelease(const std::vector<ObjectId>& ids) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Status> out;
    out.reserve(ids.size());
    for (size_t first = 0; first < ids.size(); first += kPipelineDepth) {
      std::vector<Status> group =
          SealGroup(ids, first, std::min(ids.size(), first + kPipelineDepth), /*release=*/true);
      out.insert(out.end(), group.begin(), group.end());
    }
    return out;
  }

  std::vector<Status> SealGroup(const std::vector<ObjectId>& ids, size_t first, size_t end,
                                bool release) {
    std::vector<Status> out(end - first, Status::OK());
    std::vector<size_t> sent;
    std::vector<uint8_t> message;
    for (size_t k = first; k < end; ++k) {
      const ObjectId& id = ids[k];
      Status ok = CheckHealthy();
      if (ok.ok()) ok = CheckId(id, "Seal");
      auto it = held_.find(id);
      // The store CHECK-fails (raylet exits) on a Seal of a missing or sealed object.
      if (ok.ok() && (it == held_.end() || !it->second.created_here || it->second.sealed ||
                      it->second.sealing)) {
        ok = InvalidArgument("Seal of object " + id.Hex() +
                             ": only an object this client created and has not sealed or "
                             "aborted can be sealed");
      }
      if (!ok.ok()) {
        out[k - first] = ok;
        continue;
      }
      it->second.sealing = true;  // the same id twice in one batch is refused above
      AppendMessage(message, MessageType::kSealRequest, EncodeSealRequest(id));
      sent.push_back(k);
    }
    if (sent.empty()) return out;
    Status s = SendBytes(message, RequestDeadline());
    std::vector<uint8_t> releases;
    std::vector<std::pair<ObjectId, SegmentKey>> fallback_releases;
    for (size_t k : sent) {
      const ObjectId& id = ids[k];
      Held& held = held_[id];
      held.sealing = false;
      if (s.ok()) {
        auto payload = Receive(MessageType::kSealReply, RequestDeadline());
        if (!payload.ok()) s = payload.status();
        if (s.ok()) {
          auto reply = DecodeSealReply(*payload);
          if (!reply.ok()) {
            s = Fail(reply.status());
          } else if (reply->object_id != id.Binary()) {
            s = Fail(ProtocolError("SealReply for another object"));
          }
          if (s.ok()) {
            Status sealed = PlasmaErrorToStatus(reply->error, "seal of object " + Short(id));
            out[k - first] = sealed;
            if (sealed.ok()) {
              held.sealed = true;
              if (release) ReleaseSealed(id, releases, fallback_releases);
            }
            continue;
          }
        }
      }
      out[k - first] = s;  // no answer read for it: the connection is broken
    }
    // Only once every seal reply is read: a release's own reply must not be read in their place.
    if (!releases.empty()) (void)SendBytes(releases, RequestDeadline());
    for (const auto& [id, segment] : fallback_releases) (void)ReleaseFallback(id, segment);
    return out;
  }

  // Drops this client's hold on a sealed object it holds; when it was the last, the store's pin
  // goes too, by a request the caller sends: may_unmap must be true for fallback objects (the
  // store CHECK-fails otherwise) and then the store answers (a round trip each: `fallback`);
  // for the main arena it must not expect an answer (one-way: appended to `batch`).
  void ReleaseSealed(const ObjectId& id, std::vector<uint8_t>& batch,
                     std::vector<std::pair<ObjectId, SegmentKey>>& fallback) {
    auto it = held_.find(id);
    if (--it->second.local_refs > 0) return;  // the store counts one pin per client
    const Held held = it->second;
    held_.erase(it);
    if (!held.fallback) {
      AppendMessage(batch, MessageType::kReleaseRequest, EncodeReleaseRequest(id, false));
      return;
    }
    fallback.emplace_back(id, held.segment);
  }

  Status Abort(const ObjectId& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return AbortLocked(id);
  }

  Status AbortLocked(const ObjectId& id) {
    RF_RETURN_IF_ERROR(CheckHealthy());
    RF_RETURN_IF_ERROR(CheckId(id, "Abort"));
    auto it = held_.find(id);
    // The store CHECK-fails on an Abort by a non-creator or of a sealed object.
    if (it == held_.end() || !it->second.created_here || it->second.sealed) {
      return InvalidArgument("Abort of object " + id.Hex() +
                             ": only an object this client created and has not sealed can be "
                             "aborted (a sealed one is released instead)");
    }
    RF_ASSIGN_OR_RETURN(std::vector<uint8_t> payload,
                        Roundtrip(MessageType::kAbortRequest, EncodeAbortRequest(id),
                                  MessageType::kAbortReply, RequestDeadline()));
    auto reply = DecodeAbortReply(payload);
    if (!reply.ok()) return Fail(reply.status());
    if (reply->object_id != id.Binary())
      return Fail(ProtocolError("AbortReply for another object"));
    // The store forgot a fallback segment it will send again once we no longer use it.
    Held held = it->second;
    held_.erase(it);
    if (held.fallback) DropFallbackUser(held.segment, /*store_says_unmap=*/std::nullopt);
    return Status::OK();
  }

  Status Release(const ObjectId& id) {
    std::lock_guard<std::mutex> lock(mu_);
    RF_RETURN_IF_ERROR(CheckHealthy());
    RF_RETURN_IF_ERROR(CheckId(id, "Release"));
    auto it = held_.find(id);
    if (it == held_.end()) {
      return InvalidArgument("Release of object " + id.Hex() + " that this client does not hold");
    }
    // The store CHECK-fails on a Release of the releasing client's own unsealed object.
    if (!it->second.sealed) {
      return InvalidArgument("Release of object " + id.Hex() +
                             " that this client created and has not sealed: Seal or Abort it");
    }
    std::vector<uint8_t> one_way;
    std::vector<std::pair<ObjectId, SegmentKey>> answered;
    ReleaseSealed(id, one_way, answered);
    if (!one_way.empty()) return SendBytes(one_way, RequestDeadline());
    if (!answered.empty()) return ReleaseFallback(id, answered.front().second);
    return Status::OK();  // pinned by another Get of this client still
  }

  Status ReleaseFallback(const ObjectId& id, const SegmentKey& segment) {
    RF_ASSIGN_OR_RETURN(std::vector<uint8_t> payload,
                        Roundtrip(MessageType::kReleaseRequest, EncodeReleaseRequest(id, true),
                                  MessageType::kReleaseReply, RequestDeadline()));
    auto reply = DecodeReleaseReply(payload);
    if (!reply.ok()) return Fail(reply.status());
    if (reply->object_id != id.Binary()) {
      return Fail(ProtocolError("ReleaseReply for another object"));
    }
    DropFallbackUser(segment, reply->should_unmap);
    return PlasmaErrorToStatus(reply->error, "release of object " + Short(id));
  }

  Result<bool> Contains(const ObjectId& id) {
    std::lock_guard<std::mutex> lock(mu_);
    RF_RETURN_IF_ERROR(CheckHealthy());
    RF_RETURN_IF_ERROR(CheckId(id, "Contains"));
    RF_ASSIGN_OR_RETURN(std::vector<uint8_t> payload,
                        Roundtrip(MessageType::kContainsRequest, EncodeContainsRequest(id),
                                  MessageType::kContainsReply, RequestDeadline()));
    auto reply = DecodeContainsReply(payload);
    if (!reply.ok()) return Fail(reply.status());
    if (reply->object_id != id.Binary()) {
      return Fail(ProtocolError("ContainsReply for another object"));
    }
    return reply->has_object;
  }

  bool healthy() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !broken_;
  }

  std::vector<SegmentInfo> Segments() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<SegmentInfo> out;
    for (const auto& [key, seg] : segments_) out.push_back(Info(key, seg));
    return out;
  }

  void SetSegmentCallbacks(SegmentCallback on_mapped, SegmentCallback on_unmapped) {
    std::lock_guard<std::mutex> lock(mu_);
    on_mapped_ = std::move(on_mapped);
    on_unmapped_ = std::move(on_unmapped);
  }

 private:
  struct Segment {
    UniqueFd fd;
    uint8_t* base = nullptr;
    size_t size = 0;
    bool fallback = false;
  };
  // What the store believes about one object and this connection.
  struct Held {
    bool created_here = false;  // Create succeeded on this connection
    bool sealed = false;
    int local_refs = 0;  // our Gets/Creates; the store holds one pin until this reaches 0
    SegmentKey segment;
    bool fallback = false;
    bool sealing = false;  // its Seal is in a batch whose reply is not read yet
  };

  // Reads one CreateReply for `id`: nullopt when the object was created (then held_ knows it and
  // last_created_ describes it), the request id to retry with when the store queued it, or the
  // error. Sizes are checked when given.
  Result<std::optional<uint64_t>> TakeCreateReply(const ObjectId& id,
                                                  const std::vector<uint8_t>& payload,
                                                  std::optional<uint64_t> data_size,
                                                  std::optional<uint64_t> metadata_size,
                                                  const std::string& what) {
    auto decoded = DecodeCreateReply(payload);
    if (!decoded.ok()) return Fail(decoded.status());
    const CreateReply& reply = *decoded;
    if (reply.object_id != id.Binary()) {
      return Fail(ProtocolError("CreateReply names another object than " + id.Hex()));
    }
    if (reply.error != static_cast<int32_t>(PlasmaError::kOk)) {
      // No object and no fd follow an error: the connection stays usable.
      return PlasmaErrorToStatus(reply.error, what);
    }
    if (reply.retry_with_request_id > 0)
      return std::optional<uint64_t>(reply.retry_with_request_id);
    if (!reply.has_object) return Fail(VersionMismatch("CreateReply without plasma_object"));
    const ObjectSpec& spec = reply.object;
    if ((data_size && spec.data_size != *data_size) ||
        (metadata_size && spec.metadata_size != *metadata_size)) {
      return Fail(ProtocolError(what + ": store allocated " + std::to_string(spec.data_size) + "+" +
                                std::to_string(spec.metadata_size) + " bytes"));
    }
    SegmentKey key = reply.segment;
    RF_RETURN_IF_ERROR(
        EnsureSegment(key, reply.mmap_size, spec.fallback_allocated, RequestDeadline()));
    held_[id] = Held{true, false, 1, key, spec.fallback_allocated};
    if (spec.fallback_allocated) ++fallback_users_[key];
    last_created_ = spec;
    last_created_.segment_index = key.store_fd;
    last_created_.unique_fd_id = key.unique_fd_id;
    return std::optional<uint64_t>();
  }

  Clock::time_point RequestDeadline() const {
    return Clock::now() + std::chrono::milliseconds(options_.request_timeout_ms);
  }

  Status CheckHealthy() const {
    if (broken_) {
      return Unavailable("the plasma store connection is closed after an earlier error (" +
                         broken_reason_ + "); connect a new client");
    }
    return Status::OK();
  }

  static Status CheckId(const ObjectId& id, const char* op) {
    if (id.IsNil()) return InvalidArgument(std::string(op) + " of the nil object id");
    return Status::OK();
  }

  static Status CheckOwner(const OwnerAddress& owner) {
    if (owner.node_id.size() != kRayIdSize || owner.worker_id.size() != kRayIdSize) {
      return InvalidArgument("owner node_id and worker_id must be 28 raw bytes each (got " +
                             std::to_string(owner.node_id.size()) + " and " +
                             std::to_string(owner.worker_id.size()) +
                             "): take them from core_worker.get_owner_address(ref)");
    }
    if (owner.ip_address.empty() || owner.ip_address.size() > 255 ||
        owner.ip_address.find('\0') != std::string::npos) {
      return InvalidArgument("owner ip_address '" + owner.ip_address + "' is empty or malformed");
    }
    if (owner.port <= 0 || owner.port > 65535) {
      return InvalidArgument("owner port " + std::to_string(owner.port) + " is not in 1..65535");
    }
    return Status::OK();
  }

  // Marks the connection unusable: after an I/O or protocol error we can no longer tell where
  // one message ends. The socket stays open until the client is destroyed: closing it is how the
  // store learns to drop our pins and abort what we created, and the owner must first make sure
  // nothing still reads or writes that memory (in-flight fabric transfers).
  Status Fail(Status status) {
    if (!broken_) {
      broken_ = true;
      broken_reason_ = status.ToString();
      RF_LOG(kWarn, "plasma client: the store connection is broken: "
                        << broken_reason_ << " (closed once its users are done)");
    }
    return status;
  }

  void AppendMessage(std::vector<uint8_t>& out, MessageType type,
                     const std::vector<uint8_t>& payload) const {
    MessageHeader header{options_.cookie, static_cast<int64_t>(type), payload.size()};
    auto bytes = EncodeHeader(header);
    out.insert(out.end(), bytes.begin(), bytes.end());
    out.insert(out.end(), payload.begin(), payload.end());
  }

  Status SendBytes(const std::vector<uint8_t>& message, Clock::time_point deadline) {
    // After a failure the store's framing may be off (a half-written message): more bytes would
    // be read as garbage, and the store closing the connection aborts every unsealed replica.
    RF_RETURN_IF_ERROR(CheckHealthy());
    Status s = stream_.SendAll(message.data(), message.size(), deadline);
    if (!s.ok()) return Fail(s);
    return Status::OK();
  }

  Status Send(MessageType type, const std::vector<uint8_t>& payload, Clock::time_point deadline) {
    std::vector<uint8_t> message;
    AppendMessage(message, type, payload);
    return SendBytes(message, deadline);
  }

  Result<std::vector<uint8_t>> Receive(MessageType expected, Clock::time_point deadline) {
    uint8_t raw[kHeaderSize];
    Status s = stream_.RecvExact(raw, sizeof(raw), deadline);
    if (!s.ok()) return Fail(s);
    MessageHeader header = DecodeHeader(raw);
    if (header.cookie != options_.cookie) {
      return Fail(
          VersionMismatch("the plasma store's reply does not start with the Ray cookie (got 0x" +
                          BytesToHex(std::string(reinterpret_cast<char*>(raw), 8)) +
                          "): another protocol, or RAY_ray_cookie differs; this client speaks " +
                          SupportedRayVersionsText()));
    }
    if (header.type != static_cast<int64_t>(expected)) {
      return Fail(VersionMismatch(
          std::string("the plasma store answered message type ") + std::to_string(header.type) +
          " (" + MessageTypeName(header.type) + " in " + SupportedRayVersionsText() + ") where " +
          MessageTypeName(static_cast<int64_t>(expected)) +
          " was due: the store speaks another protocol version"));
    }
    if (header.length > kMaxReplyBytes) {
      return Fail(ProtocolError("plasma reply of " + std::to_string(header.length) +
                                " bytes is implausibly large"));
    }
    std::vector<uint8_t> payload(header.length);
    s = stream_.RecvExact(payload.data(), payload.size(), deadline);
    if (!s.ok()) return Fail(s);
    return payload;
  }

  Result<std::vector<uint8_t>> Roundtrip(MessageType type, const std::vector<uint8_t>& payload,
                                         MessageType reply_type, Clock::time_point deadline) {
    RF_RETURN_IF_ERROR(Send(type, payload, deadline));
    return Receive(reply_type, deadline);
  }

  // Receives and maps the segment's fd unless this connection already has it: the store sends
  // each (fd, unique id) once per connection and there is no flag saying an fd follows.
  Status EnsureSegment(const SegmentKey& key, int64_t mmap_size, bool fallback,
                       Clock::time_point deadline) {
    if (segments_.count(key) != 0) return Status::OK();
    auto fd = stream_.RecvFd(deadline);
    if (!fd.ok()) return Fail(fd.status());
    if (mmap_size <= kMmapRegionsGap || mmap_size > kMaxSegmentBytes) {
      return Fail(ProtocolError("plasma segment mmap_size " + std::to_string(mmap_size) +
                                " is implausible"));
    }
    Segment seg;
    seg.size = static_cast<size_t>(mmap_size - kMmapRegionsGap);
    auto base = SharedMappings::Instance().Map(fd->get(), seg.size);
    if (!base.ok()) return Fail(base.status());
    seg.base = *base;
    seg.fd = std::move(*fd);
    seg.fallback = fallback;
    auto& stored = segments_[key] = std::move(seg);
    RF_LOG(kInfo, "plasma client: mapped segment fd " << key.store_fd << "/" << key.unique_fd_id
                                                      << " (" << stored.size << " bytes"
                                                      << (fallback ? ", fallback" : "") << ")");
    if (on_mapped_) on_mapped_(Info(key, stored));
    return Status::OK();
  }

  // One of our objects on a fallback segment is gone; the store forgets the segment (and will
  // resend its fd) when none is left. `store_says_unmap` is the store's verdict when it gave one.
  void DropFallbackUser(const SegmentKey& key, std::optional<bool> store_says_unmap) {
    int left = --fallback_users_[key];
    bool unmap = store_says_unmap.value_or(left <= 0);
    if (store_says_unmap.has_value() && *store_says_unmap != (left <= 0)) {
      RF_LOG(kWarn, "plasma client: store and client disagree whether fallback segment "
                        << key.store_fd << " is still used; following the store");
    }
    if (!unmap) return;
    fallback_users_.erase(key);
    auto it = segments_.find(key);
    if (it == segments_.end()) return;
    Unmap(key, it->second);
    segments_.erase(it);
  }

  // Drops this connection's use of the mapping; if it was the last, on_unmapped_ runs first.
  void Unmap(const SegmentKey& key, Segment& seg) {
    if (seg.base != nullptr) {
      const SegmentInfo info = Info(key, seg);
      SharedMappings::Instance().Unmap(seg.base, seg.size, [&] {
        if (on_unmapped_) on_unmapped_(info);
      });
    }
    seg.base = nullptr;
    seg.fd.Reset();
  }

  static SegmentInfo Info(const SegmentKey& key, const Segment& seg) {
    return SegmentInfo{key.store_fd, key.unique_fd_id, seg.fd.get(),
                       seg.base,     seg.size,         seg.fallback};
  }

  Result<ObjectBuffer> MakeBuffer(const ObjectId& id, const ObjectSpec& spec) {
    auto it = segments_.find(SegmentKey{spec.segment_index, spec.unique_fd_id});
    if (it == segments_.end()) {
      return Fail(ProtocolError("object " + id.Hex() + " lies in segment " +
                                std::to_string(spec.segment_index) +
                                " whose fd this connection never received"));
    }
    const Segment& seg = it->second;
    if (AddOverflows(spec.data_size, spec.metadata_size) ||
        AddOverflows(spec.data_offset, spec.data_size + spec.metadata_size) ||
        spec.data_offset + spec.data_size + spec.metadata_size > seg.size ||
        (spec.metadata_size > 0 && spec.metadata_offset != spec.data_offset + spec.data_size)) {
      return Fail(ProtocolError(
          "object " + id.Hex() + " at offset " + std::to_string(spec.data_offset) + " (+" +
          std::to_string(spec.data_size) + "+" + std::to_string(spec.metadata_size) +
          ") does not lie contiguously inside its segment of " + std::to_string(seg.size) +
          " bytes"));
    }
    ObjectBuffer b;
    b.id = id;
    b.found = true;
    b.data = seg.base + spec.data_offset;
    b.data_size = spec.data_size;
    b.metadata_size = spec.metadata_size;
    b.data_offset = spec.data_offset;
    b.segment_base = seg.base;
    b.segment_size = seg.size;
    b.segment_fd = seg.fd.get();
    b.fallback_allocated = spec.fallback_allocated;
    b.is_mutable = spec.is_experimental_mutable_object;
    return b;
  }

  mutable std::mutex mu_;  // one request outstanding per connection, and all state below
  UnixStream stream_;
  ConnectOptions options_;
  bool broken_ = false;
  std::string broken_reason_;
  std::map<SegmentKey, Segment> segments_;  // mirrors the store's per-connection fd set
  std::map<SegmentKey, int> fallback_users_;
  std::unordered_map<ObjectId, Held> held_;
  std::set<ObjectId> creating_;             // Creates waiting for room (lock released)
  std::map<ObjectId, uint64_t> abandoned_;  // given up at their timeout: request id
  ObjectSpec last_created_;
  SegmentCallback on_mapped_;
  SegmentCallback on_unmapped_;
};

Result<std::unique_ptr<PlasmaClient>> PlasmaClient::Connect(const std::string& socket_path,
                                                            const ConnectOptions& options) {
  if (!options.ray_version.empty() && !IsSupportedRayVersion(options.ray_version)) {
    return VersionMismatch("Ray " + options.ray_version +
                           " is not supported: rayfabric speaks the plasma protocol of " +
                           SupportedRayVersionsText() +
                           " only; install that Ray version or a rayfabric built for yours");
  }
  if (options.request_timeout_ms <= 0 || options.request_timeout_ms > kMaxTimeoutMs) {
    return InvalidArgument("request_timeout_ms must be in [1, " + std::to_string(kMaxTimeoutMs) +
                           "]");
  }
  const Clock::time_point deadline =
      Clock::now() + std::chrono::milliseconds(options.request_timeout_ms);
  auto stream = UnixStream::Connect(socket_path, "the plasma store (the raylet)", deadline);
  if (!stream.ok()) {
    if (stream.status().code() != StatusCode::kUnavailable) {
      return stream.status().WithContext("connecting to the plasma store");
    }
    return Unavailable(stream.status().message() +
                       "; is the raylet of this node running, and is this the socket of its "
                       "session (ray.nodes()[i]['ObjectStoreSocketName'])?");
  }
  auto impl = std::make_unique<Impl>(std::move(*stream), options);
  auto capacity = impl->Handshake(deadline);
  if (!capacity.ok()) return capacity.status().WithContext("plasma store at " + socket_path);
  RF_LOG(kInfo,
         "plasma client: connected to " << socket_path << " (capacity " << *capacity << " bytes)");
  return std::unique_ptr<PlasmaClient>(new PlasmaClient(socket_path, std::move(impl), *capacity));
}

PlasmaClient::PlasmaClient(std::string socket_path, std::unique_ptr<Impl> impl,
                           int64_t memory_capacity)
    : socket_path_(std::move(socket_path)),
      impl_(std::move(impl)),
      memory_capacity_(memory_capacity) {}

PlasmaClient::~PlasmaClient() = default;

Result<std::vector<ObjectBuffer>> PlasmaClient::Get(const std::vector<ObjectId>& ids,
                                                    int64_t timeout_ms) {
  return impl_->Get(ids, timeout_ms);
}

Result<ObjectBuffer> PlasmaClient::GetOne(const ObjectId& id, int64_t timeout_ms) {
  RF_ASSIGN_OR_RETURN(std::vector<ObjectBuffer> buffers, impl_->Get({id}, timeout_ms));
  if (!buffers[0].found) return NotSealed(id, timeout_ms);
  return buffers[0];
}

Status PlasmaClient::NotSealed(const ObjectId& id, int64_t timeout_ms) const {
  return NotFound("object " + id.Hex() + " is not sealed in the plasma store at " + socket_path_ +
                  " (waited " + std::to_string(timeout_ms) +
                  " ms): it lives on another node, was evicted/spilled, or is inlined");
}

Result<ObjectBuffer> PlasmaClient::Create(const ObjectId& id, const CreateOptions& options) {
  return impl_->Create(id, options, memory_capacity_);
}

std::vector<Result<ObjectBuffer>> PlasmaClient::CreateMany(
    const std::vector<ObjectId>& ids, const std::vector<CreateOptions>& options) {
  return impl_->CreateMany(ids, options, memory_capacity_);
}

Status PlasmaClient::Seal(const ObjectId& id) { return impl_->Seal(id); }
std::vector<Status> PlasmaClient::SealAndRelease(const std::vector<ObjectId>& ids) {
  return impl_->SealAndRelease(ids);
}
Status PlasmaClient::Abort(const ObjectId& id) { return impl_->Abort(id); }
Status PlasmaClient::Release(const ObjectId& id) { return impl_->Release(id); }
Result<bool> PlasmaClient::Contains(const ObjectId& id) { return impl_->Contains(id); }
bool PlasmaClient::healthy() const { return impl_->healthy(); }

Result<size_t> PlasmaClient::ReapAbandonedCreates() { return impl_->ReapAbandonedCreates(); }

size_t PlasmaClient::abandoned_creates() const { return impl_->abandoned_creates(); }
std::vector<SegmentInfo> PlasmaClient::Segments() const { return impl_->Segments(); }
void PlasmaClient::SetSegmentCallbacks(SegmentCallback on_mapped, SegmentCallback on_unmapped) {
  impl_->SetSegmentCallbacks(std::move(on_mapped), std::move(on_unmapped));
}

}  // namespace rayfabric::plasma
