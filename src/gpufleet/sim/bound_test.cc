// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/bound.h"

#include <algorithm>
#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/random.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/fill.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

Node MakeNode(const std::string& name, int64_t cpu, int64_t memory, int gpus,
              const std::string& model) {
  Node node;
  node.id = NodeId(name);
  node.capacity = {cpu, memory};
  for (int g = 0; g < gpus; ++g) {
    Gpu gpu;
    gpu.uuid = GpuUuid(name + "-gpu-" + std::to_string(g));
    gpu.index = g;
    gpu.model = model;
    node.gpus.push_back(gpu);
  }
  return node;
}

Job MakePod(const std::string& name, int64_t cpu, int64_t memory, GpuRequest gpus,
            std::vector<std::string> models = {}) {
  Job pod;
  pod.id = JobId(name);
  pod.groups.push_back({"pod", 1, {{cpu, memory}, gpus}});
  pod.allowed_gpu_models = std::move(models);
  return pod;
}

// The most GPU milli-units any placement of `pods` on `cluster` holds, by trying every
// placement: each share picks a (node, GPU) or none, each whole-GPU pod a node or none; a node
// takes them when its CPU and memory suffice, every GPU's shares sum to at most 1000, and its
// idle GPUs (no share on them) cover the whole-GPU pods.
int64_t BruteForceMaxPlaced(const Cluster& cluster, const std::vector<Job>& pods) {
  struct Choice {
    int node = -1;
    int gpu = -1;
  };
  std::vector<std::vector<Choice>> options(pods.size());
  for (size_t p = 0; p < pods.size(); ++p) {
    options[p].push_back({});
    const Job& pod = pods[p];
    for (size_t n = 0; n < cluster.nodes.size(); ++n) {
      const Node& node = cluster.nodes[n];
      if (node.gpus.empty() ||
          (!pod.allowed_gpu_models.empty() &&
           std::find(pod.allowed_gpu_models.begin(), pod.allowed_gpu_models.end(),
                     node.gpus[0].model) == pod.allowed_gpu_models.end())) {
        continue;
      }
      if (std::holds_alternative<FractionalGpu>(pod.groups[0].request.gpus)) {
        for (size_t g = 0; g < node.gpus.size(); ++g) {
          options[p].push_back({static_cast<int>(n), static_cast<int>(g)});
        }
      } else {
        options[p].push_back({static_cast<int>(n), -1});
      }
    }
  }
  std::vector<Choice> chosen(pods.size());
  int64_t best = 0;
  std::function<void(size_t)> visit = [&](size_t p) {
    if (p < pods.size()) {
      for (const Choice& choice : options[p]) {
        chosen[p] = choice;
        visit(p + 1);
      }
      return;
    }
    int64_t placed = 0;
    for (size_t n = 0; n < cluster.nodes.size(); ++n) {
      const Node& node = cluster.nodes[n];
      int64_t cpu = 0;
      int64_t memory = 0;
      int whole = 0;
      std::vector<int64_t> share(node.gpus.size(), 0);
      for (size_t q = 0; q < pods.size(); ++q) {
        if (chosen[q].node != static_cast<int>(n)) {
          continue;
        }
        const TaskRequest& request = pods[q].groups[0].request;
        cpu += request.host.cpu_milli;
        memory += request.host.memory_mib;
        if (const auto* w = std::get_if<WholeGpus>(&request.gpus)) {
          whole += w->count;
        } else {
          share[chosen[q].gpu] += std::get<FractionalGpu>(request.gpus).gpu_milli;
        }
        placed += RequestedGpuMilli(request.gpus);
      }
      const auto shared =
          std::count_if(share.begin(), share.end(), [](int64_t s) { return s > 0; });
      if (cpu > node.capacity.cpu_milli || memory > node.capacity.memory_mib ||
          *std::max_element(share.begin(), share.end()) > kMilliPerUnit ||
          shared + whole > static_cast<int64_t>(node.gpus.size())) {
        return;
      }
    }
    best = std::max(best, placed);
  };
  visit(0);
  return best;
}

