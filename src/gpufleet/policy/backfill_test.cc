// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/backfill.h"

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::TaskPlacement;
using scheduler::testing::MakeJob;
using scheduler::testing::MakeNode;

TEST(PlannedEndSeconds, EstimateIsATimeLimitWithGraceAndZeroIsUnknown) {
  const RunningJob job{.id = JobId("j"), .start_seconds = 100, .estimate_seconds = 50};
  BackfillOptions options;
  options.overrun_grace_seconds = 30;
  EXPECT_EQ(PlannedEndSeconds(job, 120, options), 150);
  EXPECT_EQ(PlannedEndSeconds(job, 150, options), 150);
  // Past its estimate: assumed to end when its grace runs out.
  EXPECT_EQ(PlannedEndSeconds(job, 151, options), 180);
  // Past the grace too: its kill is due now.
  EXPECT_EQ(PlannedEndSeconds(job, 200, options), 200);
  EXPECT_EQ(PlannedEndSeconds(job, 151, BackfillOptions{}), 151);
  const RunningJob unknown{.id = JobId("u"), .start_seconds = 100, .estimate_seconds = 0};
  EXPECT_EQ(PlannedEndSeconds(unknown, 120, options), kNeverEnds);
}

class BackfillTest : public ::testing::Test {
 protected:
  void Use(Cluster cluster, BackfillOptions options = {}) {
    auto snapshot = ClusterSnapshot::Build(std::move(cluster), catalog_);
    ASSERT_OK(snapshot);
    snapshot_.emplace(std::move(snapshot).value());
    auto scheduler = scheduler::Scheduler::Create(scheduler::SchedulerOptions{},
                                                  scheduler::PluginRegistry::Default());
    ASSERT_OK(scheduler);
    scheduler_ = std::move(scheduler).value();
    planner_ = std::make_unique<BackfillPlanner>(*scheduler_, options);
  }

  // A job holding `gpus` idle GPUs of node `node` (lowest indices first) from `start` on.
  RunningJob Hold(const std::string& id, int node, int gpus, int64_t start, int64_t estimate) {
    const TaskPlacement placement = scheduler::testing::IdleGpusPlacement(*snapshot_, node, gpus);
    EXPECT_EQ(static_cast<int>(placement.gpus.size()), gpus);
    EXPECT_OK(snapshot_->Apply(placement));
    return {.id = JobId(id),
            .start_seconds = start,
            .estimate_seconds = estimate,
            .placements = {placement}};
  }

  Reservation Reserve(const Job& head, const std::vector<RunningJob>& running, int64_t now) {
    auto reservation = planner_->Reserve(head, running, now, *snapshot_, random_);
    EXPECT_OK(reservation);
    return std::move(reservation).value();
  }

  bool Keeps(const Reservation& reservation, const Job& head, const RunningJob& candidate,
             const std::vector<RunningJob>& running, int64_t now) {
    auto keeps =
        planner_->KeepsReservation(reservation, head, candidate, running, now, *snapshot_, random_);
    EXPECT_OK(keeps);
    return keeps.ok() && *keeps;
  }

  std::set<int> NodesOf(const std::vector<TaskPlacement>& placements) const {
    std::set<int> nodes;
    for (const TaskPlacement& placement : placements) {
      nodes.insert(placement.node);
    }
    return nodes;
  }

