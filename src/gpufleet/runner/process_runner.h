// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/runner/cgroup.h"
#include "gpufleet/runner/run_as.h"
#include "gpufleet/runner/task_runner.h"
#include "gpufleet/runner/task_sandbox.h"

namespace gpufleet::runner {

// What a task inherits of the environment of the process that runs it (with LC_*).
inline constexpr std::string_view kInheritedEnv[] = {"PATH", "HOME",    "LANG",  "TZ",
                                                     "USER", "LOGNAME", "TMPDIR"};

// A task's environment, "NAME=VALUE" entries: the allow-listed part of this process's own
// environment (kInheritedEnv and LC_*; never the agent's token or anything else the agent was
// started with) without the variables the launch sets, then TaskLaunch::env, HOME, USER and
// LOGNAME of `run_as` (unless the launch sets them) and the GPU variables (GpuEnvironment).
// Every runner builds a task's environment with it.
std::vector<std::string> TaskEnvironment(const TaskLaunch& launch,
                                         const std::optional<RunAs>& run_as);

// The real TaskRunner: each task is a process of this node.
//
// How a task runs. Start forks a shim (internal/shim.h) that leads a new process group, ignores
// SIGTERM and the notice signals, forks the task's program with execve and waits for it; Start
// returns once the task's process exists, so a Stop right after it reaches the task. The task gets
// an allow-listed part of the runner's environment (kInheritedEnv and LC_*; never the agent's token
// or anything else the agent was started with) plus TaskLaunch::env, CUDA_VISIBLE_DEVICES and
// NVIDIA_VISIBLE_DEVICES set from its GPU UUIDs, stdin from /dev/null, stdout and stderr appended
// to its log file, and default signal handling. When the task ends, the shim writes
// "<state_dir>/<id>.exit" and sends SIGKILL to its process group, which ends anything the task left
// behind (a task is over when its main process is; processes that leave the group with setsid
// escape, as only cgroups could prevent). Stop signals the whole group, so the task's children get
// SIGTERM and, after the grace, SIGKILL.
//
// Surviving an agent restart. The shim is not tied to the agent: it keeps running, and its
// record of the exit outlives both. For each task the runner keeps "<state_dir>/<id>.task" (with
// '/' in the id written as '%'): the shim's pid, its start time from /proc/PID/stat (a pid alone
// could have been reused by an unrelated process since), the boot id, the GPU UUIDs and the log
// path. Open over the same directory adopts what it finds: running tasks stay kRunning and Stop
// works on them; tasks that ended meanwhile report their recorded end; a task whose process is
// gone without a record, or that started before the last reboot, is kLost.
//
// A shim that dies without a record (the OOM killer, a stray SIGKILL) makes its task kLost. The
// runner that started it also kills what is left of its group: until the runner reaps the shim,
// the group id cannot belong to anyone else. A runner that adopted the shim has no such
// guarantee and leaves the group alone.
//
// Times come from the injected Clock only; with SystemClock (CLOCK_MONOTONIC, system-wide) the
// start times recorded by one agent stay meaningful to the next one on the same boot.
//
// The hosting process: the runner reaps its shims by pid (should another part of the process
// reap them with waitpid(-1), the runner still sees their end through /proc and the exit file);
// one ProcessRunner per state directory at a time (Open enforces it with a lock file). Shims
// started by a runner that was destroyed stay unreaped children of this process until a later
// runner over the same directory, or the process's exit, reaps them.
//
// Containment (ProcessRunnerOptions). With `run_as`, the task takes on that user's groups and
// ids before it executes (HOME, USER and LOGNAME follow); the shim keeps the runner's. With
// `cgroups`, each task gets a cgroup of its own, named after its state file, with its
// TaskLaunch::cpu_milli and memory_mib as limits: Stop signals every process in it as well as the
// group, and the shim kills whatever is left in it when the task's main process ends, so a child
// that left the process group (setsid) dies with the task. Forget removes the cgroup.
//
// The task sandbox (ProcessRunnerOptions::sandbox; docs/agent.md, "The task sandbox"). Each run
// (TaskLaunch::run_id) gets a uid of its own from the configured range, and the gid of the same
// number, with no supplementary groups but the configured ones: a task cannot read another run's
// /proc/PID/environ or files, nor signal it. A uid is never held by two runs at once: a run keeps
// it while the runner knows any of its tasks (until Forget of the last one), and it is free again
// only once no process of the node runs as it (processes of an ended run that escaped its process
// group and cgroup are killed first). Uids go round-robin, so one comes back as late as possible.
// Each run also gets `runs_dir`/RUN.run/work (its tasks' working directory unless the launch names
// one, and HOME) and .../tmp (TMPDIR unless the launch sets it), owned by its uid, 0700, removed
// with the uid's release. The run and its uid are in each task's state file: a runner that adopts
// the task keeps both (and removes the directories of runs it no longer knows). Requires root.
//
// Fencing. RenewLease records the agent's lease in the state directory; each shim reads it every
// second and stops its task at the deadline as Stop would (SIGTERM, SIGKILL after the grace), so
// the tasks of a dead agent end before the server gives their GPUs to others.
//
// Thread-safe: a mutex guards the task table; Start holds it while forking.
struct ProcessRunnerOptions {
  // Every task runs as this user; excludes `sandbox`.
  std::optional<RunAs> run_as;
  std::optional<TaskCgroups> cgroups;
  // Each run's tasks run as a user of their own.
  std::optional<TaskSandboxOptions> sandbox;
};

class ProcessRunner final : public TaskRunner {
 public:
  // Opens (creating if missing; its parent must exist) the state directory and adopts the tasks
  // recorded there. `clock` must outlive the runner.
  // Errors: kInvalidArgument for an empty path or both `run_as` and `sandbox`,
  // kFailedPrecondition when the path is not a directory or another runner holds it, or for a
  // sandbox when this process is not root, an account uses an id of its range
  // (CheckTaskUidRangeIsUnused) or its runs_dir is unusable (PrepareRunsDirectory); kUnavailable
  // when something cannot be created or read.
  static Result<std::unique_ptr<ProcessRunner>> Open(std::string state_dir, const Clock& clock,
                                                     ProcessRunnerOptions options = {});

