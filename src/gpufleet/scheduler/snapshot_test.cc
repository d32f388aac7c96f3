// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/snapshot.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using testing::MakeNode;

class SnapshotTest : public ::testing::Test {
 protected:
  ClusterSnapshot Build(Cluster cluster) {
    auto snapshot = ClusterSnapshot::Build(std::move(cluster), catalog_);
    EXPECT_OK(snapshot);
    return std::move(snapshot).value();
  }
  Cluster TwoNodes() {
    Cluster cluster;
    cluster.topology = Topology({"leaf"});
    cluster.nodes.push_back(MakeNode("a", 2, "H100-80GB", {"leaf-1"}));
    cluster.nodes.push_back(MakeNode("b", 2, "T4", {"leaf-2"}));
    return cluster;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
};

TEST_F(SnapshotTest, InternsDomainsAndModels) {
  ClusterSnapshot snapshot = Build(TwoNodes());
  EXPECT_EQ(snapshot.DomainCount(0), 2);
  EXPECT_EQ(snapshot.DomainName(0, snapshot.nodes()[1].domains[0]), "leaf-2");
  EXPECT_EQ(snapshot.ModelCount(), 2);
  EXPECT_EQ(snapshot.ModelId("Tesla T4"), snapshot.nodes()[1].gpus[0].model_id);
  EXPECT_EQ(snapshot.ModelId("A10"), -1);
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].memory_mib, 80 * 1024);
  EXPECT_EQ(snapshot.TotalGpuMilli(), 4000);
}

// Racks named alike in two blocks are two racks: a domain is its path (issue 41).
TEST_F(SnapshotTest, IdentifiesDomainsByTheirPath) {
  Cluster cluster;
  cluster.topology = Topology({"block", "rack"});
  cluster.nodes.push_back(MakeNode("a", 2, "H100-80GB", {"b1", "r1"}));
  cluster.nodes.push_back(MakeNode("b", 2, "H100-80GB", {"b2", "r1"}));
  cluster.nodes.push_back(MakeNode("c", 2, "H100-80GB", {"b1", "r1"}));
  ClusterSnapshot snapshot = Build(cluster);
  EXPECT_EQ(snapshot.DomainCount(0), 2);
  EXPECT_EQ(snapshot.DomainCount(1), 2);
  const std::vector<NodeInfo>& nodes = snapshot.nodes();
  EXPECT_NE(nodes[0].domains[1], nodes[1].domains[1]);
  EXPECT_EQ(nodes[0].domains[1], nodes[2].domains[1]);
  EXPECT_EQ(snapshot.DomainName(1, nodes[0].domains[1]), "b1/r1");
  EXPECT_EQ(snapshot.DomainName(1, nodes[1].domains[1]), "b2/r1");
  EXPECT_EQ(snapshot.DomainName(0, nodes[1].domains[0]), "b2");
  EXPECT_EQ(snapshot.Clone().DomainName(1, nodes[1].domains[1]), "b2/r1");
  // A node may move to a rack the snapshot knows by its path, not to a value known elsewhere.
  ASSERT_OK(snapshot.ReplaceNode(2, MakeNode("c", 2, "H100-80GB", {"b2", "r1"})));
  EXPECT_EQ(snapshot.nodes()[2].domains[1], nodes[1].domains[1]);
  cluster.nodes[1].topology = {"b2", "r2"};
  ClusterSnapshot other = Build(cluster);
  EXPECT_THAT(other.ReplaceNode(0, MakeNode("a", 2, "H100-80GB", {"b1", "r2"})),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("rack \"b1/r2\" is new")));
}

TEST_F(SnapshotTest, CountsGpusPerModelAsNodesAreReplaced) {
  ClusterSnapshot snapshot = Build(TwoNodes());
  const int h100 = snapshot.ModelId("H100-80GB");
  const int t4 = snapshot.ModelId("T4");
  EXPECT_EQ(snapshot.GpuCount(h100), 2);
  EXPECT_EQ(snapshot.GpuCount(t4), 2);
  // Node b's GPUs become H100s (a model the snapshot knows), then it has one GPU fewer.
  ASSERT_OK(snapshot.ReplaceNode(1, MakeNode("b", 2, "H100-80GB", {"leaf-2"})));
  EXPECT_EQ(snapshot.GpuCount(h100), 4);
  EXPECT_EQ(snapshot.GpuCount(t4), 0);
  ASSERT_OK(snapshot.ReplaceNode(1, MakeNode("b", 1, "T4", {"leaf-2"})));
  EXPECT_EQ(snapshot.GpuCount(h100), 2);
  EXPECT_EQ(snapshot.GpuCount(t4), 1);
  EXPECT_EQ(snapshot.Clone().GpuCount(t4), 1);
  EXPECT_EQ(snapshot.TotalGpus(), 3);
}

