// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/explain.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/policy/never_fits.h"
#include "gpufleet/scheduler/devices.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::TaskPlacement;
using scheduler::testing::MakeJob;
using scheduler::testing::MakeNode;
using ::testing::HasSubstr;

// Two leaves of one node of 8 H100s each (node-0 in leaf-0, node-1 in leaf-1), one block.
Cluster TwoLeaves() {
  Cluster cluster;
  cluster.topology = Topology({"block", "leaf"});
  for (int n = 0; n < 2; ++n) {
    cluster.nodes.push_back(MakeNode(fmt::format("node-{}", n), 8, "H100-80GB",
                                     {"block-0", fmt::format("leaf-{}", n)}));
  }
  return cluster;
}

Job Gang(const std::string& id, int tasks, int gpus_each, const std::string& required = "") {
  Job job = MakeJob(id, tasks, WholeGpus{gpus_each});
  job.topology.required_level = required;
  return job;
}

class ExplainTest : public ::testing::Test {
 public:
  void Use(Cluster cluster) {
    auto snapshot = ClusterSnapshot::Build(std::move(cluster), catalog_);
    ASSERT_OK(snapshot);
    snapshot_.emplace(std::move(snapshot).value());
    auto made = scheduler::Scheduler::Create(scheduler::SchedulerOptions{},
                                             scheduler::PluginRegistry::Default());
    ASSERT_OK(made);
    scheduler_ = std::move(made).value();
  }

  // A job holding `gpus` idle GPUs of node `node` from `start` on, with its estimate.
  void Hold(const std::string& id, int node, int gpus, int64_t start, int64_t estimate) {
    const TaskPlacement placement = scheduler::testing::IdleGpusPlacement(*snapshot_, node, gpus);
    ASSERT_OK(snapshot_->Apply(placement));
    running_.push_back({.id = JobId(id),
                        .start_seconds = start,
                        .estimate_seconds = estimate,
                        .placements = {placement}});
  }

  Explanation Ask(const Job& job, PlacementCheck quota = {}, PlacementCheck reservation = {},
                  std::vector<const Job*> ahead = {}) {
    const int64_t allocated = snapshot_->AllocatedGpuMilli();
    ExplainInput input{.job = &job,
                       .ahead = std::move(ahead),
                       .running = running_,
                       .now_seconds = 10,
                       .quota = std::move(quota),
                       .reservation = std::move(reservation)};
    Result<Explanation> explained = Explain(*scheduler_, *snapshot_, input, random_);
    EXPECT_OK(explained);
    // The snapshot is left as it was.
    EXPECT_EQ(snapshot_->AllocatedGpuMilli(), allocated);
    return explained.ok() ? *explained : Explanation{};
  }

