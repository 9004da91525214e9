// rayfabric-copy: moves one Ray object from one node's plasma store into another's by fi_read,
// straight from the source store's shared memory into the destination store's, with the whole
// arena of each store registered with the fabric once. It is the agent's data path without the
// gRPC control plane: the serving half runs as a separate process (as the remote agent would)
// and hands over its fabric address and the object's descriptor on a pipe.
//
//   rayfabric-copy pull <src-socket> <dst-socket> <hex-id> <owner-node-hex> <owner-ip>
//                       <owner-port> <owner-worker-hex> [--ray-version V] [--provider P]
//   rayfabric-copy serve <src-socket> <hex-id> [--ray-version V] [--provider P]   (internal)
//
// Prints one JSON line: provider, bytes, seconds, GB/s.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "rayfabric/config.h"
#include "rayfabric/fabric.h"
#include "rayfabric/object_id.h"
#include "rayfabric/plasma_client.h"

extern char** environ;

namespace rayfabric::agent {
namespace {

using Clock = std::chrono::steady_clock;

std::string Hex(const std::string& b) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : b) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

std::string Unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

int Fail(const Status& s) {
  std::cout << "{\"ok\":false,\"code\":\"" << StatusCodeName(s.code()) << "\",\"error\":\"";
  for (char c : s.message()) std::cout << (c == '"' || c == '\\' ? '\'' : c);
  std::cout << "\"}" << std::endl;
  return 1;
}

struct Args {
  std::vector<std::string> positional;
  std::string ray_version;
  Config config = Config::FromEnvironment();
};

Result<Args> ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if ((s == "--ray-version" || s == "--provider") && i + 1 < argc) {
      if (s == "--ray-version") a.ray_version = argv[++i];
      if (s == "--provider") RF_RETURN_IF_ERROR(a.config.Set("provider", argv[++i]));
    } else {
      a.positional.push_back(s);
    }
  }
  return a;
}

Result<std::unique_ptr<plasma::PlasmaClient>> ConnectStore(const std::string& socket, const Args& a) {
  plasma::ConnectOptions opts;
  opts.ray_version = a.ray_version;
  return plasma::PlasmaClient::Connect(socket, opts);
}

// The serving half: pins the object (plasma Get), registers the store's arena, prints
// "READY <address> <region> <offset> <data_size> <metadata_size>", releases on "DONE".
int Serve(const Args& a) {
  if (a.positional.size() < 3) return Fail(InvalidArgument("serve <src-socket> <hex-id>"));
  auto id = ObjectId::FromHex(a.positional[2]);
  if (!id.ok()) return Fail(id.status());
  auto store = ConnectStore(a.positional[1], a);
  if (!store.ok()) return Fail(store.status());
  auto obj = (*store)->GetOne(*id, 5000);
  if (!obj.ok()) return Fail(obj.status());
  if (!obj->found) return Fail(NotFound("object " + a.positional[2] + " is not in the source store"));
  auto engine = fabric::Engine::Open(a.config);
  if (!engine.ok()) return Fail(engine.status());
  // The whole arena, once: every later object in it is served without a new registration.
  auto mr = (*engine)->Register(obj->segment_base, obj->segment_size);
  if (!mr.ok()) return Fail(mr.status());
  std::cout << "READY " << Hex((*engine)->Address()) << " " << Hex((*mr)->Describe().Serialize()) << " "
            << (obj->data - obj->segment_base) << " " << obj->data_size << " " << obj->metadata_size
            << std::endl;
  std::string line;
  std::getline(std::cin, line);  // "DONE", or EOF if the puller died
  (void)(*store)->Release(*id);
  return 0;
}

