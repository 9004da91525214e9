#include "agent/pull_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

#include "rayfabric/log.h"

namespace rayfabric::agent {
namespace {

using Clock = std::chrono::steady_clock;

// As on the gRPC face: refusals are counted one by one, logged at most 10 lines a minute.
LogLimiter& RefusalLog() {
  static LogLimiter limiter(10, std::chrono::minutes(1));
  return limiter;
}

uint32_t LoadLe32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

void StoreLe32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// Reads exactly n bytes by `deadline`; false on end of stream, error or the deadline (the
// connection is then closed). A deadline per frame, not per read: a peer that trickles bytes
// holds its connection no longer than one that sends nothing.
bool ReadFull(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    struct pollfd readable = {fd, POLLIN, 0};
    if (left <= 0 || poll(&readable, 1, static_cast<int>(left)) == 0) return false;
    ssize_t got = recv(fd, p, n, MSG_DONTWAIT);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// A request body, grown by what arrives (a header alone commits no memory).
bool ReadBody(int fd, std::string& body, size_t n, Clock::time_point deadline) {
  char chunk[64 << 10];
  body.clear();
  while (body.size() < n) {
    const size_t step = std::min(sizeof(chunk), n - body.size());
    if (!ReadFull(fd, chunk, step, deadline)) return false;
    body.append(chunk, step);
  }
  return true;
}

bool WriteFull(int fd, const void* buf, size_t n) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t put = send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

bool Reply(int fd, uint32_t code, const std::string& body) {
  unsigned char header[8];
  StoreLe32(header, code);
  StoreLe32(header + 4, static_cast<uint32_t>(body.size()));
  return WriteFull(fd, header, sizeof(header)) && WriteFull(fd, body.data(), body.size());
}

// True once the caller hung up (its timeout, its exit): its pull is then cut short.
bool HungUp(int fd) {
  struct pollfd p = {fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

Result<std::unique_ptr<PullSocket>> PullSocket::Start(const std::string& path, Agent* agent,
                                                      Credentials credentials) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("pull socket path '" + path + "' is empty or longer than " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Unavailable(std::string("pull socket: socket(): ") + strerror(errno));
  // The mode of the socket's inode becomes the mode of the file bind() creates (Linux): no
  // moment in which another user could connect.
  if (fchmod(fd, 0600) != 0) {
    const int e = errno;
    close(fd);
    return Unavailable("pull socket: fchmod 0600: " + std::string(strerror(e)));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  unlink(path.c_str());  // a stale socket of an earlier agent of this node
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      chmod(path.c_str(), 0600) != 0 || listen(fd, 128) != 0) {
    const int e = errno;
    close(fd);
    return Unavailable("pull socket: cannot listen on " + path + ": " + strerror(e) +
                       " (its directory missing or not writable?)");
  }
  struct stat bound {};
  if (stat(path.c_str(), &bound) != 0) {
    const int e = errno;
    close(fd);
    return Unavailable("pull socket: " + path + " vanished after bind: " + strerror(e));
  }
  auto socket =
      std::unique_ptr<PullSocket>(new PullSocket(path, fd, agent, std::move(credentials)));
  socket->bound_dev_ = bound.st_dev;
  socket->bound_ino_ = bound.st_ino;
  try {
    socket->acceptor_ = std::thread([raw = socket.get()] { raw->AcceptLoop(); });
  } catch (const std::system_error& e) {
    return ResourceExhausted(std::string("pull socket: no thread to accept on it: ") + e.what());
  }
  return socket;
}

PullSocket::PullSocket(std::string path, int listen_fd, Agent* agent, Credentials credentials)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      agent_(agent),
      credentials_(std::move(credentials)) {}

PullSocket::~PullSocket() {
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
  if (acceptor_.joinable()) acceptor_.join();
  close(listen_fd_);
  // Only our own socket: a newer agent of this node may have bound the path since.
  struct stat now {};
  if (stat(path_.c_str(), &now) == 0 && now.st_dev == bound_dev_ && now.st_ino == bound_ino_) {
    unlink(path_.c_str());
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (int fd : open_) shutdown(fd, SHUT_RDWR);  // wakes their reads; their pulls see stopping_
  ended_.wait(lock, [this] { return open_.empty(); });
}

void PullSocket::AcceptLoop() {
  while (!stopping_) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of fds or memory, for now: never stop accepting (callers would queue in the
      // backlog until their own timeouts), try again in a moment.
      RF_LOG_LIMITED(RefusalLog(), kWarn,
                     "pull socket " << path_ << ": accept: " << strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    // A send the caller does not take is given up after this long (per send() call: a caller
    // that reads slowly but reads is served).
    struct timeval send_bound {};
    send_bound.tv_sec = kPullSocketIdleSeconds;
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_bound, sizeof(send_bound));
    struct ucred peer {};
    socklen_t len = sizeof(peer);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 ||
        (peer.uid != getuid() && peer.uid != 0)) {
      agent_->CountUnauthenticated();
      Refuse(fd, StatusCode::kPermissionDenied,
             "Pull: the pull socket serves processes of this agent's user (uid " +
                 std::to_string(getuid()) + ") only; uid " + std::to_string(peer.uid) +
                 " is not it");
      close(fd);
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (open_.size() >= static_cast<size_t>(kPullSocketMaxConnections)) {
      agent_->CountRejectedRequest();
      Refuse(fd, StatusCode::kResourceExhausted,
             "Pull: the pull socket serves at most " + std::to_string(kPullSocketMaxConnections) +
                 " connections at once; use the agent's gRPC local socket, or fewer threads");
      close(fd);
      continue;
    }
    open_.insert(fd);
    try {
      std::thread([this, fd] { Serve(fd); }).detach();
    } catch (const std::system_error& e) {
      open_.erase(fd);
      Refuse(fd, StatusCode::kResourceExhausted,
             std::string("Pull: no thread for this connection: ") + e.what());
      close(fd);
    }
  }
}

void PullSocket::Serve(int fd) {
  while (!stopping_ && ServeOne(fd)) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  close(fd);
  open_.erase(fd);
  ended_.notify_all();
}

bool PullSocket::Refuse(int fd, StatusCode code, const std::string& why) {
  RF_LOG_LIMITED(RefusalLog(), kWarn, "pull socket " << path_ << ": refused: " << why);
  Reply(fd, static_cast<uint32_t>(ToErrorCode(code)), why);
  return false;
}

bool PullSocket::ServeOne(int fd) {
  unsigned char header[16];
  const auto idle = std::chrono::seconds(kPullSocketIdleSeconds);
  // The first byte within the idle bound; the rest of the frame within as long again.
  if (!ReadFull(fd, header, 1, Clock::now() + idle)) return false;  // closed by the caller, or idle
  const Clock::time_point received = Clock::now();
  const Clock::time_point frame_by = received + idle;
  if (!ReadFull(fd, header + 1, sizeof(header) - 1, frame_by)) return false;
  const uint32_t deadline_ms = LoadLe32(header + 4);
  const uint32_t auth_len = LoadLe32(header + 8);
  const uint32_t body_len = LoadLe32(header + 12);
  if (std::memcmp(header, kPullSocketMagic, 4) != 0) {
    agent_->CountRejectedRequest();
    return Refuse(fd, StatusCode::kInvalidArgument,
                  "Pull: not a pull-socket request (no 'RFP1' frame): speak the framing of "
                  "src/agent/pull_socket.h, or gRPC on the agent's local_socket");
  }
  if (auth_len > kPullSocketMaxAuthorization || body_len > kPullSocketMaxBody) {
    agent_->CountRejectedRequest();
    return Refuse(fd, StatusCode::kInvalidArgument,
                  "Pull: a frame of " + std::to_string(auth_len) + " + " +
                      std::to_string(body_len) + " bytes is over the bounds (" +
                      std::to_string(kPullSocketMaxAuthorization) + " of authorization, " +
                      std::to_string(kPullSocketMaxBody) + " of request)");
  }
  // The authorization first (it precedes the body): a caller without the token makes the agent
  // hold no more than its 4 KiB.
  std::string authorization(auth_len, '\0');
  if (!ReadFull(fd, authorization.data(), auth_len, frame_by)) return false;  // cut mid-frame
  Status auth = credentials_.CheckAuthorization(authorization);
  if (!auth.ok()) {
    agent_->CountUnauthenticated();
    return Refuse(fd, auth.code(), "Pull: " + auth.message());
  }
  std::string body;
  if (!ReadBody(fd, body, body_len, frame_by)) return false;  // cut mid-frame: nothing to answer
  v1::PullRequest request;
  if (!request.ParseFromString(body)) {
    agent_->CountRejectedRequest();
    return Refuse(fd, StatusCode::kInvalidArgument,
                  "Pull: the request's " + std::to_string(body_len) +
                      " bytes are not a rayfabric.v1.PullRequest");
  }
  Status shape = agent_->CheckPullRequest(request);
  if (!shape.ok()) {
    // Well framed: the connection stays usable (a caller of another version hears why).
    Reply(fd, static_cast<uint32_t>(ToErrorCode(shape.code())), shape.message());
    return true;
  }
  const Clock::time_point deadline = deadline_ms == 0
                                         ? Clock::time_point::max()
                                         : received + std::chrono::milliseconds(deadline_ms);
  v1::PullReply reply =
      agent_->Pull(request, deadline, [this, fd] { return stopping_.load() || HungUp(fd); });
  std::string out;
  if (!reply.SerializeToString(&out)) {
    return Refuse(fd, StatusCode::kInternal, "Pull: the reply could not be serialized");
  }
  return Reply(fd, 0, out);
}

}  // namespace rayfabric::agent
