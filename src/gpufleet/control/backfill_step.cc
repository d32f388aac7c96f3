// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/backfill_step.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/tenancy.h"
#include "gpufleet/wire/job_spec.h"

namespace gpufleet::control {

int64_t EstimateSeconds(const Job& job) {
  return std::chrono::duration_cast<std::chrono::seconds>(job.runtime_estimate).count();
}

void BackfillStep::BeginCycle(int64_t now_seconds) {
  now_seconds_ = now_seconds;
  head_.reset();
  head_job_.reset();
  reservation_ = {};
  running_.clear();
  started_.clear();
}

void BackfillStep::NoteTried(const std::string& name, bool did_not_fit) {
  if (did_not_fit) {
    did_not_fit_.insert(name);
  } else {
    did_not_fit_.erase(name);
  }
}

std::vector<policy::RunningJob> BackfillStep::RunningJobs(SchedulingView& view,
                                                          const QueueController& queues,
                                                          int64_t now_seconds) const {
  std::vector<policy::RunningJob> running;
  for (auto& [name, job] : view.jobs()) {
    if (!job.applied) {
      continue;
    }
    ViewJobSpec(job, catalog_);
    const std::optional<int64_t> since = queues.ChargedSince(name);
    running.push_back({.id = JobId(name),
                       .queue = QueueId(job.queue),
                       .priority = job.priority,
                       .start_seconds = since ? std::min(*since, now_seconds) : now_seconds,
                       .estimate_seconds = job.spec->ok() ? EstimateSeconds(**job.spec) : 0,
                       .placements = job.placements});
  }
  return running;
}

Status BackfillStep::SetHead(const std::string& name, const Job& job, SchedulingView& view,
                             const QueueController& queues, scheduler::Scheduler& scheduler,
                             Random& random) {
  head_ = name;
  head_job_ = job;
  // Without a running job of known length no reservation can be made: spare the plan (and the
  // copy of every running job's placements) in the common case of jobs without estimates.
  bool any_estimate = std::any_of(started_.begin(), started_.end(),
                                  [](const auto& started) { return started.estimate_seconds > 0; });
  for (auto& [other, other_job] : view.jobs()) {
    if (any_estimate) {
      break;
    }
    if (!other_job.applied) {
      continue;
    }
    const Result<Job>& spec = ViewJobSpec(other_job, catalog_);
    any_estimate = spec.ok() && EstimateSeconds(*spec) > 0;
  }
  if (!any_estimate) {
    reservation_ = {};
    running_ = started_;
    return Status::Ok();
  }
  running_ = RunningJobs(view, queues, now_seconds_);
  running_.insert(running_.end(), started_.begin(), started_.end());
  policy::BackfillPlanner planner(scheduler);
  GPUFLEET_ASSIGN_OR_RETURN(reservation_,
                            planner.Reserve(job, running_, now_seconds_, view.snapshot(), random));
  return Status::Ok();
}

Result<std::optional<std::string>> BackfillStep::Refusal(
    const std::string& name, const Job& job, const std::vector<scheduler::TaskPlacement>& placed,
    SchedulingView& view, scheduler::Scheduler& scheduler, Random& random) {
  if (!head_ || !reservation_.exists() || *head_ == name) {
    return std::optional<std::string>();
  }
  const policy::RunningJob candidate{.id = JobId(name),
                                     .start_seconds = now_seconds_,
                                     .estimate_seconds = EstimateSeconds(job),
                                     .placements = placed};
  policy::BackfillPlanner planner(scheduler);
  GPUFLEET_ASSIGN_OR_RETURN(const bool keeps,
                            planner.KeepsReservation(reservation_, *head_job_, candidate, running_,
                                                     now_seconds_, view.snapshot(), random));
  if (keeps) {
    return std::optional<std::string>();
  }
  // Another team's job is not named to this one's team.
  const std::string head = TeamOfKey(*head_) == TeamOfKey(name)
                               ? fmt::format("job {}", NameOfKey(*head_))
                               : std::string("a job of another team");
  return std::optional<std::string>(fmt::format(
      "backfill: starting now would delay {}, first in the queue, whose reservation starts in {} "
      "s; this job {}",
      head, reservation_.shadow_seconds - now_seconds_,
      EstimateSeconds(job) > 0 ? fmt::format("would run {} s, past that", EstimateSeconds(job))
                               : std::string("has no runtimeEstimate")));
}

void BackfillStep::NoteStarted(const std::string& name, const Job& job,
                               std::vector<scheduler::TaskPlacement> placed) {
  policy::RunningJob started{.id = JobId(name),
                             .start_seconds = now_seconds_,
                             .estimate_seconds = EstimateSeconds(job),
                             .placements = std::move(placed)};
  if (head_) {
    running_.push_back(started);
  }
  started_.push_back(std::move(started));
}

std::optional<int64_t> BackfillStep::shadow_seconds() const {
  return reservation_.exists() ? std::optional<int64_t>(reservation_.shadow_seconds) : std::nullopt;
}

}  // namespace gpufleet::control
