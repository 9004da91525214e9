// PlasmaClient against a scripted in-process store: what must never reach a real raylet, and
// the fd bookkeeping that must mirror the store's exactly. Real Ray: test_plasma_real_ray.py.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "../support/send_fd.h"
#include "flatbuffers/flatbuffers.h"
#include "plasma/protocol.h"
#include "plasma_wire_generated.h"
#include "rayfabric/plasma_client.h"

namespace rayfabric::plasma {
namespace {

bool ReadAll(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A segment of the fake store: the ids the store names it by, its size, and its fd here.
struct FakeSegment {
  int store_fd;
  int64_t unique_fd_id;
  int64_t mmap_size;
  int fd;
};

// A one-connection store that hands each request to a scripted handler.
class FakeStore {
 public:
  using Handler = std::function<void(FakeStore&, int64_t type, const std::vector<uint8_t>&)>;

  explicit FakeStore(Handler handler) : handler_(std::move(handler)) {
    static std::atomic<int> counter{0};
    path_ = "/tmp/rf_fake_plasma_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    ::unlink(path_.c_str());
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(listen_fd_, 1), 0);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeStore() {
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    thread_.join();
    if (conn_ >= 0) ::close(conn_);
    ::unlink(path_.c_str());
  }

  const std::string& path() const { return path_; }
  std::vector<int64_t> received() {
    std::lock_guard<std::mutex> lock(mu_);
    return received_;
  }

  void Reply(MessageType type, flatbuffers::FlatBufferBuilder& fbb) {
    MessageHeader h{kDefaultRayCookie, static_cast<int64_t>(type), fbb.GetSize()};
    auto header = EncodeHeader(h);
    std::vector<uint8_t> message(header.begin(), header.end());
    message.insert(message.end(), fbb.GetBufferPointer(), fbb.GetBufferPointer() + fbb.GetSize());
    // One send (the client may hang up right after a bad header); MSG_NOSIGNAL: no SIGPIPE.
    EXPECT_EQ(::send(conn_, message.data(), message.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(message.size()));
  }
  // A CreateReply placing the object's data at `data_offset` of `segment`, whose fd follows the
  // first reply that names it on this connection (as the store sends it).
  void ReplyCreated(const std::string& id, uint64_t data_size, uint64_t metadata_size,
                    uint64_t data_offset, const FakeSegment& segment, bool fallback = false) {
    flatbuffers::FlatBufferBuilder fbb;
    wire::ObjectSpec spec(segment.store_fd, segment.unique_fd_id, data_offset - 64, data_offset,
                          data_size, data_offset + data_size, metadata_size,
                          data_size + metadata_size, fallback, 0, false);
    auto sid = fbb.CreateString(id);
    wire::CreateReplyBuilder b(fbb);
    b.add_object_id(sid);
    b.add_plasma_object(&spec);
    b.add_store_fd(segment.store_fd);
    b.add_unique_fd_id(segment.unique_fd_id);
    b.add_mmap_size(segment.mmap_size);
    fbb.Finish(b.Finish());
    Reply(MessageType::kCreateReply, fbb);
    if (fds_sent_.insert(segment.store_fd).second) SendFd(segment.fd);
  }
  void ReplyCreateRefused(const std::string& id, PlasmaError error) {
    flatbuffers::FlatBufferBuilder fbb;
    auto sid = fbb.CreateString(id);
    wire::CreateReplyBuilder b(fbb);
    b.add_object_id(sid);
    b.add_error(static_cast<int>(error));
    fbb.Finish(b.Finish());
    Reply(MessageType::kCreateReply, fbb);
  }
  void ReplyCreateQueued(const std::string& id, uint64_t request_id) {
    flatbuffers::FlatBufferBuilder fbb;
    auto sid = fbb.CreateString(id);
    wire::CreateReplyBuilder b(fbb);
    b.add_object_id(sid);
    b.add_retry_with_request_id(request_id);
    fbb.Finish(b.Finish());
    Reply(MessageType::kCreateReply, fbb);
  }
  // Seals the object of a SealRequest; returns its id.
  std::string ReplySealed(const std::vector<uint8_t>& payload) {
    const std::string id =
        flatbuffers::GetRoot<wire::SealRequest>(payload.data())->object_id()->str();
    flatbuffers::FlatBufferBuilder fbb;
    fbb.Finish(wire::CreateSealReply(fbb, fbb.CreateString(id), 0));
    Reply(MessageType::kSealReply, fbb);
    return id;
  }
  void ReplyConnect(int64_t capacity) {
    flatbuffers::FlatBufferBuilder fbb;
    fbb.Finish(wire::CreateConnectReply(fbb, capacity));
    Reply(MessageType::kConnectReply, fbb);
  }
  void SendFd(int fd) { EXPECT_TRUE(rayfabric::testing::SendOneFd(conn_, fd)); }

 private:
  void Serve() {
    conn_ = ::accept(listen_fd_, nullptr, nullptr);
    if (conn_ < 0) return;
    while (true) {
      uint8_t raw[kHeaderSize];
      if (!ReadAll(conn_, raw, sizeof(raw))) return;
      MessageHeader h = DecodeHeader(raw);
      std::vector<uint8_t> payload(h.length);
      if (!ReadAll(conn_, payload.data(), payload.size())) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        received_.push_back(h.type);
      }
      handler_(*this, h.type, payload);
    }
  }

  Handler handler_;
  std::string path_;
  int listen_fd_ = -1;
  int conn_ = -1;
  std::thread thread_;
  std::mutex mu_;
  std::vector<int64_t> received_;
  std::set<int> fds_sent_;  // store_fds whose fd this connection has received
};

ObjectId TestId(uint8_t seed) { return *ObjectId::FromBinary(std::string(28, char(seed))); }

OwnerAddress TestOwner() {
  return OwnerAddress{std::string(28, 'n'), "127.0.0.1", 1234, std::string(28, 'w')};
}

TEST(PlasmaClientTest, MissingSocketIsUnavailable) {
  auto c = PlasmaClient::Connect("/tmp/rf_no_such_plasma_store");
  ASSERT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("cannot connect to the plasma store"), std::string::npos);
}

TEST(PlasmaClientTest, AStoreThatAcceptsNoConnectionIsTimedOutNotWaitedForEver) {
  // A stalled raylet: its socket listens, nothing accepts, the backlog (0) is full.
  const std::string path = "/tmp/rf_stalled_plasma_" + std::to_string(getpid());
  struct Cleanup {  // fds and the socket file go whatever the assertions say
    std::string path;
    std::vector<int> fds;
    ~Cleanup() {
      for (int fd : fds) ::close(fd);
      ::unlink(path.c_str());
    }
  } cleanup{path, {}};
  ::unlink(path.c_str());
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  cleanup.fds.push_back(listener);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  for (int i = 0; i < 4; ++i) {  // connections that fill the backlog
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    cleanup.fds.push_back(fd);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) break;
  }
  ConnectOptions o;
  o.request_timeout_ms = 300;
  const auto started = std::chrono::steady_clock::now();
  auto c = PlasmaClient::Connect(path, o);
  const auto took = std::chrono::steady_clock::now() - started;
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kTimedOut) << c.status();
  EXPECT_NE(c.status().message().find("accepts no connection"), std::string::npos) << c.status();
  EXPECT_LT(took, std::chrono::seconds(3));
}

