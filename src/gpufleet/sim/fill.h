// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/scheduler.h"

// "Fill" mode: the experiment of the FGD paper (USENIX ATC'23) as its reference simulator runs
// it. Pods arrive one by one in a seeded shuffled order, followed by copies drawn with replacement
// until the summed GPU request would pass `load_target` x capacity; they never leave. At each
// arrived-load percent the GPU allocation ratio and the fragmentation are recorded.
namespace gpufleet::sim {

struct FillOptions {
  std::string policy = "fgd";
  uint64_t seed = 42;
  double load_target = 1.3;
  double workload_coverage = 0.95;  // share of pods whose shapes form FGD's target workload
  scheduler::TieBreak tie_break = scheduler::TieBreak::kNodeOrder;
  // > 0: a policy that needs a target workload (fgd, gpufleet) does not get the pod list's; it
  // learns it as `gpufleet server` does (policy::WorkloadHistory of the pods placed so far; before
  // the first placement, the arriving pod's shape), rebuilt every `learn_every` arrivals.
  int learn_every = 0;
};

// Means over the events whose arrived load rounds to `arrived_percent`.
struct FillPoint {
  int arrived_percent = 0;
  double allocation_percent = 0;     // allocated milli-GPU / capacity
  double fragmentation_percent = 0;  // fragmented milli-GPU / capacity
  double fragmentation_rate = 0;     // fragmented / idle milli-GPU, in percent
};

struct FillResult {
  std::string policy;
  uint64_t seed = 0;
  int total_gpus = 0;
  int pods_arrived = 0;
  int pods_failed = 0;
  std::vector<FillPoint> points;  // ascending arrived_percent, 0 .. 100 x load_target

  // The point at `percent`, or nullptr when none was recorded.
  const FillPoint* At(int percent) const;
  // (100 - allocation) % of the GPUs at `percent`; -1 when not recorded.
  double UnallocatedGpusAt(int percent) const;
};

// The arrival order for `seed`: `pods` sorted by name and shuffled, then copies (named
// "<pod>-copy-<i>") drawn with replacement from the sorted list while the summed GPU request
// stays within `load_target` x `capacity_milli`.
std::vector<Job> FillArrivalOrder(const std::vector<Job>& pods, int64_t capacity_milli,
                                  double load_target, uint64_t seed);

// Arrived load in whole percent of `capacity_milli`, rounded as the experiment buckets events.
int ArrivedPercent(int64_t arrived_milli, int64_t capacity_milli);

// The events (indices into `order`, one per arrival) whose measurements make up the point at
// `percent`: those whose arrived load rounds to it or, when there are none, those of its
// neighbours; empty when the point is not recorded.
std::vector<size_t> FillEventsAt(const std::vector<Job>& order, int64_t capacity_milli,
                                 int percent);

// kInvalidArgument for an unknown policy or an invalid cluster.
Result<FillResult> RunFill(const Cluster& cluster, const std::vector<Job>& pods,
                           const GpuCatalog& catalog, const FillOptions& options);

// Every policy x seed, on up to `threads` threads; the results are in (policy, seed) order and
// identical to running them one after another. `on_run_done` (thread-safe) follows progress.
Result<std::vector<FillResult>> RunFillMatrix(const Cluster& cluster, const std::vector<Job>& pods,
                                              const GpuCatalog& catalog,
                                              const std::vector<std::string>& policies,
                                              const std::vector<uint64_t>& seeds,
                                              const FillOptions& options, int threads,
                                              const std::function<void()>& on_run_done = {});

}  // namespace gpufleet::sim