  // Every what-if that says it would start does start: the changed job is placed.
  void ExpectWhatIfsHold(const Explanation& explained) {
    for (const WhatIf& what_if : explained.what_ifs) {
      SCOPED_TRACE(what_if.change);
      const scheduler::ScheduleResult result =
          scheduler_->Schedule(what_if.job, *snapshot_, random_);
      EXPECT_EQ(result.scheduled(), what_if.would_start_now) << what_if.detail;
      for (auto it = result.placements.rbegin(); it != result.placements.rend(); ++it) {
        snapshot_->Revert(*it);
      }
    }
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::vector<RunningJob> running_;
  Random random_{1};
};

TEST(PendingReasonName, NamesEveryReason) {
  EXPECT_STREQ(PendingReasonName(PendingReason::kNone), "none");
  EXPECT_STREQ(PendingReasonName(PendingReason::kNever), "never");
  EXPECT_STREQ(PendingReasonName(PendingReason::kQuota), "quota");
  EXPECT_STREQ(PendingReasonName(PendingReason::kCapacity), "capacity");
  EXPECT_STREQ(PendingReasonName(PendingReason::kTopology), "topology");
  EXPECT_STREQ(PendingReasonName(PendingReason::kConstraints), "constraints");
  EXPECT_STREQ(PendingReasonName(PendingReason::kHealth), "health");
  EXPECT_STREQ(PendingReasonName(PendingReason::kReservation), "reservation");
}

// One row per reason: the cluster's state, the job, what explain must say.
TEST_F(ExplainTest, EachReasonWithItsEvidence) {
  struct Row {
    std::string name;
    std::function<void(ExplainTest&)> setup;
    Job job;
    bool refuse_quota = false;
    bool refuse_reservation = false;
    PendingReason want;
    std::string message_has;
  };
  Job h200 = Gang("h200", 1, 1);
  h200.allowed_gpu_models = {"H200-141GB"};
  // Each task fits a node, but no node holds two: three tasks on two nodes.
  const Job cpu_bound = MakeJob("cpu-bound", 3, WholeGpus{1}, {60000, 1024});
  const std::vector<Row> rows = {
      {"fits", [](ExplainTest&) {}, Gang("small", 1, 4), false, false, PendingReason::kNone,
       "fits now"},
      {"capacity",
       [](ExplainTest& t) {
         t.Hold("a", 0, 8, 0, 100);
         t.Hold("b", 1, 4, 0, 200);
       },
       Gang("big", 2, 8), false, false, PendingReason::kCapacity, "needs 16 GPUs and 4"},
      {"topology",
       [](ExplainTest& t) {
         t.Hold("a", 0, 4, 0, 100);
         t.Hold("b", 1, 4, 0, 100);
       },
       Gang("ring", 8, 1, "leaf"), false, false, PendingReason::kTopology,
       "8 GPUs are free in total, but no leaf holds the whole gang of 8 GPUs; the best, "
       "block-0/leaf-0, "
       "has 4 free and lacks 4"},
      {"topology never", [](ExplainTest&) {}, Gang("wide", 2, 8, "leaf"), false, false,
       PendingReason::kTopology, "no leaf can ever hold the whole gang of 16 GPUs"},
      {"never: a model the fleet lacks", [](ExplainTest&) {}, h200, false, false,
       PendingReason::kNever,
       "never fits: GPU model H200-141GB: the fleet has none (it has H100-80GB)"},
      {"never: larger than the fleet", [](ExplainTest&) {}, Gang("huge", 3, 8), false, false,
       PendingReason::kNever, "never fits: 24 GPUs in all: the nodes it may use have 16"},
      {"never: more GPUs per task than any node", [](ExplainTest&) {}, Gang("wide", 1, 16), false,
       false, PendingReason::kNever,
       "never fits: task workers: 16 GPUs per task: the largest node it may use, node-0, has 8 "
       "H100-80GB"},
      {"constraints", [](ExplainTest&) {}, cpu_bound, false, false, PendingReason::kConstraints,
       "no set of nodes it may use can hold it"},
      {"quota", [](ExplainTest&) {}, Gang("q", 1, 1), true, false, PendingReason::kQuota,
       "quota refuses it: over the limit"},
      {"reservation", [](ExplainTest&) {}, Gang("r", 1, 1), false, true,
       PendingReason::kReservation, "it fits now, but would delay the head"},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.name);
    running_.clear();
    Use(TwoLeaves());
    row.setup(*this);
    const PlacementCheck quota = [](const Job&, const std::vector<TaskPlacement>&,
                                    const ClusterSnapshot&) -> std::optional<std::string> {
      return "over the limit";
    };
    const PlacementCheck reservation = [](const Job&, const std::vector<TaskPlacement>&,
                                          const ClusterSnapshot&) -> std::optional<std::string> {
      return "would delay the head";
    };
    const Explanation explained = Ask(row.job, row.refuse_quota ? quota : PlacementCheck(),
                                      row.refuse_reservation ? reservation : PlacementCheck());
    EXPECT_EQ(PendingReasonName(explained.reason), PendingReasonName(row.want));
    EXPECT_THAT(explained.message, HasSubstr(row.message_has));
    ExpectWhatIfsHold(explained);
  }
}

