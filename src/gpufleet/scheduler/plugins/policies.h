// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/scheduler/fragmentation.h"
#include "gpufleet/scheduler/framework.h"

// The placement policies of the FGD paper (Weng et al., USENIX ATC'23) as score plugins, defined
// as in its reference simulator (hkust-adsl/kubernetes-scheduler-simulator, pkg/simulator/plugin):
// integer scores in [0, 100], higher is better; the framework breaks ties (SchedulerOptions).
// docs/policies.md gives each formula.
namespace gpufleet::scheduler {

// Normalisation constants of the reference simulator: 128 cores and 8 GPUs per node at most.
inline constexpr int64_t kPolicyMaxCpuMilli = 128000;
inline constexpr int64_t kPolicyMaxGpuMilli = 8000;

// Uniformly random feasible node; a fractional share on a uniformly random fitting GPU.
class RandomPolicy final : public ScorePlugin {
 public:
  std::string_view Name() const override { return "random"; }
  void PreScore(const CycleState& state, const TaskContext& task,
                const std::vector<const NodeInfo*>& feasible, Random& random) override;
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
  std::optional<std::vector<GpuAssignment>> PickGpus(const TaskContext& task, const NodeInfo& node,
                                                     GpuMask gpus, Random& random) override;

 private:
  int chosen_node_ = -1;
};

// The node whose free (CPU, GPU) vector has the smallest dot product with the request.
class DotProdPolicy final : public ScorePlugin {
 public:
  std::string_view Name() const override { return "dot-prod"; }
  bool ScoresNodeAlone() const override { return true; }
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
};

// Nodes already running tasks of the same GPU kind first, then empty nodes, then the others;
// within a band, the node with more GPU in use.
class GpuClusteringPolicy final : public ScorePlugin {
 public:
  std::string_view Name() const override { return "gpu-clustering"; }
  bool ScoresNodeAlone() const override { return true; }
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
};

// Share a partly used GPU first, then open idle GPUs of a used node, then an idle node.
class GpuPackingPolicy final : public ScorePlugin {
 public:
  std::string_view Name() const override { return "gpu-packing"; }
  bool ScoresNodeAlone() const override { return true; }
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
};

// The node left with the least free CPU and GPU (equal weights) after the placement.
class BestFitPolicy final : public ScorePlugin {
 public:
  std::string_view Name() const override { return "best-fit"; }
  bool ScoresNodeAlone() const override { return true; }
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
  void NormalizeScores(std::vector<int64_t>& scores) const override;
};

// Fragmentation gradient descent: the node and GPU whose fragmentation (for the target workload)
// grows least. "fgd" is the paper's policy; "gpufleet", ours, measures fragmentation with packed
// shares and scores it on a linear scale (docs/policies.md). Fragmentation values are memoised by
// node state, which makes a decision over thousands of nodes cheap.
// How a policy of the FGD family measures and scores a placement.
struct FgdScoring {
  // kFgd for the paper's policy; kPackedShares for gpufleet's (see FragmentationModel).
  FragmentationModel::Kind fragmentation = FragmentationModel::Kind::kFgd;
  // <= 0: FGD's score, trunc(100 * sigmoid(-increase / 1000)). > 0: floor(-increase / quantum),
  // a linear scale whose steps are `quantum_milli` milli-GPU wide.
  double quantum_milli = 0;

  int64_t Score(double increase) const;
};

class FgdPolicy final : public ScorePlugin {
 public:
  FgdPolicy(std::string name, TargetWorkload workload, FgdScoring scoring = {});
  ~FgdPolicy() override;

  std::string_view Name() const override { return name_; }
  // A score is the fragmentation change of the node alone, for a target workload fixed for the
  // policy's life.
  bool ScoresNodeAlone() const override { return true; }
  void PreScore(const CycleState& state, const TaskContext& task,
                const std::vector<const NodeInfo*>& feasible, Random& random) override;
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
  std::optional<std::vector<GpuAssignment>> PickGpus(const TaskContext& task, const NodeInfo& node,
                                                     GpuMask gpus, Random& random) override;

 private:
  struct Memo;

  std::string name_;
  TargetWorkload workload_;
  FgdScoring scoring_;
  std::unique_ptr<Memo> memo_;
};

// gpufleet's score quantum for `workload` (docs/policies.md): kGpufleetFineQuantumMilli when every
// GPU class of the workload asks for one GPU (a share or a whole one) of any model, otherwise
// kGpufleetCoarseQuantumMilli. Multi-GPU and model-constrained classes make FGD's all-or-nothing
// terms jump by whole GPUs between nodes; the coarse step keeps those jumps from scattering tasks.
inline constexpr double kGpufleetFineQuantumMilli = 75;
inline constexpr double kGpufleetCoarseQuantumMilli = 150;
double GpufleetScoreQuantum(const TargetWorkload& workload);

// trunc(100 * sigmoid(-increase / 1000)): FGD's score for a fragmentation increase in milli-GPU.
int64_t FgdScore(double fragmentation_increase);

}  // namespace gpufleet::scheduler