TEST_F(SnapshotTest, TheChangeLogNamesEveryChangedNodeUntilItIsOutrun) {
  ClusterSnapshot snapshot = Build(TwoNodes());
  const uint64_t start = snapshot.ChangeLogEnd();
  const TaskPlacement on_b{0, 0, 1, {1000, 1024}, {{0, 1000, 0, "", -1, false}}};
  ASSERT_OK(snapshot.Apply(on_b));
  snapshot.Release(on_b);
  ASSERT_OK(snapshot.ReplaceNode(0, MakeNode("a", 2, "H100-80GB", {"leaf-1"})));
  std::optional<std::span<const int>> changed = snapshot.ChangedSince(start);
  ASSERT_TRUE(changed.has_value());
  EXPECT_THAT(std::vector<int>(changed->begin(), changed->end()), ::testing::ElementsAre(1, 1, 0));
  EXPECT_TRUE(snapshot.ChangedSince(snapshot.ChangeLogEnd())->empty());
  EXPECT_FALSE(snapshot.ChangedSince(snapshot.ChangeLogEnd() + 1).has_value());
  // A copy's log starts where this one ends: older positions are not in it.
  const ClusterSnapshot copy = snapshot.Clone();
  EXPECT_FALSE(copy.ChangedSince(start).has_value());
  EXPECT_TRUE(copy.ChangedSince(snapshot.ChangeLogEnd())->empty());
  // The log keeps a few times the node count: a reader far behind must look at every node.
  for (int i = 0; i < 100; ++i) {
    ASSERT_OK(snapshot.Apply(on_b));
    snapshot.Release(on_b);
  }
  EXPECT_FALSE(snapshot.ChangedSince(start).has_value());
  const uint64_t recent = snapshot.ChangeLogEnd() - 1;
  ASSERT_TRUE(snapshot.ChangedSince(recent).has_value());
  EXPECT_THAT(std::vector<int>(snapshot.ChangedSince(recent)->begin(),
                               snapshot.ChangedSince(recent)->end()),
              ::testing::ElementsAre(1));
}

TEST_F(SnapshotTest, EverySnapshotHasItsOwnIdentityAndMovesKeepIt) {
  ClusterSnapshot first = Build(TwoNodes());
  const ClusterSnapshot second = Build(TwoNodes());
  const ClusterSnapshot copy = first.Clone();
  EXPECT_NE(first.identity(), second.identity());
  EXPECT_NE(first.identity(), copy.identity());
  const uint64_t identity = first.identity();
  const ClusterSnapshot moved = std::move(first);
  EXPECT_EQ(moved.identity(), identity);
}

TEST_F(SnapshotTest, RejectsAnInvalidCluster) {
  Cluster cluster = TwoNodes();
  cluster.nodes[1].gpus[0].model = "Z9";
  EXPECT_THAT(ClusterSnapshot::Build(cluster, catalog_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("Z9")));
}

TEST_F(SnapshotTest, ApplyAndReleaseKeepCountersConsistent) {
  ClusterSnapshot snapshot = Build(TwoNodes());
  const TaskPlacement placement{0, 0, 0, {4000, 2048}, {{0, 500, 1024}, {1, 1000, 0}}};
  ASSERT_OK(snapshot.Apply(placement));
  EXPECT_EQ(snapshot.AllocatedGpuMilli(), 1500);
  EXPECT_EQ(snapshot.nodes()[0].free.cpu_milli, 92000);
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].free_milli, 500);
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].free_memory_mib, 80 * 1024 - 1024);
  const uint64_t version = snapshot.nodes()[0].version;
  snapshot.Release(placement);
  EXPECT_EQ(snapshot.AllocatedGpuMilli(), 0);
  EXPECT_EQ(snapshot.nodes()[0].free, (HostResources{96000, 1048576}));
  EXPECT_EQ(snapshot.nodes()[0].IdleGpuCount(), 2);
  EXPECT_GT(snapshot.nodes()[0].version, version);
}

