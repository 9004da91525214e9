// Unix sockets: real sockets in a temporary directory, both ends in this process. What the pull
// socket and the plasma client rely on: the socket is private from its creation, every read and
// write ends by its deadline whatever the peer does, a hang-up is seen, and a listener unlinks
// its path at the end only if the path still names its socket.
#include "common/unix_socket.h"
#include "../support/send_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace rayfabric {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

Clock::time_point Soon() { return Clock::now() + milliseconds(500); }

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rf_unix_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/s";
  }
  void TearDown() override {
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::string dir_, path_;
};

TEST_F(UnixSocketTest, ListenerIsPrivateAndPairsWithConnect) {
  // With no umask at all the file bind() makes would be 0777: 0600 comes from the socket itself.
  const mode_t umask_before = umask(0);
  auto listener = UnixListener::Listen(path_, "test socket");
  umask(umask_before);
  ASSERT_TRUE(listener.ok()) << listener.status();
  struct stat st {};
  ASSERT_EQ(stat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  auto client = UnixStream::Connect(path_, "the test server", Soon());
  ASSERT_TRUE(client.ok()) << client.status();
  auto accepted = listener->Accept();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  UnixStream server = UnixStream::Adopt(std::move(*accepted), "the test client");
  auto uid = server.PeerUid();
  ASSERT_TRUE(uid.ok()) << uid.status();
  EXPECT_EQ(*uid, getuid());

  const std::string hello = "hello, agent";
  ASSERT_TRUE(client->SendAll(hello.data(), hello.size(), Clock::now() + milliseconds(500)).ok());
  std::string got(hello.size(), '\0');
  ASSERT_TRUE(server.RecvExact(got.data(), got.size(), Clock::now() + milliseconds(500)).ok());
  EXPECT_EQ(got, hello);
  EXPECT_FALSE(server.PeerHungUp());
  client->Close();
  EXPECT_TRUE(server.PeerHungUp());
  char byte;
  Status eof = server.RecvExact(&byte, 1, Clock::now() + milliseconds(500));
  EXPECT_EQ(eof.code(), StatusCode::kUnavailable) << eof;
  EXPECT_NE(eof.message().find("the test client closed the connection"), std::string::npos) << eof;
}

TEST_F(UnixSocketTest, AHalfCloseIsAHangUp) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UnixStream server = UnixStream::Adopt(UniqueFd(fds[0]), "a caller");
  UniqueFd caller(fds[1]);
  EXPECT_FALSE(server.PeerHungUp());
  ASSERT_EQ(::shutdown(caller.get(), SHUT_WR), 0);  // the caller gave up waiting, socket still open
  EXPECT_TRUE(server.PeerHungUp());
}

TEST_F(UnixSocketTest, AnFdComesWithItsByteAndAPlainByteIsAProtocolError) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UnixStream receiver = UnixStream::Adopt(UniqueFd(fds[0]), "the store");
  UniqueFd sender(fds[1]);
  char tmpl[] = "/tmp/rf_unix_fd_XXXXXX";
  UniqueFd file(mkstemp(tmpl));
  ASSERT_TRUE(file.valid());
  unlink(tmpl);
  ASSERT_EQ(write(file.get(), "segment", 7), 7);
  ASSERT_TRUE(testing::SendOneFd(sender.get(), file.get()));
  auto got = receiver.RecvFd(Clock::now() + milliseconds(500));
  ASSERT_TRUE(got.ok()) << got.status();
  struct stat a {
  }, b{};
  ASSERT_EQ(fstat(got->get(), &a), 0);
  ASSERT_EQ(fstat(file.get(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino) << "the fd received is the file sent";

  ASSERT_EQ(write(sender.get(), "x", 1), 1);  // a byte with no fd
  auto plain = receiver.RecvFd(Clock::now() + milliseconds(500));
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), StatusCode::kProtocolError) << plain.status();

  auto none = receiver.RecvFd(Clock::now() + milliseconds(200));  // nothing sent
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kTimedOut) << none.status();
}

