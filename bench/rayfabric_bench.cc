// rayfabric-bench: fi_read / fi_write bandwidth and latency between two processes on any provider,
// printed next to the ceilings measured in the same run: memcpy, and a raw TCP stream between the
// same two processes (over the control connection).
//
//   rayfabric-bench [--provider NAME] [--op read|write|register] [--sizes 4K,1M,256M] [--json FILE]
//                   [--verify] [--peer HOST:PORT | --listen PORT] [--iters N]
//
// --op register measures what a per-object registration costs (the agent's "object" exposure):
// fi_mr_reg of a region of each size with remote read access and a key of its own, and its
// fi_close, in this process alone (prefaulted memory; no peer).
//
// By default it spawns the serving process itself (same binary, --serve) and connects to it over
// loopback. For two hosts: run `rayfabric-bench --listen 7000` on one and
// `rayfabric-bench --peer host:7000 ...` on the other.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "rayfabric/config.h"
#include "rayfabric/fabric.h"
#include "rayfabric/pattern.h"

extern char** environ;

namespace rayfabric::bench {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSeed = 20261202;

[[noreturn]] void Die(const std::string& what) {
  std::cerr << "rayfabric-bench: " << what << std::endl;
  std::exit(1);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string SizeName(uint64_t n) {
  if (n >= (1ULL << 30) && n % (1ULL << 30) == 0) return std::to_string(n >> 30) + "G";
  if (n >= (1ULL << 20) && n % (1ULL << 20) == 0) return std::to_string(n >> 20) + "M";
  if (n >= (1ULL << 10) && n % (1ULL << 10) == 0) return std::to_string(n >> 10) + "K";
  return std::to_string(n);
}

char* AllocPrefaulted(size_t n) {
  void* p =
      mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) Die("mmap of " + std::to_string(n) + " bytes failed");
  return static_cast<char*>(p);
}

// ---------------------------------------------------------------- control connection (TCP)

class Conn {
 public:
  explicit Conn(int fd) : fd_(fd) {
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  ~Conn() { close(fd_); }
  void SendAll(const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      ssize_t w = send(fd_, c, n, MSG_NOSIGNAL);
      if (w <= 0) Die("control connection lost (send)");
      c += w;
      n -= static_cast<size_t>(w);
    }
  }
  void RecvAll(void* p, size_t n) {
    char* c = static_cast<char*>(p);
    while (n > 0) {
      ssize_t r = recv(fd_, c, n, 0);
      if (r <= 0) Die("control connection lost (recv)");
      c += r;
      n -= static_cast<size_t>(r);
    }
  }
  void SendMsg(const std::string& s) {
    uint64_t n = s.size();
    SendAll(&n, 8);
    SendAll(s.data(), s.size());
  }
  std::string RecvMsg() {
    uint64_t n = 0;
    RecvAll(&n, 8);
    std::string s(n, '\0');
    RecvAll(s.data(), n);
    return s;
  }

 private:
  int fd_;
};

int Listen(int port, int* bound_port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(port == 0 ? INADDR_LOOPBACK : INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 1) != 0) {
    Die("cannot listen on port " + std::to_string(port) + ": " + std::strerror(errno));
  }
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *bound_port = ntohs(a.sin_port);
  return fd;
}

int Connect(const std::string& host, const std::string& port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) Die("cannot resolve " + host);
  int fd = socket(res->ai_family, SOCK_STREAM, 0);
  for (int attempt = 0; connect(fd, res->ai_addr, res->ai_addrlen) != 0; ++attempt) {
    if (attempt > 100) Die("cannot connect to " + host + ":" + port + ": " + std::strerror(errno));
    usleep(50000);  // the server is still starting
  }
  freeaddrinfo(res);
  return fd;
}

// ---------------------------------------------------------------- serving side

