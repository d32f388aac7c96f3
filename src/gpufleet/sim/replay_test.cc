// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/replay.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/generators.h"
#include "gpufleet/sim/testing/trace_jobs.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::sim::testing::MakeTraceJob;
using ::gpufleet::sim::testing::SixteenGpus;

using ::gpufleet::testing::StatusIs;

ReplayResult RunWith(const Trace& trace, const std::string& queue_policy) {
  const GpuCatalog catalog = GpuCatalog::Default();
  ReplayOptions options;
  options.queue_policy = queue_policy;
  options.sample_seconds = 50;
  auto result = RunReplay(SixteenGpus(catalog), trace, catalog, options);
  EXPECT_OK(result);
  return std::move(result).value();
}

const ReplayJobOutcome& Outcome(const ReplayResult& result, const std::string& id) {
  for (const ReplayJobOutcome& job : result.jobs) {
    if (job.id == id) {
      return job;
    }
  }
  ADD_FAILURE() << "no job " << id;
  return result.jobs.front();
}

TEST(Replay, JobsRunForTheirDurationAndLeave) {
  Trace trace;
  trace.jobs = {MakeTraceJob("a", 0, 100, 8), MakeTraceJob("b", 10, 100, 8),
                MakeTraceJob("c", 20, 50, 8)};
  const ReplayResult result = RunWith(trace, "fifo");
  EXPECT_EQ(result.jobs_finished, 3);
  EXPECT_EQ(Outcome(result, "a").end_seconds, 100);
  EXPECT_EQ(Outcome(result, "b").end_seconds, 110);
  // c waits for a to leave.
  EXPECT_EQ(Outcome(result, "c").first_start_seconds, 100);
  EXPECT_EQ(Outcome(result, "c").end_seconds, 150);
  EXPECT_EQ(result.makespan_seconds, 150);
  EXPECT_EQ(result.total_gpus, 16);
  ASSERT_FALSE(result.series.empty());
  EXPECT_EQ(result.series[1].gpus_allocated, 16);  // t = 50: a and b run
  EXPECT_EQ(result.series[1].queue_length, 1);
}

TEST(Replay, SjfRunsTheShortWaitingJobFirst) {
  Trace trace;
  trace.jobs = {MakeTraceJob("big", 0, 100, 16), MakeTraceJob("long", 1, 500, 16),
                MakeTraceJob("short", 2, 10, 16)};
  const ReplayResult fifo = RunWith(trace, "fifo");
  const ReplayResult sjf = RunWith(trace, "sjf");
  EXPECT_EQ(Outcome(fifo, "short").first_start_seconds, 600);
  EXPECT_EQ(Outcome(sjf, "short").first_start_seconds, 100);
  EXPECT_LT(sjf.completion_time.mean, fifo.completion_time.mean);
}

TEST(Replay, TiresiasPreemptsJobsWithMoreAttainedService) {
  Trace trace;
  // "old" runs alone and crosses the 3600 GPU-second threshold after 225 s on 16 GPUs.
  trace.jobs = {MakeTraceJob("old", 0, 1000, 16), MakeTraceJob("new", 300, 100, 16)};
  const ReplayResult result = RunWith(trace, "tiresias");
  EXPECT_EQ(Outcome(result, "new").first_start_seconds, 300);
  EXPECT_EQ(Outcome(result, "new").end_seconds, 400);
  EXPECT_EQ(Outcome(result, "old").preemptions, 1);
  EXPECT_EQ(Outcome(result, "old").end_seconds, 1100);
}

TEST(Replay, GpufleetServesLeastRemainingGpuTimeFirst) {
  Trace trace;
  trace.jobs = {MakeTraceJob("long", 0, 1000, 16), MakeTraceJob("quick", 100, 10, 8)};
  const ReplayResult result = RunWith(trace, "gpufleet");
  EXPECT_EQ(Outcome(result, "quick").first_start_seconds, 100);
  EXPECT_EQ(Outcome(result, "long").preemptions, 1);
  EXPECT_EQ(result.jobs_finished, 2);
}

