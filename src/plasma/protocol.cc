#include "plasma/protocol.h"

#include <cstring>

#include "flatbuffers/flatbuffers.h"
#include "plasma_wire_generated.h"

namespace rayfabric::plasma {
namespace {

namespace fb = ::flatbuffers;

// The struct layout is the protocol: size and field offsets must be Ray's PlasmaObjectSpec.
static_assert(sizeof(wire::ObjectSpec) == 80, "ObjectSpec layout differs from Ray's");

template <typename Table>
Result<const Table*> VerifiedRoot(const std::vector<uint8_t>& payload, const char* table_name) {
  fb::Verifier verifier(payload.data(), payload.size());
  if (payload.size() < sizeof(fb::uoffset_t) || !verifier.VerifyBuffer<Table>(nullptr)) {
    return VersionMismatch(std::string("the plasma store's ") + table_name + " (" +
                           std::to_string(payload.size()) +
                           " bytes) is not the flatbuffer this client expects; it speaks the "
                           "protocol of " +
                           SupportedRayVersionsText() + " only: install a supported Ray version");
  }
  return fb::GetRoot<Table>(payload.data());
}

Status MissingField(const char* table_name, const char* field) {
  return VersionMismatch(std::string("the plasma store's ") + table_name + " lacks field '" +
                         field + "' that " + SupportedRayVersionsText() +
                         " always sends: the Ray version differs from the supported one");
}

std::vector<uint8_t> Finish(fb::FlatBufferBuilder& fbb) {
  return std::vector<uint8_t>(fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
}

fb::Offset<fb::String> IdString(fb::FlatBufferBuilder& fbb, const ObjectId& id) {
  return fbb.CreateString(reinterpret_cast<const char*>(id.bytes().data()), ObjectId::kSize);
}

ObjectSpec FromWire(const wire::ObjectSpec& w) {
  ObjectSpec s;
  s.segment_index = w.segment_index();
  s.unique_fd_id = w.unique_fd_id();
  s.header_offset = w.header_offset();
  s.data_offset = w.data_offset();
  s.data_size = w.data_size();
  s.metadata_offset = w.metadata_offset();
  s.metadata_size = w.metadata_size();
  s.allocated_size = w.allocated_size();
  s.fallback_allocated = w.fallback_allocated();
  s.device_num = w.device_num();
  s.is_experimental_mutable_object = w.is_experimental_mutable_object();
  return s;
}

}  // namespace

std::string SupportedRayVersionsText() { return "Ray 2.49.0 to 2.60.0"; }

const char* MessageTypeName(int64_t type) {
  static const char* const kNames[] = {
      "DisconnectClient", "CreateRequest", "CreateRetryRequest",    "CreateReply",
      "AbortRequest",     "AbortReply",    "SealRequest",           "SealReply",
      "GetRequest",       "GetReply",      "ReleaseRequest",        "ReleaseReply",
      "DeleteRequest",    "DeleteReply",   "ContainsRequest",       "ContainsReply",
      "ConnectRequest",   "ConnectReply",  "GetDebugStringRequest", "GetDebugStringReply"};
  if (type < 0 || type >= static_cast<int64_t>(sizeof(kNames) / sizeof(kNames[0]))) {
    return "unknown";
  }
  return kNames[type];
}

std::array<uint8_t, kHeaderSize> EncodeHeader(const MessageHeader& header) {
  std::array<uint8_t, kHeaderSize> out{};
  std::memcpy(out.data(), &header.cookie, 8);
  std::memcpy(out.data() + 8, &header.type, 8);
  std::memcpy(out.data() + 16, &header.length, 8);
  return out;
}

MessageHeader DecodeHeader(const uint8_t* bytes) {
  MessageHeader h;
  std::memcpy(&h.cookie, bytes, 8);
  std::memcpy(&h.type, bytes + 8, 8);
  std::memcpy(&h.length, bytes + 16, 8);
  return h;
}

std::vector<uint8_t> EncodeConnectRequest() {
  fb::FlatBufferBuilder fbb(64);
  wire::ConnectRequestBuilder b(fbb);
  fbb.Finish(b.Finish());
  return Finish(fbb);
}

std::vector<uint8_t> EncodeCreateRequest(const CreateRequestFields& f) {
  fb::FlatBufferBuilder fbb(256);
  auto id = IdString(fbb, f.object_id);
  auto node = fbb.CreateString(f.owner_node_id);
  auto ip = fbb.CreateString(f.owner_ip_address);
  auto worker = fbb.CreateString(f.owner_worker_id);
  wire::CreateRequestBuilder b(fbb);
  b.add_object_id(id);
  b.add_owner_node_id(node);
  b.add_owner_ip_address(ip);
  b.add_owner_port(f.owner_port);
  b.add_owner_worker_id(worker);
  b.add_is_mutable(false);  // mutable (compiled-graph) objects are Ray's business
  b.add_data_size(f.data_size);
  b.add_metadata_size(f.metadata_size);
  b.add_source(static_cast<int32_t>(f.source));
  b.add_device_num(0);  // CPU memory only: a GPU object comes without an fd
  b.add_try_immediately(f.try_immediately);
  fbb.Finish(b.Finish());
  return Finish(fbb);
}

std::vector<uint8_t> EncodeCreateRetryRequest(const ObjectId& id, uint64_t request_id) {
  fb::FlatBufferBuilder fbb(64);
  auto s = IdString(fbb, id);
  fbb.Finish(wire::CreateCreateRetryRequest(fbb, s, request_id));
  return Finish(fbb);
}

std::vector<uint8_t> EncodeSealRequest(const ObjectId& id) {
  fb::FlatBufferBuilder fbb(64);
  auto s = IdString(fbb, id);
  fbb.Finish(wire::CreateSealRequest(fbb, s));
  return Finish(fbb);
}

std::vector<uint8_t> EncodeAbortRequest(const ObjectId& id) {
  fb::FlatBufferBuilder fbb(64);
  auto s = IdString(fbb, id);
  fbb.Finish(wire::CreateAbortRequest(fbb, s));
  return Finish(fbb);
}

std::vector<uint8_t> EncodeReleaseRequest(const ObjectId& id, bool may_unmap) {
  fb::FlatBufferBuilder fbb(64);
  auto s = IdString(fbb, id);
  fbb.Finish(wire::CreateReleaseRequest(fbb, s, may_unmap));
  return Finish(fbb);
}

std::vector<uint8_t> EncodeContainsRequest(const ObjectId& id) {
  fb::FlatBufferBuilder fbb(64);
  auto s = IdString(fbb, id);
  fbb.Finish(wire::CreateContainsRequest(fbb, s));
  return Finish(fbb);
}

std::vector<uint8_t> EncodeGetRequest(const std::vector<ObjectId>& ids, int64_t timeout_ms) {
  fb::FlatBufferBuilder fbb(64 + 40 * ids.size());
  std::vector<fb::Offset<fb::String>> strings;
  strings.reserve(ids.size());
  for (const ObjectId& id : ids) strings.push_back(IdString(fbb, id));
  auto vec = fbb.CreateVector(strings);
  fbb.Finish(wire::CreateGetRequest(fbb, vec, timeout_ms));
  return Finish(fbb);
}

Result<ConnectReply> DecodeConnectReply(const std::vector<uint8_t>& payload) {
  RF_ASSIGN_OR_RETURN(const wire::ConnectReply* m,
                      VerifiedRoot<wire::ConnectReply>(payload, "ConnectReply"));
  ConnectReply r;
  r.memory_capacity = m->memory_capacity();
  if (r.memory_capacity <= 0) return MissingField("ConnectReply", "memory_capacity");
  return r;
}

Result<CreateReply> DecodeCreateReply(const std::vector<uint8_t>& payload) {
  RF_ASSIGN_OR_RETURN(const wire::CreateReply* m,
                      VerifiedRoot<wire::CreateReply>(payload, "CreateReply"));
  if (m->object_id() == nullptr) return MissingField("CreateReply", "object_id");
  CreateReply r;
  r.object_id = m->object_id()->str();
  r.retry_with_request_id = m->retry_with_request_id();
  r.has_object = m->plasma_object() != nullptr;
  if (r.has_object) r.object = FromWire(*m->plasma_object());
  r.error = m->error();
  r.segment.store_fd = m->store_fd();
  r.segment.unique_fd_id = m->unique_fd_id();
  r.mmap_size = m->mmap_size();
  return r;
}

Result<GetReply> DecodeGetReply(const std::vector<uint8_t>& payload) {
  RF_ASSIGN_OR_RETURN(const wire::GetReply* m, VerifiedRoot<wire::GetReply>(payload, "GetReply"));
  if (m->object_ids() == nullptr) return MissingField("GetReply", "object_ids");
  if (m->plasma_objects() == nullptr) return MissingField("GetReply", "plasma_objects");
  if (m->store_fds() == nullptr) return MissingField("GetReply", "store_fds");
  if (m->unique_fd_ids() == nullptr) return MissingField("GetReply", "unique_fd_ids");
  if (m->mmap_sizes() == nullptr) return MissingField("GetReply", "mmap_sizes");
  if (m->object_ids()->size() != m->plasma_objects()->size() ||
      m->store_fds()->size() != m->unique_fd_ids()->size() ||
      m->store_fds()->size() != m->mmap_sizes()->size()) {
    return VersionMismatch("the plasma store's GetReply has vectors of unequal lengths; " +
                           SupportedRayVersionsText() + " never sends that");
  }
  GetReply r;
  for (fb::uoffset_t i = 0; i < m->object_ids()->size(); ++i) {
    const fb::String* s = m->object_ids()->Get(i);
    if (s == nullptr) return MissingField("GetReply", "object_ids[i]");
    r.object_ids.push_back(s->str());
    r.objects.push_back(FromWire(*m->plasma_objects()->Get(i)));
  }
  for (fb::uoffset_t i = 0; i < m->store_fds()->size(); ++i) {
    r.segments.push_back(SegmentKey{m->store_fds()->Get(i), m->unique_fd_ids()->Get(i)});
    r.mmap_sizes.push_back(m->mmap_sizes()->Get(i));
  }
  return r;
}

Result<SealReply> DecodeSealReply(const std::vector<uint8_t>& payload) {
  RF_ASSIGN_OR_RETURN(const wire::SealReply* m,
                      VerifiedRoot<wire::SealReply>(payload, "SealReply"));
  if (m->object_id() == nullptr) return MissingField("SealReply", "object_id");
  return SealReply{m->object_id()->str(), m->error()};
}

Result<AbortReply> DecodeAbortReply(const std::vector<uint8_t>& payload) {
  RF_ASSIGN_OR_RETURN(const wire::AbortReply* m,
                      VerifiedRoot<wire::AbortReply>(payload, "AbortReply"));
  if (m->object_id() == nullptr) return MissingField("AbortReply", "object_id");
  return AbortReply{m->object_id()->str()};
}

Result<ReleaseReply> DecodeReleaseReply(const std::vector<uint8_t>& payload) {
  RF_ASSIGN_OR_RETURN(const wire::ReleaseReply* m,
                      VerifiedRoot<wire::ReleaseReply>(payload, "ReleaseReply"));
  if (m->object_id() == nullptr) return MissingField("ReleaseReply", "object_id");
  return ReleaseReply{m->object_id()->str(), m->should_unmap(), m->error()};
}

Result<ContainsReply> DecodeContainsReply(const std::vector<uint8_t>& payload) {
  RF_ASSIGN_OR_RETURN(const wire::ContainsReply* m,
                      VerifiedRoot<wire::ContainsReply>(payload, "ContainsReply"));
  if (m->object_id() == nullptr) return MissingField("ContainsReply", "object_id");
  return ContainsReply{m->object_id()->str(), m->has_object() != 0};
}

Status PlasmaErrorToStatus(int32_t error, const std::string& what) {
  switch (static_cast<PlasmaError>(error)) {
    case PlasmaError::kOk:
      return Status::OK();
    case PlasmaError::kObjectExists:
      return AlreadyExists(what +
                           ": the object already exists in this node's plasma store (Ray or "
                           "another client created it); do not seal or abort it, Get it instead");
    case PlasmaError::kObjectNonexistent:
      return NotFound(what + ": the object is not in this node's plasma store");
    case PlasmaError::kOutOfMemory:
      return ResourceExhausted(
          what +
          ": object store full, the plasma store has no room for the object; free or "
          "release objects, raise object_store_memory, or let Ray spill and retry");
    case PlasmaError::kOutOfDisk:
      return ResourceExhausted(what +
                               ": object store full and the fallback/spill disk is full too; "
                               "free disk space in Ray's temp/spill directory");
    case PlasmaError::kObjectNotSealed:
      return Internal(what + ": the store says the object is not sealed yet");
    case PlasmaError::kObjectInUse:
      return Internal(what + ": the store says the object is in use by another client");
    case PlasmaError::kObjectSealed:
      return Internal(what + ": the store says the object is already sealed");
    case PlasmaError::kUnexpectedError:
      return Internal(what + ": the plasma store reported UnexpectedError (see the raylet log)");
  }
  return VersionMismatch(what + ": the plasma store answered with unknown error code " +
                         std::to_string(error) + "; this client speaks " +
                         SupportedRayVersionsText());
}

}  // namespace rayfabric::plasma
