// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/scheduler.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <span>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/scheduler/devices.h"
#include "gpufleet/scheduler/plugins/filters.h"

namespace gpufleet::scheduler {
namespace {

constexpr GpuMask kAllGpus = ~GpuMask{0};

// A set of nodes that may hold a whole gang: one domain of the required topology level (and one
// software stack when the job asks for identical stacks).
struct Domain {
  std::string name;
  std::vector<int> nodes;
  GpuMask restriction = kAllGpus;  // GPUs usable on every node; narrower for an NVLink domain
  int64_t free_gpu_milli = 0;
  double coverage = 0;   // the lowest share of a group's replicas the domain can hold
  int short_group = -1;  // the group behind `coverage`
  int short_capacity = 0;
};

std::vector<std::optional<std::string>> StackValues(const Job& job, const NodeInfo& node) {
  std::vector<std::optional<std::string>> values;
  for (const std::string& key : job.identical_stack_labels) {
    values.push_back(StackValue(job, *node.node, key));
  }
  return values;
}

// Splits `nodes` into domains of `level` (empty: one domain) and, when the job asks for identical
// stacks, by their values. Domains keep the order of their first node.
std::vector<Domain> SplitIntoDomains(const Job& job, const ClusterSnapshot& snapshot,
                                     const std::vector<int>& nodes, const std::string& level,
                                     GpuMask restriction) {
  const int declared = level.empty() ? -1 : snapshot.topology().LevelIndex(level);
  std::vector<Domain> domains;
  std::map<std::string, size_t> index;
  auto add = [&](std::string name, int node, GpuMask mask) {
    if (!job.identical_stack_labels.empty()) {
      std::vector<std::string> parts;
      for (const std::optional<std::string>& value : StackValues(job, snapshot.nodes()[node])) {
        parts.push_back(value.value_or("-"));
      }
      name += fmt::format(" [{}]", fmt::join(parts, ", "));
    }
    auto [it, inserted] = index.emplace(name, domains.size());
    if (inserted) {
      domains.push_back(Domain{std::move(name), {}, mask});
    }
    domains[it->second].nodes.push_back(node);
  };
  for (int n : nodes) {
    const NodeInfo& node = snapshot.nodes()[n];
    if (level.empty()) {
      add("cluster", n, restriction);
    } else if (declared >= 0) {
      add(snapshot.DomainName(declared, node.domains[declared]), n, restriction);
    } else if (level == kNodeLevel) {
      add(node.node->id.value(), n, restriction);
    } else {
      // An NVLink domain inside a node: one domain per (node, NVLink id), restricted to its GPUs.
      std::map<int, GpuMask> by_nvlink;
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        by_nvlink[node.gpus[g].nvlink_domain] |= GpuMask{1} << g;
      }
      for (const auto& [nvlink, mask] : by_nvlink) {
        add(fmt::format("{}/nvlink-{}", node.node->id.value(), nvlink), n, mask & restriction);
      }
    }
  }
  return domains;
}

std::string GroupLabel(const Job& job, int group) {
  const TaskGroup& task_group = job.groups[group];
  return fmt::format("group \"{}\" ({} x {})",
                     task_group.name.empty() ? std::to_string(group) : task_group.name,
                     task_group.replicas, GpuRequestToString(task_group.request.gpus));
}

// What the filters and the node-alone scores (ScorePlugin::ScoresNodeAlone) read of the first
// task of a one-group job without topology, spread or identical-stack constraints: two such jobs
// of one shape get the same verdict and raw scores on a node in the same state.
struct JobShape {
  TaskRequest request;
  int replicas = 0;
  std::string image;
  std::vector<std::string> allowed_gpu_models;
  int64_t min_gpu_memory_mib = 0;
  std::map<std::string, std::string> node_selector;
  std::string identical_image_digest;

  friend bool operator==(const JobShape& a, const JobShape& b) {
    return a.request.host == b.request.host && a.request.gpus == b.request.gpus &&
           a.replicas == b.replicas && a.image == b.image &&
           a.allowed_gpu_models == b.allowed_gpu_models &&
           a.min_gpu_memory_mib == b.min_gpu_memory_mib && a.node_selector == b.node_selector &&
           a.identical_image_digest == b.identical_image_digest;
  }
};

// The shape of `job` when its first task may use the memo: one group, placed on the whole
// cluster (no required or preferred level, no spread, no identical stack).
std::optional<JobShape> MemoShapeOf(const Job& job) {
  if (job.groups.size() != 1 || !job.topology.required_level.empty() ||
      !job.topology.preferred_level.empty() || !job.spread.fault_domain.empty() ||
      !job.identical_stack_labels.empty()) {
    return std::nullopt;
  }
  const TaskGroup& group = job.groups[0];
  return JobShape{group.request,
                  group.replicas,
                  group.image,
                  job.allowed_gpu_models,
                  job.min_gpu_memory_mib,
                  job.node_selector,
                  job.identical_image_digest};
}

}  // namespace

void SchedulerOptions::AddCollectiveCost(std::shared_ptr<const fabric::Fabric> fabric) {
  plugin_args.fabric = std::move(fabric);
  extra_plugins.push_back("collective-cost");
  extra_plugin_weights["collective-cost"] = 2;
}

struct Scheduler::Impl {
  std::vector<std::unique_ptr<Plugin>> owned;
  std::vector<PreFilterPlugin*> pre_filters;
  std::vector<GpuFilterPlugin*> gpu_filters;
  std::vector<FilterPlugin*> node_filters;  // run before the GPU filters
  std::vector<FilterPlugin*> mask_filters;  // run after them, on the admitted GPUs
  std::vector<std::pair<ScorePlugin*, int64_t>> scorers;
  // Scorers that order only the nodes `scorers` rank equal (image locality).
  std::vector<std::pair<ScorePlugin*, int64_t>> tie_scorers;
  ScorePlugin* policy = nullptr;
  std::vector<ReservePlugin*> reservers;
  TieBreak tie_break = TieBreak::kNodeOrder;

