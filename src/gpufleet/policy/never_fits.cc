// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/never_fits.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::GpuSlot;
using scheduler::NodeInfo;

// Memory as a spec writes it: "80Gi", or "1536Mi".
std::string Memory(int64_t mib) {
  return mib % 1024 == 0 ? fmt::format("{}Gi", mib / 1024) : fmt::format("{}Mi", mib);
}

// CPU as a spec writes it: "8", or "0.5".
std::string Cpu(int64_t milli) {
  return milli % kMilliPerUnit == 0 ? fmt::format("{}", milli / kMilliPerUnit)
                                    : fmt::format("{:g}", static_cast<double>(milli) / 1000.0);
}

std::string GroupField(size_t g, std::string_view leaf) {
  return fmt::format("spec.tasks[{}].resources.{}", g, leaf);
}

// The models a node carries, by name, for the evidence: "8 H100-80GB".
std::string NodeGpus(const NodeInfo& node, const ClusterSnapshot& snapshot,
                     const std::vector<bool>& model_allowed, int64_t min_memory_mib) {
  std::map<std::string, int> by_model;
  int in_mig_mode = 0;  // which whole GPUs do not use
  for (const GpuSlot& gpu : node.gpus) {
    if (gpu.model_id >= 0 && model_allowed[gpu.model_id] && gpu.memory_mib >= min_memory_mib) {
      ++(gpu.mig_enabled ? in_mig_mode : by_model[snapshot.Model(gpu.model_id).name]);
    }
  }
  std::vector<std::string> parts;
  for (const auto& [model, count] : by_model) {
    parts.push_back(fmt::format("{} {}", count, model));
  }
  if (in_mig_mode > 0) {
    parts.push_back(fmt::format("{} in MIG mode", in_mig_mode));
  }
  return parts.empty() ? std::string("none") : fmt::format("{}", fmt::join(parts, ", "));
}

}  // namespace

