// A client of a Ray raylet's plasma store (its private Unix-socket protocol), for an agent that
// reads objects out of plasma and writes replicas into it. Speaks the protocol of the pinned Ray
// version only (see docs/plasma.md). Every request is validated here before it reaches the
// socket, because the store CHECK-fails (killing the raylet and every worker on the node) on
// requests that break its state machine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rayfabric/object_id.h"
#include "rayfabric/status.h"

namespace rayfabric::plasma {

// The Ray releases whose plasma protocol this client speaks. The wire carries no version, so
// the caller (the Python layer knows ray.__version__) should pass it in ConnectOptions.
const std::vector<std::string>& SupportedRayVersions();
bool IsSupportedRayVersion(std::string_view ray_version);

// Who owns the object (Python: core_worker.get_owner_address(ref), a common_pb2.Address).
// The raylet tells this owner about the new copy when it is sealed.
struct OwnerAddress {
  std::string node_id;  // 28 raw bytes
  std::string ip_address;
  int32_t port = 0;
  std::string worker_id;  // 28 raw bytes
};

// One mapped shared-memory file of the store (the main arena, or one fallback allocation).
struct SegmentInfo {
  int32_t store_fd = -1;  // the store's fd number; with unique_fd_id, the segment's name
  int64_t unique_fd_id = 0;
  int fd = -1;  // our copy of the fd (owned by the client; valid while mapped)
  uint8_t* base = nullptr;
  size_t size = 0;  // mapped bytes
  bool fallback = false;
};

// Where one object lies. Pointers stay valid until the object is released (for a fallback
// object, Release may unmap its segment) and at most until the client is destroyed.
struct ObjectBuffer {
  ObjectId id;
  bool found = false;       // Get only: false when the object was not sealed in time
  uint8_t* data = nullptr;  // data_size bytes, then metadata_size bytes of metadata
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  uint64_t data_offset = 0;  // of `data` from the segment base
  uint8_t* segment_base = nullptr;
  size_t segment_size = 0;
  int segment_fd = -1;
  bool fallback_allocated = false;
  bool is_mutable = false;
};

struct ConnectOptions {
  // ray.__version__ of the cluster; refused unless supported. Empty: not checked.
  std::string ray_version;
  int64_t cookie = 0x5241590000000000;  // Ray's default ray_cookie (RAY_ray_cookie)
  int64_t request_timeout_ms = 30000;   // bound on any single reply
};

struct CreateOptions {
  OwnerAddress owner;
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  // false (the default): objects must fit in the store's memory (else ResourceExhausted before
  // anything is sent); when the store is full it queues the request while it evicts/spills,
  // and the client polls (every 10 ms, as Ray does) up to timeout_ms, then gives up with
  // ResourceExhausted. true: sends try_immediately, which in Ray 2.60 means "allocate now,
  // from a disk-backed fallback file if the store is full" (objects up to 1 TiB).
  // Never lift the size bound: a fallback file the store cannot create kills the raylet.
  bool allow_disk_fallback = false;
  int64_t timeout_ms = 30000;
};

class PlasmaClient {
 public:
  using SegmentCallback = std::function<void(const SegmentInfo&)>;

  // Connects and handshakes (ConnectRequest/Reply). Unavailable when nothing listens at
  // `socket_path`; VersionMismatch when the version or the store's reply is not supported.
  static Result<std::unique_ptr<PlasmaClient>> Connect(const std::string& socket_path,
                                                       const ConnectOptions& options = {});
  ~PlasmaClient();  // closes the socket (the store releases our references) and unmaps
  PlasmaClient(const PlasmaClient&) = delete;
  PlasmaClient& operator=(const PlasmaClient&) = delete;

  // Waits up to timeout_ms (0: poll; must be >= 0) for the sealed objects. One entry per id,
  // in order; found=false for those not there in time. Each found object is pinned until
  // Release (one Release per successful Get or Create).
  Result<std::vector<ObjectBuffer>> Get(const std::vector<ObjectId>& ids, int64_t timeout_ms);
  // Get of one object; NotFound when it is not sealed in the store within timeout_ms.
  Result<ObjectBuffer> GetOne(const ObjectId& id, int64_t timeout_ms);
  // The NotFound that GetOne answers for an object Get did not find within timeout_ms.
  Status NotSealed(const ObjectId& id, int64_t timeout_ms) const;

  // Allocates an unsealed object to fill through `data`; then Seal (and Release) or Abort.
  // While the store makes room, the client's lock is released between polls (other requests on
  // this connection go through). A create given up at its timeout_ms (ResourceExhausted) stays
  // queued in the store, since withdrawing it would mean closing the connection (and aborting
  // every other object this client created); ReapAbandonedCreates aborts it once fulfilled, and a
  // new Create of that id answers AlreadyExists until then.
  Result<ObjectBuffer> Create(const ObjectId& id, const CreateOptions& options);
  // Create of each id (options[k] for ids[k]), with the requests written back to back before
  // their replies are read: one round trip per group of requests instead of one per object.
  // One result per id, in order, each exactly what Create would answer.
  std::vector<Result<ObjectBuffer>> CreateMany(const std::vector<ObjectId>& ids,
                                               const std::vector<CreateOptions>& options);
  Result<size_t> ReapAbandonedCreates();  // how many fulfilled abandoned creates were aborted
  size_t abandoned_creates() const;
  Status Seal(const ObjectId& id);  // only an object this client created and did not seal
  // Seal of each id, then Release of each one sealed (as Seal and Release), pipelined like
  // CreateMany. One status per id, in order: the Seal's.
  std::vector<Status> SealAndRelease(const std::vector<ObjectId>& ids);
  Status Abort(const ObjectId& id);           // only an object this client created and did not seal
  Status Release(const ObjectId& id);         // a sealed object held through Get or Create+Seal
  Result<bool> Contains(const ObjectId& id);  // true only when sealed

  int64_t memory_capacity() const { return memory_capacity_; }
  const std::string& socket_path() const { return socket_path_; }
  // False once the connection broke (every call then fails): make a new client, and destroy this
  // one once nothing reads or writes its objects (destroying it closes the socket, which makes the
  // store drop its pins and abort the objects it created).
  bool healthy() const;

  // Segments mapped so far (register them with the fabric once). The callbacks run with the
  // client's lock held, from the call that maps/unmaps: they must not call back into it.
  std::vector<SegmentInfo> Segments() const;
  void SetSegmentCallbacks(SegmentCallback on_mapped, SegmentCallback on_unmapped);

  class Impl;  // connection, segments and per-object state (src/plasma)

 private:
  PlasmaClient(std::string socket_path, std::unique_ptr<Impl> impl, int64_t memory_capacity);

  std::string socket_path_;
  std::unique_ptr<Impl> impl_;
  int64_t memory_capacity_ = 0;
};

}  // namespace rayfabric::plasma
