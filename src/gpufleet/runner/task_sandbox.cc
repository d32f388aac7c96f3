// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/task_sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/os/files.h"

namespace gpufleet::runner {
namespace {

using os::ErrnoText;
using os::ReadSmallFile;
using os::UniqueFd;

constexpr std::string_view kRangeFlag = "--task-uid-range";

bool ParseId(std::string_view text, uint64_t& out) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && error == std::errc() && end == text.data() + text.size();
}

bool InRange(const TaskUidRange& range, uint64_t id) {
  return id >= range.first && id <= range.last;
}

// The 4 uids of "Uid:\tREAL\tEFFECTIVE\tSAVED\tFS" in /proc/PID/status; nullopt when the process
// is gone, a zombie (it runs nothing any more) or its file is unreadable.
std::optional<std::array<uint64_t, 4>> ProcessUids(std::string_view pid) {
  const Result<std::optional<std::string>> text =
      ReadSmallFile(fmt::format("/proc/{}/status", pid));
  if (!text.ok() || !text->has_value()) {
    return std::nullopt;
  }
  const std::string_view status = **text;
  const size_t state = status.find("\nState:");
  if (state == std::string_view::npos ||
      status.substr(state + 7, 3).find_first_of("ZX") != std::string_view::npos) {
    return std::nullopt;
  }
  const size_t line = status.find("\nUid:");
  if (line == std::string_view::npos) {
    return std::nullopt;
  }
  std::string_view rest = status.substr(line + 5, status.find('\n', line + 1) - line - 5);
  std::array<uint64_t, 4> uids = {};
  for (uint64_t& uid : uids) {
    const size_t start = rest.find_first_not_of(" \t");
    if (start == std::string_view::npos) {
      return std::nullopt;
    }
    rest.remove_prefix(start);
    const size_t end = std::min(rest.find_first_of(" \t"), rest.size());
    if (!ParseId(rest.substr(0, end), uid)) {
      return std::nullopt;
    }
    rest.remove_prefix(end);
  }
  return uids;
}

// Calls `visit` with each process's pid and uids.
void ForEachProcess(
    const std::function<void(std::string_view, const std::array<uint64_t, 4>&)>& visit) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) {
    return;
  }
  while (const dirent* entry = readdir(proc)) {
    const std::string_view name = entry->d_name;
    if (name.empty() || name.find_first_not_of("0123456789") != std::string_view::npos) {
      continue;
    }
    if (const std::optional<std::array<uint64_t, 4>> uids = ProcessUids(name)) {
      visit(name, *uids);
    }
  }
  closedir(proc);
}

bool HasUid(const std::array<uint64_t, 4>& uids, uint64_t uid) {
  return std::find(uids.begin(), uids.end(), uid) != uids.end();
}

// The entries of a /etc/subuid-style file (NAME:START:COUNT) that overlap `range`, as errors.
Status CheckSubordinateIds(const TaskUidRange& range, const std::string& path) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<std::string> text, ReadSmallFile(path));
  if (!text.has_value()) {
    return Status::Ok();
  }
  std::string_view rest = *text;
  while (!rest.empty()) {
    const std::string_view line = rest.substr(0, rest.find('\n'));
    rest.remove_prefix(std::min(rest.size(), line.size() + 1));
    const size_t first_colon = line.find(':');
    const size_t second_colon = line.find(':', first_colon + 1);
    uint64_t start = 0;
    uint64_t count = 0;
    if (first_colon == std::string_view::npos || second_colon == std::string_view::npos ||
        !ParseId(line.substr(first_colon + 1, second_colon - first_colon - 1), start) ||
        !ParseId(line.substr(second_colon + 1), count) || count == 0) {
      continue;  // not an entry (a comment, a blank line)
    }
    if (start <= range.last && start + count - 1 >= range.first) {
      return FailedPreconditionError(fmt::format(
          "{} {}: '{}' gives '{}' the ids {}-{}, which overlap the range (a user namespace of "
          "theirs could run as a task's user); choose a range no account uses",
          kRangeFlag, FormatTaskUidRange(range), path, line.substr(0, first_colon), start,
          start + count - 1));
    }
  }
  return Status::Ok();
}

