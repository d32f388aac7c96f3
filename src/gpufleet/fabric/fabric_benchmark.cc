// SPDX-License-Identifier: Apache-2.0
// The fabric model's costs: building and analysing reference designs, the ECMP simulation of a
// 1,024-GPU ring all-reduce on a 3-tier fabric (target <= 50 ms), and one collective estimate.
#include <benchmark/benchmark.h>

#include "gpufleet/fabric/analysis.h"
#include "gpufleet/fabric/collective.h"
#include "gpufleet/fabric/ecmp.h"
#include "gpufleet/fabric/generators.h"

namespace gpufleet::fabric {
namespace {

// 4 pods x 4 leaves x 8 nodes x 8 GPUs = 1,024 GPUs; each leaf 32 NICs down, 32 up.
Fabric ThreeTierFabric() {
  ClosOptions options;
  options.tiers = 3;
  options.pods = 4;
  options.leaves_per_pod = 4;
  options.nodes_per_leaf = 4;
  options.radix = 64;
  auto spec = GenerateClos(options);
  return *Fabric::Build(*spec);
}

void BM_EcmpRingAllReduce1024Gpus(benchmark::State& state) {
  // 1,024 GPUs need 128 nodes: 8 pods of 4 leaves of 4 nodes.
  ClosOptions options;
  options.tiers = 3;
  options.pods = 8;
  options.leaves_per_pod = 4;
  options.nodes_per_leaf = 4;
  const Fabric fabric = *Fabric::Build(*GenerateClos(options));
  // Ranks spread round-robin over the pods: the worst case, every hop through the core.
  std::vector<PlacedGpus> placement;
  const int nodes = static_cast<int>(fabric.nodes().size());
  for (int i = 0; i < nodes; ++i) {
    placement.push_back({(i % 8) * (nodes / 8) + i / 8, 8});
  }
  EcmpOptions ecmp;
  ecmp.queue_pairs = static_cast<int>(state.range(0));
  for (auto _ : state) {
    const std::vector<Flow> flows = CollectiveFlows(fabric, placement, Collective::kAllReduce);
    auto result = SimulateEcmp(fabric, flows, ecmp);
    benchmark::DoNotOptimize(result);
  }
  state.counters["gpus"] = fabric.TotalGpus();
}
BENCHMARK(BM_EcmpRingAllReduce1024Gpus)->Arg(1)->Arg(4)->Unit(benchmark::kMillisecond);

void BM_BuildAndAnalyzeSuperpod(benchmark::State& state) {
  SuperpodOptions options;
  options.scalable_units = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto fabric = Fabric::Build(*GenerateSuperpod(options));
    benchmark::DoNotOptimize(Analyze(*fabric));
  }
}
BENCHMARK(BM_BuildAndAnalyzeSuperpod)->Arg(4)->Arg(8)->Unit(benchmark::kMillisecond);

void BM_EstimateCollective(benchmark::State& state) {
  const Fabric fabric = ThreeTierFabric();
  std::vector<PlacedGpus> placement;
  for (int i = 0; i < 16; ++i) {
    placement.push_back({i * 4, 8});
  }
  for (auto _ : state) {
    auto shape = ShapeOf(fabric, placement);
    benchmark::DoNotOptimize(EstimateCollective(Collective::kAllReduce, int64_t{1} << 30, *shape));
  }
}
BENCHMARK(BM_EstimateCollective);

}  // namespace
}  // namespace gpufleet::fabric

BENCHMARK_MAIN();