  // The first task's filter verdict and raw scores on each node, per job shape, kept across
  // jobs and calls while the node's version and the snapshot are unchanged (kube-scheduler
  // re-runs every filter per pod; at 10,000 nodes that was most of a cycle). Used only when
  // every score plugin scores a node alone and no extra plugin is configured.
  struct NodeMemo {
    uint64_t version = 0;
    bool known = false;
    bool fits = false;
    GpuMask mask = 0;
  };
  struct ShapeMemo {
    JobShape shape;
    uint64_t snapshot = 0;  // ClusterSnapshot::identity()
    uint64_t last_used = 0;
    std::vector<NodeMemo> nodes;  // by node index
    std::vector<int64_t> raw;     // [node * (scorers + tie_scorers) + plugin]
    // Kept from one use to the next by the snapshot's change log: the nodes that fit, by index,
    // and the log position they are up to date with once every node was judged.
    std::vector<int> fitting;
    std::optional<uint64_t> seen;
  };
  static constexpr size_t kMaxShapeMemos = 16;
  bool memo_allowed = false;
  std::vector<ShapeMemo> memos;
  uint64_t memo_clock = 0;
  ShapeMemo* memo = nullptr;  // the current job's, while it is placed

  // Scratch reused across calls so a decision does not allocate.
  std::vector<const NodeInfo*> candidates;
  std::vector<GpuMask> candidate_masks;
  std::vector<size_t> candidate_rows;  // from the memo: where each candidate's raw scores start
  std::vector<int64_t> raw_scores;
  std::vector<int64_t> totals;
  std::vector<int64_t> tie_totals;

  void Add(std::unique_ptr<Plugin> plugin, int64_t score_weight) {
    if (auto* p = dynamic_cast<PreFilterPlugin*>(plugin.get())) {
      pre_filters.push_back(p);
    }
    if (auto* p = dynamic_cast<GpuFilterPlugin*>(plugin.get())) {
      gpu_filters.push_back(p);
    }
    if (auto* p = dynamic_cast<FilterPlugin*>(plugin.get())) {
      (p->UsesGpuMask() ? mask_filters : node_filters).push_back(p);
    }
    if (auto* p = dynamic_cast<ScorePlugin*>(plugin.get())) {
      scorers.emplace_back(p, score_weight);
    }
    if (auto* p = dynamic_cast<ReservePlugin*>(plugin.get())) {
      reservers.push_back(p);
    }
    owned.push_back(std::move(plugin));
  }

