// SPDX-License-Identifier: Apache-2.0
// The CPU cost of GET /v1/usage beyond reading the store: parsing N stored run records and the
// ledger over them (ComputeUsage), by team. Records of 40 teams, 2 GPU models, 1-8 GPUs each,
// spread over 30 days; the query covers 7 of them.
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "gpufleet/control/usage_ledger.h"

namespace gpufleet::control {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

std::vector<std::string> StoredRecords(int count) {
  std::vector<std::string> records;
  records.reserve(count);
  for (int i = 0; i < count; ++i) {
    RunUsage run;
    run.team = "team-" + std::to_string(i % 40);
    run.job = run.team + "/job-" + std::to_string(i);
    run.queue = "q-" + std::to_string(i % 7);
    run.user = "user-" + std::to_string(i % 300);
    run.attempt = 1;
    run.start_ns = static_cast<int64_t>(i) * 30 * 24 * 3600 / count * kSecond;
    run.end_ns = run.start_ns + (600 + i % 7200) * kSecond;
    run.units_by_model[i % 3 == 0 ? "A100-80GB" : "H100-80GB"] = (1 + i % 8) * kShareUnitsPerGpu;
    run.busy_unit_ms = (run.end_ns - run.start_ns) / 1'000'000 * kShareUnitsPerGpu / 2;
    records.push_back(RunUsageToJson(run).dump());
  }
  return records;
}

void BM_UsageReport(benchmark::State& state) {
  const std::vector<std::string> records = StoredRecords(static_cast<int>(state.range(0)));
  UsageQuery query;
  query.from_ns = 10LL * 24 * 3600 * kSecond;
  query.to_ns = 17LL * 24 * 3600 * kSecond;
  for (auto _ : state) {
    std::vector<RunUsage> runs;
    runs.reserve(records.size());
    for (const std::string& text : records) {
      Result<RunUsage> run = RunUsageFromJson(Json::parse(text, nullptr, false));
      if (run.ok()) {
        runs.push_back(*std::move(run));
      }
    }
    UsageReport report = ComputeUsage(
        runs, 1024 * kShareUnitsPerGpu * ((query.to_ns - query.from_ns) / 1'000'000), query);
    benchmark::DoNotOptimize(report);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_UsageReport)->Arg(1000)->Arg(10000)->Arg(100000)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace gpufleet::control
BENCHMARK_MAIN();
