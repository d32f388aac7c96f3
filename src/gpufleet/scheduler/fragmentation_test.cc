// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/fragmentation.h"

#include <gtest/gtest.h>

#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

TaskShape Shape(int64_t cpu, int64_t milli, int gpus) {
  return {cpu, milli, gpus, {}};
}

TEST(TargetWorkload, KeepsTheMostFrequentShapesUpToCoverage) {
  std::vector<TaskShape> shapes;
  for (int i = 0; i < 6; ++i) {
    shapes.push_back(Shape(1000, 500, 1));
  }
  for (int i = 0; i < 3; ++i) {
    shapes.push_back(Shape(2000, 1000, 1));
  }
  shapes.push_back(Shape(4000, 0, 0));
  const TargetWorkload all = TargetWorkload::FromShapes(shapes, 1.0);
  ASSERT_EQ(all.classes().size(), 3U);
  EXPECT_DOUBLE_EQ(all.classes()[0].weight, 0.6);
  const TargetWorkload most = TargetWorkload::FromShapes(shapes, 0.9);
  ASSERT_EQ(most.classes().size(), 2U);
  EXPECT_DOUBLE_EQ(most.classes()[0].weight, 6.0 / 9.0);
  EXPECT_EQ(most.classes()[1].shape, Shape(2000, 1000, 1));
}

class NodeFragmentationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Cluster cluster;
    cluster.nodes.push_back(testing::MakeNode("n", 4, "T4"));
    snapshot_.emplace(ClusterSnapshot::Build(cluster, catalog_).value());
  }
  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
};

// Worked by hand from the FGD definition: free GPUs {1000, 1000, 600, 200}, 8 cores free.
TEST_F(NodeFragmentationTest, MatchesTheDefinition) {
  const TargetWorkload workload = TargetWorkload::FromShapes(
      {Shape(1000, 500, 1), Shape(1000, 1000, 2), Shape(16000, 500, 1), Shape(1000, 0, 0)}, 1.0);
  const FragmentationModel model(workload, *snapshot_);
  const int t4 = snapshot_->ModelId("T4");
  const std::vector<int64_t> free = {1000, 1000, 600, 200};
  // share 500: fits, fragment = 200; 2 whole: fits, fragment = 600 + 200;
  // 16 cores: cannot run, all 2800 idle; CPU-only: all 2800.
  const double expected = 0.25 * (200 + 800 + 2800 + 2800);
  EXPECT_DOUBLE_EQ(model.NodeFragmentation(8000, t4, free), expected);
  EXPECT_DOUBLE_EQ(model.NodeFragmentation(8000, t4, std::vector<int64_t>{0, 0, 0, 0}), 0);
  EXPECT_DOUBLE_EQ(model.NodeFragmentation(8000, -1, std::vector<int64_t>{}), 0);
}

// Shares of 300 on free GPUs {1000, 1000, 600, 200}: FGD counts only the 200 GPU; packed, three
// shares fit each idle GPU (100 left on each), two the 600 one (0 left), none the 200 one.
TEST_F(NodeFragmentationTest, PackedSharesCountRemaindersAndCpuLimits) {
  const TargetWorkload workload = TargetWorkload::FromShapes({Shape(1000, 300, 1)}, 1.0);
  const FragmentationModel fgd(workload, *snapshot_);
  const FragmentationModel packed(workload, *snapshot_, FragmentationModel::Kind::kPackedShares);
  const int t4 = snapshot_->ModelId("T4");
  const std::vector<int64_t> free = {1000, 1000, 600, 200};
  EXPECT_DOUBLE_EQ(fgd.NodeFragmentation(8000, t4, free), 200);
  EXPECT_DOUBLE_EQ(packed.NodeFragmentation(8000, t4, free), 100 + 100 + 0 + 200);
  // CPU for only two shares: 2800 idle, 600 usable.
  EXPECT_DOUBLE_EQ(packed.NodeFragmentation(2000, t4, free), 2800 - 600);
  EXPECT_DOUBLE_EQ(fgd.NodeFragmentation(2000, t4, free), 200);
}

TEST_F(NodeFragmentationTest, ModelRestrictedClassesCannotUseOtherModels) {
  TaskShape v100_only = Shape(1000, 500, 1);
  v100_only.gpu_models = {"V100-16GB"};
  const TargetWorkload workload = TargetWorkload::FromShapes({v100_only}, 1.0);
  const FragmentationModel model(workload, *snapshot_);
  EXPECT_DOUBLE_EQ(model.NodeFragmentation(snapshot_->nodes()[0]), 4000);
}

TEST(ShapeOf, MapsEachRequestKind) {
  EXPECT_EQ(ShapeOf({{1000, 0}, WholeGpus{4}}, {}), Shape(1000, 1000, 4));
  EXPECT_EQ(ShapeOf({{1000, 0}, FractionalGpu{250, 0}}, {}), Shape(1000, 250, 1));
  EXPECT_EQ(ShapeOf({{1000, 0}, NoGpu{}}, {"T4"}), Shape(1000, 0, 0));
  EXPECT_EQ(ShapeOf({{0, 0}, WholeGpus{1}}, {"T4", "A10"}).gpu_models,
            (std::vector<std::string>{"A10", "T4"}));
}

}  // namespace
}  // namespace gpufleet::scheduler
