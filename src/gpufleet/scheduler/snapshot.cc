// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/snapshot.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <set>

#include <fmt/format.h>

namespace gpufleet::scheduler {
namespace {

int64_t MigInstanceMilli(const MigProfile& profile) {
  return profile.compute_slices * kMilliPerUnit / kMigComputeSlices;
}

}  // namespace

int64_t NodeInfo::FreeGpuMilli() const {
  int64_t total = 0;
  for (const GpuSlot& gpu : gpus) {
    total += gpu.free_milli;
  }
  return total;
}

int NodeInfo::IdleGpuCount() const {
  int count = 0;
  for (const GpuSlot& gpu : gpus) {
    count += gpu.IsIdle() ? 1 : 0;
  }
  return count;
}

int NodeInfo::TaskCountOfKind(int kind) const {
  for (const auto& [key, count] : gpu_task_kinds) {
    if (key == kind) {
      return count;
    }
  }
  return 0;
}

std::optional<int> GpuTaskKind(const std::vector<GpuAssignment>& gpus) {
  if (gpus.empty()) {
    return std::nullopt;
  }
  if (!gpus[0].mig_profile.empty()) {
    return -1;
  }
  if (gpus.size() == 1 && gpus[0].milli < kMilliPerUnit) {
    return 0;
  }
  return static_cast<int>(gpus.size());
}

namespace {

void CountTaskKind(NodeInfo& node, const std::vector<GpuAssignment>& gpus, int delta) {
  const std::optional<int> kind = GpuTaskKind(gpus);
  if (!kind) {
    return;
  }
  auto entry = std::find_if(node.gpu_task_kinds.begin(), node.gpu_task_kinds.end(),
                            [&](const auto& candidate) { return candidate.first == *kind; });
  if (entry == node.gpu_task_kinds.end()) {
    node.gpu_task_kinds.emplace_back(*kind, delta);
    return;
  }
  entry->second += delta;
  if (entry->second == 0) {
    node.gpu_task_kinds.erase(entry);
  }
}

void CountShare(GpuSlot& gpu, const GpuAssignment& assignment, int delta) {
  if (IsShare(assignment)) {
    (assignment.mps ? gpu.mps_shares : gpu.time_sliced_shares) += delta;
  }
}

bool NodeRunsMpsByDefault(const Node& node) {
  const auto label = node.labels.find(std::string(kGpuSharingLabel));
  return label != node.labels.end() && label->second == GpuSharingName(GpuSharing::kMps);
}

}  // namespace

// A process-wide counter: identities only key caches, so the order in which threads draw them
// never changes a placement.
ClusterSnapshot::ClusterSnapshot() {
  static std::atomic<uint64_t> next_identity{1};
  identity_ = next_identity.fetch_add(1, std::memory_order_relaxed);
}

Status ValidateNode(const Node& node, const Topology& topology, const GpuCatalog& catalog) {
  if (node.gpus.size() > static_cast<size_t>(kMaxGpusPerNode)) {
    return InvalidArgumentError(
        fmt::format("gpus: {} GPUs, at most {}", node.gpus.size(), kMaxGpusPerNode));
  }
  std::set<int> indices;
  std::set<std::string> uuids;
  for (size_t g = 0; g < node.gpus.size(); ++g) {
    const Gpu& gpu = node.gpus[g];
    if (!indices.insert(gpu.index).second) {
      return InvalidArgumentError(
          fmt::format("gpus[{}].index: {} appears twice on the node", g, gpu.index));
    }
    if (gpu.uuid.value().size() > kMaxGpuUuidBytes) {
      return InvalidArgumentError(fmt::format("gpus[{}].uuid: {} bytes, at most {}", g,
                                              gpu.uuid.value().size(), kMaxGpuUuidBytes));
    }
    if (!gpu.uuid.empty() && !uuids.insert(gpu.uuid.value()).second) {
      return InvalidArgumentError(
          fmt::format("gpus[{}].uuid: \"{}\" appears twice on the node", g, gpu.uuid.value()));
    }
  }
  Cluster one;
  one.topology = topology;
  one.nodes.push_back(node);
  return one.Validate(catalog);
}

Result<ClusterSnapshot> ClusterSnapshot::Build(Cluster cluster, const GpuCatalog& catalog) {
  GPUFLEET_RETURN_IF_ERROR(cluster.Validate(catalog));
  ClusterSnapshot snapshot;
  snapshot.cluster_ = std::move(cluster);
  snapshot.catalog_ = &catalog;
  const size_t levels = snapshot.cluster_.topology.levels().size();
  snapshot.domain_names_.resize(levels);
  snapshot.domain_ids_.resize(levels);
  std::map<std::string, int> model_ids;

  snapshot.nodes_.reserve(snapshot.cluster_.nodes.size());
  for (size_t n = 0; n < snapshot.cluster_.nodes.size(); ++n) {
    const Node& node = snapshot.cluster_.nodes[n];
    if (node.gpus.size() > static_cast<size_t>(kMaxGpusPerNode)) {
      return InvalidArgumentError(fmt::format("nodes[{}] (\"{}\").gpus: {} GPUs, at most {}", n,
                                              node.id.value(), node.gpus.size(), kMaxGpusPerNode));
    }
    // A domain is its path: the value at its level under its parent (MakeNodeInfo asks for the
    // levels in order, so the parent of level L is the id just given for level L - 1).
    int parent = -1;
    snapshot.nodes_.push_back(snapshot.MakeNodeInfo(
        node, static_cast<int>(n),
        [&](size_t level) {
          auto [it, inserted] = snapshot.domain_ids_[level].emplace(
              std::make_pair(parent, node.topology[level]),
              static_cast<int>(snapshot.domain_names_[level].size()));
          if (inserted) {
            snapshot.domain_names_[level].push_back(
                level == 0 ? node.topology[level]
                           : snapshot.domain_names_[level - 1][static_cast<size_t>(parent)] + "/" +
                                 node.topology[level]);
          }
          parent = it->second;
          return it->second;
        },
        [&](const GpuModelInfo* model) {
          auto [it, inserted] =
              model_ids.emplace(model->name, static_cast<int>(snapshot.models_.size()));
          if (inserted) {
            snapshot.models_.push_back(model);
          }
          return it->second;
        }));
  }
  return snapshot;
}

NodeInfo ClusterSnapshot::MakeNodeInfo(const Node& node, int index,
                                       const std::function<int(size_t)>& domain_id,
                                       const std::function<int(const GpuModelInfo*)>& model_id) {
  NodeInfo info;
  info.index = index;
  info.node = &node;
  info.capacity = node.capacity;
  info.free = node.capacity;
  for (size_t level = 0; level < cluster_.topology.levels().size(); ++level) {
    info.domains.push_back(domain_id(level));
  }
  for (const Gpu& gpu : node.gpus) {
    const GpuModelInfo* model = catalog_->Find(gpu.model).value();
    GpuSlot slot;
    slot.index = gpu.index;
    slot.model_id = model_id(model);
    slot.memory_mib = gpu.memory_mib > 0 ? gpu.memory_mib : model->memory_mib;
    slot.free_memory_mib = slot.memory_mib;
    slot.health = gpu.health;
    slot.thermal_headroom_c = gpu.thermal_headroom_c;
    slot.nvlink_domain = gpu.nvlink_domain;
    slot.mig_enabled = gpu.mig_enabled;
    slot.mps_by_default = NodeRunsMpsByDefault(node);
    if (gpu.mig_enabled) {
      slot.mig = MigLayout::FromInstances(*model, gpu.mig_instances).value();
      slot.mig_instances = gpu.mig_instances;
      for (const MigInstance& instance : gpu.mig_instances) {
        if (instance.in_use) {
          const int64_t milli = MigInstanceMilli(*model->FindMigProfile(instance.profile));
          slot.free_milli -= milli;
          allocated_gpu_milli_ += milli;
        }
      }
    }
    total_gpu_milli_ += kMilliPerUnit;
    ++total_gpus_;
    if (static_cast<size_t>(slot.model_id) >= gpus_by_model_.size()) {
      gpus_by_model_.resize(static_cast<size_t>(slot.model_id) + 1, 0);
    }
    ++gpus_by_model_[static_cast<size_t>(slot.model_id)];
    info.gpus.push_back(std::move(slot));
  }
  return info;
}

Status ClusterSnapshot::ReplaceNode(int index, Node node) {
  if (index < 0 || index >= static_cast<int>(nodes_.size())) {
    return InvalidArgumentError(
        fmt::format("index: {} out of range ({} nodes)", index, nodes_.size()));
  }
  NodeInfo& old = nodes_[static_cast<size_t>(index)];
  if (node.id != old.node->id) {
    return InvalidArgumentError(
        fmt::format("node: \"{}\" in place of \"{}\"", node.id.value(), old.node->id.value()));
  }
  GPUFLEET_RETURN_IF_ERROR(ValidateNode(node, cluster_.topology, *catalog_));
  // Interned ids follow the order in which Build first met each domain and model: a new one
  // would get another id than a rebuild gives it, so it needs a rebuild.
  std::vector<int> domains;
  for (size_t level = 0; level < cluster_.topology.levels().size(); ++level) {
    const int parent = level == 0 ? -1 : domains.back();
    const auto it = domain_ids_[level].find(std::make_pair(parent, node.topology[level]));
    if (it == domain_ids_[level].end()) {
      return FailedPreconditionError(
          fmt::format("topology: {} \"{}\" is new; rebuild", cluster_.topology.levels()[level],
                      level == 0 ? node.topology[level]
                                 : domain_names_[level - 1][static_cast<size_t>(parent)] + "/" +
                                       node.topology[level]));
    }
    domains.push_back(it->second);
  }
  std::vector<int> models;
  for (const Gpu& gpu : node.gpus) {
    const GpuModelInfo* model = catalog_->Find(gpu.model).value();
    const auto it = std::find(models_.begin(), models_.end(), model);
    if (it == models_.end()) {
      return FailedPreconditionError(
          fmt::format("gpus: model {} is new to the snapshot; rebuild", model->name));
    }
    models.push_back(static_cast<int>(it - models_.begin()));
  }
  // What the old node adds to the totals: its GPUs, the MIG instances its document reported in
  // use and the placements applied on it.
  for (const GpuSlot& gpu : old.gpus) {
    total_gpu_milli_ -= kMilliPerUnit;
    --total_gpus_;
    --gpus_by_model_[static_cast<size_t>(gpu.model_id)];
    allocated_gpu_milli_ -= kMilliPerUnit - gpu.free_milli;
  }
  const uint64_t version = old.version;
  Node& stored = cluster_.nodes[static_cast<size_t>(index)];
  stored = std::move(node);
  size_t next_model = 0;
  old = MakeNodeInfo(
      stored, index, [&](size_t level) { return domains[level]; },
      [&](const GpuModelInfo* /*model*/) { return models[next_model++]; });
  NoteNodeChanged(index, version);
  return Status::Ok();
}

ClusterSnapshot ClusterSnapshot::Clone() const {
  ClusterSnapshot copy;
  copy.cluster_ = cluster_;
  copy.catalog_ = catalog_;
  copy.nodes_ = nodes_;
  copy.domain_names_ = domain_names_;
  copy.domain_ids_ = domain_ids_;
  copy.models_ = models_;
  copy.total_gpu_milli_ = total_gpu_milli_;
  copy.allocated_gpu_milli_ = allocated_gpu_milli_;
  copy.total_gpus_ = total_gpus_;
  copy.gpus_by_model_ = gpus_by_model_;
  // The copy's log starts empty where this one's ends: a reader of older positions looks at
  // every node.
  copy.change_log_start_ = ChangeLogEnd();
  // Each NodeInfo points at its Node: point the copies at the copied cluster.
  for (size_t n = 0; n < copy.nodes_.size(); ++n) {
    copy.nodes_[n].node = &copy.cluster_.nodes[n];
  }
  return copy;
}

int ClusterSnapshot::ModelId(std::string_view name) const {
  const std::string canonical = catalog_->Canonical(name);
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i]->name == canonical) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

