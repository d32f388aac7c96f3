// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/task_runner.h"

#include <string.h>

#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace gpufleet::runner {
namespace {

bool IsTaskIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '@' || c == '+' || c == '/' || c == '-';
}

bool IsEnvName(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) {
    return false;
  }
  for (const char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) {
      return false;
    }
  }
  return true;
}

bool HasNul(std::string_view text) {
  return text.find('\0') != std::string_view::npos;
}

// Printable for error messages: control characters (NUL and newline included) escaped.
std::string Quote(std::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  out += "'";
  return out;
}

Status CheckPath(std::string_view field, std::string_view path) {
  if (HasNul(path) || path.find('\n') != std::string_view::npos) {
    return InvalidArgumentError(
        fmt::format("{} {} contains a NUL byte or a newline", field, Quote(path)));
  }
  return Status::Ok();
}

// A task or run id: 1 to kMaxTaskIdLength characters from [A-Za-z0-9._:@+/-].
Status CheckId(std::string_view field, std::string_view id) {
  if (id.empty()) {
    return InvalidArgumentError(fmt::format("{} is empty", field));
  }
  if (id.size() > kMaxTaskIdLength) {
    return InvalidArgumentError(fmt::format("{} {} is {} characters long, more than {}", field,
                                            Quote(id), id.size(), kMaxTaskIdLength));
  }
  for (const char c : id) {
    if (!IsTaskIdChar(c)) {
      return InvalidArgumentError(
          fmt::format("{} {} has the character {}, outside [A-Za-z0-9._:@+/-]", field, Quote(id),
                      Quote(std::string_view(&c, 1))));
    }
  }
  return Status::Ok();
}

// An MPS client has one GPU (its limits name device 0), a pipe directory that a container can
// mount (podman's --volume splits at ':' and ','), and limits in range.
Status CheckMpsClient(const TaskLaunch& launch) {
  const MpsClient& mps = *launch.mps;
  if (launch.gpu_uuids.size() != 1) {
    return InvalidArgumentError(fmt::format("mps of task '{}': an MPS client has one GPU, not {}",
                                            launch.task_id, launch.gpu_uuids.size()));
  }
  GPUFLEET_RETURN_IF_ERROR(CheckPath("mps.pipe_directory", mps.pipe_directory));
  if (!mps.pipe_directory.starts_with('/') ||
      mps.pipe_directory.find_first_of(":,") != std::string::npos) {
    return InvalidArgumentError(fmt::format(
        "mps.pipe_directory of task '{}' is {}: not an absolute path without ':' or ','",
        launch.task_id, Quote(mps.pipe_directory)));
  }
  if (mps.active_thread_percentage < 1 || mps.active_thread_percentage > 100) {
    return InvalidArgumentError(
        fmt::format("mps.active_thread_percentage of task '{}' is {}: not 1..100", launch.task_id,
                    mps.active_thread_percentage));
  }
  if (mps.memory_limit_mib < 0) {
    return InvalidArgumentError(fmt::format("mps.memory_limit_mib of task '{}' is {}: negative",
                                            launch.task_id, mps.memory_limit_mib));
  }
  return Status::Ok();
}

}  // namespace

std::string_view TaskStateName(TaskState state) {
  switch (state) {
    case TaskState::kRunning:
      return "running";
    case TaskState::kExited:
      return "exited";
    case TaskState::kKilled:
      return "killed";
    case TaskState::kFailedToStart:
      return "failed-to-start";
    case TaskState::kLost:
      return "lost";
  }
  return "unknown";
}

bool IsFinal(TaskState state) {
  return state != TaskState::kRunning;
}

std::string DescribeTaskStatus(const TaskStatus& status) {
  switch (status.state) {
    case TaskState::kRunning:
      if (status.pulling_image) {
        return status.stop_requested ? "pulling its image, stop requested" : "pulling its image";
      }
      return status.stop_requested ? "running, stop requested" : "running";
    case TaskState::kExited:
      return fmt::format("exited with code {}", status.exit_code);
    case TaskState::kKilled: {
      // sigabbrev_np is glibc's thread-safe "TERM" for SIGTERM; nullptr for unknown numbers.
      const char* abbreviation = sigabbrev_np(status.signal);
      return abbreviation == nullptr
                 ? fmt::format("killed by signal {}", status.signal)
                 : fmt::format("killed by signal {} (SIG{})", status.signal, abbreviation);
    }
    case TaskState::kFailedToStart:
      return "failed to start: " + status.reason;
    case TaskState::kLost:
      return "lost: " + status.reason;
  }
  return "unknown";
}

