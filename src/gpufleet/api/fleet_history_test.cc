// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/fleet_history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::api {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

FleetSample At(int64_t unix_ms, int64_t allocated_milli = 0) {
  return {.unix_ms = unix_ms, .gpus = 8, .allocated_milli = allocated_milli};
}

TEST(FleetHistoryTest, KeepsTheLastCapacitySamplesOldestFirst) {
  FleetHistory history(3);
  for (int64_t t = 1; t <= 5; ++t) {
    history.Add(At(t * 1000, t));
  }
  ASSERT_EQ(history.size(), 3u);
  const std::vector<FleetSample> all = history.Since(0);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].unix_ms, 3000);
  EXPECT_EQ(all[2].unix_ms, 5000);
  EXPECT_EQ(history.Since(4000).size(), 2u);
  EXPECT_EQ(history.Since(4001).size(), 1u);
  EXPECT_TRUE(history.Since(6000).empty());
}

TEST(FleetHistoryTest, AClockSteppedBackReplacesTheLaterSamples) {
  FleetHistory history(10);
  history.Add(At(1000));
  history.Add(At(3000));
  history.Add(At(5000));
  history.Add(At(3000, 7));  // the wall clock stepped back 2 s
  const std::vector<FleetSample> all = history.Since(0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[1], At(3000, 7));
}

TEST(FleetHistoryTest, DocumentRoundTripsAndIsCutToTheCapacity) {
  FleetHistory history(5);
  for (int64_t t = 1; t <= 5; ++t) {
    history.Add({.unix_ms = t,
                 .gpus = 256,
                 .allocated_milli = t * 1000,
                 .busy_milli = t * 500,
                 .pending_jobs = t,
                 .running_jobs = 2 * t});
  }
  Result<FleetHistory> same = FleetHistory::FromDocument(history.ToDocument(), 5);
  ASSERT_OK(same);
  EXPECT_EQ(same->Since(0), history.Since(0));
  Result<FleetHistory> smaller = FleetHistory::FromDocument(history.ToDocument(), 2);
  ASSERT_OK(smaller);
  ASSERT_EQ(smaller->size(), 2u);
  EXPECT_EQ(smaller->Since(0)[0].unix_ms, 4);
}

TEST(FleetHistoryTest, MalformedDocumentsAreRefusedNamingTheRow) {
  EXPECT_THAT(FleetHistory::FromDocument("not json", 5), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(FleetHistory::FromDocument(R"({"samples": 3})", 5),
              StatusIs(StatusCode::kInvalidArgument));
  const Result<FleetHistory> bad =
      FleetHistory::FromDocument(R"({"samples": [[1,2,3,4,5,6], [1,"x",3,4,5,6]]})", 5);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("samples[1]"));
}

TEST(FleetHistoryTest, SamplesToJsonCarriesAnRfc3339Time) {
  const wire::Json json = FleetHistory::SamplesToJson({At(1796288177000, 1500)});
  ASSERT_EQ(json.size(), 1u);
  EXPECT_EQ(json[0]["at"], "2026-12-03T08:56:17Z");
  EXPECT_EQ(json[0]["allocated_milli"], 1500);
}

}  // namespace
}  // namespace gpufleet::api
