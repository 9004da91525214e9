// Provider and domain selection against the real fi_info of this machine (tcp;ofi_rxm, whose
// utility layer ignores the domain name hint: the choice must still honour RAYFABRIC_DOMAIN).
#include <gtest/gtest.h>

#include "rayfabric/config.h"
#include "rayfabric/fabric.h"

namespace rayfabric::fabric {
namespace {

Config WithProvider(const std::string& provider, const std::string& domain = "") {
  Config c = Config::FromEnvironment();
  EXPECT_TRUE(c.Set("provider", provider).ok());
  if (!domain.empty()) EXPECT_TRUE(c.Set("domain", domain).ok());
  return c;
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
    EXPECT_EQ(one->candidates[0].verdict, "chosen");
    EXPECT_NE(one->reason.find("domain requested by RAYFABRIC_DOMAIN"), std::string::npos)
        << one->reason;
  }
}

TEST(ProviderSelection, UnknownDomainSaysWhatIsOffered) {
  auto all = SelectProvider(WithProvider("tcp;ofi_rxm"));
  ASSERT_TRUE(all.ok()) << all.status();
  auto none = SelectProvider(WithProvider("tcp;ofi_rxm", "nosuch0"));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  const std::string& m = none.status().message();
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

}  // namespace
}  // namespace rayfabric::fabric
