// SPDX-License-Identifier: Apache-2.0
// Time of one explain answer (policy::Explain: the reason, its evidence, the ETA plan and the
// what-ifs) on 2,000 nodes x 8 H100 (125 leaves of 16 nodes) filled by running jobs (until 50 in a
// row do not fit) with runtime estimates of 1 to 24 hours, with 20 Pending jobs ahead. The argument
// is the job asked about: 0 = 8 tasks x 8 GPUs in one leaf (topology or capacity, ETA planned
// through the 20 jobs ahead, what-ifs on coarser levels and fewer GPUs), 1 = 16 whole nodes
// anywhere (capacity), 2 = one task on a model the cluster lacks (constraints, a what-if per other
// model).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "gpufleet/core/random.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/policy/explain.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::PluginRegistry;
using scheduler::Scheduler;
using scheduler::testing::MakeJob;

struct Setup {
  GpuCatalog catalog = GpuCatalog::Default();
  std::unique_ptr<Scheduler> scheduler;
  std::optional<ClusterSnapshot> snapshot;
  std::vector<RunningJob> running;
  std::vector<Job> ahead;
};

std::unique_ptr<Setup> Fill() {
  auto setup = std::make_unique<Setup>();
  setup->scheduler = Scheduler::Create({}, PluginRegistry::Default()).value();
  SyntheticClusterSpec spec;
  spec.blocks = 5;
  spec.leaves_per_block = 25;
  spec.nodes_per_leaf = 16;
  Cluster cluster = MakeSyntheticCluster(spec, setup->catalog).value();
  setup->snapshot.emplace(ClusterSnapshot::Build(std::move(cluster), setup->catalog).value());
  ClusterSnapshot& snapshot = *setup->snapshot;
  Random random(7);
  int misses = 0;
  for (int attempt = 0; misses < 50; ++attempt) {
    const std::string id = "job-" + std::to_string(attempt);
    Job job = random.Uniform(2) == 0
                  ? MakeJob(id, 1, WholeGpus{1 + static_cast<int>(random.Uniform(8))})
                  : MakeJob(id, 1 + static_cast<int>(random.Uniform(4)), WholeGpus{8});
    scheduler::ScheduleResult result = setup->scheduler->Schedule(job, snapshot, random);
    if (!result.scheduled()) {
      ++misses;
      continue;
    }
    misses = 0;
    setup->running.push_back(
        {.id = job.id,
         .start_seconds = 0,
         .estimate_seconds = 3600 * (1 + static_cast<int64_t>(random.Uniform(24))),
         .placements = std::move(result.placements)});
  }
  for (int i = 0; i < 20; ++i) {
    Job job = MakeJob("ahead-" + std::to_string(i), 1 + static_cast<int>(random.Uniform(4)),
                      WholeGpus{8});
    job.runtime_estimate = std::chrono::hours(1 + random.Uniform(8));
    setup->ahead.push_back(std::move(job));
  }
  return setup;
}

void BM_Explain(benchmark::State& state) {
  static std::unique_ptr<Setup> setup = Fill();
  Job job;
  switch (state.range(0)) {
    case 0:
      job = MakeJob("asked", 8, WholeGpus{8});
      job.topology.required_level = "leaf";
      break;
    case 1:
      job = MakeJob("asked", 16, WholeGpus{8});
      break;
    default:
      job = MakeJob("asked", 1, WholeGpus{8});
      job.allowed_gpu_models = {"H200-141GB"};
  }
  job.runtime_estimate = std::chrono::hours(2);
  ExplainInput input{.job = &job, .running = setup->running, .now_seconds = 1800};
  for (const Job& ahead : setup->ahead) {
    input.ahead.push_back(&ahead);
  }
  std::string reason;
  for (auto _ : state) {
    Random random(1);
    Result<Explanation> explained = Explain(*setup->scheduler, *setup->snapshot, input, random);
    benchmark::DoNotOptimize(explained);
    reason = std::string(PendingReasonName(explained->reason)) + ", eta " +
             (explained->eta_seconds ? std::to_string(*explained->eta_seconds) : "unknown") + ", " +
             std::to_string(explained->what_ifs.size()) + " what-ifs";
  }
  state.SetLabel(reason + ", " + std::to_string(setup->snapshot->nodes().size()) + " nodes, " +
                 std::to_string(setup->running.size()) + " running");
}
BENCHMARK(BM_Explain)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpufleet::policy

BENCHMARK_MAIN();
