// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>

#include "gpufleet/core/status.h"

// Who made a request, as the control plane sees it: a role and a team. The tokens that prove it
// are the API's (api/auth.h); the controllers and the tenancy documents need only this.
namespace gpufleet::control {

// kAgent: a node agent; it may only register and heartbeat (docs/agent.md).
enum class Role { kAdmin, kMember, kAgent };

// "admin", "member", "agent".
const char* RoleName(Role role);
// kInvalidArgument for anything but "admin" and "member".
Result<Role> ParseRole(std::string_view text);

// Who made a request.
struct Principal {
  Role role = Role::kMember;
  std::string team;  // members: the team whose jobs they see; may be empty for admins
  std::string name;  // for events and logs
  // Agents: the one node a node credential acts for; empty for a fleet-wide join token.
  std::string node;
  std::string token_id;  // TokenId of the credential

  bool is_admin() const { return role == Role::kAdmin; }
  // The one visibility rule of team-owned objects (jobs, deployments, a queue's team): admins see
  // every team's, members their own team's. Hidden objects are answered 404, never 403.
  bool Sees(std::string_view object_team) const { return is_admin() || object_team == team; }
};

}  // namespace gpufleet::control
