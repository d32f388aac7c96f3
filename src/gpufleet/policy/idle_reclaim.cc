// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/idle_reclaim.h"

#include <utility>

#include <fmt/format.h>

#include "gpufleet/policy/format.h"

namespace gpufleet::policy {
namespace {

constexpr int64_t kMinuteSeconds = 60;
constexpr int64_t kFullUtilizationMilli = 1000;

std::string Waiting(int pending_jobs) {
  return pending_jobs == 1 ? "1 job waits" : fmt::format("{} jobs wait", pending_jobs);
}

// The reclaim is told after the fact: "3 jobs waited".
std::string Waited(int pending_jobs) {
  return pending_jobs == 1 ? "1 job waited" : fmt::format("{} jobs waited", pending_jobs);
}

// Rounded up to the minute, so that the owner is never reclaimed before the time shown.
int64_t CeilToMinute(int64_t seconds) {
  const int64_t remainder = seconds % kMinuteSeconds;
  return remainder > 0 ? seconds + kMinuteSeconds - remainder : seconds - remainder;
}

const char* PastTense(ReclaimAction action) {
  return action == ReclaimAction::kSuspend ? "suspended" : "preempted";
}

}  // namespace

const char* ReclaimActionName(ReclaimAction action) {
  switch (action) {
    case ReclaimAction::kSuspend:
      return "suspend";
    case ReclaimAction::kPreempt:
      return "preempt";
  }
  return "unknown";
}

Result<ReclaimAction> ParseReclaimAction(std::string_view text) {
  if (text == "suspend") {
    return ReclaimAction::kSuspend;
  }
  if (text == "preempt") {
    return ReclaimAction::kPreempt;
  }
  return InvalidArgumentError(
      fmt::format("action: \"{}\" (must be \"suspend\" or \"preempt\")", text));
}

const char* ReclaimEventKindName(ReclaimEventKind kind) {
  switch (kind) {
    case ReclaimEventKind::kWarn:
      return "warn";
    case ReclaimEventKind::kWithdraw:
      return "withdraw";
    case ReclaimEventKind::kReclaim:
      return "reclaim";
  }
  return "unknown";
}

const char* IdleStateName(IdleState state) {
  switch (state) {
    case IdleState::kIgnored:
      return "ignored";
    case IdleState::kWatching:
      return "watching";
    case IdleState::kWarned:
      return "warned";
    case IdleState::kReclaimed:
      return "reclaimed";
  }
  return "unknown";
}

Status IdleReclaimOptions::Validate() const {
  if (threshold_milli < 1 || threshold_milli > kFullUtilizationMilli) {
    return InvalidArgumentError(
        fmt::format("threshold_milli: {} (must be in 1..1000)", threshold_milli));
  }
  if (idle_seconds <= 0) {
    return InvalidArgumentError(fmt::format("idle_seconds: {} (must be > 0)", idle_seconds));
  }
  if (warning_seconds <= 0) {
    return InvalidArgumentError(fmt::format("warning_seconds: {} (must be > 0)", warning_seconds));
  }
  if (max_sample_gap_seconds <= 0) {
    return InvalidArgumentError(
        fmt::format("max_sample_gap_seconds: {} (must be > 0)", max_sample_gap_seconds));
  }
  if (action != ReclaimAction::kSuspend && action != ReclaimAction::kPreempt) {
    return InvalidArgumentError(
        fmt::format("action: {} (must be suspend or preempt)", static_cast<int>(action)));
  }
  return Status::Ok();
}

Result<IdleReclaimer> IdleReclaimer::Create(const IdleReclaimOptions& options) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate());
  return IdleReclaimer(options);
}

Status IdleReclaimer::Track(const JobId& job, JobKind kind) {
  auto it = jobs_.find(job);
  if (it != jobs_.end() && it->second.state != IdleState::kReclaimed) {
    return AlreadyExistsError(fmt::format("job '{}' is tracked already", job.value()));
  }
  JobRecord record;
  record.state = kind == JobKind::kInteractive ? IdleState::kWatching : IdleState::kIgnored;
  jobs_[job] = std::move(record);
  return Status::Ok();
}

void IdleReclaimer::Untrack(const JobId& job) {
  jobs_.erase(job);
}

