// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/collective_cost.h"

#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/fabric/generators.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeJob;

// Two leaves of four 8-GPU nodes, leaves 3:1 oversubscribed to one spine.
std::shared_ptr<const fabric::Fabric> OversubscribedFabric() {
  fabric::ClosOptions options;
  options.leaves_per_pod = 2;
  options.nodes_per_leaf = 4;
  options.leaf_oversubscription = 3;
  auto spec = fabric::GenerateClos(options);
  auto built = fabric::Fabric::Build(*spec);
  return std::make_shared<const fabric::Fabric>(std::move(built).value());
}

class CollectiveCostTest : public ::testing::Test {
 protected:
  // With `levels`, the cluster declares the fabric's tiers as topology levels, and the
  // scheduler's compact-gang rule alone keeps a gang in as few leaves as it can; without, the
  // nodes carry no topology and only the plugin knows the fabric.
  void Use(bool topology_aware, bool levels = false) {
    auto cluster = fabric::BuildCluster(*fabric_, catalog_);
    ASSERT_OK(cluster);
    if (!levels) {
      cluster->topology = Topology();
      for (Node& node : cluster->nodes) {
        node.topology.clear();
      }
    }
    auto snapshot = ClusterSnapshot::Build(std::move(cluster).value(), catalog_);
    ASSERT_OK(snapshot);
    snapshot_.emplace(std::move(snapshot).value());
    SchedulerOptions options;
    options.policy = "best-fit";
    if (topology_aware) {
      options.extra_plugins = {"collective-cost"};
    }
    options.plugin_args.fabric = fabric_;
    auto scheduler = Scheduler::Create(options, PluginRegistry::Default());
    ASSERT_OK(scheduler);
    scheduler_ = std::move(scheduler).value();
  }

  ScheduleResult Schedule(const Job& job) {
    Random random(1);
    return scheduler_->Schedule(job, *snapshot_, random);
  }

  // The fabric's leaves (its first tier) that hold the placements.
  std::set<std::string> LeavesOf(const ScheduleResult& result) {
    std::set<std::string> leaves;
    for (const TaskPlacement& placement : result.placements) {
      const int node = fabric_->FindNode(snapshot_->nodes()[placement.node].node->id.value());
      leaves.insert(fabric_->DomainName(0, fabric_->DomainOf(0, node)));
    }
    return leaves;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::shared_ptr<const fabric::Fabric> fabric_ = OversubscribedFabric();
  std::optional<ClusterSnapshot> snapshot_;
  std::unique_ptr<Scheduler> scheduler_;
};

// leaf1 keeps two free nodes after two single-node jobs; a four-node gang fits only leaf2.
// Nodes without topology levels look alike to the policy: node order spreads it over the spine.
TEST_F(CollectiveCostTest, TopologyBlindPlacementSpreadsTheGangOverTheSpine) {
  Use(false);
  ASSERT_TRUE(Schedule(MakeJob("busy", 2, WholeGpus{8})).scheduled());
  const ScheduleResult gang = Schedule(MakeJob("gang", 4, WholeGpus{8}));
  ASSERT_TRUE(gang.scheduled()) << gang.reason;
  EXPECT_THAT(LeavesOf(gang), ElementsAre("leaf1", "leaf2"));
}

// The same nodes declaring the fabric's tiers as levels: the fewest leaves, without the plugin.
TEST_F(CollectiveCostTest, TopologyLevelsKeepTheGangInOneLeafWithoutThePlugin) {
  Use(false, /*levels=*/true);
  ASSERT_TRUE(Schedule(MakeJob("busy", 2, WholeGpus{8})).scheduled());
  const ScheduleResult gang = Schedule(MakeJob("gang", 4, WholeGpus{8}));
  ASSERT_TRUE(gang.scheduled()) << gang.reason;
  EXPECT_THAT(LeavesOf(gang), ElementsAre("leaf2"));
}

TEST_F(CollectiveCostTest, PrefersTheLeafThatHoldsTheWholeGang) {
  Use(true);
  ASSERT_TRUE(Schedule(MakeJob("busy", 2, WholeGpus{8})).scheduled());
  const ScheduleResult gang = Schedule(MakeJob("gang", 4, WholeGpus{8}));
  ASSERT_TRUE(gang.scheduled()) << gang.reason;
  EXPECT_THAT(LeavesOf(gang), ElementsAre("leaf2"));
}

TEST_F(CollectiveCostTest, SingleTaskJobsAreLeftToThePolicy) {
  Use(true);
  const ScheduleResult one = Schedule(MakeJob("one", 1, WholeGpus{8}));
  ASSERT_TRUE(one.scheduled());
  EXPECT_EQ(snapshot_->nodes()[one.placements[0].node].node->id.value(), "node1");
}

TEST_F(CollectiveCostTest, EstimatesTheGangTimeFromEachCandidate) {
  Use(false);
  ASSERT_TRUE(Schedule(MakeJob("busy", 2, WholeGpus{8})).scheduled());
  CollectiveCostScore plugin(fabric_);
  const Job gang = MakeJob("gang", 4, WholeGpus{8});
  CycleState state(gang);
  TaskContext task;
  task.snapshot = &*snapshot_;
  task.job = &gang;
  task.request = &gang.groups[0].request;
  std::vector<const NodeInfo*> feasible;
  for (const NodeInfo& node : snapshot_->nodes()) {
    if (node.IdleGpuCount() == 8) {
      feasible.push_back(&node);
    }
  }
  ASSERT_EQ(feasible.size(), 6u);
  Random random(1);
  plugin.PreScore(state, task, feasible, random);
  const double in_leaf1 = plugin.EstimateSeconds(*feasible[0]);  // node3: leaf1 has 2 free
  const double in_leaf2 = plugin.EstimateSeconds(*feasible[2]);  // node5: leaf2 has 4 free
  EXPECT_GT(in_leaf1, 2 * in_leaf2);
  std::vector<int64_t> scores;
  for (const NodeInfo* node : feasible) {
    scores.push_back(plugin.Score(state, task, *node, ~GpuMask{0}));
  }
  plugin.NormalizeScores(scores);
  EXPECT_THAT(scores, ElementsAre(0, 0, 100, 100, 100, 100));
}

TEST(CollectiveCostRegistry, NeedsAFabric) {
  EXPECT_THAT(PluginRegistry::Default().Create("collective-cost", PluginArgs{}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("collective-cost: needs a fabric")));
}

}  // namespace
}  // namespace gpufleet::scheduler
