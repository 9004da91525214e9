#include <gtest/gtest.h>
#include <thread>

#include <cstdlib>

#include "rayfabric/config.h"
#include "rayfabric/log.h"
#include "rayfabric/status.h"

namespace rayfabric {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

Status UsesMacros(int x, int* out) {
  RF_ASSIGN_OR_RETURN(int h, Half(x));
  RF_ASSIGN_OR_RETURN(*out, Half(h));
  return Status::OK();
}

TEST(Status, CarriesCodeMessageAndContext) {
  Status s = TimedOut("read of 4096 bytes from peer 3").WithContext("pull of object ab12");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kTimedOut);
  EXPECT_EQ(s.ToString(), "TimedOut: pull of object ab12: read of 4096 bytes from peer 3");
  EXPECT_EQ(Status::OK().ToString(), "OK");
}

TEST(Result, PropagatesThroughMacros) {
  int out = 0;
  EXPECT_TRUE(UsesMacros(8, &out).ok());
  EXPECT_EQ(out, 2);
  Status s = UsesMacros(6, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "odd: 3");
}

TEST(Config, DefaultsEnvironmentAndOverrides) {
  setenv("RAYFABRIC_MAX_INFLIGHT", "7", 1);
  Config c = Config::FromEnvironment();
  unsetenv("RAYFABRIC_MAX_INFLIGHT");
  EXPECT_EQ(*c.GetInt("max_inflight"), 7);
  EXPECT_EQ(*c.GetBytes("chunk_size"), 4u << 20);
  EXPECT_TRUE(c.Set("chunk_size", "64K").ok());
  EXPECT_EQ(*c.GetBytes("chunk_size"), 64u << 10);
  EXPECT_NE(c.Describe().find("max_inflight = '7' (env RAYFABRIC_MAX_INFLIGHT)"),
            std::string::npos);
}

TEST(Config, RejectsUnknownNamesAndBadValues) {
  Config c = Config::FromEnvironment();
  Status unknown = c.Set("chunk_sise", "1M");
  EXPECT_EQ(unknown.code(), StatusCode::kInvalidArgument);
  // The message names the settings there are (no command that does not exist).
  EXPECT_NE(unknown.message().find("unknown setting 'chunk_sise'"), std::string::npos);
  EXPECT_NE(unknown.message().find("chunk_size"), std::string::npos);
  EXPECT_NE(unknown.message().find("max_lease_bytes_per_peer"), std::string::npos);
  ASSERT_TRUE(c.Set("chunk_size", "12Q").ok());
  Status s = c.GetBytes("chunk_size").status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown size suffix"), std::string::npos);
  ASSERT_TRUE(c.Set("require_rdma", "maybe").ok());
  EXPECT_FALSE(c.GetBool("require_rdma").ok());
}

}  // namespace
}  // namespace rayfabric

TEST(LogLimiter, WritesABurstPerWindowThenSaysHowManyWereHeldBack) {
  rayfabric::LogLimiter limiter(3, std::chrono::milliseconds(200));
  uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.Allow(&suppressed));
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 1000; ++i) EXPECT_FALSE(limiter.Allow(&suppressed));  // a flood
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 1000u);  // the next line written says so
  ASSERT_TRUE(limiter.Allow(&suppressed));
  EXPECT_EQ(suppressed, 0u);
}