TEST(Replay, JobsLargerThanTheClusterAreCountedNotQueuedForever) {
  Trace trace;
  trace.jobs = {MakeTraceJob("huge", 0, 10, 32), MakeTraceJob("ok", 1, 10, 8)};
  // A task of 16 GPUs fits none of the 8-GPU nodes: it runs as two tasks of 8.
  trace.jobs.push_back(MakeTraceJob("wide", 2, 10, 8));
  trace.jobs.back().job.groups[0].request.gpus = WholeGpus{16};
  const ReplayResult result = RunWith(trace, "fifo");
  EXPECT_EQ(result.jobs_unplaceable, 1);
  EXPECT_EQ(result.jobs_finished, 2);
}

TEST(Replay, WideTasksAreSplitToFitTheNodes) {
  Trace trace;
  trace.jobs = {MakeTraceJob("eight", 0, 10, 8)};
  trace.jobs[0].job.groups[0].request.host = {8000, 8192};
  const Trace fitted = FitTasksToNodes(trace, 4);
  const TaskGroup& group = fitted.jobs[0].job.groups[0];
  EXPECT_EQ(group.replicas, 2);
  EXPECT_EQ(std::get<WholeGpus>(group.request.gpus).count, 4);
  EXPECT_EQ(group.request.host.cpu_milli, 4000);
  EXPECT_EQ(FitTasksToNodes(trace, 3).jobs[0].job.groups[0].replicas, 4);  // 4 x 2 GPUs
  EXPECT_EQ(FitTasksToNodes(trace, 8).jobs[0].job.groups[0].replicas, 1);
}

TEST(Replay, SameSeedSameResult) {
  Trace trace;
  for (int i = 0; i < 40; ++i) {
    trace.jobs.push_back(
        MakeTraceJob("j" + std::to_string(i), i * 7, 30 + (i * 37) % 200, 1 << (i % 4)));
  }
  for (const std::string& policy : QueuePolicyNames()) {
    SCOPED_TRACE(policy);
    const ReplayResult a = RunWith(trace, policy);
    const ReplayResult b = RunWith(trace, policy);
    EXPECT_EQ(a.jobs_finished, 40);
    ASSERT_EQ(a.jobs.size(), b.jobs.size());
    for (size_t i = 0; i < a.jobs.size(); ++i) {
      EXPECT_EQ(a.jobs[i].end_seconds, b.jobs[i].end_seconds);
    }
  }
}

TEST(Replay, UnknownQueuePolicyIsAnError) {
  const GpuCatalog catalog = GpuCatalog::Default();
  ReplayOptions options;
  options.queue_policy = "lottery";
  EXPECT_THAT(RunReplay(SixteenGpus(catalog), Trace{}, catalog, options),
              StatusIs(StatusCode::kInvalidArgument));
}

// Two leaves of four 8-GPU nodes under a 3:1 oversubscribed spine: two long single-node jobs take
// two nodes of leaf1, then a four-node gang arrives that only leaf2 can hold whole.
struct FabricReplay {
  std::shared_ptr<const fabric::Fabric> fabric;
  Cluster cluster;
  Trace trace;
};

FabricReplay OversubscribedReplay(const GpuCatalog& catalog) {
  fabric::ClosOptions clos;
  clos.leaves_per_pod = 2;
  clos.nodes_per_leaf = 4;
  clos.leaf_oversubscription = 3;
  FabricReplay replay;
  replay.fabric = std::make_shared<const fabric::Fabric>(
      fabric::Fabric::Build(*fabric::GenerateClos(clos)).value());
  replay.cluster = fabric::BuildCluster(*replay.fabric, catalog).value();
  replay.trace.jobs = {MakeTraceJob("busy1", 0, 1000, 8), MakeTraceJob("busy2", 0, 1000, 8),
                       MakeTraceJob("gang", 1, 100, 32)};
  return replay;
}

// The nodes without topology levels: only the fabric knows the leaves, and a placement blind to
// it spreads the gang over the spine.
Cluster WithoutLevels(Cluster cluster) {
  cluster.topology = Topology();
  for (Node& node : cluster.nodes) {
    node.topology.clear();
  }
  return cluster;
}

