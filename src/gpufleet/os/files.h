// SPDX-License-Identifier: Apache-2.0
// The POSIX file kit: an owned descriptor, errno as text, a small file read whole and a file
// replaced atomically. What the runners, the agent and `gpufleet server` share.
#pragma once

#include <unistd.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "gpufleet/core/status.h"

namespace gpufleet::os {

// Owns a file descriptor and closes it. Thread-compatible.
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

// strerror_r's text for `error`: thread-safe, unlike strerror.
std::string ErrnoText(int error);

// The file's content; nullopt when it does not exist. kUnavailable naming the path when it
// cannot be read.
Result<std::optional<std::string>> ReadSmallFile(const std::string& path);

// What a replaced file must survive.
enum class Durability {
  // A crash of this process: the data is in the kernel when the call returns (state files of
  // tasks that a reboot ends anyway).
  kProcessCrash,
  // A crash of the machine: the data is on disk (fsync) before the rename.
  kMachineCrash,
};

// Where WriteFileAtomically writes before it renames: `path` + this suffix, in the same directory.
inline constexpr std::string_view kAtomicWriteSuffix = ".tmp";

// Writes `content` next to `path`, then renames it over `path`: readers see the old file or the
// whole new one, never a part. A new file gets `mode`. kUnavailable naming the path on failure,
// when the temporary file is removed again.
Status WriteFileAtomically(const std::string& path, std::string_view content,
                           Durability durability = Durability::kProcessCrash, mode_t mode = 0600);

}  // namespace gpufleet::os
