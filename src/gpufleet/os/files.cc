// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/os/files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include <fmt/format.h>

namespace gpufleet::os {

std::string ErrnoText(int error) {
  char buffer[256];
  return strerror_r(error, buffer, sizeof(buffer));  // the GNU variant returns the text
}

Result<std::optional<std::string>> ReadSmallFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) {
      return std::optional<std::string>();
    }
    return UnavailableError(fmt::format("cannot open '{}': {}", path, ErrnoText(errno)));
  }
  std::string content;
  char buffer[4096];
  while (true) {
    const ssize_t n = read(fd.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return UnavailableError(fmt::format("cannot read '{}': {}", path, ErrnoText(errno)));
    }
    if (n == 0) {
      break;
    }
    content.append(buffer, static_cast<size_t>(n));
  }
  return std::optional<std::string>(std::move(content));
}

Status WriteFileAtomically(const std::string& path, std::string_view content, Durability durability,
                           mode_t mode) {
  const std::string temp_path = path + std::string(kAtomicWriteSuffix);
  UniqueFd fd(open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd.valid()) {
    return UnavailableError(fmt::format("cannot create '{}': {}", temp_path, ErrnoText(errno)));
  }
  // Leaves no temporary file behind.
  const auto fail = [&temp_path](std::string_view what) {
    const int error = errno;
    unlink(temp_path.c_str());
    return UnavailableError(fmt::format("cannot {} '{}': {}", what, temp_path, ErrnoText(error)));
  };
  while (!content.empty()) {
    const ssize_t n = write(fd.get(), content.data(), content.size());
    if (n < 0 && errno == EINTR) {
      continue;
    }
    if (n < 0) {
      return fail("write");
    }
    content.remove_prefix(static_cast<size_t>(n));
  }
  if (durability == Durability::kMachineCrash && fsync(fd.get()) != 0) {
    return fail("sync");
  }
  fd.Reset();
  if (rename(temp_path.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temp_path.c_str());
    return UnavailableError(
        fmt::format("cannot rename '{}' to '{}': {}", temp_path, path, ErrnoText(error)));
  }
  return Status::Ok();
}

}  // namespace gpufleet::os
