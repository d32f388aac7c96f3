// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/utilization_scenarios.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/testing/charts.h"
#include "gpufleet/sim/testing/trace_jobs.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::sim::testing::MakeTraceJob;
using ::gpufleet::sim::testing::SixteenGpus;

using ::gpufleet::sim::testing::ChartsIn;
using ::gpufleet::sim::testing::ChartsWithSeries;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

// Forty jobs of 1 to 8 GPUs, one every 60 s, 200 to 1,100 s long: about 80 % of 16 GPUs.
Trace ScenarioTrace() {
  Trace trace;
  for (int i = 0; i < 40; ++i) {
    trace.jobs.push_back(
        MakeTraceJob("j" + std::to_string(i), i * 60, 200 + (i * 373) % 900, 1 << ((i * 7) % 4)));
  }
  return trace;
}

std::vector<std::string> Ids(const Trace& trace) {
  std::vector<std::string> ids;
  for (const TraceJob& job : trace.jobs) {
    ids.push_back(job.job.id.value());
  }
  return ids;
}

TEST(SliceTrace, KeepsTheWindowAndMovesItToZero) {
  Trace trace;
  trace.jobs = {MakeTraceJob("a", 0, 10, 1), MakeTraceJob("b", 100, 10, 1),
                MakeTraceJob("c", 199, 10, 1), MakeTraceJob("d", 200, 10, 1)};
  const Trace slice = SliceTrace(trace, 100, 100);
  EXPECT_THAT(Ids(slice), ::testing::ElementsAre("b", "c"));
  EXPECT_EQ(slice.jobs[0].submit_seconds, 0);
  EXPECT_EQ(slice.jobs[1].submit_seconds, 99);
  EXPECT_EQ(SliceTrace(trace, 100, 0).jobs.size(), 3U);
}

TEST(FairnessWorkloads, DealsJobsAlternatelyAndCopiesTheFloodersInABurst) {
  Trace trace;
  trace.jobs = {MakeTraceJob("a", 0, 10, 1), MakeTraceJob("b", 100, 10, 1),
                MakeTraceJob("c", 200, 10, 1), MakeTraceJob("d", 399, 10, 1)};
  FairnessOptions options;
  options.flood_copies = 2;
  options.flood_burst_seconds = 40;
  const FairnessWorkloads workloads = MakeFairnessWorkloads(trace, options).value();
  EXPECT_THAT(Ids(workloads.victim_alone), ::testing::ElementsAre("b", "d"));
  EXPECT_EQ(workloads.victim_alone.jobs[0].job.queue, QueueId("team-b"));
  // a and c (team-a) twice each, squeezed into the first 40 s: c's 200 s becomes 20 s.
  EXPECT_THAT(Ids(workloads.flooded), ::testing::ElementsAre("a", "a~2", "c", "c~2", "b", "d"));
  EXPECT_EQ(workloads.flooded.jobs[2].submit_seconds, 20);
  EXPECT_EQ(workloads.flooded.jobs[2].job.queue, QueueId("team-a"));
  EXPECT_EQ(workloads.flooded.jobs[5].submit_seconds, 399);

  options.flood_copies = 0;
  EXPECT_THAT(MakeFairnessWorkloads(trace, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("flood_copies: 0")));
  options.flood_copies = 1;
  options.team_limit_share = 0.4;
  EXPECT_THAT(MakeFairnessWorkloads(trace, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("team_limit_share: 0.4")));
  options.team_limit_share = 1.0;
  options.victim = "team-a";
  EXPECT_THAT(MakeFairnessWorkloads(trace, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("two different")));
}

