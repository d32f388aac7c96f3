// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet::runner {

enum class CgroupVersion { kV1, kV2 };

// A task's limits; 0: none.
struct CgroupLimits {
  int64_t cpu_milli = 0;  // CFS quota: 1000 milli-cores = one core's time per period
  int64_t memory_bytes = 0;
};

// Each task's own cgroup under a parent of gpufleet's: the task's CPU and memory limits hold
// there, and stopping the task signals every process in it, so that a child that daemonized
// (setsid, double fork) cannot outlive the task. cgroup v2 where /sys/fs/cgroup is a cgroup2
// mount; on hybrid hosts (cgroup v1 controllers, as on the machines gpufleet is built on) one
// directory per v1 controller: memory, cpu and pids, the last listing the members.
class TaskCgroups {
 public:
  // What the node offers under `root`: v2 when it is a cgroup2 mount, v1 when it holds the
  // memory, cpu and pids controllers. Creates the parent directory `parent` (in each v1
  // controller). kUnavailable, saying why, when neither is usable (not root, read-only).
  static Result<TaskCgroups> Detect(const std::string& root = "/sys/fs/cgroup",
                                    const std::string& parent = "gpufleet");
  // A given layout: v2 at `root`, or v1 with one hierarchy per controller under `root`
  // (`root`/memory, `root`/cpu, `root`/pids). Creates the parent directories.
  static Result<TaskCgroups> Open(CgroupVersion version, const std::string& root,
                                  const std::string& parent);

  CgroupVersion version() const { return version_; }
  // "cgroup v1 (memory, cpu, pids) under /sys/fs/cgroup/{memory,cpu,pids}/gpufleet".
  std::string Describe() const;
  // Whether limits are enforced (on v2 the parent must have the cpu and memory controllers).
  bool enforces_limits() const { return enforces_limits_; }

  // Creates the task's cgroup and writes its limits; returns the cgroup.procs files a process
  // writes "0" to in order to join it. `name` holds no '/'.
  Result<std::vector<std::string>> Create(std::string_view name, const CgroupLimits& limits) const;
  // The cgroup.procs file that lists every process of the task's cgroup.
  std::string MembersFile(std::string_view name) const;
  // The processes in the task's cgroup now (none when it does not exist).
  std::vector<pid_t> Members(std::string_view name) const;
  // Sends `signal_number` to every process of the task's cgroup but those of process group
  // `except_group` (0: none), which the caller signals itself: a second SIGTERM would run a
  // shell's trap twice. The number signalled.
  int SignalAll(std::string_view name, int signal_number, pid_t except_group = 0) const;
  // Removes the task's cgroup; kFailedPrecondition while processes remain. OK when absent.
  Status Remove(std::string_view name) const;

 private:
  TaskCgroups(CgroupVersion version, std::vector<std::string> parents, bool enforces_limits);
  std::vector<std::string> Directories(std::string_view name) const;

  CgroupVersion version_;
  // v2: one parent; v1: the memory, cpu and pids parents, in that order.
  std::vector<std::string> parents_;
  bool enforces_limits_ = false;
};

}  // namespace gpufleet::runner
