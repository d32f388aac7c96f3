// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/filters.h"

#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using testing::MakeJob;
using testing::MakeNode;

class FilterTest : public ::testing::Test {
 protected:
  void Build(Cluster cluster) {
    snapshot_.emplace(ClusterSnapshot::Build(std::move(cluster), catalog_).value());
  }
  TaskContext Context(const Job& job) {
    TaskContext task;
    task.snapshot = &*snapshot_;
    task.job = &job;
    task.request = &job.groups[0].request;
    task.model_allowed.assign(snapshot_->ModelCount(), job.allowed_gpu_models.empty());
    for (const std::string& name : job.allowed_gpu_models) {
      if (snapshot_->ModelId(name) >= 0) {
        task.model_allowed[snapshot_->ModelId(name)] = true;
      }
    }
    task.mig_profile.assign(snapshot_->ModelCount(), nullptr);
    return task;
  }
  const NodeInfo& Node(int i) { return snapshot_->nodes()[i]; }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
};

TEST_F(FilterTest, GpuModelFilterChecksModelAndMemory) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("t4", 1, "T4"));
  cluster.nodes.push_back(MakeNode("a100", 1, "A100-80GB"));
  Build(cluster);
  GpuModelFilter filter;
  Job job = MakeJob("j", 1, WholeGpus{1});
  job.allowed_gpu_models = {"A100-80GB"};
  EXPECT_FALSE(filter.Admits(Context(job), Node(0).gpus[0]));
  EXPECT_TRUE(filter.Admits(Context(job), Node(1).gpus[0]));
  job.allowed_gpu_models.clear();
  job.min_gpu_memory_mib = 32 * 1024;
  EXPECT_FALSE(filter.Admits(Context(job), Node(0).gpus[0]));
  EXPECT_TRUE(filter.Admits(Context(job), Node(1).gpus[0]));
}

TEST_F(FilterTest, GpuHealthAndThermalFilters) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 4));
  cluster.nodes[0].gpus[0].health = GpuHealth::kUnhealthy;
  cluster.nodes[0].gpus[1].health = GpuHealth::kQuarantined;
  cluster.nodes[0].gpus[2].health = GpuHealth::kDegraded;
  cluster.nodes[0].gpus[3].thermal_headroom_c = 3;
  Build(cluster);
  const Job job = MakeJob("j", 1, WholeGpus{1});
  GpuHealthFilter health;
  ThermalHeadroomFilter thermal(5);
  EXPECT_FALSE(health.Admits(Context(job), Node(0).gpus[0]));
  EXPECT_FALSE(health.Admits(Context(job), Node(0).gpus[1]));
  EXPECT_TRUE(health.Admits(Context(job), Node(0).gpus[2]));
  EXPECT_TRUE(thermal.Admits(Context(job), Node(0).gpus[2]));
  EXPECT_FALSE(thermal.Admits(Context(job), Node(0).gpus[3]));
}

TEST_F(FilterTest, NodeFilters) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("ready", 1));
  cluster.nodes.push_back(MakeNode("cordoned", 1));
  cluster.nodes[1].state = NodeState::kCordoned;
  cluster.nodes[0].labels["pool"] = "train";
  cluster.nodes[0].labels[std::string(kDriverVersionLabel)] = "550";
  Build(cluster);
  Job job = MakeJob("j", 1, WholeGpus{1});
  job.node_selector["pool"] = "train";
  job.identical_stack_labels = {std::string(kDriverVersionLabel)};
  const TaskContext task = Context(job);
  CycleState state(job);
  NodeReadyFilter ready;
  NodeSelectorFilter selector;
  StackLabelsFilter stack;
  EXPECT_TRUE(ready.Filter(state, task, Node(0), ~GpuMask{0}).ok());
  EXPECT_EQ(ready.Filter(state, task, Node(1), ~GpuMask{0}).code,
            Code::kUnschedulableAndUnresolvable);
  EXPECT_TRUE(selector.Filter(state, task, Node(0), ~GpuMask{0}).ok());
  EXPECT_FALSE(selector.Filter(state, task, Node(1), ~GpuMask{0}).ok());
  EXPECT_TRUE(stack.Filter(state, task, Node(0), ~GpuMask{0}).ok());
  EXPECT_FALSE(stack.Filter(state, task, Node(1), ~GpuMask{0}).ok());
}