Status ClusterSnapshot::CheckFits(const TaskPlacement& placement) const {
  if (placement.node < 0 || placement.node >= static_cast<int>(nodes_.size())) {
    return InvalidArgumentError(
        fmt::format("placement.node: index {} out of range", placement.node));
  }
  const NodeInfo& node = nodes_[placement.node];
  if (!node.free.Covers(placement.host)) {
    return FailedPreconditionError(
        fmt::format("node {}: host resources not free (need {}, free {})", node.node->id.value(),
                    placement.host.ToString(), node.free.ToString()));
  }
  // Several assignments may share one GPU (none do today, but a MIG task may take two instances
  // of one GPU), so check against a scratch copy.
  std::vector<GpuSlot> gpus;
  for (const GpuAssignment& assignment : placement.gpus) {
    if (assignment.gpu < 0 || assignment.gpu >= static_cast<int>(node.gpus.size())) {
      return InvalidArgumentError(fmt::format("placement.gpus: index {} out of range on node {}",
                                              assignment.gpu, node.node->id.value()));
    }
    if (gpus.empty()) {
      gpus = node.gpus;
    }
    GpuSlot& gpu = gpus[assignment.gpu];
    if (!assignment.mig_profile.empty()) {
      const MigProfile* profile = Model(gpu.model_id).FindMigProfile(assignment.mig_profile);
      if (!gpu.mig_enabled || profile == nullptr) {
        return FailedPreconditionError(fmt::format("node {} gpu {}: no MIG profile {}",
                                                   node.node->id.value(), assignment.gpu,
                                                   assignment.mig_profile));
      }
      if (assignment.mig_created) {
        if (!gpu.mig.CanAddAt(*profile, assignment.mig_start)) {
          return FailedPreconditionError(
              fmt::format("node {} gpu {}: MIG {} does not fit at slot {}", node.node->id.value(),
                          assignment.gpu, assignment.mig_profile, assignment.mig_start));
        }
        gpu.mig.Add(*profile, assignment.mig_start);
      } else {
        auto instance = std::find_if(
            gpu.mig_instances.begin(), gpu.mig_instances.end(), [&](const MigInstance& candidate) {
              return candidate.profile == assignment.mig_profile &&
                     candidate.start == assignment.mig_start && !candidate.in_use;
            });
        if (instance == gpu.mig_instances.end()) {
          return FailedPreconditionError(
              fmt::format("node {} gpu {}: no free {} instance at slot {}", node.node->id.value(),
                          assignment.gpu, assignment.mig_profile, assignment.mig_start));
        }
        instance->in_use = true;
      }
      continue;
    }
    if (gpu.mig_enabled || gpu.free_milli < assignment.milli ||
        gpu.free_memory_mib < assignment.memory_mib) {
      return FailedPreconditionError(
          fmt::format("node {} gpu {}: {} milli-GPU / {} MiB not free (free {} / {})",
                      node.node->id.value(), assignment.gpu, assignment.milli,
                      assignment.memory_mib, gpu.free_milli, gpu.free_memory_mib));
    }
    if (IsShare(assignment) && !SharingFits(assignment.mps, gpu)) {
      return FailedPreconditionError(
          fmt::format("node {} gpu {}: {}", node.node->id.value(), assignment.gpu,
                      assignment.mps ? "an MPS share cannot join the time-sliced shares there"
                                     : "a time-sliced share cannot join the MPS shares there"));
    }
    gpu.free_milli -= assignment.milli;
    gpu.free_memory_mib -= assignment.memory_mib;
    CountShare(gpu, assignment, +1);
  }
  return Status::Ok();
}

