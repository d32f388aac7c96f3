// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/runner/run_as.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <string.h>
#include <unistd.h>

#include <fmt/format.h>

namespace gpufleet::runner {

Result<RunAs> LookUpUser(const std::string& user) {
  if (user.empty()) {
    return InvalidArgumentError("--run-as: the user name is empty");
  }
  std::vector<char> buffer(16384);
  passwd entry = {};
  passwd* found = nullptr;
  const int error = getpwnam_r(user.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (error != 0) {
    char text[256];
    return UnavailableError(fmt::format("--run-as: cannot look up user '{}': {}", user,
                                        strerror_r(error, text, sizeof(text))));
  }
  if (found == nullptr) {
    return NotFoundError(fmt::format("--run-as: no user '{}' on this node", user));
  }
  RunAs run_as;
  run_as.user = user;
  run_as.uid = entry.pw_uid;
  run_as.gid = entry.pw_gid;
  run_as.home = entry.pw_dir != nullptr ? entry.pw_dir : "/";
  int count = 32;
  run_as.groups.resize(static_cast<size_t>(count));
  if (getgrouplist(user.c_str(), entry.pw_gid, run_as.groups.data(), &count) < 0) {
    run_as.groups.resize(static_cast<size_t>(count));
    getgrouplist(user.c_str(), entry.pw_gid, run_as.groups.data(), &count);
  }
  run_as.groups.resize(static_cast<size_t>(count));
  return run_as;
}

Result<gid_t> LookUpGroup(const std::string& group) {
  if (group.empty()) {
    return InvalidArgumentError("--task-group: the group name is empty");
  }
  std::vector<char> buffer(1 << 16);
  struct group entry = {};
  struct group* found = nullptr;
  const int error = getgrnam_r(group.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (error != 0) {
    char text[256];
    return UnavailableError(fmt::format("--task-group: cannot look up group '{}': {}", group,
                                        strerror_r(error, text, sizeof(text))));
  }
  if (found == nullptr) {
    return NotFoundError(fmt::format("--task-group: no group '{}' on this node", group));
  }
  return entry.gr_gid;
}

}  // namespace gpufleet::runner
