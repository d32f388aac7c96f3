// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/policies.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>

#include "gpufleet/scheduler/devices.h"

namespace gpufleet::scheduler {
namespace {

// Milli-GPU per requested GPU and the GPU count, as the reference simulator's pod resource.
struct GpuDemand {
  int64_t milli_per_gpu = 0;
  int count = 0;
  int64_t Total() const { return milli_per_gpu * count; }
};

GpuDemand DemandOf(const TaskRequest& request) {
  if (const auto* whole = std::get_if<WholeGpus>(&request.gpus)) {
    return {kMilliPerUnit, whole->count};
  }
  if (const auto* share = std::get_if<FractionalGpu>(&request.gpus)) {
    return {share->gpu_milli, 1};
  }
  return {};
}

bool IsShare(const TaskRequest& request) {
  return std::holds_alternative<FractionalGpu>(request.gpus);
}

// Whether a share's kind (MPS or time-sliced) keeps it off none of the node's GPUs, so that the
// node's free milli-GPU alone says where it fits.
bool SharingBarsNoGpu(const FractionalGpu& share, const NodeInfo& node) {
  return std::all_of(node.gpus.begin(), node.gpus.end(), [&](const GpuSlot& gpu) {
    return SharingFits(RunsAsMps(share.sharing, gpu), gpu);
  });
}

}  // namespace

// ---- Random ------------------------------------------------------------------------------------

void RandomPolicy::PreScore(const CycleState& /*state*/, const TaskContext& /*task*/,
                            const std::vector<const NodeInfo*>& feasible, Random& random) {
  chosen_node_ = feasible.empty() ? -1 : feasible[random.Uniform(feasible.size())]->index;
}

int64_t RandomPolicy::Score(const CycleState& /*state*/, const TaskContext& /*task*/,
                            const NodeInfo& node, GpuMask /*gpus*/) {
  return node.index == chosen_node_ ? kMaxNodeScore : 0;
}

std::optional<std::vector<GpuAssignment>> RandomPolicy::PickGpus(const TaskContext& task,
                                                                 const NodeInfo& node, GpuMask gpus,
                                                                 Random& random) {
  if (!IsShare(*task.request)) {
    return std::nullopt;
  }
  int chosen = -1;
  uint64_t seen = 0;
  for (size_t g = 0; g < node.gpus.size(); ++g) {
    if (MaskHas(gpus, static_cast<int>(g)) && GpuCanServe(task, node.gpus[g])) {
      ++seen;
      if (random.Uniform(seen) == 0) {
        chosen = static_cast<int>(g);
      }
    }
  }
  if (chosen < 0) {
    return std::nullopt;
  }
  return std::vector<GpuAssignment>{ShareOf(task, node, chosen)};
}

// ---- DotProd -----------------------------------------------------------------------------------

int64_t DotProdPolicy::Score(const CycleState& /*state*/, const TaskContext& task,
                             const NodeInfo& node, GpuMask /*gpus*/) {
  const int64_t cpu = task.request->host.cpu_milli;
  if (node.free.cpu_milli < cpu) {
    return 0;
  }
  const double max_cpu = static_cast<double>(kPolicyMaxCpuMilli);
  const double max_gpu = static_cast<double>(kPolicyMaxGpuMilli);
  const double dot =
      (static_cast<double>(node.free.cpu_milli) / max_cpu) * (static_cast<double>(cpu) / max_cpu) +
      (static_cast<double>(node.FreeGpuMilli()) / max_gpu) *
          (static_cast<double>(DemandOf(*task.request).Total()) / max_gpu);
  return static_cast<int64_t>(100.0 * (1.0 - dot / 2.0));
}

// ---- GpuClustering -----------------------------------------------------------------------------

int64_t GpuClusteringPolicy::Score(const CycleState& /*state*/, const TaskContext& task,
                                   const NodeInfo& node, GpuMask /*gpus*/) {
  const GpuDemand demand = DemandOf(*task.request);
  if (demand.count == 0) {
    return 0;
  }
  const int kind = IsShare(*task.request) ? 0 : demand.count;
  const int64_t base = 25 * (kPolicyMaxGpuMilli - node.FreeGpuMilli()) / kPolicyMaxGpuMilli;
  if (node.TaskCountOfKind(kind) > 0) {
    return node.gpu_task_kinds.size() == 1 ? base + 75 : base + 50;
  }
  return node.gpu_task_kinds.empty() ? base + 25 : base;
}

// ---- GpuPacking --------------------------------------------------------------------------------

int64_t GpuPackingPolicy::Score(const CycleState& /*state*/, const TaskContext& task,
                                const NodeInfo& node, GpuMask /*gpus*/) {
  const GpuDemand demand = DemandOf(*task.request);
  if (demand.count == 0) {
    return 0;
  }
  const int gpu_count = static_cast<int>(node.gpus.size());
  int idle = 0;
  for (const GpuSlot& gpu : node.gpus) {
    idle += gpu.free_milli == kMilliPerUnit ? 1 : 0;
  }
  if (idle == gpu_count) {
    return std::max(33 - idle, idle);
  }
  std::vector<int> order(node.gpus.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return node.gpus[a].free_milli < node.gpus[b].free_milli; });
  int needed = demand.count;
  int idle_used = 0;
  int64_t percent_left = 0;
  for (int g : order) {
    if (needed == 0) {
      break;
    }
    const int64_t free = node.gpus[g].free_milli;
    if (demand.milli_per_gpu <= free) {
      --needed;
      idle_used += free == kMilliPerUnit ? 1 : 0;
      percent_left += free * 100 / kMilliPerUnit;
    }
  }
  if (needed != 0) {
    return 0;
  }
  if (idle_used > 0) {
    return std::max(50 - idle_used, 33);
  }
  return std::max<int64_t>(100 - percent_left / 10, 50);
}

