// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/scheduler/framework.h"

// The constraint plugins: which GPUs may serve a task and which nodes may host it.
namespace gpufleet::scheduler {

// GPU model on the job's allowed list and at least the job's minimum GPU memory.
class GpuModelFilter final : public GpuFilterPlugin {
 public:
  std::string_view Name() const override { return "gpu-model"; }
  bool Admits(const TaskContext& task, const GpuSlot& gpu) const override;
  std::string_view RejectReason() const override {
    return "GPU model not allowed or too little GPU memory";
  }
};

// Unhealthy and quarantined GPUs never serve a task; degraded ones still do.
class GpuHealthFilter final : public GpuFilterPlugin {
 public:
  std::string_view Name() const override { return "gpu-health"; }
  bool Admits(const TaskContext& task, const GpuSlot& gpu) const override;
  std::string_view RejectReason() const override { return "GPU unhealthy or quarantined"; }
};

// GPUs closer than `min_headroom_c` degrees to their slowdown temperature serve no new task.
class ThermalHeadroomFilter final : public GpuFilterPlugin {
 public:
  explicit ThermalHeadroomFilter(int min_headroom_c) : min_headroom_c_(min_headroom_c) {}
  std::string_view Name() const override { return "thermal-headroom"; }
  bool Admits(const TaskContext& task, const GpuSlot& gpu) const override;
  std::string_view RejectReason() const override {
    return "GPU too close to its slowdown temperature";
  }

 private:
  int min_headroom_c_;
};

// Only Ready nodes take new tasks: cordoned, draining and not-ready ones do not.
class NodeReadyFilter final : public FilterPlugin {
 public:
  std::string_view Name() const override { return "node-ready"; }
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
};

// Every key of the job's node selector is on the node with the same value.
class NodeSelectorFilter final : public FilterPlugin {
 public:
  std::string_view Name() const override { return "node-selector"; }
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
};

// A task with an image runs only on a node whose agent runs containers (kContainerRuntimeLabel);
// a task without one runs anywhere.
class ContainerRuntimeFilter final : public FilterPlugin {
 public:
  std::string_view Name() const override { return "container-runtime"; }
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
};

// A node labelled kLinkDegradedLabel takes no task of a job that may span nodes: more than one
// task, and no required level that keeps them on one node (kNodeLevel, kNvlinkDomainLevel).
// A one-task job, or a gang held to one node, uses no inter-node link and may go there.
class LinkHealthFilter final : public FilterPlugin {
 public:
  std::string_view Name() const override { return "link-health"; }
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
};

// The value of one key of the job's identical-stack list on `node`: the label's value (nullopt
// when the node lacks it) or, for kImageDigestStackKey, the digest the node holds each task image
// at, from its agent's image reports, "-" for one it does not hold, joined with ','. With a
// pinned digest (Job::identical_image_digest) every node it admits will run that digest: the
// value is the digest. Pure.
std::optional<std::string> StackValue(const Job& job, const Node& node, const std::string& key);

// The node carries every label of the job's identical-stack list, and holds no task image at a
// digest other than the job's pinned one (the gang search then keeps the whole gang on nodes
// with equal values).
class StackLabelsFilter final : public FilterPlugin {
 public:
  std::string_view Name() const override { return "identical-stack"; }
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
};

// Free CPU and memory for one more task.
class HostResourcesFit final : public FilterPlugin {
 public:
  std::string_view Name() const override { return "host-resources"; }
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
};

// Free GPUs (whole, share or MIG slot) among the admitted ones for one more task.
class GpuResourcesFit final : public FilterPlugin {
 public:
  std::string_view Name() const override { return "gpu-resources"; }
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
  bool UsesGpuMask() const override { return true; }
};

// Spreads a job's tasks across the values of a fault-domain kind with a maximum skew, counting
// the tasks reserved in this cycle; domains are the values found on Ready nodes that match the
// job's node selector.
class FaultDomainSpread final : public PreFilterPlugin, public FilterPlugin, public ReservePlugin {
 public:
  std::string_view Name() const override { return "fault-domain-spread"; }
  PluginResult PreFilter(CycleState& state, const ClusterSnapshot& snapshot) override;
  PluginResult Filter(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                      GpuMask gpus) const override;
  void Reserve(CycleState& state, const TaskPlacement& placement,
               const ClusterSnapshot& snapshot) override;
  void Unreserve(CycleState& state, const TaskPlacement& placement,
                 const ClusterSnapshot& snapshot) override;
};

// Rejects jobs whose topology levels the cluster does not have.
class TopologyLevelsCheck final : public PreFilterPlugin {
 public:
  std::string_view Name() const override { return "topology-levels"; }
  PluginResult PreFilter(CycleState& state, const ClusterSnapshot& snapshot) override;
};

// Prefers nodes in the preferred-level domain that already holds most of the gang's reserved
// tasks, so a gang that cannot fit one preferred domain still spreads over as few as possible.
class TopologyPreferenceScore final : public ScorePlugin {
 public:
  std::string_view Name() const override { return "topology-preference"; }
  // With nothing reserved every node scores 0.
  bool ScoresNodeAlone() const override { return true; }
  int64_t Score(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                GpuMask gpus) override;
  void NormalizeScores(std::vector<int64_t>& scores) const override;
};

}  // namespace gpufleet::scheduler
