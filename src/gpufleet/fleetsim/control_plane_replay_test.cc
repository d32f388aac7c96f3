// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/control_plane_replay.h"

#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/replay.h"
#include "gpufleet/sim/sim_report.h"

namespace gpufleet::fleetsim {
namespace {

using ::gpufleet::testing::StatusIs;

// `tasks` tasks of `gpus_per_task` whole GPUs, 1 CPU and 1 GiB each, arriving at `submit` and
// running `duration` seconds, with that run time as its estimate.
sim::TraceJob ReplayTraceJob(int64_t submit, int64_t duration, int tasks, int gpus_per_task) {
  sim::TraceJob job;
  job.job.groups.push_back({"task", tasks, {{1000, 1024}, WholeGpus{gpus_per_task}}});
  job.job.runtime_estimate = std::chrono::seconds(duration);
  job.submit_seconds = submit;
  job.duration_seconds = duration;
  return job;
}

// Two nodes of 4 GPUs. j0 and j1 fill them; j2 waits for j1's end; j3, a gang of both nodes,
// waits behind it; j4 fits beside j2; j5 fits once j2 ends, and runs past the moment j0's end
// frees the room j3 needs. Then 24 one-GPU jobs arrive 10 s apart on an empty fleet.
sim::Trace HandTrace() {
  sim::Trace trace;
  trace.source = "hand";
  trace.jobs = {ReplayTraceJob(0, 100, 1, 4), ReplayTraceJob(0, 50, 1, 4),
                ReplayTraceJob(10, 30, 1, 2), ReplayTraceJob(20, 40, 2, 4),
                ReplayTraceJob(60, 10, 1, 2), ReplayTraceJob(75, 100, 1, 4)};
  for (int i = 0; i < 24; ++i) {
    trace.jobs.push_back(ReplayTraceJob(1000 + 10 * i, 5, 1, 1));
  }
  for (size_t i = 0; i < trace.jobs.size(); ++i) {
    trace.jobs[i].job.id = JobId("j" + std::to_string(i));
  }
  return trace;
}

Cluster TwoNodesOfFour() {
  return MakeSyntheticCluster({.nodes_per_leaf = 2, .gpus_per_node = 4}, GpuCatalog::Default())
      .value();
}

std::vector<std::pair<int64_t, int64_t>> StartsAndEnds(const sim::ReplayResult& result) {
  std::vector<std::pair<int64_t, int64_t>> times;
  for (const sim::ReplayJobOutcome& job : result.jobs) {
    times.emplace_back(job.first_start_seconds, job.end_seconds);
  }
  return times;
}

// The first six jobs' times under each policy, worked out by hand (see HandTrace); the 24 small
// ones start at arrival and run 5 s.
std::vector<std::pair<int64_t, int64_t>> Expected(
    std::vector<std::pair<int64_t, int64_t>> first_six) {
  for (int i = 0; i < 24; ++i) {
    first_six.emplace_back(1000 + 10 * i, 1005 + 10 * i);
  }
  return first_six;
}

Result<sim::ReplayResult> ReplayHandTrace(const std::string& queue_policy) {
  sim::ReplayOptions options;
  options.queue_policy = queue_policy;
  return RunReplayThroughControlPlane(TwoNodesOfFour(), HandTrace(), options);
}

TEST(ControlPlaneReplayTest, FifoSkipsTheGangAndLetsTheLaterJobsPass) {
  Result<sim::ReplayResult> result = ReplayHandTrace("fifo");
  ASSERT_OK(result);
  // At 80 j2 ends: j3 (8 GPUs) does not fit while j0 runs, j5 does and runs to 180; j3 then
  // waits for it.
  EXPECT_EQ(StartsAndEnds(*result),
            Expected({{0, 100}, {0, 50}, {50, 80}, {180, 220}, {60, 70}, {80, 180}}));
  EXPECT_EQ(result->jobs_finished, 30);
  EXPECT_EQ(result->jobs_unplaceable, 0);
  EXPECT_EQ(result->total_gpus, 8);
  EXPECT_EQ(result->makespan_seconds, 1235);
  EXPECT_EQ(result->jobs[3].nodes, 2);
}

TEST(ControlPlaneReplayTest, EasyBackfillKeepsTheGangsReservation) {
  Result<sim::ReplayResult> result = ReplayHandTrace("easy-backfill");
  ASSERT_OK(result);
  // j3's reservation is at 100 (j0's estimate): j4 (60 to 70) keeps it, j5 (80 to 180) would
  // not, so j5 starts after j3.
  EXPECT_EQ(StartsAndEnds(*result),
            Expected({{0, 100}, {0, 50}, {50, 80}, {100, 140}, {60, 70}, {140, 240}}));
  // Allocated GPU-seconds: 4x100 + 4x50 + 2x30 + 8x40 + 2x10 + 4x100 + 24x5.
  EXPECT_DOUBLE_EQ(result->allocated_gpu_seconds, 400 + 200 + 60 + 320 + 20 + 400 + 120);
  ASSERT_EQ(result->queues.size(), 1u);
  EXPECT_EQ(result->queues[0].started, 30);
}

TEST(ControlPlaneReplayTest, TheSameSeedGivesTheSameReplay) {
  sim::ReplayOptions options;
  options.queue_policy = "fifo";
  options.seed = 7;
  std::vector<std::string> outputs;
  for (int run = 0; run < 2; ++run) {
    Result<sim::ReplayResult> result =
        RunReplayThroughControlPlane(TwoNodesOfFour(), HandTrace(), options);
    ASSERT_OK(result);
    std::ostringstream out;
    sim::WriteReplayJson({*result}, out);
    outputs.push_back(out.str());
  }
  EXPECT_EQ(outputs[0], outputs[1]);
}

// On 8 GPUs: queue "a" fills them at 0 and queues 8 more at 10; queue "b" queues 8 at 20. All
// run 100 s on one GPU. When the first 8 end, fair share starts b's (a has used the fleet), where
// arrival order would start a's.
sim::Trace TwoQueuesTrace() {
  sim::Trace trace;
  trace.source = "two queues";
  for (const auto& [submit, queue] :
       std::vector<std::pair<int64_t, std::string>>{{0, "a"}, {10, "a"}, {20, "b"}}) {
    for (int i = 0; i < 8; ++i) {
      sim::TraceJob job = ReplayTraceJob(submit, 100, 1, 1);
      job.job.id = JobId(fmt::format("{}{}-{}", queue, submit, i));
      job.job.queue = QueueId(queue);
      trace.jobs.push_back(std::move(job));
    }
  }
  return trace;
}

TEST(ControlPlaneReplayTest, FairShareMakesTheTracesQueuesAndServesTheLighterFirst) {
  sim::ReplayOptions options;
  options.queue_policy = "fair-share";
  Result<sim::ReplayResult> fair =
      RunReplayThroughControlPlane(TwoNodesOfFour(), TwoQueuesTrace(), options);
  ASSERT_OK(fair);
  std::vector<std::pair<int64_t, int64_t>> expected;
  for (const int64_t start : {0, 200, 100}) {
    expected.insert(expected.end(), 8, {start, start + 100});
  }
  EXPECT_EQ(StartsAndEnds(*fair), expected);
  ASSERT_EQ(fair->queues.size(), 2u);
  EXPECT_EQ(fair->preemptions, 0);
  // The replay loops' fair-share gives the same times.
  Result<sim::ReplayResult> loops =
      sim::RunReplay(TwoNodesOfFour(), TwoQueuesTrace(), GpuCatalog::Default(), options);
  ASSERT_OK(loops);
  EXPECT_EQ(StartsAndEnds(*loops), expected);
  // In arrival order a's second eight go first.
  options.queue_policy = "fifo";
  Result<sim::ReplayResult> fifo =
      RunReplayThroughControlPlane(TwoNodesOfFour(), TwoQueuesTrace(), options);
  ASSERT_OK(fifo);
  EXPECT_EQ(fifo->jobs[8].first_start_seconds, 100);
  EXPECT_EQ(fifo->jobs[16].first_start_seconds, 200);
}

TEST(ControlPlaneReplayTest, RefusesWhatTheServerHasNot) {
  sim::ReplayOptions options;
  options.queue_policy = "sjf";
  EXPECT_THAT(RunReplayThroughControlPlane(TwoNodesOfFour(), HandTrace(), options),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("sjf")));
  options.queue_policy = "fair-share-no-preempt";
  EXPECT_THAT(
      RunReplayThroughControlPlane(TwoNodesOfFour(), HandTrace(), options),
      StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("fair-share-no-preempt")));
  options.queue_policy = "fifo";
  options.topology_aware = true;
  EXPECT_THAT(RunReplayThroughControlPlane(TwoNodesOfFour(), HandTrace(), options),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::fleetsim
