// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/scheduler.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/fragmentation.h"
#include "gpufleet/scheduler/plugins/filters.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using ::testing::HasSubstr;
using testing::MakeJob;
using testing::MakeNode;

class SchedulerTest : public ::testing::Test {
 protected:
  void Use(Cluster cluster, const std::string& policy = "best-fit") {
    auto snapshot = ClusterSnapshot::Build(std::move(cluster), catalog_);
    ASSERT_OK(snapshot);
    snapshot_.emplace(std::move(snapshot).value());
    SchedulerOptions options;
    options.policy = policy;
    options.plugin_args.target_workload =
        TargetWorkload::FromShapes({{1000, 300, 1, {}}, {1000, 1000, 1, {}}}, 1.0);
    auto scheduler = Scheduler::Create(options, PluginRegistry::Default());
    ASSERT_OK(scheduler);
    scheduler_ = std::move(scheduler).value();
  }

  // Two leaves in one block: leaf-a has 3 nodes, leaf-b has 2; 8 H100 each.
  Cluster TwoLeaves() {
    Cluster cluster;
    cluster.topology = Topology({"block", "leaf"});
    for (int i = 0; i < 3; ++i) {
      cluster.nodes.push_back(MakeNode("a" + std::to_string(i), 8, "H100-80GB", {"b0", "leaf-a"}));
    }
    for (int i = 0; i < 2; ++i) {
      cluster.nodes.push_back(MakeNode("b" + std::to_string(i), 8, "H100-80GB", {"b0", "leaf-b"}));
    }
    return cluster;
  }

  ScheduleResult Schedule(const Job& job, uint64_t seed = 1) {
    Random random(seed);
    return scheduler_->Schedule(job, *snapshot_, random);
  }

  // The leaves (by path, "b0/leaf-a") that hold the placements.
  std::set<std::string> LeavesOf(const ScheduleResult& result) {
    std::set<std::string> leaves;
    for (const TaskPlacement& placement : result.placements) {
      const NodeInfo& node = snapshot_->nodes()[placement.node];
      leaves.insert(snapshot_->DomainName(1, node.domains[1]));
    }
    return leaves;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
  std::unique_ptr<Scheduler> scheduler_;
};

// With require_container_runtime (the server's scheduler), a job with an image goes to the node
// whose agent runs containers, and on process-only nodes pends with the reason; without it (the
// simulator), any node runs it.
TEST_F(SchedulerTest, ContainerJobsGoOnlyToNodesThatRunContainers) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("process", 8));
  cluster.nodes.push_back(MakeNode("podman", 8));
  cluster.nodes[1].labels[std::string(kContainerRuntimeLabel)] = "podman";
  Use(cluster);
  Job job = MakeJob("c", 1, WholeGpus{1});
  job.groups[0].image = "registry.example/train:1";
  ASSERT_TRUE(Schedule(job).scheduled());
  EXPECT_EQ(Schedule(job).placements[0].node, 0) << "best-fit's first node, unfiltered";

  SchedulerOptions options;
  options.require_container_runtime = true;
  auto filtered = Scheduler::Create(options, PluginRegistry::Default());
  ASSERT_OK(filtered);
  Random random(1);
  ScheduleResult result = (*filtered)->Schedule(job, *snapshot_, random);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(result.placements[0].node, 1);
  Job process = MakeJob("p", 1, WholeGpus{1});
  result = (*filtered)->Schedule(process, *snapshot_, random);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(result.placements[0].node, 0) << "a process goes anywhere";

  cluster.nodes.pop_back();
  Use(cluster);
  result = (*filtered)->Schedule(job, *snapshot_, random);
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.reason, HasSubstr("node runs no container runtime"));
}

// A node with a degraded link (kLinkDegradedLabel) takes no task of a gang that may span nodes;
// a one-task job, or a gang held to one node, may use it.
TEST_F(SchedulerTest, ADegradedLinkKeepsGangsThatMaySpanNodesOff) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("degraded", 8));
  cluster.nodes.push_back(MakeNode("healthy", 8));
  cluster.nodes[0].labels[std::string(kLinkDegradedLabel)] = "true";
  Use(cluster);
  const ScheduleResult gang = Schedule(MakeJob("gang", 2, WholeGpus{4}));
  ASSERT_TRUE(gang.scheduled()) << gang.reason;
  for (const TaskPlacement& placement : gang.placements) {
    EXPECT_EQ(placement.node, 1);
  }
  const ScheduleResult solo = Schedule(MakeJob("solo", 1, WholeGpus{8}));
  ASSERT_TRUE(solo.scheduled()) << solo.reason;
  EXPECT_EQ(solo.placements[0].node, 0);
  Job one_node = MakeJob("one-node", 2, WholeGpus{4});
  one_node.topology.required_level = std::string(kNodeLevel);
  Use(cluster);
  const ScheduleResult held = Schedule(one_node);
  ASSERT_TRUE(held.scheduled()) << held.reason;
  Use(cluster);
  const ScheduleResult wide = Schedule(MakeJob("wide", 2, WholeGpus{8}));
  EXPECT_FALSE(wide.scheduled());
  EXPECT_THAT(wide.reason, HasSubstr("only part of the gang fits (1 nodes can take a task)"));
}

TEST_F(SchedulerTest, PlacesASingleTask) {
  Use(TwoLeaves());
  const ScheduleResult result = Schedule(MakeJob("j", 1, WholeGpus{2}));
  ASSERT_TRUE(result.scheduled()) << result.reason;
  ASSERT_EQ(result.placements.size(), 1U);
  EXPECT_EQ(result.placements[0].gpus.size(), 2U);
  EXPECT_EQ(snapshot_->AllocatedGpuMilli(), 2000);
}

