// Counters: the status's named values, one row per count, and the wire's error codes.
#include "agent/counters.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <thread>
#include <vector>

#include "agent/wire.h"

namespace rayfabric::agent {
namespace {

TEST(Counters, EveryCountHasOneNamedDocumentedRow) {
  std::set<std::string> names;
  for (size_t i = 0; i < kNumCounts; ++i) {
    const CountInfo& row = InfoOf(static_cast<Count>(i));
    EXPECT_EQ(static_cast<size_t>(row.count), i);
    EXPECT_TRUE(names.insert(row.name).second) << row.name << " named twice";
    EXPECT_FALSE(std::string(row.doc).empty()) << row.name;
  }
  EXPECT_EQ(names.size(), kNumCounts);
}

TEST(Counters, StatusNamesEveryValueInTableOrder) {
  Counters counters;
  counters.Add(Count::kObjectsPulled);
  counters.Add(Count::kBytesPulled, 1 << 20);
  CountValues values = counters.Snapshot();
  values[static_cast<size_t>(Count::kLeasesActive)] = 7;  // an owner's gauge, set at status time
  v1::StatusReply reply;
  Counters::Into(values, reply);
  ASSERT_EQ(static_cast<size_t>(reply.counters_size()), kNumCounts);
  for (size_t i = 0; i < kNumCounts; ++i) {
    EXPECT_EQ(reply.counters(static_cast<int>(i)).name(), InfoOf(static_cast<Count>(i)).name);
  }
  const auto value_of = [&reply](const std::string& name) -> const v1::Counter* {
    for (const v1::Counter& c : reply.counters()) {
      if (c.name() == name) return &c;
    }
    return nullptr;
  };
  ASSERT_NE(value_of("objects_pulled"), nullptr);
  EXPECT_EQ(value_of("objects_pulled")->value(), 1u);
  EXPECT_EQ(value_of("bytes_pulled")->value(), 1u << 20);
  EXPECT_EQ(value_of("leases_active")->value(), 7u);
  EXPECT_TRUE(value_of("leases_active")->gauge());
  EXPECT_FALSE(value_of("objects_pulled")->gauge());
  EXPECT_EQ(value_of("pulls_failed")->value(), 0u);
}

TEST(Counters, ConcurrentAddsAreAllCounted) {
  Counters counters;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&counters] {
      for (int i = 0; i < 10000; ++i) counters.Add(Count::kLeasesGranted);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(counters.Get(Count::kLeasesGranted), 40000u);
}

TEST(Wire, ErrorCodesRoundTripAndUnknownOnesAreProtocolErrors) {
  for (int code = 1; code <= v1::ErrorCode_MAX; ++code) {
    const StatusCode status = FromErrorCode(code);
    EXPECT_EQ(static_cast<int>(ToErrorCode(status)), code);
    EXPECT_EQ(v1::ErrorCode_Name(ToErrorCode(status)).substr(0, 11), "ERROR_CODE_");
  }
  EXPECT_EQ(FromErrorCode(0), StatusCode::kProtocolError);  // NONE where an error was due
  EXPECT_EQ(FromErrorCode(-1), StatusCode::kProtocolError);
  EXPECT_EQ(FromErrorCode(v1::ErrorCode_MAX + 1), StatusCode::kProtocolError);
}

}  // namespace
}  // namespace rayfabric::agent
