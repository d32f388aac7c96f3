// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/scheduler/snapshot.h"

// Extension points in the style of the Kubernetes scheduling framework: PreFilter (once per job),
// GPU filters and node filters (per task group and node), Score (per task and node), Reserve /
// Unreserve (per placed task) and Bind (per placed job). Plugins are thread-compatible; one
// Scheduler, with its plugins, serves one thread.
namespace gpufleet::scheduler {

enum class Code {
  kSuccess,
  kUnschedulable,                 // may fit after the cluster changes (resources free up)
  kUnschedulableAndUnresolvable,  // will not fit until the job or the nodes' attributes change
  kError,
  kSkip,  // the plugin has nothing to say for this job
};

// The outcome of one plugin call. `reason` is short and static ("node is cordoned") so that the
// hot path never allocates; per-job reasons with values go into ScheduleResult.
struct PluginResult {
  Code code = Code::kSuccess;
  std::string_view reason;

  bool ok() const { return code == Code::kSuccess || code == Code::kSkip; }
  static PluginResult Success() { return {}; }
  static PluginResult Unschedulable(std::string_view why) { return {Code::kUnschedulable, why}; }
  static PluginResult Unresolvable(std::string_view why) {
    return {Code::kUnschedulableAndUnresolvable, why};
  }
};

// Bit i set: GPU i of a node may serve the task.
using GpuMask = uint64_t;

// What every plugin needs to know about the task being placed, resolved once per task group.
struct TaskContext {
  const ClusterSnapshot* snapshot = nullptr;
  const Job* job = nullptr;
  int group = 0;
  const TaskRequest* request = nullptr;
  std::vector<bool> model_allowed;             // by snapshot model id
  std::vector<const MigProfile*> mig_profile;  // by snapshot model id; set for MIG requests
};

// Data a plugin keeps for the duration of one job's scheduling cycle.
class CycleData {
 public:
  virtual ~CycleData() = default;
};

// Per-job scratch shared by the plugins; also records the tasks reserved so far in this cycle.
class CycleState {
 public:
  explicit CycleState(const Job& job) : job_(&job) {}

  const Job& job() const { return *job_; }
  const std::vector<TaskPlacement>& reserved() const { return reserved_; }
  void AddReserved(const TaskPlacement& placement) { reserved_.push_back(placement); }
  void PopReserved() { reserved_.pop_back(); }

  void Put(std::string_view key, std::unique_ptr<CycleData> data) {
    data_[std::string(key)] = std::move(data);
  }
  template <typename T>
  T* Get(std::string_view key) const {
    auto it = data_.find(key);
    return it == data_.end() ? nullptr : static_cast<T*>(it->second.get());
  }

 private:
  const Job* job_;
  std::vector<TaskPlacement> reserved_;
  std::map<std::string, std::unique_ptr<CycleData>, std::less<>> data_;
};

class Plugin {
 public:
  virtual ~Plugin() = default;
  virtual std::string_view Name() const = 0;
};

// Runs once per job before any node is looked at: checks the job against the cluster as a whole
// and prepares CycleData.
class PreFilterPlugin : public virtual Plugin {
 public:
  virtual PluginResult PreFilter(CycleState& state, const ClusterSnapshot& snapshot) = 0;
};

// Decides per GPU whether it may serve a task (model, memory, health, temperature). A node is
// judged on its admitted GPUs only.
class GpuFilterPlugin : public virtual Plugin {
 public:
  virtual bool Admits(const TaskContext& task, const GpuSlot& gpu) const = 0;
  // Why a GPU was not admitted, e.g. "GPU unhealthy or quarantined".
  virtual std::string_view RejectReason() const = 0;
};

// Decides whether a node can host one more task of the group now. `gpus` is the mask of GPUs the
// GPU filters admitted.
class FilterPlugin : public virtual Plugin {
 public:
  virtual PluginResult Filter(const CycleState& state, const TaskContext& task,
                              const NodeInfo& node, GpuMask gpus) const = 0;
  // Filters that look at `gpus` run after the GPU filters; the others run first, so a node they
  // reject costs no per-GPU work.
  virtual bool UsesGpuMask() const { return false; }
};

// Scores a feasible node for a task; higher is better. A placement policy also chooses the GPUs on
// the node it wins (PickGpus); other score plugins leave that to the policy or the default.
class ScorePlugin : public virtual Plugin {
 public:
  // Runs once per task before Score, with every feasible node.
  virtual void PreScore(const CycleState& /*state*/, const TaskContext& /*task*/,
                        const std::vector<const NodeInfo*>& /*feasible*/, Random& /*random*/) {}
  virtual int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                        GpuMask gpus) = 0;
  // True when, for the first task of a job (nothing reserved yet), Score depends only on the
  // job's spec, the task and the node's state (NodeInfo::version), once PreScore has run for the
  // task with any feasible list: not on the other nodes or the random source. The scheduler then
  // keeps such raw scores across jobs of one shape and across calls while a node is unchanged.
  virtual bool ScoresNodeAlone() const { return false; }
  // Maps raw scores to [0, kMaxNodeScore]; the default leaves them as they are. Equal raw scores
  // must map to equal scores: the scheduler skips a plugin whose raw scores are all equal.
  virtual void NormalizeScores(std::vector<int64_t>& /*scores*/) const {}
  // The GPUs the task gets on `node`; nullopt: use the default choice.
  virtual std::optional<std::vector<GpuAssignment>> PickGpus(const TaskContext& /*task*/,
                                                             const NodeInfo& /*node*/,
                                                             GpuMask /*gpus*/, Random& /*random*/) {
    return std::nullopt;
  }
};

inline constexpr int64_t kMaxNodeScore = 100;

// Scales non-negative raw scores so that the highest becomes kMaxNodeScore (all 0 stay 0).
inline void ScaleToMaxNodeScore(std::vector<int64_t>& scores) {
  const int64_t highest = scores.empty() ? 0 : *std::max_element(scores.begin(), scores.end());
  for (int64_t& score : scores) {
    score = highest == 0 ? 0 : score * kMaxNodeScore / highest;
  }
}

// Keeps plugin state in step with placements that are tried and rolled back.
// Unreserve must be idempotent and may be called for a task whose Reserve was not called.
class ReservePlugin : public virtual Plugin {
 public:
  virtual void Reserve(CycleState& state, const TaskPlacement& placement,
                       const ClusterSnapshot& snapshot) = 0;
  virtual void Unreserve(CycleState& state, const TaskPlacement& placement,
                         const ClusterSnapshot& snapshot) = 0;
};

// Makes a placed job real: the server writes it to the store, the simulator records it. A failed
// Bind rolls the whole job back.
class Binder {
 public:
  virtual ~Binder() = default;
  virtual Status Bind(const Job& job, const std::vector<TaskPlacement>& placements,
                      const ClusterSnapshot& snapshot) = 0;
};

}  // namespace gpufleet::scheduler