// 4 nodes x 8 GPUs fit in the cluster (5 nodes) but in no single leaf (3 and 2 nodes).
TEST_F(SchedulerTest, GangThatFitsTheClusterButNoLeafIsNotPlacedUnderRequiredLeaf) {
  Use(TwoLeaves());
  Job job = MakeJob("gang", 4, WholeGpus{8});
  job.topology.required_level = "leaf";
  const ScheduleResult result = Schedule(job);
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.reason, HasSubstr("no leaf can hold all tasks"));
  EXPECT_THAT(result.reason, HasSubstr("the best, b0/leaf-a, can hold 3"));
  EXPECT_EQ(snapshot_->AllocatedGpuMilli(), 0);
  job.topology.required_level.clear();
  const ScheduleResult unconstrained = Schedule(job);
  ASSERT_TRUE(unconstrained.scheduled()) << unconstrained.reason;
  EXPECT_EQ(LeavesOf(unconstrained).size(), 2U);
}

TEST_F(SchedulerTest, RequiredLeafChoosesTheSmallestLeafThatHoldsTheGang) {
  Use(TwoLeaves());
  Job job = MakeJob("gang", 2, WholeGpus{8});
  job.topology.required_level = "leaf";
  const ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(LeavesOf(result), (std::set<std::string>{"b0/leaf-b"}));
}

TEST_F(SchedulerTest, PreferredNodeKeepsAGangOnOneNodeWhenItCan) {
  Use(TwoLeaves());
  // Occupy half of every node except b1, so only b1 can take both tasks together.
  for (int n = 0; n < 4; ++n) {
    ASSERT_OK(
        snapshot_->Apply({0, 0, n, {}, {{0, 1000, 0}, {1, 1000, 0}, {2, 1000, 0}, {3, 1000, 0}}}));
  }
  Job job = MakeJob("pair", 2, WholeGpus{4});
  job.topology.preferred_level = "node";
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE(seed);
    const ScheduleResult result = Schedule(job, seed);
    ASSERT_TRUE(result.scheduled()) << result.reason;
    EXPECT_EQ(result.placements[0].node, 4);
    EXPECT_EQ(result.placements[1].node, 4);
    for (const TaskPlacement& placement : result.placements) {
      snapshot_->Release(placement);
    }
  }
}

TEST_F(SchedulerTest, RequiredNvlinkDomainKeepsEachTaskInOneDomain) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 8));
  for (int g = 4; g < 8; ++g) {
    cluster.nodes[0].gpus[g].nvlink_domain = 1;
  }
  Use(cluster);
  // GPUs 0 and 5 are busy: 3 free in each domain, 6 in all.
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{0, 1000, 0}, {5, 1000, 0}}}));
  Job job = MakeJob("j", 1, WholeGpus{4});
  job.topology.required_level = "nvlink-domain";
  EXPECT_FALSE(Schedule(job).scheduled());
  job.topology.required_level.clear();
  EXPECT_TRUE(Schedule(job).scheduled());
}

TEST_F(SchedulerTest, MigRequestThatFitsFreeSlicesButNoValidStartIsNotPlaced) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 1, "A100-80GB"));
  cluster.nodes[0].gpus[0].mig_enabled = true;
  // 1g instances at 0, 2, 4, 6: slices 1, 3, 5, 7 are free, four in all.
  for (int start : {0, 2, 4, 6}) {
    cluster.nodes[0].gpus[0].mig_instances.push_back({"1g.10gb", start, true});
  }
  Use(cluster);
  const ScheduleResult result = Schedule(MakeJob("j", 1, MigGpus{"2g.20gb", 1}));
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.reason, HasSubstr("no free MIG instance or valid MIG start slot"));
  const ScheduleResult small = Schedule(MakeJob("k", 1, MigGpus{"1g.10gb", 1}));
  ASSERT_TRUE(small.scheduled()) << small.reason;
  EXPECT_EQ(small.placements[0].gpus[0].mig_start, 1);
  EXPECT_TRUE(small.placements[0].gpus[0].mig_created);
}

TEST_F(SchedulerTest, MigRequestClaimsAFreeExistingInstanceFirst) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 1, "H100-80GB"));
  cluster.nodes[0].gpus[0].mig_enabled = true;
  cluster.nodes[0].gpus[0].mig_instances.push_back({"3g.40gb", 4, false});
  Use(cluster);
  const ScheduleResult result = Schedule(MakeJob("j", 1, MigGpus{"3g.40gb", 1}));
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(result.placements[0].gpus[0].mig_start, 4);
  EXPECT_FALSE(result.placements[0].gpus[0].mig_created);
}