TEST(PlasmaClientTest, UnsupportedRayVersionIsRefusedBeforeConnecting) {
  ConnectOptions o;
  o.ray_version = "2.9.3";
  auto c = PlasmaClient::Connect("/tmp/rf_no_such_plasma_store", o);
  ASSERT_EQ(c.status().code(), StatusCode::kVersionMismatch);
  EXPECT_NE(c.status().message().find("Ray 2.49.0 to 2.60.0"), std::string::npos) << c.status();
  EXPECT_TRUE(IsSupportedRayVersion("2.60.0"));
  EXPECT_TRUE(IsSupportedRayVersion("2.49.0"));
  EXPECT_FALSE(IsSupportedRayVersion("2.48.0"));  // its Get request has a field 2.60.0 dropped
  EXPECT_FALSE(IsSupportedRayVersion("2.61.0"));  // not checked yet
}

TEST(PlasmaClientTest, UnexpectedReplyToConnectIsVersionMismatch) {
  FakeStore store([](FakeStore& s, int64_t, const std::vector<uint8_t>&) {
    flatbuffers::FlatBufferBuilder fbb;
    fbb.Finish(wire::CreateConnectReply(fbb, 1 << 20));
    s.Reply(MessageType::kGetDebugStringReply, fbb);  // what a store with other numbers does
  });
  auto c = PlasmaClient::Connect(store.path());
  ASSERT_EQ(c.status().code(), StatusCode::kVersionMismatch);
  EXPECT_NE(c.status().message().find("Ray 2.49.0 to 2.60.0"), std::string::npos) << c.status();
}