TEST(Replay, MultiNodeJobStretchesWithItsPlacementsCommunicationCost) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const FabricReplay replay = OversubscribedReplay(catalog);
  ReplayOptions options;
  options.fabric = replay.fabric;
  auto blind = RunReplay(WithoutLevels(replay.cluster), replay.trace, catalog, options);
  ASSERT_OK(blind);
  const ReplayJobOutcome& spread = Outcome(*blind, "gang");
  EXPECT_EQ(spread.nodes, 4);
  // Across the 3:1 spine the all-reduce takes about 2.5x as long; 30 % of the run communicates.
  EXPECT_GT(spread.stretch, 1.3);
  EXPECT_LT(spread.stretch, 1.7);
  EXPECT_EQ(spread.CompletionTime(), static_cast<int64_t>(std::ceil(100 * spread.stretch)));
  EXPECT_DOUBLE_EQ(Outcome(*blind, "busy1").stretch, 1.0);

  options.topology_aware = true;
  auto aware = RunReplay(WithoutLevels(replay.cluster), replay.trace, catalog, options);
  ASSERT_OK(aware);
  EXPECT_DOUBLE_EQ(Outcome(*aware, "gang").stretch, 1.0);
  EXPECT_EQ(Outcome(*aware, "gang").CompletionTime(), 100);

  // Nodes that declare the fabric's tiers as topology levels: the compact-gang rule keeps the
  // gang in leaf2 without the plugin.
  options.topology_aware = false;
  auto levels = RunReplay(replay.cluster, replay.trace, catalog, options);
  ASSERT_OK(levels);
  EXPECT_DOUBLE_EQ(Outcome(*levels, "gang").stretch, 1.0);
}

TEST(Replay, PerJobCommunicationFractionOverridesTheDefault) {
  const GpuCatalog catalog = GpuCatalog::Default();
  FabricReplay replay = OversubscribedReplay(catalog);
  replay.trace.jobs[2].communication_fraction = 0;
  ReplayOptions options;
  options.fabric = replay.fabric;
  auto result = RunReplay(replay.cluster, replay.trace, catalog, options);
  ASSERT_OK(result);
  EXPECT_EQ(Outcome(*result, "gang").CompletionTime(), 100);
}

TEST(Replay, BadNetworkOptionsAreErrors) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const FabricReplay replay = OversubscribedReplay(catalog);
  ReplayOptions options;
  options.fabric = replay.fabric;
  options.communication_fraction = 1.5;
  EXPECT_THAT(
      RunReplay(replay.cluster, replay.trace, catalog, options),
      StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("communication_fraction: 1.5")));
  options = {};
  options.topology_aware = true;
  EXPECT_THAT(RunReplay(replay.cluster, replay.trace, catalog, options),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("needs a fabric")));
}

// a holds 8 of the 16 GPUs until 100; big (16 GPUs) arrives at 1 and cannot start before 100.
Trace BigBehindBusy(int64_t small_duration) {
  Trace trace;
  trace.jobs = {MakeTraceJob("a", 0, 100, 8), MakeTraceJob("big", 1, 100, 16),
                MakeTraceJob("small", 2, small_duration, 8)};
  return trace;
}

TEST(Replay, StrictFifoLetsNothingPassAJobThatDoesNotFit) {
  const Trace trace = BigBehindBusy(10);
  EXPECT_EQ(Outcome(RunWith(trace, "fifo"), "small").first_start_seconds, 2);
  const ReplayResult strict = RunWith(trace, "strict-fifo");
  EXPECT_EQ(Outcome(strict, "big").first_start_seconds, 100);
  EXPECT_EQ(Outcome(strict, "small").first_start_seconds, 200);
}