TEST_F(SchedulerTest, UnhealthyAndQuarantinedGpusAreNeverChosen) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 8));
  cluster.nodes[0].gpus[2].health = GpuHealth::kUnhealthy;
  cluster.nodes[0].gpus[5].health = GpuHealth::kQuarantined;
  cluster.nodes[0].gpus[6].health = GpuHealth::kDegraded;
  Use(cluster);
  EXPECT_FALSE(Schedule(MakeJob("all", 1, WholeGpus{8})).scheduled());
  EXPECT_FALSE(Schedule(MakeJob("seven", 1, WholeGpus{7})).scheduled());
  const ScheduleResult six = Schedule(MakeJob("six", 1, WholeGpus{6}));
  ASSERT_TRUE(six.scheduled()) << six.reason;
  for (const GpuAssignment& gpu : six.placements[0].gpus) {
    EXPECT_NE(gpu.gpu, 2);
    EXPECT_NE(gpu.gpu, 5);
  }
  snapshot_->Release(six.placements[0]);
  // Six usable GPUs take twelve half shares, and not one more.
  for (int share = 0; share < 12; ++share) {
    const ScheduleResult result = Schedule(MakeJob("s", 1, FractionalGpu{500, 0}), share);
    ASSERT_TRUE(result.scheduled());
    EXPECT_NE(result.placements[0].gpus[0].gpu, 2);
    EXPECT_NE(result.placements[0].gpus[0].gpu, 5);
  }
  EXPECT_FALSE(Schedule(MakeJob("s", 1, FractionalGpu{500, 0})).scheduled());
}

TEST_F(SchedulerTest, GangIsNeverHalfPlaced) {
  Use(TwoLeaves());
  // 5 nodes can take 5 of the 6 tasks: nothing may be placed.
  const ScheduleResult result = Schedule(MakeJob("gang", 6, WholeGpus{8}));
  EXPECT_FALSE(result.scheduled());
  EXPECT_TRUE(result.placements.empty());
  EXPECT_EQ(snapshot_->AllocatedGpuMilli(), 0);
  for (const NodeInfo& node : snapshot_->nodes()) {
    EXPECT_EQ(node.IdleGpuCount(), 8);
    EXPECT_EQ(node.free, node.capacity);
  }
  EXPECT_THAT(result.reason, HasSubstr("only part of the gang fits"));
}

TEST_F(SchedulerTest, MultiGroupGangIsAllOrNothing) {
  Use(TwoLeaves());
  Job job = MakeJob("mixed", 5, WholeGpus{8});
  job.groups.push_back({"eval", 1, {{1000, 1024}, FractionalGpu{100, 0}}});
  EXPECT_FALSE(Schedule(job).scheduled());
  EXPECT_EQ(snapshot_->AllocatedGpuMilli(), 0);
  job.groups[0].replicas = 4;
  const ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(result.placements.size(), 5U);
}

TEST_F(SchedulerTest, SameSeedGivesTheSamePlacement) {
  for (const std::string& policy : PlacementPolicyNames()) {
    SCOPED_TRACE(policy);
    std::vector<std::vector<TaskPlacement>> runs;
    for (int run = 0; run < 2; ++run) {
      Use(TwoLeaves(), policy);
      Random random(42);
      std::vector<TaskPlacement> placements;
      for (int i = 0; i < 20; ++i) {
        const ScheduleResult result = scheduler_->Schedule(
            MakeJob("j" + std::to_string(i), 1, FractionalGpu{300 + 10 * i, 0}), *snapshot_,
            random);
        ASSERT_TRUE(result.scheduled());
        placements.push_back(result.placements[0]);
      }
      runs.push_back(placements);
    }
    EXPECT_EQ(runs[0], runs[1]);
  }
}

TEST_F(SchedulerTest, CordonedDrainingAndNotReadyNodesTakeNoTask) {
  Cluster cluster = TwoLeaves();
  cluster.nodes[0].state = NodeState::kCordoned;
  cluster.nodes[1].state = NodeState::kDraining;
  cluster.nodes[2].state = NodeState::kNotReady;
  Use(cluster);
  const ScheduleResult result = Schedule(MakeJob("gang", 3, WholeGpus{8}));
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.details, ::testing::Contains(HasSubstr("node is cordoned")));
  const ScheduleResult two = Schedule(MakeJob("gang", 2, WholeGpus{8}));
  ASSERT_TRUE(two.scheduled());
  EXPECT_EQ(LeavesOf(two), (std::set<std::string>{"b0/leaf-b"}));
}

TEST_F(SchedulerTest, AllowedModelsMinimumMemoryAndSelectors) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("t4", 4, "T4"));
  cluster.nodes.push_back(MakeNode("h100", 4, "H100-80GB"));
  cluster.nodes[1].labels["zone"] = "east";
  Use(cluster);
  Job job = MakeJob("j", 1, WholeGpus{1});
  job.allowed_gpu_models = {"T4"};
  ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled());
  EXPECT_EQ(result.placements[0].node, 0);
  job.allowed_gpu_models.clear();
  job.min_gpu_memory_mib = 40 * 1024;
  result = Schedule(job);
  ASSERT_TRUE(result.scheduled());
  EXPECT_EQ(result.placements[0].node, 1);
  job.min_gpu_memory_mib = 0;
  job.node_selector["zone"] = "west";
  result = Schedule(job);
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.reason, HasSubstr("2 node labels do not match the node selector"));
}

TEST_F(SchedulerTest, ThermalHeadroomKeepsHotGpusFree) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 2));
  cluster.nodes[0].gpus[0].thermal_headroom_c = 2;
  Use(cluster);
  ScheduleResult result = Schedule(MakeJob("j", 1, WholeGpus{1}));
  ASSERT_TRUE(result.scheduled());
  EXPECT_EQ(result.placements[0].gpus[0].gpu, 1);
  EXPECT_FALSE(Schedule(MakeJob("k", 1, WholeGpus{1})).scheduled());
}