PackingBound Solve(const Cluster& cluster, const std::vector<Job>& pods, bool lp_only) {
  const GpuCatalog catalog = GpuCatalog::Default();
  auto problem = AggregatePacking(cluster, pods, catalog);
  EXPECT_OK(problem);
  PackingBoundOptions options;
  options.lp_only = lp_only;
  options.time_limit_seconds = 20;
  auto bound = SolvePackingBound(*problem, options);
  EXPECT_OK(bound);
  return *bound;
}

// Two distinct nodes: the aggregated model is the per-node problem itself, so the finished
// branch and bound must find exactly the brute-force optimum, and the LP may only exceed it.
TEST(PackingBound, MipEqualsBruteForceOnDistinctNodes) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("a", 6000, 32768, 2, "T4"));
  cluster.nodes.push_back(MakeNode("b", 6000, 16384, 2, "V100-32GB"));
  const std::vector<Job> pods = {
      MakePod("p0", 3000, 4096, FractionalGpu{810, 0}),
      MakePod("p1", 3000, 4096, FractionalGpu{810, 0}),
      MakePod("p2", 2000, 4096, FractionalGpu{600, 0}),
      MakePod("p3", 1000, 2048, FractionalGpu{400, 0}),
      MakePod("p4", 4000, 8192, WholeGpus{1}),
      MakePod("p5", 5000, 8192, WholeGpus{2}, {"V100-32GB"}),
      MakePod("p6", 1000, 1024, FractionalGpu{190, 0}),
  };
  const int64_t optimum = BruteForceMaxPlaced(cluster, pods);
  const PackingBound mip = Solve(cluster, pods, false);
  const PackingBound lp = Solve(cluster, pods, true);
  EXPECT_TRUE(mip.proven_optimal);
  EXPECT_EQ(mip.placed_milli_bound, optimum);
  EXPECT_GE(lp.placed_milli_bound, optimum);
  EXPECT_GE(lp.lp_bound + 1e-6, mip.placed_milli_bound);
  // Below the trivial bound (4 GPUs, 4810 milli asked): CPU and remainders keep pods out.
  EXPECT_LT(optimum, 4000);
}

// Random small instances. With every node distinct the MIP is exact; with identical nodes it
// pools their CPU and memory, so it may only exceed the optimum.
TEST(PackingBound, NeverBelowBruteForceOnRandomInstances) {
  Random random(7);
  const std::vector<int64_t> shares = {190, 300, 470, 520, 650, 810};
  int exact = 0;
  for (int instance = 0; instance < 24; ++instance) {
    Cluster cluster;
    const bool identical = instance % 2 == 1;
    const int nodes = identical ? 2 : 1 + static_cast<int>(random.Uniform(2));
    for (int n = 0; n < nodes; ++n) {
      const int64_t cpu = identical ? 6000 : 4000 + 2000 * static_cast<int64_t>(random.Uniform(3));
      const int gpus = identical ? 2 : 1 + static_cast<int>(random.Uniform(2));
      cluster.nodes.push_back(MakeNode("n" + std::to_string(n) + std::to_string(cpu), cpu, 65536,
                                       gpus, n % 2 == 0 || identical ? "T4" : "V100-32GB"));
    }
    std::vector<Job> pods;
    for (int p = 0; p < 6; ++p) {
      const int64_t cpu = 1000 + 1000 * static_cast<int64_t>(random.Uniform(4));
      GpuRequest gpus = FractionalGpu{shares[random.Uniform(shares.size())], 0};
      if (random.Uniform(4) == 0) {
        gpus = WholeGpus{1 + static_cast<int>(random.Uniform(2))};
      }
      pods.push_back(MakePod(
          "p" + std::to_string(p), cpu, 1024, gpus,
          random.Uniform(5) == 0 ? std::vector<std::string>{"T4"} : std::vector<std::string>{}));
    }
    const int64_t optimum = BruteForceMaxPlaced(cluster, pods);
    const PackingBound mip = Solve(cluster, pods, false);
    const PackingBound lp = Solve(cluster, pods, true);
    SCOPED_TRACE("instance " + std::to_string(instance));
    EXPECT_GE(mip.placed_milli_bound, optimum);
    EXPECT_GE(lp.placed_milli_bound, mip.placed_milli_bound);
    if (!identical) {
      EXPECT_TRUE(mip.proven_optimal);
      EXPECT_EQ(mip.placed_milli_bound, optimum);
      exact += mip.placed_milli_bound == optimum ? 1 : 0;
    }
  }
  EXPECT_EQ(exact, 12);
}

