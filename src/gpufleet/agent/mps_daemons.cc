// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/mps_daemons.h"

#include <fcntl.h>
#include <signal.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/os/command.h"
#include "gpufleet/os/files.h"

namespace gpufleet::agent {
namespace {

// A GPU UUID names a directory: letters, digits and '-' only ("GPU-8932f937-...").
bool IsPlainUuid(const std::string& uuid) {
  return !uuid.empty() && uuid.find_first_not_of(
                              "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuv"
                              "wxyz0123456789-") == std::string::npos;
}

std::optional<int> ParsePid(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) {
    text.remove_suffix(1);
  }
  int pid = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), pid);
  if (error != std::errc() || end != text.data() + text.size() || pid <= 1) {
    return std::nullopt;
  }
  return pid;
}

}  // namespace

MpsDaemons::MpsDaemons(MpsDaemonOptions options, const Clock& clock)
    : options_(std::move(options)), clock_(clock) {}

std::string MpsDaemons::PipeDirectory(const std::string& gpu_uuid) const {
  return fmt::format("{}/{}/pipe", options_.state_dir, gpu_uuid);
}

std::string MpsDaemons::LogDirectory(const std::string& gpu_uuid) const {
  return fmt::format("{}/{}/log", options_.state_dir, gpu_uuid);
}

std::vector<std::string> MpsDaemons::ControlEnvironment(const std::string& gpu_uuid) const {
  const char* path = std::getenv("PATH");
  return {fmt::format("PATH={}", path != nullptr ? path : "/usr/bin:/bin"),
          fmt::format("{}={}", runner::kCudaVisibleDevicesEnv, gpu_uuid),
          fmt::format("{}={}", runner::kMpsPipeDirectoryEnv, PipeDirectory(gpu_uuid)),
          fmt::format("CUDA_MPS_LOG_DIRECTORY={}", LogDirectory(gpu_uuid))};
}

int MpsDaemons::LiveDaemonPid(const std::string& gpu_uuid) const {
  const Result<std::optional<std::string>> text =
      os::ReadSmallFile(fmt::format("{}/{}", PipeDirectory(gpu_uuid), kMpsPidFile));
  if (!text.ok() || !text->has_value()) {
    return 0;
  }
  const std::optional<int> pid = ParsePid(**text);
  if (!pid || (kill(*pid, 0) != 0 && errno != EPERM)) {
    return 0;
  }
  // A reused pid is some other program, and a daemon that died but was not reaped yet has no
  // command line: neither is the daemon.
  const Result<std::optional<std::string>> cmdline =
      os::ReadSmallFile(fmt::format("/proc/{}/cmdline", *pid));
  const std::string program = std::filesystem::path(options_.control_program).filename().string();
  if (!cmdline.ok() || !cmdline->has_value() || (*cmdline)->find(program) == std::string::npos) {
    return 0;
  }
  return *pid;
}

Status MpsDaemons::Adopt() {
  if (options_.state_dir.empty()) {
    return Status::Ok();
  }
  std::error_code error;
  std::filesystem::directory_iterator entries(options_.state_dir, error);
  if (error == std::errc::no_such_file_or_directory) {
    return Status::Ok();
  }
  if (error) {
    return UnavailableError(
        fmt::format("MPS state directory {}: {}", options_.state_dir, error.message()));
  }
  for (const std::filesystem::directory_entry& entry : entries) {
    const std::string uuid = entry.path().filename().string();
    if (!IsPlainUuid(uuid) || daemons_.contains(uuid)) {
      continue;
    }
    if (const int pid = LiveDaemonPid(uuid); pid > 0) {
      daemons_[uuid] = Daemon{pid, State::kRunning, {}};
    } else {
      // Pipes and a pid file a dead daemon left would stand in the way of the next one.
      std::filesystem::remove_all(PipeDirectory(uuid), error);
    }
  }
  return Status::Ok();
}

