// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/fill_report.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpufleet::sim {
namespace {

using ::testing::HasSubstr;

FillResult MakeRun(const std::string& policy, uint64_t seed, double allocation_at_100) {
  FillResult result;
  result.policy = policy;
  result.seed = seed;
  result.total_gpus = 1000;
  result.points.push_back({90, 89.0, 5.0, 50.0});
  result.points.push_back({100, allocation_at_100, 4.0, 40.0});
  return result;
}

TEST(FillReport, SummarizesMedianAndMeanPerPolicy) {
  const std::vector<FillResult> results = {MakeRun("fgd", 1, 95.0), MakeRun("fgd", 2, 96.0),
                                           MakeRun("fgd", 3, 90.0), MakeRun("random", 1, 80.0)};
  const std::vector<FillPolicySummary> summaries = SummarizeFill(results);
  ASSERT_EQ(summaries.size(), 2U);
  EXPECT_EQ(summaries[0].policy, "fgd");
  EXPECT_EQ(summaries[0].seeds, 3);
  EXPECT_DOUBLE_EQ(summaries[0].median_unallocated_gpus_at_100, 50.0);  // 5 % of 1000
  EXPECT_DOUBLE_EQ(summaries[0].mean_allocation_at_100, 281.0 / 3.0);
  EXPECT_DOUBLE_EQ(summaries[0].mean_fragmentation_rate_at_90, 50.0);
  EXPECT_DOUBLE_EQ(summaries[1].median_unallocated_gpus_at_100, 200.0);
  std::ostringstream table;
  PrintFillSummary(summaries, table);
  EXPECT_THAT(table.str(), HasSubstr("random"));
  std::ostringstream series;
  WriteFillSeries(results, series);
  EXPECT_THAT(series.str(), HasSubstr("fgd,2,100,96.0000,4.0000,40.0000\n"));
}

TEST(FillReport, GapToTheBoundIsPerSeedThenMedian) {
  const std::vector<FillResult> results = {MakeRun("fgd", 1, 95.0), MakeRun("fgd", 2, 96.0),
                                           MakeRun("fgd", 3, 90.0), MakeRun("random", 4, 80.0)};
  // fgd leaves 50, 40 and 100 GPUs; the bounds 30, 35, 20 give gaps 20, 5, 80: median 20.
  const FillBoundsBySeed bounds = {{1, 30.0}, {2, 35.0}, {3, 20.0}};
  const std::vector<FillPolicySummary> summaries = SummarizeFill(results, bounds);
  ASSERT_EQ(summaries.size(), 2U);
  ASSERT_TRUE(summaries[0].median_gap_to_bound.has_value());
  EXPECT_DOUBLE_EQ(*summaries[0].median_gap_to_bound, 20.0);
  EXPECT_FALSE(summaries[1].median_gap_to_bound.has_value());  // no bound for seed 4
  std::ostringstream table;
  PrintFillSummary(summaries, table);
  EXPECT_THAT(table.str(), HasSubstr("gap@100"));
  EXPECT_THAT(table.str(), HasSubstr("       20.0\n"));
  std::ostringstream plain;
  PrintFillSummary(SummarizeFill(results), plain);
  EXPECT_THAT(plain.str(), ::testing::Not(HasSubstr("gap@100")));
}

}  // namespace
}  // namespace gpufleet::sim
