// Moves data between SEPARATE PROCESSES through a real libfabric provider and checks every byte.
// The provider comes from RAYFABRIC_PROVIDER (meson registers this binary once per provider);
// RAYFABRIC_TEST_DOMAINS="a,b" puts this process on domain a and its peers on domain b (Soft-RoCE);
// RAYFABRIC_TEST_MAX_BYTES caps the largest transfer (default 1 GiB).
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "peer_process.h"
#include "rayfabric/fabric.h"

namespace rayfabric {
namespace {

using fabric::Engine;
using fabric::MemoryRegion;
using fabric::RmaOp;
using fabric::RmaSpan;
using testing::Buffer;
using testing::FillPattern;
using testing::FirstMismatch;
using testing::PeerProcess;

std::string g_self;

std::string Domain(int which) {
  const char* d = std::getenv("RAYFABRIC_TEST_DOMAINS");
  if (!d) return "";
  std::string s(d);
  auto comma = s.find(',');
  if (comma == std::string::npos) return s;
  return which == 0 ? s.substr(0, comma) : s.substr(comma + 1);
}

uint64_t MaxBytes() {
  const char* m = std::getenv("RAYFABRIC_TEST_MAX_BYTES");
  return m ? std::strtoull(m, nullptr, 10) : (1ULL << 30);
}

// RAYFABRIC_TEST_TIME_SCALE stretches the timing tests' bounds (and shrinks their sizes) for slow
// hosts: the Soft-RoCE guest runs under TCG.
int TimeScale() {
  const char* s = std::getenv("RAYFABRIC_TEST_TIME_SCALE");
  return s ? std::max(1, std::atoi(s)) : 1;
}

std::string Ms(int ms) { return std::to_string(ms * TimeScale()); }

std::string PeerEnv() {
  std::string d = Domain(1);
  return d.empty() ? "" : "RAYFABRIC_DOMAIN=" + d;
}

Config TestConfig() {
  Config c = Config::FromEnvironment();
  if (!Domain(0).empty()) {
    EXPECT_TRUE(c.Set("domain", Domain(0)).ok());
  }
  return c;
}

// An engine of the test's own with some settings changed (the shared one keeps the defaults);
// null (with a test failure) if it cannot open.
std::unique_ptr<Engine> OpenEngine(
    std::initializer_list<std::pair<const char*, std::string>> settings) {
  Config c = TestConfig();
  for (const auto& [name, value] : settings) EXPECT_TRUE(c.Set(name, value).ok()) << name;
  auto opened = Engine::Open(c);
  EXPECT_TRUE(opened.ok()) << opened.status();
  return opened.ok() ? std::move(*opened) : nullptr;
}

// One engine for the whole process, as an agent would have.
Engine& SharedEngine() {
  static std::unique_ptr<Engine> engine = [] {
    auto e = Engine::Open(TestConfig());
    if (!e.ok()) {
      std::cerr << "cannot open engine: " << e.status() << std::endl;
      std::abort();
    }
    std::cerr << (*e)->report().ToString();
    return std::move(*e);
  }();
  return *engine;
}

size_t CountOpenFds() {
  size_t n = 0;
  DIR* d = opendir("/proc/self/fd");
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n;
}

size_t RssKiB() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoul(line.substr(6));
  }
  return 0;
}

class FabricProcessTest : public ::testing::Test {
 protected:
  // read_only: the peer exposes its region as the agent exposes plasma memory.
  std::unique_ptr<PeerProcess> StartPeer(uint64_t size, uint64_t seed, bool read_only = false) {
    auto p = std::make_unique<PeerProcess>(g_self, size, seed, PeerEnv(), read_only);
    EXPECT_TRUE(p->ready()) << p->error();
    return p;
  }
};

// True when every byte of [p, p+n) is `value`; else reports the first that is not.
::testing::AssertionResult AllBytesAre(const char* p, size_t n, unsigned char value) {
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<unsigned char>(p[i]) != value) {
      return ::testing::AssertionFailure()
             << "byte " << i << " of " << n << " is " << int(static_cast<unsigned char>(p[i]))
             << ", expected " << int(value);
    }
  }
  return ::testing::AssertionSuccess();
}

TEST_F(FabricProcessTest, ReportsTheProviderItUses) {
  Engine& e = SharedEngine();
  const char* want = std::getenv("RAYFABRIC_PROVIDER");
  if (want && *want) {
    // "tcp" resolves to "tcp;ofi_rxm": the chosen name starts with what was asked for.
    EXPECT_EQ(e.profile().provider.rfind(want, 0), 0u) << e.report().ToString();
  }
  if (!Domain(0).empty()) {
    EXPECT_EQ(e.profile().domain, Domain(0));
  }
  EXPECT_FALSE(e.Address().bytes.empty());
  EXPECT_EQ(e.Address().provider, e.profile().provider);
  EXPECT_NE(e.report().ToJson().find("\"provider\":\"" + e.profile().provider + "\""),
            std::string::npos);
}

TEST_F(FabricProcessTest, ReadsEverySizeByteExact) {
  Engine& e = SharedEngine();
  const uint64_t max = MaxBytes();
  const uint64_t chunk = *Config::FromEnvironment().GetBytes("chunk_size");
  const uint64_t region_size = max + 4096;
  auto peer = StartPeer(region_size, 42);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok()) << id.status();
  Buffer local(max);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok()) << mr.status();
  std::vector<uint64_t> sizes = {
      1, 7, 4095, 4096, 65537, chunk - 1, chunk, chunk * 3 + 17, (64ULL << 20) + 3, max};
  for (uint64_t size : sizes) {
    if (size > max) continue;
    uint64_t remote_offset = size < max ? 13 : 0;
    std::memset(local.data(), 0, std::min<uint64_t>(size, 1 << 20));
    auto start = std::chrono::steady_clock::now();
    Status s = e.Read(*id, peer->region(), remote_offset, *mr, local.data(), size);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(s.ok()) << "size " << size << ": " << s;
    EXPECT_EQ(FirstMismatch(local.data(), size, 42, remote_offset), -1) << "size " << size;
    if (size >= (1 << 20)) {
      std::cerr << "  read " << size << " B verified, " << size / secs / 1e9 << " GB/s\n";
    }
  }
}

TEST_F(FabricProcessTest, WritesEverySizeByteExact) {
  Engine& e = SharedEngine();
  const uint64_t max = MaxBytes();
  const uint64_t chunk = *Config::FromEnvironment().GetBytes("chunk_size");
  auto peer = StartPeer(max + 4096, 1);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok()) << id.status();
  Buffer local(max);
  FillPattern(local.data(), max, 77);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok()) << mr.status();
  for (uint64_t size : std::vector<uint64_t>{1, 4097, chunk * 2 + 5, (16ULL << 20) + 1, max}) {
    if (size > max) continue;
    const uint64_t remote_offset = 4096 - (size % 4096 == 0 ? 0 : 1);
    Status s = e.Write(*id, peer->region(), remote_offset, *mr, local.data(), size);
    ASSERT_TRUE(s.ok()) << "size " << size << ": " << s;
    EXPECT_EQ(peer->Command("CHECK " + std::to_string(remote_offset) + " " + std::to_string(size) +
                            " 77"),
              "OK")
        << "size " << size;
  }
}

