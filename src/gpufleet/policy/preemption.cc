// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/preemption.h"

#include <algorithm>
#include <compare>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "gpufleet/core/mig.h"
#include "gpufleet/policy/format.h"

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::GpuAssignment;
using scheduler::GpuMask;
using scheduler::NodeInfo;
using scheduler::PlacementScope;
using scheduler::ScheduleOutcome;
using scheduler::ScheduleResult;
using scheduler::TaskPlacement;

constexpr GpuMask kAllGpus = ~GpuMask{0};
constexpr int kMaxExactCandidatesLimit = 64;
// Domains named in the one-line reason; the details list them all.
constexpr size_t kDomainsInReason = 3;

bool MaskHas(GpuMask mask, int gpu) {
  return ((mask >> gpu) & 1U) != 0;
}

// "16", "2.5", "0.125": milli-GPU as GPUs, for people.
std::string FormatGpus(int64_t milli) {
  std::string text = fmt::format("{}.{:03}", milli / kMilliPerUnit, milli % kMilliPerUnit);
  while (text.back() == '0') {
    text.pop_back();
  }
  if (text.back() == '.') {
    text.pop_back();
  }
  return text;
}

// Milli-GPU one assignment holds: its share, or the compute share of its MIG instance.
// REQUIRES: a MIG profile known to the GPU's model (checked by AssessRunningJobs).
int64_t AssignmentMilli(const ClusterSnapshot& snapshot, const NodeInfo& node,
                        const GpuAssignment& assignment) {
  if (assignment.mig_profile.empty()) {
    return assignment.milli;
  }
  const MigProfile* profile =
      snapshot.Model(node.gpus[assignment.gpu].model_id).FindMigProfile(assignment.mig_profile);
  return profile->compute_slices * kMilliPerUnit / kMigComputeSlices;
}

// Milli-GPU the preemptor needs free in its domain, as a necessary condition for the pruning.
// MIG requests count nothing: they need free slices of their profile, which milli-GPU do not
// measure.
int64_t NeededGpuMilli(const Job& job) {
  int64_t milli = 0;
  for (const TaskGroup& group : job.groups) {
    if (!std::holds_alternative<MigGpus>(group.request.gpus)) {
      milli += group.replicas * RequestedGpuMilli(group.request.gpus);
    }
  }
  return milli;
}

// A set of nodes (and on them, GPUs) that must hold the whole preemptor: one domain of its
// required level, as the scheduler splits the cluster.
struct Domain {
  std::string name;
  std::vector<int> nodes;
  GpuMask gpus = kAllGpus;
};

Result<std::vector<Domain>> DomainsOf(const Job& job, const ClusterSnapshot& snapshot) {
  const std::string& level = job.topology.required_level;
  const int node_count = static_cast<int>(snapshot.nodes().size());
  std::vector<Domain> domains;
  if (level.empty()) {
    domains.push_back({"cluster", {}, kAllGpus});
    for (int n = 0; n < node_count; ++n) {
      domains[0].nodes.push_back(n);
    }
    return domains;
  }
  const int declared = snapshot.topology().LevelIndex(level);
  if (declared >= 0) {
    domains.resize(snapshot.DomainCount(declared));
    for (int d = 0; d < snapshot.DomainCount(declared); ++d) {
      domains[d].name = snapshot.DomainName(declared, d);
    }
    for (int n = 0; n < node_count; ++n) {
      domains[snapshot.nodes()[n].domains[declared]].nodes.push_back(n);
    }
  } else if (level == kNodeLevel) {
    for (int n = 0; n < node_count; ++n) {
      domains.push_back({snapshot.nodes()[n].node->id.value(), {n}, kAllGpus});
    }
  } else if (level == kNvlinkDomainLevel) {
    for (int n = 0; n < node_count; ++n) {
      const NodeInfo& node = snapshot.nodes()[n];
      std::map<int, GpuMask> by_nvlink;
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        by_nvlink[node.gpus[g].nvlink_domain] |= GpuMask{1} << g;
      }
      for (const auto& [nvlink, mask] : by_nvlink) {
        domains.push_back({fmt::format("{}/nvlink-{}", node.node->id.value(), nvlink), {n}, mask});
      }
    }
  } else {
    return InvalidArgumentError(
        fmt::format("preemptor.topology.required_level: unknown level \"{}\" (known: {})", level,
                    snapshot.topology().KnownLevelNames()));
  }
  std::sort(domains.begin(), domains.end(),
            [](const Domain& a, const Domain& b) { return a.name < b.name; });
  return domains;
}

// The domain (of the preemptor's required level) that holds `placement`.
std::string DomainNameOf(const Job& job, const ClusterSnapshot& snapshot,
                         const TaskPlacement& placement) {
  const std::string& level = job.topology.required_level;
  const NodeInfo& node = snapshot.nodes()[placement.node];
  if (level.empty()) {
    return "cluster";
  }
  if (const int declared = snapshot.topology().LevelIndex(level); declared >= 0) {
    return snapshot.DomainName(declared, node.domains[declared]);
  }
  if (level == kNodeLevel || placement.gpus.empty()) {
    return node.node->id.value();
  }
  return fmt::format("{}/nvlink-{}", node.node->id.value(),
                     node.gpus[placement.gpus[0].gpu].nvlink_domain);
}

// Why a running job may or may not be a victim.
enum class Standing { kCandidate, kNotPreemptible, kTooYoung, kNotAllowed };

struct JobFacts {
  int64_t gpu_milli = 0;  // all its GPUs
  int64_t lost_work_gpu_seconds = 0;
  Standing standing = Standing::kCandidate;
  // kTooYoung by a minimum runtime of its own, not PreemptionOptions::min_runtime_seconds.
  bool own_min_runtime = false;
};