  GpuMask AdmittedGpus(const TaskContext& task, const NodeInfo& node, GpuMask restriction) const {
    GpuMask mask = 0;
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      if (!MaskHas(restriction, static_cast<int>(g))) {
        continue;
      }
      bool admitted = true;
      for (const GpuFilterPlugin* filter : gpu_filters) {
        if (!filter->Admits(task, node.gpus[g])) {
          admitted = false;
          break;
        }
      }
      mask |= admitted ? GpuMask{1} << g : 0;
    }
    return mask;
  }

  // Runs every filter; on success `mask` holds the GPUs the task may use on the node.
  PluginResult Evaluate(const CycleState& state, const TaskContext& task, const NodeInfo& node,
                        GpuMask restriction, GpuMask* mask) const {
    *mask = 0;
    for (const FilterPlugin* filter : node_filters) {
      const PluginResult result = filter->Filter(state, task, node, 0);
      if (!result.ok()) {
        return result;
      }
    }
    if (std::holds_alternative<NoGpu>(task.request->gpus)) {
      return PluginResult::Success();
    }
    // Most nodes of a busy cluster lack the free GPUs outright: say so before any per-GPU filter.
    if (!GpusFit(task, node, restriction)) {
      return PluginResult::Unschedulable(NoFreeGpusReason(task, node, restriction));
    }
    *mask = AdmittedGpus(task, node, restriction);
    for (const FilterPlugin* filter : mask_filters) {
      const PluginResult result = filter->Filter(state, task, node, *mask);
      if (!result.ok()) {
        return result;
      }
    }
    return PluginResult::Success();
  }

  // Sets `out` to the weighted, normalised scores of `candidates` by `plugins`; with `from_memo`,
  // the raw scores come from the memo, whose columns for `plugins` start at `column`.
  void AddScores(const std::vector<std::pair<ScorePlugin*, int64_t>>& plugins,
                 const CycleState& state, const TaskContext& task, Random& random,
                 std::vector<int64_t>& out, const ShapeMemo* from_memo, size_t column) {
    out.assign(candidates.size(), 0);
    for (const auto& [scorer, weight] : plugins) {
      raw_scores.resize(candidates.size());
      if (from_memo != nullptr) {
        for (size_t i = 0; i < candidates.size(); ++i) {
          raw_scores[i] = from_memo->raw[candidate_rows[i] + column];
        }
        ++column;
      } else {
        scorer->PreScore(state, task, candidates, random);
        for (size_t i = 0; i < candidates.size(); ++i) {
          raw_scores[i] = scorer->Score(state, task, *candidates[i], candidate_masks[i]);
        }
      }
      // Equal raw scores stay equal (NormalizeScores treats nodes alike): the plugin ranks no
      // node above another, and adding it would change no choice. Often so for the topology
      // preference of a job without one and the image locality of a job without an image.
      if (std::adjacent_find(raw_scores.begin(), raw_scores.end(), std::not_equal_to<>()) ==
          raw_scores.end()) {
        continue;
      }
      scorer->NormalizeScores(raw_scores);
      for (size_t i = 0; i < candidates.size(); ++i) {
        out[i] += weight * raw_scores[i];
      }
    }
  }

  // Sets `totals` to the weighted, normalised scores of `candidates`, the tie-break scores below
  // them (lexicographically).
  void ComputeTotals(const CycleState& state, const TaskContext& task, Random& random,
                     const ShapeMemo* from_memo) {
    AddScores(scorers, state, task, random, totals, from_memo, 0);
    if (!tie_scorers.empty()) {
      // Lexicographic: a tie score of at most `tie_max` cannot lift a node past one whose other
      // scores total even 1 more.
      int64_t tie_max = 0;
      for (const auto& [scorer, weight] : tie_scorers) {
        tie_max += weight * kMaxNodeScore;
      }
      AddScores(tie_scorers, state, task, random, tie_totals, from_memo, scorers.size());
      for (size_t i = 0; i < candidates.size(); ++i) {
        totals[i] = totals[i] * (tie_max + 1) + tie_totals[i];
      }
    }
  }

  // Chooses among `candidates` by weighted, normalised scores; ties uniformly at random.
  size_t SelectNode(const CycleState& state, const TaskContext& task, Random& random,
                    const ShapeMemo* from_memo) {
    if (candidates.size() == 1) {
      return 0;
    }
    ComputeTotals(state, task, random, from_memo);
    size_t selected = 0;
    uint64_t ties = 1;
    for (size_t i = 1; i < totals.size(); ++i) {
      if (totals[i] > totals[selected]) {
        selected = i;
        ties = 1;
      } else if (totals[i] == totals[selected] && tie_break == TieBreak::kRandom) {
        ++ties;
        if (random.Uniform(ties) == 0) {
          selected = i;
        }
      }
    }
    return selected;
  }

  // The memo for `shape` on `snapshot`, made (evicting the least recently used) if there is none.
  ShapeMemo& FindMemo(const JobShape& shape, const ClusterSnapshot& snapshot) {
    ShapeMemo* slot = nullptr;
    for (ShapeMemo& candidate : memos) {
      if (candidate.snapshot == snapshot.identity() && candidate.shape == shape) {
        slot = &candidate;
        break;
      }
    }
    if (slot == nullptr) {
      if (memos.size() < kMaxShapeMemos) {
        slot = &memos.emplace_back();
      } else {
        slot = &*std::min_element(
            memos.begin(), memos.end(),
            [](const ShapeMemo& a, const ShapeMemo& b) { return a.last_used < b.last_used; });
      }
      slot->shape = shape;
      slot->snapshot = snapshot.identity();
      slot->nodes.assign(snapshot.nodes().size(), NodeMemo{});
      slot->raw.assign(snapshot.nodes().size() * (scorers.size() + tie_scorers.size()), 0);
      slot->fitting.clear();
      slot->seen.reset();
    }
    slot->last_used = ++memo_clock;
    return *slot;
  }

  // Fills `candidates` for the first task from the memo, judging and scoring again only the
  // nodes whose version moved since the memo saw them (found by the snapshot's change log, so the
  // nodes that did not change are not visited). Returns the memo.
  const ShapeMemo* CollectFromMemo(const CycleState& state, const TaskContext& task,
                                   const ClusterSnapshot& snapshot, Random& random) {
    ShapeMemo& m = *memo;
    const size_t stride = scorers.size() + tie_scorers.size();
    bool prescored = false;
    // Judges `node` again if it changed since the memo saw it; true if its verdict may differ.
    auto judge = [&](const NodeInfo& node) {
      NodeMemo& entry = m.nodes[static_cast<size_t>(node.index)];
      if (entry.known && entry.version == node.version) {
        return false;
      }
      if (!prescored) {
        // ScoresNodeAlone: any feasible list gives the same scores.
        const std::vector<const NodeInfo*> none;
        for (const auto& [scorer, weight] : scorers) {
          scorer->PreScore(state, task, none, random);
        }
        for (const auto& [scorer, weight] : tie_scorers) {
          scorer->PreScore(state, task, none, random);
        }
        prescored = true;
      }
      entry.known = true;
      entry.version = node.version;
      entry.fits = Evaluate(state, task, node, kAllGpus, &entry.mask).ok();
      if (entry.fits) {
        int64_t* row = &m.raw[static_cast<size_t>(node.index) * stride];
        for (const auto& [scorer, weight] : scorers) {
          *row++ = scorer->Score(state, task, node, entry.mask);
        }
        for (const auto& [scorer, weight] : tie_scorers) {
          *row++ = scorer->Score(state, task, node, entry.mask);
        }
      }
      return true;
    };
    const std::optional<std::span<const int>> changed =
        m.seen ? snapshot.ChangedSince(*m.seen) : std::nullopt;
    if (changed) {
      for (const int index : *changed) {
        if (!judge(snapshot.nodes()[static_cast<size_t>(index)])) {
          continue;
        }
        const auto at = std::lower_bound(m.fitting.begin(), m.fitting.end(), index);
        const bool listed = at != m.fitting.end() && *at == index;
        if (m.nodes[static_cast<size_t>(index)].fits && !listed) {
          m.fitting.insert(at, index);
        } else if (!m.nodes[static_cast<size_t>(index)].fits && listed) {
          m.fitting.erase(at);
        }
      }
    } else {
      m.fitting.clear();
      for (const NodeInfo& node : snapshot.nodes()) {
        judge(node);
        if (m.nodes[static_cast<size_t>(node.index)].fits) {
          m.fitting.push_back(node.index);
        }
      }
    }
    m.seen = snapshot.ChangeLogEnd();
    candidates.clear();
    candidate_masks.clear();
    candidate_rows.clear();
    for (const int index : m.fitting) {
      candidates.push_back(&snapshot.nodes()[static_cast<size_t>(index)]);
      candidate_masks.push_back(m.nodes[static_cast<size_t>(index)].mask);
      candidate_rows.push_back(static_cast<size_t>(index) * stride);
    }
    return &m;
  }

  void Rollback(CycleState& state, ClusterSnapshot& snapshot, size_t keep) {
    while (state.reserved().size() > keep) {
      const TaskPlacement placement = state.reserved().back();
      for (auto it = reservers.rbegin(); it != reservers.rend(); ++it) {
        (*it)->Unreserve(state, placement, snapshot);
      }
      snapshot.Revert(placement);
      state.PopReserved();
    }
  }

  // Places every task of the job on `nodes`, or none, on each node only the GPUs of
  // `restriction` (and of `masks[i]` for nodes[i], when given). On failure, `failed_group` names
  // the group that ran out of room.
  Status PlaceTasks(CycleState& state, const std::vector<TaskContext>& contexts,
                    ClusterSnapshot& snapshot, const std::vector<int>& nodes, GpuMask restriction,
                    Random& random, bool* placed, int* failed_group,
                    const std::vector<GpuMask>* masks = nullptr) {
    const Job& job = state.job();
    const size_t keep = state.reserved().size();
    *placed = false;
    for (int group : GroupOrder(job)) {
      const TaskContext& task = contexts[group];
      for (int replica = 0; replica < job.groups[group].replicas; ++replica) {
        // The memo holds the first task's view of the whole cluster; later tasks see the
        // reserved ones.
        const ShapeMemo* from_memo = memo != nullptr && state.reserved().empty()
                                         ? CollectFromMemo(state, task, snapshot, random)
                                         : nullptr;
        if (from_memo == nullptr) {
          candidates.clear();
          candidate_masks.clear();
          for (size_t i = 0; i < nodes.size(); ++i) {
            const int n = nodes[i];
            GpuMask mask = 0;
            if (Evaluate(state, task, snapshot.nodes()[n],
                         masks == nullptr ? restriction : restriction & (*masks)[i], &mask)
                    .ok()) {
              candidates.push_back(&snapshot.nodes()[n]);
              candidate_masks.push_back(mask);
            }
          }
        }
        if (candidates.empty()) {
          Rollback(state, snapshot, keep);
          *failed_group = group;
          return Status::Ok();
        }
        const size_t chosen = SelectNode(state, task, random, from_memo);
        const NodeInfo& node = *candidates[chosen];
        std::optional<std::vector<GpuAssignment>> gpus;
        if (policy != nullptr) {
          gpus = policy->PickGpus(task, node, candidate_masks[chosen], random);
        }
        if (!gpus) {
          gpus = DefaultGpuPick(task, node, candidate_masks[chosen]);
        }
        if (!gpus) {
          Rollback(state, snapshot, keep);
          return InternalError(
              fmt::format("node {} passed the filters but no GPUs could be "
                          "picked for {}",
                          node.node->id.value(), GroupLabel(job, group)));
        }
        TaskPlacement placement{group, replica, node.index, task.request->host, std::move(*gpus)};
        if (Status applied = snapshot.Apply(placement); !applied.ok()) {
          Rollback(state, snapshot, keep);
          return InternalError("placement rejected by the snapshot: " + applied.ToString());
        }
        state.AddReserved(placement);
        for (ReservePlugin* reserver : reservers) {
          reserver->Reserve(state, placement, snapshot);
        }
      }
    }
    *placed = true;
    return Status::Ok();
  }

  // ---- Compact gangs (docs/policies.md, "Compact gangs") ----
  //
  // Inside the domain a gang goes to, its tasks go to the fewest domains at each level below:
  // the declared levels, then nodes, then each node's NVLink domains. A tree of those domains
  // records how many tasks of each group each can take (MaxTasksOnNode, summed) and the best
  // weighted score of its nodes for the gang's first task. Level by level, the domains that take
  // the most of the remaining tasks go first; among domains that take as many, the one that
  // needs the fewest domains below it (level by level), then the best score, then the first in
  // node order. The gang is then placed task by task on the nodes (and GPUs) chosen.

  // A choice of children for some tasks of each group inside one domain.
  struct PlanChoice {
    bool ok = false;
    bool whole = false;  // a node whose NVLink domains cannot each hold its tasks: all its GPUs
    std::vector<std::pair<int, std::vector<int>>> picks;  // (child, tasks of each group)
    std::vector<int> counts;                              // domains used per level below
  };
  struct PlanDomain {
    enum class Kind { kLevel, kNode, kNvlink };
    Kind kind = Kind::kLevel;
    int node = -1;              // kNode, kNvlink: the snapshot's node index
    size_t position = 0;        // of its first node in the planned domain's node list
    GpuMask gpus = kAllGpus;    // kNvlink: the NVLink domain's GPUs
    std::vector<int> capacity;  // tasks of each group, summed over its nodes
    int64_t score = std::numeric_limits<int64_t>::min();
    std::vector<int> children;                      // indices into `plan`, in node order
    std::map<std::vector<int>, PlanChoice> chosen;  // by the tasks asked of it
  };
  std::vector<PlanDomain> plan;
  std::vector<int> plan_nodes;
  std::vector<GpuMask> plan_masks;

  // The order PlaceTasks places groups in: larger tasks first (they have the fewest places).
  static std::vector<int> GroupOrder(const Job& job) {
    std::vector<int> order(job.groups.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return RequestedGpuMilli(job.groups[a].request.gpus) >
             RequestedGpuMilli(job.groups[b].request.gpus);
    });
    return order;
  }

  // True when `a` (with score `score_a`) is the better child for the same tasks than `b`.
  static bool BetterChoice(const PlanChoice& a, int64_t score_a, const PlanChoice& b,
                           int64_t score_b) {
    if (a.ok != b.ok) {
      return a.ok;
    }
    if (a.counts != b.counts) {
      return a.counts < b.counts;
    }
    return score_a > score_b;
  }

  // The children of plan[d] that hold `need` (tasks of each group): the most tasks first.
  const PlanChoice& Choose(int d, const std::vector<int>& need) {
    if (const auto found = plan[d].chosen.find(need); found != plan[d].chosen.end()) {
      return found->second;
    }
    const PlanDomain& domain = plan[d];
    PlanChoice choice;
    choice.ok = true;
    std::vector<int> remaining = need;
    std::vector<char> used(domain.children.size(), 0);
    std::vector<int> take(need.size());
    std::vector<int> best_take;
    auto left = [&] {
      return std::any_of(remaining.begin(), remaining.end(), [](int r) { return r > 0; });
    };
    while (!domain.children.empty() && left()) {
      int best = -1;
      int best_tasks = 0;
      const PlanChoice* best_below = nullptr;
      for (size_t i = 0; i < domain.children.size(); ++i) {
        if (used[i] != 0) {
          continue;
        }
        const PlanDomain& child = plan[domain.children[i]];
        int tasks = 0;
        for (size_t g = 0; g < need.size(); ++g) {
          take[g] = std::min(child.capacity[g], remaining[g]);
          tasks += take[g];
        }
        if (tasks == 0 || tasks < best_tasks) {
          continue;
        }
        if (tasks > best_tasks) {
          best = static_cast<int>(i);
          best_tasks = tasks;
          best_take = take;
          best_below = nullptr;
          continue;
        }
        // As many tasks as the best so far: fewer domains below, then the better score.
        if (best_below == nullptr) {
          best_below = &Choose(domain.children[best], best_take);
        }
        const PlanChoice& below = Choose(domain.children[i], take);
        if (BetterChoice(below, child.score, *best_below, plan[domain.children[best]].score)) {
          best = static_cast<int>(i);
          best_take = take;
          best_below = &below;
        }
      }
      if (best < 0) {
        choice.ok = false;
        break;
      }
      used[best] = 1;
      for (size_t g = 0; g < need.size(); ++g) {
        remaining[g] -= best_take[g];
      }
      const PlanChoice& below =
          best_below != nullptr ? *best_below : Choose(domain.children[best], best_take);
      if (choice.counts.empty()) {
        choice.counts.assign(1 + below.counts.size(), 0);
      }
      ++choice.counts[0];
      for (size_t k = 0; k < below.counts.size() && k + 1 < choice.counts.size(); ++k) {
        choice.counts[k + 1] += below.counts[k];
      }
      choice.ok = choice.ok && below.ok;
      choice.picks.emplace_back(domain.children[best], best_take);
    }
    if (!choice.ok && domain.kind == PlanDomain::Kind::kNode) {
      // A task wider than an NVLink domain: the node's capacity counts GPUs across domains.
      choice = PlanChoice{true, true, {}, {static_cast<int>(domain.children.size())}};
    }
    return plan[d].chosen.emplace(need, std::move(choice)).first->second;
  }

  // Appends the nodes (position, node, GPUs) that plan[d]'s choice for `need` uses.
  void CollectPlan(int d, const std::vector<int>& need,
                   std::vector<std::tuple<size_t, int, GpuMask>>& out) {
    const PlanChoice& choice = Choose(d, need);
    const PlanDomain& domain = plan[d];
    if (domain.kind == PlanDomain::Kind::kNode) {
      GpuMask mask = 0;
      for (const auto& [child, tasks] : choice.picks) {
        mask |= plan[child].gpus;
      }
      out.emplace_back(domain.position, domain.node,
                       choice.whole || choice.picks.empty() ? kAllGpus : mask);
      return;
    }
    for (const auto& [child, tasks] : choice.picks) {
      CollectPlan(child, tasks, out);
    }
  }

  // Chooses the nodes, and on each the GPUs, that hold the whole gang inside `root` (a domain of
  // `level`; empty: the cluster or a set of nodes of one stack) with the fewest domains at each
  // level below; fills plan_nodes and plan_masks. False when nothing below `level` is left to
  // choose (an NVLink domain) or the domain cannot hold the gang.
  bool PlanCompact(const CycleState& state, const std::vector<TaskContext>& contexts,
                   const ClusterSnapshot& snapshot, const Domain& root, const std::string& level,
                   Random& random) {
    const Job& job = state.job();
    const int levels = static_cast<int>(snapshot.topology().levels().size());
    int first_level = 0;  // the first declared level below `level`
    if (!level.empty()) {
      if (const int declared = snapshot.topology().LevelIndex(level); declared >= 0) {
        first_level = declared + 1;
      } else if (level == kNodeLevel) {
        first_level = levels;
      } else {
        return false;
      }
    }
    const size_t groups = job.groups.size();
    const int first_group = GroupOrder(job)[0];
    plan.clear();
    plan.emplace_back();
    plan[0].capacity.assign(groups, 0);
    std::vector<std::vector<int>> index(static_cast<size_t>(levels));  // [level][domain id]
    for (int l = first_level; l < levels; ++l) {
      index[l].assign(static_cast<size_t>(snapshot.DomainCount(l)), -1);
    }
    candidates.clear();
    candidate_masks.clear();
    std::vector<int> candidate_plan;  // the plan index of each candidate node
    std::vector<GpuMask> masks(groups);
    std::vector<int> capacity(groups);
    std::vector<int> path;
    std::map<int, GpuMask> by_nvlink;
    for (size_t position = 0; position < root.nodes.size(); ++position) {
      const NodeInfo& node = snapshot.nodes()[root.nodes[position]];
      bool any = false;
      for (size_t g = 0; g < groups; ++g) {
        masks[g] = 0;
        capacity[g] = 0;
        if (Evaluate(state, contexts[g], node, root.restriction, &masks[g]).ok()) {
          capacity[g] = MaxTasksOnNode(contexts[g], node, masks[g], job.groups[g].replicas);
          any = any || capacity[g] > 0;
        }
      }
      if (!any) {
        continue;
      }
      path.assign(1, 0);
      for (int l = first_level; l < levels; ++l) {
        int& at = index[l][node.domains[l]];
        if (at < 0) {
          at = static_cast<int>(plan.size());
          plan.emplace_back();
          plan.back().position = position;
          plan.back().capacity.assign(groups, 0);
          plan[path.back()].children.push_back(at);
        }
        path.push_back(at);
      }
      for (const int d : path) {
        for (size_t g = 0; g < groups; ++g) {
          plan[d].capacity[g] += capacity[g];
        }
      }
      const int node_at = static_cast<int>(plan.size());
      plan.push_back({PlanDomain::Kind::kNode, node.index, position, kAllGpus, capacity});
      plan[path.back()].children.push_back(node_at);
      if (capacity[first_group] > 0) {
        candidates.push_back(&node);
        candidate_masks.push_back(masks[first_group]);
        candidate_plan.push_back(node_at);
      }
      by_nvlink.clear();
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        if (MaskHas(root.restriction, static_cast<int>(g))) {
          by_nvlink[node.gpus[g].nvlink_domain] |= GpuMask{1} << g;
        }
      }
      for (const auto& [nvlink, gpus] : by_nvlink) {
        PlanDomain domain{PlanDomain::Kind::kNvlink, node.index, position, gpus,
                          std::vector<int>(groups, 0)};
        int64_t free = 0;
        for (size_t g = 0; g < node.gpus.size(); ++g) {
          free += MaskHas(gpus, static_cast<int>(g)) ? node.gpus[g].free_milli : 0;
        }
        domain.score = -free;  // the fullest NVLink domain first, as DefaultGpuPick
        for (size_t g = 0; g < groups; ++g) {
          if (capacity[g] > 0) {
            domain.capacity[g] =
                MaxTasksOnNode(contexts[g], node, masks[g] & gpus, job.groups[g].replicas);
          }
        }
        plan[node_at].children.push_back(static_cast<int>(plan.size()));
        plan.push_back(std::move(domain));
      }
    }
    std::vector<int> need(groups);
    for (size_t g = 0; g < groups; ++g) {
      need[g] = job.groups[g].replicas;
      if (plan[0].capacity[g] < need[g]) {
        return false;
      }
    }
    // The policy's (weighted) scores of the first task; a domain scores its best node's.
    if (candidates.size() == 1) {
      plan[candidate_plan[0]].score = 0;
    } else if (!candidates.empty()) {
      ComputeTotals(state, contexts[first_group], random, nullptr);
      for (size_t i = 0; i < candidates.size(); ++i) {
        plan[candidate_plan[i]].score = totals[i];
      }
    }
    for (size_t d = plan.size(); d-- > 0;) {
      if (plan[d].kind == PlanDomain::Kind::kLevel) {
        for (const int child : plan[d].children) {
          plan[d].score = std::max(plan[d].score, plan[child].score);
        }
      }
    }
    if (!Choose(0, need).ok) {
      return false;
    }
    std::vector<std::tuple<size_t, int, GpuMask>> chosen;
    CollectPlan(0, need, chosen);
    std::sort(chosen.begin(), chosen.end());
    plan_nodes.clear();
    plan_masks.clear();
    for (const auto& [position, node, mask] : chosen) {
      plan_nodes.push_back(node);
      plan_masks.push_back(mask);
    }
    return true;
  }

  // Places the gang in `domain` (of `level`): with `compact`, on the nodes PlanCompact chooses
  // first, then, if the gang does not fit there (capacities are upper bounds), anywhere in it.
  Status PlaceInDomain(CycleState& state, const std::vector<TaskContext>& contexts,
                       ClusterSnapshot& snapshot, const Domain& domain, const std::string& level,
                       bool compact, Random& random, bool* placed, int* failed_group) {
    *placed = false;
    if (compact && PlanCompact(state, contexts, snapshot, domain, level, random)) {
      GPUFLEET_RETURN_IF_ERROR(PlaceTasks(state, contexts, snapshot, plan_nodes, domain.restriction,
                                          random, placed, failed_group, &plan_masks));
      if (*placed) {
        return Status::Ok();
      }
    }
    return PlaceTasks(state, contexts, snapshot, domain.nodes, domain.restriction, random, placed,
                      failed_group);
  }

  // Fills each domain's capacity figures; true when it could hold every group.
  bool MeasureDomain(const CycleState& state, const std::vector<TaskContext>& contexts,
                     const ClusterSnapshot& snapshot, Domain& domain) const {
    const Job& job = state.job();
    domain.coverage = 1.0;
    domain.free_gpu_milli = 0;
    for (int n : domain.nodes) {
      const NodeInfo& node = snapshot.nodes()[n];
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        if (MaskHas(domain.restriction, static_cast<int>(g))) {
          domain.free_gpu_milli += node.gpus[g].free_milli;
        }
      }
    }
    for (size_t group = 0; group < job.groups.size(); ++group) {
      const int replicas = job.groups[group].replicas;
      int capacity = 0;
      for (int n : domain.nodes) {
        const NodeInfo& node = snapshot.nodes()[n];
        GpuMask mask = 0;
        if (Evaluate(state, contexts[group], node, domain.restriction, &mask).ok()) {
          capacity += MaxTasksOnNode(contexts[group], node, mask, replicas - capacity);
        }
        if (capacity >= replicas) {
          break;
        }
      }
      const double coverage = static_cast<double>(capacity) / replicas;
      if (coverage < domain.coverage || domain.short_group < 0) {
        if (coverage < domain.coverage) {
          domain.coverage = coverage;
        }
        domain.short_group = static_cast<int>(group);
        domain.short_capacity = capacity;
      }
    }
    return domain.coverage >= 1.0;
  }

  // Orders viable domains smallest first (best fit); `best_short` gets the best non-viable one.
  std::vector<Domain*> RankDomains(const CycleState& state,
                                   const std::vector<TaskContext>& contexts,
                                   const ClusterSnapshot& snapshot, std::vector<Domain>& domains,
                                   const Domain** best_short) const {
    std::vector<Domain*> viable;
    *best_short = nullptr;
    for (Domain& domain : domains) {
      if (MeasureDomain(state, contexts, snapshot, domain)) {
        viable.push_back(&domain);
      } else if (*best_short == nullptr || domain.coverage > (*best_short)->coverage) {
        *best_short = &domain;
      }
    }
    std::stable_sort(viable.begin(), viable.end(), [](const Domain* a, const Domain* b) {
      return a->free_gpu_milli < b->free_gpu_milli;
    });
    return viable;
  }

  // Why no node (of the scope, when given) takes a task of `group`, counted per reason.
  std::vector<std::string> Diagnose(const CycleState& state, const TaskContext& task,
                                    const ClusterSnapshot& snapshot, const PlacementScope* scope,
                                    int* fitting) const {
    std::map<std::string_view, int> reasons;
    *fitting = 0;
    auto judge = [&](const NodeInfo& node, GpuMask restriction) {
      GpuMask mask = 0;
      const PluginResult result = Evaluate(state, task, node, restriction, &mask);
      if (result.ok()) {
        ++*fitting;
      } else {
        ++reasons[result.reason];
      }
    };
    if (scope == nullptr) {
      for (const NodeInfo& node : snapshot.nodes()) {
        judge(node, kAllGpus);
      }
    } else {
      for (int n : scope->nodes) {
        judge(snapshot.nodes()[n], scope->gpus);
      }
    }
    std::vector<std::pair<std::string_view, int>> sorted(reasons.begin(), reasons.end());
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    std::vector<std::string> details;
    for (const auto& [reason, count] : sorted) {
      details.push_back(fmt::format("{} {}", count, reason));
    }
    return details;
  }
};

