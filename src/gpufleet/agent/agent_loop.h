// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>

#include "gpufleet/agent/node_agent.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

namespace gpufleet::agent {

// The agent's schedule around NodeAgent (docs/agent.md, "Leases and fencing"), the one
// `gpufleet agent` runs and the in-process agents of `gpufleet sim chaos` run on simulated time:
// the lease is checked every second; the node registers until a registration succeeds, then
// heartbeats every heartbeat interval the server gave; after a failed call it tries again in five
// seconds. A server that lost the node (kNotFound, kFailedPrecondition) or no longer takes its
// credential (kUnauthenticated) gets a new registration. A server that refuses the agent's
// protocol version (wire::IsAgentProtocolRefusal) will refuse it until one side is upgraded:
// the wait after each refusal in a row doubles, from five seconds up to five minutes, so that a
// fleet of refused agents does not load the server while the operator upgrades.
// Thread-compatible.
class AgentLoop {
 public:
  static constexpr std::chrono::milliseconds kLeaseCheck{1000};
  static constexpr std::chrono::seconds kRetryAfterFailure{5};
  static constexpr std::chrono::minutes kMaxRetryAfterRefusal{5};

  // `agent` and `clock` must outlive the loop.
  AgentLoop(NodeAgent& agent, const Clock& clock);

  struct Step {
    // How long to wait before the next Step.
    Duration wait{0};
    // Tasks stopped because the lease ran out (NodeAgent::FenceIfLeaseExpired).
    int fenced = 0;
    // Whether this step registered or heartbeat, and how that went.
    bool called_server = false;
    Status call;
    // After a failed call: how long until the next one.
    Duration retry_in{0};
    // The registration succeeded in this step.
    bool registered_now = false;
  };
  // One wake-up: the lease check, then the registration or heartbeat when it is due.
  Step RunOnce();

  bool registered() const { return registered_; }

 private:
  NodeAgent& agent_;
  const Clock& clock_;
  bool registered_ = false;
  MonoTime next_call_;
  Duration refusal_wait_{0};  // the wait after the last protocol refusal; 0 after any other call
};

}  // namespace gpufleet::agent
