// SPDX-License-Identifier: Apache-2.0
// The task sandbox's parts (docs/agent.md, "The task sandbox"): a user of its own for each run's
// tasks, taken from a range of ids no account uses, and the run's private directories. The
// ProcessRunner puts them together (ProcessRunnerOptions::sandbox).
#pragma once

#include <sys/types.h>

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet::runner {

// The ids the runner gives runs, FIRST to LAST inclusive: each run's tasks get one uid and the gid
// of the same number.
struct TaskUidRange {
  uid_t first = 0;
  uid_t last = 0;

  friend bool operator==(const TaskUidRange&, const TaskUidRange&) = default;
};

// The default range: above system and regular users (up to 60000), nobody (65534), the ranges
// useradd hands out in /etc/subuid and /etc/subgid (100000 to 600100000) and systemd-nspawn's
// container range (524288 to 1879048191), in the part systemd leaves unused and below 2^31 (ids
// some tools read as signed).
inline constexpr TaskUidRange kDefaultTaskUidRange{2000000000, 2000065535};

// "FIRST-LAST", decimal, 1 <= FIRST <= LAST < 4294967295. kInvalidArgument naming
// --task-uid-range and the value.
Result<TaskUidRange> ParseTaskUidRange(std::string_view text);
// "FIRST-LAST".
std::string FormatTaskUidRange(const TaskUidRange& range);

// kFailedPrecondition naming --task-uid-range, the range and the entry when a user or group of
// this node (the passwd and group databases, as enumerated) or a range of `subuid_path` or
// `subgid_path` (NAME:START:COUNT lines; a missing file has none) has an id in `range`: a task
// with that id could read that account's processes and files. kUnavailable when a file cannot be
// read.
Status CheckTaskUidRangeIsUnused(const TaskUidRange& range, const std::string& subuid_path,
                                 const std::string& subgid_path);

// The ids in `range` that a process of this node runs as (real, effective, saved or filesystem
// uid, as /proc/PID/status says); zombies run nothing and do not count.
std::set<uid_t> UidsInUse(const TaskUidRange& range);

// Sends SIGKILL to every process (but zombies) whose real, effective, saved or filesystem uid is
// `uid` (through a pidfd, after checking the uid again, so a reused pid is never signalled).
// Returns how many it signalled.
int KillProcessesOfUid(uid_t uid);

// The first uid at or after `next` (wrapping around to range.first) that is not in `unavailable`;
// nullopt when every uid of the range is. REQUIRES: `next` in `range`.
std::optional<uid_t> PickTaskUid(const TaskUidRange& range, uid_t next,
                                 const std::set<uid_t>& unavailable);

// What ProcessRunnerOptions::sandbox configures.
struct TaskSandboxOptions {
  TaskUidRange uids = kDefaultTaskUidRange;
  // Supplementary groups of every task (`gpufleet agent --task-group`), e.g. one that may open
  // /dev/nvidia* on a node that restricts them; none by default.
  std::vector<gid_t> groups;
  // Where each run's directories go (PrepareRunsDirectory). Required.
  std::string runs_dir;
  // Checked at start: no subordinate ids of a user may fall in `uids`.
  std::string subuid_path = "/etc/subuid";
  std::string subgid_path = "/etc/subgid";
};

// Creates `runs_dir` (its parent must exist) or takes it over: owned by root, 0711, so that a task
// can enter its own run's directories but list nobody's. kFailedPrecondition naming the directory
// when it or one of its parents is not searchable by other users (tasks could not reach their
// directories), kUnavailable when it cannot be made.
Status PrepareRunsDirectory(const std::string& runs_dir);

// A run's directories: `root` (owned by root, 0711) holds `work`, the tasks' working directory
// and HOME, and `tmp`, their TMPDIR, both owned by the run's uid and gid, 0700.
struct RunDirectories {
  std::string root;
  std::string work;
  std::string tmp;
};

// Creates (or takes over, when they exist) the directories of run directory `name` under
// `runs_dir` for `uid` and `gid`. `runs_dir` must be a directory only root can write to. Never
// follows a symbolic link below `runs_dir`. kUnavailable naming the directory when one cannot be
// made.
Result<RunDirectories> CreateRunDirectories(const std::string& runs_dir, const std::string& name,
                                            uid_t uid, gid_t gid);

// Removes `runs_dir`/`name` and everything below it; no such directory is OK. REQUIRES: no
// process of the run's uid is left (nothing changes the tree meanwhile). kUnavailable naming the
// directory when it cannot be removed.
Status RemoveRunDirectory(const std::string& runs_dir, const std::string& name);

}  // namespace gpufleet::runner