TEST_F(FabricProcessTest, BatchOfSpansInOneTransfer) {
  Engine& e = SharedEngine();
  const uint64_t kRegion = 8 << 20;
  auto peer = StartPeer(kRegion, 9);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok());
  Buffer local(kRegion);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok());
  // Reassemble the remote region in reverse order of 1 MiB + 1 byte pieces.
  std::vector<RmaSpan> spans;
  const uint64_t piece = (1 << 20) + 1;
  for (uint64_t off = 0; off < kRegion; off += piece) {
    uint64_t len = std::min(piece, kRegion - off);
    spans.push_back({local.data() + off, len, off});
  }
  std::reverse(spans.begin(), spans.end());
  auto t = e.Start(RmaOp::kRead, *id, peer->region(), *mr, spans);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->Wait().ok());
  EXPECT_EQ(t->bytes(), kRegion);
  EXPECT_EQ(FirstMismatch(local.data(), kRegion, 9), -1);
}

TEST_F(FabricProcessTest, ConcurrentTransfersFromSeveralPeers) {
  Engine& e = SharedEngine();
  const uint64_t kSize = std::min<uint64_t>(MaxBytes(), 64ULL << 20);
  const int kPeers = 3;
  std::vector<std::unique_ptr<PeerProcess>> peers;
  std::vector<std::unique_ptr<Buffer>> buffers;
  std::vector<fabric::Transfer> transfers;
  std::vector<std::shared_ptr<MemoryRegion>> regions;
  for (int i = 0; i < kPeers; ++i) peers.push_back(StartPeer(kSize, 100 + i));
  for (int i = 0; i < kPeers; ++i) {
    ASSERT_TRUE(peers[i]->ready());
    auto id = e.AddPeer(peers[i]->address());
    ASSERT_TRUE(id.ok());
    buffers.push_back(std::make_unique<Buffer>(kSize));
    auto mr = e.Register(buffers[i]->data(), kSize);
    ASSERT_TRUE(mr.ok());
    regions.push_back(*mr);
    auto t = e.Start(RmaOp::kRead, *id, peers[i]->region(), *mr, {{buffers[i]->data(), kSize, 0}});
    ASSERT_TRUE(t.ok()) << t.status();
    transfers.push_back(*t);
  }
  for (int i = 0; i < kPeers; ++i) {
    const Status status = transfers[i].Wait();
    ASSERT_TRUE(status.ok()) << "peer " << i << ": " << status;
    EXPECT_EQ(FirstMismatch(buffers[i]->data(), kSize, 100 + i), -1) << "peer " << i;
  }
}

TEST_F(FabricProcessTest, OutOfRangeIsRefusedBeforePosting) {
  Engine& e = SharedEngine();
  auto peer = StartPeer(1 << 20, 3);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok());
  Buffer local(2 << 20);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok());
  uint64_t posted = e.stats().ops_posted;
  Status s = e.Read(*id, peer->region(), (1 << 20) - 10, *mr, local.data(), 11);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
  EXPECT_NE(s.message().find("exceeds the remote region"), std::string::npos) << s;
  s = e.Read(*id, peer->region(), ~0ULL - 4, *mr, local.data(), 16);  // offset overflow
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
  Buffer unregistered(4096);
  s = e.Read(*id, peer->region(), 0, *mr, unregistered.data(), 16);
  EXPECT_EQ(s.code(), StatusCode::kOutOfRange) << s;
  EXPECT_EQ(e.stats().ops_posted, posted);
  s = e.Read(987654, peer->region(), 0, *mr, local.data(), 16);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s;
  fabric::FabricAddress garbage = e.Address();
  garbage.bytes = "not an address";
  EXPECT_EQ(e.AddPeer(garbage).status().code(), StatusCode::kInvalidArgument);
}

// Addresses carry their provider: one of another provider is refused before it reaches the
// address vector, even where it has the same size and format (sockets and tcp;ofi_rxm addresses
// are both a sockaddr_in, and once inserted every read failed with an I/O error).
TEST_F(FabricProcessTest, AddressOfAnotherProviderIsRefused) {
  Engine& e = SharedEngine();
  auto peer = StartPeer(4096, 5);
  ASSERT_TRUE(peer->ready());
  fabric::FabricAddress foreign = peer->address();
  foreign.provider = e.profile().provider == "sockets" ? "tcp;ofi_rxm" : "sockets";
  const uint64_t peers_before = e.stats().peers;
  auto refused = e.AddPeer(foreign);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(foreign.provider), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("only use a provider both"), std::string::npos)
      << refused.status();
  EXPECT_EQ(e.stats().peers, peers_before);  // nothing inserted; the real address still works
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok()) << id.status();
  Buffer local(4096);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok()) << mr.status();
  ASSERT_TRUE(e.Read(*id, peer->region(), 0, *mr, local.data(), 4096).ok());
  EXPECT_LT(FirstMismatch(local.data(), 4096, 5), 0);
}

