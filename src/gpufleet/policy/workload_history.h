// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string_view>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/fragmentation.h"

// The target workload of the fgd and gpufleet placement policies (scheduler/fragmentation.h)
// learnt from the jobs a cluster has started, so that `gpufleet server` can run them without being
// told the task mix in advance (docs/policies.md, "In production").
namespace gpufleet::policy {

// Whether placement policy `name` scores against a target workload (fgd, gpufleet).
bool NeedsTargetWorkload(std::string_view name);

struct WorkloadHistoryOptions {
  // A task shape's weight halves every half-life: a mix that changes is followed within a few
  // half-lives. A day by default (docs/policies.md says why).
  Duration half_life = std::chrono::hours(24);
  // At most this many distinct shapes are kept; beyond it the lightest merges into its nearest
  // kept shape (same GPU models and count first, then the closest GPU share and CPU).
  size_t max_shapes = 64;
  // As TargetWorkload::FromShapes: the target keeps the heaviest shapes covering this share.
  double coverage = 0.95;

  // kInvalidArgument naming the field: half_life <= 0, max_shapes 0, coverage outside (0, 1].
  Status Validate() const;
};

// Task shapes (scheduler::ShapeOf: CPU, GPU share or whole-GPU count, GPU models) weighted by the
// GPUs they asked for (tasks x GPUs per task; a fractional share counts its milli-GPU), decayed
// exponentially with age. Tasks without GPUs and MIG tasks weigh nothing: fragmentation looks at
// the idle whole and shared GPUs only. Memory stays bounded by max_shapes whatever is recorded.
// Pure (time comes as an argument); thread-compatible.
class WorkloadHistory {
 public:
  // REQUIRES: options.Validate() is OK.
  explicit WorkloadHistory(WorkloadHistoryOptions options);

  // Adds `job`'s task groups as of `now`. A time earlier than the latest recorded one counts as
  // that time (no weight grows with age).
  void Record(const Job& job, MonoTime now);

  // The decayed mix (decay scales every weight alike, so it is the mix as of any time after the
  // last record): weights sum to 1; empty when nothing with GPUs was recorded.
  scheduler::TargetWorkload Target() const;

  // Distinct shapes held (<= max_shapes).
  size_t size() const { return weights_.size(); }
  bool empty() const { return weights_.empty(); }
  const WorkloadHistoryOptions& options() const { return options_; }

 private:
  // Multiplies every weight by the decay from last_ to `now` and moves last_ there.
  void DecayTo(MonoTime now);
  void Add(const scheduler::TaskShape& shape, double weight);
  // While over max_shapes: merges the lightest shape into its nearest other shape.
  void MergeRare();

  WorkloadHistoryOptions options_;
  MonoTime last_{};
  bool any_ = false;
  // Weight as of last_, in GPUs.
  std::map<scheduler::TaskShape, double> weights_;
};

}  // namespace gpufleet::policy