TEST_F(SchedulerTest, IdenticalStackKeepsTheGangOnOneDriverAndCuda) {
  Cluster cluster;
  for (int i = 0; i < 5; ++i) {
    cluster.nodes.push_back(MakeNode("n" + std::to_string(i), 8));
    cluster.nodes[i].labels[std::string(kDriverVersionLabel)] = i < 3 ? "550.54" : "560.28";
    cluster.nodes[i].labels[std::string(kCudaVersionLabel)] = "12.4";
  }
  Use(cluster);
  Job job = MakeJob("gang", 4, WholeGpus{8});
  job.identical_stack_labels = {std::string(kDriverVersionLabel), std::string(kCudaVersionLabel)};
  EXPECT_FALSE(Schedule(job).scheduled());
  job.groups[0].replicas = 3;
  const ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  for (const TaskPlacement& placement : result.placements) {
    EXPECT_LT(placement.node, 3);
  }
  // A node without the labels is never part of such a gang.
  snapshot_.reset();
  cluster.nodes[0].labels.clear();
  Use(cluster);
  const ScheduleResult without = Schedule(job);
  EXPECT_FALSE(without.scheduled());
  // With a required level and no node able to take a task, the reason says why.
  for (Node& node : cluster.nodes) {
    node.labels.clear();
  }
  Use(cluster);
  job.topology.required_level = "node";
  EXPECT_THAT(Schedule(job).reason,
              HasSubstr("(0/5 nodes can take a task: 5 node lacks a software-stack label)"));
}

TEST_F(SchedulerTest, IdenticalStackKeepsAGangOnOneImageDigestFromWhatAgentsReport) {
  const std::string a = "sha256:" + std::string(64, 'a');
  const std::string b = "sha256:" + std::string(64, 'b');
  Cluster cluster;
  for (int i = 0; i < 4; ++i) {
    cluster.nodes.push_back(MakeNode("n" + std::to_string(i), 8));
  }
  // n0 and n1 hold the tag at one digest, n2 at another (pulled after the tag moved), n3 not.
  for (int i = 0; i < 3; ++i) {
    cluster.nodes[i].cached_images = {{{"localhost/tiny:1"}, i < 2 ? a : b, 1 << 20}};
  }
  Use(cluster);
  Job job = MakeJob("gang", 2, WholeGpus{8});
  job.groups[0].image = "localhost/tiny:1";
  job.identical_stack_labels = {std::string(kImageDigestStackKey)};
  ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  for (const TaskPlacement& placement : result.placements) {
    EXPECT_LT(placement.node, 2) << "only n0 and n1 hold one digest twice";
  }
  snapshot_.reset();  // a fresh cluster for each question
  Use(cluster);
  job.groups[0].replicas = 3;
  result = Schedule(job);
  EXPECT_FALSE(result.scheduled()) << "a 3-node gang would mix digests";
  EXPECT_THAT(result.reason, HasSubstr("no set of nodes with one identical stack can hold all "
                                       "tasks of group \"workers\""));
  EXPECT_THAT(result.reason, HasSubstr("the best, cluster [" + a + "], can hold 2"));

  // Pinned: nodes holding another digest are left out, the others pull the pinned one.
  job.identical_image_digest = b;
  snapshot_.reset();
  Use(cluster);
  result = Schedule(job);
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.reason,
              HasSubstr("node holds the image at a digest other than identicalStack.imageDigest"));
  job.groups[0].replicas = 2;
  result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  for (const TaskPlacement& placement : result.placements) {
    EXPECT_GE(placement.node, 2);
  }
}

TEST_F(SchedulerTest, SpreadAcrossFaultDomainsHonoursMaxSkew) {
  Cluster cluster;
  for (int i = 0; i < 4; ++i) {
    cluster.nodes.push_back(MakeNode("n" + std::to_string(i), 8));
    cluster.nodes[i].fault_domains["rack"] = i < 2 ? "r1" : "r2";
  }
  Use(cluster, "gpu-packing");
  Job job = MakeJob("spread", 4, WholeGpus{1});
  job.spread = {"rack", 1};
  const ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  int in_r1 = 0;
  for (const TaskPlacement& placement : result.placements) {
    in_r1 += placement.node < 2 ? 1 : 0;
  }
  EXPECT_EQ(in_r1, 2);
  job.spread.fault_domain = "power-feed";
  const ScheduleResult missing = Schedule(job);
  EXPECT_FALSE(missing.scheduled());
  EXPECT_THAT(missing.reason, HasSubstr("fault-domain label"));
}

TEST_F(SchedulerTest, UnknownTopologyLevelIsReported) {
  Use(TwoLeaves());
  Job job = MakeJob("j", 1, WholeGpus{1});
  job.topology.required_level = "rack";
  const ScheduleResult result = Schedule(job);
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.reason, HasSubstr("known: block, leaf, node, nvlink-domain"));
}

TEST_F(SchedulerTest, InvalidJobIsAnError) {
  Use(TwoLeaves());
  const ScheduleResult result = Schedule(MakeJob("j", 0, WholeGpus{1}));
  EXPECT_EQ(result.outcome, ScheduleOutcome::kError);
  EXPECT_THAT(result.error.message(), HasSubstr("groups[0].replicas: 0"));
}

class FailingBinder final : public Binder {
 public:
  Status Bind(const Job&, const std::vector<TaskPlacement>& placements,
              const ClusterSnapshot&) override {
    seen = placements.size();
    return Status(StatusCode::kAborted, "version conflict");
  }
  size_t seen = 0;
};

