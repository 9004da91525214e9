// Provider and domain selection against the real fi_info of this machine (tcp;ofi_rxm, whose
// utility layer ignores the domain name hint: the choice must still honour RAYFABRIC_DOMAIN).
#include <gtest/gtest.h>

#include <chrono>
#include <map>

#include "rayfabric/config.h"
#include "rayfabric/fabric.h"

namespace rayfabric::fabric {
namespace {

Config WithProvider(const std::string& provider, const std::string& domain = "") {
  Config c = Config::FromEnvironment();
  EXPECT_TRUE(c.Set("provider", provider).ok());
  if (!domain.empty()) {
    EXPECT_TRUE(c.Set("domain", domain).ok());
  }
  return c;
}

// What the engine is given: every value typed once from the table, lists split, sizes with
// their suffixes, times in their units; a bad value refused with its name before anything opens.
TEST(EngineSettings, ReadTypedFromTheConfiguration) {
  Config c = Config::FromEnvironment();
  for (const auto& [key, value] :
       std::map<std::string, std::string>{{"provider", "tcp;ofi_rxm, sockets"},
                                          {"domain", "lo"},
                                          {"require_rdma", "yes"},
                                          {"max_rails", "2"},
                                          {"chunk_size", "1M"},
                                          {"max_inflight", "8"},
                                          {"op_timeout_ms", "1500"},
                                          {"drain_timeout_ms", "250"},
                                          {"max_registration", "64M"},
                                          {"progress_spin_us", "20"}}) {
    ASSERT_TRUE(c.Set(key, value).ok()) << key;
  }
  auto settings = EngineSettings::FromConfig(c);
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_EQ(settings->providers, (std::vector<std::string>{"tcp;ofi_rxm", "sockets"}));
  EXPECT_EQ(settings->domains, (std::vector<std::string>{"lo"}));
  EXPECT_TRUE(settings->require_rdma);
  EXPECT_EQ(settings->max_rails, 2);
  EXPECT_EQ(settings->chunk_size, 1u << 20);
  EXPECT_EQ(settings->max_inflight, 8u);
  EXPECT_EQ(settings->op_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(settings->drain_timeout, std::chrono::milliseconds(250));
  EXPECT_EQ(settings->max_registration, 64u << 20);
  EXPECT_EQ(settings->progress_spin, std::chrono::microseconds(20));
  EXPECT_TRUE(settings->reset_undrained_endpoints) << "not a setting: on unless code says so";

  ASSERT_TRUE(c.Set("max_inflight", "0").ok());
  auto refused = EngineSettings::FromConfig(c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_inflight"), std::string::npos) << refused.status();
  auto engine = Engine::Open(c);
  ASSERT_FALSE(engine.ok()) << "an engine opened on a configuration its settings refuse";
  EXPECT_NE(engine.status().message().find("max_inflight"), std::string::npos) << engine.status();

  // Settings made by hand reach the engine only with what it needs.
  EngineSettings by_hand = *settings;
  by_hand.chunk_size = 0;
  auto zero = Engine::Open(by_hand);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument) << zero.status();
  EXPECT_NE(zero.status().message().find("chunk_size 0"), std::string::npos) << zero.status();
  EXPECT_FALSE(SelectProvider(EngineSettings{}).ok()) << "zero settings must be refused";
}

TEST(ProviderSelection, EveryOfferedDomainCanBeRequestedByName) {
  auto all = SelectProvider(WithProvider("tcp;ofi_rxm"));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_GE(all->candidates.size(), 1U);
  for (const ProviderCandidate& c : all->candidates) {
    auto one = SelectProvider(WithProvider("tcp;ofi_rxm", c.domain));
    ASSERT_TRUE(one.ok()) << c.domain << ": " << one.status();
    EXPECT_EQ(one->chosen.domain, c.domain);
    EXPECT_EQ(one->candidates.size(), 1U) << "only the requested domain is a candidate";
    EXPECT_EQ(one->candidates[0].verdict.rfind("chosen", 0), 0U) << one->candidates[0].verdict;
    EXPECT_NE(one->reason.find("domain: requested by RAYFABRIC_DOMAIN"), std::string::npos)
        << one->reason;
  }
}

TEST(ProviderSelection, UnknownDomainSaysWhatIsOffered) {
  auto all = SelectProvider(WithProvider("tcp;ofi_rxm"));
  ASSERT_TRUE(all.ok()) << all.status();
  auto none = SelectProvider(WithProvider("tcp;ofi_rxm", "nosuch0"));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  const std::string m = none.status().message();
  EXPECT_NE(m.find("'nosuch0'"), std::string::npos) << m;
  EXPECT_NE(m.find("tcp;ofi_rxm/" + all->chosen.domain), std::string::npos) << m;
  EXPECT_NE(m.find("RAYFABRIC_DOMAIN"), std::string::npos) << m;
}

TEST(ProviderSelection, EngineOpensOnTheRequestedDomain) {
  auto all = SelectProvider(WithProvider("tcp;ofi_rxm"));
  ASSERT_TRUE(all.ok()) << all.status();
  const std::string domain = all->candidates.back().domain;
  auto engine = Engine::Open(WithProvider("tcp;ofi_rxm", domain));
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->profile().domain, domain);
}

// On a host with several interfaces the fabric runs where Ray's traffic does: among domains of one
// provider, the one holding the node's IP wins (a loopback one too: a one-host cluster).
TEST(ProviderSelection, TheDomainHoldingTheNodesIpWins) {
  auto all = SelectProvider(WithProvider("tcp;ofi_rxm"));
  ASSERT_TRUE(all.ok()) << all.status();
  int tried = 0;
  for (const ProviderCandidate& c : all->candidates) {
    if (c.ip.empty()) continue;
    EngineOptions options;
    options.preferred_ip = c.ip;
    auto chosen = SelectProvider(WithProvider("tcp;ofi_rxm"), options);
    ASSERT_TRUE(chosen.ok()) << chosen.status();
    EXPECT_EQ(chosen->chosen.domain, c.domain) << chosen->ToString();
    EXPECT_NE(chosen->reason.find("holds the node's IP " + c.ip), std::string::npos)
        << chosen->reason;
    ++tried;
  }
  EXPECT_GE(tried, 2) << "this host offers tcp on lo and one more interface";
  // An IP no domain holds: the first non-loopback domain, and the report says so.
  EngineOptions elsewhere;
  elsewhere.preferred_ip = "198.51.100.7";
  auto fallback = SelectProvider(WithProvider("tcp;ofi_rxm"), elsewhere);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_NE(fallback->chosen.domain, "lo");
  EXPECT_NE(fallback->reason.find("no domain holds the node's IP 198.51.100.7"), std::string::npos)
      << fallback->reason;
}

// By default a node opens one fabric per class that reaches other hosts: its best RDMA provider
// (none here) and its best socket provider; never shm or udp.
TEST(ProviderSelection, DefaultOpensOneFabricPerClass) {
  auto report = SelectProvider(WithProvider(""));
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_GE(report->fabrics.size(), 1U);
  int sockets_class = 0;
  for (const FabricSummary& f : report->fabrics) {
    EXPECT_NE(f.provider, "shm");
    EXPECT_EQ(f.provider.find("udp"), std::string::npos) << f.provider;
    if (!f.rdma) ++sockets_class;
  }
  EXPECT_EQ(sockets_class, 1) << report->ToString();
  EXPECT_EQ(report->chosen.provider, report->fabrics.front().provider);
}

TEST(ProviderSelection, AListOpensExactlyThoseBestFirst) {
  for (const char* list : {"tcp;ofi_rxm,sockets", "sockets, tcp;ofi_rxm"}) {
    auto report = SelectProvider(WithProvider(list));
    ASSERT_TRUE(report.ok()) << list << ": " << report.status();
    ASSERT_EQ(report->fabrics.size(), 2U) << report->ToString();
    EXPECT_EQ(report->fabrics[0].provider, "tcp;ofi_rxm") << list;
    EXPECT_EQ(report->fabrics[1].provider, "sockets") << list;
  }
  // Two names of one provider open it once.
  auto once = SelectProvider(WithProvider("tcp,tcp;ofi_rxm"));
  ASSERT_TRUE(once.ok()) << once.status();
  EXPECT_EQ(once->fabrics.size(), 1U) << once->ToString();
  auto unknown = SelectProvider(WithProvider("tcp;ofi_rxm,nosuchprov"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
  EXPECT_NE(unknown.status().message().find("'nosuchprov'"), std::string::npos) << unknown.status();
}

// RAYFABRIC_DOMAIN applies to the providers that offer it; the others keep their own choice.
TEST(ProviderSelection, TheDomainAppliesWhereItIsOffered) {
  auto report = SelectProvider(WithProvider("tcp;ofi_rxm,shm", "lo"));
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->fabrics.size(), 2U) << report->ToString();
  EXPECT_EQ(report->fabrics[0].provider, "tcp;ofi_rxm");
  EXPECT_EQ(report->fabrics[0].domain, "lo");
  EXPECT_EQ(report->fabrics[1].provider, "shm");
  EXPECT_EQ(report->fabrics[1].domain, "shm");
}

// The domains a provider offers here (tcp;ofi_rxm: at least lo and the Ethernet device).
std::vector<std::string> OfferedDomains(const std::string& provider) {
  std::vector<std::string> out;
  auto all = SelectProvider(WithProvider(provider));
  EXPECT_TRUE(all.ok()) << all.status();
  if (!all.ok()) return out;
  for (const ProviderCandidate& c : all->candidates) {
    if (c.provider == provider) out.push_back(c.domain);
  }
  return out;
}

// Several listed domains of one provider are its rails, in list order (the first is its domain);
// the report says so for each.
TEST(ProviderSelection, ListedDomainsBecomeRailsInListOrder) {
  const std::vector<std::string> domains = OfferedDomains("tcp;ofi_rxm");
  if (domains.size() < 2) GTEST_SKIP() << "tcp;ofi_rxm offers one domain here";
  for (const std::string& list : {domains[0] + "," + domains[1], domains[1] + "," + domains[0]}) {
    auto report = SelectProvider(WithProvider("tcp;ofi_rxm", list));
    ASSERT_TRUE(report.ok()) << list << ": " << report.status();
    ASSERT_EQ(report->fabrics.size(), 2U) << report->ToString();
    const std::string first = list.substr(0, list.find(','));
    const std::string second = list.substr(list.find(',') + 1);
    EXPECT_EQ(report->chosen.domain, first);
    EXPECT_EQ(report->fabrics[0].domain, first);
    EXPECT_EQ(report->fabrics[0].rail, 0);
    EXPECT_EQ(report->fabrics[1].domain, second);
    EXPECT_EQ(report->fabrics[1].rail, 1);
    EXPECT_NE(report->ToString().find("(rail 2)"), std::string::npos) << report->ToString();
    bool said = false;
    for (const ProviderCandidate& c : report->candidates) {
      if (c.domain == second) {
        said = c.verdict.find("chosen as rail 2 of tcp;ofi_rxm") == 0;
        EXPECT_TRUE(said) << c.verdict;
      }
    }
    EXPECT_TRUE(said);
    // The engines: one per rail, in the same order.
    auto engines = Engine::OpenAll(WithProvider("tcp;ofi_rxm", list));
    ASSERT_TRUE(engines.ok()) << engines.status();
    ASSERT_EQ(engines->size(), 2U);
    EXPECT_EQ((*engines)[0]->profile().domain, first);
    EXPECT_EQ((*engines)[1]->profile().domain, second);
  }
  // A listed domain nobody offers next to one that is offered: the offered one alone.
  auto one = SelectProvider(WithProvider("tcp;ofi_rxm", domains[0] + ",nosuch0"));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->fabrics.size(), 1U) << one->ToString();
}

// Without a list, a socket provider keeps one interface (its others are other networks); only RDMA
// providers stripe across their further domains of the same fabric by default.
TEST(ProviderSelection, SocketProvidersGetOneRailByDefault) {
  auto report = SelectProvider(WithProvider("tcp;ofi_rxm,sockets"));
  ASSERT_TRUE(report.ok()) << report.status();
  for (const FabricSummary& f : report->fabrics) EXPECT_EQ(f.rail, 0) << report->ToString();
  Config bad = WithProvider("tcp;ofi_rxm");
  ASSERT_TRUE(bad.Set("max_rails", "0").ok());
  auto refused = SelectProvider(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("max_rails"), std::string::npos) << refused.status();
}

TEST(ProviderSelection, RequireRdmaWithoutRdmaSaysSo) {
  Config c = WithProvider("");
  ASSERT_TRUE(c.Set("require_rdma", "true").ok());
  auto report = SelectProvider(c);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(report.status().message().find("RAYFABRIC_REQUIRE_RDMA"), std::string::npos)
      << report.status();
}

}  // namespace
}  // namespace rayfabric::fabric