TEST(Replay, EasyBackfillStartsAShortJobThatEndsBeforeTheReservation) {
  const ReplayResult result = RunWith(BigBehindBusy(10), "easy-backfill");
  EXPECT_EQ(Outcome(result, "small").first_start_seconds, 2);
  EXPECT_EQ(Outcome(result, "big").reserved_start_seconds, 100);
  EXPECT_EQ(Outcome(result, "big").first_start_seconds, 100);
  EXPECT_EQ(result.reservations, 1);
  EXPECT_EQ(result.reservations_delayed, 0);
}

// fifo starts the long small job at 2 because it fits, and the 16-GPU job then waits until 502:
// the naive backfill that EASY's reservation prevents.
TEST(Replay, EasyBackfillNeverDelaysTheReservedJob) {
  const Trace trace = BigBehindBusy(500);
  const ReplayResult fifo = RunWith(trace, "fifo");
  EXPECT_EQ(Outcome(fifo, "big").first_start_seconds, 502);
  const ReplayResult easy = RunWith(trace, "easy-backfill");
  EXPECT_EQ(Outcome(easy, "big").first_start_seconds, 100);
  EXPECT_EQ(Outcome(easy, "small").first_start_seconds, 200);
  EXPECT_EQ(easy.reservations_delayed, 0);
}

TEST(Replay, RuntimeEstimatesAreTimeLimitsUnderEasyBackfill) {
  Trace trace;
  trace.jobs = {MakeTraceJob("overrun", 0, 100, 8), MakeTraceJob("fine", 0, 100, 8)};
  trace.jobs[0].job.runtime_estimate = std::chrono::seconds(60);
  const ReplayResult easy = RunWith(trace, "easy-backfill");
  EXPECT_TRUE(Outcome(easy, "overrun").timed_out);
  EXPECT_EQ(Outcome(easy, "overrun").end_seconds, 60);
  EXPECT_FALSE(Outcome(easy, "fine").timed_out);
  EXPECT_EQ(easy.jobs_timed_out, 1);
  EXPECT_EQ(easy.jobs_finished, 1);
  EXPECT_EQ(easy.completion_time.mean, 100);

  const GpuCatalog catalog = GpuCatalog::Default();
  ReplayOptions options;
  options.queue_policy = "easy-backfill";
  options.overrun_grace_seconds = 30;
  auto graced = RunReplay(SixteenGpus(catalog), trace, catalog, options);
  ASSERT_OK(graced);
  EXPECT_EQ(Outcome(*graced, "overrun").end_seconds, 90);
  // Other policies run jobs to the end unless asked to enforce the limits.
  EXPECT_FALSE(Outcome(RunWith(trace, "fifo"), "overrun").timed_out);
  options.queue_policy = "fifo";
  options.enforce_time_limits = true;
  auto enforced = RunReplay(SixteenGpus(catalog), trace, catalog, options);
  ASSERT_OK(enforced);
  EXPECT_EQ(Outcome(*enforced, "overrun").end_seconds, 90);
  options.overrun_grace_seconds = -1;
  EXPECT_THAT(
      RunReplay(SixteenGpus(catalog), trace, catalog, options),
      StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("overrun_grace_seconds")));
}

// Team a submits four 8-GPU jobs at 0, team b one at 1; at 100 two GPUs slots free up and b, which
// has used nothing, goes before a's third job.
Trace FloodedByTeamA() {
  Trace trace;
  for (int i = 1; i <= 4; ++i) {
    trace.jobs.push_back(MakeTraceJob("a" + std::to_string(i), 0, 100, 8));
    trace.jobs.back().job.queue = QueueId("team-a");
  }
  trace.jobs.push_back(MakeTraceJob("b1", 1, 100, 8));
  trace.jobs.back().job.queue = QueueId("team-b");
  return trace;
}