TEST_F(SchedulerTest, FailedBindRollsTheJobBack) {
  Use(TwoLeaves());
  FailingBinder binder;
  Random random(1);
  const ScheduleResult result =
      scheduler_->Schedule(MakeJob("gang", 3, WholeGpus{8}), *snapshot_, random, &binder);
  EXPECT_EQ(result.outcome, ScheduleOutcome::kError);
  EXPECT_EQ(binder.seen, 3U);
  EXPECT_EQ(result.error.code(), StatusCode::kAborted);
  EXPECT_EQ(snapshot_->AllocatedGpuMilli(), 0);
}

TEST_F(SchedulerTest, UnknownPolicyIsRejected) {
  SchedulerOptions options;
  options.policy = "magic";
  EXPECT_THAT(Scheduler::Create(options, PluginRegistry::Default()),
              gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                          HasSubstr("unknown policy \"magic\"")));
  for (const char* policy : {"fgd", "gpufleet"}) {
    options.policy = policy;
    EXPECT_THAT(Scheduler::Create(options, PluginRegistry::Default()),
                gpufleet::testing::StatusIs(StatusCode::kInvalidArgument,
                                            HasSubstr("needs a target workload")));
  }
}

TEST_F(SchedulerTest, LargeGangUnderRequiredBlockStaysInOneBlock) {
  auto cluster = MakeSyntheticCluster({4, 4, 4, 8, "H100-80GB"}, catalog_);
  ASSERT_OK(cluster);
  Use(*cluster);
  Job job = MakeJob("big", 16, WholeGpus{8});
  job.topology = {"block", "leaf"};
  const ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  std::set<int> blocks;
  for (const TaskPlacement& placement : result.placements) {
    blocks.insert(snapshot_->nodes()[placement.node].domains[0]);
  }
  EXPECT_EQ(blocks.size(), 1U);
  EXPECT_EQ(result.placements.size(), 16U);
}

// How many distinct domains a gang's placements use at each declared level (by path), and how
// many nodes and NVLink domains (node, NVLink id).
struct Footprint {
  std::vector<int> levels;
  int nodes = 0;
  int nvlink_domains = 0;
};

Footprint FootprintOf(const ClusterSnapshot& snapshot, const ScheduleResult& result) {
  Footprint footprint;
  for (size_t level = 0; level < snapshot.topology().levels().size(); ++level) {
    std::set<int> domains;
    for (const TaskPlacement& placement : result.placements) {
      domains.insert(snapshot.nodes()[placement.node].domains[level]);
    }
    footprint.levels.push_back(static_cast<int>(domains.size()));
  }
  std::set<int> nodes;
  std::set<std::pair<int, int>> nvlink;
  for (const TaskPlacement& placement : result.placements) {
    nodes.insert(placement.node);
    for (const GpuAssignment& gpu : placement.gpus) {
      nvlink.emplace(placement.node, snapshot.nodes()[placement.node].gpus[gpu.gpu].nvlink_domain);
    }
  }
  footprint.nodes = static_cast<int>(nodes.size());
  footprint.nvlink_domains = static_cast<int>(nvlink.size());
  return footprint;
}

// One node per entry: its path, GPUs and how many of them are busy (lowest indices first).
struct CompactNode {
  std::vector<std::string> path;
  int gpus = 8;
  int busy = 0;
};

// The cases where the peers' own test suites (Kueue's Topology Aware Scheduling, KAI-Scheduler's
// topology tests) place a gang more tightly than a task-by-task choice: each gang must use the
// fewest domains at every level below its required one, whatever the policy.
struct CompactCase {
  std::string name;
  std::vector<std::string> levels;
  std::vector<CompactNode> nodes;
  int tasks = 0;
  std::string required;
  std::string preferred;
  std::vector<int> levels_used;  // expected distinct domains per declared level
  int nodes_used = 0;
};

class CompactGangTest : public SchedulerTest, public ::testing::WithParamInterface<std::string> {};