// Registrations are capped (EFA: 4 GiB with remote access); a range larger than the cap is
// registered in slices, and a transfer crosses slice boundaries on both sides: here a 1 MiB cap
// locally (7 slices, the buffer read at an odd offset) and the peer's region described as three
// remote slices of odd sizes. Every byte arrives, in order.
TEST_F(FabricProcessTest, RangeAcrossSlicesOnBothSidesMovesEveryByte) {
  constexpr size_t kMiB = 1 << 20;
  auto e = OpenEngine({{"max_registration", "1M"}});
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->profile().max_registration_bytes, kMiB);
  auto peer = StartPeer(6 * kMiB, 31);
  ASSERT_TRUE(peer->ready());
  auto id = e->AddPeer(peer->address());
  ASSERT_TRUE(id.ok()) << id.status();
  Buffer local(6 * kMiB + 4096);
  auto range = e->RegisterRange(local.data(), local.size(), fabric::kLocalRead);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->slices.size(), 7U);
  for (size_t i = 0; i < range->slices.size(); ++i) {
    EXPECT_EQ(range->slices[i]->base(), local.data() + i * kMiB);
    EXPECT_LE(range->slices[i]->length(), kMiB);
  }
  EXPECT_EQ(range->SliceFor(local.data() + kMiB + 5), range->slices[1].get());
  const fabric::RemoteRegion& r = peer->region();
  const size_t length = 6 * kMiB - 100;
  const std::vector<fabric::RemoteSlice> remote = {
      {r, 0, kMiB + kMiB / 2 + 1}, {r, kMiB + kMiB / 2 + 1, 3}, {r, kMiB + kMiB / 2 + 4, 0}};
  std::vector<fabric::RemoteSlice> slices = remote;
  slices[2].length = length - (kMiB + kMiB / 2 + 4);
  std::memset(local.data(), 0, local.size());
  char* at = local.data() + 4093;  // not aligned: every local slice boundary falls mid-piece
  auto t = e->StartRange(RmaOp::kRead, *id, slices, *range, at, length);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->Wait().ok());
  EXPECT_EQ(t->bytes(), length);
  EXPECT_LT(FirstMismatch(at, length, 31), 0);
  EXPECT_TRUE(AllBytesAre(local.data(), 4093, 0));
  EXPECT_TRUE(AllBytesAre(at + length, local.size() - 4093 - length, 0));

  // Slices that do not add up to the buffer, or a buffer outside the range: refused, nothing
  // posted.
  const uint64_t posted = e->stats().ops_posted;
  slices[2].length -= 1;
  EXPECT_EQ(e->StartRange(RmaOp::kRead, *id, slices, *range, at, length).status().code(),
            StatusCode::kOutOfRange);
  slices[2].length += 1;
  EXPECT_EQ(
      e->StartRange(RmaOp::kRead, *id, slices, *range, local.data() + 8192, length).status().code(),
      StatusCode::kOutOfRange);
  slices[0].offset = r.length;  // past the remote region
  EXPECT_EQ(e->StartRange(RmaOp::kRead, *id, slices, *range, at, length).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_EQ(e->stats().ops_posted, posted);

  // A cap below 1 MiB is refused with its name.
  Config small = TestConfig();
  ASSERT_TRUE(small.Set("max_registration", "64K").ok());
  auto refused = Engine::Open(small);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_registration"), std::string::npos);
}

// The rails of the striping test: RAYFABRIC_TEST_RAILS="a0,a1;b0,b1" (this process's domains,
// then the peer's: e.g. "rxe0,rxe2;rxe1,rxe3" in the Soft-RoCE guest, two rxe devices per side on
// two links), else the first two domains this provider offers here, for both sides (tcp: lo and
// the Ethernet device). Empty when there are not two.
std::pair<std::string, std::string> RailDomains() {
  if (const char* env = std::getenv("RAYFABRIC_TEST_RAILS")) {
    const std::string s(env);
    const size_t semi = s.find(';');
    return semi == std::string::npos ? std::make_pair(s, s)
                                     : std::make_pair(s.substr(0, semi), s.substr(semi + 1));
  }
  const fabric::ProviderReport& report = SharedEngine().report();
  std::vector<std::string> domains;
  for (const auto& c : report.candidates) {
    if (c.provider == report.chosen.provider &&
        std::find(domains.begin(), domains.end(), c.domain) == domains.end()) {
      domains.push_back(c.domain);
    }
  }
  if (domains.size() < 2) return {};
  const std::string list = domains[0] + "," + domains[1];
  return {list, list};
}

// Striping: one read spread over two rails (two engines of one provider on two domains, on both
// sides) moves every byte, each rail its own stripe (the engines' counters say how much each
// moved); a read too small to stripe stays on the first rail; a rail whose descriptor does not
// cover its stripe fails the whole transfer.
TEST_F(FabricProcessTest, StripedReadMovesEachStripeOnItsOwnRail) {
  constexpr size_t kMiB = 1 << 20;
  const auto [mine, theirs] = RailDomains();
  if (mine.empty()) GTEST_SKIP() << "this provider offers one domain here: nothing to stripe over";
  Config c = TestConfig();
  ASSERT_TRUE(c.Set("domain", mine).ok());
  auto opened = Engine::OpenAll(c);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::vector<std::unique_ptr<Engine>> engines;
  for (auto& e : *opened) {
    if (e->profile().provider == SharedEngine().profile().provider) engines.push_back(std::move(e));
  }
  ASSERT_EQ(engines.size(), 2U) << "domains " << mine;
  const size_t size = std::min<uint64_t>(MaxBytes(), 32 * kMiB) + 12345;
  auto peer = std::make_unique<PeerProcess>(g_self, size, 41, "RAYFABRIC_DOMAIN=" + theirs);
  ASSERT_TRUE(peer->ready()) << peer->error();
  const std::string line = peer->Command("RAILS");
  std::istringstream in(line);
  std::string word;
  size_t n = 0;
  in >> word >> n;
  ASSERT_EQ(word, "RAILS") << line;
  ASSERT_EQ(n, 2U) << line;
  std::vector<std::vector<fabric::RemoteSlice>> remote(2);
  std::vector<fabric::RegisteredRange> local(2);
  std::vector<fabric::Rail> rails(2);
  Buffer buf(size);
  for (size_t i = 0; i < 2; ++i) {
    std::string address_hex, region_hex;
    in >> address_hex >> region_hex;
    auto address = fabric::FabricAddress::Parse(*HexToBytes(address_hex));
    auto region = fabric::RemoteRegion::Parse(*HexToBytes(region_hex));
    ASSERT_TRUE(address.ok() && region.ok()) << line;
    auto id = engines[i]->AddPeer(*address);
    ASSERT_TRUE(id.ok()) << id.status();
    remote[i] = {{*region, 0, size}};
    auto range = engines[i]->RegisterRange(buf.data(), size, fabric::kLocalRead);
    ASSERT_TRUE(range.ok()) << range.status();
    local[i] = *range;
    rails[i] = {engines[i].get(), *id, &remote[i], &local[i]};
  }
  EXPECT_EQ(fabric::RailsFor(size, 2, 4 * kMiB), 2U);
  EXPECT_EQ(fabric::RailsFor(5 * kMiB, 2, 4 * kMiB), 1U);
  EXPECT_EQ(fabric::RailsFor(5 * kMiB, 1, 0), 1U);

  std::memset(buf.data(), 0, size);
  auto t = fabric::StartStriped(RmaOp::kRead, rails, buf.data(), size, 4 * kMiB);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(t->Wait().ok());
  EXPECT_EQ(t->bytes(), size);
  EXPECT_LT(FirstMismatch(buf.data(), size, 41), 0);
  const uint64_t first = engines[0]->stats().bytes_read;
  const uint64_t second = engines[1]->stats().bytes_read;
  EXPECT_EQ(first + second, size);
  EXPECT_EQ(first % (64 << 10), 0U) << "the stripe boundary falls on 64 KiB";
  EXPECT_GT(first, size / 2 - (64 << 10));
  EXPECT_LE(first, size / 2);

  // Too small to stripe: the first rail alone.
  std::memset(buf.data(), 0, size);
  std::vector<fabric::RemoteSlice> head = {{remote[0][0].region, 0, 3 * kMiB}};
  std::vector<fabric::Rail> small = rails;
  small[0].remote = &head;
  auto one = fabric::StartStriped(RmaOp::kRead, small, buf.data(), 3 * kMiB, 4 * kMiB);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_TRUE(one->Wait().ok());
  EXPECT_EQ(engines[0]->stats().bytes_read, first + 3 * kMiB);
  EXPECT_EQ(engines[1]->stats().bytes_read, second);
  EXPECT_LT(FirstMismatch(buf.data(), 3 * kMiB, 41), 0);

  // The second rail's descriptor covers only half of the range: its stripe cannot start, and the
  // transfer fails even though the first stripe was posted.
  std::vector<fabric::RemoteSlice> short_remote = {{remote[1][0].region, 0, size / 2}};
  std::vector<fabric::Rail> broken = rails;
  broken[1].remote = &short_remote;
  auto failed = fabric::StartStriped(RmaOp::kRead, broken, buf.data(), size, 4 * kMiB);
  ASSERT_TRUE(failed.ok()) << failed.status();
  const Status s = failed->Wait();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("stripe 2 of 2"), std::string::npos) << s;
  EXPECT_TRUE(failed->Quiesced());
}

