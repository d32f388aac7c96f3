// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

// The states of a job (docs/architecture.md, "The job lifecycle"), here so that the stored job
// record (job_record.h) can be typed below the control plane; the transitions between them live
// in control/job_lifecycle.h. Thread-safe (no state).
namespace gpufleet::wire {

enum class JobState {
  kPending,
  kScheduled,
  kRunning,
  kStopping,
  kSucceeded,
  kFailed,
  kCancelled,
  kPreempted,
  kSuspended,
};
inline constexpr std::array<JobState, 9> kJobStates = {
    JobState::kPending,   JobState::kScheduled, JobState::kRunning,
    JobState::kStopping,  JobState::kSucceeded, JobState::kFailed,
    JobState::kCancelled, JobState::kPreempted, JobState::kSuspended};

const char* JobStateName(JobState state);  // "Pending", "Stopping", ...
std::optional<JobState> ParseJobState(std::string_view name);
// "Pending, Scheduled, ..." for error messages.
std::string JobStateNames();

}  // namespace gpufleet::wire
