// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/internal/files.h"

#include <errno.h>
#include <fcntl.h>

#include <fmt/format.h>

#include "gpufleet/runner/internal/text.h"

namespace gpufleet::runner::internal {

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

}  // namespace gpufleet::runner::internal