// Registers `bytes` filled with the pattern, sends its address and descriptor, then serves
// commands: "stream N" (raw TCP ceiling), "check OFF LEN" (verify a write), "quit".
int Serve(Conn& conn, const Config& config, uint64_t bytes) {
  // The benchmark's own buffer, nothing else: the only place where peers may write (--op write).
  fabric::EngineOptions options;
  options.remote_write = true;
  auto engine = fabric::Engine::Open(config, options);
  if (!engine.ok()) {
    conn.SendMsg("ERROR " + engine.status().ToString());
    return 1;
  }
  char* buf = AllocPrefaulted(bytes);
  FillPattern(buf, bytes, kSeed);
  auto mr = (*engine)->Register(buf, bytes, fabric::kRemoteRead | fabric::kRemoteWrite);
  if (!mr.ok()) {
    conn.SendMsg("ERROR " + mr.status().ToString());
    return 1;
  }
  conn.SendMsg("OK");
  conn.SendMsg((*engine)->Address().Serialize());
  conn.SendMsg((*mr)->Describe().Serialize());
  for (;;) {
    std::istringstream cmd(conn.RecvMsg());
    std::string op;
    cmd >> op;
    if (op == "quit") break;
    if (op == "stream") {
      uint64_t n = 0, chunk = 0;
      cmd >> n >> chunk;
      for (uint64_t off = 0; off < n; off += chunk) conn.SendAll(buf, std::min(chunk, n - off));
      conn.SendMsg("done");
    } else if (op == "check") {
      uint64_t off = 0, len = 0, seed = 0;
      cmd >> off >> len >> seed;
      int64_t bad = FirstMismatch(buf + off, len, seed);
      conn.SendMsg(bad < 0 ? "OK" : "BAD " + std::to_string(bad));
    } else if (op == "fill") {
      FillPattern(buf, bytes, kSeed);
      conn.SendMsg("OK");
    }
  }
  return 0;
}

// ---------------------------------------------------------------- measuring side

struct Row {
  std::string op;
  uint64_t size;
  int iters;
  double gbps;
  double p50_us;
  double p99_us;
  double max_us;
  int slow;  // operations over kSlowFactor x p50: stalls, not spread
  bool verified;
};

constexpr double kSlowFactor = 5;

std::vector<uint64_t> ParseSizes(const std::string& list) {
  std::vector<uint64_t> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    auto v = ParseBytes(item);
    if (!v.ok()) Die("--sizes: " + v.status().message());
    out.push_back(*v);
  }
  return out;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

double MemcpyCeiling(uint64_t bytes) {
  char* a = AllocPrefaulted(bytes);
  char* b = AllocPrefaulted(bytes);
  std::memset(a, 1, bytes);
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b, a, bytes);
    best = std::max(best, bytes / Seconds(t0, Clock::now()) / 1e9);
  }
  munmap(a, bytes);
  munmap(b, bytes);
  return best;
}

double TcpCeiling(Conn& conn, char* buf, uint64_t bytes, uint64_t chunk) {
  double best = 0;
  for (int i = 0; i < 3; ++i) {
    auto t0 = Clock::now();
    conn.SendMsg("stream " + std::to_string(bytes) + " " + std::to_string(chunk));
    for (uint64_t off = 0; off < bytes; off += chunk)
      conn.RecvAll(buf, std::min(chunk, bytes - off));
    double secs = Seconds(t0, Clock::now());
    if (conn.RecvMsg() != "done") Die("stream protocol error");
    best = std::max(best, bytes / secs / 1e9);
  }
  return best;
}

struct Options {
  std::string op = "read";
  std::vector<uint64_t> sizes = ParseSizes("4K,64K,1M,16M,256M,1G");
  std::string json;
  bool verify = false;
  int iters = 0;   // 0: choose per size
  int gap_us = 0;  // idle time between operations (an application's pace, not a stream)
  std::string peer;
  int listen_port = -1;
  bool serve = false;
  uint64_t serve_bytes = 0;
  std::string connect_port;
};