// ---- BestFit -----------------------------------------------------------------------------------

int64_t BestFitPolicy::Score(const CycleState& /*state*/, const TaskContext& task,
                             const NodeInfo& node, GpuMask /*gpus*/) {
  const double cpu_left = static_cast<double>(node.free.cpu_milli - task.request->host.cpu_milli);
  const double gpu_left =
      static_cast<double>(node.FreeGpuMilli() - DemandOf(*task.request).Total());
  const double leftover = 0.5 * cpu_left / static_cast<double>(kPolicyMaxCpuMilli) +
                          0.5 * gpu_left / static_cast<double>(kPolicyMaxGpuMilli);
  return static_cast<int64_t>((1.0 - leftover) * 100.0);
}

void BestFitPolicy::NormalizeScores(std::vector<int64_t>& scores) const {
  if (scores.empty()) {
    return;
  }
  const auto [lo, hi] = std::minmax_element(scores.begin(), scores.end());
  const int64_t low = *lo;
  const int64_t range = *hi - *lo;
  for (int64_t& score : scores) {
    score = range == 0 ? 0 : (score - low) * kMaxNodeScore / range;
  }
}

// ---- FGD ---------------------------------------------------------------------------------------

int64_t FgdScore(double fragmentation_increase) {
  const double sigmoid = 1.0 / (1.0 + std::exp(fragmentation_increase / 1000.0));
  return static_cast<int64_t>(sigmoid * 100.0);
}

namespace {

// Nodes with at most this many GPUs are memoised by state.
constexpr int kMaxKeyGpus = 16;

// A node's state as fragmentation sees it: free CPU, GPU model, free milli-GPU per GPU in
// descending order. Nodes in the same state have the same fragmentation and the same FGD score.
struct StateKey {
  int64_t cpu_free = 0;
  int32_t model = -1;
  int32_t gpu_count = 0;
  std::array<int16_t, kMaxKeyGpus> free_milli{};
  uint64_t hash = 0;  // of the fields above, computed once by MakeKey

