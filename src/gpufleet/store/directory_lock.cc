// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace gpufleet::store {
namespace {

// The pid the lock file names, or "an unknown process" when it names none.
std::string Holder(int fd) {
  char text[32] = {};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  std::string pid = n > 0 ? std::string(text, static_cast<size_t>(n)) : "";
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) {
    pid.pop_back();
  }
  return pid.empty() ? "an unknown process" : fmt::format("process {}", pid);
}

}  // namespace

Result<DirectoryLock> DirectoryLock::Acquire(const std::string& directory) {
  std::string path = fmt::format("{}/lock", directory);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return UnavailableError(fmt::format("cannot open \"{}\": {}", path, std::strerror(errno)));
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    std::string message =
        error == EWOULDBLOCK
            ? fmt::format(
                  "data directory \"{}\" is in use by {} (it holds \"{}\"); stop that "
                  "server or give another --data-dir",
                  directory, Holder(fd), path)
            : fmt::format("cannot lock \"{}\": {}", path, std::strerror(error));
    close(fd);
    if (error == EWOULDBLOCK) {
      return FailedPreconditionError(std::move(message));
    }
    return UnavailableError(std::move(message));
  }
  const std::string pid = fmt::format("{}\n", getpid());
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    const int error = errno;
    close(fd);
    return UnavailableError(fmt::format("cannot write \"{}\": {}", path, std::strerror(error)));
  }
  return DirectoryLock(std::move(path), fd);
}

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) {
      close(fd_);
    }
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) {
    close(fd_);  // closing the last descriptor releases the flock
  }
}

}  // namespace gpufleet::store