// Nodes with different provider sets: each case is "MINE|THEIRS|SHARED" (provider lists, each
// optionally followed by "@DOMAINS" for RAYFABRIC_DOMAIN, and the provider the pair must use;
// empty: none shared), cases separated by spaces, from
// RAYFABRIC_TEST_MIXED (the Soft-RoCE guest: a verbs+tcp node with a tcp-only node, and two
// verbs+tcp nodes), else tcp+sockets against sockets only, against tcp+sockets, and tcp only
// against sockets only. The peer is another process that opens its fabrics as an agent would;
// this side picks the fabric both have (the agent's rule), reads over it and checks every byte.
TEST_F(FabricProcessTest, MixedNodesReadOverTheBestProviderTheyShare) {
  constexpr size_t kSize = (4 << 20) + 333;
  const char* env = std::getenv("RAYFABRIC_TEST_MIXED");
  std::istringstream cases(env ? env
                               : "tcp;ofi_rxm,sockets|sockets|sockets "
                                 "tcp;ofi_rxm,sockets|tcp;ofi_rxm,sockets|tcp;ofi_rxm "
                                 "tcp;ofi_rxm|sockets|");
  int ran = 0;
  for (std::string one; cases >> one; ++ran) {
    const size_t bar1 = one.find('|'), bar2 = one.rfind('|');
    ASSERT_TRUE(bar1 != std::string::npos && bar2 > bar1) << one;
    auto split = [](const std::string& side) {
      const size_t at = side.find('@');
      return at == std::string::npos ? std::make_pair(side, std::string())
                                     : std::make_pair(side.substr(0, at), side.substr(at + 1));
    };
    const auto [mine, my_domains] = split(one.substr(0, bar1));
    const auto [theirs, their_domains] = split(one.substr(bar1 + 1, bar2 - bar1 - 1));
    const std::string shared = one.substr(bar2 + 1);
    SCOPED_TRACE(one);
    Config c = Config::FromEnvironment();
    ASSERT_TRUE(c.Set("provider", mine).ok());
    ASSERT_TRUE(c.Set("domain", my_domains).ok());
    auto opened = Engine::OpenAll(c);
    ASSERT_TRUE(opened.ok()) << opened.status();
    std::vector<std::string> my_providers;
    for (const auto& e : *opened) {
      if (my_providers.empty() || my_providers.back() != e->profile().provider) {
        my_providers.push_back(e->profile().provider);
      }
    }
    PeerProcess peer(g_self, kSize, 51,
                     "RAYFABRIC_PROVIDER=" + theirs + " RAYFABRIC_DOMAIN=" + their_domains);
    ASSERT_TRUE(peer.ready()) << peer.error();
    std::istringstream in(peer.Command("FABRICS"));
    std::string word;
    size_t n = 0;
    in >> word >> n;
    ASSERT_EQ(word, "FABRICS");
    std::vector<fabric::FabricAddress> addresses;
    std::vector<fabric::RemoteRegion> regions;
    std::vector<std::string> their_providers;
    for (size_t i = 0; i < n; ++i) {
      std::string address_hex, region_hex;
      in >> address_hex >> region_hex;
      auto address = fabric::FabricAddress::Parse(*HexToBytes(address_hex));
      auto region = fabric::RemoteRegion::Parse(*HexToBytes(region_hex));
      ASSERT_TRUE(address.ok() && region.ok());
      addresses.push_back(*address);
      regions.push_back(*region);
      their_providers.push_back(address->provider);
    }
    const int chosen = fabric::ChooseShared(my_providers, their_providers);
    if (shared.empty()) {
      EXPECT_EQ(chosen, -1);
      // And the engines refuse each other's addresses outright.
      for (const auto& e : *opened) {
        for (const auto& a : addresses) EXPECT_FALSE(e->AddPeer(a).ok()) << a.Describe();
      }
      continue;
    }
    ASSERT_GE(chosen, 0);
    ASSERT_EQ(my_providers[chosen], shared);
    Engine* engine = nullptr;
    for (const auto& e : *opened) {
      if (engine == nullptr && e->profile().provider == shared) engine = e.get();
    }
    const size_t theirs_at =
        static_cast<size_t>(std::find(their_providers.begin(), their_providers.end(), shared) -
                            their_providers.begin());
    auto id = engine->AddPeer(addresses[theirs_at]);
    ASSERT_TRUE(id.ok()) << id.status();
    Buffer local(kSize);
    auto region = engine->Register(local.data(), kSize, fabric::kLocalRead);
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_TRUE(engine->Read(*id, regions[theirs_at], 0, *region, local.data(), kSize).ok());
    EXPECT_LT(FirstMismatch(local.data(), kSize, 51), 0);
    std::cerr << "mixed: " << mine << " with " << theirs << ": read " << kSize << " bytes over "
              << shared << " (" << engine->profile().domain << " -> " << addresses[theirs_at].domain
              << ")\n";
  }
  EXPECT_GT(ran, 0);
}

// A range whose later part cannot start (here: its local slice was not registered to be read
// into) fails as a whole, even when the part already posted finished: its bytes are not the whole
// range, and a caller that sealed them would seal stale memory.
TEST_F(FabricProcessTest, ARangeWhoseLaterPartCannotStartFails) {
  constexpr size_t kMiB = 1 << 20;
  auto e = OpenEngine({{"max_registration", "1M"}});
  ASSERT_NE(e, nullptr);
  auto peer = StartPeer(2 * kMiB, 33);
  ASSERT_TRUE(peer->ready());
  auto id = e->AddPeer(peer->address());
  ASSERT_TRUE(id.ok()) << id.status();
  Buffer local(2 * kMiB);
  fabric::RegisteredRange range;
  auto readable = e->Register(local.data(), kMiB, fabric::kLocalRead, fabric::Sharing::kPrivate);
  auto not_readable =
      e->Register(local.data() + kMiB, kMiB, fabric::kRemoteRead, fabric::Sharing::kPrivate);
  ASSERT_TRUE(readable.ok() && not_readable.ok());
  range.slices = {*readable, *not_readable};
  auto t = e->StartRange(RmaOp::kRead, *id, {{peer->region(), 0, 2 * kMiB}}, range, local.data(),
                         2 * kMiB);
  ASSERT_TRUE(t.ok()) << t.status();  // the first part was posted
  const Status s = t->Wait();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("could not start"), std::string::npos) << s;
  EXPECT_TRUE(t->Quiesced());
}

