// The agent's pull, lease and release logic without Ray: real agents (Agent::Open) with real
// libfabric engines (tcp;ofi_rxm and sockets on loopback) reading each other's objects, their
// stores and their calls to each other through the fakes at the two seams (agent_fakes.h). Each
// case drives one path that real-Ray tests reach only by chance: failover to the next provider,
// a lease that expires, a refusal for room asked again, a lease call that fails or is answered
// wrongly. GrpcPeerCalls, the real seam, is run against real gRPC peers that are no V3 agent.
#include <arpa/inet.h>
#include <errno.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <deque>
#include <random>
#include <set>

#include "agent/agent.h"
#include "agent_fakes.h"
#include "rayfabric/log.h"

namespace rayfabric::agent::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

ObjectId Id(uint8_t b) { return ObjectId::FromBinary(std::string(ObjectId::kSize, b)).value(); }

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(gen());
  return out;
}

uint64_t CounterOf(const v1::StatusReply& status, const std::string& name) {
  for (const v1::Counter& c : status.counters()) {
    if (c.name() == name) return c.value();
  }
  ADD_FAILURE() << "no counter " << name;
  return 0;
}

// Waits (at most `bound`) until `done` holds.
bool Eventually(const std::function<bool()>& done, milliseconds bound = milliseconds(1000)) {
  const auto until = Clock::now() + bound;
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(milliseconds(5));
  }
  return true;
}

// A TCP socket bound to a free loopback port, and that address (-1 if either failed).
int BoundLoopbackSocket(sockaddr_in& addr) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  addr = sockaddr_in{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// The lease's fabric address (a sockaddr_in: tcp's) with its port replaced (network order).
void ReplacePort(v1::LeaseReply& reply, uint16_t port) {
  std::string address = reply.fabric_address();
  ASSERT_GE(address.size(), sizeof(sockaddr_in));
  std::memcpy(address.data() + offsetof(sockaddr_in, sin_port), &port, sizeof(port));
  reply.set_fabric_address(address);
}

// Points every tcp lease at a loopback port nobody listens on (rxm retries a refused connection
// until the read's progress timeout).
std::function<void(const std::string&, v1::LeaseReply&)> TcpToAClosedPort() {
  sockaddr_in closed{};
  const int probe = BoundLoopbackSocket(closed);
  EXPECT_GE(probe, 0);
  if (probe >= 0) close(probe);
  return [port = closed.sin_port](const std::string&, v1::LeaseReply& reply) {
    if (reply.provider() == "tcp;ofi_rxm") ReplacePort(reply, port);
  };
}

// A TCP relay on loopback between a reader and a source's fabric address (the lease's address
// rewritten to the relay's), that can be frozen: while frozen it moves no byte either way, as a
// link that stopped passing traffic; thawed, it delivers what waited.
class FreezableRelay {
 public:
  FreezableRelay() : listen_fd_(BoundLoopbackSocket(address_)) {
    if (listen_fd_ < 0 || listen(listen_fd_, 8) != 0) abort();
    thread_ = std::thread([this] { Run(); });
  }
  ~FreezableRelay() {
    stop_ = true;
    thread_.join();
    for (int fd : fds_) close(fd);
    close(listen_fd_);
  }
  FreezableRelay(const FreezableRelay&) = delete;
  FreezableRelay& operator=(const FreezableRelay&) = delete;

  // The source's own address: where accepted connections are relayed to.
  void SetUpstream(const sockaddr_in& upstream) {
    std::lock_guard<std::mutex> lock(mu_);
    upstream_ = upstream;
  }
  uint16_t port() const { return address_.sin_port; }  // network order
  void Freeze() { frozen_ = true; }
  void Thaw() { frozen_ = false; }
  uint64_t bytes_relayed() const { return relayed_; }

 private:
  void Run() {
    while (!stop_) {
      std::vector<pollfd> polled{{listen_fd_, POLLIN, 0}};
      if (!frozen_) {
        for (int fd : open_) polled.push_back({fd, POLLIN, 0});
      }
      if (poll(polled.data(), polled.size(), 5) <= 0) continue;
      if (polled[0].revents & POLLIN) Accept();
      for (size_t k = 1; k < polled.size(); ++k) {
        if (polled[k].revents & (POLLIN | POLLHUP | POLLERR)) Pump(polled[k].fd);
      }
    }
  }
  void Accept() {
    const int in = accept(listen_fd_, nullptr, nullptr);
    if (in < 0) return;
    sockaddr_in upstream{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      upstream = upstream_;
    }
    const int out = socket(AF_INET, SOCK_STREAM, 0);
    if (out < 0 || connect(out, reinterpret_cast<sockaddr*>(&upstream), sizeof(upstream)) != 0) {
      if (out >= 0) close(out);
      close(in);
      return;
    }
    fds_.push_back(in);
    fds_.push_back(out);
    open_.insert(in);
    open_.insert(out);
    peer_[in] = out;
    peer_[out] = in;
  }
  // One read from `from`, written whole to its peer. An end or error on one side is passed on
  // (the peer's sending half shut), so that whoever waits on the other side learns of it.
  void Pump(int from) {
    char buffer[64 << 10];
    ssize_t n = 0;
    do {
      n = read(from, buffer, sizeof(buffer));
    } while (n < 0 && errno == EINTR);
    const int to = peer_[from];
    if (n <= 0) {
      shutdown(to, SHUT_WR);
      open_.erase(from);
      return;
    }
    for (ssize_t sent = 0; sent < n && !stop_;) {
      const ssize_t w =
          send(to, buffer + sent, static_cast<size_t>(n - sent), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) {
        sent += w;
      } else if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd writable{to, POLLOUT, 0};
        poll(&writable, 1, 5);  // bounded: the destructor's stop_ is seen within 5 ms
      } else {
        shutdown(from, SHUT_RD);  // the peer is gone: so is this direction
        open_.erase(from);
        return;
      }
    }
    relayed_ += static_cast<uint64_t>(n);
  }

  sockaddr_in address_{};
  const int listen_fd_;
  std::mutex mu_;
  sockaddr_in upstream_{};
  std::vector<int> fds_;  // the relay thread's alone: every socket (closed at the end)
  std::set<int> open_;    // those still read from
  std::map<int, int> peer_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> frozen_{false};
  std::atomic<uint64_t> relayed_{0};
  std::thread thread_;
};

