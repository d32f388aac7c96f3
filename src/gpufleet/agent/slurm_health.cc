// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/slurm_health.h"

#include <unistd.h>

#include <map>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/os/command.h"

extern char** environ;  // NOLINT: POSIX's

namespace gpufleet::agent {
namespace {

// Slurm keeps reasons short in `sinfo -R`; a node with eight broken GPUs still gets one line.
constexpr size_t kMaxReasonChars = 200;

// What is worth a drain, in a few words: "XID 79", "GPU lost", "row remapping failed".
std::string ShortFinding(const HealthFinding& finding) {
  const size_t end = finding.reason.find_first_of(":;");
  std::string text = finding.reason.substr(0, end);
  while (!text.empty() && text.back() == ' ') {
    text.pop_back();
  }
  return text;
}

// A node that `scontrol update state=resume` acts on: drained or down.
bool NeedsResume(const SlurmNodeState& node) {
  return node.drain || node.state.find("DOWN") != std::string::npos;
}

std::string Truncate(std::string text) {
  if (text.size() > kMaxReasonChars) {
    text.resize(kMaxReasonChars - 3);
    text += "...";
  }
  return text;
}

class Scontrol final : public SlurmControl {
 public:
  Scontrol(std::string program, const Clock& clock) : program_(std::move(program)), clock_(clock) {}

  Result<SlurmNodeState> ShowNode(const std::string& node) override {
    GPUFLEET_ASSIGN_OR_RETURN(std::string output, Run({"show", "node", "-o", node}));
    const size_t end = output.find('\n');
    return ParseScontrolNode(std::string_view(output).substr(0, end));
  }

  Status Drain(const std::string& node, const std::string& reason) override {
    return Run({"update", "nodename=" + node, "state=drain", "reason=" + reason}).status();
  }

  Status Resume(const std::string& node) override {
    return Run({"update", "nodename=" + node, "state=resume"}).status();
  }

 private:
  Result<std::string> Run(std::vector<std::string> args) {
    os::CommandSpec spec;
    spec.argv.push_back(program_);
    for (std::string& arg : args) {
      spec.argv.push_back(std::move(arg));
    }
    // scontrol finds slurmctld through SLURM_CONF and PATH like any client: pass ours on.
    for (char** entry = environ; *entry != nullptr; ++entry) {
      spec.env.emplace_back(*entry);
    }
    spec.timeout = std::chrono::seconds(30);
    GPUFLEET_ASSIGN_OR_RETURN(os::CommandOutcome outcome, os::RunCommand(spec, clock_));
    if (outcome.exit_code != 0) {
      const std::string why = os::LastLine(outcome.errors);
      const std::string command = fmt::format("{}", fmt::join(spec.argv, " "));
      if (why.find("Invalid node name") != std::string::npos) {
        return NotFoundError(fmt::format("{}: {}", command, why));
      }
      return UnavailableError(fmt::format(
          "{}: {}", command,
          outcome.timed_out ? "timed out"
                            : (why.empty() ? fmt::format("exit {}", outcome.exit_code) : why)));
    }
    return std::move(outcome.output);
  }

