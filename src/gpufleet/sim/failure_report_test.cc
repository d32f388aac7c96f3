// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/failure_report.h"

#include <sstream>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/testing/charts.h"
#include "gpufleet/sim/testing/text.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using testing::ChartsIn;
using testing::CountOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Four hours of a 100-GPU fleet with 2 bad GPUs; with quarantine the failures stop after the
// second hour, when both were found.
std::vector<FailureSimResult> Pair() {
  FailureSimResult with;
  with.quarantine = true;
  with.seed = 3;
  with.total_gpus = 100;
  with.duration_seconds = 4 * 3600;
  with.bad_gpus = {BadGpu{"g1", 60, 3, 2.0, 3600, 3600}, BadGpu{"g2", 80, 2, 2.0, 5400, 5400}};
  with.bad_found = 2;
  with.found_90_seconds = 5400;
  with.hardware_failures = 6;
  with.bad_gpu_failures = 5;
  with.hours = {{10, 3, 0, 90}, {10, 3, 1, 90}, {10, 0, 0, 90}, {10, 0, 0, 90}};
  with.flagged = {
      FlaggedDevice{reliability::Device{reliability::DeviceKind::kGpu, "g1"}, 3600, 1, 0, true}};
  with.concentration = {1, 1, 0.01, 6, 3, 0.5, 0.2, 2.8};
  with.failed_runs_by_gpu_rank = {3, 2, 1};
  with.concentration_curve = {{0.01, 0.5}, {0.02, 0.8}};
  with.large_job = {8, 4, 3.5, 0.25, 0.2, 0.05, 0, 2, 1, 0};
  with.audit_log.push_back(reliability::AuditEntry{
      1, MonoTime{3600'000'000'000}, reliability::AuditAction::kQuarantined,
      reliability::Device{reliability::DeviceKind::kGpu, "g1"}, "leaf-0",
      reliability::QuarantineSource::kAttribution, reliability::DrainMode::kNow, "attribution",
      "3 failures <evidence>", 1, 1});
  FailureSimResult without = with;
  without.quarantine = false;
  without.hours = {{10, 3, 0, 90}, {10, 3, 0, 90}, {10, 2, 0, 90}, {10, 3, 0, 90}};
  without.audit_log.clear();
  without.large_job.useful_hours = 3.0;
  return {with, without};
}

TEST(ConcentrationSentence, SaysWhoWasInvolvedAndWhatItCost) {
  const reliability::FailureConcentration c{97, 97, 0.0097, 1000, 461, 0.461, 49.4, 411.6};
  EXPECT_EQ(ConcentrationSentence(c),
            "these 97 GPUs (0.97% of the fleet) were involved in 46.1% of failed jobs; "
            "quarantining them would have avoided 412 failures");
}

TEST(CompareFailureRuns, ComparesTheHoursAfterDetection) {
  const std::vector<FailureSimResult> runs = Pair();
  const FailureComparison c = CompareFailureRuns(runs[0], runs[1]);
  EXPECT_EQ(c.detection_hour, 2);  // 5,400 s rounded up to whole hours
  EXPECT_EQ(c.with_quarantine_after.failed_runs, 0);
  EXPECT_EQ(c.without_quarantine_after.failed_runs, 5);
  EXPECT_EQ(c.with_quarantine_before.failed_runs, 6);
  EXPECT_DOUBLE_EQ(c.rate_ratio, 0.0);
  EXPECT_DOUBLE_EQ(c.failed_share_ratio, 0.0);
  EXPECT_EQ(c.with_quarantine_second_half.from_hour, 2);
  EXPECT_EQ(c.without_quarantine_second_half.failed_runs, 5);
  EXPECT_DOUBLE_EQ(c.second_half_rate_ratio, 0.0);
}

TEST(WriteFailureJson, WritesRunsAndTheComparisonOnOneLine) {
  const std::vector<FailureSimResult> runs = Pair();
  std::ostringstream pair;
  WriteFailureJson(runs, pair);
  EXPECT_EQ(CountOf(pair.str(), "\n"), 1);
  EXPECT_THAT(pair.str(), HasSubstr("{\"mode\":\"failures\",\"runs\":[{\"quarantine\":true"));
  EXPECT_THAT(pair.str(), HasSubstr("\"found_90_hours\":1.5"));
  EXPECT_THAT(pair.str(), HasSubstr("\"comparison\":{\"detection_hour\":2"));
  EXPECT_THAT(pair.str(), HasSubstr("\"ettr\":0.875"));
  std::ostringstream single;
  WriteFailureJson({runs[1]}, single);
  EXPECT_THAT(single.str(), Not(HasSubstr("comparison")));
}

TEST(WriteFailureReport, WritesAStandalonePageWithTheSectionAndCharts) {
  const std::vector<FailureSimResult> runs = Pair();
  std::ostringstream page;
  ASSERT_OK(WriteFailureReport(runs, "failures <test>", page));
  const std::string html = page.str();
  EXPECT_THAT(html, HasSubstr("<title>failures &lt;test&gt;</title>"));
  EXPECT_THAT(html, HasSubstr("these 1 GPUs (1.00% of the fleet) were involved in 50.0% of "
                              "failed jobs; quarantining them would have avoided 3 failures"));
  const std::vector<nlohmann::json> charts = ChartsIn(html);
  ASSERT_EQ(charts.size(), 4U);
  EXPECT_EQ(charts[0].at("title"), "Failed runs by GPU rank");
  EXPECT_THAT(html, HasSubstr("3 failures &lt;evidence&gt;"));
  EXPECT_THAT(html, Not(HasSubstr("3 failures <evidence>")));
  EXPECT_THAT(html, HasSubstr("new uPlot("));
  std::ostringstream again;
  ASSERT_OK(WriteFailureReport(runs, "failures <test>", again));
  EXPECT_EQ(again.str(), html);
  std::ostringstream empty;
  EXPECT_THAT(WriteFailureReport({}, "x", empty), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::sim
