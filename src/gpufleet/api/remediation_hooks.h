// SPDX-License-Identifier: Apache-2.0
// The admin's remediation hooks (`gpufleet server --remediation-hook ACTION=COMMAND`,
// docs/reliability.md, "The loop"): the reliability loop asks for a remediation, and the command
// configured for its action runs on a worker thread of its own, so that a slow hook never holds
// up the scheduling cycle. Its end is an event on the GPU's document in kind "quarantines".
#pragma once

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpufleet/control/reliability_controller.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

namespace gpufleet::api {

// "ACTION=COMMAND" flags to the command of each action; kInvalidArgument naming the flag's value
// for an unknown action, a missing '=', an empty command or an action given twice.
Result<std::map<std::string, std::string>> ParseRemediationHooks(
    const std::vector<std::string>& flags);

// Thread-safe. Runs one hook at a time, each through os::RunCommand with `timeout`, as
// `/bin/sh -c COMMAND gpufleet-remediation NODE GPU REASON` with only PATH and GPUFLEET_ACTION,
// GPUFLEET_NODE, GPUFLEET_GPU, GPUFLEET_GPU_UUID, GPUFLEET_REASON in its environment (never the
// server's own, which may hold credentials). At most kMaxWaiting hooks wait; more are refused.
class RemediationHooks {
 public:
  static constexpr size_t kMaxWaiting = 16;
  // The event keeps this much of the hook's output, its end.
  static constexpr size_t kMaxOutputBytes = 512;

  // REQUIRES: `store` and `clock` outlive it.
  RemediationHooks(std::map<std::string, std::string> commands, store::StateStore& store,
                   const Clock& clock, Duration timeout);
  // Waits for the hook running now, if any; the waiting ones are dropped.
  ~RemediationHooks();
  RemediationHooks(const RemediationHooks&) = delete;
  RemediationHooks& operator=(const RemediationHooks&) = delete;

  // control::RemediationHook: queues the request's hook; says what it did.
  std::string Start(const control::RemediationRequest& request);
  // Blocks until no hook runs or waits (tests).
  void WaitIdle();

 private:
  void Work();
  void Run(const control::RemediationRequest& request, const std::string& command);

  const std::map<std::string, std::string> commands_;
  store::StateStore& store_;
  const Clock& clock_;
  const Duration timeout_;

  std::mutex mu_;
  std::condition_variable changed_;
  std::deque<control::RemediationRequest> waiting_;  // guarded by mu_
  bool running_ = false;                             // guarded by mu_
  bool stopping_ = false;                            // guarded by mu_
  std::thread worker_;
};

}  // namespace gpufleet::api