TEST_P(CompactGangTest, UsesTheFewestDomainsAtEveryLevel) {
  const std::vector<CompactCase> cases = {
      // Two one-GPU tasks; one node has two free GPUs: both go there, not one on the tighter n0.
      {.name = "a small gang that fits one node is not split",
       .levels = {"rack"},
       .nodes = {{{"r0"}, 8, 7}, {{"r0"}, 8, 6}},
       .tasks = 2,
       .levels_used = {1},
       .nodes_used = 1},
      // Required block: b0 holds the gang (b1 has one free GPU); rack r0 of b0 holds all four on
      // a1, while the tightest nodes (a0, c0, c1) would spread them over both racks.
      {.name = "racks under a required block",
       .levels = {"block", "rack"},
       .nodes = {{{"b0", "r0"}, 8, 7},
                 {{"b0", "r0"}, 8, 4},
                 {{"b0", "r1"}, 8, 7},
                 {{"b0", "r1"}, 8, 6},
                 {{"b1", "r0"}, 8, 7}},
       .tasks = 4,
       .required = "block",
       .levels_used = {1, 1},
       .nodes_used = 1},
      // Five tasks prefer one block; none holds five (4, 1 and 2 free): 4 + 1 in two blocks.
      {.name = "blocks after a preferred block overflows",
       .levels = {"block", "rack"},
       .nodes = {{{"b0", "r0"}, 8, 4}, {{"b1", "r0"}, 8, 7}, {{"b2", "r0"}, 8, 6}},
       .tasks = 5,
       .preferred = "block",
       .levels_used = {2, 2},
       .nodes_used = 2},
      // Six tasks prefer one rack; none holds six (3, 2, 1, 1, 2 free): three racks (3 + 2 + 1).
      {.name = "racks after a preferred rack overflows",
       .levels = {"rack"},
       .nodes = {{{"r0"}, 8, 5}, {{"r1"}, 8, 6}, {{"r2"}, 8, 7}, {{"r3"}, 8, 7}, {{"r4"}, 8, 6}},
       .tasks = 6,
       .preferred = "rack",
       .levels_used = {3},
       .nodes_used = 3},
      // Racks repeat their names in both blocks: the gang still uses one block, one rack.
      {.name = "repeated rack names count as different racks",
       .levels = {"block", "rack"},
       .nodes = {{{"b0", "r0"}, 8, 7}, {{"b1", "r0"}, 8, 7}, {{"b1", "r1"}, 8, 6}},
       .tasks = 2,
       .levels_used = {1, 1},
       .nodes_used = 1},
  };
  for (const CompactCase& row : cases) {
    SCOPED_TRACE(row.name);
    snapshot_.reset();
    Cluster cluster;
    cluster.topology = Topology(row.levels);
    for (size_t n = 0; n < row.nodes.size(); ++n) {
      cluster.nodes.push_back(
          MakeNode(fmt::format("n{}", n), row.nodes[n].gpus, "H100-80GB", row.nodes[n].path));
    }
    Use(cluster, GetParam());
    for (size_t n = 0; n < row.nodes.size(); ++n) {
      if (row.nodes[n].busy > 0) {
        ASSERT_OK(snapshot_->Apply(
            testing::IdleGpusPlacement(*snapshot_, static_cast<int>(n), row.nodes[n].busy)));
      }
    }
    Job job = MakeJob("gang", row.tasks, WholeGpus{1});
    job.topology = {row.required, row.preferred};
    const ScheduleResult result = Schedule(job);
    ASSERT_TRUE(result.scheduled()) << result.reason;
    const Footprint footprint = FootprintOf(*snapshot_, result);
    EXPECT_EQ(footprint.levels, row.levels_used);
    EXPECT_EQ(footprint.nodes, row.nodes_used);
  }
}

// Two one-GPU tasks on one node whose NVLink domain 0 has one free GPU and domain 1 four: both
// go to domain 1, where the fullest-domain-first GPU choice alone would take one from each.
TEST_P(CompactGangTest, UsesTheFewestNvlinkDomainsOnANode) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 8));
  for (int g = 4; g < 8; ++g) {
    cluster.nodes[0].gpus[g].nvlink_domain = 1;
  }
  Use(cluster, GetParam());
  ASSERT_OK(snapshot_->Apply(testing::IdleGpusPlacement(*snapshot_, 0, 3)));
  const ScheduleResult result = Schedule(MakeJob("gang", 2, WholeGpus{1}));
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(FootprintOf(*snapshot_, result).nvlink_domains, 1);
}

// Two blocks each hold a rack named r1 with one 2-GPU node. Identified by value, "r1" would look
// like one rack holding both tasks; by path (b1/r1, b2/r1) no rack holds the gang.
TEST_P(CompactGangTest, RepeatedRackNamesAreDifferentRacks) {
  Cluster cluster;
  cluster.topology = Topology({"block", "rack"});
  cluster.nodes.push_back(MakeNode("n1", 2, "H100-80GB", {"b1", "r1"}));
  cluster.nodes.push_back(MakeNode("n2", 2, "H100-80GB", {"b2", "r1"}));
  Use(cluster, GetParam());
  Job job = MakeJob("gang", 2, WholeGpus{2});
  job.topology.required_level = "rack";
  const ScheduleResult result = Schedule(job);
  EXPECT_FALSE(result.scheduled());
  EXPECT_THAT(result.reason, HasSubstr("no rack can hold all tasks"));
  EXPECT_THAT(result.reason, HasSubstr("the best, b1/r1, can hold 1"));
  EXPECT_EQ(snapshot_->AllocatedGpuMilli(), 0);
  job.topology.required_level = "block";
  EXPECT_FALSE(Schedule(job).scheduled());
  job.topology.required_level.clear();
  EXPECT_TRUE(Schedule(job).scheduled());
}

