// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/preemption.h"

#include <algorithm>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using ::gpufleet::testing::StatusIs;
using scheduler::ClusterSnapshot;
using scheduler::GpuAssignment;
using scheduler::PluginRegistry;
using scheduler::Scheduler;
using scheduler::ScheduleResult;
using scheduler::TaskPlacement;
using scheduler::testing::MakeJob;
using scheduler::testing::MakeNode;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kNow = 10000;

std::vector<std::string> VictimIds(const std::vector<JobId>& ids) {
  std::vector<std::string> values;
  for (const JobId& id : ids) {
    values.push_back(id.value());
  }
  return values;
}

// `leaves` leaves named leaf-a, leaf-b, ... of `nodes` nodes ("a0", "a1", ...) with `gpus` H100s.
Cluster Leaves(int leaves, int nodes, int gpus) {
  Cluster cluster;
  cluster.topology = Topology({"leaf"});
  for (int l = 0; l < leaves; ++l) {
    const std::string letter(1, static_cast<char>('a' + l));
    for (int n = 0; n < nodes; ++n) {
      cluster.nodes.push_back(
          MakeNode(letter + std::to_string(n), gpus, "H100-80GB", {"leaf-" + letter}));
    }
  }
  return cluster;
}

// A preemptor of `replicas` tasks of `gpus` whole GPUs in queue "q" at priority 10.
Job Preemptor(int replicas, int gpus, const std::string& required_level = "") {
  Job job = MakeJob("p", replicas, WholeGpus{gpus});
  job.queue = QueueId("q");
  job.priority = 10;
  job.topology.required_level = required_level;
  return job;
}

class PreemptionTest : public ::testing::Test {
 protected:
  void Use(Cluster cluster) {
    auto snapshot = ClusterSnapshot::Build(std::move(cluster), catalog_);
    ASSERT_OK(snapshot);
    snapshot_.emplace(std::move(snapshot).value());
    auto scheduler = Scheduler::Create({}, PluginRegistry::Default());
    ASSERT_OK(scheduler);
    scheduler_ = std::move(scheduler).value();
  }

  // Starts job `id` (queue "q", priority 0, started at 0) with one task per entry of `tasks`:
  // the node index and the whole GPUs it holds there.
  RunningJob& Hold(const std::string& id,
                   const std::vector<std::pair<int, std::vector<int>>>& tasks, int priority = 0) {
    RunningJob job;
    job.id = JobId(id);
    job.queue = QueueId("q");
    job.priority = priority;
    for (size_t t = 0; t < tasks.size(); ++t) {
      TaskPlacement placement{0, static_cast<int>(t), tasks[t].first, {1000, 1024}, {}};
      for (int gpu : tasks[t].second) {
        placement.gpus.push_back({gpu, 1000, 0});
      }
      EXPECT_OK(snapshot_->Apply(placement));
      job.placements.push_back(placement);
    }
    running_.push_back(job);
    return running_.back();
  }

  Result<PreemptionDecision> Find(const Job& preemptor, PreemptionOptions options = {},
                                  PreemptionRule rule = HigherPriorityInSameQueue()) {
    auto search = PreemptionSearch::Create(*scheduler_, std::move(rule), options);
    if (!search.ok()) {
      return search.status();
    }
    Random random(1);
    return search->Find(*snapshot_, preemptor, running_, kNow, random);
  }

  std::set<std::string> NodesOf(const std::vector<TaskPlacement>& placements) const {
    std::set<std::string> nodes;
    for (const TaskPlacement& placement : placements) {
      nodes.insert(snapshot_->nodes()[placement.node].node->id.value());
    }
    return nodes;
  }

