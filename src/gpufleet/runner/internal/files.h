// SPDX-License-Identifier: Apache-2.0
// File helpers the runners share. Private to the runner module.
#pragma once

#include <unistd.h>

#include <optional>
#include <string>
#include <utility>

#include "gpufleet/core/status.h"

namespace gpufleet::runner::internal {

// Owns a file descriptor.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.Release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    Reset(other.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1) {
    if (fd_ >= 0) {
      close(fd_);
    }
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// The file's content; nullopt when it does not exist. kUnavailable naming the path when it
// cannot be read.
Result<std::optional<std::string>> ReadSmallFile(const std::string& path);

}  // namespace gpufleet::runner::internal