Status ClusterSnapshot::Apply(const TaskPlacement& placement) {
  GPUFLEET_RETURN_IF_ERROR(CheckFits(placement));
  NodeInfo& node = nodes_[placement.node];
  node.free -= placement.host;
  for (const GpuAssignment& assignment : placement.gpus) {
    GpuSlot& gpu = node.gpus[assignment.gpu];
    if (assignment.mig_profile.empty()) {
      gpu.free_milli -= assignment.milli;
      gpu.free_memory_mib -= assignment.memory_mib;
      allocated_gpu_milli_ += assignment.milli;
      CountShare(gpu, assignment, +1);
      continue;
    }
    const MigProfile& profile = *Model(gpu.model_id).FindMigProfile(assignment.mig_profile);
    if (assignment.mig_created) {
      gpu.mig.Add(profile, assignment.mig_start);
      gpu.mig_instances.push_back({assignment.mig_profile, assignment.mig_start, true});
    } else {
      for (MigInstance& instance : gpu.mig_instances) {
        if (instance.profile == assignment.mig_profile && instance.start == assignment.mig_start) {
          instance.in_use = true;
          break;
        }
      }
    }
    gpu.free_milli -= MigInstanceMilli(profile);
    allocated_gpu_milli_ += MigInstanceMilli(profile);
  }
  CountTaskKind(node, placement.gpus, +1);
  NoteNodeChanged(placement.node, node.version);
  return Status::Ok();
}

