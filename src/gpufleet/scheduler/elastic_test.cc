// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/elastic.h"

#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using testing::IdleGpusPlacement;
using testing::MakeJob;
using testing::MakeNode;

// Two leaves of one 8-GPU node each; `taken_a` and `taken_b` GPUs of them held by other work.
ClusterSnapshot ElasticFleet(const GpuCatalog& catalog, int taken_a, int taken_b) {
  Cluster cluster;
  cluster.topology = Topology({"leaf"});
  cluster.nodes.push_back(MakeNode("a0", 8, "H100-80GB", {"leaf-a"}));
  cluster.nodes.push_back(MakeNode("b0", 8, "H100-80GB", {"leaf-b"}));
  Result<ClusterSnapshot> snapshot = ClusterSnapshot::Build(std::move(cluster), catalog);
  EXPECT_OK(snapshot);
  for (const auto& [node, taken] : {std::pair{0, taken_a}, std::pair{1, taken_b}}) {
    if (taken > 0) {
      EXPECT_OK(snapshot->Apply(IdleGpusPlacement(*snapshot, node, taken)));
    }
  }
  return std::move(snapshot).value();
}

// An elastic job of 2 to 12 one-GPU tasks, all inside one leaf.
Job ElasticJob() {
  Job job = MakeJob("elastic", 12, WholeGpus{1});
  job.groups[0].min_replicas = 2;
  job.topology.required_level = "leaf";
  return job;
}

TEST(ScheduleLargestSize, PlacesTheLargestSizeThatFitsWithTheJobsTopologyRules) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<std::unique_ptr<Scheduler>> scheduler = Scheduler::Create({}, PluginRegistry::Default());
  ASSERT_OK(scheduler);
  Random random(1);

  // 5 GPUs free in leaf-a, 3 in leaf-b: 8 free in all, but one leaf holds at most 5.
  ClusterSnapshot snapshot = ElasticFleet(catalog, 3, 5);
  SizedSchedule placed = ScheduleLargestSize(**scheduler, ElasticJob(), snapshot, random);
  ASSERT_TRUE(placed.result.scheduled()) << placed.result.reason;
  EXPECT_EQ(placed.size, 5);
  ASSERT_EQ(placed.result.placements.size(), 5u);
  std::set<int> nodes;
  for (const TaskPlacement& placement : placed.result.placements) {
    nodes.insert(placement.node);
  }
  EXPECT_EQ(nodes, std::set<int>{0}) << "in one leaf";
  EXPECT_EQ(snapshot.nodes()[0].IdleGpuCount(), 0) << "the chosen placements are applied, no other";
  EXPECT_EQ(snapshot.nodes()[1].IdleGpuCount(), 3);

  // Every size fits: the maximum, at once.
  ClusterSnapshot empty = ElasticFleet(catalog, 0, 0);
  Job eight = ElasticJob();
  eight.groups[0].replicas = 8;
  placed = ScheduleLargestSize(**scheduler, eight, empty, random);
  EXPECT_EQ(placed.size, 8);

  // Not even the minimum: the minimum's refusal, nothing applied.
  ClusterSnapshot full = ElasticFleet(catalog, 7, 7);
  placed = ScheduleLargestSize(**scheduler, ElasticJob(), full, random);
  EXPECT_FALSE(placed.result.scheduled());
  EXPECT_EQ(placed.size, 0);
  EXPECT_THAT(placed.result.reason, ::testing::Not(::testing::IsEmpty()));
  EXPECT_EQ(full.nodes()[0].IdleGpuCount() + full.nodes()[1].IdleGpuCount(), 2);
}

}  // namespace
}  // namespace gpufleet::scheduler
