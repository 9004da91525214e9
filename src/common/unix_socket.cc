#include "common/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

namespace rayfabric {
namespace {

// Called with errno saved at once: the string operations around it may change errno.
std::string ErrnoText(int err) { return std::string(std::strerror(err)); }

// sun_path holds the path and its NUL.
Status FillAddress(const std::string& path, const std::string& what, sockaddr_un& addr) {
  addr = sockaddr_un{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument(what + " path '" + path + "' is empty or longer than " +
                           std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return Status::OK();
}

}  // namespace

void UniqueFd::Reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Result<BoundFile> BoundFile::Of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    return Unavailable("lstat " + path + ": " + ErrnoText(err));
  }
  return BoundFile{st.st_dev, st.st_ino};
}

bool BoundFile::UnlinkIfStill(const std::string& path) const {
  struct stat now {};
  if (::lstat(path.c_str(), &now) != 0 || now.st_dev != dev || now.st_ino != ino) return false;
  return ::unlink(path.c_str()) == 0;
}

Result<UnixStream> UnixStream::Connect(const std::string& path, std::string peer,
                                       Clock::time_point deadline) {
  sockaddr_un addr{};
  RF_RETURN_IF_ERROR(FillAddress(path, peer + " socket", addr));
  // Non-blocking: every later read and write polls to its deadline anyway.
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    const int err = errno;
    return Unavailable("socket(AF_UNIX) failed: " + ErrnoText(err));
  }
  // A Unix socket connects at once or, with the server's backlog full, says EAGAIN (there is
  // nothing to poll for): asked again, 1 ms apart at first and at most 20 ms, until the deadline.
  auto pause = std::chrono::milliseconds(1);
  while (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err != EAGAIN) {
      return Unavailable("cannot connect to " + peer + " at '" + path + "': " + ErrnoText(err));
    }
    if (Clock::now() >= deadline) {
      return TimedOut(peer + " at '" + path +
                      "' accepts no connection (its backlog stayed full): is it stalled?");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
  return UnixStream(std::move(fd), std::move(peer));
}

UnixStream UnixStream::Adopt(UniqueFd fd, std::string peer) {
  return UnixStream(std::move(fd), std::move(peer));
}

Status UnixStream::WaitFor(short events, Clock::time_point deadline, const char* what) {
  if (!fd_.valid()) return Unavailable("the connection to " + peer_ + " is closed");
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() < 0) left = std::chrono::milliseconds(0);
    pollfd p{fd_.get(), events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), INT32_MAX)));
    if (rc > 0) return Status::OK();  // readable/writable, or an error the next call reports
    if (rc == 0) return TimedOut(peer_ + " did not " + what + " in time");
    const int err = errno;
    if (err != EINTR) return Unavailable("poll failed: " + ErrnoText(err));
  }
}

Status UnixStream::SendAll(const void* data, size_t size, Clock::time_point deadline) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    RF_RETURN_IF_ERROR(WaitFor(POLLOUT, deadline, "take what we sent"));
    // MSG_DONTWAIT: a blocking send of more than the socket's free space would wait for the
    // peer past the deadline.
    const ssize_t n = ::send(fd_.get(), p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN) continue;
      return Unavailable("write to " + peer_ + " failed: " + ErrnoText(err) + " (did it exit?)");
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

Status UnixStream::RecvExact(void* data, size_t size, Clock::time_point deadline) {
  auto* p = static_cast<uint8_t*>(data);
  while (size > 0) {
    RF_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, "send what we wait for"));
    const ssize_t n = ::recv(fd_.get(), p, size, MSG_DONTWAIT);
    if (n == 0) return Unavailable(peer_ + " closed the connection (it exited, or refused us)");
    if (n < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN) continue;
      return Unavailable("read from " + peer_ + " failed: " + ErrnoText(err));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::OK();
}

