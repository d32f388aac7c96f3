// SPDX-License-Identifier: Apache-2.0
// Everything above ParseExitRecord runs in a forked child: async-signal-safe calls only (no
// malloc, no stdio, no locks), errno saved before it can change, every loop bounded by EINTR.
#include "gpufleet/runner/internal/shim.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <charconv>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace gpufleet::runner::internal {
namespace {

// The shim's own exit code when the runner gave up before the task was started.
constexpr int kAbortedExitCode = 125;
// The task's exit code when it could not reach execve (the report on the pipe says why).
constexpr int kStartFailedExitCode = 127;

// Closes descriptors first..last (inclusive).
void CloseRange(unsigned first, unsigned last, int max_fd) {
  if (first > last) {
    return;
  }
  if (close_range(first, last, 0) == 0) {
    return;
  }
  // Kernels before 5.9 have no close_range: close one by one up to the descriptor limit.
  for (unsigned fd = first; fd <= last && fd <= static_cast<unsigned>(max_fd); ++fd) {
    close(static_cast<int>(fd));
  }
}

// Closes every descriptor >= 3 but the ones the shim keeps, so that it holds none of the
// runner's sockets or files (a restarted agent must be able to bind its port again).
void CloseInheritedDescriptors(const ShimPlan& plan) {
  int keep[] = {plan.null_fd, plan.log_fd, plan.control_fd, plan.error_read_fd,
                plan.error_write_fd};
  constexpr int kKeepCount = sizeof(keep) / sizeof(keep[0]);
  for (int i = 1; i < kKeepCount; ++i) {  // insertion sort: no library call needed
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; --j) {
      const int swapped = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = swapped;
    }
  }
  unsigned next = 3;
  for (const int fd : keep) {
    if (static_cast<unsigned>(fd) > next) {
      CloseRange(next, static_cast<unsigned>(fd) - 1, plan.max_fd);
    }
    next = static_cast<unsigned>(fd) + 1;
  }
  CloseRange(next, ~0U, plan.max_fd);
}

void SetDisposition(int signal_number, void (*handler)(int)) {
  struct sigaction action = {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  sigaction(signal_number, &action, nullptr);
}

void ResetAllSignalDispositions() {
  for (int signal_number = 1; signal_number < NSIG; ++signal_number) {
    SetDisposition(signal_number, SIG_DFL);  // fails harmlessly for SIGKILL, SIGSTOP
  }
}

void UnblockAllSignals() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Reads up to `size` bytes, stopping early only at end of file; returns the count or -1.
ssize_t ReadFully(int fd, void* buffer, size_t size) {
  auto* out = static_cast<char*>(buffer);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = read(fd, out + done, size - done);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return -1;
    }
    if (n == 0) {
      break;
    }
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(done);
}

void WriteFully(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t n = write(fd, data, size);
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      return;
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

// A fixed buffer that text and decimal numbers are appended to, without allocation.
class LineBuffer {
 public:
  void Append(std::string_view text) {
    for (const char c : text) {
      if (size_ < sizeof(data_)) {
        data_[size_++] = c;
      }
    }
  }
  void AppendNumber(int value) {
    char digits[16];
    const auto [end, error] = std::to_chars(digits, digits + sizeof(digits), value);
    if (error == std::errc()) {
      Append(std::string_view(digits, static_cast<size_t>(end - digits)));
    }
  }
  const char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  char data_[64] = {};
  size_t size_ = 0;
};

// Sends `signal_number` to every process listed in the task's cgroup but the shim, and with
// `skip_own_group` but those of the shim's process group (a group signal reaches them). Returns
// how many it signalled.
int SignalCgroupMembers(const char* members_path, int signal_number, bool skip_own_group) {
  const int fd = open(members_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return 0;
  }
  int found = 0;
  int64_t pid = 0;
  bool in_number = false;
  const auto signal_pid = [&] {
    if (in_number && pid > 1 && pid != getpid() &&
        !(skip_own_group && getpgid(static_cast<pid_t>(pid)) == getpgrp())) {
      kill(static_cast<pid_t>(pid), signal_number);
      ++found;
    }
    pid = 0;
    in_number = false;
  };
  char buffer[512];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n <= 0) {
      break;
    }
    for (ssize_t i = 0; i < n; ++i) {
      if (buffer[i] >= '0' && buffer[i] <= '9') {
        pid = pid * 10 + (buffer[i] - '0');
        in_number = true;
      } else {
        signal_pid();
      }
    }
  }
  signal_pid();
  close(fd);
  return found;
}