TEST(PlasmaClientTest, MisuseNeverReachesTheStore) {
  FakeStore store([](FakeStore& s, int64_t type, const std::vector<uint8_t>&) {
    if (type == static_cast<int64_t>(MessageType::kConnectRequest)) s.ReplyConnect(1 << 20);
  });
  auto c = PlasmaClient::Connect(store.path());
  ASSERT_TRUE(c.ok()) << c.status();
  PlasmaClient& client = **c;
  EXPECT_EQ(client.memory_capacity(), 1 << 20);
  ObjectId id = TestId(1);
  auto refused = [](const Status& s) { return s.code() == StatusCode::kInvalidArgument; };
  EXPECT_TRUE(refused(client.Seal(id)));     // never created: the store would CHECK-fail
  EXPECT_TRUE(refused(client.Abort(id)));    // not the creator
  EXPECT_TRUE(refused(client.Release(id)));  // not held
  EXPECT_TRUE(refused(client.Seal(ObjectId())));
  EXPECT_TRUE(refused(client.Get({id}, -1).status()));  // unbounded wait
  EXPECT_TRUE(refused(client.Get({}, 0).status()));
  EXPECT_TRUE(refused(client.Get({id, id}, 0).status()));
  CreateOptions o;
  o.data_size = 100;
  EXPECT_TRUE(refused(client.Create(id, o).status()));  // no owner
  o.owner = TestOwner();
  o.owner.worker_id = "short";
  EXPECT_TRUE(refused(client.Create(id, o).status()));
  o.owner = TestOwner();
  o.owner.port = 0;
  EXPECT_TRUE(refused(client.Create(id, o).status()));
  o.owner = TestOwner();
  o.data_size = 0;
  EXPECT_TRUE(refused(client.Create(id, o).status()));  // empty object
  o.data_size = UINT64_MAX;
  o.metadata_size = 2;
  EXPECT_TRUE(refused(client.Create(id, o).status()));  // overflow
  o.data_size = 1ull << 45;
  o.metadata_size = 0;
  o.allow_disk_fallback = true;
  EXPECT_TRUE(refused(client.Create(id, o).status()));  // a fallback file that kills the store
  o.allow_disk_fallback = false;
  o.data_size = 2 << 20;
  EXPECT_EQ(client.Create(id, o).status().code(), StatusCode::kResourceExhausted);  // > capacity
  EXPECT_TRUE(client.healthy());
  EXPECT_EQ(store.received(), std::vector<int64_t>{16});  // only the ConnectRequest
}