Result<UniqueFd> UnixStream::RecvFd(Clock::time_point deadline) {
  while (true) {
    RF_RETURN_IF_ERROR(WaitFor(POLLIN, deadline, "send an fd"));
    char byte = 0;
    iovec iov{&byte, 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN) continue;
      return Unavailable("receiving an fd from " + peer_ + " failed: " + ErrnoText(err));
    }
    if (n == 0) return Unavailable(peer_ + " closed the connection before sending an fd");
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    if (c == nullptr || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS ||
        c->cmsg_len != CMSG_LEN(sizeof(int))) {
      return ProtocolError("expected an fd (SCM_RIGHTS) from " + peer_ +
                           " but got a plain byte: its bookkeeping of what it sent and ours "
                           "of what we received differ");
    }
    int fd;
    std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
    UniqueFd owned(fd);
    if (msg.msg_flags & MSG_CTRUNC) {
      return ProtocolError("the fd message from " + peer_ + " was truncated");
    }
    return owned;
  }
}

bool UnixStream::PeerHungUp() const {
  if (!fd_.valid()) return true;
  pollfd p{fd_.get(), POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

Result<uid_t> UnixStream::PeerUid() const {
  struct ucred cred {};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    const int err = errno;
    return Unavailable("SO_PEERCRED on the connection to " + peer_ + ": " + ErrnoText(err));
  }
  return cred.uid;
}

void UnixStream::Shutdown() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

Result<UnixListener> UnixListener::Listen(const std::string& path, const std::string& what,
                                          int backlog) {
  sockaddr_un addr{};
  RF_RETURN_IF_ERROR(FillAddress(path, what, addr));
  // A stale socket of an earlier process is replaced; anything else there is not ours to remove.
  struct stat there {};
  if (::lstat(path.c_str(), &there) == 0) {
    if (!S_ISSOCK(there.st_mode)) {
      return InvalidArgument(what + ": " + path +
                             " exists and is not a socket: not removed; pick another path");
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      const int err = errno;
      return Unavailable(what + ": cannot remove the stale socket " + path + ": " + ErrnoText(err) +
                         " (another user's? remove it, or pick another path)");
    }
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    const int err = errno;
    return Unavailable(what + ": socket(): " + ErrnoText(err));
  }
  // The file bind() creates takes the socket inode's mode, less the umask (Linux): 0600 from its
  // first moment, whatever wider mode the umask would have left.
  if (::fchmod(fd.get(), 0600) != 0) {
    const int err = errno;
    return Unavailable(what + ": fchmod 0600: " + ErrnoText(err));
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    return Unavailable(what + ": cannot bind " + path + ": " + ErrnoText(err) +
                       (err == EADDRINUSE ? " (another process bound it just now)"
                                          : " (its directory missing or not writable?)"));
  }
  // One look at the file bind() made: which file it is (for the unlink at the end), and its mode.
  struct stat made {};
  if (::lstat(path.c_str(), &made) != 0) {
    const int err = errno;
    return Unavailable(what + ": " + path + " vanished after bind: " + ErrnoText(err));
  }
  // From here a failure closes the socket and unlinks its file (the listener's destructor).
  UnixListener listener(std::move(fd), path, BoundFile{made.st_dev, made.st_ino});
  if (!S_ISSOCK(made.st_mode) || (made.st_mode & 0777) != 0600) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(made.st_mode & 07777));
    return PermissionDenied(what + ": " + path + " was created with mode " + mode +
                            ", not 0600 (a umask that takes the owner's read or write away?): "
                            "not served");
  }
  if (::listen(listener.fd_.get(), backlog) != 0) {
    const int err = errno;
    return Unavailable(what + ": listen on " + path + ": " + ErrnoText(err));
  }
  return listener;
}

Result<UniqueFd> UnixListener::Accept() {
  while (true) {
    UniqueFd fd(::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (fd.valid()) return fd;
    const int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EINVAL || err == EBADF) return Unavailable(path_ + ": no longer listening");
    if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
      return ResourceExhausted("accept on " + path_ + ": " + ErrnoText(err));
    }
    return Internal("accept on " + path_ + ": " + ErrnoText(err));
  }
}

void UnixListener::Shutdown() {
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
}

void UnixListener::Close() {
  if (!fd_.valid()) return;  // closed already, or moved from
  fd_.Reset();
  bound_.UnlinkIfStill(path_);
}

UnixListener::~UnixListener() { Close(); }

}  // namespace rayfabric
