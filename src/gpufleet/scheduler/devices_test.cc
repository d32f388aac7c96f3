// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/devices.h"

#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using ::gpufleet::testing::StatusIs;
using testing::MakeNode;

class DevicesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Cluster cluster;
    Node node = MakeNode("n", 8, "H100-80GB");
    for (int g = 4; g < 8; ++g) {
      node.gpus[g].nvlink_domain = 1;
    }
    cluster.nodes.push_back(node);
    cluster.nodes.push_back(MakeNode("m", 2, "A100-40GB"));
    cluster.nodes[1].gpus[0].mig_enabled = true;
    cluster.nodes[1].gpus[1].mig_enabled = true;
    snapshot_.emplace(ClusterSnapshot::Build(cluster, catalog_).value());
  }

  TaskContext Context(const TaskRequest& request) {
    TaskContext task;
    task.snapshot = &*snapshot_;
    task.request = &request;
    task.model_allowed.assign(snapshot_->ModelCount(), true);
    task.mig_profile.assign(snapshot_->ModelCount(), nullptr);
    if (const auto* mig = std::get_if<MigGpus>(&request.gpus)) {
      for (int m = 0; m < snapshot_->ModelCount(); ++m) {
        task.mig_profile[m] = snapshot_->Model(m).FindMigProfile(mig->profile);
      }
    }
    return task;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
};

TEST_F(DevicesTest, WholeGpusComeFromTheFullestNvlinkDomainThatHoldsThem) {
  // Domain 0 has GPUs 0..3 idle, domain 1 only 6 and 7 after this.
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{4, 1000, 0}, {5, 1000, 0}}}));
  const TaskRequest two{{}, WholeGpus{2}};
  auto picked = DefaultGpuPick(Context(two), snapshot_->nodes()[0], ~GpuMask{0});
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 6);
  EXPECT_EQ((*picked)[1].gpu, 7);
  const TaskRequest four{{}, WholeGpus{4}};
  picked = DefaultGpuPick(Context(four), snapshot_->nodes()[0], ~GpuMask{0});
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 0);
  EXPECT_EQ((*picked)[3].gpu, 3);
  // Five need both domains; a mask without GPUs 0 and 1 leaves only four idle GPUs.
  const TaskRequest five{{}, WholeGpus{5}};
  EXPECT_TRUE(DefaultGpuPick(Context(five), snapshot_->nodes()[0], ~GpuMask{0}).has_value());
  EXPECT_FALSE(DefaultGpuPick(Context(five), snapshot_->nodes()[0], ~GpuMask{3}).has_value());
}

TEST_F(DevicesTest, SharesGoToTheFittingGpuWithLeastFreeCompute) {
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{1, 600, 0}, {2, 300, 0}}}));
  const TaskRequest share{{}, FractionalGpu{400, 0}};
  auto picked = DefaultGpuPick(Context(share), snapshot_->nodes()[0], ~GpuMask{0});
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 1);  // 400 free: the tightest that fits
  const TaskRequest big{{}, FractionalGpu{500, 0}};
  picked = DefaultGpuPick(Context(big), snapshot_->nodes()[0], ~GpuMask{0});
  EXPECT_EQ((*picked)[0].gpu, 2);  // 700 free
}

TEST_F(DevicesTest, MpsSharesGoOnlyWhereNoTimeSlicedShareIs) {
  // GPU 0 holds a time-sliced share, GPU 1 an MPS client; the rest of node n is idle but masked.
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{0, 100, 0, "", -1, false, false}}}));
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{1, 200, 0, "", -1, false, true}}}));
  const GpuMask first_two = 0b11;
  const TaskRequest mps{{}, FractionalGpu{300, 0, GpuSharing::kMps}};
  auto picked = DefaultGpuPick(Context(mps), snapshot_->nodes()[0], first_two);
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 1);
  EXPECT_TRUE((*picked)[0].mps);
  EXPECT_EQ(GpuTaskCapacity(Context(mps), snapshot_->nodes()[0], first_two, 100), 2);
  const TaskRequest sliced{{}, FractionalGpu{300, 0, GpuSharing::kTimeSlicing}};
  picked = DefaultGpuPick(Context(sliced), snapshot_->nodes()[0], first_two);
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 0);
  EXPECT_FALSE((*picked)[0].mps);
  EXPECT_EQ(GpuTaskCapacity(Context(sliced), snapshot_->nodes()[0], first_two, 100), 3);
  // A stale placement that would mix them is refused, with nothing changed.
  EXPECT_THAT(
      snapshot_->Apply({0, 0, 0, {}, {{0, 100, 0, "", -1, false, true}}}),
      StatusIs(StatusCode::kFailedPrecondition,
               ::testing::HasSubstr("gpu 0: an MPS share cannot join the time-sliced shares")));
  EXPECT_EQ(snapshot_->nodes()[0].gpus[0].free_milli, 900);
}