  // Leaves every task running: a new runner over the same directory takes them over.
  ~ProcessRunner() override;
  ProcessRunner(const ProcessRunner&) = delete;
  ProcessRunner& operator=(const ProcessRunner&) = delete;

  // Adds to the common errors: kInvalidArgument for a launch with an image, when log_path is empty
  // or cannot be opened for appending, or working_dir is not a directory; kUnavailable when the
  // task cannot be recorded or forked or its run's directories cannot be made;
  // kResourceExhausted when the sandbox has no free uid for a new run. A program that is not found
  // in PATH, cannot be executed or cannot enter its working directory makes the task
  // kFailedToStart, with the reason.
  Status Start(const TaskLaunch& launch) override;
  // Adds kInternal when the process group cannot be signalled (e.g. EPERM).
  Status Stop(std::string_view task_id, Duration grace) override;
  // The signal goes to the task's process group and cgroup, as a stop's SIGTERM does (the shim
  // ignores it). kFailedPrecondition for a task an older runner started, whose shim would not.
  Status SendNotice(std::string_view task_id, std::string_view signal_name) override;
  std::vector<TaskStatus> Poll() override;
  // Also deletes the task's files; kUnavailable if that fails (the task stays known).
  Status Forget(std::string_view task_id) override;
  // Writes "<state_dir>/lease" (internal::Lease, on CLOCK_MONOTONIC whatever the injected
  // Clock): every shim reads it each second while its task runs, so the tasks stop at the
  // deadline even when no agent is left to stop them.
  Status RenewLease(Duration fence_in, Duration grace) override;

