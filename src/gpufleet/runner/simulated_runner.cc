// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/simulated_runner.h"

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "gpufleet/runner/internal/task_table.h"

namespace gpufleet::runner {
namespace {

// The whole of `text` as a decimal integer in [min, max].
std::optional<int64_t> ParseBoundedInteger(std::string_view text, int64_t min, int64_t max) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size() || value < min ||
      value > max) {
    return std::nullopt;
  }
  return value;
}

const std::string* FindEnv(const TaskLaunch& launch, std::string_view name) {
  const auto it = launch.env.find(std::string(name));
  return it == launch.env.end() ? nullptr : &it->second;
}

double Seconds(Duration duration) {
  return std::chrono::duration<double>(duration).count();
}

}  // namespace

SimulatedRunner::SimulatedRunner(const Clock& clock, SimulatedRunnerOptions options)
    : clock_(clock), options_(options) {}

void SimulatedRunner::Log(const SimulatedTask& task, MonoTime at, std::string_view line) {
  if (task.log_path.empty()) {
    return;
  }
  // Appended as a program's stdout is (O_APPEND): the agent may cut the file between lines.
  std::ofstream(task.log_path, std::ios::app)
      << fmt::format("[+{:.1f}s] {}\n", Seconds(at - task.status.start_time), line);
}

Status SimulatedRunner::Start(const TaskLaunch& launch) {
  GPUFLEET_RETURN_IF_ERROR(ValidateLaunch(launch));
  SimulatedTask task;
  std::optional<Duration> scripted_duration;
  if (const std::string* duration = FindEnv(launch, kSimDurationEnv)) {
    // A year of milliseconds is far beyond any trace and keeps MonoTime arithmetic from overflow.
    constexpr int64_t kMaxDurationMs = int64_t{365} * 24 * 3600 * 1000;
    const std::optional<int64_t> ms = ParseBoundedInteger(*duration, 0, kMaxDurationMs);
    if (!ms.has_value()) {
      return InvalidArgumentError(
          fmt::format("env {} of task '{}' is '{}', not a whole number of milliseconds in [0, {}]",
                      kSimDurationEnv, launch.task_id, *duration, kMaxDurationMs));
    }
    scripted_duration = std::chrono::milliseconds(*ms);
  }
  if (const std::string* delay = FindEnv(launch, kSimStopDelayEnv)) {
    constexpr int64_t kMaxStopDelayMs = int64_t{24} * 3600 * 1000;
    const std::optional<int64_t> ms = ParseBoundedInteger(*delay, 0, kMaxStopDelayMs);
    if (!ms.has_value()) {
      return InvalidArgumentError(
          fmt::format("env {} of task '{}' is '{}', not a whole number of milliseconds in [0, {}]",
                      kSimStopDelayEnv, launch.task_id, *delay, kMaxStopDelayMs));
    }
    task.stop_delay = std::chrono::milliseconds(*ms);
  }
  if (const std::string* code = FindEnv(launch, kSimExitCodeEnv)) {
    const std::optional<int64_t> value = ParseBoundedInteger(*code, 0, 255);
    if (!value.has_value()) {
      return InvalidArgumentError(
          fmt::format("env {} of task '{}' is '{}', not an exit code in [0, 255]", kSimExitCodeEnv,
                      launch.task_id, *code));
    }
    task.scripted_exit_code = static_cast<int>(*value);
  }

  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_RETURN_IF_ERROR(internal::CheckNewTask(tasks_, launch.task_id));
  const MonoTime now = clock_.Now();
  task.status.task_id = launch.task_id;
  task.status.gpu_uuids = launch.gpu_uuids;
  task.status.enforces_lease = true;
  task.status.start_time = now;
  if (scripted_duration.has_value()) {
    task.scripted_end = now + *scripted_duration;
  }
  if (const std::string* error = FindEnv(launch, kSimStartErrorEnv)) {
    task.status.state = TaskState::kFailedToStart;
    task.status.reason = *error;
    task.status.end_time = now;
  }
  if (options_.write_logs) {
    task.log_path = launch.log_path;
  }
  if (task.status.state == TaskState::kFailedToStart) {
    Log(task, now,
        fmt::format("simulated task {} failed to start: {}", launch.task_id, task.status.reason));
  } else {
    Log(task, now,
        fmt::format(
            "simulated task {} started on {}; {}", launch.task_id,
            launch.gpu_uuids.empty() ? std::string("no GPU")
                                     : fmt::format("GPUs {}", fmt::join(launch.gpu_uuids, ", ")),
            scripted_duration ? fmt::format("its script: run {:.1f}s, then exit with code {}",
                                            Seconds(*scripted_duration), task.scripted_exit_code)
                              : std::string("its script: run until stopped")));
  }
  tasks_.emplace(launch.task_id, std::move(task));
  return Status::Ok();
}