TEST(Replay, FairShareServesTheQueueThatUsedLessFirst) {
  const Trace trace = FloodedByTeamA();
  const ReplayResult fifo = RunWith(trace, "fifo");
  EXPECT_EQ(Outcome(fifo, "b1").first_start_seconds, 200);
  const ReplayResult fair = RunWith(trace, "fair-share");
  EXPECT_EQ(Outcome(fair, "b1").first_start_seconds, 100);
  EXPECT_EQ(Outcome(fair, "a4").first_start_seconds, 200);
  ASSERT_EQ(fair.queues.size(), 2U);
  EXPECT_EQ(fair.queues[0].queue, "team-a");
  EXPECT_EQ(fair.queues[0].jobs, 4);
  EXPECT_EQ(fair.queues[0].finished, 4);
  EXPECT_DOUBLE_EQ(fair.queues[0].queueing_delay.mean, (0 + 0 + 100 + 200) / 4.0);
  EXPECT_EQ(fair.queues[1].queue, "team-b");
  EXPECT_DOUBLE_EQ(fair.queues[1].queueing_delay.mean, 99);
  EXPECT_DOUBLE_EQ(fifo.queues[1].queueing_delay.mean, 199);
}

TEST(Replay, FairShareAdmitsByTheQueueTreesLimits) {
  const GpuCatalog catalog = GpuCatalog::Default();
  ReplayOptions options;
  options.queue_policy = "fair-share";
  options.queues = {{"team-a", {}, {{"*", 8000}}}, {"team-b"}};
  auto result = RunReplay(SixteenGpus(catalog), FloodedByTeamA(), catalog, options);
  ASSERT_OK(result);
  // team-a may hold 8 GPUs at a time: its jobs run one after another.
  EXPECT_EQ(Outcome(*result, "a2").first_start_seconds, 100);
  EXPECT_EQ(Outcome(*result, "a4").first_start_seconds, 300);
  EXPECT_EQ(Outcome(*result, "b1").first_start_seconds, 1);

  options.queues = {{"team-a"}};
  EXPECT_THAT(
      RunReplay(SixteenGpus(catalog), FloodedByTeamA(), catalog, options),
      StatusIs(StatusCode::kInvalidArgument,
               ::testing::HasSubstr("job \"b1\": queue \"team-b\" is not in the queue tree")));
  options.queues = {{"team-a", {}, {}, 0.0}, {"team-b"}};
  EXPECT_THAT(RunReplay(SixteenGpus(catalog), FloodedByTeamA(), catalog, options),
              StatusIs(StatusCode::kInvalidArgument, ::testing::HasSubstr("weight: 0")));
}

// Team a fills both nodes with two 8-GPU jobs from 0 to 5000; team b submits b1 (8 GPUs, 100 s)
// at `b_submit`. Each team is guaranteed 8 GPUs and may borrow.
Trace TeamABorrowsTeamBsHalf(int64_t b_submit) {
  Trace trace;
  for (const std::string id : {"a1", "a2"}) {
    trace.jobs.push_back(MakeTraceJob(id, 0, 5000, 8));
    trace.jobs.back().job.queue = QueueId("team-a");
  }
  trace.jobs.push_back(MakeTraceJob("b1", b_submit, 100, 8));
  trace.jobs.back().job.queue = QueueId("team-b");
  return trace;
}

ReplayOptions HalfEach(const std::string& queue_policy = "fair-share") {
  ReplayOptions options;
  options.queue_policy = queue_policy;
  options.sample_seconds = 50;
  options.queues = {{"team-a", {{"*", 8000}}}, {"team-b", {{"*", 8000}}}};
  return options;
}

ReplayResult MustReplay(const Trace& trace, const ReplayOptions& options) {
  const GpuCatalog catalog = GpuCatalog::Default();
  auto result = RunReplay(SixteenGpus(catalog), trace, catalog, options);
  EXPECT_OK(result);
  return std::move(result).value();
}

