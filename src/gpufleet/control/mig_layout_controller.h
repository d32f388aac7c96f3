// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

// MIG layouts in the scheduling cycle (docs/agent.md, "MIG layouts"): new layouts planned for
// pending MIG jobs that fit no current one, and the jobs that waited too long for instances
// their agent never reported sent back to Pending, the GPU's layout falling back to what the
// agent reports. It is the one writer of a node document's wanted layout (`mig_instances`).
namespace gpufleet::control {

// What a timed-out MIG wait ends: the node documents with their layouts dropped (updates at the
// versions read, with events) and the waiting jobs' runs, to be committed together.
struct MigRequeue {
  store::WriteBatch node_writes;
  std::vector<JobWrite> job_writes;
};

// Not thread-safe: it belongs to the thread that runs cycles.
class MigLayoutController {
 public:
  struct Options {
    // Must outlive the controller.
    store::StateStore& store;
    const GpuCatalog& catalog;
    const Clock& clock;
    std::chrono::seconds apply_timeout{120};
    std::chrono::seconds replan_delay{600};
  };
  explicit MigLayoutController(Options options) : options_(std::move(options)) {}

  // When pending MIG jobs fit no current layout (their reason says so in this capacity epoch),
  // plans new layouts for MIG GPUs of Ready agent nodes whose instances to destroy are free and
  // writes them into the node documents (the scheduler then sees the new instances; agents are
  // told to apply them). Returns whether a layout was written.
  Result<bool> PlanForPendingJobs(SchedulingView& view);

  // Jobs placed on MIG instances their node's agent has not reported for apply_timeout: the
  // writes that requeue them and drop the GPUs' unapplied layouts (nullopt when none timed out).
  // Once committed, Requeued() holds the nodes back from the planner for replan_delay or until
  // their devices change.
  Result<std::optional<MigRequeue>> PlanRequeue(const SchedulingView& view,
                                                const std::string& now_text);
  void Requeued();

 private:
  using GpuKey = std::pair<std::string, int>;  // node, GPU index
  struct Hold {
    MonoTime until;
    std::string devices;  // the MIG devices its agent reported when the hold began
  };

  Options options_;
  // The capacity epoch and the jobs of the last plan: planned again only when either changed.
  uint64_t planned_epoch_ = 0;
  std::set<std::string> planned_jobs_;
  // Since when jobs have waited for unreported MIG instances, by GPU.
  std::map<GpuKey, MonoTime> waits_;
  std::map<std::string, Hold> holds_;  // by node
  // What PlanRequeue dropped, until Requeued: the GPUs and their nodes' reported devices.
  std::map<GpuKey, std::string> dropping_;
};

}  // namespace gpufleet::control
