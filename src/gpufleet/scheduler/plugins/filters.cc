// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/filters.h"

#include <algorithm>
#include <climits>

#include "gpufleet/scheduler/devices.h"
#include "gpufleet/scheduler/plugins/image_locality.h"

namespace gpufleet::scheduler {
namespace {

constexpr std::string_view kSpreadKey = "fault-domain-spread";

struct SpreadData final : CycleData {
  std::map<std::string, int, std::less<>> counts;  // every eligible domain, with its task count
};

const std::string* FaultDomainOf(const NodeInfo& node, const std::string& kind) {
  auto it = node.node->fault_domains.find(kind);
  return it == node.node->fault_domains.end() ? nullptr : &it->second;
}

bool SelectorMatches(const Job& job, const NodeInfo& node) {
  for (const auto& [key, value] : job.node_selector) {
    auto it = node.node->labels.find(key);
    if (it == node.node->labels.end() || it->second != value) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool GpuModelFilter::Admits(const TaskContext& task, const GpuSlot& gpu) const {
  return task.model_allowed[gpu.model_id] && gpu.memory_mib >= task.job->min_gpu_memory_mib;
}

bool GpuHealthFilter::Admits(const TaskContext& /*task*/, const GpuSlot& gpu) const {
  return gpu.health == GpuHealth::kHealthy || gpu.health == GpuHealth::kDegraded;
}

bool ThermalHeadroomFilter::Admits(const TaskContext& /*task*/, const GpuSlot& gpu) const {
  return gpu.thermal_headroom_c >= min_headroom_c_;
}

PluginResult NodeReadyFilter::Filter(const CycleState& /*state*/, const TaskContext& /*task*/,
                                     const NodeInfo& node, GpuMask /*gpus*/) const {
  switch (node.node->state) {
    case NodeState::kReady:
      return PluginResult::Success();
    case NodeState::kCordoned:
      return PluginResult::Unresolvable("node is cordoned");
    case NodeState::kDraining:
      return PluginResult::Unresolvable("node is draining");
    case NodeState::kNotReady:
      return PluginResult::Unresolvable("node is not ready");
  }
  return PluginResult::Unresolvable("node state unknown");
}

PluginResult NodeSelectorFilter::Filter(const CycleState& state, const TaskContext& /*task*/,
                                        const NodeInfo& node, GpuMask /*gpus*/) const {
  return SelectorMatches(state.job(), node)
             ? PluginResult::Success()
             : PluginResult::Unresolvable("node labels do not match the node selector");
}

PluginResult LinkHealthFilter::Filter(const CycleState& state, const TaskContext& /*task*/,
                                      const NodeInfo& node, GpuMask /*gpus*/) const {
  const auto degraded = node.node->labels.find(std::string(kLinkDegradedLabel));
  if (degraded == node.node->labels.end() || degraded->second != "true") {
    return PluginResult::Success();
  }
  const Job& job = state.job();
  int tasks = 0;
  for (const TaskGroup& group : job.groups) {
    tasks += group.replicas;
  }
  const std::string& level = job.topology.required_level;
  if (tasks <= 1 || level == kNodeLevel || level == kNvlinkDomainLevel) {
    return PluginResult::Success();
  }
  return PluginResult::Unresolvable(
      "node has a degraded link (gpufleet.io/link-degraded) and the gang may span nodes");
}

PluginResult ContainerRuntimeFilter::Filter(const CycleState& /*state*/, const TaskContext& task,
                                            const NodeInfo& node, GpuMask /*gpus*/) const {
  if (task.job->groups[static_cast<size_t>(task.group)].image.empty()) {
    return PluginResult::Success();
  }
  const auto runtime = node.node->labels.find(std::string(kContainerRuntimeLabel));
  return runtime != node.node->labels.end() && !runtime->second.empty()
             ? PluginResult::Success()
             : PluginResult::Unresolvable(
                   "node runs no container runtime (its agent runs processes only)");
}

namespace {

// The job's task images, each once, in group order.
std::vector<std::string> TaskImages(const Job& job) {
  std::vector<std::string> images;
  for (const TaskGroup& group : job.groups) {
    if (!group.image.empty() &&
        std::find(images.begin(), images.end(), group.image) == images.end()) {
      images.push_back(group.image);
    }
  }
  return images;
}

}  // namespace

std::optional<std::string> StackValue(const Job& job, const Node& node, const std::string& key) {
  if (key != kImageDigestStackKey) {
    const auto it = node.labels.find(key);
    return it == node.labels.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  if (!job.identical_image_digest.empty()) {
    return job.identical_image_digest;
  }
  std::string value;
  for (const std::string& image : TaskImages(job)) {
    const CachedImage* held = ImageLocalityScore::FindImage(node, image);
    value += value.empty() ? "" : ",";
    value += held == nullptr || held->digest.empty() ? "-" : held->digest;
  }
  return value.empty() ? "-" : value;
}

PluginResult StackLabelsFilter::Filter(const CycleState& state, const TaskContext& /*task*/,
                                       const NodeInfo& node, GpuMask /*gpus*/) const {
  const Job& job = state.job();
  for (const std::string& key : job.identical_stack_labels) {
    if (!StackValue(job, *node.node, key).has_value()) {
      return PluginResult::Unresolvable("node lacks a software-stack label");
    }
  }
  if (!job.identical_image_digest.empty()) {
    for (const std::string& image : TaskImages(job)) {
      const CachedImage* held = ImageLocalityScore::FindImage(*node.node, image);
      if (held != nullptr && !held->digest.empty() && held->digest != job.identical_image_digest) {
        return PluginResult::Unresolvable(
            "node holds the image at a digest other than identicalStack.imageDigest");
      }
    }
  }
  return PluginResult::Success();
}

PluginResult HostResourcesFit::Filter(const CycleState& /*state*/, const TaskContext& task,
                                      const NodeInfo& node, GpuMask /*gpus*/) const {
  const HostResources& need = task.request->host;
  if (need.cpu_milli > node.capacity.cpu_milli || need.memory_mib > node.capacity.memory_mib) {
    return PluginResult::Unresolvable("node too small for the task's CPU or memory");
  }
  if (need.cpu_milli > node.free.cpu_milli) {
    return PluginResult::Unschedulable("insufficient free CPU");
  }
  if (need.memory_mib > node.free.memory_mib) {
    return PluginResult::Unschedulable("insufficient free memory");
  }
  return PluginResult::Success();
}

PluginResult GpuResourcesFit::Filter(const CycleState& /*state*/, const TaskContext& task,
                                     const NodeInfo& node, GpuMask gpus) const {
  if (std::holds_alternative<NoGpu>(task.request->gpus)) {
    return PluginResult::Success();
  }
  if (gpus == 0) {
    return PluginResult::Unresolvable("no admitted GPU (model, memory, health or temperature)");
  }
  if (!GpusFit(task, node, gpus)) {
    return PluginResult::Unschedulable(NoFreeGpusReason(task, node, gpus));
  }
  return PluginResult::Success();
}

PluginResult FaultDomainSpread::PreFilter(CycleState& state, const ClusterSnapshot& snapshot) {
  const SpreadConstraint& spread = state.job().spread;
  if (spread.fault_domain.empty()) {
    return {Code::kSkip, {}};
  }
  auto data = std::make_unique<SpreadData>();
  for (const NodeInfo& node : snapshot.nodes()) {
    const std::string* domain = FaultDomainOf(node, spread.fault_domain);
    if (domain != nullptr && node.node->state == NodeState::kReady &&
        SelectorMatches(state.job(), node)) {
      data->counts.emplace(*domain, 0);
    }
  }
  if (data->counts.empty()) {
    return PluginResult::Unresolvable("no Ready node carries the spread's fault-domain label");
  }
  state.Put(kSpreadKey, std::move(data));
  return PluginResult::Success();
}

PluginResult FaultDomainSpread::Filter(const CycleState& state, const TaskContext& /*task*/,
                                       const NodeInfo& node, GpuMask /*gpus*/) const {
  if (state.job().spread.fault_domain.empty()) {
    return PluginResult::Success();
  }
  const SpreadData* data = state.Get<SpreadData>(kSpreadKey);
  if (data == nullptr) {
    return PluginResult::Success();
  }
  const std::string* domain = FaultDomainOf(node, state.job().spread.fault_domain);
  if (domain == nullptr) {
    return PluginResult::Unresolvable("node lacks the spread's fault-domain label");
  }
  auto it = data->counts.find(*domain);
  if (it == data->counts.end()) {
    return PluginResult::Unresolvable("node lacks the spread's fault-domain label");
  }
  int lowest = INT_MAX;
  for (const auto& [name, count] : data->counts) {
    lowest = std::min(lowest, count);
  }
  if (it->second + 1 - lowest > state.job().spread.max_skew) {
    return PluginResult::Unschedulable("fault-domain spread would exceed its maximum skew");
  }
  return PluginResult::Success();
}

void FaultDomainSpread::Reserve(CycleState& state, const TaskPlacement& placement,
                                const ClusterSnapshot& snapshot) {
  SpreadData* data = state.Get<SpreadData>(kSpreadKey);
  if (data == nullptr) {
    return;
  }
  const std::string* domain =
      FaultDomainOf(snapshot.nodes()[placement.node], state.job().spread.fault_domain);
  if (domain != nullptr) {
    ++data->counts[*domain];
  }
}

void FaultDomainSpread::Unreserve(CycleState& state, const TaskPlacement& placement,
                                  const ClusterSnapshot& snapshot) {
  SpreadData* data = state.Get<SpreadData>(kSpreadKey);
  if (data == nullptr) {
    return;
  }
  const std::string* domain =
      FaultDomainOf(snapshot.nodes()[placement.node], state.job().spread.fault_domain);
  if (domain != nullptr) {
    auto it = data->counts.find(*domain);
    if (it != data->counts.end() && it->second > 0) {
      --it->second;
    }
  }
}

PluginResult TopologyLevelsCheck::PreFilter(CycleState& state, const ClusterSnapshot& snapshot) {
  const TopologyConstraint& topology = state.job().topology;
  for (const std::string* level : {&topology.required_level, &topology.preferred_level}) {
    if (!level->empty() && !snapshot.topology().IsKnownLevel(*level)) {
      return PluginResult::Unresolvable("the cluster has no such topology level");
    }
  }
  return PluginResult::Success();
}

int64_t TopologyPreferenceScore::Score(const CycleState& state, const TaskContext& task,
                                       const NodeInfo& node, GpuMask /*gpus*/) {
  const std::string& level = state.job().topology.preferred_level;
  if (level.empty() || state.reserved().empty()) {
    return 0;
  }
  // Below the declared levels ("node", or "nvlink-domain" inside a node) the node is the domain;
  // the GPU choice keeps a task's GPUs inside one NVLink domain.
  const int declared = task.snapshot->topology().LevelIndex(level);
  int64_t together = 0;
  for (const TaskPlacement& placed : state.reserved()) {
    const NodeInfo& other = task.snapshot->nodes()[placed.node];
    const bool same = declared >= 0 ? other.domains[declared] == node.domains[declared]
                                    : other.index == node.index;
    together += same ? 1 : 0;
  }
  return together;
}

void TopologyPreferenceScore::NormalizeScores(std::vector<int64_t>& scores) const {
  ScaleToMaxNodeScore(scores);
}

}  // namespace gpufleet::scheduler