struct Node {
  std::string name;
  std::shared_ptr<FakeStoreNode> store;
  std::unique_ptr<Agent> agent;
};

class AgentSeams : public ::testing::Test {
 protected:
  // The log lines some cases read are warnings: shown whatever RAYFABRIC_LOG_LEVEL says.
  void SetUp() override { SetLogLevel(LogLevel::kInfo); }
  // An agent named `name` (also its address and host) on a store of its own.
  // `reset_endpoints` false: its engines behave as where registrations are bound to the endpoint.
  Node& Start(const std::string& name, const std::map<std::string, std::string>& settings,
              bool reset_endpoints = true) {
    Node node;
    node.name = name;
    node.store = std::make_shared<FakeStoreNode>(64 << 20);
    AgentOptions options;
    options.node_id = std::string(ObjectId::kSize, name[0]);
    options.listen_host = "127.0.0.1";
    options.config = Config::FromEnvironment();
    for (const auto& [key, value] :
         std::map<std::string, std::string>{{"provider", "tcp;ofi_rxm"}, {"warm_store", "false"}}) {
      EXPECT_TRUE(options.config.Set(key, value).ok());
    }
    for (const auto& [key, value] : settings) {
      EXPECT_TRUE(options.config.Set(key, value).ok()) << key;
    }
    rayfabric::agent::AgentSeams seams;
    seams.connect_store = node.store->Connector();
    seams.peers = std::make_unique<FakePeerCalls>(network_, name);
    seams.reset_undrained_endpoints = reset_endpoints;
    auto agent = Agent::Open(std::move(options), std::move(seams));
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (!agent.ok()) abort();
    node.agent = std::move(*agent);
    {
      std::lock_guard<std::mutex> lock(network_->mu);
      network_->agents[name] = node.agent.get();
    }
    nodes_.push_back(std::move(node));
    return nodes_.back();
  }
  void TearDown() override {
    // Readers first: they give back their leases to sources still there.
    while (!nodes_.empty()) {
      {
        std::lock_guard<std::mutex> lock(network_->mu);
        network_->agents.erase(nodes_.back().name);
      }
      nodes_.pop_back();
    }
  }

  static v1::PullRequest PullOf(const std::string& source,
                                const std::vector<std::pair<ObjectId, size_t>>& objects) {
    v1::PullRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_timeout_ms(10000);
    for (const auto& [id, size] : objects) {
      v1::PullItem* item = request.add_items();
      item->set_object_id(id.Binary());
      item->set_source_agent(source);
      item->set_object_size(size);
    }
    return request;
  }

  std::shared_ptr<FakeNetwork> network_ = std::make_shared<FakeNetwork>();
  std::deque<Node> nodes_;
};

