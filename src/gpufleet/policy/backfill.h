// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "gpufleet/core/ids.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/policy/running_job.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/snapshot.h"

// EASY backfill (Lifka 1995; Slurm's sched/backfill with one reservation): the first job in
// queue order that does not fit now gets a reservation at the earliest time the running jobs'
// runtime estimates free enough room for it (the "shadow time"), and a later job may start now
// only if that reservation still holds with it running. The scheduler that places jobs also
// answers "does the head job fit then?", so gangs, topology constraints and every filter count
// exactly as they will when the time comes. docs/utilization.md describes the rules.
//
// Runtime estimates are time limits, as in Slurm: a job ends at its estimate at the latest, or
// `overrun_grace_seconds` later (Slurm's OverTimeLimit), when it is killed as timed out. An
// estimate of 0 means "unknown": for planning such a job never ends.
namespace gpufleet::policy {

// Planned end of a job that is never expected to end.
inline constexpr int64_t kNeverEnds = std::numeric_limits<int64_t>::max();

struct BackfillOptions {
  // How long a job may run past its estimate before it is killed; planning assumes a job that
  // has passed its estimate ends at estimate + grace. Slurm's OverTimeLimit defaults to 0.
  int64_t overrun_grace_seconds = 0;
};

// When `job` is planned to give its resources back, seen at `now_seconds`: start + estimate; once
// past that, start + estimate + grace; once past that too, now (its kill is due). kNeverEnds for
// an unknown estimate.
int64_t PlannedEndSeconds(const RunningJob& job, int64_t now_seconds,
                          const BackfillOptions& options);

// Where and when the head job is promised to start.
struct Reservation {
  JobId job;
  int64_t shadow_seconds = kNeverEnds;  // kNeverEnds: no reservation can be made
  // Where the scheduler would place the job at the shadow time, as planned now.
  std::vector<scheduler::TaskPlacement> placements;

  // False when the job fits nowhere even after every job with a known end has ended (jobs of
  // unknown length stand in the way, or no domain can ever hold it); nothing is then protected.
  bool exists() const { return shadow_seconds != kNeverEnds; }
};

// Plans and checks reservations with the caller's scheduler. Every query works on the caller's
// snapshot in place (running jobs released in the order they end, the head job placed and
// reverted) and leaves it exactly as it found it: same free resources, placements and MIG
// instances. Not thread-safe; the scheduler and snapshot must not be used meanwhile.
class BackfillPlanner {
 public:
  // REQUIRES: `scheduler` outlives the planner.
  explicit BackfillPlanner(scheduler::Scheduler& scheduler, BackfillOptions options = {});

  // The earliest planned end time (`now_seconds` when it fits now) after which `head` fits,
  // with `running` (every job holding resources in `snapshot` that may end) released in the
  // order of their planned ends, ties together. kInternal if the snapshot cannot be restored
  // (a `running` placement that was not applied).
  Result<Reservation> Reserve(const Job& head, const std::vector<RunningJob>& running,
                              int64_t now_seconds, scheduler::ClusterSnapshot& snapshot,
                              Random& random);

  // Whether `reservation` for `head` still holds with `candidate` started now: true when there is
  // no reservation, when the candidate is planned to end by the shadow time, or when the head
  // still fits at the shadow time with the candidate still running. REQUIRES: the candidate's
  // placements are applied in `snapshot`, and `running` is the other jobs holding resources
  // (the candidate not among them).
  Result<bool> KeepsReservation(const Reservation& reservation, const Job& head,
                                const RunningJob& candidate, const std::vector<RunningJob>& running,
                                int64_t now_seconds, scheduler::ClusterSnapshot& snapshot,
                                Random& random);

  const BackfillOptions& options() const { return options_; }

 private:
  scheduler::Scheduler& scheduler_;
  BackfillOptions options_;
};

}  // namespace gpufleet::policy