  // The plan's placements apply once its victims are released, on a copy of the snapshot.
  void ExpectPlanApplies(const PreemptionPlan& plan) const {
    ClusterSnapshot copy = snapshot_->Clone();
    for (const RunningJob& job : running_) {
      if (std::find(plan.victims.begin(), plan.victims.end(), job.id) != plan.victims.end()) {
        for (const TaskPlacement& placement : job.placements) {
          copy.Release(placement);
        }
      }
    }
    for (const TaskPlacement& placement : plan.placements) {
      EXPECT_OK(copy.Apply(placement));
    }
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<RunningJob> running_;
};

TEST_F(PreemptionTest, JobThatFitsNeedsNoVictims) {
  Use(Leaves(2, 2, 8));
  Hold("low", {{0, {0, 1, 2, 3, 4, 5, 6, 7}}});
  auto decision = Find(Preemptor(1, 8, "leaf"));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_TRUE(decision->plan->victims.empty());
  EXPECT_EQ(decision->plan->preempted_gpu_milli, 0);
  // Best fit: the leaf with the fewest free GPUs that holds the job.
  EXPECT_EQ(decision->plan->domain, "leaf-a");
  EXPECT_EQ(NodesOf(decision->plan->placements), (std::set<std::string>{"a1"}));
  EXPECT_EQ(decision->fit_checks, 1);
}

// Three leaves of 9 nodes x 8 GPUs; the job needs 8 whole nodes of one leaf.
TEST_F(PreemptionTest, SixtyFourGpuJobNeedingOneLeafPreemptsTheFewestGpus) {
  Use(Leaves(3, 9, 8));
  // leaf-a: one 32-GPU gang on a5..a8; 40 GPUs free.
  Hold("a-gang", {{5, {0, 1, 2, 3, 4, 5, 6, 7}},
                  {6, {0, 1, 2, 3, 4, 5, 6, 7}},
                  {7, {0, 1, 2, 3, 4, 5, 6, 7}},
                  {8, {0, 1, 2, 3, 4, 5, 6, 7}}});
  // leaf-b: four whole-node jobs and 40 GPUs free: three of them (24 GPUs) would do.
  for (int n = 9; n < 13; ++n) {
    Hold("b" + std::to_string(n), {{n, {0, 1, 2, 3, 4, 5, 6, 7}}});
  }
  // leaf-c: half of c6, c7 and c8 is held by 4-GPU jobs: two of them (8 GPUs) free two nodes.
  // Their lost work differs: the two that lose least are chosen.
  const int64_t lost[] = {100, 50, 10};
  for (int i = 0; i < 3; ++i) {
    Hold("c" + std::to_string(i), {{24 + i, {0, 1, 2, 3}}}).lost_work_gpu_seconds = lost[i];
  }

  auto decision = Find(Preemptor(8, 8, "leaf"));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  const PreemptionPlan& plan = *decision->plan;
  EXPECT_EQ(plan.domain, "leaf-c");
  EXPECT_THAT(VictimIds(plan.victims), ElementsAre("c1", "c2"));
  EXPECT_EQ(plan.preempted_gpu_milli, 8000);
  EXPECT_EQ(plan.lost_work_gpu_seconds, 60);
  EXPECT_TRUE(plan.proven_optimal);
  ASSERT_EQ(plan.placements.size(), 8U);
  for (const std::string& node : NodesOf(plan.placements)) {
    EXPECT_EQ(node[0], 'c') << node;
  }
  EXPECT_EQ(NodesOf(plan.placements).count("c6"), 0U);  // c0 still runs there
  ExpectPlanApplies(plan);
}

// Three leaves of 2 nodes x 8 GPUs; the job needs both nodes of one leaf.
TEST_F(PreemptionTest, GangVictimWithOneMemberOnAnotherLeafCountsAllItsGpus) {
  Use(Leaves(3, 2, 8));
  const std::vector<int> all = {0, 1, 2, 3, 4, 5, 6, 7};
  // x frees a1 (8 GPUs of leaf-a) but is stopped whole: 16 GPUs.
  Hold("x", {{1, all}, {2, all}});
  Hold("z", {{3, all}}).preemptible = false;
  // Freeing leaf-c costs 12 GPUs: fewer than x's 16, more than x's 8 inside leaf-a.
  Hold("w1", {{4, {0, 1, 2, 3}}});
  Hold("w2", {{5, all}});

  auto decision = Find(Preemptor(2, 8, "leaf"));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_EQ(decision->plan->domain, "leaf-c");
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("w1", "w2"));
  EXPECT_EQ(decision->plan->preempted_gpu_milli, 12000);
  ExpectPlanApplies(*decision->plan);

  // Without leaf-c, leaf-a is freed by stopping all of x, including its task on leaf-b.
  running_.back().preemptible = false;
  decision = Find(Preemptor(2, 8, "leaf"));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_EQ(decision->plan->domain, "leaf-a");
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("x"));
  EXPECT_EQ(decision->plan->preempted_gpu_milli, 16000);
  EXPECT_EQ(decision->plan->lost_work_gpu_seconds, 16 * kNow);
  EXPECT_EQ(NodesOf(decision->plan->placements), (std::set<std::string>{"a0", "a1"}));
  ExpectPlanApplies(*decision->plan);
}

TEST_F(PreemptionTest, MinimumRuntimeGuardsYoungJobs) {
  Use(Leaves(1, 1, 8));
  Hold("old", {{0, {0, 1, 2, 3}}});
  Hold("young", {{0, {4, 5, 6, 7}}}).start_seconds = kNow - 100;
  // Without the guard the young job is cheaper to stop (400 GPU-seconds lost, not 40000).
  auto decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("young"));
  EXPECT_EQ(decision->plan->lost_work_gpu_seconds, 400);

  PreemptionOptions options;
  options.min_runtime_seconds = 600;
  decision = Find(Preemptor(1, 4), options);
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("old"));

  decision = Find(Preemptor(1, 8, "leaf"), options);
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_THAT(decision->reason, HasSubstr("no leaf can be freed for job \"p\" (8 GPUs)"));
  EXPECT_THAT(decision->reason,
              HasSubstr("leaf-a has 0 free, 4 preemptible, 4 of jobs started less than 10m ago"));
}

TEST_F(PreemptionTest, CheckpointLimitsLostWork) {
  Use(Leaves(1, 1, 8));
  Hold("never-saved", {{0, {0, 1, 2, 3}}}).start_seconds = 9000;
  Hold("saved", {{0, {4, 5, 6, 7}}}).last_checkpoint_seconds = kNow - 10;
  auto decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("saved"));
  EXPECT_EQ(decision->plan->lost_work_gpu_seconds, 40);
}

// Issue 37: of two equal jobs the one that saved most recently is stopped, and a job that never
// reported a checkpoint counts its whole run.
TEST_F(PreemptionTest, VictimIsTheJobThatCheckpointedLast) {
  Use(Leaves(1, 1, 8));
  Hold("saved-50m-ago", {{0, {0, 1, 2, 3}}}).last_checkpoint_seconds = kNow - 3000;
  Hold("saved-10s-ago", {{0, {4, 5, 6, 7}}}).last_checkpoint_seconds = kNow - 10;
  auto decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("saved-10s-ago"));
  EXPECT_EQ(decision->plan->lost_work_gpu_seconds, 40);
  EXPECT_EQ(decision->plan->wasted_gpu_seconds, 40 + 4 * PreemptionOptions{}.restart_cost_seconds);

  // Both started at 0; the one without a checkpoint would lose all of its 10000 s.
  running_[1].last_checkpoint_seconds.reset();
  running_[0].last_checkpoint_seconds = kNow - 9000;
  decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("saved-50m-ago"));
  EXPECT_EQ(decision->plan->lost_work_gpu_seconds, 4 * 9000);
}