TEST_F(AgentSeams, PullsByteExactAndGivesItsLeasesBack) {
  Node& source = Start("source", {});
  Node& reader = Start("reader", {});
  const std::string bytes = RandomBytes(3 << 20, 1);
  source.store->Put(Id(1), bytes);

  v1::PullReply reply = reader.agent->Pull(PullOf("source", {{Id(1), bytes.size()}}));
  ASSERT_EQ(reply.results_size(), 1);
  EXPECT_EQ(reply.results(0).outcome(), v1::PULLED) << reply.results(0).error();
  EXPECT_EQ(reply.results(0).provider(), "tcp;ofi_rxm");
  EXPECT_TRUE(reader.store->Read(Id(1)) == bytes) << "the replica differs from the object";
  EXPECT_EQ(reader.store->Pins(Id(1)), 0) << "sealed and released by the puller";
  EXPECT_TRUE(Eventually([&] {
    return source.store->Pins(Id(1)) == 0 &&
           CounterOf(source.agent->GetStatus(), "leases_released") == 1;
  })) << "the reader's lease was never given back";
}

// Reads that fail on the best provider both nodes have go again over the next one, in the same
// Pull; the failed provider is then not offered to that source for a while.
TEST_F(AgentSeams, FailsOverToTheNextProviderWhenReadsFail) {
  const std::map<std::string, std::string> both = {{"provider", "tcp;ofi_rxm,sockets"}};
  Node& source = Start("source", both);
  // rxm retries a refused connection until the read's progress timeout: a short one here.
  Node& reader = Start(
      "reader",
      {{"provider", "tcp;ofi_rxm,sockets"}, {"op_timeout_ms", "300"}, {"drain_timeout_ms", "200"}});
  // The source's tcp address, as the reader is told it, leads nowhere.
  network_->tamper_lease = TcpToAClosedPort();
  const std::string a = RandomBytes(1 << 20, 2);
  const std::string b = RandomBytes(1 << 20, 3);
  source.store->Put(Id(1), a);
  source.store->Put(Id(2), b);

  ::testing::internal::CaptureStderr();
  v1::PullReply reply = reader.agent->Pull(PullOf("source", {{Id(1), a.size()}}));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("later pulls from that agent offer sockets first"), std::string::npos) << log;
  ASSERT_EQ(reply.results_size(), 1);
  EXPECT_EQ(reply.results(0).outcome(), v1::PULLED) << reply.results(0).error();
  EXPECT_EQ(reply.results(0).provider(), "sockets");
  EXPECT_TRUE(reader.store->Read(Id(1)) == a);
  EXPECT_EQ(network_->leases_asked, 2) << "one lease per provider tried";
  EXPECT_TRUE(Eventually([&] { return reader.store->Aborts() == 1; }))
      << "the failed read's replica must be aborted";

  // The next Pull from that source offers only the provider that worked.
  reply = reader.agent->Pull(PullOf("source", {{Id(2), b.size()}}));
  EXPECT_EQ(reply.results(0).outcome(), v1::PULLED) << reply.results(0).error();
  EXPECT_EQ(reply.results(0).provider(), "sockets");
  EXPECT_EQ(network_->leases_asked, 3) << "tcp was offered again to a source it failed with";
  EXPECT_TRUE(reader.store->Read(Id(2)) == b);
  EXPECT_TRUE(Eventually([&] {
    return source.store->Pins(Id(1)) == 0 && source.store->Pins(Id(2)) == 0;
  })) << "every lease, the failed attempt's too, is given back";
}

