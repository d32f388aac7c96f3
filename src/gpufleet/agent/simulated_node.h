// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/agent/diagnostics.h"
#include "gpufleet/agent/node_agent.h"
#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/http/client.h"
#include "gpufleet/runner/simulated_runner.h"

// One node of a simulated fleet, whole and in-process: a simulated probe, the simulated task
// runner, a telemetry sampler and the agent, talking to a real server. `gpufleet dev` runs a
// fleet of these; `gpufleet agent --backend simulated` runs one. Its agent runs the diagnostics
// the server asks for at once, the built-in check with the probe's fault model as the exercise.
namespace gpufleet::agent {

// Several Prometheus text expositions as one: each metric family's HELP and TYPE once, followed
// by the series of every input, families in the order first seen. A series belongs to the family
// whose header came last before it in its own input (so histogram suffixes stay with theirs).
// What a fleet endpoint serves for many simulated nodes.
std::string MergeMetricTexts(const std::vector<std::string>& texts);

// Sets each GPU's simulated load from the tasks `runner` runs for `agent`, so that the telemetry
// shows the work: every task busies its share of its GPUs at a level of its own (55-95%), in a
// training pattern; shares of one GPU add up (at most 100%). The MIG devices that running tasks
// name are marked in use (so the probe refuses to destroy them), the others free.
Status ApplyTaskLoads(const NodeAgent& agent, runner::TaskRunner& runner, SimulatedProbe& probe);

// A GPU that fails the jobs it runs, as the fault model's bad GPU does (docs/reliability.md,
// "Faults"): under each task that runs on it the GPU reports `xid`, one the catalog blames the GPU
// for, so that its agent drains it at once and the server ends the run as an infrastructure
// failure naming it. Once that task is gone and `recover_after` has passed, the GPU is reset (its
// XIDs forgotten, as after an operator's `nvidia-smi -r`) and takes work again, until its next
// task. Its latent fault stays, for a diagnostic to find.
struct FaultyGpu {
  int index = 0;
  int xid = 48;  // double-bit ECC error: drain at once, "reset the GPU; RMA if it repeats"
  std::chrono::milliseconds recover_after{5000};
};

class SimulatedNode {
 public:
  struct Options {
    NodeAgentOptions agent;
    std::string gpu_model = "H100-80GB";
    int gpu_count = 8;
    uint64_t seed = 1;
    std::chrono::milliseconds sample_interval{1000};
    // MIG-enabled GPUs and their first instances, as SimulatedProbe::Options::mig_profiles.
    std::map<int, std::vector<std::string>> mig_profiles;
    std::optional<FaultyGpu> faulty_gpu;
  };

  // Everything passed by reference must outlive the node. kInvalidArgument for a bad model or
  // GPU count.
  static Result<std::unique_ptr<SimulatedNode>> Create(Options options, const Clock& clock,
                                                       const GpuCatalog& catalog,
                                                       http::ApiClient& client);

  // ApplyTaskLoads on this node, then the faulty GPU's part (Options::faulty_gpu): an XID under
  // a task that has started on it, or its reset once that task is gone. Call it as `gpufleet dev`
  // does, between heartbeats.
  Status UpdateLoads();

  NodeAgent& agent() { return *agent_; }
  TelemetrySampler& sampler() { return *sampler_; }
  SimulatedProbe& probe() { return *probe_; }
  runner::SimulatedRunner& runner() { return *runner_; }

 private:
  explicit SimulatedNode(const Clock& clock) : clock_(clock) {}

  Status PlayFault();

  const Clock& clock_;
  std::optional<FaultyGpu> faulty_gpu_;
  // While the faulty GPU's XID stands: when it was reported and under which task.
  std::optional<MonoTime> fault_reported_at_;
  std::string failed_task_;

  std::unique_ptr<SimulatedProbe> probe_;
  std::unique_ptr<runner::SimulatedRunner> runner_;
  std::unique_ptr<TelemetrySampler> sampler_;
  std::unique_ptr<DiagnosticRunner> diagnostics_;  // the probe's fault model as its exercise
  std::unique_ptr<NodeAgent> agent_;
};

}  // namespace gpufleet::agent