TEST_F(UnixSocketTest, ConnectToAStalledServerEndsByItsDeadline) {
  // A server that accepts nothing: its backlog fills, and a blocking connect would wait forever.
  auto listener = UnixListener::Listen(path_, "stalled server", /*backlog=*/0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::vector<UnixStream> queued;
  Status last = Status::OK();
  for (int i = 0; i < 8 && last.ok(); ++i) {
    auto c = UnixStream::Connect(path_, "the stalled server", Clock::now() + milliseconds(100));
    if (c.ok()) {
      queued.push_back(std::move(*c));
    } else {
      last = c.status();
    }
  }
  EXPECT_EQ(last.code(), StatusCode::kTimedOut) << last;
  EXPECT_NE(last.message().find("accepts no connection"), std::string::npos) << last;
  EXPECT_LE(queued.size(), 2u) << "a backlog of 0 holds one or two connections";
}

TEST_F(UnixSocketTest, ConnectWaitsForRoomInTheBacklogUntilItsDeadline) {
  // The backlog is full at first; the server accepts 50 ms later: the connect then succeeds.
  auto listener = UnixListener::Listen(path_, "slow server", /*backlog=*/0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::vector<UnixStream> queued;
  while (queued.size() < 4) {
    auto c = UnixStream::Connect(path_, "the slow server", Clock::now() + milliseconds(20));
    if (!c.ok()) break;
    queued.push_back(std::move(*c));
  }
  ASSERT_FALSE(queued.empty());
  std::vector<UniqueFd> accepted;
  std::thread server([&] {
    std::this_thread::sleep_for(milliseconds(50));
    for (size_t i = 0; i <= queued.size(); ++i) {
      auto fd = listener->Accept();
      if (!fd.ok()) return;
      accepted.push_back(std::move(*fd));
    }
  });
  auto late = UnixStream::Connect(path_, "the slow server", Clock::now() + std::chrono::seconds(5));
  if (!late.ok()) listener->Shutdown();  // the server waits for no connection that never comes
  server.join();
  ASSERT_TRUE(late.ok()) << late.status();
  const std::string hello = "in";
  EXPECT_TRUE(late->SendAll(hello.data(), hello.size(), Soon()).ok());
  EXPECT_EQ(accepted.size(), queued.size() + 1);
}

TEST_F(UnixSocketTest, ConnectToNothingSaysWhereAndWhy) {
  auto none = UnixStream::Connect(path_, "the plasma store", Soon());
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(none.status().message().find("cannot connect to the plasma store at '" + path_),
            std::string::npos)
      << none.status();
  auto too_long = UnixStream::Connect("/tmp/" + std::string(200, 'x'), "the plasma store", Soon());
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument) << too_long.status();
  auto empty = UnixStream::Connect("", "the plasma store", Soon());
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument) << empty.status();
}

