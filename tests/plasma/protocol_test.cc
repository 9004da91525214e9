// Encoder/decoder round trips against rayfabric's own schema (plasma_wire.fbs), and the
// mapping of plasma errors to Status codes.
#include <gtest/gtest.h>

#include "flatbuffers/flatbuffers.h"
#include "plasma/protocol.h"
#include "plasma_wire_generated.h"
#include "rayfabric/object_id.h"

namespace rayfabric::plasma {
namespace {

ObjectId TestId(uint8_t seed) {
  std::string b(ObjectId::kSize, '\0');
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(seed + i);
  return *ObjectId::FromBinary(b);
}

template <typename T>
const T* Root(const std::vector<uint8_t>& payload) {
  flatbuffers::Verifier v(payload.data(), payload.size());
  EXPECT_TRUE(v.VerifyBuffer<T>(nullptr));
  return flatbuffers::GetRoot<T>(payload.data());
}

std::vector<uint8_t> Bytes(flatbuffers::FlatBufferBuilder& fbb) {
  return {fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize()};
}

TEST(ObjectIdTest, AcceptsOnlyExactly28Bytes) {
  EXPECT_TRUE(ObjectId::FromBinary(std::string(28, 'x')).ok());
  EXPECT_EQ(ObjectId::FromBinary(std::string(27, 'x')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ObjectId::FromBinary(std::string(29, 'x')).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(ObjectId::FromHex("abc").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ObjectId::FromHex(std::string(56, 'g')).status().code(), StatusCode::kInvalidArgument);
  ObjectId id = TestId(7);
  EXPECT_EQ(*ObjectId::FromHex(id.Hex()), id);
  EXPECT_TRUE(ObjectId().IsNil());
  EXPECT_FALSE(id.IsNil());
}

TEST(ProtocolTest, HeaderIsCookieTypeLengthIn24Bytes) {
  MessageHeader h{kDefaultRayCookie, static_cast<int64_t>(MessageType::kGetRequest), 1234};
  auto bytes = EncodeHeader(h);
  ASSERT_EQ(bytes.size(), 24u);
  EXPECT_EQ(bytes[7], 0x52);  // 'R' 'A' 'Y' in the top bytes, little-endian host
  MessageHeader back = DecodeHeader(bytes.data());
  EXPECT_EQ(back.cookie, h.cookie);
  EXPECT_EQ(back.type, 8);
  EXPECT_EQ(back.length, 1234u);
}

TEST(ProtocolTest, MessageTypeNumbersAreRay260s) {
  EXPECT_EQ(static_cast<int64_t>(MessageType::kCreateRetryRequest), 2);
  EXPECT_EQ(static_cast<int64_t>(MessageType::kGetReply), 9);
  EXPECT_EQ(static_cast<int64_t>(MessageType::kConnectRequest), 16);
  EXPECT_EQ(static_cast<int64_t>(MessageType::kGetDebugStringReply), 19);
  EXPECT_STREQ(MessageTypeName(17), "ConnectReply");
  EXPECT_STREQ(MessageTypeName(20), "unknown");
}

TEST(ProtocolTest, CreateRequestCarriesEveryFieldAndNoNullString) {
  CreateRequestFields f;
  f.object_id = TestId(1);
  f.owner_node_id = std::string(28, 'n');
  f.owner_ip_address = "10.1.2.3";
  f.owner_port = 4321;
  f.owner_worker_id = std::string(28, 'w');
  f.data_size = 8 << 20;
  f.metadata_size = 6;
  f.try_immediately = true;
  auto payload = EncodeCreateRequest(f);
  const auto* m = Root<wire::CreateRequest>(payload);
  ASSERT_NE(m->object_id(), nullptr);
  EXPECT_EQ(m->object_id()->str(), f.object_id.Binary());
  EXPECT_EQ(m->owner_node_id()->str(), f.owner_node_id);
  EXPECT_EQ(m->owner_ip_address()->str(), "10.1.2.3");
  EXPECT_EQ(m->owner_port(), 4321);
  EXPECT_EQ(m->owner_worker_id()->str(), f.owner_worker_id);
  EXPECT_FALSE(m->is_mutable());
  EXPECT_EQ(m->data_size(), 8u << 20);
  EXPECT_EQ(m->metadata_size(), 6u);
  EXPECT_EQ(m->source(), static_cast<int32_t>(ObjectSource::kReceivedFromRemoteRaylet));
  EXPECT_EQ(m->device_num(), 0);
  EXPECT_TRUE(m->try_immediately());

  CreateRequestFields empty_owner;  // strings present even when empty
  auto p2 = EncodeCreateRequest(empty_owner);
  const auto* m2 = Root<wire::CreateRequest>(p2);
  EXPECT_NE(m2->owner_node_id(), nullptr);
  EXPECT_NE(m2->owner_ip_address(), nullptr);
  EXPECT_NE(m2->owner_worker_id(), nullptr);
}

TEST(ProtocolTest, SmallRequestsRoundTrip) {
  ObjectId id = TestId(3);
  auto get = EncodeGetRequest({id, TestId(4)}, 250);
  const auto* g = Root<wire::GetRequest>(get);
  ASSERT_EQ(g->object_ids()->size(), 2u);
  EXPECT_EQ(g->object_ids()->Get(0)->str(), id.Binary());
  EXPECT_EQ(g->timeout_ms(), 250);
  auto rel = EncodeReleaseRequest(id, true);
  EXPECT_TRUE(Root<wire::ReleaseRequest>(rel)->may_unmap());
  EXPECT_EQ(Root<wire::ReleaseRequest>(rel)->object_id()->str(), id.Binary());
  auto retry = EncodeCreateRetryRequest(id, 77);
  EXPECT_EQ(Root<wire::CreateRetryRequest>(retry)->request_id(), 77u);
  EXPECT_EQ(Root<wire::SealRequest>(EncodeSealRequest(id))->object_id()->str(), id.Binary());
  EXPECT_EQ(Root<wire::AbortRequest>(EncodeAbortRequest(id))->object_id()->str(), id.Binary());
  EXPECT_EQ(Root<wire::ContainsRequest>(EncodeContainsRequest(id))->object_id()->str(),
            id.Binary());
  EXPECT_GE(EncodeConnectRequest().size(), 4u);
}

TEST(ProtocolTest, CreateReplyDecodesSpecAndSegment) {
  ObjectId id = TestId(5);
  flatbuffers::FlatBufferBuilder fbb;
  wire::ObjectSpec spec(17, 3, 0, 4096, 1000, 5096, 24, 1024, true, 0, false);
  auto oid = fbb.CreateString(id.Binary());
  wire::CreateReplyBuilder b(fbb);
  b.add_object_id(oid);
  b.add_plasma_object(&spec);
  b.add_store_fd(17);
  b.add_unique_fd_id(3);
  b.add_mmap_size(1 << 20);
  fbb.Finish(b.Finish());
  auto r = DecodeCreateReply(Bytes(fbb));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->object_id, id.Binary());
  EXPECT_TRUE(r->has_object);
  EXPECT_EQ(r->object.data_offset, 4096u);
  EXPECT_EQ(r->object.data_size, 1000u);
  EXPECT_EQ(r->object.metadata_size, 24u);
  EXPECT_TRUE(r->object.fallback_allocated);
  EXPECT_EQ(r->segment, (SegmentKey{17, 3}));
  EXPECT_EQ(r->mmap_size, 1 << 20);
  EXPECT_EQ(r->retry_with_request_id, 0u);
}

TEST(ProtocolTest, GetReplyMissingObjectHasDataSizeMinusOne) {
  std::vector<wire::ObjectSpec> specs = {
      wire::ObjectSpec(-1, 0, 0, 0, static_cast<uint64_t>(-1), 0, 0, 0, false, 0, false)};
  flatbuffers::FlatBufferBuilder fbb;
  auto v_ids = fbb.CreateVector(
      std::vector<flatbuffers::Offset<flatbuffers::String>>{fbb.CreateString(TestId(1).Binary())});
  auto v_specs = fbb.CreateVectorOfStructs(specs);
  auto v_fds = fbb.CreateVector(std::vector<int32_t>{});
  auto v_uids = fbb.CreateVector(std::vector<int64_t>{});
  auto v_sizes = fbb.CreateVector(std::vector<int64_t>{});
  fbb.Finish(wire::CreateGetReply(fbb, v_ids, v_specs, v_fds, v_uids, v_sizes));
  auto r = DecodeGetReply(Bytes(fbb));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->objects.size(), 1u);
  EXPECT_FALSE(r->objects[0].found());
  EXPECT_TRUE(r->segments.empty());
}

TEST(ProtocolTest, GetReplyWithUnequalVectorsIsVersionMismatch) {
  flatbuffers::FlatBufferBuilder fbb;
  auto v_ids = fbb.CreateVector(std::vector<flatbuffers::Offset<flatbuffers::String>>{});
  auto v_specs = fbb.CreateVectorOfStructs(std::vector<wire::ObjectSpec>{});
  auto v_fds = fbb.CreateVector(std::vector<int32_t>{5});
  auto v_uids = fbb.CreateVector(std::vector<int64_t>{});
  auto v_sizes = fbb.CreateVector(std::vector<int64_t>{100});
  fbb.Finish(wire::CreateGetReply(fbb, v_ids, v_specs, v_fds, v_uids, v_sizes));
  EXPECT_EQ(DecodeGetReply(Bytes(fbb)).status().code(), StatusCode::kVersionMismatch);
}

TEST(ProtocolTest, GarbageRepliesAreVersionMismatchNamingTheRayVersion) {
  std::vector<uint8_t> garbage = {0xff, 0xff, 0xff, 0x7f, 1, 2, 3, 4};
  Status s = DecodeCreateReply(garbage).status();
  EXPECT_EQ(s.code(), StatusCode::kVersionMismatch);
  EXPECT_NE(s.message().find("Ray 2.49.0 to 2.60.0"), std::string::npos) << s;
  EXPECT_EQ(DecodeGetReply({}).status().code(), StatusCode::kVersionMismatch);
  EXPECT_EQ(DecodeConnectReply({1, 2}).status().code(), StatusCode::kVersionMismatch);
  // A well-formed but empty ConnectReply lacks the capacity Ray always sends.
  flatbuffers::FlatBufferBuilder fbb;
  fbb.Finish(wire::CreateConnectReply(fbb, 0));
  EXPECT_EQ(DecodeConnectReply(Bytes(fbb)).status().code(), StatusCode::kVersionMismatch);
}

TEST(ProtocolTest, PlasmaErrorsMapToActionableStatus) {
  EXPECT_TRUE(PlasmaErrorToStatus(0, "x").ok());
  Status exists = PlasmaErrorToStatus(1, "create of object ab..");
  EXPECT_EQ(exists.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(exists.message().find("create of object ab.."), std::string::npos);
  EXPECT_EQ(PlasmaErrorToStatus(2, "x").code(), StatusCode::kNotFound);
  Status full = PlasmaErrorToStatus(3, "x");
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(full.message().find("object store full"), std::string::npos);
  EXPECT_EQ(PlasmaErrorToStatus(8, "x").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(PlasmaErrorToStatus(6, "x").code(), StatusCode::kInternal);
  EXPECT_EQ(PlasmaErrorToStatus(42, "x").code(), StatusCode::kVersionMismatch);
}

}  // namespace
}  // namespace rayfabric::plasma