TEST(FabricAddressTest, RoundTripsAndRefusesTruncation) {
  fabric::FabricAddress a{"tcp;ofi_rxm", "192.0.2.0/24", "eth0", std::string("\x02\0\x1f\x90", 4)};
  auto back = fabric::FabricAddress::Parse(a.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->provider, a.provider);
  EXPECT_EQ(back->fabric, a.fabric);
  EXPECT_EQ(back->domain, a.domain);
  EXPECT_EQ(back->bytes, a.bytes);
  EXPECT_EQ(a.Describe(), "tcp;ofi_rxm/eth0");
  const std::string wire = a.Serialize();
  for (size_t cut : {size_t{0}, size_t{3}, wire.size() - 1}) {
    EXPECT_EQ(fabric::FabricAddress::Parse(wire.substr(0, cut)).status().code(),
              StatusCode::kInvalidArgument)
        << cut;
  }
  EXPECT_EQ(fabric::FabricAddress::Parse(wire + "x").status().code(), StatusCode::kInvalidArgument);
}

std::set<std::string> ShmNames() {
  std::set<std::string> names;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* entry = readdir(d)) {
      if (entry->d_name[0] != '.') names.insert(entry->d_name);
    }
    closedir(d);
  }
  return names;
}

// libfabric's shm names an endpoint's region after its source address, by default the process
// id (/dev/shm/<pid>:<uid>:<n>), and records its owner's pid in it. A SIGKILLed process leaves its
// region behind, and a later process given the same pid failed fi_enable with EBUSY (seen in CI,
// where pid_max is 32768). Played for real: a peer is killed, and the next peer is started under
// the same pid (steered with ns_last_pid, as checkpoint/restore tools do; root only). It must
// open and serve a read, and the killed peer's region must be gone from /dev/shm.
TEST_F(FabricProcessTest, APeerGivenAKilledPeersPidOpensServesAndRemovesItsRegion) {
  if (SharedEngine().profile().provider != "shm") GTEST_SKIP() << "only shm names regions by pid";
  const std::set<std::string> before = ShmNames();
  auto killed = StartPeer(4096, 5);
  ASSERT_TRUE(killed->ready());
  const pid_t pid = killed->pid();
  std::vector<std::string> left;  // the killed peer's: "rayfabric-<pid namespace>-<pid>-..."
  for (const std::string& name : ShmNames()) {
    if (before.count(name) == 0 && name.rfind("rayfabric-", 0) == 0 &&
        name.find("-" + std::to_string(pid) + "-") != std::string::npos) {
      left.push_back(name);
    }
  }
  killed->Kill();
  ASSERT_FALSE(left.empty()) << "the shm peer made no region in /dev/shm";
  for (const std::string& name : left) {
    ASSERT_EQ(access(("/dev/shm/" + name).c_str(), F_OK), 0) << name << ": SIGKILL left nothing";
  }

  std::unique_ptr<PeerProcess> again;
  for (int attempt = 0; attempt < 10 && !again; ++attempt) {
    {
      std::ofstream last_pid("/proc/sys/kernel/ns_last_pid");
      last_pid << pid - 1;
      last_pid.close();
      if (!last_pid) GTEST_SKIP() << "cannot choose the next pid here (ns_last_pid needs root)";
    }
    auto peer = std::make_unique<PeerProcess>(g_self, 1 << 20, 6, PeerEnv());
    if (peer->pid() == pid || (!peer->ready() && peer->pid() == -1)) again = std::move(peer);
  }
  if (!again) GTEST_SKIP() << "other processes took pid " << pid << " first, 10 times";
  ASSERT_EQ(again->pid(), pid);
  ASSERT_TRUE(again->ready()) << again->error();

  Engine& e = SharedEngine();
  auto id = e.AddPeer(again->address());
  ASSERT_TRUE(id.ok()) << id.status();
  Buffer local(1 << 20);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok()) << mr.status();
  Status s = e.Read(*id, again->region(), 0, *mr, local.data(), local.size());
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(FirstMismatch(local.data(), local.size(), 6, 0), -1);
  for (const std::string& name : left) {
    EXPECT_NE(access(("/dev/shm/" + name).c_str(), F_OK), 0)
        << name << ": the killed peer's region is still in /dev/shm";
  }
}

