// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "gpufleet/core/ids.h"
#include "gpufleet/scheduler/snapshot.h"

namespace gpufleet::policy {

// A job that holds resources now: where, since when, for how long at most, and what stopping it
// would cost. The backfill planner (backfill.h) reads its placements, start and estimate; the
// preemption search (preemption.h) all but the estimate. Times are integer seconds on the
// caller's time line.
struct RunningJob {
  JobId id;
  QueueId queue;
  int priority = 0;
  bool preemptible = true;
  int64_t start_seconds = 0;
  // Its time limit, as in Slurm: it ends by then, or is killed past a grace; 0: unknown.
  int64_t estimate_seconds = 0;
  // The latest checkpoint the job can resume from; nullopt: none, so stopping it loses all the
  // work since its start. A checkpoint before the start counts as the start.
  std::optional<int64_t> last_checkpoint_seconds;
  // Work lost if the job is stopped now, in GPU-seconds, for callers that know it better than
  // the checkpoint time says; overrides GPUs x seconds since the checkpoint.
  std::optional<int64_t> lost_work_gpu_seconds;
  // How long the job runs before it may be preempted (its spec.preemption.minRuntime or its
  // queue's default); nullopt: PreemptionOptions::min_runtime_seconds.
  std::optional<int64_t> min_runtime_seconds;
  // Every task of the gang, as applied to the snapshot. Preemption frees all of them.
  std::vector<scheduler::TaskPlacement> placements;
  // An elastic job above its minimum size (docs/job-spec.md, "Elastic jobs"): up to this many of
  // its placements, those of the highest `replica`, may be released alone, a shrink that leaves
  // the job running; 0: the job stops whole or not at all.
  int releasable_tasks = 0;
};

}  // namespace gpufleet::policy