// Checks the running jobs against each other and the snapshot and works out what preempting
// each would cost.
Result<std::vector<JobFacts>> AssessRunningJobs(
    const ClusterSnapshot& snapshot, const Job& preemptor, const std::vector<RunningJob>& running,
    int64_t now_seconds, const PreemptionRule& may_preempt, const PreemptionOptions& options) {
  const auto& nodes = snapshot.nodes();
  std::vector<std::vector<int64_t>> listed_milli(nodes.size());
  std::vector<HostResources> listed_host(nodes.size());
  for (size_t n = 0; n < nodes.size(); ++n) {
    listed_milli[n].assign(nodes[n].gpus.size(), 0);
  }
  std::map<JobId, size_t> seen;
  std::vector<JobFacts> facts(running.size());
  for (size_t i = 0; i < running.size(); ++i) {
    const RunningJob& job = running[i];
    if (job.id.empty()) {
      return InvalidArgumentError(fmt::format("running[{}].id: empty", i));
    }
    if (auto [it, inserted] = seen.emplace(job.id, i); !inserted) {
      return InvalidArgumentError(
          fmt::format("running[{}].id: \"{}\" is listed twice (also running[{}])", i,
                      job.id.value(), it->second));
    }
    if (job.id == preemptor.id) {
      return InvalidArgumentError(
          fmt::format("running[{}].id: \"{}\" is the preemptor itself", i, job.id.value()));
    }
    const std::string label = fmt::format("running[{}] (\"{}\")", i, job.id.value());
    if (job.start_seconds > now_seconds) {
      return InvalidArgumentError(fmt::format("{}.start_seconds: {} is after now_seconds {}", label,
                                              job.start_seconds, now_seconds));
    }
    if (job.min_runtime_seconds && *job.min_runtime_seconds < 0) {
      return InvalidArgumentError(fmt::format("{}.min_runtime_seconds: {} (must be >= 0)", label,
                                              *job.min_runtime_seconds));
    }
    if (job.last_checkpoint_seconds && *job.last_checkpoint_seconds > now_seconds) {
      return InvalidArgumentError(
          fmt::format("{}.last_checkpoint_seconds: {} is after now_seconds {}", label,
                      *job.last_checkpoint_seconds, now_seconds));
    }
    if (job.lost_work_gpu_seconds && *job.lost_work_gpu_seconds < 0) {
      return InvalidArgumentError(fmt::format("{}.lost_work_gpu_seconds: {} (must be >= 0)", label,
                                              *job.lost_work_gpu_seconds));
    }
    const int placed = static_cast<int>(job.placements.size());
    if (job.releasable_tasks < 0 || (job.releasable_tasks > 0 && job.releasable_tasks >= placed)) {
      return InvalidArgumentError(
          fmt::format("{}.releasable_tasks: {} (must be 0..{}, fewer than its placements)", label,
                      job.releasable_tasks, std::max(0, placed - 1)));
    }
    JobFacts& fact = facts[i];
    for (size_t p = 0; p < job.placements.size(); ++p) {
      const TaskPlacement& placement = job.placements[p];
      if (placement.node < 0 || placement.node >= static_cast<int>(nodes.size())) {
        return InvalidArgumentError(
            fmt::format("{}.placements[{}].node: index {} out of range ({} nodes)", label, p,
                        placement.node, nodes.size()));
      }
      const NodeInfo& node = nodes[placement.node];
      listed_host[placement.node] += placement.host;
      for (const GpuAssignment& assignment : placement.gpus) {
        if (assignment.gpu < 0 || assignment.gpu >= static_cast<int>(node.gpus.size())) {
          return InvalidArgumentError(
              fmt::format("{}.placements[{}].gpus: index {} out of range on node {} ({} GPUs)",
                          label, p, assignment.gpu, node.node->id.value(), node.gpus.size()));
        }
        if (!assignment.mig_profile.empty() &&
            snapshot.Model(node.gpus[assignment.gpu].model_id)
                    .FindMigProfile(assignment.mig_profile) == nullptr) {
          return InvalidArgumentError(
              fmt::format("{}.placements[{}].gpus: unknown MIG profile \"{}\" on node {} gpu {}",
                          label, p, assignment.mig_profile, node.node->id.value(), assignment.gpu));
        }
        const int64_t milli = AssignmentMilli(snapshot, node, assignment);
        listed_milli[placement.node][assignment.gpu] += milli;
        fact.gpu_milli += milli;
      }
    }
    if (job.lost_work_gpu_seconds) {
      fact.lost_work_gpu_seconds = *job.lost_work_gpu_seconds;
    } else {
      const int64_t since =
          std::max(job.start_seconds, job.last_checkpoint_seconds.value_or(job.start_seconds));
      fact.lost_work_gpu_seconds = fact.gpu_milli * (now_seconds - since) / kMilliPerUnit;
    }
    const int64_t min_runtime = job.min_runtime_seconds.value_or(options.min_runtime_seconds);
    if (!job.preemptible) {
      fact.standing = Standing::kNotPreemptible;
    } else if (now_seconds - job.start_seconds < min_runtime) {
      fact.standing = Standing::kTooYoung;
      fact.own_min_runtime = job.min_runtime_seconds.has_value();
    } else if (!may_preempt(preemptor, job)) {
      fact.standing = Standing::kNotAllowed;
    }
  }
  // Releasing a placement the snapshot does not hold would corrupt the scratch copy's counters.
  for (size_t n = 0; n < nodes.size(); ++n) {
    const NodeInfo& node = nodes[n];
    const HostResources allocated = node.capacity - node.free;
    if (!allocated.Covers(listed_host[n])) {
      return FailedPreconditionError(fmt::format(
          "running jobs hold {} on node {} but the snapshot has {} allocated there: a placement "
          "is stale or listed twice",
          listed_host[n].ToString(), node.node->id.value(), allocated.ToString()));
    }
    for (size_t g = 0; g < node.gpus.size(); ++g) {
      const int64_t allocated_milli = kMilliPerUnit - node.gpus[g].free_milli;
      if (listed_milli[n][g] > allocated_milli) {
        return FailedPreconditionError(fmt::format(
            "running jobs hold {} milli-GPU on node {} gpu {} but the snapshot has {} allocated "
            "there: a placement is stale or listed twice",
            listed_milli[n][g], node.node->id.value(), g, allocated_milli));
      }
    }
  }
  return facts;
}

// Applies a released placement of `job` to the scratch snapshot again. A released MIG instance
// stays on its GPU, free: it is taken back rather than created.
Status ApplyAgain(ClusterSnapshot& scratch, const RunningJob& job, int placement) {
  TaskPlacement again = job.placements[placement];
  for (GpuAssignment& assignment : again.gpus) {
    assignment.mig_created = false;
  }
  if (Status applied = scratch.Apply(again); !applied.ok()) {
    return InternalError(fmt::format("preemption: restoring {} after a fit check failed: {}",
                                     job.id.value(), applied.ToString()));
  }
  return Status::Ok();
}

