// RAII fd and a blocking Unix stream socket with deadline-bounded reads and writes, plus
// SCM_RIGHTS fd receipt. Nothing here knows about plasma messages.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "rayfabric/status.h"

namespace rayfabric::plasma {

using Clock = std::chrono::steady_clock;

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

class UnixStream {
 public:
  // Unavailable (with the path and errno text) when nothing accepts at `path`.
  static Result<UnixStream> Connect(const std::string& path);

  Status SendAll(const void* data, size_t size, Clock::time_point deadline);
  // Reads exactly `size` bytes, never more: an fd that follows must stay in the socket.
  Status RecvExact(void* data, size_t size, Clock::time_point deadline);
  // Receives one byte carrying one fd by SCM_RIGHTS (the store's send_fd).
  Result<UniqueFd> RecvFd(Clock::time_point deadline);

  bool valid() const { return fd_.valid(); }
  void Close() { fd_.Reset(); }

 private:
  explicit UnixStream(UniqueFd fd) : fd_(std::move(fd)) {}
  Status WaitFor(short events, Clock::time_point deadline, const char* what);

  UniqueFd fd_;
};

}  // namespace rayfabric::plasma