TEST(Replay, FairShareReclaimsTheGuaranteeFromABorrowingTeam) {
  const Trace trace = TeamABorrowsTeamBsHalf(1000);
  const ReplayResult before = MustReplay(trace, HalfEach("fair-share-no-preempt"));
  EXPECT_EQ(Outcome(before, "b1").first_start_seconds, 5000);
  EXPECT_EQ(before.preemptions, 0);

  const ReplayResult result = MustReplay(trace, HalfEach());
  EXPECT_EQ(Outcome(result, "b1").first_start_seconds, 1000);
  EXPECT_EQ(Outcome(result, "b1").end_seconds, 1100);
  // Equal cost: the victim is the smaller id. It resumes when b1 ends, with all its work kept.
  EXPECT_EQ(Outcome(result, "a1").preemptions, 1);
  EXPECT_EQ(Outcome(result, "a1").end_seconds, 1100 + 4000);
  EXPECT_EQ(Outcome(result, "a2").preemptions, 0);
  EXPECT_EQ(Outcome(result, "a2").end_seconds, 5000);
  EXPECT_EQ(result.preemptions, 1);
  EXPECT_EQ(result.preemption_rounds, 1);
  EXPECT_EQ(result.lost_work_gpu_seconds, 0);
  EXPECT_EQ(result.jobs_finished, 3);
}

TEST(Replay, FairSharePreemptedWorkSinceTheLastCheckpointIsLost) {
  ReplayOptions options = HalfEach();
  options.checkpoint_interval_seconds = 300;
  const ReplayResult result = MustReplay(TeamABorrowsTeamBsHalf(1000), options);
  // a1's last checkpoint was at 900: 100 s on 8 GPUs are lost and run again.
  EXPECT_EQ(result.lost_work_gpu_seconds, 800);
  EXPECT_EQ(Outcome(result, "a1").end_seconds, 1100 + 4100);
}

TEST(Replay, FairShareWaitsForTheMinimumRuntimeThenReclaims) {
  // At 300 a's jobs have run less than the 600 s minimum: b1 waits until they come of age.
  const ReplayResult result = MustReplay(TeamABorrowsTeamBsHalf(300), HalfEach());
  EXPECT_EQ(Outcome(result, "b1").first_start_seconds, 600);
  EXPECT_EQ(result.preemptions, 1);
  ReplayOptions patient = HalfEach();
  patient.min_runtime_before_preemption_seconds = 2000;
  EXPECT_EQ(Outcome(MustReplay(TeamABorrowsTeamBsHalf(300), patient), "b1").first_start_seconds,
            2000);
}

TEST(Replay, FairShareNeverPreemptsANonPreemptibleJob) {
  Trace trace = TeamABorrowsTeamBsHalf(1000);
  trace.jobs[0].job.preemptible = false;
  trace.jobs[1].job.preemptible = false;
  const ReplayResult result = MustReplay(trace, HalfEach());
  EXPECT_EQ(Outcome(result, "b1").first_start_seconds, 5000);
  EXPECT_EQ(result.preemptions, 0);
  // One of them preemptible: that one is the victim.
  trace.jobs[1].job.preemptible = true;
  const ReplayResult one = MustReplay(trace, HalfEach());
  EXPECT_EQ(Outcome(one, "b1").first_start_seconds, 1000);
  EXPECT_EQ(Outcome(one, "a2").preemptions, 1);
  EXPECT_EQ(Outcome(one, "a1").preemptions, 0);
}

TEST(Replay, FairSharePreemptsAGangVictimWhole) {
  Trace trace;
  trace.jobs = {MakeTraceJob("gang", 0, 5000, 16), MakeTraceJob("b1", 1000, 100, 4)};
  trace.jobs[0].job.queue = QueueId("team-a");
  trace.jobs[1].job.queue = QueueId("team-b");
  const ReplayResult result = MustReplay(trace, HalfEach());
  EXPECT_EQ(Outcome(result, "b1").first_start_seconds, 1000);
  EXPECT_EQ(Outcome(result, "gang").preemptions, 1);
  // Both 8-GPU tasks stopped, not only the one b1 needed: 4 GPUs held until b1 ends.
  for (const ReplaySample& sample : result.series) {
    if (sample.time_seconds == 1050) {
      EXPECT_EQ(sample.gpus_allocated, 4);
    }
  }
  EXPECT_EQ(Outcome(result, "gang").end_seconds, 1100 + 4000);
}