// The placements of an elastic job in the order a shrink releases them: highest replica first.
std::vector<int> ReleaseOrder(const RunningJob& job) {
  std::vector<int> order(job.placements.size());
  for (size_t p = 0; p < order.size(); ++p) {
    order[p] = static_cast<int>(p);
  }
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return job.placements[a].replica > job.placements[b].replica;
  });
  return order;
}

// The shrink pass of PreemptionSearch::Find, on `scratch` (left as it was).
class ShrinkSearch {
 public:
  ShrinkSearch(scheduler::Scheduler& scheduler, ClusterSnapshot& scratch, const Job& preemptor,
               const std::vector<RunningJob>& running, Random& random)
      : scheduler_(&scheduler),
        scratch_(&scratch),
        preemptor_(&preemptor),
        running_(&running),
        random_(&random) {}

  // The fewest tasks, in the order `candidates` gives the jobs, whose release lets the preemptor
  // fit; nullopt when releasing all of them is not enough.
  Result<std::optional<PreemptionPlan>> Find(const std::vector<int>& candidates) {
    std::optional<PreemptionPlan> plan;
    for (const int job : candidates) {
      released_.push_back({job, ReleaseOrder((*running_)[job]), 0});
      const int most = (*running_)[job].releasable_tasks;
      GPUFLEET_RETURN_IF_ERROR(SetReleased(most));
      GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::vector<TaskPlacement>> fit, Fits());
      if (!fit) {
        continue;
      }
      // The fewest of this job's tasks: none did not fit (the jobs before it were not enough).
      int too_few = 0;
      int enough = most;
      while (enough - too_few > 1) {
        const int tasks = too_few + (enough - too_few) / 2;
        GPUFLEET_RETURN_IF_ERROR(SetReleased(tasks));
        GPUFLEET_ASSIGN_OR_RETURN(std::optional<std::vector<TaskPlacement>> tried, Fits());
        if (tried) {
          enough = tasks;
          fit = std::move(tried);
        } else {
          too_few = tasks;
        }
      }
      GPUFLEET_RETURN_IF_ERROR(SetReleased(enough));
      plan.emplace();
      plan->placements = std::move(*fit);
      for (const Released& released : released_) {
        plan->shrinks.push_back({(*running_)[released.job].id, released.tasks});
        for (int k = 0; k < released.tasks; ++k) {
          for (const GpuAssignment& gpu :
               (*running_)[released.job].placements[released.order[k]].gpus) {
            plan->preempted_gpu_milli += gpu.milli;
          }
        }
      }
      break;
    }
    while (!released_.empty()) {
      GPUFLEET_RETURN_IF_ERROR(SetReleased(0));
      released_.pop_back();
    }
    return plan;
  }

  int64_t fit_checks() const { return fit_checks_; }

 private:
  struct Released {
    int job;
    std::vector<int> order;  // ReleaseOrder
    int tasks;               // the first `tasks` of `order` are released in the scratch
  };

  // Releases exactly the first `tasks` placements of the last job in released_.
  Status SetReleased(int tasks) {
    Released& last = released_.back();
    const RunningJob& job = (*running_)[last.job];
    for (; last.tasks < tasks; ++last.tasks) {
      scratch_->Release(job.placements[last.order[last.tasks]]);
    }
    for (; last.tasks > tasks; --last.tasks) {
      GPUFLEET_RETURN_IF_ERROR(ApplyAgain(*scratch_, job, last.order[last.tasks - 1]));
    }
    return Status::Ok();
  }

  // The preemptor's placements when it fits in the scratch as it is now (taken back).
  Result<std::optional<std::vector<TaskPlacement>>> Fits() {
    ++fit_checks_;
    ScheduleResult result = scheduler_->Schedule(*preemptor_, *scratch_, *random_);
    if (result.outcome == ScheduleOutcome::kError) {
      return result.error.ok() ? InternalError("scheduler: " + result.reason) : result.error;
    }
    if (!result.scheduled()) {
      return std::optional<std::vector<TaskPlacement>>();
    }
    for (auto it = result.placements.rbegin(); it != result.placements.rend(); ++it) {
      scratch_->Revert(*it);
    }
    return std::optional<std::vector<TaskPlacement>>(std::move(result.placements));
  }

  scheduler::Scheduler* scheduler_;
  ClusterSnapshot* scratch_;
  const Job* preemptor_;
  const std::vector<RunningJob>* running_;
  Random* random_;
  std::vector<Released> released_;
  int64_t fit_checks_ = 0;
};

// The order of plans: fewest GPU-seconds wasted (lost work plus the restart cost of every GPU
// preempted), fewest GPUs preempted, fewest victims.
struct Cost {
  int64_t wasted_gpu_seconds = 0;
  int64_t gpu_milli = 0;
  int64_t lost_work_gpu_seconds = 0;
  int victims = 0;

  friend auto operator<=>(const Cost&, const Cost&) = default;
};

// A plan's cost from its sums; also the bound of a plan that preempts `gpu_milli` or more.
Cost MakeCost(int64_t gpu_milli, int64_t lost_work_gpu_seconds, int victims,
              int64_t restart_cost_seconds) {
  return {lost_work_gpu_seconds + gpu_milli * restart_cost_seconds / kMilliPerUnit, gpu_milli,
          lost_work_gpu_seconds, victims};
}

// The best plan so far, over all domains.
struct Incumbent {
  Cost cost;
  std::string domain;
  std::vector<JobId> victims;  // ascending
  std::vector<TaskPlacement> placements;
};

// A running job that may be preempted and has a task in the domain.
struct VictimCandidate {
  int job = 0;                // index into the running jobs
  int64_t domain_milli = 0;   // GPUs it frees inside the domain
  std::vector<int> releases;  // indices of its placements on the domain's nodes
  // Milli-GPU it frees per GPU of the domain that whole or fractional tasks could use.
  std::vector<std::pair<int, int64_t>> frees;
};