// A provider whose reads failed with a source is skipped with it for a while; where the source
// shares no other provider with this node, the lease refused for that ("no fabric in common") is
// asked again with it, and it is no longer skipped there: the pair is not left to Ray's path.
TEST_F(AgentSeams, AFailedProviderThatIsThePairsOnlyOneIsOfferedAgain) {
  Node& source = Start("source", {});  // tcp;ofi_rxm only
  Node& reader = Start(
      "reader",
      {{"provider", "tcp;ofi_rxm,sockets"}, {"op_timeout_ms", "300"}, {"drain_timeout_ms", "200"}});
  network_->tamper_lease = TcpToAClosedPort();
  const std::string a = RandomBytes(1 << 20, 13);
  const std::string b = RandomBytes(1 << 20, 14);
  source.store->Put(Id(1), a);
  source.store->Put(Id(2), b);

  // tcp's reads fail; the failover offers sockets alone, which the source does not speak.
  ::testing::internal::CaptureStderr();
  v1::PullReply reply = reader.agent->Pull(PullOf("source", {{Id(1), a.size()}}));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(reply.results(0).outcome(), v1::FAILED);
  EXPECT_EQ(network_->leases_asked, 2);
  EXPECT_NE(log.find("offer sockets first (tcp;ofi_rxm again where the agent shares none of them)"),
            std::string::npos)
      << log;

  // The link works again: sockets is refused, tcp asked again at once and read over.
  network_->tamper_lease = nullptr;
  reply = reader.agent->Pull(PullOf("source", {{Id(2), b.size()}}));
  ASSERT_EQ(reply.results_size(), 1);
  EXPECT_EQ(reply.results(0).outcome(), v1::PULLED) << reply.results(0).error();
  EXPECT_EQ(reply.results(0).provider(), "tcp;ofi_rxm");
  EXPECT_TRUE(reader.store->Read(Id(2)) == b);
  EXPECT_EQ(network_->leases_asked, 4) << "refused for no fabric in common, then asked with tcp";
  // And from then on tcp is offered with that source from the start: one lease per Pull.
  EXPECT_TRUE(Eventually([&] { return source.store->Pins(Id(1)) == 0; }));
  reply = reader.agent->Pull(PullOf("source", {{Id(1), a.size()}}));
  EXPECT_EQ(reply.results(0).outcome(), v1::PULLED) << reply.results(0).error();
  EXPECT_EQ(network_->leases_asked, 5);
  EXPECT_TRUE(reader.store->Read(Id(1)) == a);
}

// A lease ends at its TTL: the reader never seals bytes read past it, and the source unpins it by
// itself when the reader never gives it back.
TEST_F(AgentSeams, LeasesExpire) {
  Node& source = Start("source", {});
  Node& reader = Start("reader", {});
  const std::string bytes = RandomBytes(4 << 20, 4);
  source.store->Put(Id(1), bytes);
  // The reader is told its lease ends 1 ms after it asked (the source keeps the object pinned for
  // its own TTL): whether the read is refused before it starts or finishes too late, nothing read
  // past a lease's end is sealed.
  network_->tamper_lease = [](const std::string&, v1::LeaseReply& reply) {
    for (v1::Lease& lease : *reply.mutable_leases()) lease.set_expires_in_ms(1);
  };
  v1::PullReply reply = reader.agent->Pull(PullOf("source", {{Id(1), bytes.size()}}));
  network_->tamper_lease = nullptr;
  ASSERT_EQ(reply.results_size(), 1);
  EXPECT_EQ(reply.results(0).outcome(), v1::FAILED);
  EXPECT_EQ(reply.results(0).error_code(), v1::ERROR_CODE_TIMED_OUT) << reply.results(0).error();
  EXPECT_NE(reply.results(0).error().find("lease"), std::string::npos) << reply.results(0).error();
  EXPECT_FALSE(reader.store->Exists(Id(1))) << "a replica read past its lease must be aborted";
  EXPECT_EQ(CounterOf(reader.agent->GetStatus(), "pulls_lease_expired"), 1u);
  EXPECT_TRUE(Eventually([&] { return source.store->Pins(Id(1)) == 0; }))
      << "the reader's lease was not given back";

  // A lease nobody releases.
  v1::LeaseRequest lease;
  lease.set_protocol_version(kProtocolVersion);
  lease.set_ttl_ms(300);
  lease.add_object_ids(Id(1).Binary());
  lease.add_reader_providers("tcp;ofi_rxm");
  v1::LeaseReply granted = source.agent->Lease(lease, "forgetful");
  ASSERT_EQ(granted.leases_size(), 1);
  ASSERT_EQ(granted.leases(0).error_code(), v1::ERROR_CODE_NONE) << granted.leases(0).error();
  EXPECT_GE(source.store->Pins(Id(1)), 1);
  EXPECT_TRUE(Eventually([&] { return source.store->Pins(Id(1)) == 0; }))
      << "an expired lease keeps its object pinned";
  EXPECT_GE(CounterOf(source.agent->GetStatus(), "leases_expired"), 1u);
  v1::ReleaseRequest late;
  late.set_protocol_version(kProtocolVersion);
  v1::LeaseRef* ref = late.add_leases();
  ref->set_lease_id(granted.leases(0).lease_id());
  ref->set_token(granted.leases(0).token());
  v1::ReleaseReply answer = source.agent->Release(late);
  ASSERT_EQ(answer.error_codes_size(), 1);
  EXPECT_EQ(answer.error_codes(0), v1::ERROR_CODE_NOT_FOUND) << answer.errors(0);
  EXPECT_EQ(source.store->Pins(Id(1)), 0) << "a late release must not unpin twice";
}