// An MPS share that has the room only on a GPU of time-sliced shares is told that conflict, not
// that GPUs are short (issue 40's rule: the two kinds never share a GPU).
TEST_F(ExplainTest, CapacityNamesTheConflictOfMpsAndTimeSlicedShares) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("node-0", 1, "H100-80GB"));
  Use(std::move(cluster));
  const TaskPlacement sliced{0, 0, 0, {}, {{0, 250, 0, "", -1, false, false}}};
  ASSERT_OK(snapshot_->Apply(sliced));
  running_.push_back(
      {.id = JobId("sliced"), .start_seconds = 0, .estimate_seconds = 100, .placements = {sliced}});
  const Explanation explained = Ask(MakeJob("mps", 1, FractionalGpu{250, 0, GpuSharing::kMps}));
  EXPECT_EQ(explained.reason, PendingReason::kCapacity);
  EXPECT_THAT(explained.scheduler_reason, HasSubstr(scheduler::kMpsMeetsTimeSlicedReason));
  EXPECT_THAT(explained.message,
              HasSubstr("0.75 of the GPUs it may use are free, but the GPUs with room hold "
                        "time-sliced shares, which an MPS share cannot join"));
  EXPECT_THAT(explained.scheduler_reason, ::testing::Not(HasSubstr("insufficient free GPUs")));
}

// A job no node could ever hold is told so, with no ETA, and only what-ifs that could help.
TEST_F(ExplainTest, NeverOffersOnlyWhatIfsThatCanHelp) {
  Use(TwoLeaves());
  Job job = Gang("h200", 2, 4);
  job.allowed_gpu_models = {"H200-141GB"};
  const Explanation explained = Ask(job);
  ASSERT_EQ(explained.reason, PendingReason::kNever);
  EXPECT_FALSE(explained.eta_seconds.has_value());
  EXPECT_THAT(explained.eta_why, HasSubstr("checked again when nodes join"));
  // Fewer GPUs on a model the fleet lacks cannot help; another model can.
  ASSERT_EQ(explained.what_ifs.size(), 1u);
  EXPECT_EQ(explained.what_ifs[0].change, "on H100-80GB");
  EXPECT_TRUE(explained.what_ifs[0].would_start_now);
  ExpectWhatIfsHold(explained);
}

// A task of 16 GPUs on nodes of 8, with GPUs busy: no node "lacks free resources" (freeing them
// would not help), no domain is said to lack GPUs, and the only what-if is one after which a
// node could hold it.
TEST_F(ExplainTest, NeverSaysNothingThatFreedGpusWouldHelp) {
  Use(TwoLeaves());
  Hold("a", 0, 4, 0, 100);
  Hold("b", 1, 6, 0, 100);
  const Explanation explained = Ask(Gang("wide", 1, 16, "leaf"));
  ASSERT_EQ(explained.reason, PendingReason::kNever);
  EXPECT_EQ(explained.nodes.capacity, 0);
  EXPECT_EQ(explained.nodes.fits, 0);
  EXPECT_EQ(explained.nodes.constraints, 2) << "both nodes are too small for one task";
  EXPECT_FALSE(explained.best_domain.has_value());
  ASSERT_FALSE(explained.what_ifs.empty());
  for (const WhatIf& what_if : explained.what_ifs) {
    SCOPED_TRACE(what_if.change);
    EXPECT_FALSE(CheckNeverFits(what_if.job, *snapshot_).has_value());
  }
  EXPECT_EQ(explained.what_ifs[0].change, "with 8 GPUs instead of 16");
  ExpectWhatIfsHold(explained);

  // 32 GPUs in a leaf of 8 on a fleet of 16: halved to 16 the gang would fit the fleet but still
  // no leaf, so that what-if is left out; halved again it fits a leaf once GPUs there are free,
  // and once more it starts now.
  const Explanation gang = Ask(Gang("gang", 4, 8, "leaf"));
  ASSERT_EQ(gang.reason, PendingReason::kNever);
  std::vector<std::string> changes;
  for (const WhatIf& what_if : gang.what_ifs) {
    changes.push_back(what_if.change);
  }
  EXPECT_EQ(changes,
            (std::vector<std::string>{"with 8 GPUs instead of 32", "with 4 GPUs instead of 32"}));
}

