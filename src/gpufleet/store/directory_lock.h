// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

#include "gpufleet/core/status.h"

namespace gpufleet::store {

// An exclusive lock on a data directory, so that one server at a time writes the store in it
// (docs/architecture.md, "One writer per store"). It is an flock(2) on DIR/lock, which holds the
// pid of its holder; the kernel drops it when the holder exits, however it exits, so a server
// killed with SIGKILL leaves nothing to clean up. Not thread-safe; move-only.
class DirectoryLock {
 public:
  // Takes the lock. kFailedPrecondition naming the directory and the holder's pid when another
  // process holds it; kUnavailable when the lock file cannot be opened or written.
  static Result<DirectoryLock> Acquire(const std::string& directory);

  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  // Releases the lock.
  ~DirectoryLock();

  const std::string& path() const { return path_; }

 private:
  DirectoryLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
};

}  // namespace gpufleet::store