// Lost work and GPUs preempted are one sum: a large job that has just saved goes before a small
// one that has not saved for hours, unless the restart of its GPUs costs more than the small one
// would lose.
TEST_F(PreemptionTest, LostWorkAndRestartCostAreWeighedTogether) {
  Use(Leaves(1, 1, 12));
  // The big job saved a minute ago; the small one never did in its 10000 s.
  Hold("big", {{0, {0, 1, 2, 3, 4, 5, 6, 7}}}).last_checkpoint_seconds = kNow - 60;
  Hold("small", {{0, {8, 9, 10, 11}}});
  auto decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("big"));
  EXPECT_EQ(decision->plan->preempted_gpu_milli, 8000);
  EXPECT_EQ(decision->plan->wasted_gpu_seconds, 8 * 60 + 8 * 300);
  EXPECT_TRUE(decision->plan->proven_optimal);

  // The small job saved 200 s ago: 800 lost + 1200 restart is less than the big job's 0 + 2400.
  running_[0].last_checkpoint_seconds = kNow;
  running_[1].last_checkpoint_seconds = kNow - 200;
  decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("small"));
  EXPECT_EQ(decision->plan->wasted_gpu_seconds, 800 + 1200);

  // Without a restart cost only the lost work counts.
  PreemptionOptions options;
  options.restart_cost_seconds = 0;
  decision = Find(Preemptor(1, 4), options);
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("big"));
  EXPECT_EQ(decision->plan->wasted_gpu_seconds, 0);
}

// A job's own minimum runtime (spec.preemption.minRuntime) replaces the search's.
TEST_F(PreemptionTest, JobsOwnMinimumRuntimeReplacesTheDefault) {
  Use(Leaves(1, 1, 8));
  RunningJob& patient = Hold("patient", {{0, {0, 1, 2, 3}}});
  patient.min_runtime_seconds = kNow + 1;
  RunningJob& eager = Hold("eager", {{0, {4, 5, 6, 7}}});
  eager.start_seconds = kNow - 10;
  eager.min_runtime_seconds = 0;
  PreemptionOptions options;
  options.min_runtime_seconds = 600;
  auto decision = Find(Preemptor(1, 4), options);
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("eager"));

  decision = Find(Preemptor(1, 8, "leaf"), options);
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_THAT(
      decision->reason,
      HasSubstr("leaf-a has 0 free, 4 preemptible, 4 of jobs within their minimum runtime"));

  running_[0].min_runtime_seconds = -1;
  EXPECT_THAT(
      Find(Preemptor(1, 4), options),
      StatusIs(StatusCode::kInvalidArgument,
               HasSubstr("running[0] (\"patient\").min_runtime_seconds: -1 (must be >= 0)")));
  options.restart_cost_seconds = -5;
  EXPECT_THAT(
      Find(Preemptor(1, 4), options),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("restart_cost_seconds: -5 (must be >= 0)")));
}

TEST_F(PreemptionTest, NonPreemptibleJobsAreNeverVictims) {
  Use(Leaves(1, 1, 8));
  Hold("pinned", {{0, {0, 1, 2, 3}}}).preemptible = false;
  Hold("costly", {{0, {4, 5, 6, 7}}}).lost_work_gpu_seconds = 1000000;
  running_[0].lost_work_gpu_seconds = 0;
  auto decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("costly"));

  decision = Find(Preemptor(1, 8, "leaf"));
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_EQ(decision->reason,
            "no leaf can be freed for job \"p\" (8 GPUs): leaf-a has 0 free, 4 preemptible, 4 of "
            "non-preemptible jobs");
}

TEST_F(PreemptionTest, EqualPriorityIsNotPreemptedAndCostTiesGoToTheSmallestIds) {
  Use(Leaves(1, 2, 4));
  Hold("b", {{0, {0, 1, 2, 3}}}, 3);
  Hold("a", {{1, {0, 1, 2, 3}}}, 3);
  Job preemptor = Preemptor(1, 4);
  for (int pass = 0; pass < 2; ++pass) {
    SCOPED_TRACE(pass);
    auto decision = Find(preemptor);
    ASSERT_OK(decision);
    ASSERT_TRUE(decision->plan.has_value());
    EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("a"));
    EXPECT_EQ(NodesOf(decision->plan->placements), (std::set<std::string>{"a1"}));
    std::reverse(running_.begin(), running_.end());
  }

  preemptor.priority = 3;
  auto decision = Find(preemptor);
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_EQ(decision->reason,
            "no running job may be preempted for job \"p\" (4 GPUs): 2 protected by the "
            "preemption rule");
}

TEST_F(PreemptionTest, FewerVictimsBreakTiesOfGpusAndLostWork) {
  Use(Leaves(1, 2, 4));
  Hold("one", {{0, {0, 1, 2, 3}}}).lost_work_gpu_seconds = 100;
  Hold("half-1", {{1, {0, 1}}}).lost_work_gpu_seconds = 50;
  Hold("half-2", {{1, {2, 3}}}).lost_work_gpu_seconds = 50;
  auto decision = Find(Preemptor(1, 4));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("one"));
}

