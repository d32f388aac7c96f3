// SPDX-License-Identifier: Apache-2.0
// Placement latency: (a) one task on the openb cluster per policy, (b) a 1,024-GPU gang under a
// required block constraint on a synthetic 16,384-GPU cluster at 50% occupancy, (b') 1,024
// one-GPU tasks on it without a constraint, (c) a control plane's cycle at 10,000 nodes.
#include <algorithm>
#include <memory>
#include <numeric>
#include <set>

#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/sim/fill.h"
#include "gpufleet/sim/openb.h"

namespace gpufleet::scheduler {
namespace {

const std::string kDataDir = GPUFLEET_TEST_DATA_DIR;

struct OpenbSetup {
  GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster;
  std::vector<Job> pods;
  TargetWorkload workload;
};

const OpenbSetup& Openb() {
  static const OpenbSetup* setup = [] {
    auto* loaded = new OpenbSetup;
    loaded->cluster =
        sim::LoadOpenbNodes(kDataDir + "/openb/openb_node_list_gpu_node.csv", loaded->catalog)
            .value();
    loaded->pods =
        sim::LoadOpenbPods(kDataDir + "/openb/openb_pod_list_default.csv", loaded->catalog).value();
    std::vector<TaskShape> shapes;
    for (const Job& pod : loaded->pods) {
      shapes.push_back(ShapeOf(pod.groups[0].request, pod.allowed_gpu_models));
    }
    loaded->workload = TargetWorkload::FromShapes(shapes);
    return loaded;
  }();
  return *setup;
}

// (a) Every placement policy, gpufleet included. The cluster is first filled to 70% of its GPUs
// (arrival order of seed 42) by the policy itself; each iteration then places one trace task and
// releases it again.
void BM_PlaceOneTaskOnOpenb(benchmark::State& state) {
  const OpenbSetup& setup = Openb();
  const std::string policy = PlacementPolicyNames()[state.range(0)];
  state.SetLabel(policy);
  ClusterSnapshot snapshot = ClusterSnapshot::Build(setup.cluster, setup.catalog).value();
  SchedulerOptions options;
  options.policy = policy;
  options.plugin_args.target_workload = setup.workload;
  std::unique_ptr<Scheduler> scheduler =
      Scheduler::Create(options, PluginRegistry::Default()).value();
  Random random(42);
  const std::vector<Job> order =
      sim::FillArrivalOrder(setup.pods, snapshot.TotalGpuMilli(), 1.3, 42);
  size_t next = 0;
  int64_t arrived = 0;
  while (next < order.size() && arrived < snapshot.TotalGpuMilli() * 7 / 10) {
    arrived += order[next].RequestedGpuMilliTotal();
    (void)scheduler->Schedule(order[next++], snapshot, random);
  }
  int64_t placed = 0;
  const SystemClock clock;
  std::vector<int64_t> decision_nanos;
  for (auto _ : state) {
    const Job& job = order[next + (placed % 256)];
    const MonoTime start = clock.Now();
    ScheduleResult result = scheduler->Schedule(job, snapshot, random);
    decision_nanos.push_back((clock.Now() - start).count());
    for (const TaskPlacement& placement : result.placements) {
      snapshot.Release(placement);
    }
    benchmark::DoNotOptimize(result);
    ++placed;
  }
  // Per-decision percentiles (the Release that restores the state is not timed here).
  std::sort(decision_nanos.begin(), decision_nanos.end());
  state.counters["p50_us"] = decision_nanos[decision_nanos.size() / 2] / 1000.0;
  state.counters["p99_us"] = decision_nanos[decision_nanos.size() * 99 / 100] / 1000.0;
  state.counters["nodes"] = static_cast<double>(snapshot.nodes().size());
}
BENCHMARK(BM_PlaceOneTaskOnOpenb)->DenseRange(0, 6)->Unit(benchmark::kMicrosecond);

// Places `gang` and releases it again, once per iteration, with best fit on 8 blocks x 8 leaves x
// 32 nodes x 8 H100 = 16,384 GPUs, half the nodes (chosen at random, seed 7) taken whole.
// Counts the leaves the last placement used.
void PlaceGangOnHalfTakenCluster(benchmark::State& state, const Job& gang) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster = MakeSyntheticCluster({8, 8, 32, 8, "H100-80GB"}, catalog).value();
  ClusterSnapshot snapshot = ClusterSnapshot::Build(std::move(cluster), catalog).value();
  std::vector<int> nodes(snapshot.nodes().size());
  std::iota(nodes.begin(), nodes.end(), 0);
  Random occupancy(7);
  occupancy.Shuffle(nodes);
  for (size_t i = 0; i < nodes.size() / 2; ++i) {
    TaskPlacement busy{0, 0, nodes[i], {}, {}};
    for (int g = 0; g < 8; ++g) {
      busy.gpus.push_back({g, kMilliPerUnit, 0});
    }
    (void)snapshot.Apply(busy);
  }
  SchedulerOptions options;
  options.policy = "best-fit";
  std::unique_ptr<Scheduler> scheduler =
      Scheduler::Create(options, PluginRegistry::Default()).value();
  Random random(1);
  std::set<int> leaves;
  for (auto _ : state) {
    ScheduleResult result = scheduler->Schedule(gang, snapshot, random);
    if (!result.scheduled()) {
      state.SkipWithError(result.reason.c_str());
      break;
    }
    leaves.clear();
    for (const TaskPlacement& placement : result.placements) {
      leaves.insert(snapshot.nodes()[placement.node].domains[1]);
      snapshot.Release(placement);
    }
    benchmark::DoNotOptimize(result);
  }
  state.counters["gpus"] = snapshot.TotalGpus();
  state.counters["leaves"] = static_cast<double>(leaves.size());
}

// (b) 128 tasks of 8 GPUs under a required block, preferring a leaf: a block holds ~128 free
// nodes, so only some blocks fit the gang.
void BM_PlaceGangUnderRequiredBlock(benchmark::State& state) {
  Job gang;
  gang.id = JobId("gang-1024");
  gang.groups.push_back({"workers", 128, {{16000, 65536}, WholeGpus{8}}});
  gang.topology.required_level = "block";
  gang.topology.preferred_level = "leaf";
  PlaceGangOnHalfTakenCluster(state, gang);
}
BENCHMARK(BM_PlaceGangUnderRequiredBlock)->Unit(benchmark::kMillisecond);

// (b') The compact-gang plan's worst case (docs/policies.md, "Compact gangs"): 1,024 tasks of
// one GPU without a topology constraint; the plan ranks all 2,048 nodes, most of them alike,
// level by level.
void BM_PlaceGangOfOneGpuTasks(benchmark::State& state) {
  Job gang;
  gang.id = JobId("gang-1024x1");
  gang.groups.push_back({"workers", 1024, {{2000, 8192}, WholeGpus{1}}});
  PlaceGangOnHalfTakenCluster(state, gang);
}
BENCHMARK(BM_PlaceGangOfOneGpuTasks)->Unit(benchmark::kMillisecond);

// (c) The control plane's cycle at 10,000 nodes (issue 15): 4 blocks x 10 leaves x 250 nodes x
// 8 H100, one-task jobs of 1, 2, 4 and 8 GPUs placed one after another (each placement changes
// one node) and released in the same order once 2,000 are held. Argument 1 reuses unchanged
// nodes' verdicts and scores (SchedulerOptions::reuse_unchanged_nodes), 0 evaluates every node.
void BM_PlaceJobsOnTenThousandNodes(benchmark::State& state) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster = MakeSyntheticCluster({4, 10, 250, 8, "H100-80GB"}, catalog).value();
  ClusterSnapshot snapshot = ClusterSnapshot::Build(std::move(cluster), catalog).value();
  SchedulerOptions options;
  options.policy = "best-fit";
  options.reuse_unchanged_nodes = state.range(0) != 0;
  state.SetLabel(options.reuse_unchanged_nodes ? "reuse" : "full");
  std::unique_ptr<Scheduler> scheduler =
      Scheduler::Create(options, PluginRegistry::Default()).value();
  std::vector<Job> jobs;
  for (int count : {1, 2, 4, 8}) {
    Job job;
    job.id = JobId(fmt::format("j{}", count));
    job.groups.push_back({"main", 1, {{4000, 16384}, WholeGpus{count}}});
    jobs.push_back(job);
  }
  std::vector<std::vector<TaskPlacement>> held;
  Random random(1);
  int64_t n = 0;
  for (auto _ : state) {
    ScheduleResult result = scheduler->Schedule(jobs[n++ % 4], snapshot, random);
    if (!result.scheduled()) {
      state.SkipWithError(result.reason.c_str());
      break;
    }
    held.push_back(std::move(result.placements));
    if (held.size() == 2000) {
      for (const std::vector<TaskPlacement>& placements : held) {
        for (const TaskPlacement& placement : placements) {
          snapshot.Release(placement);
        }
      }
      held.clear();
    }
  }
  state.counters["nodes"] = static_cast<double>(snapshot.nodes().size());
}
BENCHMARK(BM_PlaceJobsOnTenThousandNodes)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace gpufleet::scheduler

BENCHMARK_MAIN();
