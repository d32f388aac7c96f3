// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/agent/gpu_probe.h"
#include "gpufleet/core/cluster.h"

// Health rules for one GPU: the XID catalog, uncorrectable ECC, row remapping, a lost GPU,
// thermal headroom and clock-event ("throttle") reasons. Pure functions of the readings; the
// telemetry sampler keeps the XIDs seen so far, because an XID is an event but its verdict
// holds until the GPU is reset.
namespace gpufleet::agent {

// What to do with the work on a GPU. Ordered by urgency.
enum class DrainAction {
  kNone,      // keep running and placing work
  kAfterJob,  // place nothing new; let the running job finish, then reset the GPU
  kNow,       // stop the GPU's work now
};

const char* DrainActionName(DrainAction action);  // "none", "after job", "now"

// How gpufleet treats one XID, from NVIDIA's XID catalog (resolution buckets), DCGM's health
// watches and the k8s device plugin's list of application errors (see telemetry.md §3.3).
enum class XidClass {
  kApplication,    // the job's fault; the GPU is fine: never drain
  kMonitor,        // the GPU is suspect: degrade, keep placing
  kDrainAfterJob,  // the GPU needs a reset: let the job finish, then reset
  kDrainNow,       // the GPU is broken now
};

struct XidRule {
  int code = 0;
  const char* name = "";  // NVIDIA's description, e.g. "GPU has fallen off the bus"
  XidClass xid_class = XidClass::kMonitor;
  const char* advice = "";  // what an operator does next
};

// The rule for `code`; nullptr for an XID gpufleet has no rule for.
const XidRule* FindXidRule(int code);

// One reason a GPU is not simply healthy.
struct HealthFinding {
  std::string rule;  // "xid", "ecc", "row_remap", "lost", "thermal", "clocks"
  GpuHealth health = GpuHealth::kHealthy;
  DrainAction drain = DrainAction::kNone;
  std::string reason;  // for a person, e.g. "XID 79: GPU has fallen off the bus; drain now"

  friend bool operator==(const HealthFinding&, const HealthFinding&) = default;
};

// The verdict on one GPU: the worst of its findings (Healthy when there are none). Unhealthy
// means no new work goes to the GPU; `drain` says what happens to the work already there.
struct GpuHealthReport {
  int gpu_index = 0;
  GpuHealth health = GpuHealth::kHealthy;
  DrainAction drain = DrainAction::kNone;
  std::optional<int> thermal_headroom_c;  // slowdown threshold minus temperature
  std::vector<HealthFinding> findings;

  // "XID 79: ...; drain now | temperature 84 C, 3 C below slowdown"; "healthy" when none.
  std::string Summary() const;
};

struct HealthOptions {
  // Below this many degrees under the slowdown threshold the GPU is Degraded.
  int min_thermal_headroom_c = 5;
  // DCGM's memory watch warns from this many uncorrectable remapped rows (Ampere and later).
  int64_t uncorrectable_remapped_rows_warning = 512;
};

// Judges one GPU from its identity, its latest sample and the XIDs seen since its last reset
// (code -> count).
GpuHealthReport EvaluateGpuHealth(const GpuStaticInfo& info, const GpuSample& sample,
                                  const std::map<int, int64_t>& xids_since_reset,
                                  const HealthOptions& options = {});

}  // namespace gpufleet::agent