TEST_F(PreemptionTest, NoEligibleVictimsSaysWhy) {
  Use(Leaves(1, 1, 8));
  auto decision = Find(Preemptor(1, 16));
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_THAT(decision->reason, HasSubstr("no job is running"));

  Hold("other-queue", {{0, {0, 1, 2, 3}}}).queue = QueueId("r");
  Hold("pinned", {{0, {4, 5}}}).preemptible = false;
  Hold("fresh", {{0, {6}}}).start_seconds = kNow;
  PreemptionOptions options;
  options.min_runtime_seconds = 60;
  decision = Find(Preemptor(1, 8), options);
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_EQ(decision->reason,
            "no running job may be preempted for job \"p\" (8 GPUs): 1 not preemptible, 1 "
            "started less than 1m ago, 1 protected by the preemption rule");
}

TEST_F(PreemptionTest, JobThatCannotFitEvenWithEveryVictimGone) {
  Use(Leaves(2, 1, 8));
  Hold("low", {{0, {0, 1, 2, 3}}});
  auto decision = Find(Preemptor(2, 8, "leaf"));
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_THAT(decision->reason, HasSubstr("leaf-a has 4 free, 4 preemptible"));
  EXPECT_THAT(decision->reason, HasSubstr("leaf-b has 8 free"));
  ASSERT_EQ(decision->details.size(), 2U);

  // Enough GPUs, but a 9-GPU task fits on no 8-GPU node.
  Use(Leaves(1, 2, 8));
  running_.clear();
  Hold("low", {{0, {0, 1, 2, 3, 4, 5, 6, 7}}});
  Hold("low2", {{1, {0, 1, 2, 3, 4, 5, 6, 7}}});
  decision = Find(Preemptor(1, 9));
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_THAT(decision->reason,
              HasSubstr("cluster: the job does not fit even with all 2 candidates (16 GPUs "
                        "there) preempted: room for 0 of its 1 tasks of 9 GPUs only"));

  // Room for the GPUs, but no node has the CPUs: the scheduler's reason is passed on.
  Job hungry = Preemptor(1, 8);
  hungry.groups[0].request.host.cpu_milli = 200000;
  decision = Find(hungry);
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
  EXPECT_THAT(decision->reason, HasSubstr("0/2 nodes can take a task"));
}

TEST_F(PreemptionTest, NvlinkDomainIsFreedInsideOneNode) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 8));
  for (int g = 4; g < 8; ++g) {
    cluster.nodes[0].gpus[g].nvlink_domain = 1;
  }
  Use(cluster);
  Hold("two", {{0, {0, 1}}});
  Hold("three", {{0, {4, 5, 6}}});
  auto decision = Find(Preemptor(1, 4, "nvlink-domain"));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_EQ(decision->plan->domain, "n/nvlink-0");
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("two"));
  ASSERT_EQ(decision->plan->placements.size(), 1U);
  for (const GpuAssignment& gpu : decision->plan->placements[0].gpus) {
    EXPECT_LT(gpu.gpu, 4);
  }
  ExpectPlanApplies(*decision->plan);
}

// One full node: a 3-, two 2- and a 1-GPU job. The job needs 4 GPUs: {a, d} or {b, c}, the latter
// losing less work. Greedy, most GPUs first, takes a then b and keeps both.
TEST_F(PreemptionTest, ExactSearchBeatsTheGreedyFallback) {
  Use(Leaves(1, 1, 8));
  Hold("a", {{0, {0, 1, 2}}}).lost_work_gpu_seconds = 10;
  Hold("b", {{0, {3, 4}}}).lost_work_gpu_seconds = 10;
  Hold("c", {{0, {5, 6}}}).lost_work_gpu_seconds = 10;
  Hold("d", {{0, {7}}}).lost_work_gpu_seconds = 100;
  auto exact = Find(Preemptor(1, 4));
  ASSERT_OK(exact);
  ASSERT_TRUE(exact->plan.has_value());
  EXPECT_THAT(VictimIds(exact->plan->victims), ElementsAre("b", "c"));
  EXPECT_EQ(exact->plan->preempted_gpu_milli, 4000);
  EXPECT_EQ(exact->plan->lost_work_gpu_seconds, 20);
  EXPECT_TRUE(exact->plan->proven_optimal);

  PreemptionOptions options;
  options.max_exact_candidates = 3;
  auto greedy = Find(Preemptor(1, 4), options);
  ASSERT_OK(greedy);
  ASSERT_TRUE(greedy->plan.has_value());
  EXPECT_THAT(VictimIds(greedy->plan->victims), ElementsAre("a", "b"));
  EXPECT_EQ(greedy->plan->preempted_gpu_milli, 5000);
  EXPECT_FALSE(greedy->plan->proven_optimal);
  ExpectPlanApplies(*greedy->plan);

  // One fit check finds {a, d}; proving {b, c} better would take a second.
  options = {};
  options.max_fit_checks_per_domain = 1;
  auto budget = Find(Preemptor(1, 4), options);
  ASSERT_OK(budget);
  ASSERT_TRUE(budget->plan.has_value());
  EXPECT_THAT(VictimIds(budget->plan->victims), ElementsAre("a", "d"));
  EXPECT_FALSE(budget->plan->proven_optimal);

  options = {};
  options.max_search_steps_per_domain = 1;
  budget = Find(Preemptor(1, 4), options);
  ASSERT_OK(budget);
  ASSERT_TRUE(budget->plan.has_value());
  EXPECT_THAT(VictimIds(budget->plan->victims), ElementsAre("a", "b"));
  EXPECT_FALSE(budget->plan->proven_optimal);
}

