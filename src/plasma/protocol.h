// Encoder/decoder for the plasma store's private socket protocol as spoken by Ray 2.49.0 to 2.60.0
// (the same for every message used here; docs/plasma.md).
// Pure functions over bytes: no sockets, no state, so every message can be unit tested.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "rayfabric/object_id.h"
#include "rayfabric/status.h"

namespace rayfabric::plasma {

// Ray's plasma.fbs `enum MessageType:long`. Only values rayfabric sends or expects are used;
// anything else from the store means another protocol.
enum class MessageType : int64_t {
  kDisconnectClient = 0,
  kCreateRequest = 1,
  kCreateRetryRequest = 2,
  kCreateReply = 3,
  kAbortRequest = 4,
  kAbortReply = 5,
  kSealRequest = 6,
  kSealReply = 7,
  kGetRequest = 8,
  kGetReply = 9,
  kReleaseRequest = 10,
  kReleaseReply = 11,
  kDeleteRequest = 12,
  kDeleteReply = 13,
  kContainsRequest = 14,
  kContainsReply = 15,
  kConnectRequest = 16,
  kConnectReply = 17,
  kGetDebugStringRequest = 18,
  kGetDebugStringReply = 19,
};
const char* MessageTypeName(int64_t type);

// Ray's `enum PlasmaError:int`.
enum class PlasmaError : int32_t {
  kOk = 0,
  kObjectExists = 1,
  kObjectNonexistent = 2,
  kOutOfMemory = 3,
  kObjectNotSealed = 4,
  kObjectInUse = 5,
  kUnexpectedError = 6,
  kObjectSealed = 7,
  kOutOfDisk = 8,
};

// Ray's `enum ObjectSource:int`; only metrics differ between them.
enum class ObjectSource : int32_t {
  kCreatedByWorker = 0,
  kRestoredFromStorage = 1,
  kReceivedFromRemoteRaylet = 2,
  kErrorStoredByRaylet = 3,
};

// Every message: int64 cookie | int64 type | uint64 length | flatbuffer[length], host order
// (src/ray/common/client_connection.cc). The cookie is RayConfig ray_cookie.
inline constexpr int64_t kDefaultRayCookie = 0x5241590000000000;
inline constexpr size_t kHeaderSize = 24;
// Replies are a few hundred bytes per object; anything far larger is a desync, not data.
inline constexpr uint64_t kMaxReplyBytes = 64ull << 20;

struct MessageHeader {
  int64_t cookie = 0;
  int64_t type = 0;
  uint64_t length = 0;
};
std::array<uint8_t, kHeaderSize> EncodeHeader(const MessageHeader& header);
MessageHeader DecodeHeader(const uint8_t* bytes);

// Ray's `struct PlasmaObjectSpec`.
struct ObjectSpec {
  int32_t segment_index = -1;  // the store's fd number of the segment
  int64_t unique_fd_id = 0;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t data_size = 0;  // UINT64_MAX (-1) in a GetReply: object not found
  uint64_t metadata_offset = 0;
  uint64_t metadata_size = 0;
  uint64_t allocated_size = 0;
  bool fallback_allocated = false;
  int32_t device_num = 0;
  bool is_experimental_mutable_object = false;

  bool found() const { return static_cast<int64_t>(data_size) != -1; }
};

// A segment as the store names it: its own fd number plus a per-fd unique id (fd reuse).
struct SegmentKey {
  int32_t store_fd = -1;
  int64_t unique_fd_id = 0;
  bool operator==(const SegmentKey& o) const {
    return store_fd == o.store_fd && unique_fd_id == o.unique_fd_id;
  }
  bool operator<(const SegmentKey& o) const {
    return store_fd != o.store_fd ? store_fd < o.store_fd : unique_fd_id < o.unique_fd_id;
  }
};

struct CreateRequestFields {
  ObjectId object_id;
  std::string owner_node_id;     // 28 raw bytes
  std::string owner_ip_address;  // e.g. "10.0.0.1"
  int32_t owner_port = 0;
  std::string owner_worker_id;  // 28 raw bytes
  uint64_t data_size = 0;
  uint64_t metadata_size = 0;
  ObjectSource source = ObjectSource::kReceivedFromRemoteRaylet;
  bool try_immediately = false;
};

// Encoders return the flatbuffer payload (no header). They never emit a null string field:
// the store dereferences every string without checking.
std::vector<uint8_t> EncodeConnectRequest();
std::vector<uint8_t> EncodeCreateRequest(const CreateRequestFields& fields);
std::vector<uint8_t> EncodeCreateRetryRequest(const ObjectId& id, uint64_t request_id);
std::vector<uint8_t> EncodeSealRequest(const ObjectId& id);
std::vector<uint8_t> EncodeAbortRequest(const ObjectId& id);
std::vector<uint8_t> EncodeReleaseRequest(const ObjectId& id, bool may_unmap);
std::vector<uint8_t> EncodeContainsRequest(const ObjectId& id);
std::vector<uint8_t> EncodeGetRequest(const std::vector<ObjectId>& ids, int64_t timeout_ms);

struct ConnectReply {
  int64_t memory_capacity = 0;
};
struct CreateReply {
  std::string object_id;
  uint64_t retry_with_request_id = 0;
  bool has_object = false;
  ObjectSpec object;
  int32_t error = 0;
  SegmentKey segment;
  int64_t mmap_size = 0;
};
struct GetReply {
  std::vector<std::string> object_ids;
  std::vector<ObjectSpec> objects;
  std::vector<SegmentKey> segments;  // store_fds + unique_fd_ids, pairwise
  std::vector<int64_t> mmap_sizes;
};
struct SealReply {
  std::string object_id;
  int32_t error = 0;
};
struct AbortReply {
  std::string object_id;
};
struct ReleaseReply {
  std::string object_id;
  bool should_unmap = false;
  int32_t error = 0;
};
struct ContainsReply {
  std::string object_id;
  bool has_object = false;
};

// Decoders run the flatbuffers verifier first: a reply that does not verify, or lacks a field
// Ray 2.60.0 always sends, is VersionMismatch (another Ray speaks another protocol).
Result<ConnectReply> DecodeConnectReply(const std::vector<uint8_t>& payload);
Result<CreateReply> DecodeCreateReply(const std::vector<uint8_t>& payload);
Result<GetReply> DecodeGetReply(const std::vector<uint8_t>& payload);
Result<SealReply> DecodeSealReply(const std::vector<uint8_t>& payload);
Result<AbortReply> DecodeAbortReply(const std::vector<uint8_t>& payload);
Result<ReleaseReply> DecodeReleaseReply(const std::vector<uint8_t>& payload);
Result<ContainsReply> DecodeContainsReply(const std::vector<uint8_t>& payload);

// Maps a PlasmaError to a Status whose message says what happened and what to do.
// `what` names the operation and object ("create of object 1a2b.. (8388608 bytes)").
Status PlasmaErrorToStatus(int32_t error, const std::string& what);

// "Ray 2.49.0 to 2.60.0"-style text naming the versions whose protocol this code speaks.
std::string SupportedRayVersionsText();

}  // namespace rayfabric::plasma