TEST_F(ExplainTest, HealthWhenUnhealthyGpusAreWhatIsMissing) {
  Cluster cluster = TwoLeaves();
  cluster.nodes[1].state = NodeState::kNotReady;
  for (int g = 0; g < 4; ++g) {
    cluster.nodes[0].gpus[g].health = GpuHealth::kUnhealthy;
  }
  Use(std::move(cluster));
  const Explanation explained = Ask(Gang("eight", 1, 8));
  EXPECT_EQ(explained.reason, PendingReason::kHealth);
  EXPECT_THAT(explained.message, HasSubstr("only 4 are healthy on Ready nodes"));
  EXPECT_EQ(explained.nodes.health, 1);
  EXPECT_EQ(explained.nodes.capacity, 1);
  EXPECT_FALSE(explained.eta_seconds.has_value());
  EXPECT_THAT(explained.eta_why, HasSubstr("unknown"));
}

TEST_F(ExplainTest, TopologyEvidenceNamesTheBestDomainAndWhatIfsStartIt) {
  Use(TwoLeaves());
  Hold("a", 0, 4, 0, 100);
  Hold("b", 1, 4, 0, 100);
  const Explanation explained = Ask(Gang("ring", 8, 1, "leaf"));
  ASSERT_EQ(explained.reason, PendingReason::kTopology);
  ASSERT_TRUE(explained.best_domain.has_value());
  EXPECT_EQ(explained.best_domain->name, "block-0/leaf-0");  // the path
  EXPECT_EQ(explained.best_domain->free_gpu_milli, 4000);
  EXPECT_EQ(explained.best_domain->needed_gpu_milli, 8000);
  // Coarser levels and fewer GPUs are offered; the block holds it now.
  ASSERT_FALSE(explained.what_ifs.empty());
  EXPECT_EQ(explained.what_ifs[0].change, "topology.required=block");
  EXPECT_TRUE(explained.what_ifs[0].would_start_now);
  bool fewer = false;
  for (const WhatIf& what_if : explained.what_ifs) {
    fewer = fewer || (what_if.change == "with 4 GPUs instead of 8" && what_if.would_start_now);
  }
  EXPECT_TRUE(fewer);
  ExpectWhatIfsHold(explained);
  // Both leaves free at 100: the plan starts it then.
  ASSERT_TRUE(explained.eta_seconds.has_value());
  EXPECT_EQ(*explained.eta_seconds, 100);
}

TEST_F(ExplainTest, OtherModelWhatIf) {
  Cluster cluster = TwoLeaves();
  cluster.nodes[1] = MakeNode("node-1", 8, "H200-141GB", {"block-0", "leaf-1"});
  Use(std::move(cluster));
  Hold("a", 0, 8, 0, 0);
  Job job = Gang("h100", 1, 8);
  job.allowed_gpu_models = {"H100-80GB"};
  const Explanation explained = Ask(job);
  EXPECT_EQ(explained.reason, PendingReason::kCapacity);
  bool other_model = false;
  for (const WhatIf& what_if : explained.what_ifs) {
    other_model = other_model || (what_if.change == "on H200-141GB" && what_if.would_start_now);
  }
  EXPECT_TRUE(other_model);
  ExpectWhatIfsHold(explained);
  // The job on node-0 has no estimate: no ETA, and why.
  EXPECT_FALSE(explained.eta_seconds.has_value());
  EXPECT_THAT(explained.eta_why, HasSubstr("1 running job(s) without a runtimeEstimate"));
}