int Measure(Conn& conn, const Options& opt, const Config& config, uint64_t max_size) {
  auto engine = fabric::Engine::Open(config);
  if (!engine.ok()) Die(engine.status().ToString());
  fabric::Engine& e = **engine;
  std::string status = conn.RecvMsg();
  if (status != "OK") Die("server: " + status);
  auto address = fabric::FabricAddress::Parse(conn.RecvMsg());
  if (!address.ok()) Die(address.status().ToString());
  auto peer = e.AddPeer(*address);
  if (!peer.ok()) Die(peer.status().ToString());
  auto remote = fabric::RemoteRegion::Parse(conn.RecvMsg());
  if (!remote.ok()) Die(remote.status().ToString());
  char* local = AllocPrefaulted(max_size);
  if (opt.op == "write") FillPattern(local, max_size, kSeed + 1);
  auto mr = e.Register(local, max_size);
  if (!mr.ok()) Die(mr.status().ToString());
  const auto& p = e.profile();
  std::printf("provider %s domain %s (%s)\n", p.provider.c_str(), p.domain.c_str(),
              e.report().reason.c_str());
  std::printf("chunk_size %s, max_inflight %s\n", config.GetString("chunk_size").c_str(),
              config.GetString("max_inflight").c_str());

  std::vector<Row> rows;
  for (uint64_t size : opt.sizes) {
    int iters = opt.iters > 0
                    ? opt.iters
                    : static_cast<int>(std::clamp<uint64_t>((2ULL << 30) / size, 3, 2000));
    std::vector<double> lat;
    auto run_one = [&]() {
      auto t0 = Clock::now();
      Status s = opt.op == "read" ? e.Read(*peer, *remote, 0, *mr, local, size)
                                  : e.Write(*peer, *remote, 0, *mr, local, size);
      if (!s.ok()) Die(s.ToString());
      return Seconds(t0, Clock::now());
    };
    run_one();  // warm-up: connection set-up, provider caches
    double total = 0;
    for (int i = 0; i < iters; ++i) {
      if (opt.gap_us > 0) usleep(opt.gap_us);
      double t = run_one();
      lat.push_back(t * 1e6);
      total += t;
    }
    bool verified = false;
    if (opt.verify) {
      if (opt.op == "read") {
        if (FirstMismatch(local, size, kSeed) >= 0)
          Die("read of " + SizeName(size) + " returned wrong bytes");
      } else {
        conn.SendMsg("check 0 " + std::to_string(size) + " " + std::to_string(kSeed + 1));
        std::string r = conn.RecvMsg();
        if (r != "OK") Die("write of " + SizeName(size) + " landed wrong bytes: " + r);
      }
      verified = true;
    }
    const double p50 = Percentile(lat, 0.5);
    const int slow = static_cast<int>(
        std::count_if(lat.begin(), lat.end(), [&](double us) { return us > kSlowFactor * p50; }));
    rows.push_back({opt.op, size, iters, size * iters / total / 1e9, p50, Percentile(lat, 0.99),
                    *std::max_element(lat.begin(), lat.end()), slow, verified});
    std::fprintf(stderr, "  %s %s done\n", opt.op.c_str(), SizeName(size).c_str());
  }
  if (opt.op == "write" && opt.verify) conn.SendMsg("fill");
  if (opt.op == "write" && opt.verify) conn.RecvMsg();

  const uint64_t ceiling_bytes = std::min<uint64_t>(max_size, 256ULL << 20);
  double tcp = TcpCeiling(conn, local, ceiling_bytes, 4 << 20);
  double mem = MemcpyCeiling(ceiling_bytes);

  std::printf("\n%-8s %-6s %8s %10s %10s %10s %10s %6s %8s %s\n", "size", "op", "iters", "GB/s",
              "p50 us", "p99 us", "max us", "slow", "% tcp", "verified");
  for (const Row& r : rows) {
    std::printf("%-8s %-6s %8d %10.3f %10.1f %10.1f %10.1f %6d %7.0f%% %s\n",
                SizeName(r.size).c_str(), r.op.c_str(), r.iters, r.gbps, r.p50_us, r.p99_us,
                r.max_us, r.slow, 100 * r.gbps / tcp, r.verified ? "yes" : "no");
  }
  std::printf(
      "(slow: operations over %.0fx the p50%s)\n", kSlowFactor,
      opt.gap_us > 0 ? (", " + std::to_string(opt.gap_us) + " us idle before each").c_str() : "");
  std::printf(
      "\nceilings (same run, %s): raw TCP stream between the two processes %.3f GB/s, "
      "memcpy %.3f GB/s\n",
      SizeName(ceiling_bytes).c_str(), tcp, mem);

  if (!opt.json.empty()) {
    std::ofstream js(opt.json);
    js << "{\"engine\":" << e.report().ToJson() << ",\"chunk_size\":\""
       << config.GetString("chunk_size")
       << "\",\"max_inflight\":" << config.GetString("max_inflight")
       << ",\"ceilings\":{\"tcp_stream_gbps\":" << tcp << ",\"memcpy_gbps\":" << mem
       << "},\"results\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      js << (i ? "," : "") << "{\"op\":\"" << r.op << "\",\"size\":" << r.size
         << ",\"iters\":" << r.iters << ",\"gbps\":" << r.gbps << ",\"p50_us\":" << r.p50_us
         << ",\"p99_us\":" << r.p99_us << ",\"max_us\":" << r.max_us << ",\"slow\":" << r.slow
         << ",\"gap_us\":" << opt.gap_us << ",\"verified\":" << (r.verified ? "true" : "false")
         << "}";
    }
    js << "]}\n";
  }
  conn.SendMsg("quit");
  return 0;
}