TEST_F(DevicesTest, NoFreeGpusReasonNamesTheSharingConflict) {
  // GPU 0 holds a time-sliced share, GPU 1 an MPS client, each with room for 300 more.
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{0, 100, 0, "", -1, false, false}}}));
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{1, 200, 0, "", -1, false, true}}}));
  const NodeInfo& node = snapshot_->nodes()[0];
  const TaskRequest mps{{}, FractionalGpu{300, 0, GpuSharing::kMps}};
  const TaskRequest sliced{{}, FractionalGpu{300, 0, GpuSharing::kTimeSlicing}};
  EXPECT_EQ(NoFreeGpusReason(Context(mps), node, GpuMask{0b01}), kMpsMeetsTimeSlicedReason);
  EXPECT_EQ(NoFreeGpusReason(Context(sliced), node, GpuMask{0b10}), kTimeSlicedMeetsMpsReason);
  // Without the room, the conflict is not what keeps the share off.
  const TaskRequest big_mps{{}, FractionalGpu{950, 0, GpuSharing::kMps}};
  EXPECT_EQ(NoFreeGpusReason(Context(big_mps), node, GpuMask{0b01}), kNoFreeGpusReason);
  const TaskRequest whole{{}, WholeGpus{1}};
  EXPECT_EQ(NoFreeGpusReason(Context(whole), node, GpuMask{0b11}), kNoFreeGpusReason);
  const TaskRequest mig{{}, MigGpus{"1g.5gb", 1}};
  EXPECT_EQ(NoFreeGpusReason(Context(mig), snapshot_->nodes()[1], ~GpuMask{0}), kNoMigSlotReason);
}

TEST_F(DevicesTest, ShareMemoryIsAccountedFor) {
  const TaskRequest share{{}, FractionalGpu{100, 70 * 1024}};
  const TaskContext task = Context(share);
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{0, 100, 70 * 1024}}}));
  auto picked = DefaultGpuPick(task, snapshot_->nodes()[0], GpuMask{1});
  EXPECT_FALSE(picked.has_value());  // GPU 0 has compute left but only 10 GiB
  EXPECT_EQ(GpuTaskCapacity(task, snapshot_->nodes()[0], ~GpuMask{0}, 100), 7);
}

TEST_F(DevicesTest, MigInstancesPackOntoTheFullestGpu) {
  const TaskRequest request{{}, MigGpus{"3g.20gb", 3}};
  const TaskContext task = Context(request);
  const NodeInfo& node = snapshot_->nodes()[1];
  EXPECT_EQ(GpuTaskCapacity(task, node, ~GpuMask{0}, 10), 1);  // 2 per GPU, 4 in all
  auto picked = DefaultGpuPick(task, node, ~GpuMask{0});
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 0);
  EXPECT_EQ((*picked)[0].mig_start, 0);
  EXPECT_EQ((*picked)[1].gpu, 0);
  EXPECT_EQ((*picked)[1].mig_start, 4);
  EXPECT_EQ((*picked)[2].gpu, 1);
  const TaskRequest five{{}, MigGpus{"3g.20gb", 5}};
  EXPECT_FALSE(DefaultGpuPick(Context(five), node, ~GpuMask{0}).has_value());
}

TEST_F(DevicesTest, HostResourcesBoundTheTaskCount) {
  const TaskRequest request{{48000, 1024}, FractionalGpu{100, 0}};
  EXPECT_EQ(MaxTasksOnNode(Context(request), snapshot_->nodes()[0], ~GpuMask{0}, 100), 2);
  const TaskRequest cpu_only{{1000, 0}, NoGpu{}};
  EXPECT_EQ(MaxTasksOnNode(Context(cpu_only), snapshot_->nodes()[0], 0, 50), 50);
}

}  // namespace
}  // namespace gpufleet::scheduler
