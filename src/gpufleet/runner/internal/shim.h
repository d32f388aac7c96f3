// SPDX-License-Identifier: Apache-2.0
// The shim: the process ProcessRunner forks for each task. It leads the task's process group,
// ignores SIGTERM, forks and waits for the task, and records how the task ended in a file of the
// runner's state directory, so that the exit status is known even if the agent restarted in
// between. Private to the runner module.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gpufleet::runner::internal {

// Where a start failed, as the shim records it.
enum class StartStage : int {
  kSetup = 1,     // redirecting stdin, stdout and stderr
  kChdir = 2,     // entering the working directory
  kExec = 3,      // execve
  kFork = 4,      // forking the task from the shim
  kCgroup = 5,    // joining the task's cgroup
  kIdentity = 6,  // taking on the --run-as user's groups and ids
};

// Everything the shim needs, prepared by the runner before fork(). The shim is a fork of a
// possibly multi-threaded process, so it makes async-signal-safe calls only: it cannot allocate,
// format text or look anything up. Every descriptor is >= 3 and close-on-exec.
struct ShimPlan {
  const char* executable = nullptr;      // a path for execve (PATH was searched by the runner)
  char* const* argv = nullptr;           // nullptr-terminated
  char* const* envp = nullptr;           // nullptr-terminated, complete environment of the task
  const char* working_dir = nullptr;     // nullptr: stay in the runner's directory
  const char* exit_path = nullptr;       // where the exit record goes
  const char* exit_temp_path = nullptr;  // written first, then renamed to exit_path
  int null_fd = -1;                      // /dev/null, the task's stdin and the shim's stdio
  int log_fd = -1;                       // the task's stdout and stderr, opened for appending
  int control_fd = -1;                   // the shim's end of a socket pair with the runner
  int runner_control_fd = -1;            // the runner's end, closed by the shim
  int error_read_fd = -1;                // the shim's end of the start-failure report
  int error_write_fd = -1;               // the task's end, closed by a successful execve
  int max_fd = 1024;                     // bound for closing descriptors without close_range
  // The cgroup.procs files the task writes "0" to before anything else (nullptr-terminated;
  // nullptr: no cgroup), and the one that lists its members, killed when the task ends.
  const char* const* cgroup_join_paths = nullptr;
  const char* cgroup_members_path = nullptr;
  // The agent's lease (FormatLease): read every kLeaseCheckPeriod while the task runs; once its
  // deadline has passed the shim stops the task as Stop would, SIGTERM and then SIGKILL after the
  // grace. nullptr, or no file: no deadline.
  const char* lease_path = nullptr;
  // The user the task runs as; change_identity false: the runner's own.
  bool change_identity = false;
  uid_t uid = 0;
  gid_t gid = 0;
  const gid_t* groups = nullptr;
  size_t group_count = 0;
};

// The shim's body, run in the child right after fork(); never returns. Order: lead a new process
// group; ignore and block SIGTERM, SIGINT and SIGHUP; close every inherited descriptor it does not
// need; point its stdio at /dev/null; wait for the runner's go byte on the control socket (end of
// file: the runner gave up, exit without running anything); fork the task; send the runner one
// byte back (the task's process exists, so a Stop from now on reaches it); wait for the task,
// stopping it if the lease runs out meanwhile; record the exit; send SIGKILL to every process of
// the task's cgroup (those that left the process group included), then to its own process group,
// which ends whatever the task left behind and the shim with it. The task joins its cgroup and
// takes on the run-as user's ids before it enters its working directory and executes.
//
// The three signals stay blocked in the shim across the fork: a SIGTERM sent to the group before
// the task has restored the default handling then waits, pending, instead of being discarded.
[[noreturn]] void RunShim(const ShimPlan& plan);

// How often a shim reads the lease while its task runs.
inline constexpr long kLeaseCheckPeriodNanos = 1'000'000'000;  // NOLINT(google-runtime-int)

// The lease file: "DEADLINE GRACE\n", the deadline on CLOCK_MONOTONIC and the grace, both in
// nanoseconds. Parsing is allocation-free (the shim parses it).
struct Lease {
  int64_t deadline_nanos = 0;
  int64_t grace_nanos = 0;
};
std::string FormatLease(const Lease& lease);
// CLOCK_MONOTONIC in nanoseconds, the lease's time line (async-signal-safe).
int64_t MonotonicNanos();
std::optional<Lease> ParseLease(std::string_view text);

// The shim's record of how a task ended: one line, "exited CODE", "signaled SIGNAL" or
// "start-failed STAGE ERRNO".
struct ExitRecord {
  enum class Kind { kExited, kSignaled, kStartFailed };
  Kind kind = Kind::kExited;
  int value = 0;  // exit code, signal number or errno
  StartStage stage = StartStage::kExec;
};

std::optional<ExitRecord> ParseExitRecord(std::string_view text);

}  // namespace gpufleet::runner::internal