  friend bool operator==(const StateKey&, const StateKey&) = default;
};

struct StateKeyHash {
  size_t operator()(const StateKey& key) const { return static_cast<size_t>(key.hash); }
};

StateKey MakeKey(int64_t cpu_free, int model, std::span<const int64_t> free_milli) {
  StateKey key;
  key.cpu_free = cpu_free;
  key.model = model;
  key.gpu_count = static_cast<int32_t>(free_milli.size());
  for (size_t i = 0; i < free_milli.size(); ++i) {
    key.free_milli[i] = static_cast<int16_t>(free_milli[i]);
  }
  std::sort(key.free_milli.begin(), key.free_milli.begin() + key.gpu_count, std::greater<>());
  uint64_t h = static_cast<uint64_t>(key.cpu_free) * 0x9e3779b97f4a7c15ULL;
  h ^= (static_cast<uint64_t>(key.model) << 32 | static_cast<uint32_t>(key.gpu_count)) +
       0x632be59bd9b4e019ULL + (h << 6) + (h >> 2);
  for (int i = 0; i < key.gpu_count; ++i) {
    h ^= static_cast<uint64_t>(key.free_milli[i]) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  }
  key.hash = h;
  return key;
}

// A node state and the shape of the task placed on it: FGD's score of the placement is a function
// of these alone (for a task that any GPU of the node may serve).
struct ScoreKey {
  StateKey state;
  int64_t cpu_milli = 0;
  int64_t milli_per_gpu = 0;
  int32_t gpu_count = 0;
  bool share = false;

  friend bool operator==(const ScoreKey&, const ScoreKey&) = default;
};

struct ScoreKeyHash {
  size_t operator()(const ScoreKey& key) const {
    uint64_t h = key.state.hash;
    for (uint64_t field :
         {static_cast<uint64_t>(key.cpu_milli), static_cast<uint64_t>(key.milli_per_gpu),
          static_cast<uint64_t>(key.gpu_count) << 1 | (key.share ? 1 : 0)}) {
      h ^= field * 0x9e3779b97f4a7c15ULL + 0x632be59bd9b4e019ULL + (h << 6) + (h >> 2);
    }
    return static_cast<size_t>(h);
  }
};

// Scores kept across decisions at most; the memo starts over beyond it.
constexpr size_t kMaxMemoisedScores = size_t{1} << 16;

}  // namespace

struct FgdPolicy::Memo {
  struct NodeEntry {
    uint64_t version_plus_one = 0;  // 0: not computed
    GpuMask fgd_gpus = 0;           // the GPUs fragmentation counts
    std::vector<int> gpu_index;     // for each counted GPU, its index on the node
    std::vector<int64_t> free_milli;
    StateKey key;  // valid when free_milli fits a key
  };

  const ClusterSnapshot* snapshot = nullptr;
  uint64_t snapshot_identity = 0;
  std::unique_ptr<FragmentationModel> model;
  std::unordered_map<StateKey, double, StateKeyHash> fragmentation;  // across decisions
  std::unordered_map<ScoreKey, int64_t, ScoreKeyHash> scores;        // across decisions, bounded
  std::vector<NodeEntry> nodes;
  std::vector<int64_t> scratch;
  std::vector<char> pickable;

  void Bind(const TargetWorkload& workload, const ClusterSnapshot& target,
            FragmentationModel::Kind kind) {
    if (snapshot == &target && snapshot_identity == target.identity() && model != nullptr) {
      return;
    }
    snapshot = &target;
    snapshot_identity = target.identity();
    model = std::make_unique<FragmentationModel>(workload, target, kind);
    fragmentation.clear();
    scores.clear();
    nodes.assign(target.nodes().size(), NodeEntry{});
  }