// A failed read whose operations neither drain nor can be cut off (no endpoint reset: where
// registrations are bound to the endpoint) leaves its replica created and unsealed, so the store
// never reuses memory the read may still write; once its operations come back the replica is
// aborted. The link freezes for real: a relay stops passing the connection's bytes.
TEST_F(AgentSeams, AnUndrainedReadsReplicaIsQuarantinedUntilItDrains) {
  Node& source = Start("source", {});
  Node& reader = Start("reader", {{"op_timeout_ms", "500"}, {"drain_timeout_ms", "100"}},
                       /*reset_endpoints=*/false);
  FreezableRelay relay;
  network_->tamper_lease = [&relay](const std::string&, v1::LeaseReply& reply) {
    ASSERT_GE(reply.fabric_address().size(), sizeof(sockaddr_in));
    sockaddr_in upstream{};
    std::memcpy(&upstream, reply.fabric_address().data(), sizeof(upstream));
    relay.SetUpstream(upstream);
    ReplacePort(reply, relay.port());
  };
  const std::string a = RandomBytes(1 << 20, 11);
  const std::string b = RandomBytes(1 << 20, 12);
  source.store->Put(Id(1), a);
  source.store->Put(Id(2), b);

  // Through the relay while it passes traffic: the connection is up, the bytes arrive.
  v1::PullReply reply = reader.agent->Pull(PullOf("source", {{Id(1), a.size()}}));
  ASSERT_EQ(reply.results(0).outcome(), v1::PULLED) << reply.results(0).error();
  EXPECT_TRUE(reader.store->Read(Id(1)) == a);
  EXPECT_GT(relay.bytes_relayed(), a.size()) << "the read did not go through the relay";

  relay.Freeze();
  const Clock::time_point asked = Clock::now();
  ::testing::internal::CaptureStderr();
  reply = reader.agent->Pull(PullOf("source", {{Id(2), b.size()}}));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("tcp;ofi_rxm is this node's only provider: later pulls from that agent go on "
                     "using it"),
            std::string::npos)
      << "the log must not promise a provider the pair does not have:\n"
      << log;
  ASSERT_EQ(reply.results_size(), 1);
  EXPECT_EQ(reply.results(0).outcome(), v1::FAILED);
  EXPECT_EQ(reply.results(0).error_code(), v1::ERROR_CODE_TIMED_OUT) << reply.results(0).error();
  EXPECT_NE(reply.results(0).error().find("still outstanding"), std::string::npos)
      << reply.results(0).error();
  EXPECT_LT(Clock::now() - asked, std::chrono::seconds(5)) << "op and drain timeouts, no more";
  EXPECT_EQ(CounterOf(reader.agent->GetStatus(), "replicas_quarantined"), 1u);
  // Kept created and unsealed (the store holds its memory), not aborted, through sweeps.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_TRUE(reader.store->Exists(Id(2))) << "aborted while its read could still write it";
  EXPECT_EQ(reader.store->Read(Id(2)), "") << "a failed read's replica must never be sealed";
  EXPECT_EQ(reader.store->Aborts(), 0);

  // The link passes traffic again: the read's operations come back (done, or refused by the
  // source, whose lease is given back by now); the next sweep aborts the replica.
  relay.Thaw();
  EXPECT_TRUE(Eventually([&] { return reader.store->Aborts() == 1; }, milliseconds(5000)))
      << "the quarantined replica was not aborted once its read drained";
  EXPECT_FALSE(reader.store->Exists(Id(2)));
  EXPECT_TRUE(Eventually([&] { return source.store->Pins(Id(2)) == 0; }))
      << "the failed read's lease was not given back";
  network_->tamper_lease = nullptr;  // (it names the relay, which goes first)
}

