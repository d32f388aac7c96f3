// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/autoscale_sim.h"

#include <algorithm>
#include <numeric>
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
using testing::ChartsWithSeries;
using testing::CountOf;
using ::testing::HasSubstr;

constexpr int64_t kDay = 86400;

// Two days in minute intervals: small enough for a unit test.
AutoscaleSimOptions TwoDays() {
  AutoscaleSimOptions options;
  options.duration_seconds = 2 * kDay;
  return options;
}

AutoscaleSimResult RunOk(const AutoscaleSimOptions& options) {
  Result<AutoscaleSimResult> result = RunAutoscaleSim(options);
  EXPECT_OK(result);
  return result.ok() ? std::move(result).value() : AutoscaleSimResult{};
}

std::string Json(const AutoscaleSimResult& result) {
  std::ostringstream out;
  WriteAutoscaleJson(result, out);
  return out.str();
}

std::string Report(const AutoscaleSimResult& result) {
  std::ostringstream out;
  EXPECT_OK(WriteAutoscaleReport(result, "autoscale <test>", out));
  return out.str();
}

// Every unit of work is served, dropped or still waiting at the end.
void ExpectWorkConserved(const std::vector<AutoscaleInterval>& run,
                         const AutoscaleRunSummary& summary) {
  ASSERT_FALSE(run.empty());
  EXPECT_EQ(summary.arrived, summary.served + summary.dropped + run.back().backlog);
  for (const AutoscaleInterval& interval : run) {
    EXPECT_LE(interval.served, interval.capacity);
    EXPECT_LE(interval.ready_replicas, interval.replicas);
  }
}