// Issue 33: a container task must not land on a node whose agent runs processes only.
TEST_F(FilterTest, ContainerRuntimeFilterKeepsImagesOffProcessOnlyNodes) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("podman", 1));
  cluster.nodes[0].labels[std::string(kContainerRuntimeLabel)] = "podman";
  cluster.nodes.push_back(MakeNode("process", 1));  // no label: an agent with the process runner
  cluster.nodes.push_back(MakeNode("blank", 1));
  cluster.nodes[2].labels[std::string(kContainerRuntimeLabel)] = "";
  Build(cluster);
  const ContainerRuntimeFilter filter;
  struct Case {
    const char* image;
    int node;
    bool admitted;
  };
  for (const Case& c :
       {Case{"", 0, true}, Case{"", 1, true}, Case{"", 2, true},
        Case{"registry.example/train:1", 0, true}, Case{"registry.example/train:1", 1, false},
        Case{"registry.example/train:1", 2, false}}) {
    SCOPED_TRACE(::testing::Message() << "image \"" << c.image << "\" on node " << c.node);
    Job job = MakeJob("j", 1, WholeGpus{1});
    job.groups[0].image = c.image;
    const CycleState state(job);
    const PluginResult result = filter.Filter(state, Context(job), Node(c.node), ~GpuMask{0});
    EXPECT_EQ(result.ok(), c.admitted);
    if (!c.admitted) {
      EXPECT_EQ(result.code, Code::kUnschedulableAndUnresolvable);
      EXPECT_EQ(result.reason, "node runs no container runtime (its agent runs processes only)");
    }
  }
}

TEST_F(FilterTest, ResourceFits) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 2, "H100-80GB", {}, {8000, 16384}));
  Build(cluster);
  HostResourcesFit host;
  GpuResourcesFit gpus;
  const Job small = MakeJob("s", 1, WholeGpus{2}, {8000, 16384});
  const Job big_cpu = MakeJob("b", 1, WholeGpus{1}, {9000, 0});
  const Job three = MakeJob("t", 1, WholeGpus{3}, {0, 0});
  CycleState state(small);
  EXPECT_TRUE(host.Filter(state, Context(small), Node(0), ~GpuMask{0}).ok());
  EXPECT_EQ(host.Filter(state, Context(big_cpu), Node(0), ~GpuMask{0}).code,
            Code::kUnschedulableAndUnresolvable);
  EXPECT_TRUE(gpus.Filter(state, Context(small), Node(0), ~GpuMask{0}).ok());
  EXPECT_EQ(gpus.Filter(state, Context(three), Node(0), ~GpuMask{0}).code, Code::kUnschedulable);
  EXPECT_EQ(gpus.Filter(state, Context(small), Node(0), 0).code,
            Code::kUnschedulableAndUnresolvable);
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {4000, 0}, {}}));
  EXPECT_EQ(host.Filter(state, Context(small), Node(0), ~GpuMask{0}).code, Code::kUnschedulable);
}