  const std::string program_;
  const Clock& clock_;
};

}  // namespace

std::unique_ptr<SlurmControl> NewScontrol(std::string program, const Clock& clock) {
  return std::make_unique<Scontrol>(std::move(program), clock);
}

Result<SlurmNodeState> ParseScontrolNode(std::string_view line) {
  SlurmNodeState node;
  // Reason= is the last field and holds spaces; every other value is one word.
  const size_t reason_at = line.find(" Reason=");
  const std::string_view fields = line.substr(0, reason_at);
  bool have_state = false;
  size_t start = 0;
  while (start < fields.size()) {
    size_t end = fields.find(' ', start);
    if (end == std::string_view::npos) {
      end = fields.size();
    }
    const std::string_view token = fields.substr(start, end - start);
    if (token.starts_with("State=")) {
      node.state = std::string(token.substr(6));
      have_state = true;
    }
    start = end + 1;
  }
  if (!have_state) {
    return InvalidArgumentError(fmt::format("scontrol show node: no State= in \"{}\"", line));
  }
  node.drain = node.state.find("DRAIN") != std::string::npos;
  if (reason_at != std::string_view::npos) {
    std::string reason(line.substr(reason_at + 8));
    // Slurm appends who set it and when: "... [root@2026-12-03T02:30:00]".
    if (const size_t stamp = reason.rfind(" [");
        stamp != std::string::npos && !reason.empty() && reason.back() == ']') {
      reason.resize(stamp);
    }
    node.reason = std::move(reason);
  }
  return node;
}

const char* SlurmHealthActionName(SlurmHealthAction action) {
  switch (action) {
    case SlurmHealthAction::kNone:
      return "none";
    case SlurmHealthAction::kDrained:
      return "drained";
    case SlurmHealthAction::kStillDrained:
      return "still drained";
    case SlurmHealthAction::kResumed:
      return "resumed";
    case SlurmHealthAction::kLeftDrained:
      return "left drained";
  }
  return "unknown";
}

std::string SlurmDrainReason(const std::vector<GpuHealthReport>& gpus) {
  std::vector<std::string> parts;
  for (const GpuHealthReport& gpu : gpus) {
    if (gpu.health != GpuHealth::kUnhealthy && gpu.health != GpuHealth::kQuarantined) {
      continue;
    }
    for (const HealthFinding& finding : gpu.findings) {
      if (finding.health == GpuHealth::kUnhealthy || finding.health == GpuHealth::kQuarantined) {
        parts.push_back(fmt::format("{} on GPU {}", ShortFinding(finding), gpu.gpu_index));
      }
    }
  }
  if (parts.empty()) {
    return "";
  }
  return Truncate(fmt::format("{} {}", kSlurmReasonPrefix, fmt::join(parts, "; ")));
}

Result<SlurmHealthOutcome> RunSlurmHealthCheck(GpuProbe* probe, const Status& probe_error,
                                               SlurmControl& slurm, const std::string& node,
                                               const HealthOptions& options) {
  SlurmHealthOutcome outcome;
  // GPUs that cannot be read are as unusable as broken ones: the driver is gone or a GPU fell
  // off the bus before this process could read its identity.
  Status unreadable = probe_error;
  if (probe != nullptr && unreadable.ok()) {
    Result<ProbeInventory> inventory = probe->Inventory();
    Result<std::vector<GpuSample>> samples =
        inventory.ok() ? probe->Sample() : Result<std::vector<GpuSample>>(inventory.status());
    if (!samples.ok()) {
      unreadable = samples.status();
    } else {
      for (const GpuStaticInfo& info : inventory->gpus) {
        GpuSample sample;
        sample.index = info.index;
        for (const GpuSample& s : *samples) {
          if (s.index == info.index) {
            sample = s;
          }
        }
        // One run sees only the XIDs the driver queued while it ran: Slurm runs the check again
        // every HealthCheckInterval, and lasting faults (a lost GPU, pending row remaps, ECC)
        // show in every sample.
        std::map<int, int64_t> xids;
        for (const XidEvent& xid : sample.xids) {
          ++xids[xid.code];
        }
        outcome.gpus.push_back(EvaluateGpuHealth(info, sample, xids, options));
      }
    }
  }
  outcome.reason =
      unreadable.ok()
          ? SlurmDrainReason(outcome.gpus)
          : Truncate(fmt::format("{} NVML: {}", kSlurmReasonPrefix, unreadable.message()));

  GPUFLEET_ASSIGN_OR_RETURN(const SlurmNodeState state, slurm.ShowNode(node));
  const bool ours = state.reason.starts_with(kSlurmReasonPrefix);
  if (state.drain && !ours) {
    outcome.action = SlurmHealthAction::kLeftDrained;
  } else if (!outcome.reason.empty()) {
    if (state.drain) {
      outcome.action = SlurmHealthAction::kStillDrained;
    } else {
      GPUFLEET_RETURN_IF_ERROR(slurm.Drain(node, outcome.reason));
      outcome.action = SlurmHealthAction::kDrained;
    }
  } else if (ours && NeedsResume(state)) {
    if (const Status resumed = slurm.Resume(node); !resumed.ok()) {
      // slurmd runs this check as its HealthCheckProgram while another run (an operator's, the
      // agent's) may run it too: Slurm refuses to resume a node the other one resumed meanwhile.
      GPUFLEET_ASSIGN_OR_RETURN(const SlurmNodeState again, slurm.ShowNode(node));
      if (NeedsResume(again)) {
        return resumed;
      }
      return outcome;
    }
    outcome.action = SlurmHealthAction::kResumed;
  }
  return outcome;
}

}  // namespace gpufleet::agent
