#include "peer_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <vector>

extern char** environ;

namespace rayfabric::testing {
Buffer::Buffer(size_t length) : length_(length) {
  void* p = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::abort();
  }
  data_ = static_cast<char*>(p);
}

Buffer::~Buffer() { munmap(data_, length_); }

PeerProcess::PeerProcess(const std::string& self, uint64_t size, uint64_t seed,
                         const std::string& extra_env, bool read_only) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    error_ = "pipe failed";
    return;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  posix_spawn_file_actions_addclose(&fa, to_child[1]);
  posix_spawn_file_actions_addclose(&fa, from_child[0]);
  std::vector<std::string> args = {
      self, "--peer", "--size", std::to_string(size), "--seed", std::to_string(seed)};
  if (read_only) args.emplace_back("--read-only");
  // This process's environment, with the extra variables replacing any of the same name (getenv
  // would return the first).
  std::vector<std::string> extra_vars;
  std::istringstream extra(extra_env);
  for (std::string kv; extra >> kv;) extra_vars.push_back(kv);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    const std::string name = kv.substr(0, kv.find('=') + 1);
    if (std::none_of(extra_vars.begin(), extra_vars.end(),
                     [&](const std::string& x) { return x.rfind(name, 0) == 0; })) {
      env.push_back(kv);
    }
  }
  env.insert(env.end(), extra_vars.begin(), extra_vars.end());
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int rc = posix_spawn(&pid_, self.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    error_ = std::string("posix_spawn: ") + std::strerror(rc);
    pid_ = -1;
    return;
  }
  to_ = fdopen(to_child[1], "w");
  from_ = fdopen(from_child[0], "r");
  std::string line = Command("");
  std::istringstream in(line);
  std::string word, addr_hex, region_hex;
  in >> word >> addr_hex >> region_hex;
  if (word != "READY") {
    error_ = "peer did not start: '" + line + "'";
    return;
  }
  auto address = HexToBytes(addr_hex);
  auto region_bytes = HexToBytes(region_hex);
  if (!address.ok() || !region_bytes.ok()) {
    error_ = "peer sent a malformed READY line: '" + line + "'";
    return;
  }
  auto parsed = fabric::FabricAddress::Parse(*address);
  if (!parsed.ok()) {
    error_ = parsed.status().ToString();
    return;
  }
  address_ = *parsed;
  auto region = fabric::RemoteRegion::Parse(*region_bytes);
  if (!region.ok()) {
    error_ = region.status().ToString();
    return;
  }
  region_ = *region;
  ready_ = true;
}

PeerProcess::~PeerProcess() {
  if (pid_ > 0) {
    if (to_) {
      std::fputs("QUIT\n", to_);
      std::fflush(to_);
    }
    int status = 0;
    // Give it a moment to close its endpoint cleanly, then make sure it is gone.
    for (int i = 0; i < 200 && waitpid(pid_, &status, WNOHANG) == 0; ++i) usleep(10000);
    Kill();
  }
  if (to_) std::fclose(to_);
  if (from_) std::fclose(from_);
}

void PeerProcess::Signal(int sig) {
  if (pid_ > 0) kill(pid_, sig);
}

void PeerProcess::Kill() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
}

std::string PeerProcess::Command(const std::string& line) {
  if (!to_ || !from_) return "";
  if (!line.empty()) {
    std::fputs((line + "\n").c_str(), to_);
    std::fflush(to_);
  }
  char buf[4096];
  if (!std::fgets(buf, sizeof(buf), from_)) return "";
  std::string reply(buf);
  while (!reply.empty() && (reply.back() == '\n' || reply.back() == '\r')) reply.pop_back();
  return reply;
}