Scheduler::Scheduler(SchedulerOptions options)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {}

Scheduler::~Scheduler() = default;

Result<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options,
                                                     const PluginRegistry& registry) {
  const auto& policies = PlacementPolicyNames();
  if (std::find(policies.begin(), policies.end(), options.policy) == policies.end()) {
    return InvalidArgumentError(fmt::format("policy: unknown policy \"{}\" (known: {})",
                                            options.policy, fmt::join(policies, ", ")));
  }
  std::unique_ptr<Scheduler> scheduler(new Scheduler(options));
  Impl& impl = *scheduler->impl_;
  impl.tie_break = options.tie_break;
  std::vector<std::string> built_in = {"topology-levels", "fault-domain-spread", "gpu-model",
                                       "gpu-health",      "thermal-headroom",    "node-ready",
                                       "node-selector",   "identical-stack",     "link-health",
                                       "host-resources",  "gpu-resources"};
  if (options.require_container_runtime) {
    // Before the resource fits: a node that cannot run the task says so, not that it is full.
    built_in.insert(built_in.end() - 2, "container-runtime");
  }
  for (const std::string& name : built_in) {
    GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Plugin> plugin,
                              registry.Create(name, options.plugin_args));
    impl.Add(std::move(plugin), 0);
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Plugin> policy,
                            registry.Create(options.policy, options.plugin_args));
  impl.policy = dynamic_cast<ScorePlugin*>(policy.get());
  impl.Add(std::move(policy), options.policy_weight);
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Plugin> preference,
                            registry.Create("topology-preference", options.plugin_args));
  impl.Add(std::move(preference), options.topology_preference_weight);
  if (options.image_locality_weight < 0) {
    return InvalidArgumentError(fmt::format("image_locality_weight: {} (must not be negative)",
                                            options.image_locality_weight));
  }
  if (options.image_locality_weight > 0) {
    GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Plugin> locality,
                              registry.Create("image-locality", options.plugin_args));
    if (auto* scorer = dynamic_cast<ScorePlugin*>(locality.get())) {
      impl.tie_scorers.emplace_back(scorer, options.image_locality_weight);
    }
    impl.owned.push_back(std::move(locality));
  }
  impl.memo_allowed = options.reuse_unchanged_nodes && options.extra_plugins.empty();
  for (const auto& [scorer, weight] : impl.scorers) {
    impl.memo_allowed = impl.memo_allowed && scorer->ScoresNodeAlone();
  }
  for (const auto& [scorer, weight] : impl.tie_scorers) {
    impl.memo_allowed = impl.memo_allowed && scorer->ScoresNodeAlone();
  }
  for (const std::string& name : options.extra_plugins) {
    if (name == "image-locality") {
      // As a plain score it could outweigh the topology; its bound holds only as a tie-break.
      return InvalidArgumentError(
          "extra_plugins: image-locality is a tie-break score the scheduler adds itself; set "
          "image_locality_weight instead");
    }
    GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<Plugin> plugin,
                              registry.Create(name, options.plugin_args));
    const auto weight = options.extra_plugin_weights.find(name);
    impl.Add(std::move(plugin), weight == options.extra_plugin_weights.end() ? 1 : weight->second);
  }
  return scheduler;
}