// A serving store connection that breaks is replaced at once; the old one, which holds the pins of
// the leases granted on it, stays open until the last of them ends, and then closes (dropping
// them), so that a reader of such a lease never reads memory the store has reused.
TEST_F(AgentSeams, ABrokenStoreConnectionIsReplacedAndKeptWhileItsLeasesLive) {
  Node& source = Start("source", {});
  source.store->Put(Id(1), RandomBytes(1 << 20, 7));
  auto lease_of = [&](const std::string& requester) {
    v1::LeaseRequest request;
    request.set_protocol_version(kProtocolVersion);
    request.set_ttl_ms(10000);
    request.add_object_ids(Id(1).Binary());
    request.add_reader_providers("tcp;ofi_rxm");
    v1::LeaseReply reply = source.agent->Lease(request, requester);
    EXPECT_EQ(reply.leases_size(), 1);
    EXPECT_EQ(reply.leases(0).error_code(), v1::ERROR_CODE_NONE) << reply.leases(0).error();
    return reply.leases(0);
  };
  auto release = [&](const v1::Lease& lease) {
    v1::ReleaseRequest request;
    request.set_protocol_version(kProtocolVersion);
    v1::LeaseRef* ref = request.add_leases();
    ref->set_lease_id(lease.lease_id());
    ref->set_token(lease.token());
    v1::ReleaseReply reply = source.agent->Release(request);
    EXPECT_EQ(reply.error_codes_size(), 1);
    EXPECT_EQ(reply.error_codes(0), v1::ERROR_CODE_NONE) << reply.errors(0);
  };
  const v1::Lease before = lease_of("reader-1");
  ASSERT_EQ(source.store->Connections(), 2);  // serving and pulling
  ASSERT_EQ(source.store->Pins(Id(1)), 1);

  source.store->BreakConnection(0);              // the serving one
  const v1::Lease after = lease_of("reader-2");  // on a new serving connection
  EXPECT_EQ(CounterOf(source.agent->GetStatus(), "store_reconnects"), 1u);
  EXPECT_EQ(source.store->Connections(), 3) << "the broken serving connection was not replaced";
  EXPECT_EQ(source.store->Pins(Id(1)), 2);
  // Several sweeps later the retired connection is still open: its lease lives.
  std::this_thread::sleep_for(milliseconds(350));
  EXPECT_EQ(source.store->Connections(), 3) << "closed while a lease granted on it lived";
  EXPECT_EQ(source.store->Pins(Id(1)), 2);

  release(before);
  EXPECT_TRUE(Eventually([&] { return source.store->Connections() == 2; }))
      << "the retired connection outlived its last lease";
  EXPECT_EQ(source.store->Pins(Id(1)), 1) << "closing it must drop its pin, and only its pin";
  release(after);
  EXPECT_EQ(source.store->Pins(Id(1)), 0);
  EXPECT_EQ(CounterOf(source.agent->GetStatus(), "leases_released"), 2u);
}

// A source that refuses a lease for want of room for this reader, while the reader's earlier
// leases there are being given back, is asked again once they are.
TEST_F(AgentSeams, RefusedForRoomIsAskedAgainOnceLeasesAreBack) {
  Node& source = Start("source", {{"max_lease_bytes_per_peer", "1M"}});
  Node& reader = Start("reader", {});
  const std::string a = RandomBytes(1 << 20, 5);
  const std::string b = RandomBytes(1 << 20, 6);
  source.store->Put(Id(1), a);
  source.store->Put(Id(2), b);
  network_->release_delay = milliseconds(200);

  v1::PullReply first = reader.agent->Pull(PullOf("source", {{Id(1), a.size()}}));
  EXPECT_EQ(first.results(0).outcome(), v1::PULLED) << first.results(0).error();
  // Id(1)'s lease is still held there (its release is answered 200 ms later): Id(2) does not fit
  // this reader's bound at first.
  const Clock::time_point asked = Clock::now();
  v1::PullReply second = reader.agent->Pull(PullOf("source", {{Id(2), b.size()}}));
  EXPECT_EQ(second.results(0).outcome(), v1::PULLED) << second.results(0).error();
  EXPECT_TRUE(reader.store->Read(Id(2)) == b);
  EXPECT_EQ(network_->leases_asked, 3) << "Id(2) leased twice: refused, then granted";
  EXPECT_EQ(CounterOf(reader.agent->GetStatus(), "pulls_asked_again_for_room"), 1u);
  EXPECT_LT(Clock::now() - asked, std::chrono::seconds(1));

  // Two objects of one Pull, over the bound together: the second goes once the first's lease is
  // back, in the same Pull.
  source.store->Put(Id(3), RandomBytes(1 << 20, 7));
  source.store->Put(Id(4), RandomBytes(1 << 20, 8));
  network_->release_delay = milliseconds(0);
  ASSERT_TRUE(Eventually([&] { return source.store->Pins(Id(2)) == 0; }));
  v1::PullReply both = reader.agent->Pull(PullOf("source", {{Id(3), 1 << 20}, {Id(4), 1 << 20}}));
  EXPECT_EQ(both.results(0).outcome(), v1::PULLED) << both.results(0).error();
  EXPECT_EQ(both.results(1).outcome(), v1::PULLED) << both.results(1).error();
  EXPECT_EQ(CounterOf(reader.agent->GetStatus(), "pulls_asked_again_for_room"), 2u);

  // Refused for room while nothing of this reader's is on its way back (its room is taken by a
  // lease it holds otherwise): final, with the source's reason.
  ASSERT_TRUE(Eventually([&] { return source.store->Pins(Id(4)) == 0; }));
  v1::LeaseRequest hold;
  hold.set_protocol_version(kProtocolVersion);
  hold.add_object_ids(Id(1).Binary());
  hold.add_reader_providers("tcp;ofi_rxm");
  ASSERT_EQ(source.agent->Lease(hold, "reader").leases(0).error_code(), v1::ERROR_CODE_NONE);
  v1::PullReply refused = reader.agent->Pull(PullOf("source", {{Id(2), b.size()}}));
  EXPECT_EQ(refused.results(0).outcome(), v1::ALREADY_LOCAL) << "pulled before: found here";
  source.store->Put(Id(5), RandomBytes(1 << 20, 9));
  refused = reader.agent->Pull(PullOf("source", {{Id(5), 1 << 20}}));
  EXPECT_EQ(refused.results(0).outcome(), v1::FAILED);
  EXPECT_EQ(refused.results(0).error_code(), v1::ERROR_CODE_RESOURCE_EXHAUSTED)
      << refused.results(0).error();
  EXPECT_NE(refused.results(0).error().find("refused a lease"), std::string::npos)
      << refused.results(0).error();
  EXPECT_EQ(CounterOf(reader.agent->GetStatus(), "pulls_asked_again_for_room"), 2u);
  EXPECT_FALSE(reader.store->Exists(Id(5)));
}