TEST_F(SnapshotTest, ApplyOfStalePlacementChangesNothing) {
  ClusterSnapshot snapshot = Build(TwoNodes());
  ASSERT_OK(snapshot.Apply({0, 0, 0, {1000, 0}, {{0, 700, 0}}}));
  // GPU 1 is free, GPU 0 has only 300 left: the whole placement must be refused.
  EXPECT_THAT(snapshot.Apply({0, 1, 0, {1000, 0}, {{1, 500, 0}, {0, 500, 0}}}),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not free")));
  EXPECT_EQ(snapshot.nodes()[0].gpus[1].free_milli, 1000);
  EXPECT_EQ(snapshot.AllocatedGpuMilli(), 700);
  EXPECT_THAT(snapshot.Apply({0, 0, 5, {}, {}}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(snapshot.Apply({0, 0, 1, {200000, 0}, {}}),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("host resources")));
}

TEST_F(SnapshotTest, MigInstancesStayAfterReleaseButNotAfterRevert) {
  Cluster cluster = TwoNodes();
  cluster.nodes[0].gpus[0].mig_enabled = true;
  ClusterSnapshot snapshot = Build(cluster);
  const TaskPlacement placement{0, 0, 0, {}, {{0, 0, 0, "3g.40gb", 4, true}}};
  ASSERT_OK(snapshot.Apply(placement));
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].mig_instances.size(), 1U);
  EXPECT_EQ(snapshot.AllocatedGpuMilli(), 428);
  snapshot.Release(placement);
  ASSERT_EQ(snapshot.nodes()[0].gpus[0].mig_instances.size(), 1U);
  EXPECT_FALSE(snapshot.nodes()[0].gpus[0].mig_instances[0].in_use);
  // Claiming the free instance again, then undoing the claim, keeps it.
  const TaskPlacement claim{0, 0, 0, {}, {{0, 0, 0, "3g.40gb", 4, false}}};
  ASSERT_OK(snapshot.Apply(claim));
  snapshot.Revert(claim);
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].mig_instances.size(), 1U);
  // A created instance that is reverted disappears with its slices.
  const TaskPlacement create{0, 0, 0, {}, {{0, 0, 0, "3g.40gb", 0, true}}};
  ASSERT_OK(snapshot.Apply(create));
  snapshot.Revert(create);
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].mig_instances.size(), 1U);
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].mig.used_slices(), 0xF0);
  EXPECT_THAT(snapshot.Apply({0, 0, 0, {}, {{0, 0, 0, "3g.40gb", 2, true}}}),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("does not fit at slot 2")));
}

TEST_F(SnapshotTest, TracksTaskKindsPerNode) {
  ClusterSnapshot snapshot = Build(TwoNodes());
  ASSERT_OK(snapshot.Apply({0, 0, 0, {}, {{0, 300, 0}}}));
  ASSERT_OK(snapshot.Apply({0, 1, 0, {}, {{1, 1000, 0}}}));
  EXPECT_EQ(snapshot.nodes()[0].TaskCountOfKind(0), 1);
  EXPECT_EQ(snapshot.nodes()[0].TaskCountOfKind(1), 1);
  snapshot.Release({0, 0, 0, {}, {{0, 300, 0}}});
  EXPECT_EQ(snapshot.nodes()[0].TaskCountOfKind(0), 0);
  EXPECT_EQ(snapshot.nodes()[0].gpu_task_kinds.size(), 1U);
}

TEST_F(SnapshotTest, CloneIsIndependentAndPointsAtItsOwnNodes) {
  ClusterSnapshot snapshot = Build(TwoNodes());
  ASSERT_OK(snapshot.Apply({0, 0, 0, {1000, 0}, {{0, 1000, 0}}}));
  ClusterSnapshot copy = snapshot.Clone();
  EXPECT_EQ(copy.AllocatedGpuMilli(), 1000);
  EXPECT_EQ(copy.nodes()[0].gpus[0].free_milli, 0);
  EXPECT_EQ(copy.nodes()[1].node, &copy.cluster().nodes[1]);
  EXPECT_EQ(copy.nodes()[1].node->id.value(), "b");
  EXPECT_EQ(copy.DomainName(0, copy.nodes()[1].domains[0]), "leaf-2");

  ASSERT_OK(copy.Apply({0, 1, 1, {}, {{1, 1000, 0}}}));
  copy.Release({0, 0, 0, {1000, 0}, {{0, 1000, 0}}});
  EXPECT_EQ(snapshot.nodes()[0].gpus[0].free_milli, 0);
  EXPECT_EQ(snapshot.nodes()[1].gpus[1].free_milli, 1000);
  EXPECT_EQ(snapshot.AllocatedGpuMilli(), 1000);
  EXPECT_EQ(copy.nodes()[0].gpus[0].free_milli, 1000);
}

}  // namespace
}  // namespace gpufleet::scheduler
