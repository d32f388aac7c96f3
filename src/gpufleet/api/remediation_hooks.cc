// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/remediation_hooks.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/control/outcome_json.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/os/command.h"

namespace gpufleet::api {

Result<std::map<std::string, std::string>> ParseRemediationHooks(
    const std::vector<std::string>& flags) {
  std::map<std::string, std::string> commands;
  for (const std::string& flag : flags) {
    const size_t equals = flag.find('=');
    const std::string action = flag.substr(0, equals);
    const bool known = std::any_of(std::begin(control::kRemediationActions),
                                   std::end(control::kRemediationActions),
                                   [&](std::string_view name) { return name == action; });
    if (equals == std::string::npos || !known || equals + 1 == flag.size()) {
      return InvalidArgumentError(fmt::format(
          "--remediation-hook: \"{}\" (must be ACTION=COMMAND, ACTION one of reset-gpu, "
          "reboot-node, ticket)",
          flag));
    }
    if (!commands.emplace(action, flag.substr(equals + 1)).second) {
      return InvalidArgumentError(
          fmt::format("--remediation-hook: \"{}\" (a second hook for {})", flag, action));
    }
  }
  return commands;
}

RemediationHooks::RemediationHooks(std::map<std::string, std::string> commands,
                                   store::StateStore& store, const Clock& clock, Duration timeout)
    : commands_(std::move(commands)), store_(store), clock_(clock), timeout_(timeout) {
  worker_ = std::thread([this] { Work(); });
}

RemediationHooks::~RemediationHooks() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    waiting_.clear();
  }
  changed_.notify_all();
  worker_.join();
}

std::string RemediationHooks::Start(const control::RemediationRequest& request) {
  if (commands_.count(request.action) == 0) {
    return fmt::format("no hook configured for {}", request.action);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (waiting_.size() >= kMaxWaiting) {
      return fmt::format("hook not run: {} hooks already wait", waiting_.size());
    }
    waiting_.push_back(request);
  }
  changed_.notify_all();
  return fmt::format("hook for {} started", request.action);
}

void RemediationHooks::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return waiting_.empty() && !running_; });
}

void RemediationHooks::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || !waiting_.empty(); });
    if (stopping_) {
      return;
    }
    const control::RemediationRequest request = std::move(waiting_.front());
    waiting_.pop_front();
    running_ = true;
    lock.unlock();
    Run(request, commands_.at(request.action));
    lock.lock();
    running_ = false;
    changed_.notify_all();
  }
}

void RemediationHooks::Run(const control::RemediationRequest& request, const std::string& command) {
  const std::string gpu = std::to_string(request.gpu);
  os::CommandSpec spec;
  spec.argv = {"/bin/sh", "-c", command, "gpufleet-remediation", request.node, gpu, request.reason};
  spec.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
              "GPUFLEET_ACTION=" + request.action,
              "GPUFLEET_NODE=" + request.node,
              "GPUFLEET_GPU=" + gpu,
              "GPUFLEET_GPU_UUID=" + request.gpu_uuid,
              "GPUFLEET_REASON=" + request.reason};
  spec.timeout = timeout_;
  const MonoTime start = clock_.Now();
  const Result<os::CommandOutcome> outcome = os::RunCommand(spec, clock_);
  const double seconds = std::chrono::duration<double>(clock_.Now() - start).count();
  std::string event;
  if (!outcome.ok()) {
    event = fmt::format("remediation {} hook could not start: {}", request.action,
                        outcome.status().message());
  } else {
    std::string output = outcome->output + outcome->errors;
    if (output.size() > kMaxOutputBytes) {
      output = output.substr(output.size() - kMaxOutputBytes);
    }
    const std::string end =
        outcome->timed_out ? fmt::format("timed out after {:.1f} s", seconds)
                           : fmt::format("exited {} after {:.1f} s", outcome->exit_code, seconds);
    event = fmt::format("remediation {} hook {}: {}", request.action, end,
                        os::LastLine(output).empty() ? "no output" : os::LastLine(output));
  }
  store::WriteBatch batch;
  batch.AppendEvent(std::string(control::kQuarantinesKind), fmt::format("gpu:{}", request.gpu_uuid),
                    event);
  batch.AppendEvent(std::string(control::kNodesKind), request.node,
                    fmt::format("gpu {}: {}", request.gpu, event));
  const Status status = store_.Commit(batch);
  if (!status.ok()) {
    fmt::print(stderr, "gpufleet server: {} (not recorded: {})\n", event, status.ToString());
  }
}

}  // namespace gpufleet::api
