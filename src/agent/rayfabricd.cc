// rayfabricd: the rayfabric agent of one Ray node. Serves leases on the node's plasma objects and
// pulls remote objects into it by fi_read; controlled over gRPC (proto/rayfabric/v1/agent.proto).
//
//   rayfabricd --plasma-socket PATH --node-id HEX --listen HOST:PORT --local-socket PATH
//              [--ray-version V] [--provider P] [--domain D] [--exit-with-parent]
//
// Two ports: --listen (other agents: Info, LeaseObjects, ReleaseLeases, GetStatus) and the Unix
// socket --local-socket (this node's processes; the only place Pull is served), both with the
// Ray cluster's credentials (token / TLS, from Ray's environment variables: agent/auth.h). Pull
// is also served without gRPC on the Unix socket <local-socket>.pull (agent/pull_socket.h).
// Once serving it prints one line `RAYFABRICD_READY {json}` (address, local_socket, provider,
// domain, fabrics: [{provider, domain, rdma}] best first, pid, token_auth, tls, pull_socket
// ("" when it could not be opened: callers then use gRPC's local socket)) to stdout; any
// startup error is one line `RAYFABRICD_ERROR {json}` and exit status 1.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/un.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "agent/agent.h"
#include "agent/local_service.h"
#include "agent/peer_service.h"
#include "agent/pull_socket.h"
#include "common/unix_socket.h"
#include "rayfabric/hex.h"
#include "rayfabric/log.h"

namespace rayfabric::agent {
namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

int StartupError(const Status& s) {
  std::cout << "RAYFABRICD_ERROR {\"code\":" << JsonString(StatusCodeName(s.code()))
            << ",\"error\":" << JsonString(s.message()) << "}" << std::endl;
  return 1;
}

struct Flags {
  AgentOptions agent;
  std::string listen = "127.0.0.1:0";
  std::string local_socket;
  bool exit_with_parent = false;
};

Result<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::string node_hex;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> Result<std::string> {
      if (i + 1 >= argc) return InvalidArgument(arg + " needs a value");
      return std::string(argv[++i]);
    };
    if (arg == "--plasma-socket") {
      RF_ASSIGN_OR_RETURN(f.agent.plasma_socket, value());
    } else if (arg == "--node-id") {
      RF_ASSIGN_OR_RETURN(node_hex, value());
    } else if (arg == "--listen") {
      RF_ASSIGN_OR_RETURN(f.listen, value());
    } else if (arg == "--local-socket") {
      RF_ASSIGN_OR_RETURN(f.local_socket, value());
    } else if (arg == "--ray-version") {
      RF_ASSIGN_OR_RETURN(f.agent.ray_version, value());
    } else if (arg == "--provider" || arg == "--domain") {
      RF_ASSIGN_OR_RETURN(std::string v, value());
      RF_RETURN_IF_ERROR(f.agent.config.Set(arg.substr(2), v));
    } else if (arg == "--exit-with-parent") {
      f.exit_with_parent = true;
    } else {
      return InvalidArgument(
          "unknown argument '" + arg +
          "'; usage: rayfabricd --plasma-socket PATH --node-id HEX --listen HOST:PORT "
          "--local-socket PATH [--ray-version V] [--provider P] [--domain D] "
          "[--exit-with-parent]");
    }
  }
  if (f.agent.plasma_socket.empty()) return InvalidArgument("--plasma-socket is required");
  if (f.local_socket.empty()) {
    return InvalidArgument(
        "--local-socket is required: the Unix socket where this node's processes ask for pulls "
        "(e.g. in the Ray session directory)");
  }
  if (f.local_socket.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("--local-socket path is longer than a Unix socket path may be (" +
                           std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes)");
  }
  RF_ASSIGN_OR_RETURN(f.agent.node_id, HexToBytes(node_hex));
  return f;
}

}  // namespace
}  // namespace rayfabric::agent

