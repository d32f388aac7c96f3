// SPDX-License-Identifier: Apache-2.0
// Victim search time: a 64-GPU job that needs one leaf (8 tasks x 8 GPUs) on a synthetic cluster of
// `leaves` leaves x 16 nodes x 8 H100, filled by running jobs of lower priority, 90% of the GPUs
// allocated. Second argument, the job mix: 0 = whole-node tasks and gangs (about 4 jobs per leaf),
// 1 = also single tasks of 1..8 GPUs (about 6 per leaf), 2 = single tasks of 1 or 2 GPUs only
// (about 80 per leaf: beyond 20 candidates a leaf is searched greedily).
#include <cstddef>
#include <memory>
#include <vector>

#include <benchmark/benchmark.h>

#include "gpufleet/core/random.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/policy/preemption.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::PluginRegistry;
using scheduler::Scheduler;
using scheduler::testing::MakeJob;

constexpr int64_t kNow = 100000;

struct Setup {
  GpuCatalog catalog = GpuCatalog::Default();
  std::unique_ptr<Scheduler> scheduler;
  std::optional<ClusterSnapshot> snapshot;
  std::vector<RunningJob> running;
};

std::unique_ptr<Setup> Fill(int leaves, int mix) {
  auto setup = std::make_unique<Setup>();
  setup->scheduler = Scheduler::Create({}, PluginRegistry::Default()).value();
  Cluster cluster = MakeSyntheticCluster({1, leaves, 16, 8}, setup->catalog).value();
  setup->snapshot.emplace(ClusterSnapshot::Build(std::move(cluster), setup->catalog).value());
  ClusterSnapshot& snapshot = *setup->snapshot;
  Random random(7);
  // Fill until 50 jobs in a row do not fit, then end random jobs of 1 or 2 tasks, leaf by leaf,
  // down to 90%: best fit packs the first leaves first, so only this way are the free GPUs
  // scattered.
  int misses = 0;
  for (int attempt = 0; misses < 50; ++attempt) {
    Job job;
    const std::string id = "job-" + std::to_string(attempt);
    const uint64_t kind = random.Uniform(10);
    if (mix == 2) {
      job = MakeJob(id, 1, WholeGpus{1 + static_cast<int>(random.Uniform(2))});
    } else if (mix >= 1 && kind < 5) {
      job = MakeJob(id, 1, WholeGpus{1 + static_cast<int>(random.Uniform(8))});
    } else if (kind < 8) {
      job = MakeJob(id, 1 + static_cast<int>(random.Uniform(4)), WholeGpus{8});
    } else {
      job = MakeJob(id, 2 + static_cast<int>(random.Uniform(7)), WholeGpus{8});
      job.topology.required_level = "leaf";
    }
    scheduler::ScheduleResult result = setup->scheduler->Schedule(job, snapshot, random);
    if (!result.scheduled()) {
      ++misses;
      continue;
    }
    misses = 0;
    RunningJob running;
    running.id = job.id;
    running.priority = static_cast<int>(random.Uniform(3));
    running.preemptible = random.Uniform(10) != 0;
    running.start_seconds = static_cast<int64_t>(random.Uniform(kNow));
    running.placements = std::move(result.placements);
    setup->running.push_back(std::move(running));
  }
  for (int leaf = 0; snapshot.AllocatedGpuMilli() * 100 > snapshot.TotalGpuMilli() * 90;
       leaf = (leaf + 1) % leaves) {
    std::vector<size_t> small;
    for (size_t j = 0; j < setup->running.size(); ++j) {
      const RunningJob& job = setup->running[j];
      if (job.placements.size() <= 2 &&
          snapshot.nodes()[job.placements[0].node].domains[1] == leaf) {
        small.push_back(j);
      }
    }
    if (small.empty()) {
      continue;
    }
    const size_t victim = small[random.Uniform(small.size())];
    for (const scheduler::TaskPlacement& placement : setup->running[victim].placements) {
      snapshot.Release(placement);
    }
    setup->running.erase(setup->running.begin() + static_cast<std::ptrdiff_t>(victim));
  }
  return setup;
}

void BM_FindVictimsForOneLeaf(benchmark::State& state) {
  const int leaves = static_cast<int>(state.range(0));
  const std::unique_ptr<Setup> setup = Fill(leaves, static_cast<int>(state.range(1)));
  auto search =
      PreemptionSearch::Create(*setup->scheduler, HigherPriorityInSameQueue(), {}).value();
  Job preemptor = MakeJob("preemptor", 8, WholeGpus{8});
  preemptor.priority = 3;
  preemptor.topology.required_level = "leaf";
  Random random(1);
  PreemptionDecision decision;
  for (auto _ : state) {
    decision = search.Find(*setup->snapshot, preemptor, setup->running, kNow, random).value();
    benchmark::DoNotOptimize(decision);
  }
  state.counters["gpus"] = setup->snapshot->TotalGpus();
  state.counters["running_jobs"] = static_cast<double>(setup->running.size());
  state.counters["fit_checks"] = static_cast<double>(decision.fit_checks);
  state.counters["has_plan"] = decision.plan ? 1 : 0;
  state.counters["preempted_gpus"] = decision.plan ? decision.plan->preempted_gpu_milli / 1000 : 0;
  state.counters["victims"] =
      decision.plan ? static_cast<double>(decision.plan->victims.size()) : 0;
  state.counters["proven_optimal"] = decision.plan && decision.plan->proven_optimal ? 1 : 0;
}
BENCHMARK(BM_FindVictimsForOneLeaf)
    ->ArgsProduct({{4, 16, 64}, {0, 1, 2}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpufleet::policy
BENCHMARK_MAIN();
