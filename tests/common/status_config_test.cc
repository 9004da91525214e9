#include <gtest/gtest.h>

#include <cctype>
#include <set>
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

TEST(Config, ValidateNamesEveryBadSettingWhereItCameFromAndWhatItAllows) {
  Config c = Config::FromEnvironment();
  ASSERT_TRUE(c.Validate().ok()) << c.Validate() << " (the defaults must pass)";
  setenv("RAYFABRIC_EXPOSURE", "everything", 1);
  Config from_env = Config::FromEnvironment();
  unsetenv("RAYFABRIC_EXPOSURE");
  ASSERT_TRUE(from_env.Set("max_rails", "0").ok());
  ASSERT_TRUE(from_env.Set("max_registration", "64K").ok());
  ASSERT_TRUE(from_env.Set("max_lease_bytes_per_peer", "150%").ok());
  ASSERT_TRUE(from_env.Set("warm_store", "maybe").ok());
  ASSERT_TRUE(from_env.Set("op_timeout_ms", "soon").ok());
  Status s = from_env.Validate();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  for (const char* says : {
           "exposure='everything': use object, arena or auto (from env RAYFABRIC_EXPOSURE)",
           "max_rails='0' must be in [1, 64] (given as --max_rails)",
           "max_registration='64K' must be at least 1M",
           "max_lease_bytes_per_peer='150%': a share must be in (0%, 100%]",
           "warm_store='maybe' is not a boolean (true/false)",
           "op_timeout_ms='soon' is not an integer",
       }) {
    EXPECT_NE(s.message().find(says), std::string::npos) << "no '" << says << "' in: " << s;
  }
  // One error for them all, and only for them.
  EXPECT_EQ(s.message().find("chunk_size"), std::string::npos) << s;
}

TEST(Config, EveryRowHasATypeADefaultItAllowsAndADoc) {
  const Config defaults = Config::FromEnvironment();
  std::set<std::string> envs;
  for (const ConfigEntry& e : ConfigTable()) {
    EXPECT_TRUE(std::string(e.env) ==
                std::string("RAYFABRIC_") +
                    [&] {
                      std::string upper(e.name);
                      for (char& ch : upper)
                        ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
                      return upper;
                    }())
        << e.name << " is read from " << e.env;
    EXPECT_TRUE(envs.insert(e.env).second) << e.env << " twice";
    EXPECT_GT(std::string(e.doc).size(), 10u) << e.name;
    if (e.spec.type == SettingType::kChoice) {
      EXPECT_NE(e.spec.choices, nullptr) << e.name;
    }
  }
  EXPECT_TRUE(defaults.Validate().ok());
}

TEST(Config, SharesAreOfTheWholeGiven) {
  Config c = Config::FromEnvironment();
  ASSERT_TRUE(c.Set("max_lease_bytes_per_peer", "25%").ok());
  EXPECT_EQ(*c.GetBytesOrShare("max_lease_bytes_per_peer", 1000), 250u);
  ASSERT_TRUE(c.Set("max_lease_bytes_per_peer", "8M").ok());
  EXPECT_EQ(*c.GetBytesOrShare("max_lease_bytes_per_peer", 1000), 8u << 20);
  ASSERT_TRUE(c.Set("max_lease_bytes_per_peer", "0%").ok());
  EXPECT_FALSE(c.GetBytesOrShare("max_lease_bytes_per_peer", 1000).ok());
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
