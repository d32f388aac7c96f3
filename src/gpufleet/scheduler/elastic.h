// SPDX-License-Identifier: Apache-2.0
#pragma once

#include "gpufleet/core/random.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/snapshot.h"

namespace gpufleet::scheduler {

// An elastic job's size (docs/job-spec.md, "Elastic jobs"), chosen with its placement.
struct SizedSchedule {
  ScheduleResult result;
  int size = 0;  // the elastic group's replicas placed; 0 when nothing fits
};

// Places an elastic job (Job::IsElastic) at the largest size from its group's `replicas` down to
// `min_replicas` that fits now, each size the scheduler's own gang placement of Job::AtSize, so
// that its topology rules hold at every size. The maximum is tried first, then the minimum, then a
// binary search (each try taken back) between the largest size known to fit and the smallest known
// not to, then that size is placed: at most 3 + ceil(log2(max - min)) Schedule calls. The search
// takes it that a size that fits means every smaller one fits, which greedy placement makes nearly
// but not strictly true: a size it skips costs the job tasks, never a wrong placement. Like
// Schedule, it leaves the chosen placements applied to `snapshot` and nothing else; without a fit,
// the result is the minimum's refusal. Pure: no IO, no clock.
SizedSchedule ScheduleLargestSize(Scheduler& scheduler, const Job& job, ClusterSnapshot& snapshot,
                                  Random& random);

}  // namespace gpufleet::scheduler
