// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/snapshot.h"

// GPU fragmentation as the FGD paper (Weng et al., USENIX ATC'23) defines it: the idle GPU
// capacity of a node that the tasks of a target workload cannot use, weighted by how often each
// kind of task occurs.
namespace gpufleet::scheduler {

// A task as fragmentation sees it: CPU, milli-GPU per GPU (1000 for whole GPUs), GPU count and
// the allowed GPU models (canonical names; empty: any).
struct TaskShape {
  int64_t cpu_milli = 0;
  int64_t gpu_milli = 0;
  int num_gpus = 0;
  std::vector<std::string> gpu_models;

  friend auto operator<=>(const TaskShape&, const TaskShape&) = default;
};

TaskShape ShapeOf(const TaskRequest& request, const std::vector<std::string>& allowed_models);

struct TaskClass {
  TaskShape shape;
  double weight = 0;  // share of the workload; the weights of a TargetWorkload sum to 1
};

// The distribution of task kinds a cluster is expected to serve. Thread-compatible value type.
class TargetWorkload {
 public:
  TargetWorkload() = default;
  // The most frequent shapes that together cover `coverage` of `shapes` (FGD keeps 95%), weights
  // renormalised over the kept ones. Ties in frequency go to the larger CPU, GPU share, GPU count.
  static TargetWorkload FromShapes(const std::vector<TaskShape>& shapes, double coverage = 0.95);
  // The same from shapes with weights (distinct shapes, weights > 0; others are left out): the
  // heaviest covering `coverage` of the total weight, renormalised.
  static TargetWorkload FromWeights(std::vector<TaskClass> weighted, double coverage = 0.95);

  const std::vector<TaskClass>& classes() const { return classes_; }
  bool empty() const { return classes_.empty(); }

 private:
  std::vector<TaskClass> classes_;
};

// Evaluates fragmentation against one snapshot's model ids. Thread-compatible.
class FragmentationModel {
 public:
  // kFgd: the paper's measure. kPackedShares: the same, except that for a fractional-share class
  // the unusable GPU is what is left once as many of its shares as the free CPU and GPUs allow
  // are packed onto the node: the remainder on each GPU and the GPUs stranded for lack of CPU.
  enum class Kind { kFgd, kPackedShares };

  FragmentationModel(const TargetWorkload& workload, const ClusterSnapshot& snapshot,
                     Kind kind = Kind::kFgd);

  // F_n(M) in milli-GPU for a node with `cpu_free` milli-CPU whose GPUs are of `model_id` (-1: no
  // GPUs) with free milli-GPU `free_milli`: for each task class, all idle GPU if the class cannot
  // run on the node, else the idle GPU on GPUs too small for it; weighted by class share.
  double NodeFragmentation(int64_t cpu_free, int model_id,
                           std::span<const int64_t> free_milli) const;
  // The same for a node of the snapshot, counting its healthy and degraded non-MIG GPUs.
  double NodeFragmentation(const NodeInfo& node) const;
  double ClusterFragmentation(const ClusterSnapshot& snapshot) const;

  const TargetWorkload& workload() const { return *workload_; }

 private:
  const TargetWorkload* workload_;
  Kind kind_;
  // Per class: bit m set when the class may run on model id m; all bits for any model.
  std::vector<std::vector<bool>> accessible_;
};

// The free milli-GPU of the GPUs FGD looks at: healthy or degraded and not in MIG mode.
void CollectFreeMilli(const NodeInfo& node, std::vector<int64_t>& out);
// The model id of a node's GPUs (its first GPU's), or -1 for a node without GPUs.
int NodeModelId(const NodeInfo& node);

}  // namespace gpufleet::scheduler
