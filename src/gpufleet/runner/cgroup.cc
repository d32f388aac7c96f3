// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/cgroup.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <charconv>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/os/files.h"

namespace gpufleet::runner {
namespace {

using os::ErrnoText;

constexpr long kCgroup2Magic = 0x63677270;  // NOLINT(google-runtime-int): statfs's f_type
// The v1 controllers a task's cgroup lives in; the last one lists the members.
constexpr std::string_view kV1Controllers[] = {"memory", "cpu", "pids"};
constexpr int64_t kCpuPeriodMicros = 100'000;

bool IsDirectory(const std::string& path) {
  struct stat info = {};
  return stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
}

Status MakeDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    return UnavailableError(fmt::format("cannot create cgroup '{}': {}", path, ErrnoText(errno)));
  }
  return Status::Ok();
}

Status WriteControl(const std::string& path, const std::string& value) {
  std::ofstream out(path);
  out << value;
  out.flush();
  if (!out) {
    return UnavailableError(
        fmt::format("cannot write '{}' to '{}': {}", value, path, ErrnoText(errno)));
  }
  return Status::Ok();
}

bool FileExists(const std::string& path) {
  return access(path.c_str(), F_OK) == 0;
}

}  // namespace

TaskCgroups::TaskCgroups(CgroupVersion version, std::vector<std::string> parents,
                         bool enforces_limits)
    : version_(version), parents_(std::move(parents)), enforces_limits_(enforces_limits) {}

Result<TaskCgroups> TaskCgroups::Detect(const std::string& root, const std::string& parent) {
  struct statfs info = {};
  if (statfs(root.c_str(), &info) != 0) {
    return UnavailableError(
        fmt::format("no cgroups: cannot read '{}': {}", root, ErrnoText(errno)));
  }
  if (static_cast<long>(info.f_type) == kCgroup2Magic) {  // NOLINT(google-runtime-int)
    return Open(CgroupVersion::kV2, root, parent);
  }
  for (const std::string_view controller : kV1Controllers) {
    if (!IsDirectory(fmt::format("{}/{}", root, controller))) {
      return UnavailableError(
          fmt::format("no cgroups: '{}' is not a cgroup2 mount and has no v1 '{}' controller", root,
                      controller));
    }
  }
  return Open(CgroupVersion::kV1, root, parent);
}

Result<TaskCgroups> TaskCgroups::Open(CgroupVersion version, const std::string& root,
                                      const std::string& parent) {
  std::vector<std::string> parents;
  bool enforces_limits = true;
  if (version == CgroupVersion::kV2) {
    parents.push_back(fmt::format("{}/{}", root, parent));
    GPUFLEET_RETURN_IF_ERROR(MakeDirectory(parents.back()));
    // Children get the cpu and memory controllers only if the parent hands them down; where the
    // root does not offer them (a container without delegation), tasks still get a cgroup of
    // their own, without limits.
    enforces_limits =
        WriteControl(fmt::format("{}/cgroup.subtree_control", parents.back()), "+cpu +memory").ok();
  } else {
    for (const std::string_view controller : kV1Controllers) {
      parents.push_back(fmt::format("{}/{}/{}", root, controller, parent));
      GPUFLEET_RETURN_IF_ERROR(MakeDirectory(parents.back()));
    }
  }
  return TaskCgroups(version, std::move(parents), enforces_limits);
}

std::string TaskCgroups::Describe() const {
  if (version_ == CgroupVersion::kV2) {
    return fmt::format(
        "cgroup v2 under {}{}", parents_.front(),
        enforces_limits_ ? "" : " (cpu and memory controllers not delegated: no limits)");
  }
  return fmt::format("cgroup v1 (memory, cpu, pids) under {}", fmt::join(parents_, ", "));
}

std::vector<std::string> TaskCgroups::Directories(std::string_view name) const {
  std::vector<std::string> directories;
  for (const std::string& parent : parents_) {
    directories.push_back(fmt::format("{}/{}", parent, name));
  }
  return directories;
}

Result<std::vector<std::string>> TaskCgroups::Create(std::string_view name,
                                                     const CgroupLimits& limits) const {
  if (name.empty() || name.find('/') != std::string_view::npos || name == "." || name == "..") {
    return InvalidArgumentError(fmt::format("cgroup name '{}' is not one path component", name));
  }
  const std::vector<std::string> directories = Directories(name);
  std::vector<std::string> join;
  for (const std::string& directory : directories) {
    GPUFLEET_RETURN_IF_ERROR(MakeDirectory(directory));
    join.push_back(directory + "/cgroup.procs");
  }
  if (!enforces_limits_) {
    return join;
  }
  if (version_ == CgroupVersion::kV2) {
    const std::string& directory = directories.front();
    GPUFLEET_RETURN_IF_ERROR(WriteControl(
        directory + "/memory.max",
        limits.memory_bytes > 0 ? std::to_string(limits.memory_bytes) : std::string("max")));
    GPUFLEET_RETURN_IF_ERROR(WriteControl(
        directory + "/cpu.max",
        limits.cpu_milli > 0
            ? fmt::format("{} {}", limits.cpu_milli * kCpuPeriodMicros / 1000, kCpuPeriodMicros)
            : fmt::format("max {}", kCpuPeriodMicros)));
    return join;
  }
  GPUFLEET_RETURN_IF_ERROR(WriteControl(
      directories[0] + "/memory.limit_in_bytes",
      limits.memory_bytes > 0 ? std::to_string(limits.memory_bytes) : std::string("-1")));
  GPUFLEET_RETURN_IF_ERROR(
      WriteControl(directories[1] + "/cpu.cfs_period_us", std::to_string(kCpuPeriodMicros)));
  GPUFLEET_RETURN_IF_ERROR(
      WriteControl(directories[1] + "/cpu.cfs_quota_us",
                   limits.cpu_milli > 0 ? std::to_string(limits.cpu_milli * kCpuPeriodMicros / 1000)
                                        : std::string("-1")));
  return join;
}

std::string TaskCgroups::MembersFile(std::string_view name) const {
  return fmt::format("{}/{}/cgroup.procs", parents_.back(), name);
}

std::vector<pid_t> TaskCgroups::Members(std::string_view name) const {
  std::vector<pid_t> members;
  std::ifstream in(MembersFile(name));
  pid_t pid = 0;
  while (in >> pid) {
    members.push_back(pid);
  }
  return members;
}

int TaskCgroups::SignalAll(std::string_view name, int signal_number, pid_t except_group) const {
  if (version_ == CgroupVersion::kV2 && signal_number == SIGKILL && except_group == 0) {
    const std::string kill_file = fmt::format("{}/{}/cgroup.kill", parents_.front(), name);
    if (FileExists(kill_file) && WriteControl(kill_file, "1").ok()) {
      return static_cast<int>(Members(name).size());
    }
  }
  int signalled = 0;
  for (const pid_t pid : Members(name)) {
    if (pid <= 1 || (except_group > 0 && getpgid(pid) == except_group)) {
      continue;
    }
    if (kill(pid, signal_number) == 0) {
      ++signalled;
    }
  }
  return signalled;
}

Status TaskCgroups::Remove(std::string_view name) const {
  for (const std::string& directory : Directories(name)) {
    if (rmdir(directory.c_str()) != 0 && errno != ENOENT) {
      return errno == EBUSY ? FailedPreconditionError(
                                  fmt::format("cgroup '{}' still holds processes", directory))
                            : UnavailableError(fmt::format("cannot remove cgroup '{}': {}",
                                                           directory, ErrnoText(errno)));
    }
  }
  return Status::Ok();
}

}  // namespace gpufleet::runner
