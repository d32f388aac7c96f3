// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/utilization_scenarios.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TraceJob Job(const std::string& id, int64_t submit, int64_t duration, int gpus) {
  TraceJob job;
  job.job.id = JobId(id);
  const int tasks = gpus > 8 ? gpus / 8 : 1;
  job.job.groups.push_back({"task", tasks, {{1000, 1024}, WholeGpus{gpus / tasks}}});
  job.job.runtime_estimate = std::chrono::seconds(duration);
  job.submit_seconds = submit;
  job.duration_seconds = duration;
  return job;
}

// 2 nodes x 8 GPUs.
Cluster SixteenGpus(const GpuCatalog& catalog) {
  return MakeSyntheticCluster({1, 1, 2, 8, "V100-32GB"}, catalog).value();
}

// Forty jobs of 1 to 8 GPUs, one every 60 s, 200 to 1,100 s long: about 80 % of 16 GPUs.
Trace SmallTrace() {
  Trace trace;
  for (int i = 0; i < 40; ++i) {
    trace.jobs.push_back(
        Job("j" + std::to_string(i), i * 60, 200 + (i * 373) % 900, 1 << ((i * 7) % 4)));
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
  trace.jobs = {Job("a", 0, 10, 1), Job("b", 100, 10, 1), Job("c", 199, 10, 1),
                Job("d", 200, 10, 1)};
  const Trace slice = SliceTrace(trace, 100, 100);
  EXPECT_THAT(Ids(slice), ::testing::ElementsAre("b", "c"));
  EXPECT_EQ(slice.jobs[0].submit_seconds, 0);
  EXPECT_EQ(slice.jobs[1].submit_seconds, 99);
  EXPECT_EQ(SliceTrace(trace, 100, 0).jobs.size(), 3U);
}

TEST(FairnessWorkloads, DealsJobsAlternatelyAndCopiesTheFloodersInABurst) {
  Trace trace;
  trace.jobs = {Job("a", 0, 10, 1), Job("b", 100, 10, 1), Job("c", 200, 10, 1),
                Job("d", 399, 10, 1)};
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
  auto result = RunFairnessScenario(SixteenGpus(catalog), SmallTrace(), catalog, options, 2);
  ASSERT_OK(result);
  ASSERT_EQ(result->comparisons.size(), 2U);
  EXPECT_EQ(result->victim_jobs, 20);
  EXPECT_EQ(result->flooder_jobs, 80);
  const FairnessComparison& fifo = result->comparisons[0];
  const FairnessComparison& fair = result->comparisons[1];
  EXPECT_EQ(fifo.policy, "fifo");
  EXPECT_EQ(fair.policy, "fair-share");
  // Alone, the victim's queue is the same under both policies.
  EXPECT_DOUBLE_EQ(fifo.victim_alone_mean_delay, fair.victim_alone_mean_delay);
  EXPECT_GT(fifo.victim_flooded_mean_delay, 2 * fair.victim_flooded_mean_delay);
  EXPECT_LT(fair.victim_flooded_mean_delay, fair.flooder_mean_delay);

  std::ostringstream summary;
  PrintFairnessSummary(*result, summary);
  EXPECT_THAT(summary.str(), HasSubstr("fair-share"));
  std::ostringstream page;
  ASSERT_OK(WriteFairnessReport(*result, "fairness", page));
  EXPECT_THAT(page.str(), HasSubstr("<svg"));
  EXPECT_THAT(page.str(), HasSubstr("data-series=\"fair-share flooded\""));
  EXPECT_THAT(WriteFairnessReport(FairnessResult{}, "x", page),
              StatusIs(StatusCode::kInvalidArgument));
}

TEST(BackfillScenario, EasyBackfillWaitsLessThanStrictFifoAndKeepsEveryReservation) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Trace trace = SmallTrace();
  // Whole-cluster jobs now and then, the ones strict FIFO queues everything behind.
  for (int i = 0; i < 4; ++i) {
    trace.jobs.push_back(Job("wide" + std::to_string(i), 300 + i * 600, 400, 16));
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
  EXPECT_THAT(page.str(), HasSubstr("data-series=\"easy-backfill\""));
  EXPECT_THAT(WriteBackfillReport(BackfillScenarioResult{}, "x", page),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::sim
