// The agent's pull socket: Pull for this node's processes over a plain Unix socket, beside the
// gRPC one. Why: on the development VM a gRPC call over a Unix socket costs ~0.5 ms, a plain
// socket round trip ~0.04 ms, and a 1 MiB get ~3 ms in all (docs/benchmarks-history.md,
// session 14).
//
// Who may ask: the socket is 0600 and, once per connection, the peer's uid (SO_PEERCRED) must be
// the agent's or root's; on every request, as the gRPC face checks them, the Ray cluster's token
// when it uses one, the protocol version, 1..kMaxItemsPerRequest items. No TLS: the bytes never
// leave the kernel, and a process that may open this socket may open the node's plasma socket,
// which creates objects with no credentials at all.
//
// Frames, little-endian:
//   request  "RFP1" | u32 deadline_ms | u32 authorization_len | u32 body_len
//            | authorization ("Bearer <token>" or empty) | body (v1::PullRequest)
//   reply    u32 code | u32 body_len | body
//            (code 0: a v1::PullReply; else a v1::ErrorCode and a UTF-8 message)
// deadline_ms: the caller's own deadline from now (0: none), as gRPC's deadline. A connection
// carries any number of requests, one at a time, and is closed after kPullSocketIdleSeconds
// without one. A malformed or unauthenticated request is answered with its reason and the
// connection closed; a caller that hangs up cancels its pull.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "agent/agent.h"
#include "agent/auth.h"
#include "common/unix_socket.h"
#include "rayfabric/status.h"

namespace rayfabric::agent {

inline constexpr char kPullSocketMagic[4] = {'R', 'F', 'P', '1'};
inline constexpr size_t kPullSocketMaxBody = 64u << 20;      // as gRPC's message bound
inline constexpr size_t kPullSocketMaxAuthorization = 4096;  // "Bearer " + a token
// One thread per connection; callers keep theirs between calls, so idle ones are closed (a caller
// connects again, ~0.1 ms) and a node's many worker processes stay under the bound. A caller over
// the bound is told so (RESOURCE_EXHAUSTED) and pulls over gRPC's local socket instead.
inline constexpr int kPullSocketMaxConnections = 256;
// A connection that sends nothing for this long, or takes longer to send the rest of a frame once
// it began, or does not take a reply within this long, is closed.
inline constexpr int kPullSocketIdleSeconds = 10;

class PullSocket {
 public:
  // Listens on `path` (replacing a stale socket there). `agent` outlives the PullSocket.
  static Result<std::unique_ptr<PullSocket>> Start(const std::string& path, Agent* agent,
                                                   Credentials credentials);
  // Stops accepting, cancels the pulls under way, waits for their threads and unlinks the
  // socket if it is still the one it bound (a newer agent of this node may have bound the path).
  ~PullSocket();
  PullSocket(const PullSocket&) = delete;
  PullSocket& operator=(const PullSocket&) = delete;

  const std::string& path() const { return listener_.path(); }

 private:
  PullSocket(UnixListener listener, Agent* agent, Credentials credentials);
  void AcceptLoop();
  void Serve(std::unique_ptr<UnixStream> caller);
  // One request: false when the connection is to be closed.
  bool ServeOne(UnixStream& caller);
  // Answers `why` (within `bound`) and says the connection is to be closed.
  bool Refuse(
      UnixStream& caller, StatusCode code, const std::string& why,
      std::chrono::steady_clock::duration bound = std::chrono::seconds(kPullSocketIdleSeconds));

  UnixListener listener_;
  Agent* const agent_;
  const Credentials credentials_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable ended_;
  std::set<UnixStream*> open_;  // connections being served (their threads are detached)
  std::thread acceptor_;
};

}  // namespace rayfabric::agent
