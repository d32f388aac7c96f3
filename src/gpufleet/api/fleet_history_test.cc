// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/fleet_history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::api {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

// A sample as the history keeps it: one, its peaks its figures.
FleetSample At(int64_t unix_ms, int64_t allocated_milli = 0) {
  return {.unix_ms = unix_ms,
          .gpus = 8,
          .allocated_milli = allocated_milli,
          .peak_allocated_milli = allocated_milli};
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

// Past the samples as taken, the oldest kCoarseEvery become one coarse row of their means and
// peaks, so the history reaches back as far as the coarse capacity allows.
TEST(FleetHistoryTest, OldSamplesFoldIntoCoarseRowsWithMeansAndPeaks) {
  constexpr int64_t kEvery = FleetHistory::kCoarseEvery;
  FleetHistory history(10, 2);
  // 4 coarse rows' worth and 10 more: busy 0..kEvery-1 in each block, allocated 8000 once.
  for (int64_t t = 0; t < 4 * kEvery + 10; ++t) {
    history.Add({.unix_ms = t * 1000,
                 .gpus = 8,
                 .allocated_milli = t % kEvery == 5 ? 8000 : 0,
                 .busy_milli = t % kEvery});
  }
  EXPECT_EQ(history.size(), 10u);
  ASSERT_EQ(history.coarse_size(), 2u);  // the two oldest blocks are gone
  const std::vector<FleetSample> all = history.Since(0);
  ASSERT_EQ(all.size(), 12u);
  const FleetSample& row = all[0];
  EXPECT_EQ(row.unix_ms, 2 * kEvery * 1000);
  EXPECT_EQ(row.samples, kEvery);
  EXPECT_EQ(row.busy_milli, (kEvery - 1 + 1) / 2);  // the mean of 0..kEvery-1, rounded
  EXPECT_EQ(row.peak_busy_milli, kEvery - 1);
  EXPECT_EQ(row.allocated_milli, (8000 + kEvery / 2) / kEvery);
  EXPECT_EQ(row.peak_allocated_milli, 8000);
  EXPECT_EQ(all[2].unix_ms, 4 * kEvery * 1000);  // then the samples as taken
  EXPECT_EQ(all[2].samples, 1);
  // A coarse row is in a window that its span reaches into.
  EXPECT_EQ(history.Since(3 * kEvery * 1000 + 1).size(), 11u);
  // Without a coarse capacity the oldest are dropped, as before.
  FleetHistory plain(10);
  for (int64_t t = 0; t < 4 * kEvery; ++t) {
    plain.Add(At(t * 1000));
  }
  EXPECT_EQ(plain.Since(0).size(), 10u);
}

TEST(FleetHistoryTest, CoarseRowsRoundTripAndOldDocumentsStillRead) {
  FleetHistory history(3, 5);
  for (int64_t t = 0; t < 3 * static_cast<int64_t>(FleetHistory::kCoarseEvery); ++t) {
    history.Add({.unix_ms = t, .gpus = 4, .busy_milli = t});
  }
  ASSERT_GT(history.coarse_size(), 0u);
  Result<FleetHistory> same = FleetHistory::FromDocument(history.ToDocument(), 3, 5);
  ASSERT_OK(same);
  EXPECT_EQ(same->Since(0), history.Since(0));
  // A document written before the coarse rows: samples as taken, peaks their figures.
  Result<FleetHistory> old =
      FleetHistory::FromDocument(R"({"samples": [[1,8,2000,1000,0,1]]})", 3, 5);
  ASSERT_OK(old);
  ASSERT_EQ(old->Since(0).size(), 1u);
  EXPECT_EQ(old->Since(0)[0].peak_busy_milli, 1000);
  EXPECT_EQ(old->Since(0)[0].samples, 1);
  // A coarse row standing for no sample, and one of the wrong width, are refused by name.
  EXPECT_THAT(
      FleetHistory::FromDocument(R"({"coarse": [[1,8,0,0,0,0,0,0,0]], "samples": []})", 3, 5)
          .status()
          .message(),
      HasSubstr("coarse[0] stands for 0 samples"));
  EXPECT_THAT(FleetHistory::FromDocument(R"({"coarse": [[1,8,0]], "samples": []})", 3, 5)
                  .status()
                  .message(),
              HasSubstr("coarse[0] is not 9"));
}

TEST(FleetHistoryTest, SamplesToJsonCarriesAnRfc3339Time) {
  const wire::Json json = FleetHistory::SamplesToJson({At(1796288177000, 1500)});
  ASSERT_EQ(json.size(), 1u);
  EXPECT_EQ(json[0]["at"], "2026-12-03T08:56:17Z");
  EXPECT_EQ(json[0]["allocated_milli"], 1500);
}

}  // namespace
}  // namespace gpufleet::api
