// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/principal.h"

#include <fmt/core.h>

namespace gpufleet::control {

const char* RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kMember:
      return "member";
    case Role::kAgent:
      return "agent";
  }
  return "unknown";
}

Result<Role> ParseRole(std::string_view text) {
  if (text == "admin") {
    return Role::kAdmin;
  }
  if (text == "member") {
    return Role::kMember;
  }
  if (text == "agent") {
    return Role::kAgent;
  }
  return InvalidArgumentError(fmt::format("role: \"{}\" (must be admin, member or agent)", text));
}

}  // namespace gpufleet::control