TEST_F(FabricProcessTest, ForgedDescriptorsFailWithoutTouchingOtherMemory) {
  Engine& e = SharedEngine();
  // shm (libfabric 1.17) reads the peer with process_vm_readv and never checks RMA keys: only the
  // OS (same uid / ptrace rights) protects the memory. The profile says so; docs/security.
  if (!e.profile().checks_remote_keys) GTEST_SKIP() << e.profile().key_lifetime;
  auto peer = StartPeer(1 << 20, 5);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok());
  Buffer local(4 << 20);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok());
  // A descriptor claiming more than was registered: the TARGET provider must refuse.
  fabric::RemoteRegion longer = peer->region();
  longer.length = 4 << 20;
  Status s = e.Read(*id, longer, (1 << 20) - 4096, *mr, local.data(), 64 << 10);
  EXPECT_FALSE(s.ok()) << "read past the registered region succeeded";
  std::cerr << "  past-the-end read: " << s << "\n";
  // A key that was never handed out.
  fabric::RemoteRegion forged = peer->region();
  forged.key ^= 0x5a5a5a;
  s = e.Read(*id, forged, 0, *mr, local.data(), 4096);
  EXPECT_FALSE(s.ok()) << "read with a forged key succeeded";
  std::cerr << "  forged-key read: " << s << "\n";
  // The attacked peer is alive, and the engine keeps serving others. (tcp;ofi_rxm tears the
  // connection down after a protection error and does not take the same endpoint back.)
  EXPECT_EQ(peer->Command("PING"), "PONG");
  auto other = StartPeer(1 << 20, 15);
  ASSERT_TRUE(other->ready());
  auto other_id = e.AddPeer(other->address());
  ASSERT_TRUE(other_id.ok());
  s = e.Read(*other_id, other->region(), 0, *mr, local.data(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(FirstMismatch(local.data(), 1 << 20, 15), -1);
}

// A key whose region the target deregistered must stop working, where the provider profile says
// deregistration revokes keys. Where it says it does not (libfabric's MR cache on verbs/efa keeps
// the MR registered after fi_close(); shm never checks keys) the stale read is EXPECTED to succeed:
// the profile must tell the truth either way, since the agent's leases rely on it.
TEST_F(FabricProcessTest, StaleKeyAfterDeregistrationFails) {
  Engine& e = SharedEngine();
  auto peer = StartPeer(1 << 20, 6);
  ASSERT_TRUE(peer->ready());
  // The target's own profile decides (same provider and environment as ours, but ask it).
  const std::string keys = peer->Command("KEYS");
  const fabric::ProviderProfile& p = e.profile();
  const std::string mine = std::string("KEYS checks=") + (p.checks_remote_keys ? "1" : "0") +
                           " mr_cache=" + (p.mr_cache ? "1" : "0") +
                           " revokes=" + (p.deregistration_revokes_keys ? "1" : "0");
  ASSERT_EQ(keys, mine) << "the peer decided key lifetime differently from this process";
  std::cerr << "  profile: deregistration_revokes_keys=" << p.deregistration_revokes_keys
            << " mr_cache=" << p.mr_cache << " checks_remote_keys=" << p.checks_remote_keys << ": "
            << p.key_lifetime << "\n";
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok());
  Buffer local(1 << 20);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok());
  ASSERT_TRUE(e.Read(*id, peer->region(), 0, *mr, local.data(), 4096).ok());
  ASSERT_EQ(peer->Command("DEREG"), "OK");
  Status s = e.Read(*id, peer->region(), 0, *mr, local.data(), 4096);
  std::cerr << "  stale-key read: " << s << "\n";
  if (p.deregistration_revokes_keys) {
    EXPECT_FALSE(s.ok())
        << "read with a revoked key succeeded, but the profile says deregistration revokes "
           "keys: "
        << p.key_lifetime;
  } else if (p.mr_cache || !p.checks_remote_keys) {
    EXPECT_TRUE(s.ok()) << "the profile says a deregistered key stays valid (" << p.key_lifetime
                        << ") but the stale read failed: the profile is wrong for " << p.provider;
    if (s.ok()) {
      EXPECT_EQ(FirstMismatch(local.data(), 4096, 6), -1);
      std::cerr << "  stale-key read SUCCEEDED as the profile predicts (keys not revoked on this "
                   "provider)\n";
    }
  } else {
    std::cerr << "  key lifetime unknown for " << p.provider << ": nothing asserted\n";
  }
  EXPECT_EQ(peer->Command("PING"), "PONG");
}