// The ETA plan starts the jobs ahead first, each for its estimate, then this one.
TEST_F(ExplainTest, EtaFollowsTheJobsAheadAndTheirEstimates) {
  Use(TwoLeaves());
  Hold("a", 0, 8, 0, 100);  // ends at 100
  Hold("b", 1, 8, 0, 300);  // ends at 300
  Job ahead = Gang("ahead", 1, 8);
  ahead.runtime_estimate = std::chrono::seconds(500);  // node-0 from 100 to 600
  const Job job = Gang("mine", 2, 8);
  const Explanation explained = Ask(job, {}, {}, {&ahead});
  EXPECT_EQ(explained.reason, PendingReason::kCapacity);
  ASSERT_TRUE(explained.eta_seconds.has_value()) << explained.eta_why;
  EXPECT_EQ(*explained.eta_seconds, 600);
  // Alone, it would start when both running jobs end.
  const Explanation alone = Ask(job);
  ASSERT_TRUE(alone.eta_seconds.has_value());
  EXPECT_EQ(*alone.eta_seconds, 300);
}

// A job ahead that no node could ever hold is left out of the plan and counted: it would hold
// the reservation forever and start nothing behind it.
TEST_F(ExplainTest, EtaLeavesOutJobsAheadThatNeverFit) {
  Use(TwoLeaves());
  Hold("a", 0, 8, 0, 100);                 // ends at 100
  Hold("b", 1, 8, 0, 300);                 // ends at 300
  Job too_wide = Gang("too-wide", 1, 16);  // 16 GPUs per task on 8-GPU nodes
  too_wide.runtime_estimate = std::chrono::seconds(60);
  Job too_many = Gang("too-many", 3, 8);  // 24 GPUs on a fleet of 16
  too_many.runtime_estimate = std::chrono::seconds(60);
  const Job job = Gang("mine", 1, 8);
  const Explanation explained = Ask(job, {}, {}, {&too_wide, &too_many});
  ASSERT_TRUE(explained.eta_seconds.has_value()) << explained.eta_why;
  EXPECT_EQ(*explained.eta_seconds, 100);
  EXPECT_EQ(explained.ahead_never_start, 2);
  EXPECT_THAT(explained.eta_why, HasSubstr("2 jobs ahead cannot start"));
  // Without them nothing is said.
  const Explanation alone = Ask(job);
  EXPECT_EQ(alone.ahead_never_start, 0);
  EXPECT_THAT(alone.eta_why, ::testing::Not(HasSubstr("cannot start")));
}

// EASY in the plan: a long job that fits now does not jump a reserved head it would delay; it
// starts when the head has run.
TEST_F(ExplainTest, EtaKeepsTheHeadsReservation) {
  Cluster cluster;
  for (int n = 0; n < 3; ++n) {
    cluster.nodes.push_back(MakeNode(fmt::format("node-{}", n), 8));
  }
  Use(std::move(cluster));
  Hold("a", 0, 8, 0, 100);
  Hold("b", 1, 8, 0, 300);
  Job big = Gang("big", 3, 8);
  big.runtime_estimate = std::chrono::seconds(50);
  Job small = Gang("small", 1, 8);
  small.runtime_estimate = std::chrono::seconds(1000);
  const Explanation explained = Ask(small, {}, {}, {&big});
  ASSERT_TRUE(explained.eta_seconds.has_value()) << explained.eta_why;
  EXPECT_EQ(*explained.eta_seconds, 350);
  // A short one backfills now: it ends before the head's reservation at 300.
  Job quick = Gang("quick", 1, 8);
  quick.runtime_estimate = std::chrono::seconds(200);
  const Explanation backfilled = Ask(quick, {}, {}, {&big});
  ASSERT_TRUE(backfilled.eta_seconds.has_value()) << backfilled.eta_why;
  EXPECT_EQ(*backfilled.eta_seconds, 10);
}

}  // namespace
}  // namespace gpufleet::policy