// Makes directory `name` in `dir` (or takes over the one there, never through a symbolic link)
// with `uid`, `gid` and `mode`, whatever the umask.
Result<UniqueFd> MakeDirectoryAt(int dir, const std::string& name, const std::string& path,
                                 uid_t uid, gid_t gid, mode_t mode) {
  if (mkdirat(dir, name.c_str(), mode) != 0 && errno != EEXIST) {
    return UnavailableError(fmt::format("cannot create '{}': {}", path, ErrnoText(errno)));
  }
  UniqueFd fd(openat(dir, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid() || fchown(fd.get(), uid, gid) != 0 || fchmod(fd.get(), mode) != 0) {
    return UnavailableError(
        fmt::format("cannot make '{}' a directory of uid {}: {}", path, uid, ErrnoText(errno)));
  }
  return fd;
}

}  // namespace

Result<TaskUidRange> ParseTaskUidRange(std::string_view text) {
  const size_t dash = text.find('-');
  uint64_t first = 0;
  uint64_t last = 0;
  if (dash == std::string_view::npos || !ParseId(text.substr(0, dash), first) ||
      !ParseId(text.substr(dash + 1), last)) {
    return InvalidArgumentError(fmt::format("{}: \"{}\" is not FIRST-LAST (e.g. {})", kRangeFlag,
                                            text, FormatTaskUidRange(kDefaultTaskUidRange)));
  }
  constexpr uint64_t kInvalidId = static_cast<uid_t>(-1);
  if (first == 0 || first > last || last >= kInvalidId) {
    return InvalidArgumentError(
        fmt::format("{}: \"{}\": want 1 <= FIRST <= LAST < {} (uid 0 is root, {} is no id)",
                    kRangeFlag, text, kInvalidId, kInvalidId));
  }
  return TaskUidRange{static_cast<uid_t>(first), static_cast<uid_t>(last)};
}

std::string FormatTaskUidRange(const TaskUidRange& range) {
  return fmt::format("{}-{}", range.first, range.last);
}

Status CheckTaskUidRangeIsUnused(const TaskUidRange& range, const std::string& subuid_path,
                                 const std::string& subgid_path) {
  std::vector<char> buffer(1 << 16);
  std::string conflict;
  setpwent();
  passwd user = {};
  passwd* found_user = nullptr;
  while (conflict.empty() && getpwent_r(&user, buffer.data(), buffer.size(), &found_user) == 0) {
    if (InRange(range, found_user->pw_uid) || InRange(range, found_user->pw_gid)) {
      conflict = fmt::format("user '{}' (uid {}, gid {})", found_user->pw_name, found_user->pw_uid,
                             found_user->pw_gid);
    }
  }
  endpwent();
  setgrent();
  group entry = {};
  group* found_group = nullptr;
  while (conflict.empty() && getgrent_r(&entry, buffer.data(), buffer.size(), &found_group) == 0) {
    if (InRange(range, found_group->gr_gid)) {
      conflict = fmt::format("group '{}' (gid {})", found_group->gr_name, found_group->gr_gid);
    }
  }
  endgrent();
  if (!conflict.empty()) {
    return FailedPreconditionError(
        fmt::format("{} {}: {} is in the range; choose a range no account uses", kRangeFlag,
                    FormatTaskUidRange(range), conflict));
  }
  GPUFLEET_RETURN_IF_ERROR(CheckSubordinateIds(range, subuid_path));
  return CheckSubordinateIds(range, subgid_path);
}

std::set<uid_t> UidsInUse(const TaskUidRange& range) {
  std::set<uid_t> used;
  ForEachProcess([&](std::string_view, const std::array<uint64_t, 4>& uids) {
    for (const uint64_t uid : uids) {
      if (InRange(range, uid)) {
        used.insert(static_cast<uid_t>(uid));
      }
    }
  });
  return used;
}