// Milli-GPU of a domain by who holds them, for the reason when nothing can be freed.
struct Holdings {
  int64_t free = 0;
  int64_t candidates = 0;
  int64_t not_preemptible = 0;
  int64_t too_young = 0;
  bool too_young_by_own_min_runtime = false;
  int64_t not_allowed = 0;
  int64_t other = 0;  // allocations of jobs not in the running list
};

// What one task group of the preemptor needs of single GPUs: whole GPUs of one node, or a share of
// one GPU. The search uses it only as a necessary condition, before calling the scheduler.
struct TaskNeed {
  bool whole = true;
  int64_t per_task = 0;  // whole: GPUs per task; otherwise milli-GPU per task
  int replicas = 0;
  std::string label;  // "8 tasks of 8 GPUs"
};

std::vector<TaskNeed> TaskNeedsOf(const Job& job) {
  std::vector<TaskNeed> needs;
  for (const TaskGroup& group : job.groups) {
    if (const auto* whole = std::get_if<WholeGpus>(&group.request.gpus)) {
      needs.push_back({true, whole->count, group.replicas,
                       fmt::format("{} tasks of {} GPUs", group.replicas, whole->count)});
    } else if (const auto* share = std::get_if<FractionalGpu>(&group.request.gpus)) {
      needs.push_back({false, share->gpu_milli, group.replicas,
                       fmt::format("{} tasks of {} milli-GPU", group.replicas, share->gpu_milli)});
    }
  }
  return needs;
}

struct FitCheck {
  bool fits = false;
  std::vector<TaskPlacement> placements;
  std::string reason;
};

// Everything one Find call shares between its domain searches.
struct SearchContext {
  scheduler::Scheduler* scheduler = nullptr;
  ClusterSnapshot* scratch = nullptr;
  const Job* preemptor = nullptr;
  const std::vector<RunningJob>* running = nullptr;
  const std::vector<JobFacts>* facts = nullptr;
  const PreemptionOptions* options = nullptr;
  Random* random = nullptr;
  int64_t need_milli = 0;
  std::vector<TaskNeed> needs;
  // (running job, placement) pairs by node index.
  std::vector<std::vector<std::pair<int, int>>> placements_by_node;
  std::optional<Incumbent> best;
  int64_t fit_checks = 0;
};

// The victim search inside one domain.
class DomainSearch {
 public:
  DomainSearch(SearchContext& context, const Domain& domain)
      : context_(&context), domain_(&domain) {
    scope_.nodes = domain.nodes;
    scope_.gpus = domain.gpus;
  }

  const Domain& domain() const { return *domain_; }
  const Holdings& holdings() const { return holdings_; }
  const std::vector<VictimCandidate>& candidates() const { return candidates_; }
  bool exhaustive() const { return exhaustive_; }
  const std::string& all_released_reason() const { return all_released_reason_; }

  // Sorts out who holds what in the domain and which jobs could be victims.
  void Survey() {
    const ClusterSnapshot& snapshot = *context_->scratch;
    const std::vector<RunningJob>& running = *context_->running;
    const std::vector<JobFacts>& facts = *context_->facts;
    int64_t allocated = 0;
    // Every GPU of the domain's nodes gets a slot; those outside the domain's GPUs or with MIG
    // enabled are not usable by whole or fractional tasks and stay at 0 free.
    std::map<int, size_t> by_job;
    std::vector<VictimCandidate> touching;
    for (int n : domain_->nodes) {
      const NodeInfo& node = snapshot.nodes()[n];
      const int first = static_cast<int>(base_free_.size());
      node_slots_.emplace_back(first, first + static_cast<int>(node.gpus.size()));
      for (size_t g = 0; g < node.gpus.size(); ++g) {
        const bool inside = MaskHas(domain_->gpus, static_cast<int>(g));
        if (inside) {
          holdings_.free += node.gpus[g].free_milli;
          allocated += kMilliPerUnit - node.gpus[g].free_milli;
        }
        usable_.push_back(inside && !node.gpus[g].mig_enabled);
        base_free_.push_back(usable_.back() ? node.gpus[g].free_milli : 0);
      }
      for (const auto& [job, p] : context_->placements_by_node[n]) {
        auto [it, inserted] = by_job.emplace(job, touching.size());
        if (inserted) {
          touching.push_back(VictimCandidate{job, 0, {}, {}});
        }
        VictimCandidate& candidate = touching[it->second];
        candidate.releases.push_back(p);
        for (const GpuAssignment& assignment : running[job].placements[p].gpus) {
          if (!MaskHas(domain_->gpus, assignment.gpu)) {
            continue;
          }
          const int64_t milli = AssignmentMilli(snapshot, node, assignment);
          candidate.domain_milli += milli;
          if (usable_[first + assignment.gpu]) {
            candidate.frees.emplace_back(first + assignment.gpu, milli);
          }
        }
      }
    }
    int64_t listed = 0;
    for (VictimCandidate& candidate : touching) {
      listed += candidate.domain_milli;
      switch (facts[candidate.job].standing) {
        case Standing::kCandidate:
          holdings_.candidates += candidate.domain_milli;
          candidates_.push_back(std::move(candidate));
          break;
        case Standing::kNotPreemptible:
          holdings_.not_preemptible += candidate.domain_milli;
          break;
        case Standing::kTooYoung:
          holdings_.too_young += candidate.domain_milli;
          holdings_.too_young_by_own_min_runtime |= facts[candidate.job].own_min_runtime;
          break;
        case Standing::kNotAllowed:
          holdings_.not_allowed += candidate.domain_milli;
          break;
      }
    }
    holdings_.other = allocated - listed;
    // Most useful first: the largest share of the victim's GPUs inside the domain, then the most
    // freed there, then the least lost work, then by id.
    std::sort(candidates_.begin(), candidates_.end(),
              [&](const VictimCandidate& a, const VictimCandidate& b) {
                const JobFacts& fa = facts[a.job];
                const JobFacts& fb = facts[b.job];
                // a.domain / a.total > b.domain / b.total, cross-multiplied; a job without GPUs has
                // 0 / 1.
                const int64_t share_a = a.domain_milli * std::max<int64_t>(1, fb.gpu_milli);
                const int64_t share_b = b.domain_milli * std::max<int64_t>(1, fa.gpu_milli);
                if (share_a != share_b) {
                  return share_a > share_b;
                }
                if (a.domain_milli != b.domain_milli) {
                  return a.domain_milli > b.domain_milli;
                }
                if (fa.lost_work_gpu_seconds != fb.lost_work_gpu_seconds) {
                  return fa.lost_work_gpu_seconds < fb.lost_work_gpu_seconds;
                }
                return running[a.job].id < running[b.job].id;
              });
    suffix_milli_.assign(candidates_.size() + 1, 0);
    for (size_t i = candidates_.size(); i > 0; --i) {
      suffix_milli_[i - 1] = suffix_milli_[i] + candidates_[i - 1].domain_milli;
    }
  }

