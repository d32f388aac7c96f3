// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/process_runner.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/os/files.h"
#include "gpufleet/runner/internal/shim.h"
#include "gpufleet/runner/internal/task_table.h"
#include "gpufleet/runner/internal/text.h"

namespace gpufleet::runner {
namespace {

using internal::SplitCommas;
using os::ErrnoText;
using os::ReadSmallFile;
using os::UniqueFd;
using os::WriteFileAtomically;

constexpr std::string_view kStateSuffix = ".task";
constexpr std::string_view kExitSuffix = ".exit";
constexpr std::string_view kStateHeader = "gpufleet-task-state 1";
constexpr std::string_view kLockFileName = "lock";
// The agent's lease (RenewLease); like "lock", no task's file can have this name.
constexpr std::string_view kLeaseFileName = "lease";

// The shim points 0, 1 and 2 at /dev/null first; a descriptor there would be lost (it is only
// possible when the hosting process runs with a standard stream closed).
Status MoveAboveStdio(UniqueFd& fd) {
  if (fd.get() > STDERR_FILENO) {
    return Status::Ok();
  }
  const int moved = fcntl(fd.get(), F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  if (moved < 0) {
    return UnavailableError("cannot duplicate a descriptor: " + ErrnoText(errno));
  }
  fd.Reset(moved);
  return Status::Ok();
}

// '/' is not allowed in a file name and '%' is not allowed in a task id.
std::string FileStem(std::string_view task_id) {
  std::string stem(task_id);
  std::replace(stem.begin(), stem.end(), '/', '%');
  return stem;
}

std::string TaskIdFromStem(std::string_view stem) {
  std::string task_id(stem);
  std::replace(task_id.begin(), task_id.end(), '%', '/');
  return task_id;
}

bool EndsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

Status RemoveIfPresent(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return UnavailableError(fmt::format("cannot remove '{}': {}", path, ErrnoText(errno)));
  }
  return Status::Ok();
}

// What /proc/PID/stat says about a process.
struct ProcessStat {
  char state = '?';          // 'R', 'S', ..., 'Z' (zombie), 'X' (dead)
  uint64_t start_ticks = 0;  // field 22, starttime: clock ticks after boot
};

std::optional<ProcessStat> ReadProcessStat(pid_t pid) {
  const Result<std::optional<std::string>> text = ReadSmallFile(fmt::format("/proc/{}/stat", pid));
  if (!text.ok() || !text->has_value()) {
    return std::nullopt;
  }
  // The command name (field 2) is in parentheses and may hold spaces and parentheses itself.
  const std::string& line = **text;
  const size_t name_end = line.rfind(')');
  if (name_end == std::string::npos) {
    return std::nullopt;
  }
  std::vector<std::string_view> fields;  // fields[0] is field 3, the state
  std::string_view rest = std::string_view(line).substr(name_end + 1);
  while (!rest.empty()) {
    const size_t start = rest.find_first_not_of(' ');
    if (start == std::string_view::npos) {
      break;
    }
    rest.remove_prefix(start);
    const size_t end = std::min(rest.find(' '), rest.size());
    fields.push_back(rest.substr(0, end));
    rest.remove_prefix(end);
  }
  constexpr size_t kStartTimeIndex = 22 - 3;
  if (fields.size() <= kStartTimeIndex || fields[0].empty()) {
    return std::nullopt;
  }
  ProcessStat stat;
  stat.state = fields[0][0];
  const std::string_view ticks = fields[kStartTimeIndex];
  const auto [end, error] =
      std::from_chars(ticks.data(), ticks.data() + ticks.size(), stat.start_ticks);
  if (error != std::errc() || end != ticks.data() + ticks.size()) {
    return std::nullopt;
  }
  return stat;
}

// Identifies the current boot; empty if the kernel does not say.
std::string ReadBootId() {
  const Result<std::optional<std::string>> text = ReadSmallFile("/proc/sys/kernel/random/boot_id");
  if (!text.ok() || !text->has_value()) {
    return "";
  }
  std::string id = **text;
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) {
    id.pop_back();
  }
  return id;
}

// argv[0] as execve needs it: unchanged when it names a path, else the first executable regular
// file of that name in `search_path` (empty entries mean the current directory, as in POSIX).
Result<std::string> FindExecutable(const std::string& program, std::string_view search_path) {
  if (program.find('/') != std::string::npos) {
    return program;
  }
  std::string_view rest = search_path;
  while (true) {
    const size_t colon = rest.find(':');
    const std::string_view dir = rest.substr(0, colon);
    const std::string candidate = dir.empty() ? "./" + program : fmt::format("{}/{}", dir, program);
    struct stat info = {};
    if (stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (colon == std::string_view::npos) {
      break;
    }
    rest.remove_prefix(colon + 1);
  }
  return NotFoundError(fmt::format("command '{}' not found in PATH '{}'", program, search_path));
}

// The variables of the runner's own environment a task gets (kInheritedEnv); never the rest,
// which holds the agent's secrets.
bool IsInherited(std::string_view name) {
  for (const std::string_view allowed : kInheritedEnv) {
    if (name == allowed) {
      return true;
    }
  }
  return name.starts_with("LC_");
}

}  // namespace

std::vector<std::string> TaskEnvironment(const TaskLaunch& launch,
                                         const std::optional<RunAs>& run_as) {
  std::map<std::string, std::string, std::less<>> overrides(launch.env.begin(), launch.env.end());
  if (run_as.has_value()) {
    overrides.try_emplace("HOME", run_as->home);
    overrides.try_emplace("USER", run_as->user);
    overrides.try_emplace("LOGNAME", run_as->user);
  }
  for (auto& [name, value] : GpuEnvironment(launch.gpu_uuids)) {
    overrides.insert_or_assign(name, value);
  }
  if (launch.mps.has_value()) {
    for (auto& [name, value] : MpsEnvironment(*launch.mps)) {
      overrides.insert_or_assign(name, value);
    }
  }
  std::vector<std::string> entries;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const std::string_view name = text.substr(0, text.find('='));
    if (IsInherited(name) && !overrides.contains(name)) {
      entries.emplace_back(text);
    }
  }
  for (const auto& [name, value] : overrides) {
    entries.push_back(fmt::format("{}={}", name, value));
  }
  return entries;
}