  const NodeEntry& Entry(const NodeInfo& node) {
    NodeEntry& entry = nodes[node.index];
    if (entry.version_plus_one != node.version + 1) {
      entry.version_plus_one = node.version + 1;
      entry.fgd_gpus = 0;
      entry.gpu_index.clear();
      entry.free_milli.clear();
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        const GpuSlot& gpu = node.gpus[g];
        if (!gpu.mig_enabled &&
            (gpu.health == GpuHealth::kHealthy || gpu.health == GpuHealth::kDegraded)) {
          entry.fgd_gpus |= GpuMask{1} << g;
          entry.gpu_index.push_back(static_cast<int>(g));
          entry.free_milli.push_back(gpu.free_milli);
        }
      }
      if (entry.free_milli.size() <= static_cast<size_t>(kMaxKeyGpus)) {
        entry.key = MakeKey(node.free.cpu_milli, NodeModelId(node), entry.free_milli);
      }
    }
    return entry;
  }

  double Fragment(int64_t cpu_free, int model_id, std::span<const int64_t> free_milli) {
    if (free_milli.size() > static_cast<size_t>(kMaxKeyGpus)) {
      return model->NodeFragmentation(cpu_free, model_id, free_milli);
    }
    auto [it, inserted] = fragmentation.try_emplace(MakeKey(cpu_free, model_id, free_milli), 0.0);
    if (inserted) {
      it->second = model->NodeFragmentation(cpu_free, model_id, free_milli);
    }
    return it->second;
  }

  // The best FGD score of placing `task` on a node in state (cpu_free, model_id, free_milli),
  // trying each entry that `pickable` allows for a share; `pick` gets the first entry reaching it.
  int64_t Evaluate(const TaskContext& task, const FgdScoring& scoring, int64_t cpu_free,
                   int model_id, std::vector<int64_t>& free_milli,
                   const std::vector<char>& can_pick, int* pick) {
    const double before = Fragment(cpu_free, model_id, free_milli);
    const int64_t cpu_after = cpu_free - task.request->host.cpu_milli;
    const GpuDemand demand = DemandOf(*task.request);
    auto score_of = [&](double after) { return scoring.Score(after - before); };
    *pick = -1;
    if (IsShare(*task.request)) {
      int64_t best = std::numeric_limits<int64_t>::min();
      for (size_t i = 0; i < free_milli.size(); ++i) {
        if (!can_pick[i] || free_milli[i] < demand.milli_per_gpu) {
          continue;
        }
        // A GPU with the same free milli-GPU as the one before it leaves the same node state
        // (fragmentation sees the sorted vector), so it cannot score better; in a memoised state
        // the vector is sorted and every repeat is skipped.
        if (i > 0 && can_pick[i - 1] && free_milli[i] == free_milli[i - 1]) {
          continue;
        }
        free_milli[i] -= demand.milli_per_gpu;
        const int64_t score = score_of(Fragment(cpu_after, model_id, free_milli));
        free_milli[i] += demand.milli_per_gpu;
        if (score > best) {
          best = score;
          *pick = static_cast<int>(i);
        }
      }
      return best;
    }
    std::vector<size_t> taken;
    for (size_t i = 0; i < free_milli.size() && static_cast<int>(taken.size()) < demand.count;
         ++i) {
      if (can_pick[i] && free_milli[i] == kMilliPerUnit) {
        taken.push_back(i);
        free_milli[i] = 0;
      }
    }
    const int64_t score = score_of(Fragment(cpu_after, model_id, free_milli));
    for (size_t i : taken) {
      free_milli[i] = kMilliPerUnit;
    }
    return score;
  }

  // Fills `pickable` for the counted GPUs of `entry`: admitted by `gpus` and able to serve.
  void FillPickable(const TaskContext& task, const NodeInfo& node, const NodeEntry& entry,
                    GpuMask gpus) {
    pickable.assign(entry.gpu_index.size(), 0);
    for (size_t i = 0; i < entry.gpu_index.size(); ++i) {
      const int g = entry.gpu_index[i];
      pickable[i] = MaskHas(gpus, g) && GpuCanServe(task, node.gpus[g]) ? 1 : 0;
    }
  }
};