TEST(FairnessScenario, FairShareShieldsTheVictimBetterThanFifo) {
  const GpuCatalog catalog = GpuCatalog::Default();
  FairnessOptions options;
  options.flood_copies = 4;
  options.flood_burst_seconds = 60;
  options.replay.sample_seconds = 300;
  auto result = RunFairnessScenario(SixteenGpus(catalog), ScenarioTrace(), catalog, options, 2);
  ASSERT_OK(result);
  ASSERT_EQ(result->comparisons.size(), 3U);
  EXPECT_EQ(result->victim_jobs, 20);
  EXPECT_EQ(result->flooder_jobs, 80);
  const FairnessComparison& fifo = result->comparisons[0];
  const FairnessComparison& no_preempt = result->comparisons[1];
  const FairnessComparison& fair = result->comparisons[2];
  EXPECT_EQ(fifo.policy, "fifo");
  EXPECT_EQ(no_preempt.policy, "fair-share-no-preempt");
  EXPECT_EQ(fair.policy, "fair-share");
  // Reclaiming the guarantee from the flooder shields the victim further.
  EXPECT_EQ(no_preempt.flooded.preemptions, 0);
  EXPECT_GT(fair.flooded.preemptions, 0);
  EXPECT_LE(fair.victim_flooded_mean_delay, no_preempt.victim_flooded_mean_delay);
  // Alone, the victim's queue is the same under both policies.
  EXPECT_DOUBLE_EQ(fifo.victim_alone_mean_delay, fair.victim_alone_mean_delay);
  EXPECT_GT(fifo.victim_flooded_mean_delay, 2 * fair.victim_flooded_mean_delay);
  EXPECT_LT(fair.victim_flooded_mean_delay, fair.flooder_mean_delay);

  std::ostringstream summary;
  PrintFairnessSummary(*result, summary);
  EXPECT_THAT(summary.str(), HasSubstr("fair-share-no-preempt"));
  EXPECT_THAT(summary.str(), HasSubstr("preemptions"));
  std::ostringstream page;
  ASSERT_OK(WriteFairnessReport(*result, "fairness", page));
  EXPECT_GT(ChartsWithSeries(ChartsIn(page.str()), "fair-share flooded"), 0);
  EXPECT_THAT(WriteFairnessReport(FairnessResult{}, "x", page),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(BackfillScenario, EasyBackfillWaitsLessThanStrictFifoAndKeepsEveryReservation) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Trace trace = ScenarioTrace();
  // Whole-cluster jobs now and then, the ones strict FIFO queues everything behind.
  for (int i = 0; i < 4; ++i) {
    trace.jobs.push_back(MakeTraceJob("wide" + std::to_string(i), 300 + i * 600, 400, 16));
  }
  std::stable_sort(trace.jobs.begin(), trace.jobs.end(), [](const TraceJob& a, const TraceJob& b) {
    return a.submit_seconds < b.submit_seconds;
  });
  BackfillScenarioOptions options;
  options.replay.sample_seconds = 300;
  auto result = RunBackfillScenario(SixteenGpus(catalog), trace, catalog, options, 2);
  ASSERT_OK(result);
  ASSERT_EQ(result->runs.size(), 3U);
  const ReplayResult& strict = result->runs[0];
  const ReplayResult& easy = result->runs[2];
  EXPECT_EQ(strict.queue_policy, "strict-fifo");
  EXPECT_EQ(easy.queue_policy, "easy-backfill");
  EXPECT_EQ(easy.jobs_finished, 44);
  EXPECT_LT(easy.queueing_delay.mean, strict.queueing_delay.mean);
  EXPECT_GT(easy.reservations, 0);
  EXPECT_EQ(easy.reservations_delayed, 0);
  EXPECT_EQ(easy.jobs_timed_out, 0);

  std::ostringstream summary;
  PrintBackfillSummary(*result, summary);
  EXPECT_THAT(summary.str(), HasSubstr("easy-backfill"));
  std::ostringstream page;
  ASSERT_OK(WriteBackfillReport(*result, "backfill", page));
  EXPECT_GT(ChartsWithSeries(ChartsIn(page.str()), "easy-backfill"), 0);
  EXPECT_THAT(WriteBackfillReport(BackfillScenarioResult{}, "x", page),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(RuntimeEstimates, ExactModelKeepsTheRunTimes) {
  const Trace trace = ScenarioTrace();
  auto estimated = WithRuntimeEstimates(trace, EstimateModel{}, 7);
  ASSERT_OK(estimated);
  for (const TraceJob& job : estimated->jobs) {
    EXPECT_EQ(job.job.runtime_estimate, std::chrono::seconds(job.duration_seconds));
  }
}

TEST(RuntimeEstimates, OverAndUnderestimatesStayInTheirRanges) {
  Trace trace;
  for (int i = 0; i < 2000; ++i) {
    trace.jobs.push_back(MakeTraceJob("j" + std::to_string(i), i, 1000, 1));
  }
  const EstimateModel model{.overestimate_factor = 4, .underestimate_share = 0.1};
  auto estimated = WithRuntimeEstimates(trace, model, 7);
  ASSERT_OK(estimated);
  int under = 0;
  int64_t largest = 0;
  for (const TraceJob& job : estimated->jobs) {
    const int64_t estimate =
        std::chrono::duration_cast<std::chrono::seconds>(job.job.runtime_estimate).count();
    EXPECT_GE(estimate, 500);
    EXPECT_LE(estimate, 4000);
    under += estimate < job.duration_seconds ? 1 : 0;
    largest = std::max(largest, estimate);
  }
  EXPECT_NEAR(under, 200, 50);
  EXPECT_GT(largest, 3800);
  // The same seed draws the same estimates.
  auto again = WithRuntimeEstimates(trace, model, 7);
  ASSERT_OK(again);
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    EXPECT_EQ(again->jobs[i].job.runtime_estimate, estimated->jobs[i].job.runtime_estimate);
  }
}

TEST(RuntimeEstimates, AnUnderestimateOfAOneSecondJobIsNotZero) {
  Trace trace;
  trace.jobs.push_back(MakeTraceJob("short", 0, 1, 1));
  auto estimated = WithRuntimeEstimates(trace, {.underestimate_share = 1}, 7);
  ASSERT_OK(estimated);
  EXPECT_EQ(estimated->jobs[0].job.runtime_estimate, std::chrono::seconds(1));
}

TEST(RuntimeEstimates, RejectsModelsOutOfRange) {
  const Trace trace = ScenarioTrace();
  EXPECT_THAT(WithRuntimeEstimates(trace, {.overestimate_factor = 0.5}, 7),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overestimate_factor: 0.5")));
  EXPECT_THAT(WithRuntimeEstimates(trace, {.underestimate_share = 1.5}, 7),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("underestimate_share: 1.5")));
}

TEST(BackfillScenario, UnderestimatedJobsAreKilledAtTheirLimitAndReservationsHold) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Trace trace = ScenarioTrace();
  for (int i = 0; i < 4; ++i) {
    trace.jobs.push_back(MakeTraceJob("wide" + std::to_string(i), 300 + i * 600, 400, 16));
  }
  std::stable_sort(trace.jobs.begin(), trace.jobs.end(), [](const TraceJob& a, const TraceJob& b) {
    return a.submit_seconds < b.submit_seconds;
  });
  BackfillScenarioOptions options;
  options.policies = {"easy-backfill"};
  options.estimates = {.overestimate_factor = 3, .underestimate_share = 0.2};
  auto result = RunBackfillScenario(SixteenGpus(catalog), trace, catalog, options, 1);
  ASSERT_OK(result);
  const ReplayResult& easy = result->runs[0];
  EXPECT_GT(easy.jobs_timed_out, 0);
  EXPECT_EQ(easy.jobs_finished + easy.jobs_timed_out, easy.jobs_total);
  EXPECT_EQ(easy.reservations_delayed, 0);
  std::ostringstream summary;
  PrintBackfillSummary(*result, summary);
  EXPECT_THAT(summary.str(), HasSubstr("x U[1, 3], 20% of the jobs underestimated"));
}

}  // namespace
}  // namespace gpufleet::sim
