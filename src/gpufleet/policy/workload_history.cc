// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/workload_history.h"

#include <cmath>
#include <cstdlib>
#include <tuple>
#include <variant>
#include <vector>

#include <fmt/core.h>

namespace gpufleet::policy {
namespace {

// A shape whose weight falls below this share of the total is forgotten: it cannot reach the
// target's coverage, and forgetting it keeps old shapes from lingering.
constexpr double kNegligibleShare = 1e-9;

// How far apart two shapes are for merging: a different GPU model set first, then the GPU count,
// the GPU share and the CPU; compared lexicographically.
std::tuple<bool, int64_t, int64_t, int64_t> Distance(const scheduler::TaskShape& a,
                                                     const scheduler::TaskShape& b) {
  return {a.gpu_models != b.gpu_models, std::llabs(int64_t{a.num_gpus} - b.num_gpus),
          std::llabs(a.gpu_milli - b.gpu_milli), std::llabs(a.cpu_milli - b.cpu_milli)};
}

}  // namespace

bool NeedsTargetWorkload(std::string_view name) {
  return name == "fgd" || name == "gpufleet";
}

Status WorkloadHistoryOptions::Validate() const {
  if (half_life <= Duration::zero()) {
    return InvalidArgumentError(
        fmt::format("workload half_life: {}s (must be positive)",
                    std::chrono::duration_cast<std::chrono::seconds>(half_life).count()));
  }
  if (max_shapes == 0) {
    return InvalidArgumentError("workload max_shapes: 0 (must be at least 1)");
  }
  if (!(coverage > 0 && coverage <= 1)) {
    return InvalidArgumentError(fmt::format("workload coverage: {} (must be in (0, 1])", coverage));
  }
  return Status::Ok();
}

WorkloadHistory::WorkloadHistory(WorkloadHistoryOptions options) : options_(std::move(options)) {}

void WorkloadHistory::DecayTo(MonoTime now) {
  if (!any_) {
    last_ = now;
    any_ = true;
    return;
  }
  if (now <= last_) {
    return;
  }
  const double half_lives = std::chrono::duration<double>(now - last_).count() /
                            std::chrono::duration<double>(options_.half_life).count();
  const double factor = std::exp2(-half_lives);
  double total = 0;
  for (auto& [shape, weight] : weights_) {
    weight *= factor;
    total += weight;
  }
  std::erase_if(weights_, [&](const auto& entry) {
    return !(entry.second > 0) || entry.second < kNegligibleShare * total;
  });
  last_ = now;
}

void WorkloadHistory::Add(const scheduler::TaskShape& shape, double weight) {
  weights_[shape] += weight;
  MergeRare();
}

void WorkloadHistory::MergeRare() {
  while (weights_.size() > options_.max_shapes) {
    auto lightest = weights_.begin();
    for (auto it = weights_.begin(); it != weights_.end(); ++it) {
      if (it->second < lightest->second) {
        lightest = it;
      }
    }
    auto nearest = weights_.end();
    for (auto it = weights_.begin(); it != weights_.end(); ++it) {
      if (it != lightest &&
          (nearest == weights_.end() ||
           Distance(lightest->first, it->first) < Distance(lightest->first, nearest->first))) {
        nearest = it;
      }
    }
    // max_shapes >= 1, so there is another shape.
    nearest->second += lightest->second;
    weights_.erase(lightest);
  }
}

void WorkloadHistory::Record(const Job& job, MonoTime now) {
  DecayTo(now);
  for (const TaskGroup& group : job.groups) {
    if (group.replicas <= 0 || std::holds_alternative<MigGpus>(group.request.gpus)) {
      continue;
    }
    const int64_t milli = RequestedGpuMilli(group.request.gpus);
    if (milli <= 0) {
      continue;
    }
    const double gpus = static_cast<double>(group.replicas) * static_cast<double>(milli) /
                        static_cast<double>(kMilliPerUnit);
    Add(scheduler::ShapeOf(group.request, job.allowed_gpu_models), gpus);
  }
}

scheduler::TargetWorkload WorkloadHistory::Target() const {
  // Decay multiplies every weight by the same factor: the weights as of the last record give the
  // shares as of any later time.
  std::vector<scheduler::TaskClass> classes;
  classes.reserve(weights_.size());
  for (const auto& [shape, weight] : weights_) {
    classes.push_back({shape, weight});
  }
  return scheduler::TargetWorkload::FromWeights(std::move(classes), options_.coverage);
}

}  // namespace gpufleet::policy