  // Everything a what-if could disturb, as text.
  std::string Fingerprint() const {
    std::string out = fmt::format("allocated={}\n", snapshot_->AllocatedGpuMilli());
    for (const scheduler::NodeInfo& node : snapshot_->nodes()) {
      std::multiset<std::pair<int, int>> kinds(node.gpu_task_kinds.begin(),
                                               node.gpu_task_kinds.end());
      out += fmt::format("node {} cpu={} mem={} kinds={}:", node.index, node.free.cpu_milli,
                         node.free.memory_mib, kinds.size());
      for (const auto& [kind, count] : kinds) {
        out += fmt::format(" {}x{}", kind, count);
      }
      for (const scheduler::GpuSlot& gpu : node.gpus) {
        out += fmt::format(" [{} {} {} slices={}", gpu.index, gpu.free_milli, gpu.free_memory_mib,
                           gpu.mig.used_slices());
        for (const MigInstance& instance : gpu.mig_instances) {
          out +=
              fmt::format(" {}@{}{}", instance.profile, instance.start, instance.in_use ? "*" : "");
        }
        out += "]";
      }
      out += "\n";
    }
    return out;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
  std::unique_ptr<scheduler::Scheduler> scheduler_;
  std::unique_ptr<BackfillPlanner> planner_;
  Random random_{7};
};

Cluster Nodes(int count) {
  Cluster cluster;
  for (int i = 0; i < count; ++i) {
    cluster.nodes.push_back(MakeNode("n" + std::to_string(i), 8));
  }
  return cluster;
}

TEST_F(BackfillTest, ShadowTimeIsTheFirstPlannedEndAfterWhichTheHeadFits) {
  Use(Nodes(2));
  const std::vector<RunningJob> running = {Hold("long", 0, 8, 0, 100), Hold("short", 1, 4, 0, 50)};
  const Job head = MakeJob("head", 2, WholeGpus{8});
  const std::string before = Fingerprint();
  const Reservation reservation = Reserve(head, running, 10);
  ASSERT_TRUE(reservation.exists());
  EXPECT_EQ(reservation.job, JobId("head"));
  EXPECT_EQ(reservation.shadow_seconds, 100);
  EXPECT_EQ(NodesOf(reservation.placements), (std::set<int>{0, 1}));
  EXPECT_EQ(Fingerprint(), before);
}

TEST_F(BackfillTest, AHeadThatFitsNowIsReservedNow) {
  Use(Nodes(2));
  const std::vector<RunningJob> running = {Hold("long", 0, 8, 0, 100)};
  const Reservation reservation = Reserve(MakeJob("head", 1, WholeGpus{8}), running, 10);
  EXPECT_EQ(reservation.shadow_seconds, 10);
  EXPECT_EQ(NodesOf(reservation.placements), (std::set<int>{1}));
}

// The head needs both nodes at t=100. A 4-GPU job fits on n1 now, and a backfill that only asks
// "does it fit now?" would start it; if it runs past 100 the head waits for it.
TEST_F(BackfillTest, ABackfillThatWouldDelayTheReservationIsRefused) {
  Use(Nodes(2));
  std::vector<RunningJob> running = {Hold("long", 0, 8, 0, 100), Hold("short", 1, 4, 0, 50)};
  const Job head = MakeJob("head", 2, WholeGpus{8});
  const int64_t now = 10;
  const Reservation reservation = Reserve(head, running, now);
  ASSERT_EQ(reservation.shadow_seconds, 100);

  const std::string before = Fingerprint();
  const RunningJob too_long = Hold("too-long", 1, 4, now, 200);
  EXPECT_FALSE(Keeps(reservation, head, too_long, running, now));
  snapshot_->Revert(too_long.placements[0]);
  EXPECT_EQ(Fingerprint(), before);

  // Ending exactly at the shadow time is in time.
  const RunningJob in_time = Hold("in-time", 1, 4, now, 90);
  EXPECT_TRUE(Keeps(reservation, head, in_time, running, now));
  snapshot_->Revert(in_time.placements[0]);
  const RunningJob one_late = Hold("one-late", 1, 4, now, 91);
  EXPECT_FALSE(Keeps(reservation, head, one_late, running, now));
  snapshot_->Revert(one_late.placements[0]);
  EXPECT_EQ(Fingerprint(), before);
}

TEST_F(BackfillTest, ALongBackfillAwayFromTheReservationIsAllowed) {
  Use(Nodes(3));
  std::vector<RunningJob> running = {Hold("long", 0, 8, 0, 100), Hold("short", 1, 8, 0, 50),
                                     Hold("side", 2, 4, 0, 1000)};
  const Job head = MakeJob("head", 2, WholeGpus{8});
  const Reservation reservation = Reserve(head, running, 10);
  ASSERT_EQ(reservation.shadow_seconds, 100);
  EXPECT_EQ(NodesOf(reservation.placements), (std::set<int>{0, 1}));
  // n2 is not needed at t=100: a job of unknown length may go there.
  const RunningJob forever = Hold("forever", 2, 4, 10, 0);
  EXPECT_TRUE(Keeps(reservation, head, forever, running, 10));
}

TEST_F(BackfillTest, JobsOfUnknownLengthNeverEnd) {
  Use(Nodes(2));
  const std::vector<RunningJob> running = {Hold("unknown", 0, 8, 0, 0),
                                           Hold("known", 1, 4, 0, 100)};
  // Both nodes: n0 never frees up, so no reservation can be made.
  const Reservation none = Reserve(MakeJob("big", 2, WholeGpus{8}), running, 10);
  EXPECT_FALSE(none.exists());
  EXPECT_EQ(none.shadow_seconds, kNeverEnds);
  EXPECT_TRUE(none.placements.empty());

  // One node: n1 at t=100. A candidate of unknown length on n1 would hold it forever.
  const Job head = MakeJob("head", 1, WholeGpus{8});
  const Reservation reservation = Reserve(head, running, 10);
  ASSERT_EQ(reservation.shadow_seconds, 100);
  const RunningJob unknown = Hold("candidate", 1, 4, 10, 0);
  EXPECT_FALSE(Keeps(reservation, head, unknown, running, 10));
  snapshot_->Revert(unknown.placements[0]);
  const RunningJob known = Hold("candidate", 1, 4, 10, 50);
  EXPECT_TRUE(Keeps(reservation, head, known, running, 10));
  // With no reservation there is nothing to protect.
  EXPECT_TRUE(Keeps(none, MakeJob("big", 2, WholeGpus{8}), known, running, 10));
}

TEST_F(BackfillTest, AJobPastItsEstimateIsPlannedToEndAtItsLimitPlusGrace) {
  BackfillOptions options;
  options.overrun_grace_seconds = 60;
  Use(Nodes(1), options);
  const std::vector<RunningJob> running = {Hold("overrun", 0, 8, 0, 100)};
  const Job head = MakeJob("head", 1, WholeGpus{8});
  EXPECT_EQ(Reserve(head, running, 150).shadow_seconds, 160);
  EXPECT_EQ(Reserve(head, running, 170).shadow_seconds, 170);
  Use(Nodes(1));
  const std::vector<RunningJob> no_grace = {Hold("overrun", 0, 8, 0, 100)};
  EXPECT_EQ(Reserve(head, no_grace, 150).shadow_seconds, 150);
}

// leaf-a: a0 busy until 100, a1 until 300, a2 idle; leaf-b: b0 until 50, b1 until 200. A gang of
// two 8-GPU tasks that must share a leaf fits first at 100 (a0 + a2), although 16 GPUs are free
// from 50 on (b0 + a2).
TEST_F(BackfillTest, GangWithALeafConstraintWaitsForOneLeafToHoldIt) {
  Cluster cluster;
  cluster.topology = Topology({"leaf"});
  for (const char* name : {"a0", "a1", "a2"}) {
    cluster.nodes.push_back(MakeNode(name, 8, "H100-80GB", {"leaf-a"}));
  }
  for (const char* name : {"b0", "b1"}) {
    cluster.nodes.push_back(MakeNode(name, 8, "H100-80GB", {"leaf-b"}));
  }
  Use(cluster);
  const std::vector<RunningJob> running = {Hold("a0", 0, 8, 0, 100), Hold("a1", 1, 8, 0, 300),
                                           Hold("b0", 3, 8, 0, 50), Hold("b1", 4, 8, 0, 200)};
  Job head = MakeJob("head", 2, WholeGpus{8});
  EXPECT_EQ(Reserve(head, running, 0).shadow_seconds, 50);
  head.topology.required_level = "leaf";
  const std::string before = Fingerprint();
  const Reservation reservation = Reserve(head, running, 0);
  EXPECT_EQ(reservation.shadow_seconds, 100);
  EXPECT_EQ(NodesOf(reservation.placements), (std::set<int>{0, 2}));
  EXPECT_EQ(Fingerprint(), before);

  // a2 is idle now; a long job there pushes the head to 200 (leaf-b), a short one does not.
  const RunningJob long_job = Hold("long", 2, 8, 0, 150);
  EXPECT_FALSE(Keeps(reservation, head, long_job, running, 0));
  snapshot_->Revert(long_job.placements[0]);
  const RunningJob short_job = Hold("short", 2, 8, 0, 100);
  EXPECT_TRUE(Keeps(reservation, head, short_job, running, 0));
}

TEST_F(BackfillTest, MigInstancesOfReleasedJobsAreRestored) {
  Cluster cluster = Nodes(1);
  cluster.nodes.push_back(MakeNode("mig", 1, "A100-80GB"));
  cluster.nodes[1].gpus[0].mig_enabled = true;
  Use(cluster);
  TaskPlacement mig_task{0, 0, 1, {1000, 1024}, {{0, 0, 0, "3g.40gb", 4, true}}};
  ASSERT_OK(snapshot_->Apply(mig_task));
  const std::vector<RunningJob> running = {
      {.id = JobId("mig"), .start_seconds = 0, .estimate_seconds = 50, .placements = {mig_task}},
      Hold("whole", 0, 8, 0, 100)};
  const std::string before = Fingerprint();
  const Reservation reservation = Reserve(MakeJob("head", 1, WholeGpus{8}), running, 10);
  EXPECT_EQ(reservation.shadow_seconds, 100);
  EXPECT_EQ(Fingerprint(), before);
  ASSERT_EQ(snapshot_->nodes()[1].gpus[0].mig_instances.size(), 1U);
  EXPECT_TRUE(snapshot_->nodes()[1].gpus[0].mig_instances[0].in_use);
}

}  // namespace
}  // namespace gpufleet::policy