INSTANTIATE_TEST_SUITE_P(EveryPolicy, CompactGangTest, ::testing::ValuesIn(PlacementPolicyNames()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// The compact plan counts each group's tasks per node on its own, an upper bound: n0 seems to
// hold the 8-GPU task and the 1-GPU one, but holds only one of them. The gang is still placed,
// over the whole domain.
TEST_F(SchedulerTest, ACompactPlanThatDoesNotHoldTheGangFallsBackToTheWholeDomain) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n0", 8));
  cluster.nodes.push_back(MakeNode("n1", 8));
  Use(cluster);
  ASSERT_OK(snapshot_->Apply(testing::IdleGpusPlacement(*snapshot_, 1, 7)));
  Job job = MakeJob("mixed", 1, WholeGpus{8});
  job.groups.push_back({"eval", 1, {{1000, 1024}, WholeGpus{1}}});
  const ScheduleResult result = Schedule(job);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(FootprintOf(*snapshot_, result).nodes, 2);
}

// A job spread over fault domains is spread, not compacted; a single task is left to the policy.
TEST_F(SchedulerTest, SpreadJobsAndSingleTasksAreNotCompacted) {
  Cluster cluster;
  cluster.topology = Topology({"rack"});
  for (int i = 0; i < 4; ++i) {
    cluster.nodes.push_back(MakeNode(fmt::format("n{}", i), 8, "H100-80GB", {"r0"}));
    cluster.nodes[i].fault_domains["power"] = i < 2 ? "p0" : "p1";
  }
  Use(cluster);
  // n1 has 1 free GPU, n3 has 2: best fit takes n1 for one task, where a gang of two would not
  // fit.
  ASSERT_OK(snapshot_->Apply(testing::IdleGpusPlacement(*snapshot_, 1, 7)));
  ASSERT_OK(snapshot_->Apply(testing::IdleGpusPlacement(*snapshot_, 3, 6)));
  ScheduleResult one = Schedule(MakeJob("one", 1, WholeGpus{1}));
  ASSERT_TRUE(one.scheduled());
  EXPECT_EQ(one.placements[0].node, 1);
  snapshot_->Release(one.placements[0]);
  Job spread = MakeJob("spread", 2, WholeGpus{1});
  spread.spread = {"power", 1};
  const ScheduleResult result = Schedule(spread);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(FootprintOf(*snapshot_, result).nodes, 2);
  EXPECT_NE(result.placements[0].node / 2, result.placements[1].node / 2);
}

TEST_F(SchedulerTest, ScopeConfinesTheJobToItsNodesAndGpus) {
  Use(TwoLeaves());
  Job job = MakeJob("gang", 2, WholeGpus{8});
  job.topology.required_level = "leaf";
  Random random(1);
  // Unscoped, best fit picks leaf-b; scoped to leaf-a's nodes the gang must go there.
  const PlacementScope leaf_a{{0, 1, 2}};
  const ScheduleResult result = scheduler_->Schedule(job, *snapshot_, random, nullptr, &leaf_a);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(LeavesOf(result), (std::set<std::string>{"b0/leaf-a"}));
  for (const TaskPlacement& placement : result.placements) {
    snapshot_->Revert(placement);
  }

  // One node of the scope and four of its GPUs: a 4-GPU task fits on GPUs 4-7, an 8-GPU one not.
  const PlacementScope half_node{{3}, 0xF0};
  const ScheduleResult eight = scheduler_->Schedule(MakeJob("eight", 1, WholeGpus{8}), *snapshot_,
                                                    random, nullptr, &half_node);
  EXPECT_FALSE(eight.scheduled());
  EXPECT_THAT(eight.reason, HasSubstr("0/1 nodes can take a task"));
  const ScheduleResult four = scheduler_->Schedule(MakeJob("four", 1, WholeGpus{4}), *snapshot_,
                                                   random, nullptr, &half_node);
  ASSERT_TRUE(four.scheduled()) << four.reason;
  EXPECT_EQ(four.placements[0].node, 3);
  for (const GpuAssignment& gpu : four.placements[0].gpus) {
    EXPECT_GE(gpu.gpu, 4);
  }

  const PlacementScope bad{{9}};
  const ScheduleResult error =
      scheduler_->Schedule(MakeJob("j", 1, WholeGpus{1}), *snapshot_, random, nullptr, &bad);
  EXPECT_EQ(error.outcome, ScheduleOutcome::kError);
  EXPECT_THAT(error.reason, HasSubstr("scope.nodes: index 9 out of range"));
}

// Reusing unchanged nodes' verdicts and scores (SchedulerOptions::reuse_unchanged_nodes) must
// not change a single decision: a scheduler that keeps them and one that evaluates every node
// for every job place a random sequence of jobs, with random releases between them, the same
// way, on every node-alone policy and both tie breaks. Nodes are also replaced (a GPU's health
// changes), and the snapshot's change log, a few times the node count long, is outrun.
TEST(SchedulerReuse, PlacesExactlyAsAFullEvaluationAfterRandomPlacementsAndReleases) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster;
  cluster.topology = Topology({"leaf"});
  for (int i = 0; i < 24; ++i) {
    Node node = MakeNode(fmt::format("n{:02}", i), i % 3 == 0 ? 4 : 8,
                         i % 4 == 0 ? "A100-80GB" : "H100-80GB", {fmt::format("leaf-{}", i / 6)},
                         {i % 5 == 0 ? 16000 : 96000, 1048576});
    node.labels["pool"] = i % 2 == 0 ? "a" : "b";
    if (i % 7 == 3) {
      node.state = NodeState::kCordoned;
    }
    if (i % 6 == 1) {
      node.gpus[1].health = GpuHealth::kUnhealthy;
    }
    if (i % 8 == 4) {
      for (Gpu& gpu : node.gpus) {
        gpu.mig_enabled = true;
      }
    }
    if (i % 3 == 1) {
      node.cached_images.push_back({{"registry.example/train:1"}, "", int64_t{8} << 30});
    }
    cluster.nodes.push_back(std::move(node));
  }
  const std::vector<GpuRequest> requests = {WholeGpus{1},          WholeGpus{2},
                                            WholeGpus{4},          WholeGpus{8},
                                            FractionalGpu{250, 0}, FractionalGpu{500, 20000},
                                            MigGpus{"1g.10gb", 1}};
  // The FGD family scores against a target workload: a mix of the requests below.
  const TargetWorkload target =
      TargetWorkload::FromShapes({TaskShape{.cpu_milli = 1000, .gpu_milli = 1000, .num_gpus = 1},
                                  TaskShape{.cpu_milli = 2000, .gpu_milli = 1000, .num_gpus = 4},
                                  TaskShape{.cpu_milli = 1000, .gpu_milli = 250, .num_gpus = 1},
                                  TaskShape{.cpu_milli = 3000, .gpu_milli = 500, .num_gpus = 1}});
  for (const std::string policy :
       {"best-fit", "dot-prod", "gpu-packing", "gpu-clustering", "fgd", "gpufleet"}) {
    for (const TieBreak tie_break : {TieBreak::kNodeOrder, TieBreak::kRandom}) {
      SCOPED_TRACE(policy);
      SchedulerOptions options;
      options.policy = policy;
      options.tie_break = tie_break;
      options.plugin_args.target_workload = target;
      auto reusing = Scheduler::Create(options, PluginRegistry::Default());
      options.reuse_unchanged_nodes = false;
      auto full = Scheduler::Create(options, PluginRegistry::Default());
      ASSERT_OK(reusing);
      ASSERT_OK(full);
      auto a = ClusterSnapshot::Build(cluster, catalog);
      auto b = ClusterSnapshot::Build(cluster, catalog);
      ASSERT_OK(a);
      ASSERT_OK(b);
      Random pick(tie_break == TieBreak::kRandom ? 7 : 3);
      std::vector<std::vector<TaskPlacement>> placed;
      int scheduled = 0;
      for (int step = 0; step < 400; ++step) {
        if (pick.Uniform(10) == 0) {
          // A heartbeat's news: node `index` is replaced and the placements on it applied again
          // (not a MIG node: its document would have to report the instances made since).
          int index = static_cast<int>(pick.Uniform(cluster.nodes.size()));
          index += index % 8 == 4 ? 1 : 0;
          Node node = a->cluster().nodes[static_cast<size_t>(index)];
          node.gpus[0].health = node.gpus[0].health == GpuHealth::kHealthy ? GpuHealth::kUnhealthy
                                                                           : GpuHealth::kHealthy;
          ASSERT_OK(a->ReplaceNode(index, node));
          ASSERT_OK(b->ReplaceNode(index, node));
          for (const std::vector<TaskPlacement>& job : placed) {
            for (const TaskPlacement& placement : job) {
              if (placement.node == index) {
                ASSERT_OK(a->Apply(placement));
                ASSERT_OK(b->Apply(placement));
              }
            }
          }
          continue;
        }
        if (!placed.empty() && pick.Uniform(3) == 0) {
          const size_t victim = pick.Uniform(placed.size());
          for (const TaskPlacement& placement : placed[victim]) {
            a->Release(placement);
            b->Release(placement);
          }
          placed.erase(placed.begin() + static_cast<std::ptrdiff_t>(victim));
          continue;
        }
        Job job = MakeJob(fmt::format("j{}", step), 1 + static_cast<int>(pick.Uniform(4) / 3),
                          requests[pick.Uniform(requests.size())],
                          {1000 * (1 + static_cast<int64_t>(pick.Uniform(3))), 1024});
        switch (pick.Uniform(6)) {
          case 0:
            job.node_selector["pool"] = "a";
            break;
          case 1:
            job.allowed_gpu_models = {"H100-80GB"};
            break;
          case 2:
            job.groups[0].image = "registry.example/train:1";
            break;
          case 3:
            job.topology.required_level = "leaf";  // not reused: checks the two paths mix
            break;
          default:
            break;
        }
        Random ra(1000 + step);
        Random rb(1000 + step);
        const ScheduleResult x = (*reusing)->Schedule(job, *a, ra);
        const ScheduleResult y = (*full)->Schedule(job, *b, rb);
        ASSERT_EQ(x.outcome, y.outcome) << "step " << step << ": " << x.reason << " / " << y.reason;
        ASSERT_EQ(x.placements, y.placements) << "step " << step;
        ASSERT_EQ(x.reason, y.reason) << "step " << step;
        ASSERT_EQ(x.details, y.details) << "step " << step;
        if (x.scheduled()) {
          placed.push_back(x.placements);
          ++scheduled;
        }
      }
      // The sequence exercised both placements and refusals.
      EXPECT_GT(scheduled, 50);
      EXPECT_LT(scheduled, 400);
    }
  }
}