  // Whether freeing every candidate frees enough GPUs; without it no set can fit.
  bool CanFreeEnough() const {
    return !candidates_.empty() && holdings_.free + suffix_milli_[0] >= context_->need_milli;
  }

  // The lowest cost any plan in this domain can have.
  Cost LowerBound() const {
    return MakeCost(std::max<int64_t>(0, context_->need_milli - holdings_.free), 0, 1,
                    context_->options->restart_cost_seconds);
  }

  // True when a plan of `cost` here could still replace the best plan so far.
  bool CanStillWin(const Cost& cost) const {
    if (!context_->best) {
      return true;
    }
    if (cost != context_->best->cost) {
      return cost < context_->best->cost;
    }
    // Same cost: only a smaller domain name wins. Within a domain the first plan found stands;
    // looking on for one with smaller job ids could visit every set of that cost.
    return domain_->name < context_->best->domain;
  }

  // Adds the most useful candidates until the job fits, then drops those it fits without.
  Status Greedy() {
    std::vector<int> chosen;
    int64_t freed = 0;
    std::vector<int64_t> free = base_free_;
    std::optional<FitCheck> fitted;
    for (size_t i = 0; i < candidates_.size() && !fitted; ++i) {
      chosen.push_back(static_cast<int>(i));
      freed += candidates_[i].domain_milli;
      AddFrees(free, static_cast<int>(i), +1);
      if (!MayFit(freed, free)) {
        if (i + 1 == candidates_.size()) {
          all_released_reason_ = RoomShortfall(free);
        }
        continue;
      }
      GPUFLEET_ASSIGN_OR_RETURN(FitCheck check, Check(chosen));
      if (check.fits) {
        fitted = std::move(check);
      } else if (i + 1 == candidates_.size()) {
        all_released_reason_ = check.reason;
      }
    }
    if (!fitted) {
      return Status::Ok();
    }
    // Reprieve the costliest victims first: each one the job fits without stays running.
    std::vector<int> by_cost = chosen;
    std::sort(by_cost.begin(), by_cost.end(), [&](int a, int b) {
      const Cost cost_a = Plus(Cost{}, a);
      const Cost cost_b = Plus(Cost{}, b);
      if (cost_a != cost_b) {
        return cost_a > cost_b;
      }
      return a > b;
    });
    for (int victim : by_cost) {
      if (chosen.size() == 1) {
        break;  // no victims at all was tried first, by the caller
      }
      AddFrees(free, victim, -1);
      const int64_t freed_without = freed - candidates_[victim].domain_milli;
      std::vector<int> without;
      for (int c : chosen) {
        if (c != victim) {
          without.push_back(c);
        }
      }
      bool fits_without = false;
      if (MayFit(freed_without, free)) {
        GPUFLEET_ASSIGN_OR_RETURN(FitCheck check, Check(without));
        if (check.fits) {
          fits_without = true;
          chosen = std::move(without);
          freed = freed_without;
          fitted = std::move(check);
        }
      }
      if (!fits_without) {
        AddFrees(free, victim, +1);
      }
    }
    Cost cost;
    for (int c : chosen) {
      cost = Plus(cost, c);
    }
    Record(cost, chosen, std::move(fitted->placements));
    return Status::Ok();
  }

  // Branch and bound over the candidates, bounded by the best plan of any domain so far.
  Status Exact() {
    const size_t slots = base_free_.size();
    suffix_free_.assign(candidates_.size() + 1, std::vector<int64_t>(slots, 0));
    for (size_t i = candidates_.size(); i > 0; --i) {
      suffix_free_[i - 1] = suffix_free_[i];
      for (const auto& [slot, milli] : candidates_[i - 1].frees) {
        suffix_free_[i - 1][slot] += milli;
      }
    }
    free_ = base_free_;
    checks_ = 0;
    steps_ = 0;
    chosen_.clear();
    return Explore(0, Cost{}, 0);
  }

  void MarkNotExhaustive() { exhaustive_ = false; }

 private:
  Cost Plus(const Cost& cost, int candidate) const {
    const JobFacts& fact = (*context_->facts)[candidates_[candidate].job];
    return MakeCost(cost.gpu_milli + fact.gpu_milli,
                    cost.lost_work_gpu_seconds + fact.lost_work_gpu_seconds, cost.victims + 1,
                    context_->options->restart_cost_seconds);
  }

  void AddFrees(std::vector<int64_t>& free, int candidate, int sign) const {
    for (const auto& [slot, milli] : candidates_[candidate].frees) {
      free[slot] += sign * milli;
    }
  }

  // How many tasks of `need` the domain's GPUs could take with `free` milli-GPU free on each.
  int64_t TaskRoom(const TaskNeed& need, const std::vector<int64_t>& free) const {
    int64_t tasks = 0;
    for (const auto& [first, end] : node_slots_) {
      if (need.whole) {
        int64_t idle = 0;
        for (int slot = first; slot < end; ++slot) {
          idle += usable_[slot] && free[slot] == kMilliPerUnit ? 1 : 0;
        }
        tasks += idle / need.per_task;
      } else {
        for (int slot = first; slot < end; ++slot) {
          tasks += usable_[slot] ? free[slot] / need.per_task : 0;
        }
      }
    }
    return tasks;
  }

  // A necessary condition for the job to fit: enough milli-GPU free in the domain, and room for
  // every group's tasks counted on single GPUs (a task of k whole GPUs needs k idle GPUs on one
  // node). Saves the scheduler calls for sets that cannot work.
  bool MayFit(int64_t freed, const std::vector<int64_t>& free) const {
    if (holdings_.free + freed < context_->need_milli) {
      return false;
    }
    for (const TaskNeed& need : context_->needs) {
      if (TaskRoom(need, free) < need.replicas) {
        return false;
      }
    }
    return true;
  }

