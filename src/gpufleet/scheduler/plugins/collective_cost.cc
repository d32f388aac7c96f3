// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/collective_cost.h"

#include <algorithm>
#include <cmath>

namespace gpufleet::scheduler {

CollectiveCostScore::CollectiveCostScore(std::shared_ptr<const fabric::Fabric> fabric,
                                         Options options)
    : fabric_(std::move(fabric)), options_(options) {}

void CollectiveCostScore::Bind(const ClusterSnapshot& snapshot) {
  if (bound_ == &snapshot && bound_identity_ == snapshot.identity()) {
    return;
  }
  bound_ = &snapshot;
  bound_identity_ = snapshot.identity();
  fabric_node_.clear();
  for (const NodeInfo& node : snapshot.nodes()) {
    fabric_node_.push_back(fabric_->FindNode(node.node->id.value()));
  }
}

int CollectiveCostScore::DomainAt(int level, int node) const {
  if (level == 0) {
    return node;
  }
  if (level == 1) {
    const int shared = fabric_->nodes()[node].nvlink_domain;
    return shared >= 0 ? static_cast<int>(fabric_->nodes().size()) + shared : node;
  }
  return fabric_->DomainOf(level - 2, node);
}

void CollectiveCostScore::PreScore(const CycleState& state, const TaskContext& task,
                                   const std::vector<const NodeInfo*>& feasible,
                                   Random& /*random*/) {
  const Job& job = state.job();
  const auto* whole = std::get_if<WholeGpus>(&task.request->gpus);
  active_ = whole != nullptr && job.TaskCount() > 1;
  if (!active_) {
    return;
  }
  Bind(*task.snapshot);
  gang_gpus_ = 0;
  for (const TaskGroup& group : job.groups) {
    if (const auto* gpus = std::get_if<WholeGpus>(&group.request.gpus)) {
      gang_gpus_ += gpus->count * group.replicas;
    }
  }
  int reserved_gpus = 0;
  reserved_domain_.assign(Levels(), -1);
  for (const TaskPlacement& placed : state.reserved()) {
    reserved_gpus += static_cast<int>(placed.gpus.size());
    const int node = fabric_node_[placed.node];
    for (int level = 0; level < Levels(); ++level) {
      const int domain = node < 0 ? -2 : DomainAt(level, node);
      int& common = reserved_domain_[level];
      common = common == -1 || common == domain ? domain : -2;
    }
  }
  remaining_gpus_ = std::max(0, gang_gpus_ - reserved_gpus);
  // Free GPUs, in whole tasks' worth, per domain of every level among the feasible nodes.
  const int node_count = static_cast<int>(fabric_->nodes().size());
  free_gpus_.assign(Levels(), {});
  free_gpus_[0].assign(node_count, 0);
  free_gpus_[1].assign(node_count + fabric_->nvlink_domains().size(), 0);
  for (int t = 0; t < fabric_->TierCount(); ++t) {
    free_gpus_[2 + t].assign(fabric_->DomainCount(t), 0);
  }
  for (const NodeInfo* node : feasible) {
    const int fabric_node = fabric_node_[node->index];
    if (fabric_node < 0) {
      continue;
    }
    const int64_t usable = node->IdleGpuCount() / whole->count * whole->count;
    for (int level = 0; level < Levels(); ++level) {
      free_gpus_[level][DomainAt(level, fabric_node)] += usable;
    }
  }
}

double CollectiveCostScore::EstimateSeconds(const NodeInfo& node) const {
  const int fabric_node = fabric_node_[node.index];
  // The lowest level whose domain around `node` holds the reserved tasks and the rest.
  int level = Levels();
  if (fabric_node >= 0) {
    for (int l = 0; l < Levels(); ++l) {
      const int domain = DomainAt(l, fabric_node);
      const int common = reserved_domain_[l];
      if ((common == -1 || common == domain) && free_gpus_[l][domain] >= remaining_gpus_) {
        level = l;
        break;
      }
    }
  }
  const int like = fabric_node >= 0 ? fabric_node : 0;
  const int per_domain = level <= 1 ? gang_gpus_ : fabric_->NvlinkDomainGpus(like);
  const int common_tier = level <= 1 ? -1 : level - 2;
  const fabric::PlacementShape shape =
      fabric::UniformShape(*fabric_, like, gang_gpus_, per_domain, common_tier);
  return fabric::EstimateCollective(fabric::Collective::kAllReduce, options_.collective_bytes,
                                    shape, options_.cost)
      .seconds;
}

int64_t CollectiveCostScore::Score(const CycleState& /*state*/, const TaskContext& /*task*/,
                                   const NodeInfo& node, GpuMask /*gpus*/) {
  if (!active_) {
    return 0;
  }
  return -std::llround(EstimateSeconds(node) * 1e9);
}

void CollectiveCostScore::NormalizeScores(std::vector<int64_t>& scores) const {
  if (!active_ || scores.empty()) {
    std::fill(scores.begin(), scores.end(), 0);
    return;
  }
  const double fastest = static_cast<double>(-*std::max_element(scores.begin(), scores.end()));
  for (int64_t& score : scores) {
    const double slowdown = fastest > 0 ? static_cast<double>(-score) / fastest - 1 : 0;
    score = std::llround(kMaxNodeScore * std::max(0.0, 1 - slowdown / options_.tolerance));
  }
}

}  // namespace gpufleet::scheduler