std::optional<NeverFits> CheckNeverFits(const Job& job, const ClusterSnapshot& snapshot) {
  const std::vector<NodeInfo>& nodes = snapshot.nodes();
  if (nodes.empty()) {
    return NeverFits{"the fleet has no nodes yet", "spec.tasks"};
  }
  const bool needs_gpus = std::any_of(job.groups.begin(), job.groups.end(), [](const TaskGroup& g) {
    return !std::holds_alternative<NoGpu>(g.request.gpus);
  });

  // GPU models: those the job names that the fleet has.
  std::vector<bool> model_allowed(snapshot.ModelCount(), job.allowed_gpu_models.empty());
  std::set<std::string> fleet_models;
  for (int m = 0; m < snapshot.ModelCount(); ++m) {
    fleet_models.insert(snapshot.Model(m).name);
  }
  if (!job.allowed_gpu_models.empty()) {
    for (const std::string& name : job.allowed_gpu_models) {
      if (const int id = snapshot.ModelId(name); id >= 0) {
        model_allowed[id] = true;
      }
    }
    if (needs_gpus &&
        std::find(model_allowed.begin(), model_allowed.end(), true) == model_allowed.end()) {
      return NeverFits{
          fmt::format("GPU model {}: the fleet has none (it has {})",
                      fmt::join(job.allowed_gpu_models, ", "),
                      fleet_models.empty() ? std::string("no GPUs")
                                           : fmt::format("{}", fmt::join(fleet_models, ", "))),
          "spec.gpuModels"};
    }
  }
  // GPU memory per GPU.
  if (needs_gpus && job.min_gpu_memory_mib > 0) {
    int64_t largest = 0;
    for (const NodeInfo& node : nodes) {
      for (const GpuSlot& gpu : node.gpus) {
        if (gpu.model_id >= 0 && model_allowed[gpu.model_id]) {
          largest = std::max(largest, gpu.memory_mib);
        }
      }
    }
    if (largest < job.min_gpu_memory_mib) {
      return NeverFits{fmt::format("minGpuMemory {}: the largest GPU it may use has {}",
                                   Memory(job.min_gpu_memory_mib), Memory(largest)),
                       "spec.minGpuMemory"};
    }
  }
  // The node selector: a label no node has is named; else no node has them all.
  std::vector<const NodeInfo*> selected;
  for (const NodeInfo& node : nodes) {
    bool all = true;
    for (const auto& [key, value] : job.node_selector) {
      const auto it = node.node->labels.find(key);
      all = all && it != node.node->labels.end() && it->second == value;
    }
    for (const std::string& key : job.identical_stack_labels) {
      all = all && (key == kImageDigestStackKey || node.node->labels.count(key) > 0);
    }
    if (all) {
      selected.push_back(&node);
    }
  }
  if (selected.empty()) {
    for (const auto& [key, value] : job.node_selector) {
      std::set<std::string> values;
      for (const NodeInfo& node : nodes) {
        if (const auto it = node.node->labels.find(key); it != node.node->labels.end()) {
          values.insert(it->second);
        }
      }
      if (values.count(value) == 0) {
        return NeverFits{fmt::format("nodeSelector {}={}: no node has that label{}", key, value,
                                     values.empty() ? fmt::format(" (no node has the key {})", key)
                                                    : fmt::format(" (nodes have {}={})", key,
                                                                  fmt::join(values, "|"))),
                         "spec.nodeSelector"};
      }
    }
    for (const std::string& key : job.identical_stack_labels) {
      if (key != kImageDigestStackKey) {
        bool any = false;
        for (const NodeInfo& node : nodes) {
          any = any || node.node->labels.count(key) > 0;
        }
        if (!any) {
          return NeverFits{fmt::format("topology.identicalStack {}: no node has that label", key),
                           "spec.topology.identicalStack"};
        }
      }
    }
    std::vector<std::string> pairs;
    for (const auto& [key, value] : job.node_selector) {
      pairs.push_back(fmt::format("{}={}", key, value));
    }
    return NeverFits{
        fmt::format("nodeSelector {}: no node has all of these labels", fmt::join(pairs, ", ")),
        "spec.nodeSelector"};
  }

  // Each group: one task on one selected node, empty.
  int64_t whole_gpus_needed = 0;
  for (size_t g = 0; g < job.groups.size(); ++g) {
    const TaskRequest& request = job.groups[g].request;
    const NodeInfo* largest_cpu = nullptr;
    const NodeInfo* largest_memory = nullptr;
    const NodeInfo* largest_gpus = nullptr;
    int largest_gpu_count = -1;
    bool mig_profile_known = false;  // some allowed GPU model of the fleet has the profile
    bool fits = false;
    for (const NodeInfo* node : selected) {
      if (largest_cpu == nullptr || node->capacity.cpu_milli > largest_cpu->capacity.cpu_milli) {
        largest_cpu = node;
      }
      if (largest_memory == nullptr ||
          node->capacity.memory_mib > largest_memory->capacity.memory_mib) {
        largest_memory = node;
      }
      const bool host_fits = request.host.cpu_milli <= node->capacity.cpu_milli &&
                             request.host.memory_mib <= node->capacity.memory_mib;
      int usable = 0;
      bool share = false;
      bool mig = false;
      for (const GpuSlot& gpu : node->gpus) {
        if (gpu.model_id < 0 || !model_allowed[gpu.model_id] ||
            gpu.memory_mib < job.min_gpu_memory_mib ||
            (gpu.mig_enabled && !std::holds_alternative<MigGpus>(request.gpus))) {
          continue;  // whole GPUs and shares never go on a GPU in MIG mode (scheduler/devices.cc)
        }
        ++usable;
        if (const auto* fraction = std::get_if<FractionalGpu>(&request.gpus)) {
          share = share || gpu.memory_mib >= fraction->gpu_memory_mib;
        } else if (const auto* wanted = std::get_if<MigGpus>(&request.gpus)) {
          const bool has_profile =
              snapshot.Model(gpu.model_id).FindMigProfile(wanted->profile) != nullptr;
          mig_profile_known = mig_profile_known || has_profile;
          mig = mig || (has_profile && gpu.mig_enabled);
        }
      }
      if (host_fits && usable > largest_gpu_count) {
        largest_gpu_count = usable;
        largest_gpus = node;
      }
      if (!host_fits) {
        continue;
      }
      if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
        fits = fits || usable >= whole->count;
      } else if (std::holds_alternative<FractionalGpu>(request.gpus)) {
        fits = fits || share;
      } else if (std::holds_alternative<MigGpus>(request.gpus)) {
        fits = fits || mig;
      } else {
        fits = true;
      }
    }
    if (fits) {
      if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
        whole_gpus_needed += static_cast<int64_t>(whole->count) * job.groups[g].replicas;
      }
      continue;
    }
    const std::string& task = job.groups[g].name;
    if (request.host.cpu_milli > largest_cpu->capacity.cpu_milli) {
      return NeverFits{fmt::format("task {}: cpu {} per task: the largest node it may use, {}, "
                                   "has {}",
                                   task, Cpu(request.host.cpu_milli), largest_cpu->node->id.value(),
                                   Cpu(largest_cpu->capacity.cpu_milli)),
                       GroupField(g, "cpu")};
    }
    if (request.host.memory_mib > largest_memory->capacity.memory_mib) {
      return NeverFits{
          fmt::format("task {}: memory {} per task: the largest node it may use, {}, has {}", task,
                      Memory(request.host.memory_mib), largest_memory->node->id.value(),
                      Memory(largest_memory->capacity.memory_mib)),
          GroupField(g, "memory")};
    }
    if (largest_gpus == nullptr) {
      return NeverFits{
          fmt::format("task {}: no node it may use has both the cpu {} and the "
                      "memory {} of one task",
                      task, Cpu(request.host.cpu_milli), Memory(request.host.memory_mib)),
          GroupField(g, "cpu")};
    }
    if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
      return NeverFits{
          fmt::format("task {}: {} GPUs per task: the largest node it may use, {}, has {}", task,
                      whole->count, largest_gpus->node->id.value(),
                      NodeGpus(*largest_gpus, snapshot, model_allowed, job.min_gpu_memory_mib)),
          GroupField(g, "gpus")};
    }
    if (const auto* fraction = std::get_if<FractionalGpu>(&request.gpus)) {
      return NeverFits{
          fmt::format("task {}: gpu memory {} per share: no GPU it may use has as much", task,
                      Memory(fraction->gpu_memory_mib)),
          GroupField(g, "gpus")};
    }
    if (const auto* wanted = std::get_if<MigGpus>(&request.gpus)) {
      return NeverFits{
          mig_profile_known
              ? fmt::format("task {}: MIG profile {}: no GPU it may use is in MIG mode (nodes "
                            "join with MIG enabled, e.g. `gpufleet dev --simulated-mig-nodes`)",
                            task, wanted->profile)
              : fmt::format("task {}: MIG profile {}: no GPU model of the fleet it may use has it "
                            "(models: {})",
                            task, wanted->profile, fmt::join(fleet_models, ", ")),
          GroupField(g, "gpus")};
    }
    return NeverFits{fmt::format("task {}: no node it may use can hold one task", task),
                     GroupField(g, "gpus")};
  }
  // The gang as a whole: whole GPUs of every group against every GPU it may use.
  if (whole_gpus_needed > 0) {
    int64_t fleet = 0;
    int64_t in_mig_mode = 0;
    for (const NodeInfo* node : selected) {
      for (const GpuSlot& gpu : node->gpus) {
        if (gpu.model_id >= 0 && model_allowed[gpu.model_id] &&
            gpu.memory_mib >= job.min_gpu_memory_mib) {
          ++(gpu.mig_enabled ? in_mig_mode : fleet);
        }
      }
    }
    if (fleet < whole_gpus_needed) {
      return NeverFits{
          fmt::format("{} GPUs in all: the nodes it may use have {} GPUs together{}",
                      whole_gpus_needed, fleet,
                      in_mig_mode == 0 ? std::string()
                                       : fmt::format(" (and {} in MIG mode, which whole GPUs do "
                                                     "not use)",
                                                     in_mig_mode)),
          "spec.tasks"};
    }
  }
  return std::nullopt;
}

