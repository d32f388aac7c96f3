// SPDX-License-Identifier: Apache-2.0
// The task table that ProcessRunner and SimulatedRunner both keep, task id -> the runner's record
// of the task (a struct with a `TaskStatus status` member), and the checks the TaskRunner
// contract (task_runner.h) makes on it, so that every runner answers Start, Stop, Poll and Forget
// with the same codes and messages. Private to the runner module; callers hold the mutex that
// guards their table.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/runner/task_runner.h"

namespace gpufleet::runner::internal {

template <typename Task>
using TaskTable = std::map<std::string, Task, std::less<>>;

// Start: kAlreadyExists when the table knows `task_id`, running or not yet forgotten.
template <typename Task>
Status CheckNewTask(const TaskTable<Task>& tasks, std::string_view task_id) {
  if (tasks.contains(task_id)) {
    return AlreadyExistsError(fmt::format(
        "task '{}' is already known to the runner; forget it before starting it again", task_id));
  }
  return Status::Ok();
}

// Stop: kInvalidArgument for a negative grace.
inline Status CheckStopGrace(std::string_view task_id, Duration grace) {
  if (grace < Duration::zero()) {
    return InvalidArgumentError(fmt::format(
        "grace period for stopping task '{}' is negative: {} ns", task_id, grace.count()));
  }
  return Status::Ok();
}

// SendNotice: the number of a notice's signal; kInvalidArgument naming the task and the name
// for any other.
inline Result<int> NoticeSignal(std::string_view task_id, std::string_view signal_name) {
  const std::optional<int> number = NoticeSignalNumber(signal_name);
  if (!number) {
    return InvalidArgumentError(
        fmt::format("notice to task '{}': \"{}\" is not a notice signal (one of {})", task_id,
                    signal_name, NoticeSignalNames()));
  }
  return *number;
}

// RenewLease: both durations are non-negative.
inline Status CheckLease(Duration fence_in, Duration grace) {
  if (fence_in < Duration::zero() || grace < Duration::zero()) {
    return InvalidArgumentError(
        fmt::format("lease: fence_in ({} ns) and grace ({} ns) must not be negative",
                    fence_in.count(), grace.count()));
  }
  return Status::Ok();
}

// Stop: the task with `task_id`; kNotFound when the table does not know it.
template <typename Task>
Result<typename TaskTable<Task>::iterator> FindTask(TaskTable<Task>& tasks,
                                                    std::string_view task_id) {
  const auto it = tasks.find(task_id);
  if (it == tasks.end()) {
    return NotFoundError(fmt::format("task '{}' is not known to the runner", task_id));
  }
  return it;
}

// Forget: the task with `task_id`, brought up to date by `update(task)`; kNotFound as FindTask,
// kFailedPrecondition while the task is still running.
template <typename Task, typename Update>
Result<typename TaskTable<Task>::iterator> FindEndedTask(TaskTable<Task>& tasks,
                                                         std::string_view task_id, Update update) {
  GPUFLEET_ASSIGN_OR_RETURN(const auto it, FindTask(tasks, task_id));
  update(it->second);
  if (!IsFinal(it->second.status.state)) {
    return FailedPreconditionError(
        fmt::format("task '{}' is still running; stop it and wait for its end first", task_id));
  }
  return it;
}

// Stop's bookkeeping for the runners that signal their tasks (records with `kill_deadline`,
// `sigterm_sent` and `sigkill_sent`): marks the task as stopped, keeps the sooner of its kill
// deadlines and says which signal is due now; kNone when that one was sent already.
enum class DueSignal { kNone, kTerm, kKill };
template <typename Task>
DueSignal RecordStop(Task& task, MonoTime now, Duration grace) {
  task.status.stop_requested = true;
  const MonoTime deadline = now + grace;
  if (!task.kill_deadline.has_value() || deadline < *task.kill_deadline) {
    task.kill_deadline = deadline;
  }
  if (now >= *task.kill_deadline) {
    return task.sigkill_sent ? DueSignal::kNone : DueSignal::kKill;
  }
  return task.sigterm_sent ? DueSignal::kNone : DueSignal::kTerm;
}

// Poll: every task brought up to date by `update(task)`, then the statuses, sorted by task id.
template <typename Task, typename Update>
std::vector<TaskStatus> UpdatedStatuses(TaskTable<Task>& tasks, Update update) {
  std::vector<TaskStatus> statuses;
  statuses.reserve(tasks.size());
  for (auto& [id, task] : tasks) {
    update(task);
    statuses.push_back(task.status);
  }
  return statuses;
}

}  // namespace gpufleet::runner::internal
