// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/runner/task_runner.h"

namespace gpufleet::runner {

// Scripting a simulated task: environment entries of its launch, so that a job spec, a trace
// replayed by `gpufleet dev` or an agent test says how the task behaves without a field that
// only simulation would use.
//
// How long the task runs, in milliseconds of the runner's Clock (a non-negative integer).
// Without it the task runs until it is stopped.
inline constexpr std::string_view kSimDurationEnv = "GPUFLEET_SIM_DURATION_MS";
// The exit code once the duration has passed (0 to 255; default 0).
inline constexpr std::string_view kSimExitCodeEnv = "GPUFLEET_SIM_EXIT_CODE";
// When set, the task fails to start with this text as its reason.
inline constexpr std::string_view kSimStartErrorEnv = "GPUFLEET_SIM_START_ERROR";
// How long the task takes to exit after SIGTERM, in milliseconds (a job writing its checkpoint);
// past the stop's grace it is killed by SIGKILL at the grace. Without it SIGTERM ends it at once.
inline constexpr std::string_view kSimStopDelayEnv = "GPUFLEET_SIM_STOP_MS";

struct SimulatedRunnerOptions {
  // Each task with a log_path gets there the lines a simulated program would print: its start
  // (GPUs and script), its progress through its scripted duration in tenths, the stop asked of it
  // and its end, each with the time since its start on the runner's Clock. Off: no disk at all.
  bool write_logs = false;
};

// A TaskRunner that runs nothing: a task "runs" until its scripted duration has passed on the
// injected Clock, then exits with its scripted code; Stop ends it as killed by SIGTERM, at once or
// after its scripted stop delay (SIGKILL when that is longer than the grace).
// Start validates launches as ProcessRunner does, except that log_path may be empty. It touches
// no process, and no disk unless it writes logs, so one process can host the runners of a whole
// simulated fleet.
//
// Thread-safe: a mutex guards the task table; the Clock must be safe to read concurrently.
class SimulatedRunner final : public TaskRunner {
 public:
  // `clock` must outlive the runner.
  explicit SimulatedRunner(const Clock& clock, SimulatedRunnerOptions options = {});

  // Adds kInvalidArgument for a malformed GPUFLEET_SIM_* entry, naming it and its value.
  Status Start(const TaskLaunch& launch) override;
  Status Stop(std::string_view task_id, Duration grace) override;
  std::vector<TaskStatus> Poll() override;
  // Records the notice in the task's status (TaskStatus::notices): a simulated task has no
  // process to signal.
  Status SendNotice(std::string_view task_id, std::string_view signal_name) override;
  Status Forget(std::string_view task_id) override;
  // From the lease's deadline on, every running task not yet stopping is stopped as by
  // Stop(grace) at the deadline.
  Status RenewLease(Duration fence_in, Duration grace) override;
  // It simulates tasks with an image as it does processes.
  std::string ContainerRuntime() const override { return "simulated"; }

  // When the next running task with a duration ends, so that a simulation can move its clock
  // straight there; nullopt when no running task will end by itself.
  std::optional<MonoTime> NextEndTime() const;

 private:
  struct SimulatedTask {
    TaskStatus status;
    std::optional<MonoTime> scripted_end;
    int scripted_exit_code = 0;
    Duration stop_delay{0};
    std::optional<MonoTime> stop_end;  // when a requested stop ends it
    int stop_signal = 0;
    std::string log_path;   // empty: it writes no log
    int logged_tenths = 0;  // of its scripted duration, already said done in its log
  };

  // Moves a running task whose scripted end has come to kExited, dated at that end, and stops
  // it at the lease's deadline once that has come. REQUIRES: mu_ held.
  void Advance(SimulatedTask& task, MonoTime now) const;
  // Stop's effect from `at` on; `cause` starts the line the task's log gets. REQUIRES: mu_ held.
  static void StopAt(SimulatedTask& task, MonoTime at, Duration grace, std::string_view cause);
  // Appends `line`, dated `at` from the task's start, to the task's log, if it has one.
  static void Log(const SimulatedTask& task, MonoTime at, std::string_view line);

  const Clock& clock_;
  const SimulatedRunnerOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, SimulatedTask, std::less<>> tasks_;  // guarded by mu_
  std::optional<MonoTime> fence_at_;                         // guarded by mu_
  Duration fence_grace_{0};                                  // guarded by mu_
};

}  // namespace gpufleet::runner
