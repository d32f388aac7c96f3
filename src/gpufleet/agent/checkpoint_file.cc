// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/checkpoint_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "gpufleet/os/files.h"
#include "gpufleet/wire/agent_protocol.h"

namespace gpufleet::agent {
namespace {

constexpr size_t kTailBytes = 2 * kMaxCheckpointLineBytes;

}  // namespace

Result<int64_t> ParseCheckpointLine(std::string_view line) {
  const char* const begin = line.data();
  const char* const end = line.data() + line.size();
  if (line.empty() || line[0] < '0' || line[0] > '9') {
    return InvalidArgumentError("not a number");
  }
  int64_t seconds = 0;
  const auto [after, error] = std::from_chars(begin, end, seconds);
  if (error != std::errc() && error != std::errc::result_out_of_range) {
    return InvalidArgumentError("not a number");
  }
  const char* rest = after;
  if (rest != end && *rest == '.') {
    rest = std::find_if(rest + 1, end, [](char c) { return c < '0' || c > '9'; });
  }
  if (rest != end && *rest != ' ' && *rest != '\t') {
    return InvalidArgumentError("not a number");
  }
  if (error == std::errc::result_out_of_range || seconds < 1 ||
      seconds > wire::kMaxCheckpointUnixSeconds) {
    return InvalidArgumentError("out of range");
  }
  return seconds;
}

Result<CheckpointRead> ReadCheckpointFile(const std::string& path) {
  // O_NONBLOCK: a FIFO put in the file's place opens without waiting for a writer.
  const os::UniqueFd fd(
      open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    const int error = errno;
    if (error == ENOENT) {
      return NotFoundError(fmt::format("checkpoint file {}: missing", path));
    }
    if (error == ELOOP) {
      return CheckpointRead{.rejected = "a symbolic link"};
    }
    return UnavailableError(fmt::format("checkpoint file {}: {}", path, os::ErrnoText(error)));
  }
  struct stat info = {};
  if (fstat(fd.get(), &info) != 0) {
    return UnavailableError(fmt::format("checkpoint file {}: {}", path, os::ErrnoText(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    return CheckpointRead{.rejected = "not a regular file"};
  }
  CheckpointRead read;
  read.size = info.st_size;
  read.mtime_ns = int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec;
  const size_t tail = std::min<size_t>(kTailBytes, static_cast<size_t>(info.st_size));
  std::string text(tail, '\0');
  const ssize_t got = pread(fd.get(), text.data(), tail, info.st_size - static_cast<off_t>(tail));
  if (got < 0) {
    return UnavailableError(fmt::format("checkpoint file {}: {}", path, os::ErrnoText(errno)));
  }
  text.resize(static_cast<size_t>(got));
  const bool whole_file = static_cast<size_t>(got) == static_cast<size_t>(info.st_size);
  const size_t last_end = text.rfind('\n');
  if (last_end == std::string::npos) {
    if (!whole_file) {
      read.rejected = "line too long";
    }
    return read;
  }
  const size_t previous_end = last_end == 0 ? std::string::npos : text.rfind('\n', last_end - 1);
  if (previous_end == std::string::npos && !whole_file) {
    read.rejected = "line too long";
    return read;
  }
  const size_t line_begin = previous_end == std::string::npos ? 0 : previous_end + 1;
  const std::string_view line = std::string_view(text).substr(line_begin, last_end - line_begin);
  if (line.size() > kMaxCheckpointLineBytes) {
    read.rejected = "line too long";
    return read;
  }
  Result<int64_t> seconds = ParseCheckpointLine(line);
  if (seconds.ok()) {
    read.unix_seconds = *seconds;
  } else {
    read.rejected = seconds.status().message();
  }
  return read;
}

}  // namespace gpufleet::agent
