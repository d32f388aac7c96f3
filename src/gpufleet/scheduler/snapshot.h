// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/mig.h"
#include "gpufleet/core/resources.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

namespace gpufleet::scheduler {

// Most GPUs one node may carry: eligibility masks are 64-bit.
inline constexpr int kMaxGpusPerNode = 64;

// Longest GPU UUID a node may give: NVML's UUID buffer (NVML_DEVICE_UUID_V2_BUFFER_SIZE) less its
// terminating NUL. Placements store their GPUs' UUIDs, so the size of a job's stored document has
// a bound.
inline constexpr size_t kMaxGpuUuidBytes = 95;

// Whether one node can be part of a snapshot of a cluster with `topology`: what Cluster::Validate
// checks of a node, at most kMaxGpusPerNode GPUs, GPU indices and (non-empty) UUIDs unique
// within the node, UUIDs of at most kMaxGpuUuidBytes. kInvalidArgument naming the field and the
// value, e.g. `gpus: 65 GPUs, at most 64`. A server checks registrations with it, and leaves a
// stored node that fails it out of its snapshot rather than failing every cycle.
Status ValidateNode(const Node& node, const Topology& topology, const GpuCatalog& catalog);

// The free state of one GPU during scheduling.
struct GpuSlot {
  int index = 0;
  int model_id = -1;
  int64_t memory_mib = 0;
  int64_t free_milli = kMilliPerUnit;
  int64_t free_memory_mib = 0;
  GpuHealth health = GpuHealth::kHealthy;
  int thermal_headroom_c = 100;
  int nvlink_domain = 0;
  bool mig_enabled = false;
  MigLayout mig;
  std::vector<MigInstance> mig_instances;
  // The fractional shares on the GPU by how they run: never both kinds at once (GpuSharing).
  int mps_shares = 0;
  int time_sliced_shares = 0;
  // The node's kGpuSharingLabel says "mps": shares that do not say run as MPS clients here.
  bool mps_by_default = false;

  bool IsIdle() const { return free_milli == kMilliPerUnit && (!mig_enabled || mig.empty()); }
};

// A node as the scheduler sees it: what is free now and where it sits in the topology.
struct NodeInfo {
  int index = 0;
  const Node* node = nullptr;  // labels, fault domains; owned by the snapshot
  HostResources capacity;
  HostResources free;
  std::vector<int> domains;  // interned domain id (by path) per declared topology level
  std::vector<GpuSlot> gpus;
  // Tasks on the node by the kind of their GPU request: key 0 for fractional shares, n for tasks
  // of n whole GPUs, -1 for MIG tasks; value the task count. GPU-clustering policies read it.
  std::vector<std::pair<int, int>> gpu_task_kinds;
  // Bumped on every change, so plugins can cache what they derive from the node's state.
  uint64_t version = 0;

  int64_t FreeGpuMilli() const;
  int IdleGpuCount() const;
  int TaskCountOfKind(int kind) const;
};

// One GPU (or part of one) handed to a task.
struct GpuAssignment {
  int gpu = 0;              // index into NodeInfo::gpus
  int64_t milli = 0;        // compute share taken: 1000 for a whole GPU
  int64_t memory_mib = 0;   // GPU memory taken
  std::string mig_profile;  // set for a MIG instance
  int mig_start = -1;
  bool mig_created = false;  // a new instance, rather than a free existing one
  bool mps = false;          // a share run as an MPS client (GpuSharing::kMps, resolved)

  friend bool operator==(const GpuAssignment&, const GpuAssignment&) = default;
};

// A fractional share of a GPU rather than the whole GPU or a MIG instance.
inline bool IsShare(const GpuAssignment& assignment) {
  return assignment.mig_profile.empty() && assignment.milli < kMilliPerUnit;
}
// Whether a share asking for `sharing` runs as an MPS client on `gpu` (kNodeDefault: as the
// GPU's node says).
inline bool RunsAsMps(GpuSharing sharing, const GpuSlot& gpu) {
  return sharing == GpuSharing::kMps || (sharing == GpuSharing::kNodeDefault && gpu.mps_by_default);
}
// Whether a share (MPS or time-sliced) may join the shares `gpu` has: MPS clients and
// time-sliced tasks never share a GPU, since the time-sliced ones would escape MPS's limits and
// slow the clients down unseen.
inline bool SharingFits(bool mps, const GpuSlot& gpu) {
  return mps ? gpu.time_sliced_shares == 0 : gpu.mps_shares == 0;
}

// Where one task of a job goes.
struct TaskPlacement {
  int group = 0;
  int replica = 0;
  int node = 0;  // index into ClusterSnapshot::nodes()
  HostResources host;
  std::vector<GpuAssignment> gpus;

  friend bool operator==(const TaskPlacement&, const TaskPlacement&) = default;
};

// The gpu_task_kinds key of a placement; nullopt for a task without GPUs.
std::optional<int> GpuTaskKind(const std::vector<GpuAssignment>& gpus);

// The mutable view of a cluster the scheduler places work in: free resources per node and GPU,
// interned topology domains (by path), and the GPU catalog's models by dense id. Apply/Release keep
// every counter consistent; nothing else writes. Thread-compatible.
class ClusterSnapshot {
 public:
  // kInvalidArgument when the cluster does not validate against `catalog`.
  // REQUIRES: `catalog` outlives the snapshot.
  static Result<ClusterSnapshot> Build(Cluster cluster, const GpuCatalog& catalog);