Status IdleReclaimer::Observe(const JobId& job, int64_t time_seconds, int64_t utilization_milli) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return NotFoundError(fmt::format("job '{}' is not tracked", job.value()));
  }
  if (utilization_milli < 0 || utilization_milli > kFullUtilizationMilli) {
    return InvalidArgumentError(fmt::format(
        "utilization_milli: {} for job '{}' (must be in 0..1000)", utilization_milli, job.value()));
  }
  JobRecord& record = it->second;
  if (record.state == IdleState::kIgnored || record.state == IdleState::kReclaimed) {
    return Status::Ok();
  }
  if (record.last_sample_seconds && time_seconds < *record.last_sample_seconds) {
    return InvalidArgumentError(
        fmt::format("time_seconds: {} for job '{}' is before its previous sample at {}",
                    time_seconds, job.value(), *record.last_sample_seconds));
  }
  const bool gap = record.last_sample_seconds &&
                   time_seconds - *record.last_sample_seconds > options_.max_sample_gap_seconds;
  if (utilization_milli < options_.threshold_milli) {
    if (record.idle_since_seconds && gap) {
      record.run_break_reason =
          fmt::format("no utilization samples between {} and {}",
                      FormatClock(*record.last_sample_seconds), FormatClock(time_seconds));
    }
    if (!record.idle_since_seconds || gap) {
      record.idle_since_seconds = time_seconds;
    }
  } else {
    record.run_break_reason =
        fmt::format("GPUs busy again ({} at {})", FormatPercentMilli(utilization_milli),
                    FormatClock(time_seconds));
    record.idle_since_seconds.reset();
  }
  record.last_sample_seconds = time_seconds;
  record.last_sample_milli = utilization_milli;
  return Status::Ok();
}

bool IdleReclaimer::IdleAt(const JobRecord& record, int64_t now) const {
  return record.idle_since_seconds && record.last_sample_seconds &&
         now - *record.last_sample_seconds <= options_.max_sample_gap_seconds;
}

std::optional<ReclaimEvent> IdleReclaimer::Step(const JobId& id, JobRecord& record, int64_t now,
                                                int pending_jobs) const {
  const bool idle = IdleAt(record, now);
  const int64_t idle_for = idle ? now - *record.idle_since_seconds : 0;
  ReclaimEvent event{.job = id, .action = options_.action, .time_seconds = now};
  switch (record.state) {
    case IdleState::kIgnored:
    case IdleState::kReclaimed:
      return std::nullopt;
    case IdleState::kWatching:
      if (!idle || idle_for < options_.idle_seconds || pending_jobs == 0) {
        return std::nullopt;
      }
      record.state = IdleState::kWarned;
      record.warned_at_seconds = now;
      record.deadline_seconds = now + options_.warning_seconds;
      event.kind = ReclaimEventKind::kWarn;
      event.deadline_seconds = record.deadline_seconds;
      event.reason = fmt::format("GPUs under {} for {} while {}; will be {} at {} unless used",
                                 FormatPercentMilli(options_.threshold_milli), FormatSpan(idle_for),
                                 Waiting(pending_jobs), PastTense(options_.action),
                                 FormatClock(CeilToMinute(record.deadline_seconds)));
      break;
    case IdleState::kWarned:
      // The idle run that earned the warning began before it; a later start means the run broke.
      if (!idle || *record.idle_since_seconds > record.warned_at_seconds) {
        event.kind = ReclaimEventKind::kWithdraw;
        if (!record.last_sample_seconds ||
            now - *record.last_sample_seconds > options_.max_sample_gap_seconds) {
          event.reason = fmt::format("no utilization sample since {}; warning withdrawn",
                                     FormatClock(record.last_sample_seconds.value_or(0)));
        } else {
          event.reason = record.run_break_reason + "; warning withdrawn";
        }
      } else if (pending_jobs == 0) {
        event.kind = ReclaimEventKind::kWithdraw;
        event.reason = "no jobs wait for GPUs any more; warning withdrawn";
      } else if (now >= record.deadline_seconds) {
        event.kind = ReclaimEventKind::kReclaim;
        event.reason = fmt::format(
            "GPUs under {} for {} while {}; {}", FormatPercentMilli(options_.threshold_milli),
            FormatSpan(idle_for), Waited(pending_jobs), PastTense(options_.action));
        record.state = IdleState::kReclaimed;
        record.deadline_seconds = 0;
        return event;
      } else {
        return std::nullopt;
      }
      record.state = IdleState::kWatching;
      record.deadline_seconds = 0;
      break;
  }
  return event;
}

Result<std::vector<ReclaimEvent>> IdleReclaimer::Decide(int64_t now_seconds, int pending_jobs) {
  if (pending_jobs < 0) {
    return InvalidArgumentError(fmt::format("pending_jobs: {} (must be >= 0)", pending_jobs));
  }
  if (last_decide_seconds_ && now_seconds < *last_decide_seconds_) {
    return InvalidArgumentError(fmt::format("now_seconds: {} is before the previous decision at {}",
                                            now_seconds, *last_decide_seconds_));
  }
  last_decide_seconds_ = now_seconds;
  std::vector<ReclaimEvent> events;
  for (auto& [id, record] : jobs_) {
    std::optional<ReclaimEvent> event = Step(id, record, now_seconds, pending_jobs);
    if (event) {
      record.last_reason = event->reason;
      events.push_back(std::move(*event));
    }
  }
  return events;
}

Result<IdleJobStatus> IdleReclaimer::Describe(const JobId& job) const {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) {
    return NotFoundError(fmt::format("job '{}' is not tracked", job.value()));
  }
  const JobRecord& record = it->second;
  return IdleJobStatus{.state = record.state,
                       .idle_since_seconds = record.idle_since_seconds,
                       .deadline_seconds = record.deadline_seconds,
                       .last_reason = record.last_reason};
}

}  // namespace gpufleet::policy