int main(int argc, char** argv) {
  using namespace rayfabric::agent;
  auto flags = ParseFlags(argc, argv);
  if (!flags.ok()) return StartupError(flags.status());
  if (flags->exit_with_parent) {
    // The agent lives as long as whoever started it (the per-node Ray actor): no orphans.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1)
      return StartupError(rayfabric::Aborted("parent exited before the agent started"));
  }
  // Block the stop signals in every thread; the main thread waits for them below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);

  auto credentials = Credentials::FromEnvironment();
  if (!credentials.ok()) return StartupError(credentials.status());
  RF_LOG(kInfo, "control plane: " << credentials->Describe());
  flags->agent.credentials = *credentials;
  const std::string host = flags->listen.substr(0, flags->listen.rfind(':'));
  // The node's IP: each fabric runs on the interface that holds it (unless RAYFABRIC_DOMAIN).
  flags->agent.listen_host =
      host.size() > 2 && host.front() == '[' ? host.substr(1, host.size() - 2) : host;
  auto agent = Agent::Open(flags->agent);
  if (!agent.ok()) return StartupError(agent.status());
  // Two servers, so that which face is served where is structural: the network port serves Peer
  // (and Local's methods only as refusals); the Unix socket serves Peer and Local.
  const ServiceGuard guard(agent->get(), *credentials);
  PeerService peer_service(guard);
  LocalService local_service(guard);
  LocalRefused local_refused(guard);
  LegacyService legacy_service(guard);
  const auto build = [&](const std::string& address, int* port, grpc::Service* local) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, credentials->ServerCredentials(), port);
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.SetMaxSendMessageSize(64 << 20);
    builder.RegisterService(&peer_service);
    builder.RegisterService(local);
    builder.RegisterService(&legacy_service);
    return builder.BuildAndStart();
  };
  int port = 0;
  std::unique_ptr<grpc::Server> network = build(flags->listen, &port, &local_refused);
  if (!network || port == 0) {
    return StartupError(rayfabric::Unavailable("cannot listen on " + flags->listen +
                                               " (address in use, or not this node's?)"));
  }
  // A stale socket of an earlier agent of this node would make the bind fail.
  unlink(flags->local_socket.c_str());
  std::unique_ptr<grpc::Server> local =
      build("unix:" + flags->local_socket, nullptr, &local_service);
  if (!local) {
    network->Shutdown(std::chrono::system_clock::now());
    return StartupError(rayfabric::Unavailable("cannot listen on unix:" + flags->local_socket +
                                               " (is the socket's directory missing?)"));
  }
  // Only this node's user may connect to the local socket (the session directory is the Ray
  // user's too).
  if (chmod(flags->local_socket.c_str(), 0600) != 0) {
    const int err = errno;
    return StartupError(rayfabric::Unavailable("chmod 0600 " + flags->local_socket +
                                               " failed: " + std::strerror(err)));
  }
  auto local_bound = rayfabric::BoundFile::Of(flags->local_socket);
  if (!local_bound.ok()) return StartupError(local_bound.status());
  // Pull without gRPC's cost per call; the gRPC local socket above serves it too.
  std::unique_ptr<PullSocket> pull_socket;
  {
    auto opened = PullSocket::Start(flags->local_socket + ".pull", agent->get(), *credentials);
    if (opened.ok()) {
      pull_socket = std::move(*opened);
    } else {
      RF_LOG(kWarn, "no pull socket (" << opened.status().message()
                                       << "): this node's processes pull over gRPC's local socket");
    }
  }
  const auto info = (*agent)->Info();
  std::string fabrics;
  for (const auto& f : info.fabrics()) {
    fabrics += std::string(fabrics.empty() ? "" : ",") +
               "{\"provider\":" + JsonString(f.provider()) +
               ",\"domain\":" + JsonString(f.domain()) +
               ",\"rdma\":" + (f.rdma() ? "true" : "false") + "}";
  }
  std::cout << "RAYFABRICD_READY {\"address\":" << JsonString(host + ":" + std::to_string(port))
            << ",\"local_socket\":" << JsonString(flags->local_socket)
            << ",\"provider\":" << JsonString(info.provider())
            << ",\"domain\":" << JsonString(info.domain()) << ",\"fabrics\":[" << fabrics << "]"
            << ",\"pid\":" << info.pid()
            << ",\"token_auth\":" << (info.token_auth() ? "true" : "false")
            << ",\"tls\":" << (info.tls() ? "true" : "false")
            << ",\"pull_socket\":" << JsonString(pull_socket ? pull_socket->path() : "") << "}"
            << std::endl;
  int sig = 0;
  sigwait(&stop, &sig);
  RF_LOG(kInfo, "rayfabricd: signal " << sig << ", shutting down");
  const auto grace = std::chrono::system_clock::now() + std::chrono::seconds(2);
  // Both at once: neither port takes new calls while the other drains.
  std::thread network_down([&network, grace] { network->Shutdown(grace); });
  local->Shutdown(grace);
  network_down.join();
  pull_socket.reset();
  agent->reset();
  // Only our own socket: a newer agent of this node may have bound the path since.
  local_bound->UnlinkIfStill(flags->local_socket);
  return 0;
}
