// FallbackCounts: what the agent keeps of its node's fallback reports, bounded whatever is sent.
#include "agent/fallback_counts.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>

namespace rayfabric::agent {
namespace {

TEST(FallbackCounts, CountsByReasonAndInTotal) {
  FallbackCounts f;
  EXPECT_EQ(f.total(), 0u);
  EXPECT_TRUE(f.ByReason().empty());
  f.Add("pull failed: Unavailable", 2);
  f.Add("no fabric shared", 1);
  f.Add("pull failed: Unavailable", 3);
  f.Add("ignored", 0);  // nothing to count
  EXPECT_EQ(f.total(), 6u);
  const auto by = f.ByReason();
  ASSERT_EQ(by.size(), 2u);
  EXPECT_EQ(by.at("pull failed: Unavailable"), 5u);
  EXPECT_EQ(by.at("no fabric shared"), 1u);
}

TEST(FallbackCounts, DistinctReasonsAreBounded) {
  FallbackCounts f;
  const size_t sent = FallbackCounts::kMaxReasons * 3;
  for (size_t i = 0; i < sent; ++i) f.Add("reason " + std::to_string(i), 1);
  const auto by = f.ByReason();
  ASSERT_EQ(by.size(), FallbackCounts::kMaxReasons);
  const std::string other(FallbackCounts::kOtherReason);
  // The first kMaxReasons - 1 reasons are kept by name, every later one is counted as other.
  EXPECT_EQ(by.at("reason 0"), 1u);
  EXPECT_EQ(by.count("reason " + std::to_string(FallbackCounts::kMaxReasons - 2)), 1u);
  EXPECT_EQ(by.count("reason " + std::to_string(FallbackCounts::kMaxReasons - 1)), 0u);
  EXPECT_EQ(by.at(other), sent - (FallbackCounts::kMaxReasons - 1));
  EXPECT_EQ(f.total(), sent);
  // A reason already kept still counts under its own name once the table is full.
  f.Add("reason 0", 4);
  EXPECT_EQ(f.ByReason().at("reason 0"), 5u);
  EXPECT_EQ(f.ByReason().size(), FallbackCounts::kMaxReasons);
}

TEST(FallbackCounts, CountsSaturate) {
  FallbackCounts f;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  f.Add("a", max - 1);
  f.Add("a", 5);
  f.Add("b", 7);
  EXPECT_EQ(f.ByReason().at("a"), max);
  EXPECT_EQ(f.ByReason().at("b"), 7u);
  EXPECT_EQ(f.total(), max);
}

TEST(FallbackCounts, ReasonsAreCleaned) {
  EXPECT_EQ(FallbackCounts::Clean("  pull failed\n: x\t "), "pull failed : x");
  EXPECT_EQ(FallbackCounts::Clean(""), "unknown");
  EXPECT_EQ(FallbackCounts::Clean(" \r\n\x7f "), "unknown");
  EXPECT_EQ(FallbackCounts::Clean(std::string(500, 'x')),
            std::string(FallbackCounts::kMaxReasonBytes, 'x'));
  // A cut never splits a UTF-8 character: "é" is 2 bytes and would straddle the limit.
  const std::string straddles = std::string(FallbackCounts::kMaxReasonBytes - 1, 'x') + "\xC3\xA9z";
  EXPECT_EQ(FallbackCounts::Clean(straddles),
            std::string(FallbackCounts::kMaxReasonBytes - 1, 'x'));
  const std::string fits = std::string(FallbackCounts::kMaxReasonBytes - 2, 'x') + "\xC3\xA9z";
  EXPECT_EQ(FallbackCounts::Clean(fits),
            std::string(FallbackCounts::kMaxReasonBytes - 2, 'x') + "\xC3\xA9");
  // The same reason sent with different junk around it is one reason.
  FallbackCounts f;
  f.Add("no fabric shared\n", 1);
  f.Add("  no fabric shared", 1);
  EXPECT_EQ(f.ByReason().size(), 1u);
  EXPECT_EQ(f.ByReason().at("no fabric shared"), 2u);
}

}  // namespace
}  // namespace rayfabric::agent
