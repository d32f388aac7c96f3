// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/os/command.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/os/files.h"

namespace gpufleet::os {
namespace {

void CloseIfOpen(int& fd) {
  if (fd >= 0) {
    close(fd);
    fd = -1;
  }
}

// Appends what can be read from `fd` now; false at end of file or on an error.
bool Drain(int fd, std::string& out) {
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0 && errno == EAGAIN) {
      return true;
    }
    if (n <= 0) {
      return false;
    }
    out.append(buffer, static_cast<size_t>(n));
    if (out.size() > kMaxCapturedBytes) {
      out.erase(0, out.size() - kMaxCapturedBytes);
    }
  }
}

int ExitCodeOf(int wait_status) {
  return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
}

}  // namespace

std::string LastLine(std::string_view text) {
  while (!text.empty()) {
    const size_t newline = text.find_last_of('\n');
    std::string_view line = newline == std::string_view::npos ? text : text.substr(newline + 1);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(0, newline);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) {
      line.remove_suffix(1);
    }
    while (!line.empty() && line.front() == ' ') {
      line.remove_prefix(1);
    }
    if (!line.empty()) {
      return std::string(line);
    }
  }
  return "";
}

Result<CommandOutcome> RunCommand(const CommandSpec& spec, const Clock& clock) {
  if (spec.argv.empty()) {
    return InvalidArgumentError("a command needs a program");
  }
  // Everything the child needs is built before fork: after it, the child may not allocate.
  std::vector<std::string> argv_storage = spec.argv;
  std::vector<char*> argv;
  for (std::string& arg : argv_storage) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  std::vector<std::string> env_storage = spec.env;
  std::vector<char*> envp;
  for (std::string& entry : env_storage) {
    envp.push_back(entry.data());
  }
  envp.push_back(nullptr);
  std::string search_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  if (const char* path = getenv("PATH"); path != nullptr) {
    search_path = path;
  }

  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  const bool capture = spec.output_fd < 0;
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0 ||
      (capture && (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0))) {
    const int error = errno;
    for (int* fd : {&out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1]}) {
      CloseIfOpen(*fd);
    }
    if (null_fd >= 0) {
      close(null_fd);
    }
    return UnavailableError(
        fmt::format("cannot prepare pipes for '{}': {}", spec.argv[0], ErrnoText(error)));
  }
  const int stdout_target = capture ? out_pipe[1] : spec.output_fd;
  const int stderr_target = capture ? err_pipe[1] : spec.output_fd;

  const pid_t pid = fork();
  if (pid < 0) {
    const int error = errno;
    close(null_fd);
    for (int* fd : {&out_pipe[0], &out_pipe[1], &err_pipe[0], &err_pipe[1]}) {
      CloseIfOpen(*fd);
    }
    return UnavailableError(fmt::format("cannot fork '{}': {}", spec.argv[0], ErrnoText(error)));
  }
  if (pid == 0) {
    // The child: async-signal-safe calls only. dup2 clears close-on-exec on the copies.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (dup2(null_fd, STDIN_FILENO) < 0 || dup2(stdout_target, STDOUT_FILENO) < 0 ||
        dup2(stderr_target, STDERR_FILENO) < 0) {
      _exit(126);
    }
    for (const int fd : spec.inherited_fds) {
      const int flags = fcntl(fd, F_GETFD);
      if (flags < 0 || fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0) {
        _exit(126);
      }
    }
    if (strchr(argv[0], '/') != nullptr) {
      execve(argv[0], argv.data(), envp.data());
    } else {
      execvpe(argv[0], argv.data(), envp.data());
    }
    static constexpr char kNotFound[] = "cannot execute the program\n";
    [[maybe_unused]] const ssize_t ignored = write(STDERR_FILENO, kNotFound, sizeof(kNotFound) - 1);
    _exit(127);
  }
  close(null_fd);
  CloseIfOpen(out_pipe[1]);
  CloseIfOpen(err_pipe[1]);
  // A pidfd becomes readable when the child exits, whether or not the pipes are still held open
  // by a grandchild (podman's conmon).
  const int pid_fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  CommandOutcome outcome;
  const MonoTime deadline = clock.Now() + spec.timeout;
  for (int* fd : {&out_pipe[0], &err_pipe[0]}) {
    if (*fd >= 0) {
      fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
    }
  }
  int wait_status = 0;
  bool exited = false;
  while (!exited) {
    const Duration left = deadline - clock.Now();
    if (left <= Duration::zero()) {
      kill(pid, SIGKILL);
      outcome.timed_out = true;
      break;
    }
    pollfd fds[3] = {{pid_fd, POLLIN, 0}, {out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
    // Without a pidfd (kernels before 5.3) the child's end is checked every 50 ms.
    const int64_t left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count();
    const int wait_ms = static_cast<int>(std::clamp<int64_t>(left_ms, 1, pid_fd >= 0 ? 1000 : 50));
    if (poll(fds, 3, wait_ms) < 0 && errno != EINTR) {
      kill(pid, SIGKILL);
      break;
    }
    if (fds[1].revents != 0 && !Drain(out_pipe[0], outcome.output)) {
      CloseIfOpen(out_pipe[0]);
    }
    if (fds[2].revents != 0 && !Drain(err_pipe[0], outcome.errors)) {
      CloseIfOpen(err_pipe[0]);
    }
    const pid_t waited = waitpid(pid, &wait_status, WNOHANG);
    exited = waited == pid;
  }
  if (!exited) {
    waitpid(pid, &wait_status, 0);
  }
  // What the program wrote before it ended; a grandchild that holds the pipes is not waited for.
  if (out_pipe[0] >= 0) {
    Drain(out_pipe[0], outcome.output);
  }
  if (err_pipe[0] >= 0) {
    Drain(err_pipe[0], outcome.errors);
  }
  for (int* fd : {&out_pipe[0], &err_pipe[0]}) {
    CloseIfOpen(*fd);
  }
  if (pid_fd >= 0) {
    close(pid_fd);
  }
  outcome.exit_code = outcome.timed_out ? -1 : ExitCodeOf(wait_status);
  return outcome;
}

}  // namespace gpufleet::os