namespace {

std::vector<char*> NullTerminatedPointers(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  pointers.reserve(strings.size() + 1);
  for (std::string& text : strings) {
    pointers.push_back(text.data());
  }
  pointers.push_back(nullptr);
  return pointers;
}

template <typename Integer>
bool ParseInteger(std::string_view text, Integer& out) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return !text.empty() && error == std::errc() && end == text.data() + text.size();
}

// The state file: a header line, then key=value lines (values hold no newline: ValidateLaunch
// refuses newlines in paths and argv[0]).
struct StateRecord {
  std::string task_id;
  pid_t shim_pid = 0;
  uint64_t shim_start_ticks = 0;
  std::string boot_id;
  int64_t start_time_nanos = 0;
  std::string command;
  std::vector<std::string> gpu_uuids;
  std::string log_path;
  std::string working_dir;
  // Its shim stops it when the lease runs out; records of older runners lack the line.
  bool enforces_lease = false;
  // Its shim ignores the notice signals (SendNotice); records of older runners lack the line.
  bool takes_notices = false;
  // The task sandbox: the run's directory name and uid; empty and none without one.
  std::string run_dir;
  std::optional<uid_t> uid;
};

std::string FormatStateRecord(const StateRecord& record) {
  return fmt::format(
      "{}\ntask_id={}\nshim_pid={}\nshim_start_ticks={}\nboot_id={}\nstart_time_ns={}\n"
      "command={}\ngpu_uuids={}\nlog_path={}\nworking_dir={}\nenforces_lease={}\nrun_dir={}\n"
      "uid={}\ntakes_notices={}\n",
      kStateHeader, record.task_id, record.shim_pid, record.shim_start_ticks, record.boot_id,
      record.start_time_nanos, record.command, fmt::join(record.gpu_uuids, ","), record.log_path,
      record.working_dir, record.enforces_lease ? 1 : 0, record.run_dir,
      record.uid.has_value() ? std::to_string(*record.uid) : "", record.takes_notices ? 1 : 0);
}

Result<StateRecord> ParseStateRecord(std::string_view text) {
  std::map<std::string, std::string, std::less<>> values;
  bool first = true;
  while (!text.empty()) {
    const size_t newline = text.find('\n');
    if (newline == std::string_view::npos) {
      return InvalidArgumentError("the last line is incomplete");
    }
    const std::string_view line = text.substr(0, newline);
    text.remove_prefix(newline + 1);
    if (first) {
      if (line != kStateHeader) {
        return InvalidArgumentError(
            fmt::format("the first line is '{}', not '{}'", line, kStateHeader));
      }
      first = false;
      continue;
    }
    const size_t equals = line.find('=');
    if (equals == std::string_view::npos) {
      return InvalidArgumentError(fmt::format("line '{}' has no '='", line));
    }
    values.insert_or_assign(std::string(line.substr(0, equals)),
                            std::string(line.substr(equals + 1)));
  }
  if (first) {
    return InvalidArgumentError("the file is empty");
  }
  for (const char* key : {"task_id", "shim_pid", "shim_start_ticks", "start_time_ns"}) {
    if (!values.contains(key)) {
      return InvalidArgumentError(fmt::format("'{}' is missing", key));
    }
  }
  StateRecord record;
  record.task_id = values["task_id"];
  if (!ParseInteger(values["shim_pid"], record.shim_pid) || record.shim_pid <= 1) {
    return InvalidArgumentError(fmt::format("shim_pid '{}' is not a pid", values["shim_pid"]));
  }
  if (!ParseInteger(values["shim_start_ticks"], record.shim_start_ticks)) {
    return InvalidArgumentError(
        fmt::format("shim_start_ticks '{}' is not a number", values["shim_start_ticks"]));
  }
  if (!ParseInteger(values["start_time_ns"], record.start_time_nanos)) {
    return InvalidArgumentError(
        fmt::format("start_time_ns '{}' is not a number", values["start_time_ns"]));
  }
  record.boot_id = values["boot_id"];
  record.command = values["command"];
  record.gpu_uuids = SplitCommas(values["gpu_uuids"]);
  record.log_path = values["log_path"];
  record.working_dir = values["working_dir"];
  record.enforces_lease = values["enforces_lease"] == "1";
  record.takes_notices = values["takes_notices"] == "1";
  record.run_dir = values["run_dir"];
  if (!values["uid"].empty()) {
    uid_t uid = 0;
    if (!ParseInteger(values["uid"], uid)) {
      return InvalidArgumentError(fmt::format("uid '{}' is not a number", values["uid"]));
    }
    record.uid = uid;
  }
  if (record.uid.has_value() == record.run_dir.empty()) {
    return InvalidArgumentError("run_dir and uid go together");
  }
  return record;
}