ScheduleResult Scheduler::Schedule(const Job& job, ClusterSnapshot& snapshot, Random& random,
                                   Binder* binder, const PlacementScope* scope) {
  ScheduleResult result;
  if (Status valid = job.Validate(snapshot.catalog()); !valid.ok()) {
    result.outcome = ScheduleOutcome::kError;
    result.error = valid;
    result.reason = valid.message();
    return result;
  }
  Impl& impl = *impl_;
  impl.memo = nullptr;
  CycleState state(job);
  for (PreFilterPlugin* plugin : impl.pre_filters) {
    const PluginResult pre = plugin->PreFilter(state, snapshot);
    if (!pre.ok()) {
      result.reason = fmt::format("{}: {}", plugin->Name(), pre.reason);
      if (plugin->Name() == "topology-levels") {
        result.reason +=
            fmt::format(" (job asks for \"{}\"/\"{}\"; known: {})", job.topology.required_level,
                        job.topology.preferred_level, snapshot.topology().KnownLevelNames());
      }
      return result;
    }
  }

  std::vector<TaskContext> contexts(job.groups.size());
  for (size_t g = 0; g < job.groups.size(); ++g) {
    TaskContext& task = contexts[g];
    task.snapshot = &snapshot;
    task.job = &job;
    task.group = static_cast<int>(g);
    task.request = &job.groups[g].request;
    task.model_allowed.assign(snapshot.ModelCount(), job.allowed_gpu_models.empty());
    for (const std::string& name : job.allowed_gpu_models) {
      if (const int id = snapshot.ModelId(name); id >= 0) {
        task.model_allowed[id] = true;
      }
    }
    task.mig_profile.assign(snapshot.ModelCount(), nullptr);
    if (const auto* mig = std::get_if<MigGpus>(&task.request->gpus)) {
      for (int m = 0; m < snapshot.ModelCount(); ++m) {
        task.mig_profile[m] = snapshot.Model(m).FindMigProfile(mig->profile);
      }
    }
  }

  const std::string& required = job.topology.required_level;
  const std::string& preferred = job.topology.preferred_level;
  std::vector<Domain> domains(1);
  domains[0].name = "cluster";
  if (scope == nullptr) {
    domains[0].nodes.resize(snapshot.nodes().size());
    std::iota(domains[0].nodes.begin(), domains[0].nodes.end(), 0);
  } else {
    for (int n : scope->nodes) {
      if (n < 0 || n >= static_cast<int>(snapshot.nodes().size())) {
        result.outcome = ScheduleOutcome::kError;
        result.error = InvalidArgumentError(fmt::format(
            "scope.nodes: index {} out of range ({} nodes)", n, snapshot.nodes().size()));
        result.reason = result.error.message();
        return result;
      }
    }
    domains[0].nodes = scope->nodes;
    domains[0].restriction = scope->gpus;
  }
  if (!required.empty() || !job.identical_stack_labels.empty()) {
    domains = SplitIntoDomains(job, snapshot, domains[0].nodes, required, domains[0].restriction);
  }

  std::vector<Domain*> order;
  const Domain* best_short = nullptr;
  if (domains.size() == 1 && preferred.empty()) {
    order.push_back(&domains[0]);  // one domain: no need to measure it first
  } else {
    order = impl.RankDomains(state, contexts, snapshot, domains, &best_short);
  }

  // A gang of several tasks goes to the fewest domains at every level (PlanCompact); a job that
  // asks to be spread over fault domains is spread.
  int tasks = 0;
  for (const TaskGroup& group : job.groups) {
    tasks += group.replicas;
  }
  const bool compact = tasks > 1 && job.spread.fault_domain.empty();
  if (impl.memo_allowed && scope == nullptr && !compact) {
    if (const std::optional<JobShape> shape = MemoShapeOf(job)) {
      impl.memo = &impl.FindMemo(*shape, snapshot);
    }
  }
  int failed_group = 0;
  for (Domain* domain : order) {
    bool placed = false;
    // Inside the required domain, first try to keep the gang in one preferred-level domain.
    if (!preferred.empty() && preferred != required) {
      std::vector<Domain> inner =
          SplitIntoDomains(job, snapshot, domain->nodes, preferred, domain->restriction);
      if (inner.size() > 1) {
        const Domain* unused = nullptr;
        std::vector<Domain*> inner_order =
            impl.RankDomains(state, contexts, snapshot, inner, &unused);
        if (!inner_order.empty()) {
          if (Status status =
                  impl.PlaceInDomain(state, contexts, snapshot, *inner_order[0], preferred, compact,
                                     random, &placed, &failed_group);
              !status.ok()) {
            result.outcome = ScheduleOutcome::kError;
            result.error = status;
            result.reason = status.message();
            return result;
          }
        }
      }
    }
    // Otherwise (or when it overflows) the fewest domains at each level of the whole domain.
    if (!placed) {
      if (Status status = impl.PlaceInDomain(state, contexts, snapshot, *domain, required, compact,
                                             random, &placed, &failed_group);
          !status.ok()) {
        result.outcome = ScheduleOutcome::kError;
        result.error = status;
        result.reason = status.message();
        return result;
      }
    }
    if (!placed) {
      continue;
    }
    if (binder != nullptr) {
      if (Status bound = binder->Bind(job, state.reserved(), snapshot); !bound.ok()) {
        impl.Rollback(state, snapshot, 0);
        result.outcome = ScheduleOutcome::kError;
        result.error = bound;
        result.reason = "bind failed: " + bound.ToString();
        return result;
      }
    }
    result.outcome = ScheduleOutcome::kScheduled;
    result.placements = state.reserved();
    return result;
  }

  // Not placed: say why in terms a person can act on.
  if (!required.empty() || !job.identical_stack_labels.empty()) {
    // identicalStack splits the nodes by their stack's values (SplitIntoDomains).
    const std::string what = required.empty() ? "set of nodes with one identical stack" : required;
    if (best_short != nullptr) {
      result.reason = fmt::format("no {} can hold all tasks of {}; the best, {}, can hold {}", what,
                                  GroupLabel(job, best_short->short_group), best_short->name,
                                  best_short->short_capacity);
    } else {
      result.reason = fmt::format("no {} has room for the whole gang", what);
    }
    failed_group = best_short != nullptr ? best_short->short_group : failed_group;
  }
  int fitting = 0;
  result.details = impl.Diagnose(state, contexts[failed_group], snapshot, scope, &fitting);
  const size_t considered = scope == nullptr ? snapshot.nodes().size() : scope->nodes.size();
  if (!result.reason.empty() && !result.details.empty() &&
      (fitting == 0 || !job.identical_stack_labels.empty())) {
    // No node takes even one task: the domain figures alone would not say why.
    result.reason += fmt::format(" ({}/{} nodes can take a task: {})", fitting, considered,
                                 fmt::join(result.details, ", "));
  }
  if (result.reason.empty()) {
    result.reason =
        fitting == 0
            ? fmt::format("{}: 0/{} nodes can take a task: {}", GroupLabel(job, failed_group),
                          considered, fmt::join(result.details, ", "))
            : fmt::format("{}: only part of the gang fits ({} nodes can take a task)",
                          GroupLabel(job, failed_group), fitting);
  }
  return result;
}