namespace {

// Everything CheckNeverFits reads of `job` but the names its messages quote: two jobs with the
// same key get the same answer on one fleet, names aside. Texts go in with their length, so no
// name can pass for two.
std::string NeverFitsShape(const Job& job) {
  std::string key;
  const auto add = [&key](std::string_view text) {
    key += fmt::format("{}:{}", text.size(), text);
  };
  for (const std::string& model : job.allowed_gpu_models) {
    add(model);
  }
  key += fmt::format("|{}|", job.min_gpu_memory_mib);
  for (const auto& [label, value] : job.node_selector) {
    add(label);
    add(value);
  }
  key += '|';
  for (const std::string& label : job.identical_stack_labels) {
    add(label);
  }
  for (const TaskGroup& group : job.groups) {
    const TaskRequest& request = group.request;
    key +=
        fmt::format("|{},{},{},", group.replicas, request.host.cpu_milli, request.host.memory_mib);
    if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
      key += fmt::format("w{}", whole->count);
    } else if (const auto* fraction = std::get_if<FractionalGpu>(&request.gpus)) {
      key += fmt::format("f{}", fraction->gpu_memory_mib);
    } else if (const auto* mig = std::get_if<MigGpus>(&request.gpus)) {
      key += 'm';
      add(mig->profile);
    }
  }
  return key;
}

}  // namespace

std::optional<NeverFits> NeverFitsCheck::Check(const Job& job, const ClusterSnapshot& snapshot,
                                               uint64_t shape_epoch) {
  if (epoch_ != shape_epoch || fitting_shapes_.size() + never_fitting_.size() >= kMaxShapes) {
    fitting_shapes_.clear();
    never_fitting_.clear();
    epoch_ = shape_epoch;
  }
  std::string shape = NeverFitsShape(job);
  if (fitting_shapes_.contains(shape)) {
    return std::nullopt;
  }
  for (const TaskGroup& group : job.groups) {
    shape += fmt::format("|{}:{}", group.name.size(), group.name);
  }
  if (const auto known = never_fitting_.find(shape); known != never_fitting_.end()) {
    return known->second;
  }
  std::optional<NeverFits> never = CheckNeverFits(job, snapshot);
  if (never.has_value()) {
    never_fitting_.emplace(std::move(shape), *never);
  } else {
    fitting_shapes_.insert(NeverFitsShape(job));
  }
  return never;
}

bool SameShapeForNeverFits(const Node& a, const Node& b) {
  const auto same_gpu = [](const Gpu& x, const Gpu& y) {
    return x.model == y.model && x.memory_mib == y.memory_mib && x.mig_enabled == y.mig_enabled;
  };
  return a.id == b.id && a.capacity.cpu_milli == b.capacity.cpu_milli &&
         a.capacity.memory_mib == b.capacity.memory_mib && a.labels == b.labels &&
         std::equal(a.gpus.begin(), a.gpus.end(), b.gpus.begin(), b.gpus.end(), same_gpu);
}

}  // namespace gpufleet::policy
