// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "gpufleet/fabric/collective.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/scheduler/framework.h"

namespace gpufleet::scheduler {

// Prefers the node that keeps a multi-task gang's collectives fastest. For each candidate node it
// estimates the all-reduce time of the whole gang (fabric/collective.h) if the gang went where
// the candidate leads: with the tasks reserved so far, and the rest placed as close as the free
// GPUs of the candidate's domains allow (its node, NVLink domain, leaf domain, ...). A node whose
// leaf domain can take the rest of the gang therefore beats one whose gang would have to climb
// over an oversubscribed spine. Jobs of one task, and tasks without whole GPUs, score 0
// everywhere. Nodes are matched to the fabric by name; a node the fabric does not know counts as
// crossing every tier. Not thread-safe (one per Scheduler).
class CollectiveCostScore final : public ScorePlugin {
 public:
  struct Options {
    int64_t collective_bytes = int64_t{1} << 30;  // one all-reduce of 1 GiB per rank
    fabric::CostModelOptions cost;
    // Candidates this much slower than the best score 0, linearly from the best's 100: smaller
    // differences are left to the placement policy.
    double tolerance = 0.02;
  };

  // REQUIRES: `fabric` is not null.
  explicit CollectiveCostScore(std::shared_ptr<const fabric::Fabric> fabric)
      : CollectiveCostScore(std::move(fabric), Options()) {}
  CollectiveCostScore(std::shared_ptr<const fabric::Fabric> fabric, Options options);

  std::string_view Name() const override { return "collective-cost"; }
  void PreScore(const CycleState& state, const TaskContext& task,
                const std::vector<const NodeInfo*>& feasible, Random& random) override;
  // Minus the estimated collective time in nanoseconds.
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
  void NormalizeScores(std::vector<int64_t>& scores) const override;

  // The estimated gang all-reduce time, in seconds, if the gang grows from `node`; computed by
  // PreScore's data (for tests and explanations).
  double EstimateSeconds(const NodeInfo& node) const;

 private:
  void Bind(const ClusterSnapshot& snapshot);
  // Domain of fabric node `node` at `level`: 0 the node, 1 its NVLink domain, 2 + t tier t.
  int DomainAt(int level, int node) const;
  int Levels() const { return 2 + fabric_->TierCount(); }

  std::shared_ptr<const fabric::Fabric> fabric_;
  Options options_;
  const ClusterSnapshot* bound_ = nullptr;
  uint64_t bound_identity_ = 0;
  std::vector<int> fabric_node_;  // by snapshot node index; -1 when unknown

  // Per scheduling step (PreScore):
  bool active_ = false;
  int gang_gpus_ = 0;
  int remaining_gpus_ = 0;
  std::vector<std::vector<int64_t>> free_gpus_;  // [level][domain]
  std::vector<int> reserved_domain_;             // [level]: -1 none reserved, -2 several
};

}  // namespace gpufleet::scheduler