Status SimulatedRunner::Stop(std::string_view task_id, Duration grace) {
  GPUFLEET_RETURN_IF_ERROR(internal::CheckStopGrace(task_id, grace));
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const auto it, internal::FindTask(tasks_, task_id));
  SimulatedTask& task = it->second;
  const MonoTime now = clock_.Now();
  Advance(task, now);
  if (IsFinal(task.status.state)) {
    return Status::Ok();
  }
  StopAt(task, now, grace, "SIGTERM");
  Advance(task, now);
  return Status::Ok();
}

Status SimulatedRunner::SendNotice(std::string_view task_id, std::string_view signal_name) {
  GPUFLEET_RETURN_IF_ERROR(internal::NoticeSignal(task_id, signal_name).status());
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const auto it, internal::FindTask(tasks_, task_id));
  SimulatedTask& task = it->second;
  Advance(task, clock_.Now());
  if (!IsFinal(task.status.state)) {
    task.status.notices.emplace_back(signal_name);
  }
  return Status::Ok();
}

void SimulatedRunner::StopAt(SimulatedTask& task, MonoTime at, Duration grace,
                             std::string_view cause) {
  const bool first = !task.status.stop_requested;
  task.status.stop_requested = true;
  const bool killed = task.stop_delay > grace;
  const MonoTime end = at + (killed ? grace : task.stop_delay);
  if (!task.stop_end || end < *task.stop_end) {
    task.stop_end = end;
    task.stop_signal = killed ? SIGKILL : SIGTERM;
  }
  if (first) {
    Log(task, at,
        killed ? fmt::format("{}: its checkpoint takes {:.1f}s, more than the {:.1f}s grace", cause,
                             Seconds(task.stop_delay), Seconds(grace))
        : task.stop_delay > Duration::zero()
            ? fmt::format("{}: writing its checkpoint ({:.1f}s)", cause, Seconds(task.stop_delay))
            : fmt::format("{}: stopping", cause));
  }
}

Status SimulatedRunner::RenewLease(Duration fence_in, Duration grace) {
  GPUFLEET_RETURN_IF_ERROR(internal::CheckLease(fence_in, grace));
  std::lock_guard<std::mutex> lock(mu_);
  const MonoTime now = clock_.Now();
  for (auto& [id, task] : tasks_) {
    Advance(task, now);  // a deadline already passed takes effect before it moves
  }
  fence_at_ = now + fence_in;
  fence_grace_ = grace;
  return Status::Ok();
}

std::vector<TaskStatus> SimulatedRunner::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  const MonoTime now = clock_.Now();
  return internal::UpdatedStatuses(tasks_, [&](SimulatedTask& task) { Advance(task, now); });
}

Status SimulatedRunner::Forget(std::string_view task_id) {
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const auto it,
                            internal::FindEndedTask(tasks_, task_id, [&](SimulatedTask& task) {
                              Advance(task, clock_.Now());
                            }));
  tasks_.erase(it);
  return Status::Ok();
}

std::optional<MonoTime> SimulatedRunner::NextEndTime() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<MonoTime> next;
  for (const auto& [id, task] : tasks_) {
    if (task.status.state != TaskState::kRunning) {
      continue;
    }
    std::optional<MonoTime> fenced_end;
    if (fence_at_ && !task.status.stop_requested) {
      fenced_end = *fence_at_ + std::min(task.stop_delay, fence_grace_);
    }
    for (const std::optional<MonoTime>& end : {task.scripted_end, task.stop_end, fenced_end}) {
      if (end.has_value() && (!next.has_value() || *end < *next)) {
        next = end;
      }
    }
  }
  return next;
}

void SimulatedRunner::Advance(SimulatedTask& task, MonoTime now) const {
  if (task.status.state != TaskState::kRunning) {
    return;
  }
  if (fence_at_ && now >= *fence_at_ && !task.status.stop_requested &&
      !(task.scripted_end && *task.scripted_end <= *fence_at_)) {
    StopAt(task, *fence_at_, fence_grace_, "SIGTERM: the agent's lease ran out");
  }
  const bool ends_first =
      task.scripted_end && (!task.stop_end || *task.scripted_end <= *task.stop_end);
  if (ends_first && now >= *task.scripted_end) {
    task.status.state = TaskState::kExited;
    task.status.exit_code = task.scripted_exit_code;
    task.status.end_time = task.scripted_end;
    Log(task, *task.scripted_end, fmt::format("done: exit code {}", task.scripted_exit_code));
  } else if (task.stop_end && now >= *task.stop_end) {
    task.status.state = TaskState::kKilled;
    task.status.signal = task.stop_signal;
    task.status.end_time = task.stop_end;
    Log(task, *task.stop_end,
        task.stop_signal == SIGKILL ? "killed by SIGKILL at the end of the grace"
                                    : "ended by SIGTERM");
  } else if (task.scripted_end && *task.scripted_end > task.status.start_time) {
    const Duration scripted = *task.scripted_end - task.status.start_time;
    const auto tenths = static_cast<int>((now - task.status.start_time) * 10 / scripted);
    if (tenths > task.logged_tenths) {
      task.logged_tenths = tenths;
      Log(task, now,
          fmt::format("{}% of its scripted {:.1f}s done", tenths * 10, Seconds(scripted)));
    }
  }
}

}  // namespace gpufleet::runner
