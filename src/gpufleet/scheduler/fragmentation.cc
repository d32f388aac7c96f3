// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/fragmentation.h"

#include <algorithm>
#include <map>

namespace gpufleet::scheduler {

TaskShape ShapeOf(const TaskRequest& request, const std::vector<std::string>& allowed_models) {
  TaskShape shape;
  shape.cpu_milli = request.host.cpu_milli;
  if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
    shape.gpu_milli = kMilliPerUnit;
    shape.num_gpus = whole->count;
  } else if (const auto* share = std::get_if<FractionalGpu>(&request.gpus)) {
    shape.gpu_milli = share->gpu_milli;
    shape.num_gpus = 1;
  } else if (std::holds_alternative<MigGpus>(request.gpus)) {
    // MIG instances live on MIG-mode GPUs, which fractional fragmentation does not look at.
    shape.gpu_milli = RequestedGpuMilli(request.gpus);
    shape.num_gpus = 1;
  }
  if (shape.num_gpus > 0) {
    shape.gpu_models = allowed_models;
    std::sort(shape.gpu_models.begin(), shape.gpu_models.end());
  }
  return shape;
}

TargetWorkload TargetWorkload::FromShapes(const std::vector<TaskShape>& shapes, double coverage) {
  std::map<TaskShape, int64_t> counts;
  for (const TaskShape& shape : shapes) {
    ++counts[shape];
  }
  std::vector<TaskClass> counted;
  counted.reserve(counts.size());
  for (const auto& [shape, count] : counts) {
    counted.push_back({shape, static_cast<double>(count)});
  }
  return FromWeights(std::move(counted), coverage);
}

TargetWorkload TargetWorkload::FromWeights(std::vector<TaskClass> weighted, double coverage) {
  std::erase_if(weighted, [](const TaskClass& c) { return !(c.weight > 0); });
  std::stable_sort(weighted.begin(), weighted.end(), [](const TaskClass& a, const TaskClass& b) {
    if (a.weight != b.weight) {
      return a.weight > b.weight;
    }
    return a.shape > b.shape;  // larger CPU, then GPU share, GPU count, models first
  });
  double total = 0;
  for (const TaskClass& task_class : weighted) {
    total += task_class.weight;
  }
  TargetWorkload workload;
  double kept = 0;
  for (TaskClass& task_class : weighted) {
    if (kept >= coverage * total) {
      break;
    }
    kept += task_class.weight;
    workload.classes_.push_back(std::move(task_class));
  }
  for (TaskClass& task_class : workload.classes_) {
    task_class.weight /= kept;
  }
  return workload;
}

FragmentationModel::FragmentationModel(const TargetWorkload& workload,
                                       const ClusterSnapshot& snapshot, Kind kind)
    : workload_(&workload), kind_(kind) {
  for (const TaskClass& task_class : workload.classes()) {
    std::vector<bool> models(snapshot.ModelCount(), task_class.shape.gpu_models.empty());
    for (const std::string& name : task_class.shape.gpu_models) {
      const int id = snapshot.ModelId(name);
      if (id >= 0) {
        models[id] = true;
      }
    }
    accessible_.push_back(std::move(models));
  }
}

double FragmentationModel::NodeFragmentation(int64_t cpu_free, int model_id,
                                             std::span<const int64_t> free_milli) const {
  int64_t idle = 0;
  for (int64_t free : free_milli) {
    idle += free;
  }
  if (idle == 0) {
    return 0;
  }
  double fragmentation = 0;
  const std::vector<TaskClass>& classes = workload_->classes();
  for (size_t c = 0; c < classes.size(); ++c) {
    const TaskShape& shape = classes[c].shape;
    int64_t unusable = idle;
    const bool can_run = shape.num_gpus > 0 && model_id >= 0 && accessible_[c][model_id] &&
                         cpu_free >= shape.cpu_milli;
    const bool share_class = shape.num_gpus == 1 && shape.gpu_milli < kMilliPerUnit;
    if (can_run && share_class && kind_ == Kind::kPackedShares) {
      int64_t shares = 0;
      for (int64_t free : free_milli) {
        shares += free / shape.gpu_milli;
      }
      if (shape.cpu_milli > 0) {
        shares = std::min(shares, cpu_free / shape.cpu_milli);
      }
      unusable = idle - shares * shape.gpu_milli;
    } else if (can_run) {
      int fitting = 0;
      int64_t too_small = 0;
      for (int64_t free : free_milli) {
        if (free >= shape.gpu_milli) {
          ++fitting;
        } else {
          too_small += free;
        }
      }
      if (fitting >= shape.num_gpus) {
        unusable = too_small;
      }
    }
    fragmentation += classes[c].weight * static_cast<double>(unusable);
  }
  return fragmentation;
}

void CollectFreeMilli(const NodeInfo& node, std::vector<int64_t>& out) {
  out.clear();
  for (const GpuSlot& gpu : node.gpus) {
    if (!gpu.mig_enabled &&
        (gpu.health == GpuHealth::kHealthy || gpu.health == GpuHealth::kDegraded)) {
      out.push_back(gpu.free_milli);
    }
  }
}

int NodeModelId(const NodeInfo& node) {
  return node.gpus.empty() ? -1 : node.gpus[0].model_id;
}

double FragmentationModel::NodeFragmentation(const NodeInfo& node) const {
  std::vector<int64_t> free_milli;
  CollectFreeMilli(node, free_milli);
  return NodeFragmentation(node.free.cpu_milli, NodeModelId(node), free_milli);
}

double FragmentationModel::ClusterFragmentation(const ClusterSnapshot& snapshot) const {
  double total = 0;
  for (const NodeInfo& node : snapshot.nodes()) {
    total += NodeFragmentation(node);
  }
  return total;
}

}  // namespace gpufleet::scheduler
