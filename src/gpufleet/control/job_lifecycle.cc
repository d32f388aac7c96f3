// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/job_lifecycle.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpufleet/control/usage_ledger.h"
#include "gpufleet/wire/agent_protocol.h"

namespace gpufleet::control {
namespace {

constexpr char kStoppingField[] = "stopping";
constexpr char kNoticeField[] = "notice";
constexpr char kExpeditedField[] = "expedited";

bool IsPlainTransition(JobState from, JobState to) {
  switch (to) {
    case JobState::kScheduled:
      return from == JobState::kPending;
    case JobState::kRunning:
      return from == JobState::kScheduled;
    case JobState::kPending:
      return from == JobState::kPreempted || from == JobState::kSuspended;
    case JobState::kCancelled:
      return from == JobState::kPending || from == JobState::kSuspended ||
             from == JobState::kPreempted;
    case JobState::kSuspended:
      return from == JobState::kPreempted;
    case JobState::kFailed:
      return from == JobState::kPending;
    default:
      return false;
  }
}

bool IsRunEnding(JobState then) {
  return then == JobState::kPending || then == JobState::kPreempted ||
         then == JobState::kSuspended || then == JobState::kFailed ||
         then == JobState::kCancelled || then == JobState::kSucceeded;
}

// Moves a job whose run is over to `then`.
void TakeEndState(Json& job, JobState then, std::string reason) {
  job["state"] = JobStateName(then);
  job["reason"] = std::move(reason);
  job["placements"] = Json::array();
  job.erase(kStoppingField);
  // An elastic job's size is its run's; the next run chooses its own.
  job.erase("world_size");
}

}  // namespace

std::optional<JobState> StoredJobState(const Json& job) {
  return ParseJobState(wire::StrOr(job, "state"));
}

bool HoldsResources(JobState state) {
  return state == JobState::kScheduled || state == JobState::kRunning ||
         state == JobState::kStopping;
}

bool RunIsWanted(JobState state) {
  return state == JobState::kScheduled || state == JobState::kRunning;
}

bool IsFinished(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled;
}

store::ListFilter UnfinishedJobs() {
  store::ListFilter filter{.exclude_states = true};
  for (const JobState state : kJobStates) {
    if (IsFinished(state)) {
      filter.states.emplace_back(JobStateName(state));
    }
  }
  return filter;
}

bool PlacementGone(const Json& placement) {
  const std::string phase = wire::StrOr(placement, "phase");
  return phase == "Succeeded" || phase == "Failed" || wire::BoolOr(placement, "gone", false);
}

bool PlacementGone(const wire::PlacementRecord& placement) {
  return placement.phase == "Succeeded" || placement.phase == "Failed" || placement.gone;
}

void MarkPlacementGone(Json& placement, std::string_view why) {
  placement["gone"] = true;
  placement["gone_reason"] = std::string(why);
}

Result<std::string> TransitionJob(Json& job, JobState to, std::string reason, std::string event) {
  const std::optional<JobState> from = StoredJobState(job);
  if (!from || !IsPlainTransition(*from, to)) {
    return FailedPreconditionError(
        fmt::format("job \"{}\" is {}; it cannot become {}", wire::StrOr(job, "name"),
                    wire::StrOr(job, "state", "unknown"), JobStateName(to)));
  }
  if (event.empty()) {
    event = reason.empty() ? JobStateName(to) : fmt::format("{}: {}", JobStateName(to), reason);
  }
  job["state"] = JobStateName(to);
  job["reason"] = std::move(reason);
  if (to == JobState::kScheduled) {
    job.erase(kExpeditedField);  // placed again: its head start is used
  }
  return event;
}

Result<std::string> EndRun(Json& job, JobState then, std::string reason, std::string since) {
  const std::optional<JobState> from = StoredJobState(job);
  if (from == JobState::kStopping && IsRunEnding(then)) {
    std::string event = fmt::format("{}; {} once its tasks are gone", reason, JobStateName(then));
    job["reason"] = reason;
    job[kStoppingField]["then"] = JobStateName(then);
    job[kStoppingField]["reason"] = std::move(reason);
    return event;
  }
  if (!from || !RunIsWanted(*from) || !IsRunEnding(then)) {
    return FailedPreconditionError(
        fmt::format("job \"{}\" is {}; its run cannot end as {}", wire::StrOr(job, "name"),
                    wire::StrOr(job, "state", "unknown"), JobStateName(then)));
  }
  // A preemption notice is over once the run ends, for whatever reason.
  job.erase(kNoticeField);
  bool all_gone = true;
  for (const Json& placement : wire::ArrayOr(job, "placements")) {
    all_gone = all_gone && PlacementGone(placement);
  }
  if (all_gone) {
    std::string event =
        reason.empty() ? JobStateName(then) : fmt::format("{}: {}", JobStateName(then), reason);
    TakeEndState(job, then, std::move(reason));
    return event;
  }
  std::string event = fmt::format("Stopping, then {}: {}", JobStateName(then), reason);
  job["state"] = JobStateName(JobState::kStopping);
  job["reason"] = reason;
  job[kStoppingField] = {
      {"then", JobStateName(then)}, {"reason", std::move(reason)}, {"since", std::move(since)}};
  return event;
}

namespace {

// The job's node-failure policy as its stored spec says ("requeue" unless "fail").
bool RequeuesOnNodeFailure(const Json& job) {
  const Json& spec = job.contains("spec") ? job["spec"] : Json::object();
  return wire::StrOr(spec.contains("spec") ? spec["spec"] : Json::object(), "onNodeFailure",
                     "requeue") != "fail";
}

}  // namespace

void MarkExpedited(Json& job, const std::string& why) {
  job[kExpeditedField] = why;
}

std::string EndRunOnFailure(Json& job, const std::string& why, const std::string& since) {
  const bool requeue = RequeuesOnNodeFailure(job);
  if (requeue) {
    MarkExpedited(job, why);
  }
  Result<std::string> event = EndRun(job, requeue ? JobState::kPending : JobState::kFailed,
                                     requeue ? fmt::format("requeued: {}", why) : why, since);
  return event.ok() ? *event : event.status().message();
}

std::optional<std::string> FinishStoppingIfDone(Json& job) {
  if (StoredJobState(job) != JobState::kStopping) {
    return std::nullopt;
  }
  for (const Json& placement : wire::ArrayOr(job, "placements")) {
    if (!PlacementGone(placement)) {
      return std::nullopt;
    }
  }
  const Json& stopping = job.contains(kStoppingField) ? job[kStoppingField] : Json::object();
  // A stop record that does not parse (written by hand) ends as a failure, never as a success.
  const JobState then = ParseJobState(wire::StrOr(stopping, "then")).value_or(JobState::kFailed);
  const std::string then_name = JobStateName(then);
  std::string reason = wire::StrOr(stopping, "reason");
  std::string event = fmt::format("stopped: every task has ended; now {}", then_name);
  TakeEndState(job, then, std::move(reason));
  return event;
}

std::string DescribeStopping(const Json& job, std::optional<int64_t> now_unix_nanos,
                             std::chrono::seconds grace) {
  int total = 0;
  int live = 0;
  for (const Json& placement : wire::ArrayOr(job, "placements")) {
    ++total;
    live += PlacementGone(placement) ? 0 : 1;
  }
  std::string out = fmt::format("{} of {} tasks still running", live, total);
  const Json& stopping = job.contains(kStoppingField) ? job[kStoppingField] : Json::object();
  const Result<int64_t> since = ParseRfc3339(wire::StrOr(stopping, "since"));
  if (now_unix_nanos && since.ok()) {
    const int64_t ago = std::max<int64_t>(0, (*now_unix_nanos - *since) / 1'000'000'000);
    out += fmt::format("; SIGTERM sent {}s ago, SIGKILL at {}s", ago, grace.count());
  }
  return out;
}

bool TaskStarted(const Json& placement) {
  const std::string phase = wire::StrOr(placement, "phase");
  return phase == "Running" || phase == "Succeeded" || phase == "Failed";
}

void StampTaskStarted(Json& placement, int64_t now_ns) {
  if (!placement.contains("started_ns")) {
    placement["started_ns"] = now_ns;
  }
}

void StampImagePulled(Json& placement, int64_t now_ns) {
  if (!placement.contains("image_pulled_ns")) {
    placement["image_pulled_ns"] = now_ns;
  }
}

std::string PlacementImage(const Json& job, const Json& placement) {
  const Json& spec = job.contains("spec") ? job["spec"] : Json::object();
  const Json& inner = spec.contains("spec") ? spec["spec"] : Json::object();
  const Json& groups = wire::ArrayOr(inner, "tasks");
  const int64_t group = wire::IntOr(placement, "group", -1);
  return group >= 0 && group < static_cast<int64_t>(groups.size())
             ? wire::StrOr(groups[group], "image")
             : std::string();
}

std::optional<std::string> PartlyStartedGang(const Json& job) {
  // Named up to this many, so that the reason of a gang of thousands stays small.
  constexpr size_t kNamedTasks = 8;
  const Json& placements = wire::ArrayOr(job, "placements");
  std::vector<std::string> named;
  size_t not_started = 0;
  for (const Json& placement : placements) {
    if (TaskStarted(placement)) {
      continue;
    }
    if (++not_started <= kNamedTasks) {
      const std::string phase = wire::StrOr(placement, "phase");
      named.push_back(fmt::format("{} on {} ({})", wire::StrOr(placement, "task"),
                                  wire::StrOr(placement, "node"),
                                  phase.empty() ? "not reported" : phase));
    }
  }
  if (not_started == 0 || not_started == placements.size()) {
    return std::nullopt;
  }
  return fmt::format(
      "{} of {} tasks started; not started: {}{}", placements.size() - not_started,
      placements.size(), fmt::join(named, ", "),
      not_started > named.size() ? fmt::format(" and {} more", not_started - named.size()) : "");
}

std::optional<int64_t> GangWindowStart(const Json& job) {
  const std::optional<StampedRun> run = StampedRunOf(job);
  const int64_t run_start = run ? run->start_ns : 0;
  std::optional<int64_t> first_start;
  int64_t last_pull = run_start;
  for (const Json& placement : wire::ArrayOr(job, "placements")) {
    if (wire::StrOr(placement, "phase") == wire::TaskPhaseName(wire::TaskPhase::kPulling)) {
      return std::nullopt;
    }
    if (TaskStarted(placement)) {
      const int64_t started = wire::IntOr(placement, "started_ns", run_start);
      first_start = first_start ? std::min(*first_start, started) : started;
    }
    last_pull = std::max(last_pull, wire::IntOr(placement, "image_pulled_ns", run_start));
  }
  return std::max(first_start.value_or(run_start), last_pull);
}

}  // namespace gpufleet::control
