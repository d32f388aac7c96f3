// SPDX-License-Identifier: Apache-2.0
// What one sample and one scrape cost: the sampler's CPU share at 1 Hz is the time per
// SampleOnce (plus a fifteenth of a render for a 15 s scrape interval) divided by a second.
// bench/agent_telemetry.sh measures the whole process instead.
#include <memory>

#include <benchmark/benchmark.h>

#include "gpufleet/agent/nvml_probe.h"
#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/agent/testing/fake_nvml.h"

namespace gpufleet::agent {
namespace {

void BM_SampleOnceFakeNvml(benchmark::State& state) {
  auto fake = testing::FakeNvml::Open(GPUFLEET_FAKE_NVML_PATH);
  if (!fake.ok() ||
      !(*fake)->LoadScript(testing::HealthyH100Script(static_cast<int>(state.range(0)))).ok()) {
    state.SkipWithError("cannot load the fake NVML library");
    return;
  }
  auto probe = NvmlProbe::Open({.library_path = GPUFLEET_FAKE_NVML_PATH});
  FakeClock clock;
  auto sampler = TelemetrySampler::Create({.probe = **probe, .clock = clock});
  for (auto _ : state) {
    benchmark::DoNotOptimize((*sampler)->SampleOnce());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SampleOnceFakeNvml)->Arg(8);

void BM_SampleOnceSimulated(benchmark::State& state) {
  FakeClock clock;
  const GpuCatalog catalog = GpuCatalog::Default();
  auto probe =
      SimulatedProbe::Create(clock, catalog, {.gpu_count = static_cast<int>(state.range(0))});
  auto sampler = TelemetrySampler::Create({.probe = **probe, .clock = clock});
  for (auto _ : state) {
    benchmark::DoNotOptimize((*sampler)->SampleOnce());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_SampleOnceSimulated)->Arg(8);

void BM_RenderMetrics(benchmark::State& state) {
  FakeClock clock;
  const GpuCatalog catalog = GpuCatalog::Default();
  auto probe =
      SimulatedProbe::Create(clock, catalog, {.gpu_count = static_cast<int>(state.range(0))});
  auto sampler =
      TelemetrySampler::Create({.probe = **probe, .clock = clock, .hostname = "node-0001"});
  benchmark::DoNotOptimize((*sampler)->SampleOnce());
  for (auto _ : state) {
    benchmark::DoNotOptimize((*sampler)->RenderMetrics());
  }
}
BENCHMARK(BM_RenderMetrics)->Arg(8);

}  // namespace
}  // namespace gpufleet::agent

BENCHMARK_MAIN();
