// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/job_state.h"

namespace gpufleet::wire {

const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kPending:
      return "Pending";
    case JobState::kScheduled:
      return "Scheduled";
    case JobState::kRunning:
      return "Running";
    case JobState::kStopping:
      return "Stopping";
    case JobState::kSucceeded:
      return "Succeeded";
    case JobState::kFailed:
      return "Failed";
    case JobState::kCancelled:
      return "Cancelled";
    case JobState::kPreempted:
      return "Preempted";
    case JobState::kSuspended:
      return "Suspended";
  }
  return "Unknown";
}

std::optional<JobState> ParseJobState(std::string_view name) {
  for (const JobState state : kJobStates) {
    if (name == JobStateName(state)) {
      return state;
    }
  }
  return std::nullopt;
}

std::string JobStateNames() {
  std::string out;
  for (const JobState state : kJobStates) {
    out += out.empty() ? "" : ", ";
    out += JobStateName(state);
  }
  return out;
}

}  // namespace gpufleet::wire