TEST(AutoscaleSimOptions, RejectsEachBadFieldByName) {
  struct Case {
    AutoscaleSimOptions options;
    const char* message;
  };
  auto with = [](auto change) {
    AutoscaleSimOptions options = TwoDays();
    change(options);
    return options;
  };
  const Case cases[] = {
      {with([](auto& o) { o.duration_seconds = 0; }), "duration_seconds: 0"},
      {with([](auto& o) { o.interval_seconds = 0; }), "interval_seconds: 0"},
      {with([](auto& o) { o.interval_seconds = 3 * kDay; }), "interval_seconds: 259200"},
      {with([](auto& o) { o.mean_load_gpu_milli = -1; }), "mean_load_gpu_milli: -1"},
      {with([](auto& o) { o.daily_amplitude = 1.5; }), "daily_amplitude: 1.5"},
      {with([](auto& o) { o.peak_hour = 25; }), "peak_hour: 25"},
      {with([](auto& o) { o.noise = -0.1; }), "noise: -0.1"},
      {with([](auto& o) { o.noise_correlation = 1; }), "noise_correlation: 1"},
      {with([](auto& o) { o.replica.gpu_milli = 0; }), "replica.gpu_milli: 0"},
      {with([](auto& o) { o.startup_seconds = -1; }), "startup_seconds: -1"},
      {with([](auto& o) { o.max_queue_seconds = -1; }), "max_queue_seconds: -1"},
      {with([](auto& o) { o.autoscaler.max_replicas = 1; }), "autoscaler.max_replicas: 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(c.options.Validate(), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
    EXPECT_THAT(RunAutoscaleSim(c.options), StatusIs(StatusCode::kInvalidArgument));
  }
  EXPECT_OK(TwoDays().Validate());
}

TEST(ParseReplicaShape, WholeFractionalAndMig) {
  const GpuCatalog catalog = GpuCatalog::Default();
  EXPECT_EQ(ParseReplicaShape("gpu", catalog, "H100-80GB")->gpu_milli, 1000);
  EXPECT_EQ(ParseReplicaShape("fraction:500", catalog, "H100-80GB")->gpu_milli, 500);
  Result<ReplicaShape> mig = ParseReplicaShape("mig:3g.40gb", catalog, "H100-80GB");
  ASSERT_OK(mig);
  EXPECT_EQ(mig->gpu_milli, 428);  // 3 of 7 compute slices
  EXPECT_EQ(mig->label, "MIG 3g.40gb on H100-80GB");
  EXPECT_THAT(ParseReplicaShape("fraction:0", catalog, "H100-80GB"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"fraction:0\"")));
  EXPECT_THAT(ParseReplicaShape("fraction:5x", catalog, "H100-80GB"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseReplicaShape("fraction:1001", catalog, "H100-80GB"),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseReplicaShape("mig:3g.45gb", catalog, "H100-80GB"),
              StatusIs(StatusCode::kNotFound, HasSubstr("\"3g.45gb\"")));
  EXPECT_THAT(ParseReplicaShape("mig:1g.10gb", catalog, "no-such-gpu"),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(ParseReplicaShape("tpu", catalog, "H100-80GB"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"tpu\"")));
}

TEST(DiurnalLoad, FollowsTheDayAndTheSeed) {
  AutoscaleSimOptions options = TwoDays();
  options.noise = 0;
  const std::vector<int64_t> smooth = DiurnalLoad(options);
  ASSERT_EQ(smooth.size(), 2880U);
  // The peak is in the interval around 14:00, the trough around 02:00.
  const auto peak = std::max_element(smooth.begin(), smooth.begin() + 1440) - smooth.begin();
  const auto trough = std::min_element(smooth.begin(), smooth.begin() + 1440) - smooth.begin();
  EXPECT_NEAR(static_cast<double>(peak), 14 * 60, 1);
  EXPECT_NEAR(static_cast<double>(trough), 2 * 60, 1);
  // Over whole days the cosine averages out: the mean is the configured mean.
  const double mean =
      static_cast<double>(std::accumulate(smooth.begin(), smooth.end(), int64_t{0})) / 2880 / 60;
  EXPECT_NEAR(mean, 16000, 1);
  EXPECT_NEAR(static_cast<double>(smooth[peak]) / 60, 16000 * 1.6, 1);

  options.noise = 0.1;
  EXPECT_EQ(DiurnalLoad(options), DiurnalLoad(options));
  AutoscaleSimOptions other = options;
  other.seed = 43;
  EXPECT_NE(DiurnalLoad(options), DiurnalLoad(other));
  for (int64_t work : DiurnalLoad(options)) {
    EXPECT_GE(work, 0);
  }
}

TEST(AutoscaleSim, ConstantLoadAtTargetMatchesStaticProvisioning) {
  AutoscaleSimOptions options = TwoDays();
  options.daily_amplitude = 0;
  options.noise = 0;
  options.mean_load_gpu_milli = 7000;  // 10 replicas at 70%
  const AutoscaleSimResult result = RunOk(options);
  EXPECT_EQ(result.static_replicas, 10);
  EXPECT_EQ(result.autoscaled_summary.min_replicas, 10);
  EXPECT_EQ(result.autoscaled_summary.max_replicas, 10);
  EXPECT_EQ(result.autoscaled_summary.scale_ups + result.autoscaled_summary.scale_downs, 0);
  EXPECT_DOUBLE_EQ(result.autoscaled_summary.gpu_hours, 10 * 48.0);
  EXPECT_DOUBLE_EQ(result.static_summary.gpu_hours, 10 * 48.0);
  EXPECT_EQ(result.autoscaled_summary.overload_intervals, 0);
  EXPECT_EQ(result.autoscaled_summary.dropped, 0);
  EXPECT_NEAR(result.autoscaled_summary.mean_utilization, 0.7, 1e-9);
}

TEST(AutoscaleSim, DiurnalLoadSavesGpuHoursAgainstStaticPeak) {
  const AutoscaleSimResult result = RunOk(TwoDays());
  const AutoscaleRunSummary& autoscaled = result.autoscaled_summary;
  const AutoscaleRunSummary& fixed = result.static_summary;
  // Static provisioning meets the target at the peak, so it is never above it.
  EXPECT_EQ(fixed.overload_intervals, 0);
  EXPECT_EQ(fixed.dropped, 0);
  EXPECT_EQ(fixed.min_replicas, result.static_replicas);
  EXPECT_LT(autoscaled.gpu_hours, 0.8 * fixed.gpu_hours);
  // A target-tracking controller hovers around its target: some intervals are above it, fewer
  // above the band where it acts.
  EXPECT_GT(autoscaled.overload_intervals, 0);
  EXPECT_LT(autoscaled.above_band_intervals, autoscaled.overload_intervals);
  EXPECT_GT(autoscaled.mean_utilization, fixed.mean_utilization);
  EXPECT_GT(autoscaled.scale_ups, 0);
  EXPECT_GT(autoscaled.scale_downs, 0);
  EXPECT_LT(autoscaled.max_replicas, result.options.autoscaler.max_replicas);
  EXPECT_EQ(autoscaled.arrived, fixed.arrived);
  ExpectWorkConserved(result.autoscaled, autoscaled);
  ExpectWorkConserved(result.static_peak, fixed);
  EXPECT_FALSE(result.first_decisions.empty());
}

TEST(AutoscaleSim, NewReplicasServeOnlyAfterTheStartUpDelay) {
  AutoscaleSimOptions options = TwoDays();
  options.startup_seconds = 180;
  const AutoscaleSimResult result = RunOk(options);
  const std::vector<AutoscaleInterval>& run = result.autoscaled;
  int checked = 0;
  for (size_t k = 3; k < run.size(); ++k) {
    SCOPED_TRACE(k);
    // Replicas added at the end of interval k - 1 are starting in k ...
    if (run[k].replicas > run[k - 1].replicas) {
      EXPECT_LE(run[k].ready_replicas, run[k - 1].replicas);
      ++checked;
    }
    // ... and those added three or more intervals ago (180 s) are ready.
    int added_recently = 0;
    for (size_t j = k - 2; j <= k; ++j) {
      added_recently += std::max(0, run[j].replicas - run[j - 1].replicas);
    }
    EXPECT_LE(run[k].replicas - run[k].ready_replicas, added_recently);
  }
  EXPECT_GT(checked, 0);

  options.startup_seconds = 0;
  for (const AutoscaleInterval& interval : RunOk(options).autoscaled) {
    EXPECT_EQ(interval.ready_replicas, interval.replicas);
  }
}

TEST(AutoscaleSim, TooFewReplicasQueueAndDropWork) {
  AutoscaleSimOptions options = TwoDays();
  options.autoscaler.max_replicas = 12;  // the peak needs about 26 GPUs of work
  const AutoscaleSimResult result = RunOk(options);
  const AutoscaleRunSummary& s = result.autoscaled_summary;
  EXPECT_EQ(s.max_replicas, 12);
  EXPECT_GT(s.dropped, 0);
  EXPECT_GT(s.delayed, 0);
  EXPECT_GT(s.saturated_intervals, 0);
  EXPECT_GT(s.overload_intervals, s.saturated_intervals);
  EXPECT_GT(s.mean_wait_seconds, 0);
  ExpectWorkConserved(result.autoscaled, s);

  // Without a queue, work not served in its own interval is dropped at once.
  options.max_queue_seconds = 0;
  const AutoscaleSimResult no_queue = RunOk(options);
  EXPECT_EQ(no_queue.autoscaled_summary.delayed, 0);
  EXPECT_GT(no_queue.autoscaled_summary.dropped, s.dropped);
  ExpectWorkConserved(no_queue.autoscaled, no_queue.autoscaled_summary);
}

TEST(AutoscaleSim, FractionalReplicasNeedTwiceTheCountForTheSameGpus) {
  AutoscaleSimOptions whole = TwoDays();
  whole.noise = 0;
  AutoscaleSimOptions half = whole;
  half.replica = ReplicaShape{.gpu_milli = 500, .label = "500 milli-GPU"};
  half.autoscaler.max_replicas = 200;
  const AutoscaleSimResult a = RunOk(whole);
  const AutoscaleSimResult b = RunOk(half);
  EXPECT_NEAR(b.static_replicas, 2 * a.static_replicas, 1);
  // Finer replicas follow the load more closely: no more GPU-hours than whole GPUs.
  EXPECT_LE(b.autoscaled_summary.gpu_hours, a.autoscaled_summary.gpu_hours * 1.01);
}

TEST(AutoscaleSim, SameOptionsGiveTheSameBytes) {
  const AutoscaleSimResult first = RunOk(TwoDays());
  const AutoscaleSimResult second = RunOk(TwoDays());
  EXPECT_EQ(Json(first), Json(second));
  EXPECT_EQ(Report(first), Report(second));
  AutoscaleSimOptions other = TwoDays();
  other.seed = 7;
  EXPECT_NE(Json(first), Json(RunOk(other)));
}

TEST(AutoscaleSim, OutputsCarryTheFigures) {
  const AutoscaleSimResult result = RunOk(TwoDays());
  const std::string json = Json(result);
  EXPECT_THAT(json, HasSubstr("\"mode\":\"autoscale\""));
  EXPECT_THAT(json, HasSubstr("\"static_replicas\":" + std::to_string(result.static_replicas)));
  EXPECT_THAT(json, HasSubstr("\"overload_intervals\":"));
  EXPECT_EQ(CountOf(json, "\n"), 1);

  std::ostringstream summary;
  PrintAutoscaleSummary(result, summary);
  EXPECT_THAT(summary.str(), HasSubstr("intervals above 70% (target)"));
  EXPECT_THAT(summary.str(), HasSubstr("intervals above 77% (band)"));
  EXPECT_THAT(summary.str(), HasSubstr("GPU-hours"));

  const std::string report = Report(result);
  EXPECT_THAT(report, HasSubstr("<title>autoscale &lt;test&gt;</title>"));
  const std::vector<nlohmann::json> charts = ChartsIn(report);
  ASSERT_EQ(charts.size(), 4U);
  EXPECT_GT(ChartsWithSeries(charts, "replicas (autoscaled)"), 0);
  EXPECT_GT(ChartsWithSeries(charts, "static peak replicas"), 0);
  EXPECT_EQ(charts[1].at("title"), "Replicas and load on day 1");
  EXPECT_THAT(report, HasSubstr("new uPlot("));

  std::ostringstream broken;
  broken.setstate(std::ios::badbit);
  EXPECT_THAT(WriteAutoscaleReport(result, "t", broken), StatusIs(StatusCode::kUnavailable));
}

}  // namespace
}  // namespace gpufleet::sim