  const std::string& state_dir() const { return state_dir_; }
  // The lease file RenewLease writes.
  const std::string& lease_path() const { return lease_path_; }
  // The task's state file, for tests that fake what a restart can find.
  std::string StateFilePathForTest(std::string_view task_id) const;

 private:
  struct Task {
    TaskStatus status;
    std::string command;      // the program as executed, for messages
    std::string working_dir;  // empty: the runner's
    std::string log_path;
    pid_t shim_pid = 0;  // also the process group id; 0 when no process was started
    uint64_t shim_start_ticks = 0;
    bool spawned_here = false;  // a child of this process: waitpid can reap it
    bool reaped = false;
    bool sigterm_sent = false;
    bool sigkill_sent = false;
    // Its shim ignores the notice signals; false for a task an older runner started.
    bool takes_notices = false;
    std::optional<MonoTime> kill_deadline;
    // Sandbox: the name of the run's directory under runs_dir and its uid (and gid); none for a
    // task that never ran or was not sandboxed.
    std::string run_dir;
    std::optional<uid_t> uid;
  };

  ProcessRunner(std::string state_dir, const Clock& clock, int lock_fd, std::string boot_id,
                ProcessRunnerOptions options);

  Status LoadStateDirectory();
  std::string FilePath(std::string_view task_id, std::string_view suffix) const;
  // Forks the shim of `task`, running it as `identity` (none: as this process), and records it.
  // REQUIRES: mu_ held.
  Status Spawn(const TaskLaunch& launch, int log_fd, Task& task,
               const std::optional<RunAs>& identity);
  // Sandbox: gives `task` its run's uid (the one the run holds, or a free one) and directories,
  // and adapts `launch` (TMPDIR, working directory). Returns the identity the task runs as.
  // REQUIRES: mu_ held.
  Result<RunAs> EnterRun(TaskLaunch& launch, Task& task);
  // Sandbox: once no task of run directory `run_dir` is known, the run has ended: its uid and
  // directories are released as soon as no process of the uid is left. REQUIRES: mu_ held.
  void EndRunIfUnused(const std::string& run_dir, uid_t uid);
  // Kills what is left of the ended runs, and releases those of them with no process left.
  // REQUIRES: mu_ held.
  void ReleaseEndedRuns();
  // Sandbox: ends the runs whose directories no adopted task names. REQUIRES: mu_ held.
  void EndStrayRuns();
  // Notices the end of a running task and sends a SIGKILL that is due. REQUIRES: mu_ held.
  void Refresh(Task& task, MonoTime now);
  // Whether the shim still runs; reaps it when it can. REQUIRES: mu_ held.
  bool ShimAlive(Task& task);
  // Records the end of a task whose shim is gone. REQUIRES: mu_ held.
  void Finish(Task& task, MonoTime now);
  // Sends `signal_number` to the task's process group if the shim is still the process the
  // runner started (never to a reused pid). REQUIRES: mu_ held.
  Status SignalGroup(Task& task, int signal_number);
  // The task's cgroup, named like its state file.
  std::string CgroupName(std::string_view task_id) const;

  const std::string state_dir_;
  const std::string lease_path_;
  const Clock& clock_;
  const int lock_fd_;
  const std::string boot_id_;
  const ProcessRunnerOptions options_;
  std::mutex mu_;
  std::map<std::string, Task, std::less<>> tasks_;  // guarded by mu_
  // Cgroups of forgotten tasks that still held a process when Forget killed it.
  std::vector<std::string> cgroups_to_remove_;  // guarded by mu_
  // Sandbox: runs none of whose tasks is known any more, by directory name, with their uid (none
  // for a directory with no uid of the range), until no process of that uid is left.
  std::map<std::string, std::optional<uid_t>> ended_runs_;  // guarded by mu_
  uid_t next_uid_ = 0;                                      // guarded by mu_
};

}  // namespace gpufleet::runner
