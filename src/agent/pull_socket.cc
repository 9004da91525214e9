#include "agent/pull_socket.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

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

// A request body, grown by what arrives (a header alone commits no memory).
bool ReadBody(UnixStream& caller, std::string& body, size_t n, Clock::time_point deadline) {
  char chunk[64 << 10];
  body.clear();
  while (body.size() < n) {
    const size_t step = std::min(sizeof(chunk), n - body.size());
    if (!caller.RecvExact(chunk, step, deadline).ok()) return false;
    body.append(chunk, step);
  }
  return true;
}

// A reply the caller does not take within `bound` is given up (and the connection closed).
bool Reply(UnixStream& caller, uint32_t code, const std::string& body, Clock::duration bound) {
  unsigned char header[8];
  StoreLe32(header, code);
  StoreLe32(header + 4, static_cast<uint32_t>(body.size()));
  const Clock::time_point by = Clock::now() + bound;
  return caller.SendAll(header, sizeof(header), by).ok() &&
         caller.SendAll(body.data(), body.size(), by).ok();
}

}  // namespace

Result<std::unique_ptr<PullSocket>> PullSocket::Start(const std::string& path, Agent* agent,
                                                      Credentials credentials) {
  RF_ASSIGN_OR_RETURN(UnixListener listener, UnixListener::Listen(path, "pull socket"));
  auto socket = std::unique_ptr<PullSocket>(
      new PullSocket(std::move(listener), agent, std::move(credentials)));
  try {
    socket->acceptor_ = std::thread([raw = socket.get()] { raw->AcceptLoop(); });
  } catch (const std::exception& e) {
    return ResourceExhausted(std::string("pull socket: no thread to accept on it: ") + e.what());
  }
  return socket;
}

PullSocket::PullSocket(UnixListener listener, Agent* agent, Credentials credentials)
    : listener_(std::move(listener)), agent_(agent), credentials_(std::move(credentials)) {}

PullSocket::~PullSocket() {
  stopping_ = true;
  listener_.Shutdown();  // wakes Accept()
  if (acceptor_.joinable()) acceptor_.join();
  // Callers still in the backlog are turned away at once, not after the pulls under way.
  listener_.Close();
  std::unique_lock<std::mutex> lock(mu_);
  for (UnixStream* caller : open_) caller->Shutdown();  // wakes their reads; pulls see stopping_
  ended_.wait(lock, [this] { return open_.empty(); });
}

void PullSocket::AcceptLoop() {
  // Refusals at the door are small and go to a fresh connection: the acceptor waits at most this
  // long on one.
  constexpr auto kDoorBound = std::chrono::milliseconds(100);
  while (!stopping_) {
    Result<UniqueFd> accepted = listener_.Accept();
    if (!accepted.ok()) {
      if (stopping_) return;
      // Out of fds or memory, for now: never stop accepting (callers would queue in the
      // backlog until their own timeouts), try again in a moment.
      RF_LOG_LIMITED(RefusalLog(), kWarn, "pull socket " << path() << ": " << accepted.status());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    auto caller = std::make_unique<UnixStream>(
        UnixStream::Adopt(std::move(*accepted), "a pull-socket caller"));
    const Result<uid_t> uid = caller->PeerUid();
    if (!uid.ok() || (*uid != getuid() && *uid != 0)) {
      agent_->CountRefusal(Count::kRequestsUnauthenticated);
      Refuse(*caller, StatusCode::kPermissionDenied,
             "Pull: the pull socket serves processes of this agent's user (uid " +
                 std::to_string(getuid()) + ") only; " +
                 (uid.ok() ? "uid " + std::to_string(*uid) + " is not it"
                           : "the caller's is unknown (" + uid.status().message() + ")"),
             kDoorBound);
      continue;
    }
    // Decided under the lock, answered outside it (a refusal may take up to kDoorBound).
    std::string refusal;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (open_.size() >= static_cast<size_t>(kPullSocketMaxConnections)) {
        refusal = "Pull: the pull socket serves at most " +
                  std::to_string(kPullSocketMaxConnections) +
                  " connections at once; use the agent's gRPC local socket, or fewer threads";
      } else {
        UnixStream* raw = caller.get();
        try {
          open_.insert(raw);
          std::thread([this, raw] { Serve(std::unique_ptr<UnixStream>(raw)); }).detach();
          // Its thread owns it now; it cannot end (and delete it) before this lock is let go.
          (void)caller.release();
          continue;
        } catch (const std::exception& e) {
          open_.erase(raw);
          refusal = std::string("Pull: the agent has no thread for this connection (") + e.what() +
                    "); use the agent's gRPC local socket";
        }
      }
    }
    agent_->CountRefusal(Count::kRequestsRejected);
    Refuse(*caller, StatusCode::kResourceExhausted, refusal, kDoorBound);
  }
}