int Pull(const Args& a, const char* self) {
  if (a.positional.size() < 8) {
    return Fail(InvalidArgument("pull <src-socket> <dst-socket> <hex-id> <owner-node-hex> <owner-ip> "
                                "<owner-port> <owner-worker-hex>"));
  }
  const std::string& hex_id = a.positional[3];
  auto id = ObjectId::FromHex(hex_id);
  if (!id.ok()) return Fail(id.status());
  plasma::CreateOptions create;
  create.owner.node_id = Unhex(a.positional[4]);
  create.owner.ip_address = a.positional[5];
  create.owner.port = std::stoi(a.positional[6]);
  create.owner.worker_id = Unhex(a.positional[7]);

  // Start the serving half (in production: the remote node's agent, asked over gRPC).
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) return Fail(Internal("pipe"));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  posix_spawn_file_actions_addclose(&fa, to_child[1]);
  posix_spawn_file_actions_addclose(&fa, from_child[0]);
  std::vector<std::string> args = {self, "serve", a.positional[1], hex_id, "--ray-version", a.ray_version};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t child = -1;
  if (posix_spawn(&child, self, &fa, nullptr, argv.data(), environ) != 0) return Fail(Internal("spawn"));
  posix_spawn_file_actions_destroy(&fa);
  close(to_child[0]);
  close(from_child[1]);
  FILE* to = fdopen(to_child[1], "w");
  FILE* from = fdopen(from_child[0], "r");
  auto finish = [&](int rc) {
    std::fputs("DONE\n", to);
    std::fflush(to);
    std::fclose(to);
    std::fclose(from);
    waitpid(child, nullptr, 0);
    return rc;
  };
  char buf[8192];
  std::string line = std::fgets(buf, sizeof(buf), from) ? buf : "";
  std::istringstream in(line);
  std::string word, addr_hex, region_hex;
  uint64_t offset = 0, data_size = 0, metadata_size = 0;
  in >> word >> addr_hex >> region_hex >> offset >> data_size >> metadata_size;
  if (word != "READY") {
    std::cout << line;  // the server's own JSON error
    return finish(1);
  }
  auto t0 = Clock::now();
  auto engine = fabric::Engine::Open(a.config);
  if (!engine.ok()) return finish(Fail(engine.status()));
  auto peer = (*engine)->AddPeer(Unhex(addr_hex));
  if (!peer.ok()) return finish(Fail(peer.status()));
  auto remote = fabric::RemoteRegion::Parse(Unhex(region_hex));
  if (!remote.ok()) return finish(Fail(remote.status()));

  auto store = ConnectStore(a.positional[2], a);
  if (!store.ok()) return finish(Fail(store.status()));
  create.data_size = data_size;
  create.metadata_size = metadata_size;
  auto obj = (*store)->Create(*id, create);
  if (!obj.ok()) return finish(Fail(obj.status().WithContext("creating the replica")));
  auto t1 = Clock::now();
  auto mr = (*engine)->Register(obj->segment_base, obj->segment_size);
  Status s = mr.ok() ? (*engine)->Read(*peer, *remote, offset, *mr, obj->data, data_size + metadata_size)
                     : mr.status();
  auto t2 = Clock::now();
  if (!s.ok()) {
    (void)(*store)->Abort(*id);  // never seal bytes we did not get
    return finish(Fail(s.WithContext("fi_read of object " + hex_id)));
  }
  s = (*store)->Seal(*id);
  if (s.ok()) s = (*store)->Release(*id);
  if (!s.ok()) return finish(Fail(s));
  auto t3 = Clock::now();
  const double read_s = std::chrono::duration<double>(t2 - t1).count();
  const double total_s = std::chrono::duration<double>(t3 - t0).count();
  const uint64_t bytes = data_size + metadata_size;
  auto stats = (*engine)->stats();
  std::cout << "{\"ok\":true,\"provider\":\"" << (*engine)->profile().provider << "\",\"bytes\":" << bytes
            << ",\"fabric_bytes_read\":" << stats.bytes_read << ",\"read_seconds\":" << read_s
            << ",\"total_seconds\":" << total_s << ",\"read_gbps\":" << bytes / read_s / 1e9 << "}" << std::endl;
  return finish(0);
}

}  // namespace
}  // namespace rayfabric::agent

int main(int argc, char** argv) {
  auto args = rayfabric::agent::ParseArgs(argc, argv);
  if (!args.ok()) return rayfabric::agent::Fail(args.status());
  if (args->positional.empty()) {
    std::cerr << "usage: rayfabric-copy pull <src-socket> <dst-socket> <hex-id> <owner-node-hex> <owner-ip> "
                 "<owner-port> <owner-worker-hex> [--ray-version V] [--provider P]\n";
    return 2;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[n > 0 ? n : 0] = '\0';
  if (args->positional[0] == "serve") return rayfabric::agent::Serve(*args);
  if (args->positional[0] == "pull") return rayfabric::agent::Pull(*args, self);
  return rayfabric::agent::Fail(rayfabric::InvalidArgument("unknown command " + args->positional[0]));
}