TEST(CannotFitWhereSmallerFailed, ComparesOneGroupJobsOfWholeGpusUnderEqualConstraints) {
  const Job small = MakeJob("small", 2, WholeGpus{4});
  EXPECT_TRUE(CannotFitWhereSmallerFailed(MakeJob("same", 2, WholeGpus{4}), small));
  EXPECT_TRUE(CannotFitWhereSmallerFailed(MakeJob("wider", 2, WholeGpus{8}), small));
  EXPECT_TRUE(CannotFitWhereSmallerFailed(MakeJob("more", 3, WholeGpus{4}), small));
  EXPECT_FALSE(CannotFitWhereSmallerFailed(MakeJob("fewer", 1, WholeGpus{8}), small));
  EXPECT_FALSE(CannotFitWhereSmallerFailed(MakeJob("narrower", 4, WholeGpus{2}), small));
  EXPECT_FALSE(
      CannotFitWhereSmallerFailed(MakeJob("less cpu", 2, WholeGpus{4}, {500, 1024}), small));
  Job other_model = MakeJob("a100", 2, WholeGpus{8});
  other_model.allowed_gpu_models = {"A100-80GB"};
  EXPECT_FALSE(CannotFitWhereSmallerFailed(other_model, small));
  Job in_leaf = MakeJob("leaf", 2, WholeGpus{8});
  in_leaf.topology.required_level = "leaf";
  EXPECT_FALSE(CannotFitWhereSmallerFailed(in_leaf, small));
  EXPECT_FALSE(CannotFitWhereSmallerFailed(MakeJob("share", 2, FractionalGpu{500}),
                                           MakeJob("small share", 2, FractionalGpu{250})));
}

}  // namespace
}  // namespace gpufleet::scheduler
