// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/agent/health.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

// `gpufleet agent --once --slurm-health`: Slurm's HealthCheckProgram. Reads the GPUs once,
// judges them by the agent's health rules and drains the node in slurmctld when a GPU is
// unhealthy; resumes it when gpufleet drained it and the GPUs are clean again. A node drained
// for any other reason (by an admin, by another check) is never touched.
namespace gpufleet::agent {

// Every reason gpufleet gives Slurm starts so; it is how a later run knows the drain is its own.
inline constexpr std::string_view kSlurmReasonPrefix = "gpufleet:";

// A node as slurmctld sees it.
struct SlurmNodeState {
  std::string state;   // "IDLE", "IDLE+DRAIN", "MIXED+DRAIN", "DOWN+DRAIN" ...
  bool drain = false;  // DRAIN flag: draining or drained
  std::string reason;  // without Slurm's " [user@time]" suffix; empty when none
};

// Slurm's control of one node. Implementations say whether they are thread-safe.
class SlurmControl {
 public:
  virtual ~SlurmControl() = default;
  // kNotFound when slurmctld does not know the node.
  virtual Result<SlurmNodeState> ShowNode(const std::string& node) = 0;
  virtual Status Drain(const std::string& node, const std::string& reason) = 0;
  virtual Status Resume(const std::string& node) = 0;
};

// SlurmControl through the scontrol program (`scontrol show node -o`, `scontrol update`), which
// reads SLURM_CONF like any Slurm client. Thread-safe.
std::unique_ptr<SlurmControl> NewScontrol(std::string program, const Clock& clock);

// Parses one line of `scontrol show node -o`. kInvalidArgument when it has no State=.
Result<SlurmNodeState> ParseScontrolNode(std::string_view line);

enum class SlurmHealthAction {
  kNone,          // GPUs clean, node not drained by gpufleet
  kDrained,       // a GPU is unhealthy: drained now
  kStillDrained,  // a GPU is still unhealthy and gpufleet's drain stands
  kResumed,       // gpufleet's drain lifted: the GPUs are clean again
  kLeftDrained,   // drained for another reason: left alone, whatever the GPUs say
};
const char* SlurmHealthActionName(SlurmHealthAction action);

struct SlurmHealthOutcome {
  SlurmHealthAction action = SlurmHealthAction::kNone;
  // The drain reason gpufleet gives ("gpufleet: XID 79 on GPU 3"); empty when the GPUs are clean.
  std::string reason;
  std::vector<GpuHealthReport> gpus;  // one per GPU read
};

// The reason for Slurm from the unhealthy GPUs of `gpus`: "gpufleet: XID 79 on GPU 3; ...", at
// most about 200 characters; empty when none is unhealthy (Degraded GPUs do not drain a node).
std::string SlurmDrainReason(const std::vector<GpuHealthReport>& gpus);

// One health check of `node`: the GPUs' identity and one sample (with the XIDs the driver
// queued), judged with `options`; then drain, resume or nothing, as above. A probe that cannot
// read the GPUs at all (the caller passes its error as `probe_error`; `probe` is then null) is
// unhealthy: "gpufleet: NVML: ...". Errors are scontrol's (kUnavailable, kNotFound).
Result<SlurmHealthOutcome> RunSlurmHealthCheck(GpuProbe* probe, const Status& probe_error,
                                               SlurmControl& slurm, const std::string& node,
                                               const HealthOptions& options = {});

}  // namespace gpufleet::agent