void ClusterSnapshot::Release(const TaskPlacement& placement) {
  GiveBack(placement, false);
}

void ClusterSnapshot::Revert(const TaskPlacement& placement) {
  GiveBack(placement, true);
}

void ClusterSnapshot::GiveBack(const TaskPlacement& placement, bool remove_created_instances) {
  NodeInfo& node = nodes_[placement.node];
  node.free += placement.host;
  for (const GpuAssignment& assignment : placement.gpus) {
    GpuSlot& gpu = node.gpus[assignment.gpu];
    if (assignment.mig_profile.empty()) {
      gpu.free_milli += assignment.milli;
      gpu.free_memory_mib += assignment.memory_mib;
      allocated_gpu_milli_ -= assignment.milli;
      CountShare(gpu, assignment, -1);
      continue;
    }
    const MigProfile& profile = *Model(gpu.model_id).FindMigProfile(assignment.mig_profile);
    auto instance = std::find_if(
        gpu.mig_instances.begin(), gpu.mig_instances.end(), [&](const MigInstance& candidate) {
          return candidate.profile == assignment.mig_profile &&
                 candidate.start == assignment.mig_start && candidate.in_use;
        });
    if (instance != gpu.mig_instances.end()) {
      if (remove_created_instances && assignment.mig_created) {
        gpu.mig_instances.erase(instance);
        gpu.mig.Remove(profile, assignment.mig_start);
      } else {
        // A finished task leaves its instance on the GPU, free for the next task.
        instance->in_use = false;
      }
    }
    gpu.free_milli += MigInstanceMilli(profile);
    allocated_gpu_milli_ -= MigInstanceMilli(profile);
  }
  CountTaskKind(node, placement.gpus, -1);
  NoteNodeChanged(placement.node, node.version);
}

void ClusterSnapshot::NoteNodeChanged(int index, uint64_t old_version) {
  nodes_[static_cast<size_t>(index)].version = old_version + 1;
  // Bounded: a reader further behind than the log reaches looks at every node, which costs no
  // more than reading this many entries.
  if (change_log_.size() >= 4 * nodes_.size() + 16) {
    change_log_start_ += change_log_.size();
    change_log_.clear();
  }
  change_log_.push_back(index);
}

std::optional<std::span<const int>> ClusterSnapshot::ChangedSince(uint64_t since) const {
  if (since < change_log_start_ || since > ChangeLogEnd()) {
    return std::nullopt;
  }
  return std::span<const int>(change_log_).subspan(since - change_log_start_);
}

}  // namespace gpufleet::scheduler