TEST_F(PreemptionTest, RuleDecidesAcrossQueues) {
  Use(Leaves(1, 1, 8));
  Hold("borrower", {{0, {0, 1, 2, 3}}}, 9).queue = QueueId("over");
  Hold("owner", {{0, {4, 5, 6, 7}}}, 0).queue = QueueId("within");
  // A queue within its guarantee reclaims from one over it, whatever the priorities.
  const PreemptionRule reclaim = [](const Job& preemptor, const RunningJob& victim) {
    return preemptor.queue.value() == "within" && victim.queue.value() == "over";
  };
  Job preemptor = Preemptor(1, 4);
  preemptor.queue = QueueId("within");
  preemptor.priority = 0;
  auto decision = Find(preemptor, {}, reclaim);
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("borrower"));
}

TEST_F(PreemptionTest, FindLeavesTheSnapshotAsItWas) {
  Use(Leaves(2, 2, 8));
  Hold("x", {{0, {0, 1, 2, 3}}, {2, {0, 1, 2, 3}}});
  Hold("y", {{1, {0, 1, 2, 3, 4, 5, 6, 7}}});
  Hold("z", {{3, {0, 1, 2, 3, 4, 5}}});
  std::vector<int64_t> before;
  for (const auto& node : snapshot_->nodes()) {
    for (const auto& gpu : node.gpus) {
      before.push_back(gpu.free_milli);
    }
  }
  auto decision = Find(Preemptor(2, 8, "leaf"));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  std::vector<int64_t> after;
  for (const auto& node : snapshot_->nodes()) {
    for (const auto& gpu : node.gpus) {
      after.push_back(gpu.free_milli);
    }
  }
  EXPECT_EQ(after, before);
}