int KillProcessesOfUid(uid_t uid) {
  int killed = 0;
  ForEachProcess([&](std::string_view pid_text, const std::array<uint64_t, 4>& uids) {
    uint64_t pid = 0;
    if (!HasUid(uids, uid) || !ParseId(pid_text, pid)) {
      return;
    }
    // The pidfd holds on to the process: if the pid still shows the uid after it was opened, the
    // pidfd's process is one of the uid's (or has died, and the signal goes nowhere).
    // (glibc 2.36's <sys/pidfd.h> is not usable from C++: it declares no C linkage.)
    const UniqueFd process(static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0)));
    if (!process.valid()) {
      return;
    }
    const std::optional<std::array<uint64_t, 4>> again = ProcessUids(pid_text);
    if (again.has_value() && HasUid(*again, uid) &&
        syscall(SYS_pidfd_send_signal, process.get(), SIGKILL, nullptr, 0) == 0) {
      ++killed;
    }
  });
  return killed;
}

std::optional<uid_t> PickTaskUid(const TaskUidRange& range, uid_t next,
                                 const std::set<uid_t>& unavailable) {
  const uint64_t size = uint64_t{range.last} - range.first + 1;
  for (uint64_t offset = 0; offset < size; ++offset) {
    const uid_t uid = static_cast<uid_t>(range.first + (next - range.first + offset) % size);
    if (!unavailable.contains(uid)) {
      return uid;
    }
  }
  return std::nullopt;
}

Status PrepareRunsDirectory(const std::string& runs_dir) {
  if (mkdir(runs_dir.c_str(), 0711) != 0 && errno != EEXIST) {
    return UnavailableError(
        fmt::format("cannot create the runs' directory '{}': {}", runs_dir, ErrnoText(errno)));
  }
  UniqueFd fd(open(runs_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid() || fchown(fd.get(), 0, 0) != 0 || fchmod(fd.get(), 0711) != 0) {
    return UnavailableError(
        fmt::format("cannot make '{}' a directory of root, 0711: {}", runs_dir, ErrnoText(errno)));
  }
  std::error_code error;
  std::filesystem::path path = std::filesystem::absolute(runs_dir, error);
  for (; !error && path.has_relative_path(); path = path.parent_path()) {
    struct stat info = {};
    if (stat(path.c_str(), &info) != 0) {
      return UnavailableError(fmt::format("cannot stat '{}': {}", path.string(), ErrnoText(errno)));
    }
    if ((info.st_mode & S_IXOTH) == 0) {
      return FailedPreconditionError(fmt::format(
          "'{}' (mode {:04o}) is not searchable by other users, so tasks could not reach their "
          "directories under '{}' (chmod o+x it)",
          path.string(), info.st_mode & 07777, runs_dir));
    }
  }
  return Status::Ok();
}

Result<RunDirectories> CreateRunDirectories(const std::string& runs_dir, const std::string& name,
                                            uid_t uid, gid_t gid) {
  RunDirectories dirs;
  dirs.root = fmt::format("{}/{}", runs_dir, name);
  dirs.work = dirs.root + "/work";
  dirs.tmp = dirs.root + "/tmp";
  UniqueFd runs(open(runs_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!runs.valid()) {
    return UnavailableError(fmt::format("cannot open '{}': {}", runs_dir, ErrnoText(errno)));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const UniqueFd root,
                            MakeDirectoryAt(runs.get(), name, dirs.root, 0, 0, 0711));
  GPUFLEET_RETURN_IF_ERROR(MakeDirectoryAt(root.get(), "work", dirs.work, uid, gid, 0700).status());
  GPUFLEET_RETURN_IF_ERROR(MakeDirectoryAt(root.get(), "tmp", dirs.tmp, uid, gid, 0700).status());
  return dirs;
}

Status RemoveRunDirectory(const std::string& runs_dir, const std::string& name) {
  const std::string path = fmt::format("{}/{}", runs_dir, name);
  std::error_code error;
  std::filesystem::remove_all(path, error);  // never follows a symbolic link it finds
  if (error) {
    return UnavailableError(fmt::format("cannot remove '{}': {}", path, error.message()));
  }
  return Status::Ok();
}

}  // namespace gpufleet::runner