void PullSocket::Serve(std::unique_ptr<UnixStream> caller) {
  while (!stopping_ && ServeOne(*caller)) {
  }
  std::lock_guard<std::mutex> lock(mu_);
  open_.erase(caller.get());
  caller.reset();  // closed before the destructor may go on
  ended_.notify_all();
}

bool PullSocket::Refuse(UnixStream& caller, StatusCode code, const std::string& why,
                        std::chrono::steady_clock::duration bound) {
  RF_LOG_LIMITED(RefusalLog(), kWarn, "pull socket " << path() << ": refused: " << why);
  Reply(caller, static_cast<uint32_t>(ToErrorCode(code)), why, bound);
  return false;
}

bool PullSocket::ServeOne(UnixStream& caller) {
  unsigned char header[16];
  const auto idle = std::chrono::seconds(kPullSocketIdleSeconds);
  // The first byte within the idle bound; the rest of the frame within as long again.
  // Closed by the caller, or idle:
  if (!caller.RecvExact(header, 1, Clock::now() + idle).ok()) return false;
  const Clock::time_point received = Clock::now();
  const Clock::time_point frame_by = received + idle;
  if (!caller.RecvExact(header + 1, sizeof(header) - 1, frame_by).ok()) return false;
  const uint32_t deadline_ms = LoadLe32(header + 4);
  const uint32_t auth_len = LoadLe32(header + 8);
  const uint32_t body_len = LoadLe32(header + 12);
  if (std::memcmp(header, kPullSocketMagic, 4) != 0) {
    agent_->CountRefusal(Count::kRequestsRejected);
    return Refuse(caller, StatusCode::kInvalidArgument,
                  "Pull: not a pull-socket request (no 'RFP1' frame): speak the framing of "
                  "src/agent/pull_socket.h, or gRPC on the agent's local_socket");
  }
  if (auth_len > kPullSocketMaxAuthorization || body_len > kPullSocketMaxBody) {
    agent_->CountRefusal(Count::kRequestsRejected);
    return Refuse(caller, StatusCode::kInvalidArgument,
                  "Pull: a frame of " + std::to_string(auth_len) + " + " +
                      std::to_string(body_len) + " bytes is over the bounds (" +
                      std::to_string(kPullSocketMaxAuthorization) + " of authorization, " +
                      std::to_string(kPullSocketMaxBody) + " of request)");
  }
  // The authorization first (it precedes the body): a caller without the token makes the agent
  // hold no more than its 4 KiB.
  std::string authorization(auth_len, '\0');
  if (!caller.RecvExact(authorization.data(), auth_len, frame_by).ok()) {
    return false;  // cut mid-frame
  }
  Status auth = credentials_.CheckAuthorization(authorization);
  if (!auth.ok()) {
    agent_->CountRefusal(Count::kRequestsUnauthenticated);
    return Refuse(caller, auth.code(), "Pull: " + auth.message());
  }
  std::string body;
  if (!ReadBody(caller, body, body_len, frame_by))
    return false;  // cut mid-frame: nothing to answer
  v1::PullRequest request;
  if (!request.ParseFromString(body)) {
    agent_->CountRefusal(Count::kRequestsRejected);
    return Refuse(caller, StatusCode::kInvalidArgument,
                  "Pull: the request's " + std::to_string(body_len) +
                      " bytes are not a rayfabric.v1.PullRequest");
  }
  Status shape = agent_->CheckPullRequest(request);
  if (!shape.ok()) {
    // Well framed: the connection stays usable (a caller of another version hears why).
    // (A reply the caller did not take in time would leave half a frame: then closed.)
    return Reply(caller, static_cast<uint32_t>(ToErrorCode(shape.code())), shape.message(), idle);
  }
  const Clock::time_point deadline = deadline_ms == 0
                                         ? Clock::time_point::max()
                                         : received + std::chrono::milliseconds(deadline_ms);
  v1::PullReply reply = agent_->Pull(
      request, deadline, [this, &caller] { return stopping_.load() || caller.PeerHungUp(); });
  std::string out;
  if (!reply.SerializeToString(&out)) {
    return Refuse(caller, StatusCode::kInternal, "Pull: the reply could not be serialized");
  }
  return Reply(caller, 0, out, idle);
}

}  // namespace rayfabric::agent