std::string StartFailureReason(const internal::ExitRecord& record, std::string_view command,
                               std::string_view working_dir) {
  const std::string error = ErrnoText(record.value);
  switch (record.stage) {
    case internal::StartStage::kSetup:
      return "cannot redirect stdin, stdout and stderr: " + error;
    case internal::StartStage::kChdir:
      return fmt::format("cannot enter working directory '{}': {}", working_dir, error);
    case internal::StartStage::kExec:
      return fmt::format("cannot execute '{}': {}", command, error);
    case internal::StartStage::kFork:
      return "cannot fork the task's process: " + error;
    case internal::StartStage::kCgroup:
      return "cannot join the task's cgroup: " + error;
    case internal::StartStage::kIdentity:
      return "cannot take on the task's user and group ids: " + error;
  }
  return "unknown start failure: " + error;
}

}  // namespace

ProcessRunner::ProcessRunner(std::string state_dir, const Clock& clock, int lock_fd,
                             std::string boot_id, ProcessRunnerOptions options)
    : state_dir_(std::move(state_dir)),
      lease_path_(fmt::format("{}/{}", state_dir_, kLeaseFileName)),
      clock_(clock),
      lock_fd_(lock_fd),
      boot_id_(std::move(boot_id)),
      options_(std::move(options)) {}

ProcessRunner::~ProcessRunner() {
  close(lock_fd_);
}