Result<std::string> MpsDaemons::EnsureRunning(const std::string& gpu_uuid) {
  if (options_.state_dir.empty()) {
    return FailedPreconditionError("this agent runs no MPS daemons (no MPS state directory)");
  }
  if (!IsPlainUuid(gpu_uuid)) {
    return FailedPreconditionError(
        fmt::format("GPU UUID \"{}\" cannot name an MPS directory", gpu_uuid));
  }
  const std::string pipes = PipeDirectory(gpu_uuid);
  const MonoTime now = clock_.Now();
  if (const auto known = daemons_.find(gpu_uuid); known != daemons_.end()) {
    Daemon& daemon = known->second;
    if (daemon.state == State::kQuitting) {
      return UnavailableError(fmt::format(
          "the MPS daemon of {} is quitting; a new one starts once it is gone", gpu_uuid));
    }
    if (daemon.state == State::kStarting) {
      // -d returned once it had forked the daemon, which writes its pid file soon after: the
      // agent's next pass looks again rather than this one waiting.
      if (const int pid = LiveDaemonPid(gpu_uuid); pid > 0) {
        daemon = Daemon{pid, State::kRunning, now};
        return pipes;
      }
      if (now - daemon.since <= options_.start_wait) {
        return UnavailableError(
            fmt::format("the MPS daemon of {} is starting (no pid file yet)", gpu_uuid));
      }
      daemons_.erase(known);
      return UnavailableError(fmt::format(
          "the MPS daemon of {} wrote no pid file in {} ms", gpu_uuid,
          std::chrono::duration_cast<std::chrono::milliseconds>(options_.start_wait).count()));
    }
    if (LiveDaemonPid(gpu_uuid) == daemon.pid) {
      return pipes;
    }
    daemons_.erase(known);  // it died: start another
  }
  // One that runs but is not known (Adopt not called yet) is taken, never started twice.
  if (const int pid = LiveDaemonPid(gpu_uuid); pid > 0) {
    daemons_[gpu_uuid] = Daemon{pid, State::kRunning, now};
    return pipes;
  }
  const std::string logs = LogDirectory(gpu_uuid);
  std::error_code error;
  std::filesystem::remove_all(pipes, error);
  std::filesystem::create_directories(pipes, error);
  if (!error) {
    std::filesystem::create_directories(logs, error);
  }
  if (error) {
    return FailedPreconditionError(
        fmt::format("MPS directories of {}: {}", gpu_uuid, error.message()));
  }
  // The daemon keeps its parent's stdout and stderr: a file, not a pipe RunCommand would wait on.
  const std::string output_path = logs + "/control-program.log";
  const os::UniqueFd output(
      open(output_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!output.valid()) {
    return FailedPreconditionError(fmt::format("{}: {}", output_path, os::ErrnoText(errno)));
  }
  os::CommandSpec spec;
  spec.argv = {options_.control_program, "-d"};
  spec.env = ControlEnvironment(gpu_uuid);
  spec.output_fd = output.get();
  spec.timeout = options_.command_timeout;
  GPUFLEET_ASSIGN_OR_RETURN(const os::CommandOutcome outcome, os::RunCommand(spec, clock_));
  if (outcome.exit_code != 0) {
    const Result<std::optional<std::string>> said = os::ReadSmallFile(output_path);
    return FailedPreconditionError(fmt::format(
        "{} -d for {} {}: {}", options_.control_program, gpu_uuid,
        outcome.timed_out ? "timed out" : fmt::format("exited with {}", outcome.exit_code),
        said.ok() && said->has_value() ? os::LastLine(**said) : ""));
  }
  if (const int pid = LiveDaemonPid(gpu_uuid); pid > 0) {
    daemons_[gpu_uuid] = Daemon{pid, State::kRunning, now};
    return pipes;
  }
  daemons_[gpu_uuid] = Daemon{0, State::kStarting, now};
  return UnavailableError(
      fmt::format("the MPS daemon of {} is starting (no pid file yet)", gpu_uuid));
}

Status MpsDaemons::Quit(const std::string& gpu_uuid) {
  os::CommandSpec spec;
  // `echo quit | nvidia-cuda-mps-control`, the program passed as $0 rather than spliced in.
  spec.argv = {"/bin/sh", "-c", "echo quit | \"$0\"", options_.control_program};
  spec.env = ControlEnvironment(gpu_uuid);
  spec.timeout = options_.command_timeout;
  GPUFLEET_ASSIGN_OR_RETURN(const os::CommandOutcome outcome, os::RunCommand(spec, clock_));
  if (outcome.exit_code != 0) {
    return FailedPreconditionError(fmt::format("quit for the MPS daemon of {} exited with {}: {}",
                                               gpu_uuid, outcome.exit_code,
                                               os::LastLine(outcome.errors)));
  }
  return Status::Ok();
}

std::vector<std::string> MpsDaemons::StopUnused(const std::vector<runner::TaskStatus>& tasks,
                                                const std::set<std::string>& wanted_gpus) {
  std::set<std::string> in_use = wanted_gpus;
  for (const runner::TaskStatus& task : tasks) {
    if (!runner::IsFinal(task.state)) {
      in_use.insert(task.gpu_uuids.begin(), task.gpu_uuids.end());
    }
  }
  std::vector<std::string> told;
  const MonoTime now = clock_.Now();
  for (auto it = daemons_.begin(); it != daemons_.end();) {
    const std::string& uuid = it->first;
    Daemon& daemon = it->second;
    if (daemon.state == State::kStarting) {
      // Once it has written its pid file it is stopped like any other when no share wants it.
      if (const int pid = LiveDaemonPid(uuid); pid > 0) {
        daemon = Daemon{pid, State::kRunning, now};
      } else if (now - daemon.since > options_.start_wait) {
        it = daemons_.erase(it);
        continue;
      } else {
        ++it;
        continue;
      }
    }
    if (LiveDaemonPid(uuid) != daemon.pid) {
      std::error_code ignored;
      std::filesystem::remove_all(PipeDirectory(uuid), ignored);
      it = daemons_.erase(it);
      continue;
    }
    if (daemon.state == State::kRunning && !in_use.contains(uuid)) {
      // A quit that failed still leads to SIGKILL after the grace.
      static_cast<void>(Quit(uuid));
      daemon.state = State::kQuitting;
      daemon.since = now;
      told.push_back(uuid);
    } else if (daemon.state == State::kQuitting && now - daemon.since >= options_.quit_grace) {
      kill(daemon.pid, SIGKILL);
    }
    ++it;
  }
  return told;
}

std::map<std::string, MpsDaemons::State> MpsDaemons::daemons() const {
  std::map<std::string, State> out;
  for (const auto& [uuid, daemon] : daemons_) {
    out[uuid] = daemon.state;
  }
  return out;
}

}  // namespace gpufleet::agent