// Identical nodes are pooled: their CPU is one sum, cut per node only by "at most q pods above
// 1/(q+1) of a node". Three pods of more than half a node's CPU: the cut keeps the bound exact.
// A 2700 and three 1400s on two 4000-CPU nodes: no node holds the 2700 with a 1400, so one pod
// stays out, but the pooled CPU (6900 of 8000) and the cuts let all four in. The bound is sound,
// not tight, there.
TEST(PackingBound, PoolsIdenticalNodesOnlyAsFarAsThePerNodeCutsAllow) {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("a", 4000, 8192, 2, "T4"));
  cluster.nodes.push_back(MakeNode("b", 4000, 8192, 2, "T4"));
  const std::vector<Job> halves = {
      MakePod("p0", 2100, 1024, FractionalGpu{810, 0}),
      MakePod("p1", 2100, 1024, FractionalGpu{810, 0}),
      MakePod("p2", 2100, 1024, FractionalGpu{810, 0}),
  };
  EXPECT_EQ(BruteForceMaxPlaced(cluster, halves), 2 * 810);
  EXPECT_EQ(Solve(cluster, halves, false).placed_milli_bound, 2 * 810);
  EXPECT_EQ(Solve(cluster, halves, true).placed_milli_bound, 2 * 810);
  const std::vector<Job> mixed = {
      MakePod("p0", 2700, 1024, FractionalGpu{810, 0}),
      MakePod("p1", 1400, 1024, FractionalGpu{810, 0}),
      MakePod("p2", 1400, 1024, FractionalGpu{810, 0}),
      MakePod("p3", 1400, 1024, FractionalGpu{810, 0}),
  };
  EXPECT_EQ(BruteForceMaxPlaced(cluster, mixed), 3 * 810);
  EXPECT_EQ(Solve(cluster, mixed, false).placed_milli_bound, 4 * 810);
}

TEST(PackingBound, AggregatesIdenticalNodesAndPods) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("a", 8000, 32768, 2, "T4"));
  cluster.nodes.push_back(MakeNode("b", 8000, 32768, 2, "T4"));
  cluster.nodes.push_back(MakeNode("c", 8000, 32768, 4, "T4"));
  const std::vector<Job> pods = {
      MakePod("p0", 1000, 1024, FractionalGpu{500, 0}),
      MakePod("p1", 1000, 1024, FractionalGpu{500, 0}),
      MakePod("p2", 1000, 1024, WholeGpus{2}),
      MakePod("p3", 1000, 1024, NoGpu{}),
  };
  auto problem = AggregatePacking(cluster, pods, catalog);
  ASSERT_OK(problem);
  ASSERT_EQ(problem->node_types.size(), 2U);
  EXPECT_EQ(problem->node_types[0].count, 2);
  ASSERT_EQ(problem->pod_shapes.size(), 2U);  // the CPU-only pod places no GPU
  EXPECT_EQ(problem->pod_shapes[0].count, 2);
  EXPECT_EQ(problem->capacity_milli, 8000);
  EXPECT_EQ(problem->requested_milli, 3000);
}