  std::string RoomShortfall(const std::vector<int64_t>& free) const {
    for (const TaskNeed& need : context_->needs) {
      if (const int64_t room = TaskRoom(need, free); room < need.replicas) {
        return fmt::format("room for {} of its {} only", room, need.label);
      }
    }
    return "too few GPUs";
  }

  // Tries the candidates from `next` on, given the victims in chosen_ (of `cost`, freeing
  // `freed` in the domain and leaving free_ free per GPU) that do not let the job fit.
  Status Explore(size_t next, const Cost& cost, int64_t freed) {
    if (next == candidates_.size() || !exhaustive_) {
      return Status::Ok();
    }
    if (++steps_ > context_->options->max_search_steps_per_domain) {
      exhaustive_ = false;
      return Status::Ok();
    }
    // Even with every remaining candidate preempted the job would not fit.
    remaining_free_ = free_;
    for (size_t slot = 0; slot < remaining_free_.size(); ++slot) {
      remaining_free_[slot] += suffix_free_[next][slot];
    }
    if (!MayFit(freed + suffix_milli_[next], remaining_free_)) {
      return Status::Ok();
    }
    // Any plan from here adds a victim, and at least the GPUs still missing.
    const int64_t missing = std::max<int64_t>(0, context_->need_milli - holdings_.free - freed);
    if (!CanStillWin(MakeCost(cost.gpu_milli + missing, cost.lost_work_gpu_seconds,
                              cost.victims + 1, context_->options->restart_cost_seconds))) {
      return Status::Ok();
    }
    const int candidate = static_cast<int>(next);
    const Cost with = Plus(cost, candidate);
    // Every set containing chosen_ plus this candidate costs at least `with`.
    if (CanStillWin(with)) {
      chosen_.push_back(candidate);
      AddFrees(free_, candidate, +1);
      const int64_t freed_with = freed + candidates_[next].domain_milli;
      bool fits = false;
      if (MayFit(freed_with, free_)) {
        if (checks_ >= context_->options->max_fit_checks_per_domain) {
          exhaustive_ = false;
        } else {
          ++checks_;
          GPUFLEET_ASSIGN_OR_RETURN(FitCheck check, Check(chosen_));
          if (check.fits) {
            fits = true;
            Record(with, chosen_, std::move(check.placements));
          }
        }
      }
      // A set that fits is not extended: a larger one costs more.
      if (!fits) {
        GPUFLEET_RETURN_IF_ERROR(Explore(next + 1, with, freed_with));
      }
      AddFrees(free_, candidate, -1);
      chosen_.pop_back();
    }
    return Explore(next + 1, cost, freed);
  }

  void Record(const Cost& cost, const std::vector<int>& chosen,
              std::vector<TaskPlacement> placements) {
    Incumbent plan{cost, domain_->name, {}, std::move(placements)};
    for (int c : chosen) {
      plan.victims.push_back((*context_->running)[candidates_[c].job].id);
    }
    std::sort(plan.victims.begin(), plan.victims.end());
    std::optional<Incumbent>& best = context_->best;
    if (!best || std::tie(plan.cost, plan.domain, plan.victims) <
                     std::tie(best->cost, best->domain, best->victims)) {
      best = std::move(plan);
    }
  }

  // Whether the preemptor fits in the domain once the victims' tasks there are released: the real
  // scheduler on the scratch snapshot, confined to the domain. Leaves the scratch as it was.
  Result<FitCheck> Check(const std::vector<int>& victims) {
    ClusterSnapshot& scratch = *context_->scratch;
    const std::vector<RunningJob>& running = *context_->running;
    ++context_->fit_checks;
    for (int c : victims) {
      for (int p : candidates_[c].releases) {
        scratch.Release(running[candidates_[c].job].placements[p]);
      }
    }
    ScheduleResult result = context_->scheduler->Schedule(*context_->preemptor, scratch,
                                                          *context_->random, nullptr, &scope_);
    if (result.scheduled()) {
      for (auto it = result.placements.rbegin(); it != result.placements.rend(); ++it) {
        scratch.Revert(*it);
      }
    }
    for (auto c = victims.rbegin(); c != victims.rend(); ++c) {
      const std::vector<int>& releases = candidates_[*c].releases;
      for (auto p = releases.rbegin(); p != releases.rend(); ++p) {
        GPUFLEET_RETURN_IF_ERROR(ApplyAgain(scratch, running[candidates_[*c].job], *p));
      }
    }
    if (result.outcome == ScheduleOutcome::kError) {
      return result.error.ok() ? InternalError("scheduler: " + result.reason) : result.error;
    }
    return FitCheck{result.scheduled(), std::move(result.placements), std::move(result.reason)};
  }

  SearchContext* context_;
  const Domain* domain_;
  PlacementScope scope_;
  Holdings holdings_;
  std::vector<VictimCandidate> candidates_;  // most useful first
  std::vector<int64_t> suffix_milli_;        // [i]: domain milli of candidates i..end
  // One slot per GPU of the domain's nodes, node by node.
  std::vector<std::pair<int, int>> node_slots_;  // [first, end) per domain node
  std::vector<bool> usable_;                     // by whole or fractional tasks
  std::vector<int64_t> base_free_;               // milli-GPU free now
  // The exact search's state: [i][slot] milli freed by candidates i..end; free with chosen_
  // released; scratch for the bound.
  std::vector<std::vector<int64_t>> suffix_free_;
  std::vector<int64_t> free_;
  std::vector<int64_t> remaining_free_;
  std::vector<int> chosen_;
  int64_t checks_ = 0;
  int64_t steps_ = 0;
  bool exhaustive_ = true;
  std::string all_released_reason_;
};

std::string DescribeHoldings(const DomainSearch& search, const PreemptionOptions& options) {
  const Holdings& held = search.holdings();
  std::string line = fmt::format("{} has {} free", search.domain().name, FormatGpus(held.free));
  auto add = [&](int64_t milli, std::string_view what) {
    if (milli > 0) {
      line += fmt::format(", {} {}", FormatGpus(milli), what);
    }
  };
  add(held.candidates, "preemptible");
  add(held.not_preemptible, "of non-preemptible jobs");
  add(held.too_young, held.too_young_by_own_min_runtime
                          ? std::string("of jobs within their minimum runtime")
                          : fmt::format("of jobs started less than {} ago",
                                        FormatSpan(options.min_runtime_seconds)));
  add(held.not_allowed, "of jobs the preemption rule protects");
  add(held.other, "of other work");
  return line;
}

}  // namespace