// The store sends a segment's fd once per connection; the client must take it exactly then.
TEST(PlasmaClientTest, SegmentFdIsReceivedAndMappedOnce) {
  constexpr int64_t kArena = 1 << 20;
  int memfd = ::memfd_create("rf_fake_arena", 0);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::ftruncate(memfd, kArena), 0);
  uint64_t next_offset = 4096;
  const FakeSegment main_arena{42, 7, kArena + 8, memfd};
  FakeStore store([&](FakeStore& s, int64_t type, const std::vector<uint8_t>& payload) {
    switch (static_cast<MessageType>(type)) {
      case MessageType::kConnectRequest:
        s.ReplyConnect(kArena);
        break;
      case MessageType::kCreateRequest: {
        auto* req = flatbuffers::GetRoot<wire::CreateRequest>(payload.data());
        s.ReplyCreated(req->object_id()->str(), req->data_size(), req->metadata_size(), next_offset,
                       main_arena);
        next_offset += 8192;
        break;
      }
      case MessageType::kSealRequest:
        s.ReplySealed(payload);
        break;
      default:
        break;  // ReleaseRequest(may_unmap=false) has no reply
    }
  });
  auto c = PlasmaClient::Connect(store.path());
  ASSERT_TRUE(c.ok()) << c.status();
  int mapped = 0;
  (*c)->SetSegmentCallbacks(
      [&](const SegmentInfo& seg) {
        ++mapped;
        EXPECT_EQ(seg.size, static_cast<size_t>(kArena));
      },
      nullptr);
  for (uint8_t i = 1; i <= 3; ++i) {
    CreateOptions o;
    o.owner = TestOwner();
    o.data_size = 100;
    o.metadata_size = 4;
    auto b = (*c)->Create(TestId(i), o);
    ASSERT_TRUE(b.ok()) << b.status();
    std::memset(b->data, i, 104);
    EXPECT_EQ((*c)->Release(TestId(i)).code(), StatusCode::kInvalidArgument);  // unsealed
    ASSERT_TRUE((*c)->Seal(TestId(i)).ok());
    EXPECT_EQ((*c)->Seal(TestId(i)).code(), StatusCode::kInvalidArgument);  // sealed already
    EXPECT_EQ((*c)->Abort(TestId(i)).code(), StatusCode::kInvalidArgument);
    ASSERT_TRUE((*c)->Release(TestId(i)).ok());
  }
  EXPECT_EQ(mapped, 1);
  ASSERT_EQ((*c)->Segments().size(), 1u);
  // The bytes written through our mapping are in the store's memory.
  auto* arena = static_cast<uint8_t*>(::mmap(nullptr, kArena, PROT_READ, MAP_SHARED, memfd, 0));
  ASSERT_NE(arena, MAP_FAILED);
  EXPECT_EQ(arena[4096], 1);
  EXPECT_EQ(arena[4096 + 8192 + 103], 2);
  EXPECT_EQ(arena[4096 + 2 * 8192], 3);
  ::munmap(arena, kArena);
  ::close(memfd);
  EXPECT_TRUE((*c)->healthy());
}