int PeerMain(int argc, char** argv) {
  uint64_t size = 1 << 20, seed = 1;
  bool read_only = false;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--size" && i + 1 < argc) size = std::stoull(argv[i + 1]);
    if (std::string(argv[i]) == "--seed" && i + 1 < argc) seed = std::stoull(argv[i + 1]);
    if (std::string(argv[i]) == "--read-only") read_only = true;
  }
  Config config = Config::FromEnvironment();
  // --read-only: exposed as the agent exposes plasma memory (an endpoint without FI_REMOTE_WRITE,
  // the region registered for remote read only); else a target peers may also write.
  fabric::EngineOptions options;
  options.remote_write = !read_only;
  auto engine = fabric::Engine::Open(config, options);
  if (!engine.ok()) {
    std::cout << "ERROR " << engine.status().ToString() << std::endl;
    return 1;
  }
  auto buffer = std::make_unique<Buffer>(size);
  FillPattern(buffer->data(), size, seed);
  const uint32_t access =
      read_only ? fabric::kRemoteRead : fabric::kRemoteRead | fabric::kRemoteWrite;
  auto region = (*engine)->Register(buffer->data(), size, access);
  if (!region.ok()) {
    std::cout << "ERROR " << region.status().ToString() << std::endl;
    return 1;
  }
  std::shared_ptr<fabric::MemoryRegion> mr = std::move(*region);
  std::cout << "READY " << BytesToHex((*engine)->Address().Serialize()) << " "
            << BytesToHex(mr->Describe().Serialize()) << std::endl;
  std::vector<std::unique_ptr<fabric::Engine>> extra_engines;  // RAILS, FABRICS: open until QUIT
  std::vector<std::shared_ptr<fabric::MemoryRegion>> extra_regions;
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "QUIT") break;
    if (cmd == "PING") {
      std::cout << "PONG" << std::endl;
    } else if (cmd == "KEYS") {  // this (target) process's key-lifetime profile
      const fabric::ProviderProfile& pr = (*engine)->profile();
      std::cout << "KEYS checks=" << pr.checks_remote_keys << " mr_cache=" << pr.mr_cache
                << " revokes=" << pr.deregistration_revokes_keys << std::endl;
    } else if (cmd == "DEREG") {
      mr.reset();
      std::cout << "OK" << std::endl;
    } else if (cmd == "CHECK") {
      uint64_t off = 0, len = 0, s = 0;
      in >> off >> len >> s;
      int64_t bad = off + len <= size ? FirstMismatch(buffer->data() + off, len, s) : 0;
      std::cout << (bad < 0 ? std::string("OK") : "BAD " + std::to_string(bad)) << std::endl;
    } else if (cmd == "FABRICS" || cmd == "RAILS") {
      // FABRICS: every engine an agent would open here (RAYFABRIC_PROVIDER, RAYFABRIC_DOMAIN),
      // best first; RAILS: those of this peer's provider only (its rails, in order). The buffer
      // is registered with each: "FABRICS|RAILS n ADDRESS REGION ...".
      auto opened = fabric::Engine::OpenAll(config, options);
      if (!opened.ok()) {
        std::cout << "ERROR " << opened.status().ToString() << std::endl;
        continue;
      }
      std::string out;
      size_t n = 0;
      for (auto& e : *opened) {
        if (cmd == "RAILS" && e->profile().provider != (*engine)->profile().provider) continue;
        auto registered = e->Register(buffer->data(), size, access);
        if (!registered.ok()) {
          out = "ERROR " + registered.status().ToString();
          break;
        }
        out += " " + BytesToHex(e->Address().Serialize()) + " " +
               BytesToHex((*registered)->Describe().Serialize());
        extra_regions.push_back(std::move(*registered));
        extra_engines.push_back(std::move(e));
        ++n;
      }
      std::cout << (out.rfind("ERROR", 0) == 0 ? out : cmd + " " + std::to_string(n) + out)
                << std::endl;
    } else if (cmd == "FILL") {
      uint64_t s = 0;
      in >> s;
      FillPattern(buffer->data(), size, s);
      std::cout << "OK" << std::endl;
    } else {
      std::cout << "UNKNOWN " << cmd << std::endl;
    }
  }
  return 0;
}

}  // namespace rayfabric::testing