bool CannotFitWhereSmallerFailed(const Job& job, const Job& smaller) {
  if (job.groups.size() != 1 || smaller.groups.size() != 1 || !job.spread.fault_domain.empty() ||
      !smaller.spread.fault_domain.empty() ||
      job.allowed_gpu_models != smaller.allowed_gpu_models ||
      job.min_gpu_memory_mib != smaller.min_gpu_memory_mib ||
      job.node_selector != smaller.node_selector ||
      job.topology.required_level != smaller.topology.required_level ||
      job.identical_stack_labels != smaller.identical_stack_labels ||
      job.identical_image_digest != smaller.identical_image_digest ||
      job.groups[0].image != smaller.groups[0].image) {
    return false;
  }
  const TaskGroup& a = job.groups[0];
  const TaskGroup& b = smaller.groups[0];
  const auto* a_gpus = std::get_if<WholeGpus>(&a.request.gpus);
  const auto* b_gpus = std::get_if<WholeGpus>(&b.request.gpus);
  return a_gpus != nullptr && b_gpus != nullptr && a_gpus->count >= b_gpus->count &&
         a.replicas >= b.replicas && a.request.host.cpu_milli >= b.request.host.cpu_milli &&
         a.request.host.memory_mib >= b.request.host.memory_mib;
}

}  // namespace gpufleet::scheduler