// --op register: registration and deregistration time per size, this process alone.
int MeasureRegistration(const Options& opt, const Config& config, uint64_t max_size) {
  auto engine = fabric::Engine::Open(config);
  if (!engine.ok()) Die(engine.status().ToString());
  fabric::Engine& e = **engine;
  const auto& p = e.profile();
  std::printf("provider %s domain %s: %s; %s\n", p.provider.c_str(), p.domain.c_str(),
              p.key_lifetime.c_str(), p.access_note.c_str());
  char* buf = AllocPrefaulted(max_size);
  struct RegRow {
    uint64_t size;
    int iters;
    double reg_p50_us, reg_p99_us, dereg_p50_us, dereg_p99_us;
  };
  std::vector<RegRow> rows;
  for (uint64_t size : opt.sizes) {
    const int iters = opt.iters > 0
                          ? opt.iters
                          : static_cast<int>(std::clamp<uint64_t>((4ULL << 30) / size, 5, 2000));
    std::vector<double> reg, dereg;
    for (int i = 0; i <= iters; ++i) {
      auto t0 = Clock::now();
      auto mr = e.Register(buf, size, fabric::kRemoteRead, fabric::Sharing::kPrivate);
      auto t1 = Clock::now();
      if (!mr.ok()) Die(mr.status().ToString());
      mr->reset();
      auto t2 = Clock::now();
      if (i == 0) continue;  // warm-up
      reg.push_back(Seconds(t0, t1) * 1e6);
      dereg.push_back(Seconds(t1, t2) * 1e6);
    }
    rows.push_back({size, iters, Percentile(reg, 0.5), Percentile(reg, 0.99),
                    Percentile(dereg, 0.5), Percentile(dereg, 0.99)});
  }
  std::printf("\n%-8s %8s %12s %12s %12s %12s\n", "size", "iters", "reg p50 us", "reg p99 us",
              "dereg p50 us", "dereg p99 us");
  for (const RegRow& r : rows) {
    std::printf("%-8s %8d %12.1f %12.1f %12.1f %12.1f\n", SizeName(r.size).c_str(), r.iters,
                r.reg_p50_us, r.reg_p99_us, r.dereg_p50_us, r.dereg_p99_us);
  }
  if (!opt.json.empty()) {
    std::ofstream js(opt.json);
    js << "{\"engine\":" << e.report().ToJson() << ",\"registration\":[";
    for (size_t i = 0; i < rows.size(); ++i) {
      const RegRow& r = rows[i];
      js << (i ? "," : "") << "{\"size\":" << r.size << ",\"iters\":" << r.iters
         << ",\"reg_p50_us\":" << r.reg_p50_us << ",\"reg_p99_us\":" << r.reg_p99_us
         << ",\"dereg_p50_us\":" << r.dereg_p50_us << ",\"dereg_p99_us\":" << r.dereg_p99_us << "}";
    }
    js << "]}\n";
  }
  munmap(buf, max_size);
  return 0;
}

