// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/policy/mig_planner.h"

// "MIG" mode: a cluster of MIG-enabled GPUs and a stream of single-instance MIG tasks whose mix
// of sizes shifts over the day (small instances by day, large ones by night), so that any one
// layout goes stale. The same arrivals run under three ways of managing instances: a fixed
// layout, the scheduler alone (it creates instances in free slices and never destroys them), and
// the scheduler with the MIG planner repartitioning GPUs whose instances are free.
namespace gpufleet::sim {

enum class MigMode {
  kFixed,        // the initial layout stays as it is: no instance is created or destroyed
  kCreateOnly,   // GPUs start empty; the scheduler creates instances, finished ones stay free
  kRepartition,  // the initial layout, then the scheduler plus the planner
};
const char* MigModeName(MigMode mode);  // "fixed", "create-only", "repartition"

// The instance sizes (compute slices) the scenario uses, and their count.
inline constexpr std::array<int, 5> kMigSizes = {1, 2, 3, 4, 7};

struct MigNodeGroup {
  std::string model;  // a MIG-capable catalog model
  int nodes = 0;
};

struct MigSimOptions {
  uint64_t seed = 42;
  int64_t duration_seconds = int64_t{3} * 86400;
  std::vector<MigNodeGroup> node_groups = {{"H100-80GB", 4}, {"A100-40GB", 2}};
  int gpus_per_node = 8;
  // Offered load: compute-slice-seconds arriving per second, as a share of the fleet's slices.
  double load = 0.85;
  // Task run times are exponential with this mean, cut to [60 s, 12 x the mean].
  int64_t mean_duration_seconds = 3600;
  // A task that has not started this long after it arrived leaves, unserved.
  int64_t patience_seconds = int64_t{2} * 3600;
  // Shares of arriving tasks by size (kMigSizes order) at noon and at midnight; in between, the
  // mix moves along a cosine. Each task runs on one model, drawn by the model's share of slices.
  std::array<double, 5> day_mix = {0.50, 0.30, 0.15, 0.05, 0.0};
  std::array<double, 5> night_mix = {0.05, 0.10, 0.25, 0.25, 0.35};
  // The layout the fixed and repartition runs start from: instance sizes per GPU, each at the
  // lowest start that lets the rest fit, the patterns used in turn over each node's GPUs.
  std::vector<std::vector<int>> initial_layout = {{7},    {4, 3}, {7},          {3, 2, 1, 1},
                                                  {4, 3}, {7},    {3, 2, 1, 1}, {2, 2, 2, 1}};
  // Repartition mode: how often the planner runs while tasks wait, and how many of the oldest
  // waiting tasks it plans for.
  int64_t replan_interval_seconds = 300;
  int max_plan_requests = 64;
  policy::MigPlannerOptions planner = {.search_budget = 20000};
  // Width of the time-series buckets.
  int64_t sample_seconds = 3600;

  // kInvalidArgument naming the field and the value.
  Status Validate(const GpuCatalog& catalog) const;
};

// Tasks of one size.
struct MigSizeStats {
  int size = 0;  // compute slices
  int submitted = 0;
  int served = 0;  // started before their patience ran out
  int abandoned = 0;
  double mean_wait_seconds = 0;  // of the served ones
};

// One time bucket.
struct MigBucket {
  int64_t start_seconds = 0;
  double slice_utilization = 0;  // compute slices of running tasks / all slices, time-averaged
  int pending_at_end = 0;
  int arrived = 0;
  int arrived_large = 0;  // of size 3 or more
  int served = 0;         // tasks started in the bucket
};

struct MigSimResult {
  MigMode mode = MigMode::kFixed;
  uint64_t seed = 0;
  int64_t duration_seconds = 0;
  int total_gpus = 0;
  int total_slices = 0;
  int submitted = 0;
  int served = 0;
  int abandoned = 0;
  int waiting_at_end = 0;
  double mean_wait_seconds = 0;  // of the served tasks
  double p95_wait_seconds = 0;
  double slice_utilization = 0;
  std::vector<MigSizeStats> by_size;  // kMigSizes order
  std::vector<MigBucket> buckets;
  // Repartition mode only.
  int planner_runs = 0;
  int planner_runs_not_optimal = 0;  // the search budget ran out; the plan was the best found
  int64_t planner_steps = 0;
  int gpus_reconfigured = 0;  // summed over plans
  int instances_destroyed = 0;
  int instances_created = 0;  // by plans; the scheduler's own creations are not counted

  double ServedShare() const { return submitted > 0 ? static_cast<double>(served) / submitted : 0; }
};

// One run. kInvalidArgument for bad options.
Result<MigSimResult> RunMigSim(const MigSimOptions& options, MigMode mode,
                               const GpuCatalog& catalog);
// The three modes on the same arrivals (fixed, create-only, repartition), on up to `threads`
// threads; the results do not depend on `threads`.
Result<std::vector<MigSimResult>> RunMigSims(const MigSimOptions& options,
                                             const GpuCatalog& catalog, int threads);

// A fixed-width table, one column per run.
void PrintMigSummary(const std::vector<MigSimResult>& results, std::ostream& out);

// An HTML5 page titled `title`: the runs side by side, served share per size, and charts of
// slice utilization, waiting tasks, the demand mix over time and the served share per size.
// kInvalidArgument when `results` is empty; kUnavailable when `out` fails.
Status WriteMigReport(const std::vector<MigSimResult>& results, const MigSimOptions& options,
                      const std::string& title, std::ostream& out);

}  // namespace gpufleet::sim
