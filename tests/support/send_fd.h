// Test support: sends one fd over a Unix socket as Ray's plasma store does (send_fd: one byte
// carrying the fd by SCM_RIGHTS), for tests that play the store's side of UnixStream::RecvFd.
#pragma once

#include <sys/socket.h>

#include <cstring>

namespace rayfabric::testing {

// True when the byte and its fd were sent.
inline bool SendOneFd(int socket, int fd) {
  char byte = 0;
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return ::sendmsg(socket, &msg, MSG_NOSIGNAL) == 1;
}

}  // namespace rayfabric::testing
