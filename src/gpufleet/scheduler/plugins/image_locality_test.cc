// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/image_locality.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeJob;
using testing::MakeNode;

constexpr char kImage[] = "nvcr.io/nvidia/pytorch:24.05-py3";
constexpr char kDigest[] =
    "sha256:22700987b9883debbb9d822f1137f76cb8a8164d662310127f8f1f0af6b1bfca";
constexpr int64_t kTenGiB = int64_t{10} << 30;

CachedImage Image(int64_t size_bytes = kTenGiB, std::string reference = kImage) {
  return CachedImage{{std::move(reference)}, kDigest, size_bytes};
}

TEST(ImageLocalityFindTest, MatchesByCanonicalNameOrPinnedDigest) {
  Node node = MakeNode("n", 8);
  node.cached_images = {Image(kTenGiB, "docker.io/library/busybox:latest"), Image()};
  EXPECT_EQ(ImageLocalityScore::FindImage(node, "busybox"), &node.cached_images[0]);
  EXPECT_EQ(ImageLocalityScore::FindImage(node, "library/busybox:latest"), &node.cached_images[0]);
  EXPECT_EQ(ImageLocalityScore::FindImage(node, kImage), &node.cached_images[1]);
  EXPECT_EQ(ImageLocalityScore::FindImage(node, std::string("nvcr.io/other@") + kDigest),
            &node.cached_images[0]);
  EXPECT_EQ(ImageLocalityScore::FindImage(node, "nvcr.io/nvidia/pytorch:24.06-py3"), nullptr);
  EXPECT_EQ(ImageLocalityScore::FindImage(node, "busybox:1"), nullptr);
}

class ImageLocalityTest : public ::testing::Test {
 protected:
  void Use(Cluster cluster, int64_t weight = 1) {
    auto snapshot = ClusterSnapshot::Build(std::move(cluster), catalog_);
    ASSERT_OK(snapshot);
    snapshot_.emplace(std::move(snapshot).value());
    SchedulerOptions options;
    options.image_locality_weight = weight;
    auto scheduler = Scheduler::Create(options, PluginRegistry::Default());
    ASSERT_OK(scheduler);
    scheduler_ = std::move(scheduler).value();
  }

  // Nodes in order, 8 H100 each; a0..a{na-1} in leaf-a, b0..b{nb-1} in leaf-b.
  static Cluster Leaves(int na, int nb) {
    Cluster cluster;
    cluster.topology = Topology({"leaf"});
    for (int i = 0; i < na; ++i) {
      cluster.nodes.push_back(MakeNode("a" + std::to_string(i), 8, "H100-80GB", {"leaf-a"}));
    }
    for (int i = 0; i < nb; ++i) {
      cluster.nodes.push_back(MakeNode("b" + std::to_string(i), 8, "H100-80GB", {"leaf-b"}));
    }
    return cluster;
  }

  static Node& NodeNamed(Cluster& cluster, const std::string& name) {
    for (Node& node : cluster.nodes) {
      if (node.id.value() == name) {
        return node;
      }
    }
    ADD_FAILURE() << "no node " << name;
    return cluster.nodes.front();
  }

  // The nodes of the placements, in placement order.
  std::vector<std::string> Nodes(const Job& job) {
    Random random(1);
    const ScheduleResult result = scheduler_->Schedule(job, *snapshot_, random);
    EXPECT_TRUE(result.scheduled()) << result.reason;
    std::vector<std::string> nodes;
    for (const TaskPlacement& placement : result.placements) {
      nodes.push_back(snapshot_->nodes()[placement.node].node->id.value());
    }
    return nodes;
  }