TEST(Replay, FairShareKeepsTheQueueTreesAccountsThroughPreemption) {
  Trace trace = TeamABorrowsTeamBsHalf(1000);
  trace.jobs.push_back(MakeTraceJob("b2", 1001, 100, 8));
  trace.jobs.back().job.queue = QueueId("team-b");
  ReplayOptions options = HalfEach();
  // Were a1 still charged after its preemption, team-a would be at its limit and a1 never back.
  options.queues[0].limit = {{"*", 16000}};
  const ReplayResult result = MustReplay(trace, options);
  EXPECT_EQ(Outcome(result, "b1").first_start_seconds, 1000);
  // b1 is charged to team-b, which then holds its whole guarantee: b2 does not reclaim.
  EXPECT_EQ(Outcome(result, "b2").first_start_seconds, 1100);
  EXPECT_EQ(result.preemptions, 1);
  EXPECT_EQ(result.jobs_finished, 4);
  // a1 goes back on b2's GPUs when b2 ends, with its 4000 s of work left.
  EXPECT_EQ(Outcome(result, "a1").end_seconds, 1200 + 4000);
}

TEST(Replay, FairSharePreemptsALowerPriorityInTheSameQueue) {
  Trace trace;
  trace.jobs = {MakeTraceJob("low", 0, 5000, 16), MakeTraceJob("high", 1000, 100, 8)};
  trace.jobs[1].job.priority = 1;
  const ReplayResult result = RunWith(trace, "fair-share");
  EXPECT_EQ(Outcome(result, "high").first_start_seconds, 1000);
  EXPECT_EQ(Outcome(result, "low").preemptions, 1);
  EXPECT_EQ(Outcome(RunWith(trace, "fair-share-no-preempt"), "high").first_start_seconds, 5000);
}

TEST(Replay, FairSharePreemptionIsDeterministic) {
  Trace trace;
  for (int i = 0; i < 60; ++i) {
    trace.jobs.push_back(
        MakeTraceJob("j" + std::to_string(i), i * 40, 700 + (i * 37) % 900, 1 << (i % 4)));
    trace.jobs.back().job.queue = QueueId(i % 3 == 0 ? "team-b" : "team-a");
  }
  const ReplayResult a = MustReplay(trace, HalfEach());
  const ReplayResult b = MustReplay(trace, HalfEach());
  EXPECT_GT(a.preemptions, 0);
  EXPECT_EQ(a.jobs_finished, 60);
  EXPECT_EQ(a.preemptions, b.preemptions);
  ASSERT_EQ(a.jobs.size(), b.jobs.size());
  for (size_t i = 0; i < a.jobs.size(); ++i) {
    EXPECT_EQ(a.jobs[i].first_start_seconds, b.jobs[i].first_start_seconds);
    EXPECT_EQ(a.jobs[i].end_seconds, b.jobs[i].end_seconds);
    EXPECT_EQ(a.jobs[i].preemptions, b.jobs[i].preemptions);
  }
}

TEST(Replay, BadPreemptionOptionsAreErrors) {
  const GpuCatalog catalog = GpuCatalog::Default();
  ReplayOptions options = HalfEach();
  options.min_runtime_before_preemption_seconds = -1;
  EXPECT_THAT(RunReplay(SixteenGpus(catalog), TeamABorrowsTeamBsHalf(1), catalog, options),
              StatusIs(StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("min_runtime_before_preemption_seconds: -1")));
  options = HalfEach();
  options.checkpoint_interval_seconds = -5;
  EXPECT_THAT(RunReplay(SixteenGpus(catalog), TeamABorrowsTeamBsHalf(1), catalog, options),
              StatusIs(StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("checkpoint_interval_seconds: -5")));
}

TEST(Replay, JobsWithoutAQueueAreInTheDefaultQueue) {
  const ReplayResult result = RunWith(BigBehindBusy(10), "fifo");
  ASSERT_EQ(result.queues.size(), 1U);
  EXPECT_EQ(result.queues[0].queue, "default");
  EXPECT_EQ(result.queues[0].jobs, 3);
  EXPECT_EQ(result.queues[0].started, 3);
  EXPECT_EQ(Outcome(result, "a").queue, "default");
}

}  // namespace
}  // namespace gpufleet::sim
