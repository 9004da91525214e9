// LeaseTable: tokens, expiry and limits (the agent's pin bookkeeping), without plasma or gRPC.
#include "agent/lease_table.h"

#include <gtest/gtest.h>

#include <set>

namespace rayfabric::agent {
namespace {

using std::chrono::milliseconds;

ObjectId Id(uint8_t b) {
  std::string raw(ObjectId::kSize, static_cast<char>(b));
  return ObjectId::FromBinary(raw).value();
}

TEST(LeaseTable, GrantReleaseWithTheRightTokenOnly) {
  LeaseTable t(8);
  auto g = t.Grant({Id(1), 100}, milliseconds(1000));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->token.size(), LeaseTable::kTokenBytes);
  EXPECT_EQ(t.active(), 1u);
  EXPECT_EQ(t.pinned_bytes(), 100u);

  std::string forged = g->token;
  forged[0] ^= 1;
  auto bad = t.Release(g->id, forged);
  EXPECT_EQ(bad.status().code(), StatusCode::kPermissionDenied);
  EXPECT_EQ(t.active(), 1u) << "a forged release must not drop the lease";

  auto ok = t.Release(g->id, g->token);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->object, Id(1));
  EXPECT_EQ(t.pinned_bytes(), 0u);
  auto again = t.Release(g->id, g->token);
  EXPECT_EQ(again.status().code(), StatusCode::kNotFound);
  EXPECT_NE(again.status().message().find("unknown"), std::string::npos);
}

TEST(LeaseTable, TokensAreDistinct) {
  LeaseTable t(1000);
  std::set<std::string> tokens;
  for (int i = 0; i < 1000; ++i) tokens.insert(t.Grant({Id(2), 1}, milliseconds(1000))->token);
  EXPECT_EQ(tokens.size(), 1000u);
}

TEST(LeaseTable, ExpiryUnpinsAndLateReleaseSaysExpired) {
  LeaseTable t(8);
  auto now = LeaseTable::Clock::now();
  auto short_lease = t.Grant({Id(3), 10}, milliseconds(50), now);
  auto long_lease = t.Grant({Id(4), 20}, milliseconds(5000), now);
  ASSERT_TRUE(short_lease.ok() && long_lease.ok());
  EXPECT_TRUE(t.TakeExpired(now + milliseconds(49)).empty());
  auto expired = t.TakeExpired(now + milliseconds(50));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].object, Id(3));
  EXPECT_EQ(t.pinned_bytes(), 20u);
  EXPECT_TRUE(t.RecentlyExpired(short_lease->id));
  auto late = t.Release(short_lease->id, short_lease->token);
  EXPECT_EQ(late.status().code(), StatusCode::kNotFound);
  EXPECT_NE(late.status().message().find("expired"), std::string::npos) << late.status();
}

TEST(LeaseTable, RefusesBeyondTheLimit) {
  LeaseTable t(2);
  ASSERT_TRUE(t.Grant({Id(5), 1}, milliseconds(1000)).ok());
  ASSERT_TRUE(t.Grant({Id(6), 1}, milliseconds(1000)).ok());
  auto third = t.Grant({Id(7), 1}, milliseconds(1000));
  EXPECT_EQ(third.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("RAYFABRIC_MAX_LEASES"), std::string::npos);
  EXPECT_EQ(t.TakeAll().size(), 2u);
  EXPECT_EQ(t.active(), 0u);
}

TEST(LeaseTable, BytesAreBoundedPerRequester) {
  LeaseTable t(100, 1000);
  ASSERT_TRUE(t.Grant({Id(1), 600, "10.0.0.1"}, milliseconds(1000)).ok());
  auto over = t.Grant({Id(2), 500, "10.0.0.1"}, milliseconds(1000));
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("10.0.0.1 already holds 600 bytes"), std::string::npos)
      << over.status();
  // Another requester has its own budget; one object larger than the bound is refused alone.
  auto other = t.Grant({Id(2), 500, "10.0.0.2"}, milliseconds(1000));
  ASSERT_TRUE(other.ok());
  // One object larger than the bound is granted to a requester that holds nothing (else it could
  // never move), and then nothing more.
  ASSERT_TRUE(t.Grant({Id(3), 1001, "10.0.0.3"}, milliseconds(1000)).ok());
  EXPECT_EQ(t.Grant({Id(5), 1, "10.0.0.3"}, milliseconds(1000)).status().code(),
            StatusCode::kResourceExhausted);
  EXPECT_EQ(t.pinned_bytes_of("10.0.0.1"), 600u);
  EXPECT_EQ(t.pinned_bytes_of("10.0.0.3"), 1001u);
  // Released and expired leases give their bytes back.
  ASSERT_TRUE(t.Release(other->id, other->token).ok());
  EXPECT_EQ(t.pinned_bytes_of("10.0.0.2"), 0u);
  EXPECT_EQ(t.TakeExpired(LeaseTable::Clock::now() + milliseconds(2000)).size(), 2u);
  EXPECT_EQ(t.pinned_bytes_of("10.0.0.1"), 0u);
  EXPECT_EQ(t.pinned_bytes_of("10.0.0.3"), 0u);
  EXPECT_TRUE(t.Grant({Id(4), 1000, "10.0.0.1"}, milliseconds(1000)).ok());
  EXPECT_EQ(t.pinned_bytes(), 1000u);
}

}  // namespace
}  // namespace rayfabric::agent