TEST_F(PreemptionTest, BadOptionsAndInputsAreErrors) {
  Use(Leaves(1, 2, 8));
  PreemptionOptions options;
  options.min_runtime_seconds = -5;
  EXPECT_THAT(Find(Preemptor(1, 1), options),
              StatusIs(StatusCode::kInvalidArgument, "min_runtime_seconds: -5 (must be >= 0)"));
  options = {};
  options.max_exact_candidates = 65;
  EXPECT_THAT(Find(Preemptor(1, 1), options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_exact_candidates: 65")));
  options = {};
  options.max_fit_checks_per_domain = 0;
  EXPECT_THAT(Find(Preemptor(1, 1), options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_fit_checks_per_domain: 0")));
  options = {};
  options.max_search_steps_per_domain = 0;
  EXPECT_THAT(Find(Preemptor(1, 1), options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_search_steps_per_domain: 0")));
  EXPECT_THAT(Find(Preemptor(1, 1), {}, PreemptionRule()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("may_preempt")));

  EXPECT_THAT(Find(Preemptor(1, 1, "rack")),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("preemptor.topology.required_level: unknown level \"rack\"")));
  EXPECT_THAT(Find(Preemptor(0, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("preemptor: ")));

  Hold("j", {{0, {0}}});
  running_.push_back(running_[0]);
  EXPECT_THAT(Find(Preemptor(1, 1)),
              StatusIs(StatusCode::kInvalidArgument,
                       "running[1].id: \"j\" is listed twice (also running[0])"));
  running_.pop_back();
  running_[0].start_seconds = kNow + 1;
  EXPECT_THAT(Find(Preemptor(1, 1)),
              StatusIs(StatusCode::kInvalidArgument,
                       "running[0] (\"j\").start_seconds: 10001 is after now_seconds 10000"));
  running_[0].start_seconds = 0;
  running_[0].lost_work_gpu_seconds = -1;
  EXPECT_THAT(Find(Preemptor(1, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("lost_work_gpu_seconds: -1")));
  running_[0].lost_work_gpu_seconds.reset();
  running_[0].placements[0].node = 7;
  EXPECT_THAT(Find(Preemptor(1, 1)),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("running[0] (\"j\").placements[0].node: index 7 out of range")));
  // A placement the snapshot does not hold (GPU 1 of a0 is free) would corrupt the search.
  running_[0].placements[0].node = 0;
  running_[0].placements[0].gpus[0].gpu = 1;
  EXPECT_THAT(Find(Preemptor(1, 1)),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("on node a0 gpu 1 but the snapshot has 0 allocated")));
  running_[0].placements[0].gpus[0].gpu = 0;
  running_[0].id = JobId("p");
  EXPECT_THAT(Find(Preemptor(1, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("is the preemptor itself")));
}

// Queue-tree rule: `gpus` whole H100s of queue `queue` at `priority`, as preemptor or victim.
Job QueueJob(const std::string& queue, int gpus, int priority = 0) {
  Job job = MakeJob("p", 1, WholeGpus{gpus});
  job.queue = QueueId(queue);
  job.priority = priority;
  return job;
}

RunningJob VictimIn(const std::string& queue, int priority = 0) {
  RunningJob victim;
  victim.id = JobId("v");
  victim.queue = QueueId(queue);
  victim.priority = priority;
  return victim;
}

QueueTree TreeOf(std::vector<QueueSpec> specs,
                 const std::vector<std::tuple<std::string, std::string, int64_t>>& charges) {
  auto tree = QueueTree::Create(std::move(specs));
  EXPECT_OK(tree);
  for (const auto& [job, queue, milli] : charges) {
    EXPECT_OK(tree->Charge(JobId(job), QueueId(queue), {{"H100-80GB", milli}}));
  }
  return std::move(tree).value();
}

PreemptionRule MustRule(const QueueTree& tree, const std::string& queue) {
  auto rule = QueueTreeRule(tree, QueueId(queue));
  EXPECT_OK(rule);
  return std::move(rule).value();
}

const GpuMilliByModel kEightH100 = {{"H100-80GB", 8000}};

TEST(QueueTreeRule, QueueWithinItsGuaranteeReclaimsFromASiblingOverIts) {
  // team-a holds 12 of its 8 GPUs, team-b 2 of its 8.
  const QueueTree tree = TreeOf({{"team-a", kEightH100}, {"team-b", kEightH100}},
                                {{"a1", "team-a", 12000}, {"b1", "team-b", 2000}});
  const PreemptionRule b = MustRule(tree, "team-b");
  EXPECT_TRUE(b(QueueJob("team-b", 6), VictimIn("team-a", 5)));
  // Whatever the priorities: a reclaim is about quota.
  EXPECT_TRUE(b(QueueJob("team-b", 1, -3), VictimIn("team-a", 100)));
  // 7 GPUs would make team-b borrow 1: no reclaim, or team-a could reclaim it back.
  EXPECT_FALSE(b(QueueJob("team-b", 7), VictimIn("team-a")));
  // A queue over its guarantee reclaims nothing.
  const PreemptionRule a = MustRule(tree, "team-a");
  EXPECT_FALSE(a(QueueJob("team-a", 1, 9), VictimIn("team-b")));
}

TEST(QueueTreeRule, QueueThatHoldsItsGuaranteeReclaimsNothing) {
  const QueueTree tree = TreeOf({{"team-a", kEightH100}, {"team-b", kEightH100}},
                                {{"a1", "team-a", 12000}, {"b1", "team-b", 8000}});
  const PreemptionRule b = MustRule(tree, "team-b");
  EXPECT_FALSE(b(QueueJob("team-b", 1), VictimIn("team-a")));
  // Within the queue, priority still rules.
  EXPECT_TRUE(b(QueueJob("team-b", 1, 1), VictimIn("team-b", 0)));
}

TEST(QueueTreeRule, WithinAQueueOnlyAHigherPriorityPreempts) {
  const QueueTree tree = TreeOf({{"team", kEightH100}}, {{"t1", "team", 4000}});
  const PreemptionRule rule = MustRule(tree, "team");
  EXPECT_TRUE(rule(QueueJob("team", 1, 5), VictimIn("team", 4)));
  EXPECT_FALSE(rule(QueueJob("team", 1, 5), VictimIn("team", 5)));
  EXPECT_FALSE(rule(QueueJob("team", 1, 5), VictimIn("team", 6)));
  // A queue the tree does not know is never a victim.
  EXPECT_FALSE(rule(QueueJob("team", 1, 5), VictimIn("elsewhere", 0)));
}

TEST(QueueTreeRule, NestedQueuesReclaimOnlyWhatIsBorrowedAllTheWayDown) {
  // org-a is over its guarantee because org-a/spare borrows; org-a/core holds only its own.
  const QueueTree tree = TreeOf(
      {{"org-a", {{"H100-80GB", 8000}}},
       {"org-a/core", {{"H100-80GB", 8000}}},
       {"org-a/spare"},
       {"org-b", {{"H100-80GB", 8000}}},
       {"org-b/team", {{"H100-80GB", 8000}}},
       {"org-b/other"}},
      {{"core", "org-a/core", 8000}, {"spare", "org-a/spare", 4000}, {"own", "org-a", 1000}});
  // org-b/team reclaims from its parent's sibling org-a (distance 1).
  const PreemptionRule team = MustRule(tree, "org-b/team");
  EXPECT_TRUE(team(QueueJob("org-b/team", 8), VictimIn("org-a/spare")));
  EXPECT_TRUE(team(QueueJob("org-b/team", 8), VictimIn("org-a")));
  EXPECT_FALSE(team(QueueJob("org-b/team", 8), VictimIn("org-a/core")));
  // Nor from a queue that merely shares a prefix, nor from its sibling holding nothing.
  EXPECT_FALSE(team(QueueJob("org-b/team", 8), VictimIn("org-a-x")));
  EXPECT_FALSE(team(QueueJob("org-b/team", 8), VictimIn("org-b/other")));
  EXPECT_FALSE(team(QueueJob("org-b/team", 9), VictimIn("org-a/spare")));
  EXPECT_THAT(QueueTreeRule(tree, QueueId("org-c")), StatusIs(StatusCode::kNotFound));
}

TEST_F(PreemptionTest, QueueTreeRuleReclaimsTheBorrowedGpusInOneSearch) {
  Use(Leaves(1, 1, 8));
  Hold("borrowed", {{0, {0, 1, 2, 3}}}, 9).queue = QueueId("team-a");
  Hold("guaranteed", {{0, {4, 5, 6, 7}}}, 0).queue = QueueId("team-a");
  // team-a's borrowed half is not marked as such: the search takes either; ties go to the
  // smaller id.
  const QueueTree tree =
      TreeOf({{"team-a", {{"H100-80GB", 4000}}}, {"team-b", {{"H100-80GB", 4000}}}},
             {{"borrowed", "team-a", 4000}, {"guaranteed", "team-a", 4000}});
  auto decision = Find(QueueJob("team-b", 4), {}, MustRule(tree, "team-b"));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value());
  EXPECT_THAT(VictimIds(decision->plan->victims), ElementsAre("borrowed"));
  EXPECT_EQ(decision->plan->preempted_gpu_milli, 4000);
  // Five GPUs would make team-b borrow: no plan.
  decision = Find(QueueJob("team-b", 5), {}, MustRule(tree, "team-b"));
  ASSERT_OK(decision);
  EXPECT_FALSE(decision->plan.has_value());
}

// Brute force: every subset of the eligible jobs, cheapest first, each checked by the scheduler on
// a fresh snapshot of the whole cluster without the subset. Returns the cheapest that fits.
struct BruteForceCost {
  int64_t wasted = 0;
  int64_t gpu_milli = 0;
  int64_t lost_work = 0;
  int victims = 0;
  friend auto operator<=>(const BruteForceCost&, const BruteForceCost&) = default;
};

std::optional<BruteForceCost> BruteForceOptimum(const Cluster& cluster, const GpuCatalog& catalog,
                                                Scheduler& scheduler, const Job& preemptor,
                                                const std::vector<RunningJob>& running,
                                                const std::vector<int>& eligible) {
  std::vector<std::pair<BruteForceCost, uint32_t>> subsets;
  for (uint32_t mask = 0; mask < (1U << eligible.size()); ++mask) {
    BruteForceCost cost;
    for (size_t e = 0; e < eligible.size(); ++e) {
      if ((mask >> e) & 1U) {
        const RunningJob& job = running[eligible[e]];
        int64_t milli = 0;
        for (const TaskPlacement& placement : job.placements) {
          for (const GpuAssignment& gpu : placement.gpus) {
            milli += gpu.milli;
          }
        }
        const int64_t since =
            std::max(job.start_seconds, job.last_checkpoint_seconds.value_or(job.start_seconds));
        cost.gpu_milli += milli;
        cost.lost_work += milli * (kNow - since) / 1000;
        ++cost.victims;
      }
    }
    cost.wasted = cost.lost_work + cost.gpu_milli * PreemptionOptions{}.restart_cost_seconds / 1000;
    subsets.emplace_back(cost, mask);
  }
  std::sort(subsets.begin(), subsets.end());
  for (const auto& [cost, mask] : subsets) {
    auto fresh = ClusterSnapshot::Build(cluster, catalog);
    EXPECT_OK(fresh);
    for (size_t j = 0; j < running.size(); ++j) {
      const auto e = std::find(eligible.begin(), eligible.end(), static_cast<int>(j));
      if (e != eligible.end() && ((mask >> (e - eligible.begin())) & 1U)) {
        continue;
      }
      for (const TaskPlacement& placement : running[j].placements) {
        EXPECT_OK(fresh->Apply(placement));
      }
    }
    Random random(1);
    if (scheduler.Schedule(preemptor, *fresh, random).scheduled()) {
      return cost;
    }
  }
  return std::nullopt;
}

// 2-4 leaves of 2-4 nodes with 4-8 GPUs each, filled with single tasks, fractional tasks and
// gangs (half of them spread over leaves), at random priorities and ages; the preemptor needs a
// leaf, a node or just room. At most 8 jobs are eligible, so the brute force stays small.
TEST(PreemptionRandomTest, MatchesTheBruteForceOptimumOnSmallClusters) {
  const GpuCatalog catalog = GpuCatalog::Default();
  auto scheduler = Scheduler::Create({}, PluginRegistry::Default());
  ASSERT_OK(scheduler);
  auto oracle = Scheduler::Create({}, PluginRegistry::Default());
  ASSERT_OK(oracle);
  PreemptionOptions options;
  options.min_runtime_seconds = 300;
  const PreemptionRule rule = HigherPriorityInSameQueue();
  auto search = PreemptionSearch::Create(**scheduler, rule, options);
  ASSERT_OK(search);

  int plans_with_victims = 0;
  int no_plan = 0;
  int spanning_victims = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SCOPED_TRACE(seed);
    Random random(seed);
    Cluster cluster;
    cluster.topology = Topology({"leaf"});
    const int leaves = 2 + static_cast<int>(random.Uniform(3));
    const int nodes = 2 + static_cast<int>(random.Uniform(3));
    for (int l = 0; l < leaves; ++l) {
      for (int n = 0; n < nodes; ++n) {
        Node node = MakeNode(fmt::format("l{}n{}", l, n), 4 + static_cast<int>(random.Uniform(5)),
                             "H100-80GB", {fmt::format("leaf-{}", l)});
        node.fault_domains["leaf"] = fmt::format("leaf-{}", l);
        cluster.nodes.push_back(std::move(node));
      }
    }
    auto built = ClusterSnapshot::Build(cluster, catalog);
    ASSERT_OK(built);
    ClusterSnapshot snapshot = std::move(built).value();

    Job preemptor;
    switch (random.Uniform(3)) {
      case 0:
        preemptor = Preemptor(2 + static_cast<int>(random.Uniform(nodes - 1)),
                              2 + static_cast<int>(random.Uniform(3)), "leaf");
        break;
      case 1:
        preemptor = Preemptor(1 + static_cast<int>(random.Uniform(2)),
                              2 + static_cast<int>(random.Uniform(3)), "node");
        break;
      default:
        preemptor = Preemptor(1 + static_cast<int>(random.Uniform(3)),
                              1 + static_cast<int>(random.Uniform(8)));
        break;
    }
    preemptor.priority = 1 + static_cast<int>(random.Uniform(3));

    std::vector<RunningJob> running;
    std::vector<int> eligible;
    for (int attempt = 0; attempt < 40; ++attempt) {
      const std::string id = fmt::format("j{:02}", attempt);
      Job job;
      switch (random.Uniform(4)) {
        case 0:
          job = MakeJob(id, 1, FractionalGpu{250 * (1 + static_cast<int64_t>(random.Uniform(3)))});
          break;
        case 1:
          job = MakeJob(id, 2 + static_cast<int>(random.Uniform(2)),
                        WholeGpus{1 + static_cast<int>(random.Uniform(4))});
          if (random.Uniform(2) == 0) {
            job.spread = {"leaf", 1};
          }
          break;
        default:
          job = MakeJob(id, 1, WholeGpus{1 + static_cast<int>(random.Uniform(6))});
          break;
      }
      ScheduleResult result = (*scheduler)->Schedule(job, snapshot, random);
      if (!result.scheduled()) {
        continue;
      }
      RunningJob running_job;
      running_job.id = job.id;
      running_job.queue = QueueId("q");
      running_job.priority = static_cast<int>(random.Uniform(3));
      running_job.preemptible = random.Uniform(8) != 0;
      running_job.start_seconds = kNow - static_cast<int64_t>(random.Uniform(3000));
      if (random.Uniform(2) == 0) {
        running_job.last_checkpoint_seconds =
            running_job.start_seconds + static_cast<int64_t>(random.Uniform(3000));
        running_job.last_checkpoint_seconds = std::min(kNow, *running_job.last_checkpoint_seconds);
      }
      running_job.placements = result.placements;
      const bool is_eligible = running_job.preemptible &&
                               kNow - running_job.start_seconds >= options.min_runtime_seconds &&
                               rule(preemptor, running_job);
      if (is_eligible && eligible.size() == 8) {
        for (const TaskPlacement& placement : result.placements) {
          snapshot.Release(placement);
        }
        continue;
      }
      if (is_eligible) {
        eligible.push_back(static_cast<int>(running.size()));
      }
      running.push_back(std::move(running_job));
    }

    Random search_random(seed);
    auto decision = search->Find(snapshot, preemptor, running, kNow, search_random);
    ASSERT_OK(decision);
    const std::optional<BruteForceCost> optimum =
        BruteForceOptimum(cluster, catalog, **oracle, preemptor, running, eligible);
    ASSERT_EQ(decision->plan.has_value(), optimum.has_value()) << decision->reason;
    if (!optimum) {
      ++no_plan;
      continue;
    }
    const PreemptionPlan& plan = *decision->plan;
    EXPECT_TRUE(plan.proven_optimal);
    EXPECT_EQ(plan.wasted_gpu_seconds, optimum->wasted);
    EXPECT_EQ(plan.preempted_gpu_milli, optimum->gpu_milli);
    EXPECT_EQ(plan.lost_work_gpu_seconds, optimum->lost_work);
    EXPECT_EQ(static_cast<int>(plan.victims.size()), optimum->victims);
    if (plan.victims.empty()) {
      continue;
    }
    ++plans_with_victims;
    // The placements apply once the victims are gone, all inside the plan's domain.
    ClusterSnapshot after = snapshot.Clone();
    std::set<std::string> victim_leaves;
    for (const RunningJob& job : running) {
      if (std::find(plan.victims.begin(), plan.victims.end(), job.id) == plan.victims.end()) {
        continue;
      }
      std::set<std::string> leaves_of_job;
      for (const TaskPlacement& placement : job.placements) {
        after.Release(placement);
        leaves_of_job.insert(after.nodes()[placement.node].node->topology[0]);
      }
      spanning_victims += leaves_of_job.size() > 1 ? 1 : 0;
    }
    for (const TaskPlacement& placement : plan.placements) {
      EXPECT_OK(after.Apply(placement));
      if (preemptor.topology.required_level == "leaf") {
        EXPECT_EQ(after.nodes()[placement.node].node->topology[0], plan.domain);
      }
    }
  }
  // The cases exercise what they claim to.
  EXPECT_GE(plans_with_victims, 60);
  EXPECT_GE(no_plan, 5);
  EXPECT_GE(spanning_victims, 5);
}

// Issue 37 item 6: an elastic job above its minimum gives up its highest ranks before a job of
// its priority is preempted whole, even one whose stop would waste less (it saved just now).
TEST_F(PreemptionTest, AnElasticJobShrinksBeforeAJobOfItsPriorityIsPreemptedWhole) {
  Use(Leaves(1, 2, 8));
  Hold("whole", {{1, {0, 1, 2, 3, 4, 5, 6, 7}}});
  std::vector<std::pair<int, std::vector<int>>> ranks;
  for (int gpu = 0; gpu < 8; ++gpu) {
    ranks.push_back({0, {gpu}});
  }
  Hold("elastic", ranks);
  running_[0].last_checkpoint_seconds = kNow;
  running_[1].releasable_tasks = 6;  // min 2, runs at 8

  auto decision = Find(Preemptor(4, 1));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_TRUE(decision->plan->victims.empty()) << "no job stops whole";
  EXPECT_THAT(decision->plan->shrinks, ElementsAre(Shrink{JobId("elastic"), 4}))
      << "as few tasks as the preemptor needs";
  EXPECT_EQ(decision->plan->preempted_gpu_milli, 4000);
  EXPECT_EQ(NodesOf(decision->plan->placements), std::set<std::string>{"a0"});
  // The preemptor goes where ranks 4..7 were: the plan applies once they alone are released.
  ClusterSnapshot copy = snapshot_->Clone();
  for (const TaskPlacement& placement : running_[1].placements) {
    if (placement.replica >= 4) {
      copy.Release(placement);
    }
  }
  for (const TaskPlacement& placement : decision->plan->placements) {
    EXPECT_OK(copy.Apply(placement));
  }

  // Not elastic, the same job is no cheaper victim than the other.
  running_[1].releasable_tasks = 0;
  decision = Find(Preemptor(4, 1));
  ASSERT_OK(decision);
  ASSERT_TRUE(decision->plan.has_value()) << decision->reason;
  EXPECT_TRUE(decision->plan->shrinks.empty());
  EXPECT_EQ(decision->plan->victims.size(), 1u);

  // A shrink leaves at least one task.
  running_[1].releasable_tasks = 8;
  EXPECT_THAT(Find(Preemptor(4, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("releasable_tasks: 8")));
}

}  // namespace
}  // namespace gpufleet::policy