TEST_F(UnixSocketTest, ListenerReplacesAStaleSocketButNothingElse) {
  {
    UniqueFd file(open(path_.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
    ASSERT_TRUE(file.valid());
  }
  auto refused = UnixListener::Listen(path_, "pull socket");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("exists and is not a socket"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(lstat(path_.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode)) << "the file is left where it was";
  ASSERT_EQ(unlink(path_.c_str()), 0);

  {
    // A socket left behind by a process that died (never unlinked).
    UniqueFd stale(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(stale.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    ASSERT_EQ(bind(stale.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  auto replaced = UnixListener::Listen(path_, "pull socket");
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_TRUE(UnixStream::Connect(path_, "the new socket", Soon()).ok());
}

TEST_F(UnixSocketTest, ReadEndsByItsDeadlineHoweverThePeerTrickles) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UnixStream reader = UnixStream::Adopt(UniqueFd(fds[0]), "a trickling peer");
  UniqueFd writer(fds[1]);
  std::thread trickle([&] {
    for (int i = 0; i < 20; ++i) {
      if (write(writer.get(), "x", 1) != 1) return;
      std::this_thread::sleep_for(milliseconds(50));
    }
  });
  char buf[64];
  const auto started = Clock::now();
  Status s = reader.RecvExact(buf, sizeof(buf), started + milliseconds(300));
  const auto took = Clock::now() - started;
  trickle.join();
  EXPECT_EQ(s.code(), StatusCode::kTimedOut) << s;
  EXPECT_NE(s.message().find("a trickling peer did not send what we wait for in time"),
            std::string::npos)
      << s;
  EXPECT_LT(took, milliseconds(900));  // the deadline, not 64 bytes x 50 ms
}

TEST_F(UnixSocketTest, WriteEndsByItsDeadlineWhenThePeerDoesNotRead) {
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UnixStream writer = UnixStream::Adopt(UniqueFd(fds[0]), "a peer that never reads");
  UniqueFd idle(fds[1]);
  // Far more than the socket buffers hold: one blocking send() would wait for the peer forever.
  std::vector<char> big(64u << 20, 'y');
  const auto started = Clock::now();
  Status s = writer.SendAll(big.data(), big.size(), started + milliseconds(300));
  const auto took = Clock::now() - started;
  EXPECT_EQ(s.code(), StatusCode::kTimedOut) << s;
  EXPECT_LT(took, milliseconds(900));
}

TEST_F(UnixSocketTest, ShutdownWakesABlockedReadAndAccept) {
  auto listener = UnixListener::Listen(path_, "test socket");
  ASSERT_TRUE(listener.ok()) << listener.status();
  std::thread waker([&] {
    std::this_thread::sleep_for(milliseconds(100));
    listener->Shutdown();
  });
  auto accepted = listener->Accept();
  waker.join();
  ASSERT_FALSE(accepted.ok());
  EXPECT_EQ(accepted.status().code(), StatusCode::kUnavailable) << accepted.status();

  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  UnixStream reader = UnixStream::Adopt(UniqueFd(fds[0]), "a silent peer");
  UniqueFd silent(fds[1]);
  std::thread stopper([&] {
    std::this_thread::sleep_for(milliseconds(100));
    reader.Shutdown();
  });
  char byte;
  const auto started = Clock::now();
  Status s = reader.RecvExact(&byte, 1, started + std::chrono::seconds(30));
  stopper.join();
  EXPECT_FALSE(s.ok());
  EXPECT_LT(Clock::now() - started, std::chrono::seconds(5));
}

TEST_F(UnixSocketTest, ListenerUnlinksItsPathOnlyWhileItIsStillItsOwn) {
  {
    auto listener = UnixListener::Listen(path_, "test socket");
    ASSERT_TRUE(listener.ok()) << listener.status();
  }
  EXPECT_NE(access(path_.c_str(), F_OK), 0) << "its own socket is unlinked at the end";

  auto older = UnixListener::Listen(path_, "older socket");
  ASSERT_TRUE(older.ok()) << older.status();
  {
    // A newer process binds the same path (replacing the older one's file) ...
    auto newer = UnixListener::Listen(path_, "newer socket");
    ASSERT_TRUE(newer.ok()) << newer.status();
    // ... and the older one ends first: the newer socket stays.
    older->Close();
    EXPECT_EQ(access(path_.c_str(), F_OK), 0) << "the older must not unlink the newer's socket";
    EXPECT_TRUE(UnixStream::Connect(path_, "the newer socket", Soon()).ok());
  }
  // The newer one ended last: its own file went with it.
  EXPECT_NE(access(path_.c_str(), F_OK), 0);

  auto first = UnixListener::Listen(path_, "first socket");
  ASSERT_TRUE(first.ok());
  auto second = UnixListener::Listen(path_, "second socket");
  ASSERT_TRUE(second.ok());
  { UnixListener ended = std::move(*first); }
  EXPECT_EQ(access(path_.c_str(), F_OK), 0) << "the first must not unlink the second's socket";
  auto still = UnixStream::Connect(path_, "the second socket", Soon());
  EXPECT_TRUE(still.ok()) << still.status();
}

}  // namespace
}  // namespace rayfabric