// CreateMany and SealAndRelease write a batch of requests before reading the replies: each id
// still gets exactly its own answer, in order, and what Create/Seal alone would refuse never
// reaches the store (a duplicate in the batch included).
TEST(PlasmaClientTest, PipelinedCreateAndSealAnswerEachIdInOrder) {
  constexpr int64_t kArena = 1 << 20;
  int memfd = ::memfd_create("rf_fake_arena", 0);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(::ftruncate(memfd, kArena), 0);
  const ObjectId taken_by_ray = TestId(3);
  uint64_t next_offset = 4096;
  const FakeSegment main_arena{42, 7, kArena + 8, memfd};
  std::vector<std::string> sealed_ids;
  FakeStore store([&](FakeStore& s, int64_t type, const std::vector<uint8_t>& payload) {
    switch (static_cast<MessageType>(type)) {
      case MessageType::kConnectRequest:
        s.ReplyConnect(kArena);
        break;
      case MessageType::kCreateRequest: {
        auto* req = flatbuffers::GetRoot<wire::CreateRequest>(payload.data());
        if (req->object_id()->str() == taken_by_ray.Binary()) {
          s.ReplyCreateRefused(req->object_id()->str(), PlasmaError::kObjectExists);
          break;
        }
        s.ReplyCreated(req->object_id()->str(), req->data_size(), req->metadata_size(), next_offset,
                       main_arena);
        next_offset += 8192;
        break;
      }
      case MessageType::kSealRequest:
        sealed_ids.push_back(s.ReplySealed(payload));
        break;
      default:
        break;  // ReleaseRequest(may_unmap=false) has no reply
    }
  });
  auto c = PlasmaClient::Connect(store.path());
  ASSERT_TRUE(c.ok()) << c.status();
  PlasmaClient& client = **c;
  CreateOptions o;
  o.owner = TestOwner();
  o.data_size = 100;
  CreateOptions empty = o;
  empty.data_size = 0;
  // 1, 2, 3 (Ray has it), 1 again, an empty one, 4.
  const std::vector<ObjectId> ids{TestId(1), TestId(2), taken_by_ray,
                                  TestId(1), TestId(5), TestId(4)};
  auto created = client.CreateMany(ids, {o, o, o, o, empty, o});
  ASSERT_EQ(created.size(), ids.size());
  EXPECT_TRUE(created[0].ok()) << created[0].status();
  EXPECT_TRUE(created[1].ok()) << created[1].status();
  EXPECT_EQ(created[2].status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(created[3].status().code(), StatusCode::kAlreadyExists);  // twice in the batch
  EXPECT_EQ(created[4].status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(created[5].ok()) << created[5].status();
  EXPECT_EQ(created[0]->data + 8192, created[1]->data);  // each reply went to its own id
  EXPECT_EQ(created[1]->data + 8192, created[5]->data);
  EXPECT_EQ(client.CreateMany({TestId(6)}, {}).front().status().code(),
            StatusCode::kInvalidArgument);  // options do not match the ids
  std::memset(created[5]->data, 4, 100);

  // 1, 4, 1 again, 3 (never created here), 2.
  auto sealed = client.SealAndRelease({TestId(1), TestId(4), TestId(1), taken_by_ray, TestId(2)});
  ASSERT_EQ(sealed.size(), 5u);
  EXPECT_TRUE(sealed[0].ok()) << sealed[0];
  EXPECT_TRUE(sealed[1].ok()) << sealed[1];
  EXPECT_EQ(sealed[2].code(), StatusCode::kInvalidArgument);  // twice in the batch
  EXPECT_EQ(sealed[3].code(), StatusCode::kInvalidArgument);  // the store would CHECK-fail
  EXPECT_TRUE(sealed[4].ok()) << sealed[4];
  EXPECT_EQ(sealed_ids,
            (std::vector<std::string>{TestId(1).Binary(), TestId(4).Binary(), TestId(2).Binary()}));
  // Released too: no longer held by this client.
  EXPECT_EQ(client.Release(TestId(4)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(client.Seal(TestId(4)).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(client.healthy());
  // What reached the store: Connect, 4 creates (not the duplicate nor the empty one), 3 seals,
  // then their 3 one-way releases. Wait for the releases to arrive.
  constexpr auto kCreate = static_cast<int64_t>(MessageType::kCreateRequest);
  constexpr auto kSeal = static_cast<int64_t>(MessageType::kSealRequest);
  constexpr auto kRelease = static_cast<int64_t>(MessageType::kReleaseRequest);
  std::vector<int64_t> expected{static_cast<int64_t>(MessageType::kConnectRequest)};
  expected.insert(expected.end(), {kCreate, kCreate, kCreate, kCreate, kSeal, kSeal, kSeal,
                                   kRelease, kRelease, kRelease});
  for (int i = 0; i < 200 && store.received().size() < expected.size(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(store.received(), expected);
  auto* arena = static_cast<uint8_t*>(::mmap(nullptr, kArena, PROT_READ, MAP_SHARED, memfd, 0));
  ASSERT_NE(arena, MAP_FAILED);
  EXPECT_EQ(arena[4096 + 2 * 8192 + 99], 4);
  ::munmap(arena, kArena);
  ::close(memfd);
}

// Creates the store queued are polled together, their retries pipelined; a fallback object's
// release (the store answers it) goes only after every seal reply of its batch is read.
TEST(PlasmaClientTest, QueuedAndFallbackObjectsInABatch) {
  constexpr int64_t kArena = 1 << 20;
  int arena_fd = ::memfd_create("rf_fake_arena", 0);
  int fallback_fd = ::memfd_create("rf_fake_fallback", 0);
  ASSERT_GE(arena_fd, 0);
  ASSERT_GE(fallback_fd, 0);
  ASSERT_EQ(::ftruncate(arena_fd, kArena), 0);
  ASSERT_EQ(::ftruncate(fallback_fd, kArena), 0);
  const ObjectId main_now = TestId(1), fallback_later = TestId(2), main_later = TestId(3);
  uint64_t next_offset = 4096;
  const FakeSegment main_arena{42, 7, kArena + 8, arena_fd};
  const FakeSegment fallback_file{43, 8, kArena + 8, fallback_fd};
  std::map<std::string, int> retries;
  std::vector<std::string> retried;                    // ids, in the order their retries came
  std::vector<std::pair<std::string, bool>> released;  // (id, may_unmap)
  FakeStore store([&](FakeStore& s, int64_t type, const std::vector<uint8_t>& payload) {
    auto reply_object = [&](const std::string& id, uint64_t size, bool fallback) {
      s.ReplyCreated(id, size, 0, next_offset, fallback ? fallback_file : main_arena, fallback);
      next_offset += 8192;
    };
    switch (static_cast<MessageType>(type)) {
      case MessageType::kConnectRequest:
        s.ReplyConnect(kArena);
        break;
      case MessageType::kCreateRequest: {
        auto* req = flatbuffers::GetRoot<wire::CreateRequest>(payload.data());
        const std::string id = req->object_id()->str();
        if (id == main_now.Binary()) {
          reply_object(id, req->data_size(), false);
        } else {
          s.ReplyCreateQueued(id, id == fallback_later.Binary() ? 77 : 88);
        }
        break;
      }
      case MessageType::kCreateRetryRequest: {
        auto* req = flatbuffers::GetRoot<wire::CreateRetryRequest>(payload.data());
        const std::string id = req->object_id()->str();
        retried.push_back(id);
        // The fallback one is fulfilled at its second retry, the other at its first.
        if (id == fallback_later.Binary() && ++retries[id] < 2) {
          s.ReplyCreateQueued(id, req->request_id());
        } else {
          reply_object(id, 100, id == fallback_later.Binary());
        }
        break;
      }
      case MessageType::kSealRequest:
        s.ReplySealed(payload);
        break;
      case MessageType::kReleaseRequest: {
        auto* req = flatbuffers::GetRoot<wire::ReleaseRequest>(payload.data());
        released.emplace_back(req->object_id()->str(), req->may_unmap());
        if (!req->may_unmap()) break;  // a main-arena release has no reply
        flatbuffers::FlatBufferBuilder fbb;
        fbb.Finish(wire::CreateReleaseReply(fbb, fbb.CreateString(req->object_id()->str()),
                                            /*should_unmap=*/true, 0));
        s.Reply(MessageType::kReleaseReply, fbb);
        break;
      }
      default:
        break;
    }
  });
  auto c = PlasmaClient::Connect(store.path());
  ASSERT_TRUE(c.ok()) << c.status();
  PlasmaClient& client = **c;
  CreateOptions o;
  o.owner = TestOwner();
  o.data_size = 100;
  o.timeout_ms = 5000;
  auto created = client.CreateMany({main_now, fallback_later, main_later}, {o, o, o});
  ASSERT_EQ(created.size(), 3u);
  for (const auto& r : created) ASSERT_TRUE(r.ok()) << r.status();
  // Both queued creates were polled at the first tick, then the one still queued alone (polled
  // one after the other, the order would be 2, 2, 3).
  EXPECT_EQ(retried, (std::vector<std::string>{fallback_later.Binary(), main_later.Binary(),
                                               fallback_later.Binary()}));
  std::memset(created[1]->data, 2, 100);

  auto sealed = client.SealAndRelease({main_now, fallback_later, main_later});
  ASSERT_EQ(sealed.size(), 3u);
  for (const Status& st : sealed) EXPECT_TRUE(st.ok()) << st;
  EXPECT_TRUE(client.healthy());  // every reply was read as what it is
  // The fallback release came last and was answered: the one-way ones were handled before it.
  EXPECT_EQ(released, (std::vector<std::pair<std::string, bool>>{{main_now.Binary(), false},
                                                                 {main_later.Binary(), false},
                                                                 {fallback_later.Binary(), true}}));
  auto* fallback =
      static_cast<uint8_t*>(::mmap(nullptr, kArena, PROT_READ, MAP_SHARED, fallback_fd, 0));
  ASSERT_NE(fallback, MAP_FAILED);
  EXPECT_EQ(fallback[4096 + 2 * 8192 + 99], 2);  // written through the fallback mapping
  ::munmap(fallback, kArena);
  ::close(arena_fd);
  ::close(fallback_fd);
}

}  // namespace
}  // namespace rayfabric::plasma