Status PreemptionOptions::Validate() const {
  if (min_runtime_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("min_runtime_seconds: {} (must be >= 0)", min_runtime_seconds));
  }
  if (restart_cost_seconds < 0) {
    return InvalidArgumentError(
        fmt::format("restart_cost_seconds: {} (must be >= 0)", restart_cost_seconds));
  }
  if (max_exact_candidates < 0 || max_exact_candidates > kMaxExactCandidatesLimit) {
    return InvalidArgumentError(fmt::format("max_exact_candidates: {} (must be in 0..{})",
                                            max_exact_candidates, kMaxExactCandidatesLimit));
  }
  if (max_fit_checks_per_domain < 1) {
    return InvalidArgumentError(
        fmt::format("max_fit_checks_per_domain: {} (must be >= 1)", max_fit_checks_per_domain));
  }
  if (max_search_steps_per_domain < 1) {
    return InvalidArgumentError(
        fmt::format("max_search_steps_per_domain: {} (must be >= 1)", max_search_steps_per_domain));
  }
  return Status::Ok();
}

PreemptionRule HigherPriorityInSameQueue() {
  return [](const Job& preemptor, const RunningJob& victim) {
    return victim.queue == preemptor.queue && victim.priority < preemptor.priority;
  };
}

Result<PreemptionRule> QueueTreeRule(const QueueTree& tree, const QueueId& queue) {
  GPUFLEET_ASSIGN_OR_RETURN(const QueueStatus own, tree.StatusOf(queue));
  const int64_t held_within_guarantee = TotalMilli(own.allocated) - own.borrowed_milli;
  const int64_t guarantee_left = TotalMilli(own.guarantee) - held_within_guarantee;
  // ReclaimCandidates refuses (kFailedPrecondition) a queue that holds its whole guarantee: it
  // reclaims nothing.
  std::vector<std::string> reclaimable;
  if (const Result<std::vector<QueueExcess>> over = tree.ReclaimCandidates(queue); over.ok()) {
    for (const QueueExcess& excess : *over) {
      reclaimable.push_back(excess.queue.value());
    }
  }
  std::set<std::string, std::less<>> borrowing;
  if (!reclaimable.empty()) {
    for (const QueueId& other : tree.Queues()) {
      if (const Result<int64_t> borrowed = tree.Borrowed(other); borrowed.ok() && *borrowed > 0) {
        borrowing.insert(other.value());
      }
    }
  }
  return PreemptionRule(
      [own_queue = queue, guarantee_left, reclaimable = std::move(reclaimable),
       borrowing = std::move(borrowing)](const Job& preemptor, const RunningJob& victim) {
        if (victim.queue == own_queue) {
          return victim.priority < preemptor.priority;
        }
        if (reclaimable.empty() || preemptor.RequestedGpuMilliTotal() > guarantee_left) {
          return false;
        }
        const std::string& path = victim.queue.value();
        for (const std::string& over : reclaimable) {
          const bool within =
              path == over || (path.size() > over.size() &&
                               path.compare(0, over.size(), over) == 0 && path[over.size()] == '/');
          if (!within) {
            continue;
          }
          // Every queue from `over` (borrowing, as a candidate) down to the victim's.
          for (size_t slash = path.find('/', over.size()); slash != std::string::npos;
               slash = path.find('/', slash + 1)) {
            if (borrowing.count(std::string_view(path).substr(0, slash)) == 0) {
              return false;
            }
          }
          return borrowing.count(path) > 0;
        }
        return false;
      });
}

Result<PreemptionSearch> PreemptionSearch::Create(scheduler::Scheduler& scheduler,
                                                  PreemptionRule may_preempt,
                                                  PreemptionOptions options) {
  GPUFLEET_RETURN_IF_ERROR(options.Validate());
  if (!may_preempt) {
    return InvalidArgumentError("may_preempt: no rule given");
  }
  return PreemptionSearch(scheduler, std::move(may_preempt), options);
}