TEST_F(FilterTest, GpuResourcesFitNeverMixesMpsAndTimeSlicedShares) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("n", 1, "H100-80GB"));
  cluster.nodes.push_back(MakeNode("m", 1, "H100-80GB"));
  cluster.nodes[1].labels[std::string(kGpuSharingLabel)] = "mps";
  Build(cluster);
  GpuResourcesFit gpus;
  const Job mps = MakeJob("p", 1, FractionalGpu{250, 0, GpuSharing::kMps}, {0, 0});
  const Job sliced = MakeJob("s", 1, FractionalGpu{250, 0, GpuSharing::kTimeSlicing}, {0, 0});
  const Job by_node = MakeJob("d", 1, FractionalGpu{250, 0}, {0, 0});
  CycleState state(mps);
  // An idle GPU takes either kind.
  EXPECT_TRUE(gpus.Filter(state, Context(mps), Node(0), ~GpuMask{0}).ok());
  EXPECT_TRUE(gpus.Filter(state, Context(sliced), Node(0), ~GpuMask{0}).ok());
  // Node n's GPU holds a time-sliced share: no MPS share joins it, with compute to spare.
  ASSERT_OK(snapshot_->Apply({0, 0, 0, {}, {{0, 250, 0, "", -1, false, false}}}));
  EXPECT_EQ(gpus.Filter(state, Context(mps), Node(0), ~GpuMask{0}).code, Code::kUnschedulable);
  EXPECT_TRUE(gpus.Filter(state, Context(sliced), Node(0), ~GpuMask{0}).ok());
  EXPECT_TRUE(gpus.Filter(state, Context(by_node), Node(0), ~GpuMask{0}).ok());
  // Node m runs shares as MPS by default: one that does not say is an MPS client there, and a
  // time-sliced share cannot join it.
  ASSERT_OK(snapshot_->Apply({0, 0, 1, {}, {{0, 250, 0, "", -1, false, true}}}));
  EXPECT_TRUE(gpus.Filter(state, Context(mps), Node(1), ~GpuMask{0}).ok());
  EXPECT_TRUE(gpus.Filter(state, Context(by_node), Node(1), ~GpuMask{0}).ok());
  EXPECT_EQ(gpus.Filter(state, Context(sliced), Node(1), ~GpuMask{0}).code, Code::kUnschedulable);
  // Once the MPS share is gone the GPU takes a time-sliced one again.
  snapshot_->Release({0, 0, 1, {}, {{0, 250, 0, "", -1, false, true}}});
  EXPECT_TRUE(gpus.Filter(state, Context(sliced), Node(1), ~GpuMask{0}).ok());
}

TEST_F(FilterTest, FaultDomainSpreadCountsReservedTasks) {
  Cluster cluster;
  for (int i = 0; i < 3; ++i) {
    cluster.nodes.push_back(MakeNode("n" + std::to_string(i), 8));
    cluster.nodes[i].fault_domains["rack"] = "r" + std::to_string(i);
  }
  Build(cluster);
  Job job = MakeJob("j", 6, WholeGpus{1});
  job.spread = {"rack", 1};
  const TaskContext task = Context(job);
  CycleState state(job);
  FaultDomainSpread spread;
  ASSERT_TRUE(spread.PreFilter(state, *snapshot_).ok());
  const TaskPlacement on_first{0, 0, 0, {}, {}};
  spread.Reserve(state, on_first, *snapshot_);
  EXPECT_FALSE(spread.Filter(state, task, Node(0), ~GpuMask{0}).ok());
  EXPECT_TRUE(spread.Filter(state, task, Node(1), ~GpuMask{0}).ok());
  spread.Unreserve(state, on_first, *snapshot_);
  spread.Unreserve(state, on_first, *snapshot_);  // idempotent
  EXPECT_TRUE(spread.Filter(state, task, Node(0), ~GpuMask{0}).ok());
}

TEST_F(FilterTest, TopologyLevelsCheck) {
  Cluster cluster;
  cluster.topology = Topology({"leaf"});
  cluster.nodes.push_back(MakeNode("n", 1, "H100-80GB", {"l1"}));
  Build(cluster);
  TopologyLevelsCheck check;
  Job job = MakeJob("j", 1, WholeGpus{1});
  job.topology = {"leaf", "nvlink-domain"};
  CycleState good(job);
  EXPECT_TRUE(check.PreFilter(good, *snapshot_).ok());
  job.topology.required_level = "block";
  CycleState bad(job);
  EXPECT_EQ(check.PreFilter(bad, *snapshot_).code, Code::kUnschedulableAndUnresolvable);
}

}  // namespace
}  // namespace gpufleet::scheduler