// SIGKILL to every process in the task's cgroup until it is empty (bounded: a process forking
// as fast as it is killed is held by its cgroup's pids limit, not here).
void KillCgroupMembers(const char* members_path) {
  if (members_path == nullptr) {
    return;
  }
  for (int round = 0; round < 200; ++round) {
    if (SignalCgroupMembers(members_path, SIGKILL, /*skip_own_group=*/false) == 0) {
      return;
    }
    const timespec pause = {0, 5'000'000};
    nanosleep(&pause, nullptr);
  }
}

// The lease as its file says now; nullopt without a path, a file or a well-formed line.
std::optional<Lease> ReadLease(const char* path) {
  if (path == nullptr) {
    return std::nullopt;
  }
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return std::nullopt;
  }
  char buffer[64];
  const ssize_t n = ReadFully(fd, buffer, sizeof(buffer));
  close(fd);
  if (n <= 0) {
    return std::nullopt;
  }
  return ParseLease(std::string_view(buffer, static_cast<size_t>(n)));
}

// Waits for the task; if the lease runs out first, stops it as the runner's Stop would: SIGTERM
// to the group (the shim ignores it) and to the cgroup's members outside the group at the
// deadline, SIGKILL to the task and its cgroup once the grace has passed since (whatever else is
// left in the group dies with the shim after the record). The shim looks at least every
// kLeaseCheckPeriodNanos and wakes at a deadline it has read, so a SIGTERM comes late only when
// the lease was shortened since the last look; the task still gets its whole grace (the agent's
// fencing margin leaves room for both before the server frees the GPUs). SIGCHLD is blocked, so
// sigtimedwait wakes the shim when the task ends. Returns what waitpid returned.
pid_t WaitForTask(const ShimPlan& plan, pid_t task, int& wait_status) {
  sigset_t child_ended;
  sigemptyset(&child_ended);
  sigaddset(&child_ended, SIGCHLD);
  bool sigterm_sent = false;
  bool sigkill_sent = false;
  int64_t kill_at = 0;
  for (;;) {
    const pid_t waited = waitpid(task, &wait_status, plan.lease_path == nullptr ? 0 : WNOHANG);
    if (waited < 0 && errno == EINTR) {
      continue;
    }
    if (waited != 0) {
      return waited;
    }
    const int64_t now = MonotonicNanos();
    int64_t wait_nanos = kLeaseCheckPeriodNanos;
    if (!sigterm_sent) {
      const std::optional<Lease> lease = ReadLease(plan.lease_path);
      if (lease.has_value() && now < lease->deadline_nanos &&
          lease->deadline_nanos - now < wait_nanos) {
        wait_nanos = lease->deadline_nanos - now;
      }
      if (lease.has_value() && now >= lease->deadline_nanos) {
        // The group only if it is the shim's own: were setpgid to have failed, it would be the
        // agent's.
        kill(getpgrp() == getpid() ? 0 : task, SIGTERM);
        if (plan.cgroup_members_path != nullptr) {
          SignalCgroupMembers(plan.cgroup_members_path, SIGTERM, /*skip_own_group=*/true);
        }
        sigterm_sent = true;
        kill_at = now + lease->grace_nanos;
      }
    }
    if (sigterm_sent && !sigkill_sent && now >= kill_at) {
      kill(task, SIGKILL);
      KillCgroupMembers(plan.cgroup_members_path);
      sigkill_sent = true;
    }
    if (sigterm_sent && !sigkill_sent && kill_at - now < wait_nanos) {
      wait_nanos = kill_at - now;
    }
    const timespec timeout = {static_cast<time_t>(wait_nanos / 1'000'000'000),
                              static_cast<long>(wait_nanos % 1'000'000'000)};  // NOLINT
    sigtimedwait(&child_ended, nullptr, &timeout);
  }
}

// Kills the task's cgroup, then the shim's process group, the shim included. The group only if
// it is the shim's own: were setpgid to have failed, the group would be the agent's.
[[noreturn]] void EndProcessGroup(const ShimPlan& plan) {
  KillCgroupMembers(plan.cgroup_members_path);
  if (getpgrp() == getpid()) {
    kill(0, SIGKILL);
  }
  _exit(kAbortedExitCode);
}

// Writes the record next to its final name and renames it there, so that a reader sees the
// whole line or nothing. No fsync: the file only has to survive the agent, not the node (tasks
// do not survive a reboot, which the runner detects through the boot id).
[[noreturn]] void RecordAndEnd(const ShimPlan& plan, const LineBuffer& line) {
  const int fd = open(plan.exit_temp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd >= 0) {
    WriteFully(fd, line.data(), line.size());
    close(fd);
    rename(plan.exit_temp_path, plan.exit_path);
  }
  EndProcessGroup(plan);
}

[[noreturn]] void RecordStartFailure(const ShimPlan& plan, int stage, int error) {
  LineBuffer line;
  line.Append("start-failed ");
  line.AppendNumber(stage);
  line.Append(" ");
  line.AppendNumber(error);
  line.Append("\n");
  RecordAndEnd(plan, line);
}

[[noreturn]] void ReportStartFailure(const ShimPlan& plan, StartStage stage, int error) {
  const int report[2] = {static_cast<int>(stage), error};
  WriteFully(plan.error_write_fd, reinterpret_cast<const char*>(report), sizeof(report));
  _exit(kStartFailedExitCode);
}

// The task's side of the second fork: default signal handling (dispositions the shim or the
// agent set to "ignore" would otherwise survive execve), stdio, working directory, execve.
[[noreturn]] void RunTask(const ShimPlan& plan) {
  ResetAllSignalDispositions();
  UnblockAllSignals();
  if (dup2(plan.null_fd, STDIN_FILENO) < 0 || dup2(plan.log_fd, STDOUT_FILENO) < 0 ||
      dup2(plan.log_fd, STDERR_FILENO) < 0) {
    ReportStartFailure(plan, StartStage::kSetup, errno);
  }
  if (plan.cgroup_join_paths != nullptr) {
    for (const char* const* path = plan.cgroup_join_paths; *path != nullptr; ++path) {
      const int fd = open(*path, O_WRONLY | O_CLOEXEC);
      if (fd < 0 || write(fd, "0", 1) != 1) {
        ReportStartFailure(plan, StartStage::kCgroup, errno);
      }
      close(fd);
    }
  }
  if (plan.change_identity && (setgroups(plan.group_count, plan.groups) != 0 ||
                               setgid(plan.gid) != 0 || setuid(plan.uid) != 0)) {
    ReportStartFailure(plan, StartStage::kIdentity, errno);
  }
  if (plan.working_dir != nullptr && chdir(plan.working_dir) != 0) {
    ReportStartFailure(plan, StartStage::kChdir, errno);
  }
  execve(plan.executable, plan.argv, plan.envp);
  ReportStartFailure(plan, StartStage::kExec, errno);
}

}  // namespace

void RunShim(const ShimPlan& plan) {
  setpgid(0, 0);
  // The agent's signal handlers must not run here (they were written for the agent, not for an
  // async-signal-safe child), and SIGCHLD must not be ignored, or the kernel would reap the task
  // before waitpid sees it.
  ResetAllSignalDispositions();
  // The shim must outlive the task to record its end: a SIGTERM meant for the group (Stop), a
  // preemption notice's signal (SendNotice; core's NoticeSignalNumber lists them, the others
  // are ignored by default) or a terminal's SIGINT/SIGHUP must not end it. SIGKILL still does.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (const int signal_number : {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM}) {
    SetDisposition(signal_number, SIG_IGN);
    sigaddset(&stop_signals, signal_number);
  }
  // SIGCHLD blocked too (its disposition stays the default): WaitForTask takes it with
  // sigtimedwait.
  sigaddset(&stop_signals, SIGCHLD);
  sigprocmask(SIG_SETMASK, &stop_signals, nullptr);
  close(plan.runner_control_fd);
  CloseInheritedDescriptors(plan);
  dup2(plan.null_fd, STDIN_FILENO);
  dup2(plan.null_fd, STDOUT_FILENO);
  dup2(plan.null_fd, STDERR_FILENO);
  prctl(PR_SET_NAME, "gpufleet-shim", 0, 0, 0);

  char go = 0;
  if (ReadFully(plan.control_fd, &go, 1) != 1) {
    _exit(kAbortedExitCode);
  }

  const pid_t task = fork();
  if (task < 0) {
    RecordStartFailure(plan, static_cast<int>(StartStage::kFork), errno);
  }
  if (task == 0) {
    RunTask(plan);
  }
  const char started = 's';
  while (send(plan.control_fd, &started, 1, MSG_NOSIGNAL) < 0 && errno == EINTR) {
  }
  close(plan.control_fd);
  close(plan.error_write_fd);
  close(plan.log_fd);
  close(plan.null_fd);

  // End of file without a report: execve succeeded and closed the task's end of the pipe.
  int report[2] = {0, 0};
  const ssize_t reported = ReadFully(plan.error_read_fd, report, sizeof(report));
  close(plan.error_read_fd);
  int wait_status = 0;
  const pid_t waited = WaitForTask(plan, task, wait_status);

  if (reported == static_cast<ssize_t>(sizeof(report))) {
    RecordStartFailure(plan, report[0], report[1]);
  }
  LineBuffer line;
  if (waited == task && WIFEXITED(wait_status)) {
    line.Append("exited ");
    line.AppendNumber(WEXITSTATUS(wait_status));
    line.Append("\n");
  } else if (waited == task && WIFSIGNALED(wait_status)) {
    line.Append("signaled ");
    line.AppendNumber(WTERMSIG(wait_status));
    line.Append("\n");
  } else {
    // Cannot happen with SIGCHLD at its default; without a record the runner reports it lost.
    EndProcessGroup(plan);
  }
  RecordAndEnd(plan, line);
}

int64_t MonotonicNanos() {
  timespec now = {};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t{now.tv_sec} * 1'000'000'000 + now.tv_nsec;
}

std::string FormatLease(const Lease& lease) {
  return std::to_string(lease.deadline_nanos) + " " + std::to_string(lease.grace_nanos) + "\n";
}

namespace {

// A record line, "FIRST REST\n", as (FIRST, REST); nullopt without the newline or the space.
std::optional<std::pair<std::string_view, std::string_view>> SplitRecordLine(
    std::string_view text) {
  if (text.empty() || text.back() != '\n') {
    return std::nullopt;
  }
  text.remove_suffix(1);
  const size_t space = text.find(' ');
  if (space == std::string_view::npos) {
    return std::nullopt;
  }
  return std::make_pair(text.substr(0, space), text.substr(space + 1));
}

// The whole of `digits` as a decimal number.
template <typename Number>
bool ParseWholeNumber(std::string_view digits, Number& out) {
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
  return !digits.empty() && error == std::errc() && end == digits.data() + digits.size();
}

}  // namespace

std::optional<Lease> ParseLease(std::string_view text) {
  const auto fields = SplitRecordLine(text);
  Lease lease;
  if (!fields || !ParseWholeNumber(fields->first, lease.deadline_nanos) ||
      !ParseWholeNumber(fields->second, lease.grace_nanos) || lease.grace_nanos < 0) {
    return std::nullopt;
  }
  return lease;
}

std::optional<ExitRecord> ParseExitRecord(std::string_view text) {
  const auto fields = SplitRecordLine(text);
  if (!fields) {
    return std::nullopt;
  }
  const std::string_view word = fields->first;
  std::string_view rest = fields->second;
  auto take_number = [&rest](int& out) {
    const size_t end_of_number = rest.find(' ');
    const std::string_view digits = rest.substr(0, end_of_number);
    rest = end_of_number == std::string_view::npos ? std::string_view()
                                                   : rest.substr(end_of_number + 1);
    return ParseWholeNumber(digits, out);
  };
  ExitRecord record;
  if (word == "exited" || word == "signaled") {
    record.kind = word == "exited" ? ExitRecord::Kind::kExited : ExitRecord::Kind::kSignaled;
    if (!take_number(record.value) || !rest.empty()) {
      return std::nullopt;
    }
    return record;
  }
  if (word == "start-failed") {
    int stage = 0;
    record.kind = ExitRecord::Kind::kStartFailed;
    if (!take_number(stage) || !take_number(record.value) || !rest.empty() ||
        stage < static_cast<int>(StartStage::kSetup) ||
        stage > static_cast<int>(StartStage::kIdentity)) {
      return std::nullopt;
    }
    record.stage = static_cast<StartStage>(stage);
    return record;
  }
  return std::nullopt;
}

}  // namespace gpufleet::runner::internal