TEST_F(FabricProcessTest, PeerKilledMidTransferFailsWithinBound) {
  // Its own engine: a short op timeout, small chunks and one op in flight so the transfer is
  // still running when the peer dies.
  auto engine = OpenEngine({{"op_timeout_ms", "4000"},
                            {"drain_timeout_ms", "1000"},
                            {"chunk_size", "64K"},
                            {"max_inflight", "1"}});
  ASSERT_TRUE(engine);
  Engine& e = *engine;
  const uint64_t kSize = std::min<uint64_t>(MaxBytes(), 256ULL << 20);
  auto victim = StartPeer(kSize, 11);
  auto survivor = StartPeer(1 << 20, 12);
  ASSERT_TRUE(victim->ready() && survivor->ready());
  auto victim_id = e.AddPeer(victim->address());
  auto survivor_id = e.AddPeer(survivor->address());
  ASSERT_TRUE(victim_id.ok() && survivor_id.ok());
  Buffer local(kSize);
  auto mr = e.Register(local.data(), kSize);
  ASSERT_TRUE(mr.ok());
  auto t = e.Start(RmaOp::kRead, *victim_id, victim->region(), *mr, {{local.data(), kSize, 0}});
  ASSERT_TRUE(t.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  bool finished_before_kill = t->Done();
  victim->Kill();
  auto start = std::chrono::steady_clock::now();
  Status s = t->Wait(std::chrono::milliseconds(20000));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "  in-flight read when the peer died: " << s << " after " << waited << " s\n";
  EXPECT_LT(waited, 4.0 + 1.0 + 2.0);  // op timeout + drain bound (a reset) + slack
  if (!finished_before_kill) {
    EXPECT_FALSE(s.ok());
  }
  // A new read from the dead peer fails within the bound too.
  start = std::chrono::steady_clock::now();
  s = e.Read(*victim_id, victim->region(), 0, *mr, local.data(), 1 << 20);
  waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "  read from the dead peer: " << s << " after " << waited << " s\n";
  EXPECT_FALSE(s.ok());
  EXPECT_LT(waited, 4.0 + 1.0 + 2.0);
  // The engine keeps serving the others.
  s = e.Read(*survivor_id, survivor->region(), 0, *mr, local.data(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(FirstMismatch(local.data(), 1 << 20, 12), -1);
}

// The agent's exposure: a region registered for remote READ only, on an endpoint that never asked
// for FI_REMOTE_WRITE. A peer holding its exact descriptor can read it but not write one byte.
TEST_F(FabricProcessTest, ReadOnlyRegionRefusesWrites) {
  Engine& e = SharedEngine();
  // shm (libfabric 1.17) moves bytes with process_vm_readv/writev and checks neither keys nor
  // access: only the OS (same uid / ptrace rights) protects the memory. The profile says so.
  if (!e.profile().checks_remote_keys) GTEST_SKIP() << e.profile().key_lifetime;
  auto peer = StartPeer(1 << 20, 21, /*read_only=*/true);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok());
  Buffer local(1 << 20);
  FillPattern(local.data(), local.size(), 99);
  auto mr = e.Register(local.data(), local.size());
  ASSERT_TRUE(mr.ok());
  // Reading with the descriptor works ...
  Status s = e.Read(*id, peer->region(), 0, *mr, local.data(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(FirstMismatch(local.data(), 1 << 20, 21), -1);
  // ... writing with it does not. (tcp;ofi_rxm drops the connection after the refused write and
  // the target does not take the same endpoint back: a second write fails as not connected.)
  // Where the profile says access is NOT enforced (verbs with libfabric's MR cache), the write
  // is expected to land: the profile must tell the truth either way, since the agent refuses to
  // serve plasma memory on such a provider.
  const fabric::ProviderProfile& p = e.profile();
  std::cerr << "  profile: enforces_access=" << p.enforces_access << ": " << p.access_note << "\n";
  FillPattern(local.data(), local.size(), 99);
  for (uint64_t size : {uint64_t{64}, uint64_t{1} << 20}) {
    s = e.Write(*id, peer->region(), 0, *mr, local.data(), size);
    std::cerr << "  write of " << size << " B through a read-only descriptor: " << s << "\n";
    const std::string check = peer->Command("CHECK 0 " + std::to_string(1 << 20) + " 21");
    if (p.enforces_access) {
      EXPECT_FALSE(s.ok()) << "a write through a read-only descriptor succeeded";
      EXPECT_EQ(check, "OK") << "the peer's memory changed after a refused write";
    } else {
      EXPECT_TRUE(s.ok()) << "the profile says access is not enforced (" << p.access_note
                          << ") but the write failed: the profile is wrong for " << p.provider;
      EXPECT_NE(check, "OK") << "the write succeeded but the bytes did not change";
      std::cerr << "  write through a read-only descriptor LANDED, as the profile predicts\n";
      FillPattern(local.data(), local.size(), 21);  // undo, for the next size's check
      ASSERT_TRUE(e.Write(*id, peer->region(), 0, *mr, local.data(), 1 << 20).ok());
      FillPattern(local.data(), local.size(), 99);
    }
  }
}

// Keys are drawn at random where the application picks them: nothing reads a region without
// having been handed its descriptor, neither small keys (what a counter from 1 would hand out)
// nor keys near a real one.
TEST_F(FabricProcessTest, GuessedKeysReadNothing) {
  if (!SharedEngine().profile().checks_remote_keys) {
    GTEST_SKIP() << SharedEngine().profile().key_lifetime;
  }
  auto peer = StartPeer(1 << 20, 22, /*read_only=*/true);
  ASSERT_TRUE(peer->ready());
  const fabric::RemoteRegion real = peer->region();
  if (!SharedEngine().profile().prov_key) {
    EXPECT_GT(real.key, 0xffffffffULL) << "a 64-bit random key below 2^32 (p = 2^-32)";
  }
  Buffer local(4096);
  // The attacker's endpoint. A refused RMA ends its connection: tcp;ofi_rxm lets it reconnect
  // after a moment, verbs;ofi_rxm not from the same endpoint. Before every guess the real
  // descriptor must read again (from this endpoint, else from a fresh one), so each refusal below
  // is the key's doing and not a dead connection's.
  std::unique_ptr<Engine> e;
  fabric::PeerId id = 0;
  std::shared_ptr<MemoryRegion> mr;
  int fresh_endpoints = 0;
  auto ready = [&]() -> bool {
    for (int round = 0; round < 3; ++round) {
      if (!e) {
        e = OpenEngine({});
        if (!e) return false;
        ++fresh_endpoints;
        auto added = e->AddPeer(peer->address());
        auto registered = e->Register(local.data(), local.size());
        if (!added.ok() || !registered.ok()) return false;
        id = *added;
        mr = *registered;
      }
      for (int attempt = 0; attempt < 10; ++attempt) {
        if (e->Read(id, real, 0, mr, local.data(), 4096).ok()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50 * TimeScale()));
      }
      mr.reset();
      e.reset();
    }
    return false;
  };
  ASSERT_TRUE(ready());
  EXPECT_EQ(FirstMismatch(local.data(), 4096, 22), -1);
  std::vector<uint64_t> keys;
  const uint64_t small = TimeScale() > 1 ? 4 : 16;  // fewer in the slow guest
  for (uint64_t k = 0; k < small; ++k) keys.push_back(k);
  for (uint64_t d = 1; d <= (TimeScale() > 1 ? 1u : 4u); ++d) {
    keys.insert(keys.end(), {real.key + d, real.key - d});
  }
  int refused = 0;
  for (uint64_t base : {uint64_t{0}, real.address}) {
    for (uint64_t key : keys) {
      if (key == real.key) continue;
      ASSERT_TRUE(ready()) << "the real descriptor no longer reads, even from a fresh endpoint";
      std::memset(local.data(), 0xA5, local.size());
      fabric::RemoteRegion guess = real;
      guess.address = base;
      guess.key = key;
      Status s = e->Read(id, guess, 0, mr, local.data(), 4096);
      EXPECT_FALSE(s.ok()) << "a read with guessed key " << key << " at base " << base
                           << " succeeded";
      EXPECT_TRUE(AllBytesAre(local.data(), local.size(), 0xA5)) << "a guessed key read bytes";
      refused += s.ok() ? 0 : 1;
    }
  }
  std::cerr << "  " << refused << " guessed descriptors refused (each after a good read; "
            << fresh_endpoints << " attacker endpoints)\n";
  EXPECT_EQ(peer->Command("PING"), "PONG");
}

// A transfer whose source froze mid-flight (SIGSTOP) fails by the progress timeout, and when it
// is reported nothing of it can land any more: the buffer is reused (filled with a sentinel), the
// source resumes, and not one byte changes.
TEST_F(FabricProcessTest, FrozenPeerNeverWritesAfterTheFailureIsReported) {
  auto engine = OpenEngine({{"op_timeout_ms", Ms(1500)},
                            {"drain_timeout_ms", Ms(1000)},
                            {"chunk_size", "1M"},
                            {"max_inflight", "8"}});
  ASSERT_TRUE(engine);
  Engine& e = *engine;
  const uint64_t kSize = std::min<uint64_t>(MaxBytes(), 512ULL << 20);
  auto frozen = StartPeer(kSize, 31, /*read_only=*/true);
  auto survivor = StartPeer(1 << 20, 32, /*read_only=*/true);
  ASSERT_TRUE(frozen->ready() && survivor->ready());
  auto frozen_id = e.AddPeer(frozen->address());
  auto survivor_id = e.AddPeer(survivor->address());
  ASSERT_TRUE(frozen_id.ok() && survivor_id.ok());
  Buffer local(kSize);
  auto mr = e.Register(local.data(), kSize);
  ASSERT_TRUE(mr.ok());
  fabric::Transfer t;
  // Freeze the source while the read is in flight (retry with an earlier stop if it finished).
  bool frozen_mid_flight = false;
  for (int delay_ms : {20, 5, 0}) {
    auto started =
        e.Start(RmaOp::kRead, *frozen_id, frozen->region(), *mr, {{local.data(), kSize, 0}});
    ASSERT_TRUE(started.ok()) << started.status();
    t = *started;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    frozen->Signal(SIGSTOP);
    if (!t.Done()) {
      frozen_mid_flight = true;
      break;
    }
    frozen->Signal(SIGCONT);
  }
  ASSERT_TRUE(frozen_mid_flight) << "every read finished before the source could be stopped";
  auto start = std::chrono::steady_clock::now();
  Status s = t.Wait(std::chrono::milliseconds(20000));
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "  read from a frozen source: " << s << " after " << waited << " s; resets "
            << e.stats().endpoint_resets << ", undrained " << e.stats().transfers_undrained << "\n";
  if (s.ok() && !e.profile().checks_remote_keys) {
    // shm: the READER copies with process_vm_readv, so a stopped source cannot hold the read; it
    // completes, byte-exact, and nothing is left to land later.
    frozen->Signal(SIGCONT);
    EXPECT_EQ(FirstMismatch(local.data(), kSize, 31), -1);
    GTEST_SKIP() << e.profile().provider << ": the reader moves the bytes itself; no frozen read";
  }
  EXPECT_FALSE(s.ok());
  EXPECT_LT(waited, (1.5 + 1.0) * TimeScale() + 3.0);
  ASSERT_TRUE(t.Quiesced()) << "reported with operations outstanding: " << s;
  // The store reuses the memory; then the source wakes up and answers what it was asked.
  std::memset(local.data(), 0xEE, kSize);
  frozen->Signal(SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  EXPECT_TRUE(AllBytesAre(local.data(), kSize, 0xEE)) << "bytes landed after the failure";
  // Both peers are served again afterwards (a reset changes only this endpoint's connections).
  s = e.Read(*survivor_id, survivor->region(), 0, *mr, local.data(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(FirstMismatch(local.data(), 1 << 20, 32), -1);
  s = e.Read(*frozen_id, frozen->region(), 0, *mr, local.data(), 1 << 20);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(FirstMismatch(local.data(), 1 << 20, 31), -1);
}

// A caller whose own deadline passed cancels; Wait() returns only once nothing of the transfer
// is outstanding, so the buffer may be reused at once.
TEST_F(FabricProcessTest, CancelReturnsOnlyWhenDrained) {
  Engine& e = SharedEngine();
  const uint64_t kSize = std::min<uint64_t>(MaxBytes(), 256ULL << 20);
  auto peer = StartPeer(kSize, 33, /*read_only=*/true);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok());
  Buffer local(kSize);
  auto mr = e.Register(local.data(), kSize);
  ASSERT_TRUE(mr.ok());
  auto t = e.Start(RmaOp::kRead, *id, peer->region(), *mr, {{local.data(), kSize, 0}});
  ASSERT_TRUE(t.ok());
  t->Cancel("the caller's deadline passed");
  Status s = t->Wait(std::chrono::milliseconds(20000));
  std::cerr << "  cancelled read: " << s << "\n";
  EXPECT_TRUE(t->Quiesced());
  if (!s.ok()) {
    EXPECT_EQ(s.code(), StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("deadline passed"), std::string::npos) << s;
  }
  std::memset(local.data(), 0xEE, kSize);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(AllBytesAre(local.data(), kSize, 0xEE)) << "bytes landed after a cancelled transfer";
}

// op_timeout_ms bounds the time without progress, not the whole transfer: a transfer far longer
// than it that keeps completing operations finishes.
TEST_F(FabricProcessTest, SlowTransferThatProgressesDoesNotTimeOut) {
  auto engine =
      OpenEngine({{"op_timeout_ms", Ms(150)}, {"chunk_size", "4K"}, {"max_inflight", "1"}});
  ASSERT_TRUE(engine);
  Engine& e = *engine;
  const uint64_t kSize = std::min<uint64_t>(MaxBytes(), (32ULL << 20) / TimeScale());
  auto peer = StartPeer(kSize, 34, /*read_only=*/true);
  ASSERT_TRUE(peer->ready());
  auto id = e.AddPeer(peer->address());
  ASSERT_TRUE(id.ok());
  Buffer local(kSize);
  auto mr = e.Register(local.data(), kSize);
  ASSERT_TRUE(mr.ok());
  auto start = std::chrono::steady_clock::now();
  Status s = e.Read(*id, peer->region(), 0, *mr, local.data(), kSize);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cerr << "  " << kSize / 4096 << " reads of 4 KiB one at a time: " << secs
            << " s with op_timeout_ms=" << Ms(150) << "\n";
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(FirstMismatch(local.data(), kSize, 34), -1);
}

TEST_F(FabricProcessTest, RegistrationCacheServesCoveredRanges) {
  Engine& e = SharedEngine();
  Buffer b(4 << 20);
  auto whole = e.Register(b.data(), b.size());
  ASSERT_TRUE(whole.ok());
  auto inner = e.Register(b.data() + 4096, 1 << 20);
  ASSERT_TRUE(inner.ok());
  EXPECT_EQ(whole->get(), inner->get());
  auto outside = e.Register(b.data() + (3 << 20),
                            2 << 20 > b.size() - (3 << 20) ? b.size() - (3 << 20) : 2 << 20);
  ASSERT_TRUE(outside.ok());
  EXPECT_EQ(whole->get(), outside->get());
  EXPECT_EQ(e.Register(nullptr, 10).status().code(), StatusCode::kInvalidArgument);
  // Never a region with other access (it would widen the exposure), nor a private one.
  auto readable = e.Register(b.data() + 4096, 1 << 20, fabric::kRemoteRead);
  ASSERT_TRUE(readable.ok());
  EXPECT_NE(readable->get(), whole->get());
  auto own1 = e.Register(b.data() + 4096, 1 << 20, fabric::kRemoteRead, fabric::Sharing::kPrivate);
  auto own2 = e.Register(b.data() + 4096, 1 << 20, fabric::kRemoteRead, fabric::Sharing::kPrivate);
  ASSERT_TRUE(own1.ok() && own2.ok());
  EXPECT_NE(own1->get(), own2->get());
  EXPECT_NE(own1->get(), readable->get());
  if (!e.profile().prov_key) {
    EXPECT_NE((*own1)->Describe().key, (*own2)->Describe().key);
  }
  // Peers may not write an agent-like engine's memory: it refuses to register for it.
  EXPECT_EQ(e.Register(b.data(), 4096, fabric::kRemoteWrite).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(FabricProcessTest, RegisterDeregisterLoopLeavesMemoryAndFidsFlat) {
  Engine& e = SharedEngine();
  std::vector<std::unique_ptr<Buffer>> buffers;
  for (int i = 0; i < 16; ++i) buffers.push_back(std::make_unique<Buffer>(64 << 10));
  auto cycle = [&](int n) {
    for (int i = 0; i < n; ++i) {
      Buffer& b = *buffers[i % buffers.size()];
      auto mr = e.Register(b.data() + (i % 7) * 64, 32 << 10);
      ASSERT_TRUE(mr.ok()) << mr.status();
    }
  };
  cycle(200);  // warm up allocator and provider caches
  const uint64_t regions = e.stats().regions_registered;
  const size_t fds = CountOpenFds();
  const size_t rss = RssKiB();
  cycle(10000);
  EXPECT_EQ(e.stats().regions_registered, regions);
  EXPECT_EQ(CountOpenFds(), fds);
  EXPECT_LT(RssKiB(), rss + 8 * 1024) << "RSS grew from " << rss << " KiB";
  std::cerr << "  10000 registrations: fds " << fds << " -> " << CountOpenFds() << ", RSS " << rss
            << " -> " << RssKiB() << " KiB\n";
}

}  // namespace
}  // namespace rayfabric

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--peer") return rayfabric::testing::PeerMain(argc, argv);
  rayfabric::g_self = "/proc/self/exe";
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n > 0) rayfabric::g_self.assign(path, n);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
