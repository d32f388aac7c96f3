// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/scheduler.h"

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <span>
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
      return PluginResult::Unschedulable(NoFreeGpusReason(task));
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

  // Chooses among `candidates` by weighted, normalised scores; ties uniformly at random.
  size_t SelectNode(const CycleState& state, const TaskContext& task, Random& random,
                    const ShapeMemo* from_memo) {
    if (candidates.size() == 1) {
      return 0;
    }
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

  // Places every task of the job on `nodes`, or none. On failure, `failed_group` names the group
  // that ran out of room.
  Status PlaceTasks(CycleState& state, const std::vector<TaskContext>& contexts,
                    ClusterSnapshot& snapshot, const std::vector<int>& nodes, GpuMask restriction,
                    Random& random, bool* placed, int* failed_group) {
    const Job& job = state.job();
    const size_t keep = state.reserved().size();
    // Larger tasks first: they have the fewest places to go.
    std::vector<int> order(job.groups.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return RequestedGpuMilli(job.groups[a].request.gpus) >
             RequestedGpuMilli(job.groups[b].request.gpus);
    });
    *placed = false;
    for (int group : order) {
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
          for (int n : nodes) {
            GpuMask mask = 0;
            if (Evaluate(state, task, snapshot.nodes()[n], restriction, &mask).ok()) {
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
                                       "node-selector",   "identical-stack",     "host-resources",
                                       "gpu-resources"};
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

  if (impl.memo_allowed && scope == nullptr) {
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
                  impl.PlaceTasks(state, contexts, snapshot, inner_order[0]->nodes,
                                  inner_order[0]->restriction, random, &placed, &failed_group);
              !status.ok()) {
            result.outcome = ScheduleOutcome::kError;
            result.error = status;
            result.reason = status.message();
            return result;
          }
        }
      }
    }
    if (!placed) {
      if (Status status = impl.PlaceTasks(state, contexts, snapshot, domain->nodes,
                                          domain->restriction, random, &placed, &failed_group);
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
