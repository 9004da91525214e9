#include "plasma/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace rayfabric::plasma {
namespace {

std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

}  // namespace

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<UnixStream> UnixStream::Connect(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("plasma socket path '" + path + "' is empty or longer than " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Unavailable("socket(AF_UNIX) failed: " + ErrnoText(errno));
  int rc;
  do {
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    return Unavailable("cannot connect to the plasma store at '" + path + "': " + ErrnoText(err) +
                       "; is the raylet of this node running, and is this the socket "
                       "of its session (ray.nodes()[i]['ObjectStoreSocketName'])?");
  }
  return UnixStream(std::move(fd));
}

Status UnixStream::WaitFor(short events, Clock::time_point deadline, const char* what) {
  if (!fd_.valid()) return Unavailable("the plasma store connection is closed");
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    pollfd p{fd_.get(), events, 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
    if (rc > 0) return Status::OK();  // readable/writable, or an error the next call reports
    if (rc == 0) {
      return TimedOut(std::string("the plasma store did not ") + what + " in time");
    }
    if (errno != EINTR) return Unavailable(std::string("poll failed: ") + ErrnoText(errno));
  }
}

Status UnixStream::SendAll(const void* data, size_t size, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    RF_RETURN_IF_ERROR(WaitFor(POLLOUT, deadline, "accept our request"));
    ssize_t n = ::send(fd_.get(), p, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Unavailable("write to the plasma store failed: " + ErrnoText(errno) +
                         " (did the raylet exit?)");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

Status UnixStream::RecvExact(void* data, size_t size, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    RF_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, "reply"));
    ssize_t n = ::recv(fd_.get(), p, size, 0);
    if (n == 0) {
      return Unavailable(
          "the plasma store closed the connection (raylet exited or refused "
          "our request)");
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Unavailable("read from the plasma store failed: " + ErrnoText(errno));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

Result<UniqueFd> UnixStream::RecvFd(Clock::time_point deadline) {
  while (true) {
    RF_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, "send a segment fd"));
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return Unavailable("receiving a segment fd from the plasma store failed: " +
                         ErrnoText(errno));
    }
    if (n == 0) return Unavailable("the plasma store closed the connection before sending an fd");
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
        c->cmsg_len != CMSG_LEN(sizeof(int))) {
      return ProtocolError(
          "expected a segment fd (SCM_RIGHTS) from the plasma store but got a "
          "plain byte: the client's segment bookkeeping and the store's differ");
    }
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    UniqueFd owned(fd);
    if (msg.msg_flags & MSG_CTRUNC) {
      return ProtocolError("segment fd message from the plasma store was truncated");
    }
    return owned;
  }
}

}  // namespace rayfabric::plasma