// A lease call that fails on its way (the source down, an older agent) ends the Pull's items with
// that failure, its code and its words; nothing is created on the reader. A reply lost after the
// source granted the lease: the same for the reader, and the source's pin ends at the lease's TTL.
TEST_F(AgentSeams, ALeaseCallThatFailsEndsThePullWithItsReason) {
  Node& source = Start("source", {});
  Node& reader = Start("reader", {});
  const std::string bytes = RandomBytes(1 << 20, 10);
  source.store->Put(Id(1), bytes);
  network_->fail_lease = [](const std::string&) { return Unavailable("connection refused"); };
  v1::PullReply reply = reader.agent->Pull(PullOf("source", {{Id(1), bytes.size()}}));
  ASSERT_EQ(reply.results_size(), 1);
  EXPECT_EQ(reply.results(0).outcome(), v1::FAILED);
  EXPECT_EQ(reply.results(0).error_code(), v1::ERROR_CODE_UNAVAILABLE) << reply.results(0).error();
  EXPECT_NE(reply.results(0).error().find("connection refused"), std::string::npos)
      << reply.results(0).error();
  EXPECT_FALSE(reader.store->Exists(Id(1)));

  network_->fail_lease = [](const std::string&) { return VersionMismatch("it runs protocol V2"); };
  reply = reader.agent->Pull(PullOf("source", {{Id(1), bytes.size()}}));
  EXPECT_EQ(reply.results(0).outcome(), v1::FAILED);
  EXPECT_EQ(reply.results(0).error_code(), v1::ERROR_CODE_VERSION_MISMATCH)
      << reply.results(0).error();
  EXPECT_FALSE(reader.store->Exists(Id(1)));
  network_->fail_lease = nullptr;

  network_->lose_lease_reply = [](const std::string&) { return Unavailable("reply lost"); };
  v1::PullRequest pull = PullOf("source", {{Id(1), bytes.size()}});
  pull.set_timeout_ms(300);  // (its leases' TTL: the Pull's bound and a margin)
  reply = reader.agent->Pull(pull);
  network_->lose_lease_reply = nullptr;
  EXPECT_EQ(reply.results(0).outcome(), v1::FAILED);
  EXPECT_EQ(reply.results(0).error_code(), v1::ERROR_CODE_UNAVAILABLE) << reply.results(0).error();
  EXPECT_FALSE(reader.store->Exists(Id(1)));
  EXPECT_GE(source.store->Pins(Id(1)), 1) << "the source granted the lease";
  EXPECT_TRUE(Eventually([&] { return source.store->Pins(Id(1)) == 0; }, milliseconds(5000)))
      << "a lease whose reply was lost outlived its TTL";

  // The source back: the same object comes, byte-exact.
  reply = reader.agent->Pull(PullOf("source", {{Id(1), bytes.size()}}));
  EXPECT_EQ(reply.results(0).outcome(), v1::PULLED) << reply.results(0).error();
  EXPECT_TRUE(reader.store->Read(Id(1)) == bytes);
}

