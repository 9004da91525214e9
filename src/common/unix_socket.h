// Unix stream sockets, as this project uses them: an RAII fd; a connection whose reads and writes
// each end by a deadline (and SCM_RIGHTS fd receipt, as Ray's plasma store sends segments); a
// listening socket that is private from the moment it exists and is unlinked at the end only if
// it is still the one it bound. Nothing here knows of plasma, gRPC or libfabric.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <string>

#include "rayfabric/status.h"

namespace rayfabric {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = other.Release();
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// Which file a path named when it was bound: a later unlink removes it only if it is still that
// one (a newer process may have bound the path since).
struct BoundFile {
  dev_t dev = 0;
  ino_t ino = 0;

  static Result<BoundFile> Of(const std::string& path);
  // Unlinks `path` if it still names this file; false (nothing done) if not, or if it is gone.
  bool UnlinkIfStill(const std::string& path) const;
};

class UnixStream {
 public:
  using Clock = std::chrono::steady_clock;

  // `peer` names the other end in every error ("the plasma store", "a pull-socket caller").
  // Unavailable (with the path and errno text) when nothing accepts at `path`; TimedOut when the
  // peer's backlog stays full until `deadline` (a stalled server: a blocking connect would wait
  // for it forever).
  static Result<UnixStream> Connect(const std::string& path, std::string peer,
                                    Clock::time_point deadline);
  // A connection accepted elsewhere (UnixListener::Accept).
  static UnixStream Adopt(UniqueFd fd, std::string peer);

  // Every write and read below ends by `deadline` however the peer trickles or stalls: TimedOut.
  Status SendAll(const void* data, size_t size, Clock::time_point deadline);
  // Reads exactly `size` bytes, never more: an fd that follows must stay in the socket.
  Status RecvExact(void* data, size_t size, Clock::time_point deadline);
  // Receives one byte carrying one fd by SCM_RIGHTS (the store's send_fd).
  Result<UniqueFd> RecvFd(Clock::time_point deadline);

  // True once the peer hung up or the connection broke (checked without waiting).
  bool PeerHungUp() const;
  // The peer's uid (SO_PEERCRED: the uid of the process that connected).
  Result<uid_t> PeerUid() const;
  // Wakes a read or write blocked on this connection in another thread (they then fail); the fd
  // stays open until Close or destruction.
  void Shutdown();

  bool valid() const { return fd_.valid(); }
  void Close() { fd_.Reset(); }
  const std::string& peer() const { return peer_; }

 private:
  UnixStream(UniqueFd fd, std::string peer) : fd_(std::move(fd)), peer_(std::move(peer)) {}
  Status WaitFor(short events, Clock::time_point deadline, const char* what);

  UniqueFd fd_;
  std::string peer_;
};

class UnixListener {
 public:
  // Listens on `path`, mode 0600 from the socket's creation (no moment in which another user
  // could connect), replacing a stale socket there (anything else there is refused, not
  // removed). `what` names it in errors.
  static Result<UnixListener> Listen(const std::string& path, const std::string& what,
                                     int backlog = 128);
  // Waits for the next connection. Unavailable once Shutdown was called; other errors (out of
  // fds or memory) are the caller's to retry.
  Result<UniqueFd> Accept();
  // Wakes Accept in another thread (it then returns Unavailable).
  void Shutdown();
  // Closes the socket and unlinks its path if it still names the socket this bound (once: a
  // later Close, or the destructor, does nothing). No Accept may run meanwhile.
  void Close();
  ~UnixListener();
  UnixListener(UnixListener&& other) noexcept = default;
  UnixListener& operator=(UnixListener&&) = delete;
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  const std::string& path() const { return path_; }

 private:
  UnixListener(UniqueFd fd, std::string path, BoundFile bound)
      : fd_(std::move(fd)), path_(std::move(path)), bound_(bound) {}

  UniqueFd fd_;
  std::string path_;
  BoundFile bound_;
};

}  // namespace rayfabric
