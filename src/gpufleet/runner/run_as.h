// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet::runner {

// The user a task runs as (`gpufleet agent --run-as USER`), looked up once at start.
struct RunAs {
  std::string user;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary groups, the primary one included
  std::string home;
};

// Looks `user` up in the password and group databases. kNotFound naming it when unknown.
Result<RunAs> LookUpUser(const std::string& user);

// Looks `group` up in the group database (`gpufleet agent --task-group GROUP`). kNotFound naming
// the flag and the group when unknown.
Result<gid_t> LookUpGroup(const std::string& group);

}  // namespace gpufleet::runner