  static Job Gang(int tasks, int gpus, const std::string& image = kImage) {
    Job job = MakeJob("gang", tasks, WholeGpus{gpus});
    job.groups[0].image = image;
    return job;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(ImageLocalityTest, WithEqualOtherScoresTheGangLandsOnTheNodesHoldingItsImage) {
  Cluster cluster = Leaves(4, 0);
  NodeNamed(cluster, "a2").cached_images = {Image()};
  NodeNamed(cluster, "a3").cached_images = {Image()};
  Use(cluster);
  EXPECT_THAT(Nodes(Gang(2, 8)), ElementsAre("a2", "a3"));
  // Without the plugin, or for a job without an image, node order decides the tie.
  Use(cluster, /*weight=*/0);
  EXPECT_THAT(Nodes(Gang(2, 8)), ElementsAre("a0", "a1"));
  Use(cluster);
  EXPECT_THAT(Nodes(Gang(2, 8, "")), ElementsAre("a0", "a1"));
}

TEST_F(ImageLocalityTest, ASmallImageMovesNoTask) {
  Cluster cluster = Leaves(2, 0);
  NodeNamed(cluster, "a1").cached_images = {Image(2 * 1000 * 1000)};  // 2 MB
  Use(cluster);
  EXPECT_THAT(Nodes(Gang(1, 8)), ElementsAre("a0"));
}

TEST_F(ImageLocalityTest, NeverBeatsTheDomainTheTopologyChooses) {
  // A preferred leaf: the gang of 2 goes to the smallest leaf that holds it (leaf-b), not to
  // leaf-a whose nodes hold the image.
  Cluster cluster = Leaves(3, 2);
  NodeNamed(cluster, "a0").cached_images = {Image()};
  NodeNamed(cluster, "a1").cached_images = {Image()};
  Use(cluster);
  Job job = Gang(2, 8);
  job.topology.preferred_level = "leaf";
  EXPECT_THAT(Nodes(job), ElementsAre("b0", "b1"));
}

TEST_F(ImageLocalityTest, NeverBeatsTheTopologyPreferenceScore) {
  // No leaf has 3 free nodes (a0 is full), so the gang spans leaves and the preferred-topology
  // score places it. The first task goes to a holder, a2 (every other score ties); the second
  // stays in the first one's leaf (a1) although b1 holds the image; the third, where the
  // topology ties again, goes to the holder b1.
  Cluster cluster = Leaves(3, 2);
  NodeNamed(cluster, "a2").cached_images = {Image()};
  NodeNamed(cluster, "b1").cached_images = {Image()};
  Use(cluster);
  ASSERT_OK(snapshot_->Apply({0,
                              0,
                              0,
                              {},
                              {{0, 1000, 0},
                               {1, 1000, 0},
                               {2, 1000, 0},
                               {3, 1000, 0},
                               {4, 1000, 0},
                               {5, 1000, 0},
                               {6, 1000, 0},
                               {7, 1000, 0}}}));
  Job job = Gang(3, 8);
  job.topology.preferred_level = "leaf";
  EXPECT_THAT(Nodes(job), ElementsAre("a2", "a1", "b1"));
}

TEST_F(ImageLocalityTest, NeverBeatsAFitConstraintOrThePolicy) {
  Cluster cluster = Leaves(2, 0);
  NodeNamed(cluster, "a1").cached_images = {Image()};
  Use(cluster);
  // a1 holds the image but has 4 GPUs busy: a task of 8 cannot go there.
  ASSERT_OK(
      snapshot_->Apply({0, 0, 1, {}, {{0, 1000, 0}, {1, 1000, 0}, {2, 1000, 0}, {3, 1000, 0}}}));
  EXPECT_THAT(Nodes(Gang(1, 8)), ElementsAre("a0"));
  // A task of 4 fits both (a0 has 0 free now); with a fresh snapshot, best-fit prefers the
  // fuller node a1 anyway, and a holder a0 would not move it.
  Cluster other = Leaves(2, 0);
  NodeNamed(other, "a0").cached_images = {Image()};
  Use(other);
  ASSERT_OK(
      snapshot_->Apply({0, 0, 1, {}, {{0, 1000, 0}, {1, 1000, 0}, {2, 1000, 0}, {3, 1000, 0}}}));
  EXPECT_THAT(Nodes(Gang(1, 4)), ElementsAre("a1"));
}

TEST_F(ImageLocalityTest, IsATieBreakScoreOnly) {
  SchedulerOptions options;
  options.extra_plugins = {"image-locality"};
  EXPECT_THAT(Scheduler::Create(options, PluginRegistry::Default()).status().message(),
              HasSubstr("image_locality_weight"));
  options.extra_plugins.clear();
  options.image_locality_weight = -1;
  EXPECT_THAT(Scheduler::Create(options, PluginRegistry::Default()).status().message(),
              HasSubstr("image_locality_weight: -1"));
}

}  // namespace
}  // namespace gpufleet::scheduler
