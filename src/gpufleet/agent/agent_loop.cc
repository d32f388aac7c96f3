// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/agent_loop.h"

#include <algorithm>

#include "gpufleet/wire/agent_protocol.h"

namespace gpufleet::agent {

AgentLoop::AgentLoop(NodeAgent& agent, const Clock& clock)
    : agent_(agent), clock_(clock), next_call_(clock.Now()) {}

AgentLoop::Step AgentLoop::RunOnce() {
  Step step;
  step.fenced = agent_.FenceIfLeaseExpired();
  agent_.TendMpsDaemons();
  if (clock_.Now() >= next_call_) {
    step.called_server = true;
    step.call = registered_ ? agent_.Heartbeat() : agent_.Register();
    Duration wait = kRetryAfterFailure;
    if (wire::IsAgentProtocolRefusal(step.call)) {
      refusal_wait_ = refusal_wait_ == Duration(0)
                          ? Duration(kRetryAfterFailure)
                          : std::min<Duration>(refusal_wait_ * 2, kMaxRetryAfterRefusal);
      wait = refusal_wait_;
    } else {
      refusal_wait_ = Duration(0);
    }
    if (step.call.ok()) {
      step.registered_now = !registered_;
      registered_ = true;
      wait = agent_.heartbeat_interval();
    } else {
      registered_ = registered_ && step.call.code() != StatusCode::kNotFound &&
                    step.call.code() != StatusCode::kFailedPrecondition &&
                    step.call.code() != StatusCode::kUnauthenticated;
    }
    if (!step.call.ok()) {
      step.retry_in = wait;
    }
    next_call_ = clock_.Now() + wait;
  }
  step.wait = std::min<Duration>(next_call_ - clock_.Now(), kLeaseCheck);
  return step;
}

}  // namespace gpufleet::agent