int64_t FgdScoring::Score(double increase) const {
  if (quantum_milli <= 0) {
    return FgdScore(increase);
  }
  return static_cast<int64_t>(std::floor(-increase / quantum_milli));
}

double GpufleetScoreQuantum(const TargetWorkload& workload) {
  for (const TaskClass& task_class : workload.classes()) {
    const TaskShape& shape = task_class.shape;
    if (shape.num_gpus > 1 || (shape.num_gpus > 0 && !shape.gpu_models.empty())) {
      return kGpufleetCoarseQuantumMilli;
    }
  }
  return kGpufleetFineQuantumMilli;
}

FgdPolicy::FgdPolicy(std::string name, TargetWorkload workload, FgdScoring scoring)
    : name_(std::move(name)),
      workload_(std::move(workload)),
      scoring_(scoring),
      memo_(std::make_unique<Memo>()) {}

FgdPolicy::~FgdPolicy() = default;

void FgdPolicy::PreScore(const CycleState& /*state*/, const TaskContext& task,
                         const std::vector<const NodeInfo*>& /*feasible*/, Random& /*random*/) {
  memo_->Bind(workload_, *task.snapshot, scoring_.fragmentation);
}

int64_t FgdPolicy::Score(const CycleState& /*state*/, const TaskContext& task, const NodeInfo& node,
                         GpuMask gpus) {
  Memo& memo = *memo_;
  memo.Bind(workload_, *task.snapshot, scoring_.fragmentation);
  const Memo::NodeEntry& entry = memo.Entry(node);
  const int model_id = NodeModelId(node);
  const bool shareable_key =
      (gpus & entry.fgd_gpus) == entry.fgd_gpus &&
      entry.free_milli.size() <= static_cast<size_t>(kMaxKeyGpus) &&
      (!IsShare(*task.request) ||
       (std::get<FractionalGpu>(task.request->gpus).gpu_memory_mib == 0 &&
        SharingBarsNoGpu(std::get<FractionalGpu>(task.request->gpus), node)));
  int pick = -1;
  if (!shareable_key) {
    memo.scratch = entry.free_milli;
    memo.FillPickable(task, node, entry, gpus);
    return memo.Evaluate(task, scoring_, node.free.cpu_milli, model_id, memo.scratch, memo.pickable,
                         &pick);
  }
  const StateKey& key = entry.key;
  const GpuDemand demand = DemandOf(*task.request);
  if (memo.scores.size() >= kMaxMemoisedScores) {
    memo.scores.clear();
  }
  auto [it, inserted] =
      memo.scores.try_emplace(ScoreKey{key, task.request->host.cpu_milli, demand.milli_per_gpu,
                                       demand.count, IsShare(*task.request)},
                              0);
  if (inserted) {
    memo.scratch.assign(key.free_milli.begin(), key.free_milli.begin() + key.gpu_count);
    memo.pickable.assign(memo.scratch.size(), 1);
    it->second = memo.Evaluate(task, scoring_, node.free.cpu_milli, model_id, memo.scratch,
                               memo.pickable, &pick);
  }
  return it->second;
}

std::optional<std::vector<GpuAssignment>> FgdPolicy::PickGpus(const TaskContext& task,
                                                              const NodeInfo& node, GpuMask gpus,
                                                              Random& /*random*/) {
  if (!IsShare(*task.request)) {
    return std::nullopt;
  }
  Memo& memo = *memo_;
  memo.Bind(workload_, *task.snapshot, scoring_.fragmentation);
  const Memo::NodeEntry& entry = memo.Entry(node);
  memo.scratch = entry.free_milli;
  memo.FillPickable(task, node, entry, gpus);
  int pick = -1;
  memo.Evaluate(task, scoring_, node.free.cpu_milli, NodeModelId(node), memo.scratch, memo.pickable,
                &pick);
  if (pick < 0) {
    return std::nullopt;
  }
  return std::vector<GpuAssignment>{ShareOf(task, node, entry.gpu_index[pick])};
}

}  // namespace gpufleet::scheduler