TEST(PackingBound, RejectsWhatItCannotModel) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("a", 8000, 32768, 2, "T4"));
  Job mig = MakePod("mig-pod", 1000, 1024, MigGpus{"1g.10gb", 1});
  EXPECT_THAT(AggregatePacking(cluster, {mig}, catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("pod mig-pod: a MIG request")));
  Job gang = MakePod("gang", 1000, 1024, WholeGpus{1});
  gang.groups[0].replicas = 2;
  EXPECT_THAT(AggregatePacking(cluster, {gang}, catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("pod gang: 1 groups of 2 tasks")));
  Job share = MakePod("big-share", 1000, 1024, FractionalGpu{1500, 0});
  EXPECT_THAT(AggregatePacking(cluster, {share}, catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpu_milli 1500")));
  Cluster mixed = cluster;
  mixed.nodes[0].gpus[1].model = "V100-32GB";
  EXPECT_THAT(AggregatePacking(mixed, {}, catalog),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("node a: GPUs of two models")));
}

TEST(PackingBound, RejectsBadOptionsAndTooManyPatterns) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("a", 64000, 65536, 8, "T4"));
  std::vector<Job> pods;
  for (int64_t milli = 10; milli < 1000; milli += 10) {
    pods.push_back(MakePod("s" + std::to_string(milli), 100, 100, FractionalGpu{milli, 0}));
  }
  auto problem = AggregatePacking(cluster, pods, catalog);
  ASSERT_OK(problem);
  PackingBoundOptions options;
  options.max_gpu_patterns = 1000;
  EXPECT_THAT(SolvePackingBound(*problem, options),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("max_gpu_patterns")));
  options.time_limit_seconds = 0;
  EXPECT_THAT(SolvePackingBound(*problem, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("time_limit_seconds: 0")));
}

// Against the experiment itself: no policy leaves fewer GPUs unallocated at 100 % than the
// bound, on the fill test's cluster and trace.
TEST(RunFillBound, NoPolicyBeatsTheBound) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const Cluster cluster = MakeSyntheticCluster({1, 1, 16, 4, "T4", 16000, 65536}, catalog).value();
  // No pod moves the load by more than 1.6 %, so events land on the 99-101 % points.
  std::vector<Job> pods;
  for (int i = 0; i < 80; ++i) {
    const GpuRequest gpus = i % 3 == 0   ? GpuRequest{WholeGpus{1}}
                            : i % 3 == 1 ? GpuRequest{FractionalGpu{810, 0}}
                                         : GpuRequest{FractionalGpu{350, 0}};
    pods.push_back(MakePod("pod-" + std::to_string(100 + i), 3000, 8192, gpus));
  }
  PackingBoundOptions options;
  options.time_limit_seconds = 10;
  auto bound = RunFillBound(cluster, pods, catalog, 42, 1.3, options);
  ASSERT_OK(bound);
  EXPECT_EQ(bound->total_gpus, 64);
  EXPECT_GT(bound->events, 0);
  EXPECT_GT(bound->unallocated_gpus_bound, 0);  // CPU and the 810-shares' remainders
  // Events early in the point are bounded by shorter prefixes: never looser than the last.
  EXPECT_GE(bound->unallocated_gpus_bound, bound->unallocated_gpus_bound_last);
  options.lp_only = false;
  auto mip = RunFillBound(cluster, pods, catalog, 42, 1.3, options);
  ASSERT_OK(mip);
  EXPECT_GE(mip->unallocated_gpus_bound + 1e-9, bound->unallocated_gpus_bound);
  for (const std::string policy : {"best-fit", "fgd", "gpufleet", "random"}) {
    FillOptions fill;
    fill.policy = policy;
    auto run = RunFill(cluster, pods, catalog, fill);
    ASSERT_OK(run);
    EXPECT_GE(run->UnallocatedGpusAt(100) + 1e-9, mip->unallocated_gpus_bound) << policy;
  }
  EXPECT_THAT(RunFillBound(cluster, pods, catalog, 42, 0.5, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("load_target: 0.5")));
  options.checkpoints = 0;
  EXPECT_THAT(RunFillBound(cluster, pods, catalog, 42, 1.3, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("checkpoints: 0")));
}

}  // namespace
}  // namespace gpufleet::sim