Status ValidateLaunch(const TaskLaunch& launch) {
  GPUFLEET_RETURN_IF_ERROR(CheckId("task_id", launch.task_id));
  if (!launch.run_id.empty()) {
    GPUFLEET_RETURN_IF_ERROR(CheckId("run_id", launch.run_id));
  }
  if (launch.argv.empty()) {
    return InvalidArgumentError(fmt::format("argv of task '{}' is empty", launch.task_id));
  }
  if (launch.argv[0].empty()) {
    return InvalidArgumentError(
        fmt::format("argv[0] (the program) of task '{}' is empty", launch.task_id));
  }
  if (launch.argv[0].find('\n') != std::string::npos) {
    return InvalidArgumentError(
        fmt::format("argv[0] (the program) of task '{}' contains a "
                    "newline: {}",
                    launch.task_id, Quote(launch.argv[0])));
  }
  for (size_t i = 0; i < launch.argv.size(); ++i) {
    if (HasNul(launch.argv[i])) {
      return InvalidArgumentError(fmt::format("argv[{}] of task '{}' contains a NUL byte: {}", i,
                                              launch.task_id, Quote(launch.argv[i])));
    }
  }
  for (const auto& [name, value] : launch.env) {
    if (!IsEnvName(name)) {
      return InvalidArgumentError(fmt::format(
          "env name {} of task '{}' is not [A-Za-z_][A-Za-z0-9_]*", Quote(name), launch.task_id));
    }
    if (name == kCudaVisibleDevicesEnv || name == kNvidiaVisibleDevicesEnv) {
      return InvalidArgumentError(fmt::format(
          "env {} of task '{}' is set by the runner from gpu_uuids", name, launch.task_id));
    }
    if (name.starts_with(kMpsEnvPrefix)) {
      return InvalidArgumentError(fmt::format(
          "env {} of task '{}' is set by the runner for MPS clients", name, launch.task_id));
    }
    if (HasNul(value)) {
      return InvalidArgumentError(fmt::format("env {} of task '{}' contains a NUL byte: {}", name,
                                              launch.task_id, Quote(value)));
    }
  }
  std::set<std::string_view> seen_uuids;
  for (size_t i = 0; i < launch.gpu_uuids.size(); ++i) {
    const std::string& uuid = launch.gpu_uuids[i];
    if (uuid.empty()) {
      return InvalidArgumentError(
          fmt::format("gpu_uuids[{}] of task '{}' is empty", i, launch.task_id));
    }
    for (const char c : uuid) {
      const auto byte = static_cast<unsigned char>(c);
      if (c == ',' || byte <= 0x20 || byte == 0x7f) {
        return InvalidArgumentError(
            fmt::format("gpu_uuids[{}] of task '{}' is {}: a comma, blank or control character", i,
                        launch.task_id, Quote(uuid)));
      }
    }
    if (!seen_uuids.insert(uuid).second) {
      return InvalidArgumentError(
          fmt::format("gpu_uuids[{}] of task '{}' repeats {}", i, launch.task_id, Quote(uuid)));
    }
  }
  GPUFLEET_RETURN_IF_ERROR(CheckPath("log_path", launch.log_path));
  GPUFLEET_RETURN_IF_ERROR(CheckPath("working_dir", launch.working_dir));
  GPUFLEET_RETURN_IF_ERROR(CheckPath("checkpoint_path", launch.checkpoint_path));
  GPUFLEET_RETURN_IF_ERROR(CheckPath("notice_path", launch.notice_path));
  if (launch.mps.has_value()) {
    GPUFLEET_RETURN_IF_ERROR(CheckMpsClient(launch));
  }
  if (!launch.image.empty()) {
    if (const Status image = ValidateImageReference(launch.image); !image.ok()) {
      return InvalidArgumentError(
          fmt::format("image of task '{}': {}", launch.task_id, image.message()));
    }
  }
  return Status::Ok();
}

std::map<std::string, std::string> MpsEnvironment(const MpsClient& client) {
  std::map<std::string, std::string> env = {
      {std::string(kMpsPipeDirectoryEnv), client.pipe_directory},
      {std::string(kMpsActiveThreadsEnv), std::to_string(client.active_thread_percentage)}};
  if (client.memory_limit_mib > 0) {
    env[std::string(kMpsMemoryLimitEnv)] = fmt::format("0={}M", client.memory_limit_mib);
  }
  return env;
}

std::map<std::string, std::string> GpuEnvironment(const std::vector<std::string>& gpu_uuids) {
  if (gpu_uuids.empty()) {
    return {{std::string(kCudaVisibleDevicesEnv), std::string(kNoCudaDevices)},
            {std::string(kNvidiaVisibleDevicesEnv), std::string(kNoNvidiaDevices)}};
  }
  const std::string joined = fmt::format("{}", fmt::join(gpu_uuids, ","));
  return {{std::string(kCudaVisibleDevicesEnv), joined},
          {std::string(kNvidiaVisibleDevicesEnv), joined}};
}

Result<std::vector<std::string>> StopUndesiredTasks(
    TaskRunner& runner, const std::set<std::string, std::less<>>& desired, Duration grace) {
  std::vector<std::string> stopped;
  for (const TaskStatus& status : runner.Poll()) {
    if (status.state != TaskState::kRunning || status.stop_requested ||
        desired.contains(status.task_id)) {
      continue;
    }
    GPUFLEET_RETURN_IF_ERROR(runner.Stop(status.task_id, grace));
    stopped.push_back(status.task_id);
  }
  return stopped;
}

}  // namespace gpufleet::runner