int Main(int argc, char** argv) {
  Options opt;
  Config config = Config::FromEnvironment();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--provider") {
      (void)config.Set("provider", next());
    } else if (a == "--domain") {
      (void)config.Set("domain", next());
    } else if (a == "--op") {
      opt.op = next();
      if (opt.op != "read" && opt.op != "write" && opt.op != "register") {
        Die("--op must be read, write or register");
      }
    } else if (a == "--sizes") {
      opt.sizes = ParseSizes(next());
    } else if (a == "--json") {
      opt.json = next();
    } else if (a == "--verify") {
      opt.verify = true;
    } else if (a == "--iters") {
      opt.iters = std::stoi(next());
    } else if (a == "--gap-us") {
      opt.gap_us = std::stoi(next());
    } else if (a == "--chunk-size") {
      (void)config.Set("chunk_size", next());
    } else if (a == "--max-inflight") {
      (void)config.Set("max_inflight", next());
    } else if (a == "--peer") {
      opt.peer = next();
    } else if (a == "--listen") {
      opt.listen_port = std::stoi(next());
    } else if (a == "--serve") {
      opt.serve = true;
    } else if (a == "--serve-bytes") {
      opt.serve_bytes = std::stoull(next());
    } else if (a == "--connect-port") {
      opt.connect_port = next();
    } else if (a == "-h" || a == "--help") {
      std::printf(
          "usage: rayfabric-bench [--provider NAME] [--domain NAME] [--op read|write|register]\n"
          "                       [--sizes 4K,1M,256M] [--json FILE] [--verify] [--iters N]\n"
          "                       [--gap-us N]\n"
          "                       [--chunk-size 4M] [--max-inflight 16]\n"
          "                       [--listen PORT | --peer HOST:PORT]\n");
      return 0;
    } else {
      Die("unknown argument " + a + " (see --help)");
    }
  }
  uint64_t max_size = *std::max_element(opt.sizes.begin(), opt.sizes.end());
  if (opt.op == "register") return MeasureRegistration(opt, config, max_size);

  if (opt.serve) {  // spawned by the measuring side
    Conn conn(Connect("127.0.0.1", opt.connect_port));
    return Serve(conn, config, opt.serve_bytes);
  }
  if (opt.listen_port >= 0) {  // two-host mode, serving side
    int port = 0;
    int lfd = Listen(opt.listen_port, &port);
    std::printf("serving on port %d\n", port);
    Conn conn(accept(lfd, nullptr, nullptr));
    uint64_t bytes = 0;
    conn.RecvAll(&bytes, 8);
    return Serve(conn, config, bytes);
  }
  if (!opt.peer.empty()) {  // two-host mode, measuring side
    auto colon = opt.peer.rfind(':');
    if (colon == std::string::npos) Die("--peer wants HOST:PORT");
    Conn conn(Connect(opt.peer.substr(0, colon), opt.peer.substr(colon + 1)));
    conn.SendAll(&max_size, 8);
    return Measure(conn, opt, config, max_size);
  }
  // Default: spawn the serving process ourselves, with the same provider settings.
  int port = 0;
  int lfd = Listen(0, &port);
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) Die("cannot find own executable");
  self[n] = '\0';
  std::vector<std::string> args = {self,
                                   "--serve",
                                   "--serve-bytes",
                                   std::to_string(max_size),
                                   "--connect-port",
                                   std::to_string(port)};
  if (!config.GetString("provider").empty()) {
    args.push_back("--provider");
    args.push_back(config.GetString("provider"));
  }
  if (const char* d = std::getenv("RAYFABRIC_BENCH_SERVER_DOMAIN")) {
    args.push_back("--domain");
    args.push_back(d);
  }
  std::vector<char*> argvp;
  for (auto& s : args) argvp.push_back(s.data());
  argvp.push_back(nullptr);
  pid_t child = -1;
  if (posix_spawn(&child, self, nullptr, nullptr, argvp.data(), environ) != 0)
    Die("cannot spawn server");
  Conn conn(accept(lfd, nullptr, nullptr));
  close(lfd);
  int rc = Measure(conn, opt, config, max_size);
  int status = 0;
  waitpid(child, &status, 0);
  return rc;
}

}  // namespace
}  // namespace rayfabric::bench

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  return rayfabric::bench::Main(argc, argv);
}
