// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "gpufleet/control/queue_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/policy/backfill.h"
#include "gpufleet/policy/running_job.h"
#include "gpufleet/scheduler/scheduler.h"

// The scheduling cycle's EASY backfill step (docs/explain.md): the first Pending job in queue
// order that does not fit (the head) gets a reservation at the time the running jobs' runtime
// estimates free room for it (policy::BackfillPlanner, as `gpufleet sim backfill` uses), and a
// later job that would fit now starts only if the head's reservation still holds with it running.
// So a large job at the head of the queue is not starved by small ones that keep fitting first.
// Jobs without a runtimeEstimate never end in the plan: with such jobs in the way there is no
// reservation, and nothing is held back. Not thread-safe: it belongs to the thread that runs
// cycles.
namespace gpufleet::control {

class BackfillStep {
 public:
  // REQUIRES: `catalog` outlives the step.
  explicit BackfillStep(const GpuCatalog& catalog) : catalog_(catalog) {}

  // At the start of the cycle's pass over the Pending jobs, at `now_seconds` (the queue
  // controller's CycleSeconds()).
  void BeginCycle(int64_t now_seconds);

  // Whether the head is still to be found this cycle.
  bool LookingForHead() const { return !head_; }
  // Whether `name`'s last try found it too big for the free resources (the scheduler said
  // unschedulable), so it may be a head even when the cycle skips it as unchanged.
  bool DidNotFit(const std::string& name) const { return did_not_fit_.count(name) > 0; }
  void NoteTried(const std::string& name, bool did_not_fit);

  // Makes `name` the head and plans its reservation over the view's running jobs and those this
  // cycle placed so far. kInternal if the snapshot cannot be restored.
  Status SetHead(const std::string& name, const Job& job, SchedulingView& view,
                 const QueueController& queues, scheduler::Scheduler& scheduler, Random& random);

  // Why `placed` (applied in the snapshot) for `name` must not start now: it would run past the
  // head's reservation and take what the head needs then. nullopt: it may start.
  Result<std::optional<std::string>> Refusal(const std::string& name, const Job& job,
                                             const std::vector<scheduler::TaskPlacement>& placed,
                                             SchedulingView& view, scheduler::Scheduler& scheduler,
                                             Random& random);
  // Records a job the cycle placed: it holds resources from now on.
  void NoteStarted(const std::string& name, const Job& job,
                   std::vector<scheduler::TaskPlacement> placed);

  // The head of the last cycle, and its reservation's start (CycleSeconds; nullopt: none could
  // be made).
  const std::optional<std::string>& head() const { return head_; }
  std::optional<int64_t> shadow_seconds() const;

  // Every job holding resources in the view, as the backfill plan sees it: started when its queue
  // charged it (or now), ending by its runtimeEstimate (0: unknown).
  std::vector<policy::RunningJob> RunningJobs(SchedulingView& view, const QueueController& queues,
                                              int64_t now_seconds) const;

 private:
  const GpuCatalog& catalog_;
  int64_t now_seconds_ = 0;
  std::optional<std::string> head_;
  std::optional<Job> head_job_;
  policy::Reservation reservation_;
  std::vector<policy::RunningJob> running_;  // view's jobs and this cycle's, once a head is set
  std::vector<policy::RunningJob> started_;  // placed this cycle
  std::set<std::string> did_not_fit_;
};

// The estimate of a spec in whole seconds (0: unknown).
int64_t EstimateSeconds(const Job& job);

}  // namespace gpufleet::control