Result<PreemptionDecision> PreemptionSearch::Find(const ClusterSnapshot& snapshot,
                                                  const Job& preemptor,
                                                  const std::vector<RunningJob>& running,
                                                  int64_t now_seconds, Random& random) {
  if (Status valid = preemptor.Validate(snapshot.catalog()); !valid.ok()) {
    return InvalidArgumentError("preemptor: " + valid.message());
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::vector<Domain> domains, DomainsOf(preemptor, snapshot));
  GPUFLEET_ASSIGN_OR_RETURN(
      std::vector<JobFacts> facts,
      AssessRunningJobs(snapshot, preemptor, running, now_seconds, may_preempt_, options_));

  PreemptionDecision decision;
  ClusterSnapshot scratch = snapshot.Clone();
  // Nothing to preempt when the job fits as things are: the scheduler picks the domain.
  ScheduleResult as_is = scheduler_->Schedule(preemptor, scratch, random);
  decision.fit_checks = 1;
  if (as_is.outcome == ScheduleOutcome::kError) {
    return as_is.error.ok() ? InternalError("scheduler: " + as_is.reason) : as_is.error;
  }
  if (as_is.scheduled()) {
    PreemptionPlan plan;
    plan.domain = DomainNameOf(preemptor, snapshot, as_is.placements.front());
    plan.placements = std::move(as_is.placements);
    decision.plan = std::move(plan);
    return decision;
  }

  const std::string job_label = fmt::format("job \"{}\" ({} GPUs)", preemptor.id.value(),
                                            FormatGpus(preemptor.RequestedGpuMilliTotal()));
  std::map<Standing, int> standings;
  bool own_min_runtimes = false;
  for (const JobFacts& fact : facts) {
    ++standings[fact.standing];
    own_min_runtimes |= fact.own_min_runtime;
  }
  if (standings[Standing::kCandidate] == 0) {
    std::vector<std::string> parts;
    if (running.empty()) {
      parts.push_back("no job is running");
    }
    if (int n = standings[Standing::kNotPreemptible]; n > 0) {
      parts.push_back(fmt::format("{} not preemptible", n));
    }
    if (int n = standings[Standing::kTooYoung]; n > 0) {
      parts.push_back(own_min_runtimes ? fmt::format("{} within their minimum runtime", n)
                                       : fmt::format("{} started less than {} ago", n,
                                                     FormatSpan(options_.min_runtime_seconds)));
    }
    if (int n = standings[Standing::kNotAllowed]; n > 0) {
      parts.push_back(fmt::format("{} protected by the preemption rule", n));
    }
    decision.reason = fmt::format("no running job may be preempted for {}: {}", job_label,
                                  fmt::join(parts, ", "));
    return decision;
  }

  // A shrink first: it stops no job, and an elastic job above its minimum gives up its highest
  // ranks before any job of its priority or lower is preempted whole (issue 37 item 6). The
  // elastic candidates shrink in order, lowest priority first, each to its minimum until the
  // preemptor fits; the last one only by as many tasks as it must (a binary search): at most
  // 1 + ceil(log2(releasable tasks)) fit checks per elastic candidate.
  std::vector<int> elastic;
  for (size_t i = 0; i < running.size(); ++i) {
    if (facts[i].standing == Standing::kCandidate && running[i].releasable_tasks > 0) {
      elastic.push_back(static_cast<int>(i));
    }
  }
  if (!elastic.empty()) {
    std::stable_sort(elastic.begin(), elastic.end(), [&](int a, int b) {
      return std::tie(running[a].priority, running[a].id) <
             std::tie(running[b].priority, running[b].id);
    });
    ShrinkSearch shrink(*scheduler_, scratch, preemptor, running, random);
    GPUFLEET_ASSIGN_OR_RETURN(std::optional<PreemptionPlan> plan, shrink.Find(elastic));
    decision.fit_checks += shrink.fit_checks();
    if (plan) {
      plan->domain = DomainNameOf(preemptor, snapshot, plan->placements.front());
      plan->wasted_gpu_seconds =
          plan->preempted_gpu_milli * options_.restart_cost_seconds / kMilliPerUnit;
      decision.plan = std::move(plan);
      return decision;
    }
  }

  SearchContext context;
  context.scheduler = scheduler_;
  context.scratch = &scratch;
  context.preemptor = &preemptor;
  context.running = &running;
  context.facts = &facts;
  context.options = &options_;
  context.random = &random;
  context.need_milli = NeededGpuMilli(preemptor);
  context.needs = TaskNeedsOf(preemptor);
  context.placements_by_node.resize(snapshot.nodes().size());
  for (size_t j = 0; j < running.size(); ++j) {
    for (size_t p = 0; p < running[j].placements.size(); ++p) {
      context.placements_by_node[running[j].placements[p].node].emplace_back(static_cast<int>(j),
                                                                             static_cast<int>(p));
    }
  }
  std::vector<DomainSearch> searches;
  searches.reserve(domains.size());
  for (const Domain& domain : domains) {
    searches.emplace_back(context, domain);
    searches.back().Survey();
  }

  // A greedy plan per domain first: the best of them bounds the exact searches.
  std::vector<DomainSearch*> feasible;
  for (DomainSearch& search : searches) {
    if (search.CanFreeEnough()) {
      feasible.push_back(&search);
      ++decision.domains_searched;
      GPUFLEET_RETURN_IF_ERROR(search.Greedy());
    }
  }
  // Then the exact searches, most promising domain first.
  std::stable_sort(feasible.begin(), feasible.end(),
                   [](const DomainSearch* a, const DomainSearch* b) {
                     return a->LowerBound() < b->LowerBound();
                   });
  for (DomainSearch* search : feasible) {
    if (static_cast<int>(search->candidates().size()) > options_.max_exact_candidates) {
      search->MarkNotExhaustive();
      continue;
    }
    if (search->CanStillWin(search->LowerBound())) {
      GPUFLEET_RETURN_IF_ERROR(search->Exact());
    }
  }
  decision.fit_checks += context.fit_checks;

  if (context.best) {
    PreemptionPlan plan;
    plan.domain = std::move(context.best->domain);
    plan.victims = std::move(context.best->victims);
    plan.preempted_gpu_milli = context.best->cost.gpu_milli;
    plan.lost_work_gpu_seconds = context.best->cost.lost_work_gpu_seconds;
    plan.wasted_gpu_seconds = context.best->cost.wasted_gpu_seconds;
    plan.placements = std::move(context.best->placements);
    for (const DomainSearch* search : feasible) {
      // A domain searched only in part proves nothing if its bound could still beat the plan.
      if (!search->exhaustive() && search->CanStillWin(search->LowerBound())) {
        plan.proven_optimal = false;
      }
    }
    decision.plan = std::move(plan);
    return decision;
  }

  // No plan: name the domains that came closest, by what could be freed there.
  std::vector<const DomainSearch*> closest;
  for (const DomainSearch& search : searches) {
    closest.push_back(&search);
  }
  std::stable_sort(closest.begin(), closest.end(),
                   [](const DomainSearch* a, const DomainSearch* b) {
                     return a->holdings().free + a->holdings().candidates >
                            b->holdings().free + b->holdings().candidates;
                   });
  for (const DomainSearch* search : closest) {
    if (search->CanFreeEnough()) {
      decision.details.push_back(fmt::format(
          "{}: the job does not fit even with all {} candidates ({} GPUs there) preempted: {}",
          search->domain().name, search->candidates().size(),
          FormatGpus(search->holdings().candidates), search->all_released_reason()));
    } else {
      decision.details.push_back(DescribeHoldings(*search, options_));
    }
  }
  const std::string& level = preemptor.topology.required_level;
  std::vector<std::string> named(
      decision.details.begin(),
      decision.details.begin() +
          static_cast<std::ptrdiff_t>(std::min(kDomainsInReason, decision.details.size())));
  decision.reason = fmt::format("no {} can be freed for {}: {}", level.empty() ? "cluster" : level,
                                job_label, fmt::join(named, "; "));
  if (decision.details.size() > named.size()) {
    decision.reason += fmt::format("; {} more", decision.details.size() - named.size());
  }
  return decision;
}

}  // namespace gpufleet::policy