Result<std::unique_ptr<ProcessRunner>> ProcessRunner::Open(std::string state_dir,
                                                           const Clock& clock,
                                                           ProcessRunnerOptions options) {
  if (state_dir.empty()) {
    return InvalidArgumentError("state_dir of the task runner is empty");
  }
  if (mkdir(state_dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return UnavailableError(
        fmt::format("cannot create state_dir '{}': {}", state_dir, ErrnoText(errno)));
  }
  struct stat info = {};
  if (stat(state_dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return FailedPreconditionError(fmt::format("state_dir '{}' is not a directory", state_dir));
  }
  const std::string lock_path = fmt::format("{}/{}", state_dir, kLockFileName);
  UniqueFd lock(open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) {
    return UnavailableError(fmt::format("cannot open '{}': {}", lock_path, ErrnoText(errno)));
  }
  if (flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    return errno == EWOULDBLOCK
               ? FailedPreconditionError(fmt::format(
                     "state_dir '{}' is in use by another task runner (lock '{}' is held)",
                     state_dir, lock_path))
               : UnavailableError(fmt::format("cannot lock '{}': {}", lock_path, ErrnoText(errno)));
  }
  if (options.sandbox.has_value()) {
    if (options.run_as.has_value()) {
      return InvalidArgumentError(
          "the task sandbox (a user per run) and run_as (one user for every task) exclude each "
          "other");
    }
    if (geteuid() != 0) {
      return FailedPreconditionError(
          "the task sandbox (a user per run) needs root to run tasks as other users");
    }
    GPUFLEET_RETURN_IF_ERROR(CheckTaskUidRangeIsUnused(
        options.sandbox->uids, options.sandbox->subuid_path, options.sandbox->subgid_path));
    GPUFLEET_RETURN_IF_ERROR(PrepareRunsDirectory(options.sandbox->runs_dir));
  }
  std::unique_ptr<ProcessRunner> runner(new ProcessRunner(
      std::move(state_dir), clock, lock.Release(), ReadBootId(), std::move(options)));
  GPUFLEET_RETURN_IF_ERROR(runner->LoadStateDirectory());
  return runner;
}

std::string ProcessRunner::FilePath(std::string_view task_id, std::string_view suffix) const {
  return fmt::format("{}/{}{}", state_dir_, FileStem(task_id), suffix);
}

// With the suffix, no task id (".." is one) names a directory a path component cannot be.
std::string ProcessRunner::CgroupName(std::string_view task_id) const {
  return FileStem(task_id) + std::string(kStateSuffix);
}

std::string ProcessRunner::StateFilePathForTest(std::string_view task_id) const {
  return FilePath(task_id, kStateSuffix);
}

Status ProcessRunner::LoadStateDirectory() {
  std::error_code error;
  std::filesystem::directory_iterator it(state_dir_, error);
  if (error) {
    return UnavailableError(
        fmt::format("cannot list state_dir '{}': {}", state_dir_, error.message()));
  }
  std::set<std::string> state_stems;
  std::vector<std::string> exit_stems;
  const std::filesystem::directory_iterator end;
  for (; it != end; it.increment(error)) {
    if (error) {
      return UnavailableError(
          fmt::format("cannot list state_dir '{}': {}", state_dir_, error.message()));
    }
    const std::string name = it->path().filename().string();
    const std::string path = it->path().string();
    if (EndsWith(name, os::kAtomicWriteSuffix)) {
      GPUFLEET_RETURN_IF_ERROR(RemoveIfPresent(path));  // a write the last agent did not finish
      continue;
    }
    if (EndsWith(name, kExitSuffix)) {
      exit_stems.push_back(name.substr(0, name.size() - kExitSuffix.size()));
      continue;
    }
    if (!EndsWith(name, kStateSuffix)) {
      continue;
    }
    const std::string stem = name.substr(0, name.size() - kStateSuffix.size());
    state_stems.insert(stem);

    const MonoTime now = clock_.Now();
    Task task;
    task.status.task_id = TaskIdFromStem(stem);
    GPUFLEET_ASSIGN_OR_RETURN(const std::optional<std::string> text, ReadSmallFile(path));
    Result<StateRecord> record = text.has_value()
                                     ? ParseStateRecord(*text)
                                     : Result<StateRecord>(InvalidArgumentError("it vanished"));
    if (record.ok() && record->task_id != task.status.task_id) {
      record = InvalidArgumentError(
          fmt::format("it names task '{}', not the one of its file name", record->task_id));
    }
    if (!record.ok()) {
      task.status.state = TaskState::kLost;
      task.status.reason =
          fmt::format("its state file '{}' is unreadable: {}", path, record.status().message());
      task.status.end_time = now;
      tasks_.emplace(task.status.task_id, std::move(task));
      continue;
    }
    task.status.gpu_uuids = record->gpu_uuids;
    task.status.enforces_lease = record->enforces_lease;
    task.takes_notices = record->takes_notices;
    task.status.start_time = MonoTime{record->start_time_nanos};
    task.status.process_group = record->shim_pid;
    task.command = record->command;
    task.working_dir = record->working_dir;
    task.log_path = record->log_path;
    task.shim_pid = record->shim_pid;
    task.shim_start_ticks = record->shim_start_ticks;
    task.run_dir = record->run_dir;
    task.uid = record->uid;
    if (!boot_id_.empty() && record->boot_id != boot_id_) {
      // Pids and start times restart with the kernel: the old ones must not be trusted.
      task.status.state = TaskState::kLost;
      task.status.reason = "the node restarted since the task started";
      task.status.end_time = now;
      task.status.process_group = 0;
    }
    tasks_.emplace(task.status.task_id, std::move(task));
  }
  for (const std::string& stem : exit_stems) {
    if (!state_stems.contains(stem)) {  // left by a Forget that was interrupted
      GPUFLEET_RETURN_IF_ERROR(RemoveIfPresent(FilePath(TaskIdFromStem(stem), kExitSuffix)));
    }
  }
  if (options_.sandbox.has_value()) {
    // Round-robin goes on after the newest uid the adopted tasks hold.
    const TaskUidRange& range = options_.sandbox->uids;
    next_uid_ = range.first;
    for (const auto& [id, task] : tasks_) {
      if (task.uid.has_value() && *task.uid >= range.first && *task.uid < range.last) {
        next_uid_ = std::max<uid_t>(next_uid_, *task.uid + 1);
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    EndStrayRuns();
  }
  return Status::Ok();
}

void ProcessRunner::EndStrayRuns() {
  const TaskUidRange& range = options_.sandbox->uids;
  std::error_code error;
  std::filesystem::directory_iterator it(options_.sandbox->runs_dir, error);
  const std::filesystem::directory_iterator end;
  for (; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    const bool known = std::any_of(tasks_.begin(), tasks_.end(),
                                   [&](const auto& entry) { return entry.second.run_dir == name; });
    if (known) {
      continue;
    }
    // The uid is the owner of its directories (a run that ended while no runner watched).
    std::optional<uid_t> uid;
    for (const char* dir : {"work", "tmp"}) {
      struct stat info = {};
      if (!uid.has_value() && lstat((it->path() / dir).c_str(), &info) == 0 &&
          info.st_uid >= range.first && info.st_uid <= range.last) {
        uid = info.st_uid;
      }
    }
    ended_runs_.emplace(name, uid);
  }
  ReleaseEndedRuns();
}

Result<RunAs> ProcessRunner::EnterRun(TaskLaunch& launch, Task& task) {
  const TaskSandboxOptions& sandbox = *options_.sandbox;
  task.run_dir = FileStem(launch.run_id.empty() ? launch.task_id : launch.run_id) + ".run";
  for (const auto& [id, other] : tasks_) {
    if (other.run_dir == task.run_dir && other.uid.has_value()) {
      task.uid = other.uid;  // a task of the same run
      break;
    }
  }
  if (const auto ended = ended_runs_.find(task.run_dir); ended != ended_runs_.end()) {
    // The run goes on: it keeps its uid and directories.
    task.uid = task.uid.has_value() ? task.uid : ended->second;
    ended_runs_.erase(ended);
  }
  if (!task.uid.has_value()) {
    std::set<uid_t> unavailable = UidsInUse(sandbox.uids);
    for (const auto& [id, other] : tasks_) {
      if (other.uid.has_value()) {
        unavailable.insert(*other.uid);
      }
    }
    for (const auto& [name, uid] : ended_runs_) {
      if (uid.has_value()) {
        unavailable.insert(*uid);
      }
    }
    task.uid = PickTaskUid(sandbox.uids, next_uid_, unavailable);
    if (!task.uid.has_value()) {
      return Status(
          StatusCode::kResourceExhausted,
          fmt::format(
              "task '{}': every uid of --task-uid-range {} is held by a run or used by a process",
              launch.task_id, FormatTaskUidRange(sandbox.uids)));
    }
    next_uid_ = *task.uid == sandbox.uids.last ? sandbox.uids.first : *task.uid + 1;
  }
  const uid_t uid = *task.uid;
  Result<RunDirectories> dirs = CreateRunDirectories(sandbox.runs_dir, task.run_dir, uid, uid);
  if (!dirs.ok()) {
    return UnavailableError(fmt::format("task '{}': {}", launch.task_id, dirs.status().message()));
  }
  launch.env.try_emplace("TMPDIR", dirs->tmp);
  if (launch.working_dir.empty()) {
    launch.working_dir = dirs->work;
  }
  task.working_dir = launch.working_dir;
  RunAs identity;
  identity.user = fmt::format("gpufleet-{}", uid);
  identity.uid = uid;
  identity.gid = uid;
  identity.groups.push_back(uid);
  identity.groups.insert(identity.groups.end(), sandbox.groups.begin(), sandbox.groups.end());
  identity.home = dirs->work;
  return identity;
}

void ProcessRunner::EndRunIfUnused(const std::string& run_dir, uid_t uid) {
  const bool used = std::any_of(tasks_.begin(), tasks_.end(),
                                [&](const auto& entry) { return entry.second.run_dir == run_dir; });
  if (!used) {
    ended_runs_.emplace(run_dir, uid);
    ReleaseEndedRuns();
  }
}

void ProcessRunner::ReleaseEndedRuns() {
  if (ended_runs_.empty()) {
    return;
  }
  // A directory left by an earlier run whose uid a live run holds now waits for that run.
  std::set<uid_t> held;
  for (const auto& [id, task] : tasks_) {
    if (task.uid.has_value()) {
      held.insert(*task.uid);
    }
  }
  // What a run left behind (a child that left its process group, without cgroups to catch it)
  // dies with the run; the uid is free once the kernel has taken the last one away.
  for (const auto& [name, uid] : ended_runs_) {
    if (uid.has_value() && !held.contains(*uid)) {
      KillProcessesOfUid(*uid);
    }
  }
  const std::set<uid_t> in_use = UidsInUse(options_.sandbox->uids);
  std::erase_if(ended_runs_, [&](const auto& entry) {
    const auto& [name, uid] = entry;
    return !(uid.has_value() && (in_use.contains(*uid) || held.contains(*uid))) &&
           RemoveRunDirectory(options_.sandbox->runs_dir, name).ok();
  });
}

Status ProcessRunner::Start(const TaskLaunch& launch) {
  GPUFLEET_RETURN_IF_ERROR(ValidateLaunch(launch));
  if (launch.log_path.empty()) {
    return InvalidArgumentError(fmt::format("log_path of task '{}' is empty", launch.task_id));
  }
  if (!launch.working_dir.empty()) {
    struct stat info = {};
    if (stat(launch.working_dir.c_str(), &info) != 0) {
      return InvalidArgumentError(fmt::format("working_dir '{}' of task '{}' is unusable: {}",
                                              launch.working_dir, launch.task_id,
                                              ErrnoText(errno)));
    }
    if (!S_ISDIR(info.st_mode)) {
      return InvalidArgumentError(fmt::format("working_dir '{}' of task '{}' is not a directory",
                                              launch.working_dir, launch.task_id));
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_RETURN_IF_ERROR(internal::CheckNewTask(tasks_, launch.task_id));
  if (!launch.image.empty()) {
    return InvalidArgumentError(fmt::format(
        "task '{}' asks for image '{}': the process runner runs no containers (gpufleet agent "
        "--runner podman does)",
        launch.task_id, launch.image));
  }
  UniqueFd log(
      open(launch.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOCTTY, 0600));
  if (!log.valid()) {
    return InvalidArgumentError(
        fmt::format("log_path '{}' of task '{}' cannot be opened for appending: {}",
                    launch.log_path, launch.task_id, ErrnoText(errno)));
  }

  Task task;
  task.status.task_id = launch.task_id;
  task.status.gpu_uuids = launch.gpu_uuids;
  task.status.start_time = clock_.Now();
  task.working_dir = launch.working_dir;
  task.log_path = launch.log_path;
  const auto path_entry = launch.env.find("PATH");
  const char* runner_path = getenv("PATH");
  const std::string search_path = path_entry != launch.env.end() ? path_entry->second
                                  : runner_path != nullptr       ? runner_path
                                                                 : "/usr/bin:/bin";
  Result<std::string> executable = FindExecutable(launch.argv[0], search_path);
  if (!executable.ok()) {
    // Nothing ran, so there is nothing to adopt later: the task lives in memory only.
    task.status.state = TaskState::kFailedToStart;
    task.status.reason = executable.status().message();
    task.status.end_time = task.status.start_time;
    tasks_.emplace(launch.task_id, std::move(task));
    return Status::Ok();
  }
  task.command = *executable;
  std::optional<RunAs> identity = options_.run_as;
  TaskLaunch sandboxed;
  if (options_.sandbox.has_value()) {
    sandboxed = launch;
    Result<RunAs> entered = EnterRun(sandboxed, task);
    if (entered.ok()) {
      identity = std::move(entered).value();
    }
    const Status spawned =
        entered.ok() ? Spawn(sandboxed, log.get(), task, identity) : entered.status();
    if (!spawned.ok()) {
      if (task.uid.has_value()) {
        EndRunIfUnused(task.run_dir, *task.uid);
      }
      return spawned;
    }
  } else {
    GPUFLEET_RETURN_IF_ERROR(Spawn(launch, log.get(), task, identity));
  }
  tasks_.emplace(launch.task_id, std::move(task));
  return Status::Ok();
}

namespace {

// Creates the task's checkpoint file, or takes over the one its earlier start left (a restarted
// agent), owned by the task's user and writable by it alone. Never follows a symbolic link.
Status CreateCheckpointFile(const TaskLaunch& launch, const std::optional<RunAs>& identity) {
  const UniqueFd fd(open(launch.checkpoint_path.c_str(),
                         O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY,
                         0600));
  if (!fd.valid()) {
    return InvalidArgumentError(fmt::format("checkpoint_path '{}' of task '{}' cannot be made: {}",
                                            launch.checkpoint_path, launch.task_id,
                                            ErrnoText(errno)));
  }
  struct stat info = {};
  if (fstat(fd.get(), &info) != 0 || !S_ISREG(info.st_mode)) {
    return InvalidArgumentError(fmt::format("checkpoint_path '{}' of task '{}' is not a file",
                                            launch.checkpoint_path, launch.task_id));
  }
  if (identity.has_value() && fchown(fd.get(), identity->uid, identity->gid) != 0) {
    return UnavailableError(
        fmt::format("checkpoint_path '{}' of task '{}': cannot give it to {}: {}",
                    launch.checkpoint_path, launch.task_id, identity->user, ErrnoText(errno)));
  }
  return Status::Ok();
}

}  // namespace

Status ProcessRunner::Spawn(const TaskLaunch& launch, int log_fd, Task& task,
                            const std::optional<RunAs>& identity) {
  // Everything the child needs is built here: after fork it may not allocate.
  std::vector<std::string> argv_storage = launch.argv;
  std::vector<char*> argv = NullTerminatedPointers(argv_storage);
  std::vector<std::string> env_storage = TaskEnvironment(launch, identity);
  if (!launch.checkpoint_path.empty()) {
    GPUFLEET_RETURN_IF_ERROR(CreateCheckpointFile(launch, identity));
    env_storage.push_back(fmt::format("{}={}", kCheckpointFileEnv, launch.checkpoint_path));
  }
  if (!launch.notice_path.empty()) {
    env_storage.push_back(fmt::format("{}={}", kNoticeFileEnv, launch.notice_path));
  }
  std::vector<char*> envp = NullTerminatedPointers(env_storage);
  std::vector<std::string> cgroup_join;
  std::vector<const char*> cgroup_join_pointers;
  std::string cgroup_members;
  if (options_.cgroups.has_value()) {
    const CgroupLimits limits{.cpu_milli = launch.cpu_milli,
                              .memory_bytes = launch.memory_mib * 1024 * 1024};
    Result<std::vector<std::string>> join =
        options_.cgroups->Create(CgroupName(launch.task_id), limits);
    if (!join.ok()) {
      return UnavailableError(
          fmt::format("task '{}': {}", launch.task_id, join.status().message()));
    }
    cgroup_join = std::move(join).value();
    for (const std::string& path : cgroup_join) {
      cgroup_join_pointers.push_back(path.c_str());
    }
    cgroup_join_pointers.push_back(nullptr);
    cgroup_members = options_.cgroups->MembersFile(CgroupName(launch.task_id));
  }
  const std::string exit_path = FilePath(launch.task_id, kExitSuffix);
  const std::string exit_temp_path = exit_path + std::string(os::kAtomicWriteSuffix);
  const std::string state_path = FilePath(launch.task_id, kStateSuffix);
  GPUFLEET_RETURN_IF_ERROR(RemoveIfPresent(exit_path));  // from a forgotten task of that id

  UniqueFd log(fcntl(log_fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1));
  UniqueFd null_device(open("/dev/null", O_RDONLY | O_CLOEXEC));
  int control_fds[2] = {-1, -1};
  int error_fds[2] = {-1, -1};
  // The control channel is a socket pair so that both sides can send with MSG_NOSIGNAL: a peer
  // that died early must not raise SIGPIPE.
  if (!log.valid() || !null_device.valid() ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control_fds) != 0 ||
      pipe2(error_fds, O_CLOEXEC) != 0) {
    const int error = errno;
    for (const int fd : {control_fds[0], control_fds[1], error_fds[0], error_fds[1]}) {
      if (fd >= 0) {
        close(fd);
      }
    }
    return UnavailableError(fmt::format("cannot prepare descriptors for task '{}': {}",
                                        launch.task_id, ErrnoText(error)));
  }
  UniqueFd shim_control(control_fds[0]);
  UniqueFd runner_control(control_fds[1]);
  UniqueFd error_read(error_fds[0]);
  UniqueFd error_write(error_fds[1]);
  for (UniqueFd* fd :
       {&log, &null_device, &shim_control, &runner_control, &error_read, &error_write}) {
    GPUFLEET_RETURN_IF_ERROR(MoveAboveStdio(*fd));
  }

  internal::ShimPlan plan;
  plan.executable = task.command.c_str();
  plan.argv = argv.data();
  plan.envp = envp.data();
  plan.working_dir = launch.working_dir.empty() ? nullptr : launch.working_dir.c_str();
  plan.exit_path = exit_path.c_str();
  plan.exit_temp_path = exit_temp_path.c_str();
  plan.null_fd = null_device.get();
  plan.log_fd = log.get();
  plan.control_fd = shim_control.get();
  plan.runner_control_fd = runner_control.get();
  plan.error_read_fd = error_read.get();
  plan.error_write_fd = error_write.get();
  const long open_max = sysconf(_SC_OPEN_MAX);  // NOLINT(google-runtime-int): sysconf's type
  plan.max_fd = open_max > 0 && open_max < (1 << 20) ? static_cast<int>(open_max) : (1 << 20);
  if (options_.cgroups.has_value()) {
    plan.cgroup_join_paths = cgroup_join_pointers.data();
    plan.cgroup_members_path = cgroup_members.c_str();
  }
  plan.lease_path = lease_path_.c_str();
  if (identity.has_value()) {
    plan.change_identity = true;
    plan.uid = identity->uid;
    plan.gid = identity->gid;
    plan.groups = identity->groups.data();
    plan.group_count = identity->groups.size();
  }

  const pid_t pid = fork();
  if (pid < 0) {
    return UnavailableError(
        fmt::format("cannot fork the shim of task '{}': {}", launch.task_id, ErrnoText(errno)));
  }
  if (pid == 0) {
    internal::RunShim(plan);
  }
  // The shim's ends are its own now.
  shim_control.Reset();
  error_read.Reset();
  error_write.Reset();
  log.Reset();
  null_device.Reset();
  // Both sides set the group, so Stop finds it even if the shim has not run yet.
  setpgid(pid, pid);

  // Until the shim is recorded it waits for the go byte; giving up closes the channel and the
  // shim exits without starting the task.
  auto abandon = [&](Status status) {
    runner_control.Reset();
    waitpid(pid, nullptr, 0);
    return status;
  };
  const std::optional<ProcessStat> stat = ReadProcessStat(pid);
  if (!stat.has_value()) {
    return abandon(InternalError(
        fmt::format("cannot read /proc/{}/stat of the shim of task '{}'", pid, launch.task_id)));
  }
  task.shim_pid = pid;
  task.shim_start_ticks = stat->start_ticks;
  task.spawned_here = true;
  task.status.process_group = pid;
  StateRecord record;
  record.task_id = launch.task_id;
  record.shim_pid = pid;
  record.shim_start_ticks = stat->start_ticks;
  record.boot_id = boot_id_;
  record.start_time_nanos = task.status.start_time.nanos;
  record.command = task.command;
  record.gpu_uuids = launch.gpu_uuids;
  record.log_path = launch.log_path;
  record.working_dir = launch.working_dir;
  record.enforces_lease = true;
  record.takes_notices = true;
  record.run_dir = task.run_dir;
  record.uid = task.uid;
  task.status.enforces_lease = true;
  task.takes_notices = true;
  const Status written = WriteFileAtomically(state_path, FormatStateRecord(record));
  if (!written.ok()) {
    return abandon(written);
  }
  // Wait for the shim's answer: once it has forked the task, a Stop reaches the task. A failed
  // send or an end of file means the shim is already gone; Poll then reports how.
  const char go = 'g';
  ssize_t transferred = -1;
  do {
    transferred = send(runner_control.get(), &go, 1, MSG_NOSIGNAL);
  } while (transferred < 0 && errno == EINTR);
  char started = 0;
  do {
    transferred = recv(runner_control.get(), &started, 1, 0);
  } while (transferred < 0 && errno == EINTR);
  return Status::Ok();
}

bool ProcessRunner::ShimAlive(Task& task) {
  if (task.spawned_here && !task.reaped) {
    siginfo_t info = {};
    if (waitid(P_PID, static_cast<id_t>(task.shim_pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0) {
      if (info.si_pid == 0) {
        return true;
      }
      // Normally the shim has already killed its group. If it died early (OOM killer, a stray
      // SIGKILL), the task may live on: end it, so that a final task never holds a GPU. The
      // unreaped shim still holds the pid, so the group id cannot belong to anyone else yet.
      kill(-task.shim_pid, SIGKILL);
      if (options_.cgroups.has_value()) {
        options_.cgroups->SignalAll(CgroupName(task.status.task_id), SIGKILL);
      }
      waitpid(task.shim_pid, nullptr, 0);  // returns at once: the shim has exited
      task.reaped = true;
      return false;
    }
    // ECHILD: reaped by someone else; only /proc can tell from here on.
    task.reaped = true;
  }
  const std::optional<ProcessStat> stat = ReadProcessStat(task.shim_pid);
  if (!stat.has_value() || stat->start_ticks != task.shim_start_ticks) {
    return false;  // gone, or the pid now belongs to another process
  }
  if (stat->state == 'Z' || stat->state == 'X') {
    // An unreaped shim; reap it if it is ours (a runner of this process started it).
    waitpid(task.shim_pid, nullptr, WNOHANG);
    return false;
  }
  return true;
}

Status ProcessRunner::SignalGroup(Task& task, int signal_number) {
  // An unreaped child keeps its pid, so the group cannot belong to anyone else. Otherwise the
  // start time must still match: the pid (and group id) may have been reused.
  const bool pid_is_held = task.spawned_here && !task.reaped;
  if (!pid_is_held && !ShimAlive(task)) {
    return Status::Ok();  // already over; the next Poll records it
  }
  if (kill(-task.shim_pid, signal_number) != 0 && errno != ESRCH) {
    return InternalError(fmt::format("cannot send signal {} to process group {} of task '{}': {}",
                                     signal_number, task.shim_pid, task.status.task_id,
                                     ErrnoText(errno)));
  }
  // Processes of the task that left its group (setsid) are still in its cgroup; the group's
  // members had their signal above, once.
  if (options_.cgroups.has_value()) {
    options_.cgroups->SignalAll(CgroupName(task.status.task_id), signal_number, task.shim_pid);
  }
  return Status::Ok();
}

void ProcessRunner::Finish(Task& task, MonoTime now) {
  task.status.end_time = now;
  const std::string exit_path = FilePath(task.status.task_id, kExitSuffix);
  const Result<std::optional<std::string>> text = ReadSmallFile(exit_path);
  if (!text.ok()) {
    task.status.state = TaskState::kLost;
    task.status.reason = text.status().message();
    return;
  }
  if (!text->has_value()) {
    if (task.sigkill_sent) {
      task.status.state = TaskState::kKilled;  // the SIGKILL ended the shim before it could write
      task.status.signal = SIGKILL;
      return;
    }
    task.status.state = TaskState::kLost;
    task.status.reason =
        fmt::format("its process (pid {}) is gone and left no exit status", task.shim_pid);
    return;
  }
  const std::optional<internal::ExitRecord> record = internal::ParseExitRecord(**text);
  if (!record.has_value()) {
    task.status.state = TaskState::kLost;
    task.status.reason = fmt::format("its exit file '{}' is corrupt", exit_path);
    return;
  }
  switch (record->kind) {
    case internal::ExitRecord::Kind::kExited:
      task.status.state = TaskState::kExited;
      task.status.exit_code = record->value;
      return;
    case internal::ExitRecord::Kind::kSignaled:
      task.status.state = TaskState::kKilled;
      task.status.signal = record->value;
      return;
    case internal::ExitRecord::Kind::kStartFailed:
      task.status.state = TaskState::kFailedToStart;
      task.status.reason = StartFailureReason(*record, task.command, task.working_dir);
      return;
  }
}

void ProcessRunner::Refresh(Task& task, MonoTime now) {
  if (IsFinal(task.status.state)) {
    return;
  }
  if (!ShimAlive(task)) {
    Finish(task, now);
    return;
  }
  if (task.kill_deadline.has_value() && now >= *task.kill_deadline && !task.sigkill_sent) {
    // Poll cannot return an error; a failed SIGKILL is simply tried again next time.
    task.sigkill_sent = SignalGroup(task, SIGKILL).ok();
  }
}

Status ProcessRunner::Stop(std::string_view task_id, Duration grace) {
  GPUFLEET_RETURN_IF_ERROR(internal::CheckStopGrace(task_id, grace));
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const auto it, internal::FindTask(tasks_, task_id));
  Task& task = it->second;
  const MonoTime now = clock_.Now();
  Refresh(task, now);
  if (IsFinal(task.status.state)) {
    return Status::Ok();
  }
  switch (internal::RecordStop(task, now, grace)) {
    case internal::DueSignal::kKill:
      GPUFLEET_RETURN_IF_ERROR(SignalGroup(task, SIGKILL));
      task.sigkill_sent = true;
      break;
    case internal::DueSignal::kTerm:
      GPUFLEET_RETURN_IF_ERROR(SignalGroup(task, SIGTERM));
      task.sigterm_sent = true;
      break;
    case internal::DueSignal::kNone:
      break;
  }
  return Status::Ok();
}

Status ProcessRunner::SendNotice(std::string_view task_id, std::string_view signal_name) {
  GPUFLEET_ASSIGN_OR_RETURN(const int signal_number, internal::NoticeSignal(task_id, signal_name));
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(const auto it, internal::FindTask(tasks_, task_id));
  Task& task = it->second;
  Refresh(task, clock_.Now());
  if (IsFinal(task.status.state)) {
    return Status::Ok();
  }
  if (!task.takes_notices) {
    return FailedPreconditionError(fmt::format(
        "task '{}' was started by an older runner whose shim a notice's signal would end; it "
        "gets no notice",
        task_id));
  }
  GPUFLEET_RETURN_IF_ERROR(SignalGroup(task, signal_number));
  task.status.notices.emplace_back(signal_name);
  return Status::Ok();
}

std::vector<TaskStatus> ProcessRunner::Poll() {
  std::lock_guard<std::mutex> lock(mu_);
  const MonoTime now = clock_.Now();
  std::erase_if(cgroups_to_remove_,
                [&](const std::string& cgroup) { return options_.cgroups->Remove(cgroup).ok(); });
  ReleaseEndedRuns();
  return internal::UpdatedStatuses(tasks_, [&](Task& task) { Refresh(task, now); });
}

Status ProcessRunner::Forget(std::string_view task_id) {
  std::lock_guard<std::mutex> lock(mu_);
  GPUFLEET_ASSIGN_OR_RETURN(
      const auto it,
      internal::FindEndedTask(tasks_, task_id, [&](Task& task) { Refresh(task, clock_.Now()); }));
  if (options_.cgroups.has_value()) {
    // The shim emptied it when the task ended; a process that got in since is killed here, and
    // the cgroup removed by a later Poll once that process is gone.
    std::string cgroup = CgroupName(task_id);
    const Status removed = options_.cgroups->Remove(cgroup);
    if (removed.code() == StatusCode::kFailedPrecondition) {
      options_.cgroups->SignalAll(cgroup, SIGKILL);
      cgroups_to_remove_.push_back(std::move(cgroup));
    } else {
      GPUFLEET_RETURN_IF_ERROR(removed);
    }
  }
  // The state file first: if the agent dies in between, Open deletes the stray exit file.
  GPUFLEET_RETURN_IF_ERROR(RemoveIfPresent(FilePath(task_id, kStateSuffix)));
  GPUFLEET_RETURN_IF_ERROR(RemoveIfPresent(FilePath(task_id, kExitSuffix)));
  const std::string run_dir = it->second.run_dir;
  const std::optional<uid_t> uid = it->second.uid;
  tasks_.erase(it);
  if (uid.has_value()) {
    EndRunIfUnused(run_dir, *uid);
  }
  return Status::Ok();
}

Status ProcessRunner::RenewLease(Duration fence_in, Duration grace) {
  GPUFLEET_RETURN_IF_ERROR(internal::CheckLease(fence_in, grace));
  std::lock_guard<std::mutex> lock(mu_);  // one writer of the lease file's temporary
  const internal::Lease lease{
      .deadline_nanos = internal::MonotonicNanos() + std::chrono::nanoseconds(fence_in).count(),
      .grace_nanos = std::chrono::nanoseconds(grace).count()};
  return WriteFileAtomically(lease_path_, internal::FormatLease(lease));
}

}  // namespace gpufleet::runner
