// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/testing/server_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <regex>

#include <fmt/core.h>

extern char** environ;  // NOLINT(readability-redundant-declaration): POSIX leaves it undeclared

namespace gpufleet::api_testing {

ServerProcess::ServerProcess(pid_t pid, int output_fd)
    : pid_(pid), output_fd_(output_fd), drainer_([this] { Drain(); }) {}

Result<std::unique_ptr<ServerProcess>> ServerProcess::Start(const std::string& binary,
                                                            const std::vector<std::string>& args,
                                                            std::chrono::milliseconds timeout) {
  std::array<int, 2> pipe_fds{};
  if (pipe2(pipe_fds.data(), O_CLOEXEC) != 0) {
    return InternalError(fmt::format("pipe: {}", std::strerror(errno)));  // NOLINT
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, pipe_fds[1], STDERR_FILENO);
  std::vector<std::string> argv_text = {binary, "server"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_text) {
    argv.push_back(arg.data());
  }
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(pipe_fds[1]);
  if (spawned != 0) {
    close(pipe_fds[0]);
    return InternalError(fmt::format("spawning {}: {}", binary, std::strerror(spawned)));  // NOLINT
  }
  auto process = std::unique_ptr<ServerProcess>(new ServerProcess(pid, pipe_fds[0]));
  static const std::regex kListening("listening on https?://[^ ]*:([0-9]+)");
  std::unique_lock<std::mutex> lock(process->mu_);
  std::smatch match;
  const bool listening = process->output_cv_.wait_for(lock, timeout, [&] {
    return std::regex_search(process->output_, match, kListening) || process->closed_;
  });
  if (!listening || match.empty()) {
    const std::string output = process->output_;
    lock.unlock();
    process->KillAndWait(SIGKILL);
    return UnavailableError(fmt::format("{} server did not start listening: {}", binary, output));
  }
  process->port_ = std::stoi(match[1].str());
  return process;
}

ServerProcess::~ServerProcess() {
  KillAndWait(SIGKILL);
  if (drainer_.joinable()) {
    drainer_.join();
  }
  close(output_fd_);
}

int ServerProcess::KillAndWait(int signal) {
  if (reaped_) {
    return wait_status_;
  }
  kill(pid_, signal);
  while (waitpid(pid_, &wait_status_, 0) < 0 && errno == EINTR) {
  }
  reaped_ = true;
  return wait_status_;
}

std::string ServerProcess::output() const {
  std::lock_guard<std::mutex> lock(mu_);
  return output_;
}

void ServerProcess::Drain() {
  std::array<char, 4096> buffer{};
  while (true) {
    const ssize_t n = read(output_fd_, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (n <= 0) {
      closed_ = true;
      output_cv_.notify_all();
      return;
    }
    output_.append(buffer.data(), static_cast<size_t>(n));
    output_cv_.notify_all();
  }
}

}  // namespace gpufleet::api_testing