  ClusterSnapshot(ClusterSnapshot&&) = default;
  ClusterSnapshot& operator=(ClusterSnapshot&&) = default;

  // A deep copy for what-if searches (which victims would let a job fit?) that change a scratch
  // snapshot. Explicit rather than a copy constructor, so the state is never copied by accident.
  // REQUIRES: the catalog outlives the copy too.
  ClusterSnapshot Clone() const;

  const std::vector<NodeInfo>& nodes() const { return nodes_; }
  const Cluster& cluster() const { return cluster_; }
  const Topology& topology() const { return cluster_.topology; }
  const GpuCatalog& catalog() const { return *catalog_; }

  // Topology domains are identified by their path: a domain of level L is one value at every
  // level down to L, so racks named "r1" in blocks "b1" and "b2" are two racks. Ids are dense per
  // level (NodeInfo::domains), in the order Build first meets them.
  int DomainCount(int level) const { return static_cast<int>(domain_names_[level].size()); }
  // The readable path of a domain, its values joined by '/' ("b2/r1"); the value alone at the
  // first level ("b2").
  const std::string& DomainName(int level, int domain) const {
    return domain_names_[level][domain];
  }

  int ModelCount() const { return static_cast<int>(models_.size()); }
  const GpuModelInfo& Model(int model_id) const { return *models_[model_id]; }
  // Dense id of a model (name or alias), or -1 when no GPU of the cluster has that model.
  int ModelId(std::string_view name) const;

  // Takes the resources of `placement`. kFailedPrecondition, with nothing changed, when they are
  // not free (a stale placement); kInvalidArgument for indices out of range.
  Status Apply(const TaskPlacement& placement);
  // Gives back what Apply took when the task ends; MIG instances it created stay on the GPU, free.
  // REQUIRES: `placement` was applied and not released since.
  void Release(const TaskPlacement& placement);
  // Undoes Apply exactly, removing MIG instances it created (a reservation that is rolled back).
  // REQUIRES: `placement` was applied and not released since.
  void Revert(const TaskPlacement& placement);

  // Puts `node` (the same name) in place of the node at `index` with all its resources free but
  // the MIG instances it reports in use, as Build would, and moves its version on: for a node
  // document that changed (a heartbeat's health or state) without rebuilding every node. The
  // placements applied on the old node go with it (apply them again). kFailedPrecondition, with
  // nothing changed, when one of its topology domains or GPU models is new to the snapshot
  // (rebuild then); kInvalidArgument for an index out of range, another name or a node that
  // ValidateNode refuses.
  Status ReplaceNode(int index, Node node);

  // The indices of the nodes whose version moved from position `since` of the snapshot's change
  // log to ChangeLogEnd(), in order and with repeats, so that a cache of per-node results visits
  // only those; nullopt when that part of the log is gone (look at every node then). The log
  // keeps a few times the node count of the latest changes.
  std::optional<std::span<const int>> ChangedSince(uint64_t since) const;
  uint64_t ChangeLogEnd() const { return change_log_start_ + change_log_.size(); }

  // Unique to this snapshot among all built or cloned in the process, and kept by moves. Plugins
  // that cache what they derive from a snapshot key on it together with the address: a new
  // snapshot (a clone for a what-if search, or a rebuilt one) may reuse a dead one's address, with
  // nodes at the same versions but in another state.
  uint64_t identity() const { return identity_; }

  int64_t TotalGpuMilli() const { return total_gpu_milli_; }
  int64_t AllocatedGpuMilli() const { return allocated_gpu_milli_; }
  int TotalGpus() const { return total_gpus_; }
  // GPUs of the model with dense id `model_id` (see Model), kept as nodes are replaced.
  // REQUIRES: 0 <= model_id < ModelCount() (a model is interned with its first GPU).
  int GpuCount(int model_id) const { return gpus_by_model_[static_cast<size_t>(model_id)]; }

 private:
  ClusterSnapshot();
  // The NodeInfo of `node`, everything free but the MIG instances it reports in use (added to
  // the totals); `domain_id` and `model_id` give the interned ids.
  NodeInfo MakeNodeInfo(const Node& node, int index, const std::function<int(size_t)>& domain_id,
                        const std::function<int(const GpuModelInfo*)>& model_id);
  Status CheckFits(const TaskPlacement& placement) const;
  // Moves the version of node `index` on and logs it; the one writer of NodeInfo::version.
  void NoteNodeChanged(int index, uint64_t old_version);
  void GiveBack(const TaskPlacement& placement, bool remove_created_instances);

  Cluster cluster_;
  const GpuCatalog* catalog_ = nullptr;
  std::vector<NodeInfo> nodes_;
  std::vector<std::vector<std::string>> domain_names_;  // [level][domain id]: the path
  // [level]: (parent id, value) -> domain id; the parent is -1 at the first level.
  std::vector<std::map<std::pair<int, std::string>, int>> domain_ids_;
  std::vector<const GpuModelInfo*> models_;  // by model id
  uint64_t identity_ = 0;
  int64_t total_gpu_milli_ = 0;
  int64_t allocated_gpu_milli_ = 0;
  int total_gpus_ = 0;
  std::vector<int> gpus_by_model_;  // by model id
  std::vector<int> change_log_;
  uint64_t change_log_start_ = 0;  // the position of change_log_[0]
};

}  // namespace gpufleet::scheduler
