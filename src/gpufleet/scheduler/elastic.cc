// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/elastic.h"

#include <utility>

namespace gpufleet::scheduler {
namespace {

void RevertAll(const ScheduleResult& result, ClusterSnapshot& snapshot) {
  for (auto it = result.placements.rbegin(); it != result.placements.rend(); ++it) {
    snapshot.Revert(*it);
  }
}

}  // namespace

SizedSchedule ScheduleLargestSize(Scheduler& scheduler, const Job& job, ClusterSnapshot& snapshot,
                                  Random& random) {
  const int max_size = job.groups[0].replicas;
  const int min_size = job.groups[0].min_replicas;
  ScheduleResult largest = scheduler.Schedule(job, snapshot, random);
  if (largest.scheduled() || largest.outcome == ScheduleOutcome::kError || min_size >= max_size) {
    return {.result = std::move(largest), .size = largest.scheduled() ? max_size : 0};
  }
  ScheduleResult smallest = scheduler.Schedule(job.AtSize(min_size), snapshot, random);
  if (!smallest.scheduled()) {
    return {.result = std::move(smallest), .size = 0};
  }
  RevertAll(smallest, snapshot);
  // Invariant: `fits` fits, `too_large` does not; each try is taken back.
  int fits = min_size;
  int too_large = max_size;
  while (too_large - fits > 1) {
    const int size = fits + (too_large - fits) / 2;
    const ScheduleResult tried = scheduler.Schedule(job.AtSize(size), snapshot, random);
    if (tried.scheduled()) {
      RevertAll(tried, snapshot);
      fits = size;
    } else {
      too_large = size;
    }
  }
  ScheduleResult chosen = scheduler.Schedule(job.AtSize(fits), snapshot, random);
  const int size = chosen.scheduled() ? fits : 0;
  return {.result = std::move(chosen), .size = size};
}

}  // namespace gpufleet::scheduler