// A source that answers fewer leases than it was asked for is not believed: the Pull fails as a
// protocol error, nothing is read, and the lease it did describe is given back (the one its reply
// left out, which the reader cannot name, ends at its TTL).
TEST_F(AgentSeams, ALeaseReplyWithTooFewLeasesIsRefusedAndGivenBack) {
  Node& source = Start("source", {});
  Node& reader = Start("reader", {});
  source.store->Put(Id(1), RandomBytes(1 << 20, 11));
  source.store->Put(Id(2), RandomBytes(1 << 20, 12));
  network_->tamper_lease = [](const std::string&, v1::LeaseReply& reply) {
    reply.mutable_leases()->RemoveLast();
  };
  // (A short Pull, so that its leases' TTL, the Pull's bound and a margin, ends soon.)
  v1::PullRequest pull = PullOf("source", {{Id(1), 1 << 20}, {Id(2), 1 << 20}});
  pull.set_timeout_ms(300);
  v1::PullReply reply = reader.agent->Pull(pull);
  network_->tamper_lease = nullptr;
  ASSERT_EQ(reply.results_size(), 2);
  for (const v1::PullResult& result : reply.results()) {
    EXPECT_EQ(result.outcome(), v1::FAILED);
    EXPECT_EQ(result.error_code(), v1::ERROR_CODE_PROTOCOL_ERROR) << result.error();
    EXPECT_NE(result.error().find("answered 1 leases for 2 objects"), std::string::npos)
        << result.error();
  }
  EXPECT_FALSE(reader.store->Exists(Id(1)));
  EXPECT_FALSE(reader.store->Exists(Id(2)));
  EXPECT_TRUE(Eventually([&] {
    return source.store->Pins(Id(1)) == 0 &&
           CounterOf(source.agent->GetStatus(), "leases_released") == 1;
  })) << "the lease described was not given back";
  EXPECT_TRUE(Eventually([&] { return source.store->Pins(Id(2)) == 0; }, milliseconds(5000)))
      << "the lease left out of the reply outlived its TTL";
  EXPECT_EQ(CounterOf(source.agent->GetStatus(), "leases_expired"), 1u);
}

// The real seam, against real gRPC peers that are no protocol V3 agent.
std::string Loopback(int port) { return "127.0.0.1:" + std::to_string(port); }

Status LeaseFrom(GrpcPeerCalls& peers, const std::string& address, milliseconds bound,
                 const std::function<bool()>& cancelled = nullptr) {
  std::unique_ptr<PeerCall> call = peers.NewCall();
  v1::LeaseRequest request;
  request.set_protocol_version(kProtocolVersion);
  v1::LeaseReply reply;
  return AwaitPeerCall(*call, cancelled, [&](PeerCalls::Done done) {
    peers.StartLease(*call, address, request, reply, Clock::now() + bound, std::move(done));
  });
}

// A gRPC server without the Peer service (an agent older than V3) answers UNIMPLEMENTED.
TEST(GrpcPeerCallsTest, AServerWithoutThePeerServiceIsAVersionMismatch) {
  // (A V2 agent's service; its own methods unimplemented too.)
  v1::Agent::CallbackService v2_only;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&v2_only);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  GrpcPeerCalls peers(Credentials::Insecure());
  const Status s = LeaseFrom(peers, Loopback(port), milliseconds(5000));
  EXPECT_EQ(s.code(), StatusCode::kVersionMismatch) << s.ToString();
  EXPECT_NE(s.message().find("protocol V3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find(Loopback(port)), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("same rayfabric version"), std::string::npos) << s.ToString();
  server->Shutdown();
}

// A peer that takes the connection and never answers: the call ends at its bound (said as an agent
// that is not there), or as soon as its caller goes away (said as cancelled, not as the peer's
// fault).
TEST(GrpcPeerCallsTest, ASilentPeerEndsAtTheBoundOrWhenTheCallerLeaves) {
  sockaddr_in addr{};
  const int listener = BoundLoopbackSocket(addr);
  ASSERT_GE(listener, 0);
  ASSERT_EQ(listen(listener, 16), 0);  // connections complete in the backlog; nobody speaks
  const std::string address = Loopback(ntohs(addr.sin_port));
  GrpcPeerCalls peers(Credentials::Insecure());
  // (gRPC keeps connecting to such a peer for its connect timeout, 20 s: both calls below end
  // well within it, by their own bound or their caller's leaving.)

  Clock::time_point t0 = Clock::now();
  Status s = LeaseFrom(peers, address, milliseconds(300));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find(address), std::string::npos) << s.ToString();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3));

  t0 = Clock::now();
  s = LeaseFrom(peers, address, milliseconds(30000),
                [t0] { return Clock::now() - t0 > milliseconds(200); });
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_NE(s.message().find("cancelled"), std::string::npos) << s.ToString();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(3)) << "a cancelled call must end at once";
  close(listener);
}

}  // namespace
}  // namespace rayfabric::agent::testing
