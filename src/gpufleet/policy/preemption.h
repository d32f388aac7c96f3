// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/core/ids.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/policy/queues.h"
#include "gpufleet/policy/running_job.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/snapshot.h"

// Gang- and topology-aware preemption: for a job that does not fit, one search chooses the
// running jobs to stop so that it fits, knowing the job's gang and its required topology level.
// It frees a whole leaf (or NVLink domain, or node) with the fewest GPUs preempted instead of
// going node by node, and preempts every victim as a whole gang.
//
// Time is integer seconds on any time line the caller picks, the same for `now_seconds` and the
// running jobs' times. GPU amounts are milli-GPU, lost work is GPU-seconds.
namespace gpufleet::policy {

// "May `preemptor` preempt `victim`?": the caller's policy, e.g. a higher priority within a queue,
// or a queue within its guarantee reclaiming from queues over theirs (policy/queues.h knows that
// tree). Asked only about preemptible jobs past the minimum runtime; must be deterministic.
using PreemptionRule = std::function<bool(const Job& preemptor, const RunningJob& victim)>;

// Within one queue a higher priority preempts a lower one; never across queues.
PreemptionRule HigherPriorityInSameQueue();

// The queue tree's rule for a preemptor of `queue`, shared by the server and the simulator:
//   - within `queue`, a higher priority preempts a lower one;
//   - across queues, only to reclaim a guarantee: `queue` holds less than its guarantee, the
//     preemptor's GPUs fit in what is left of it (milli-GPU over all models), and the victim's
//     queue is one that `tree.ReclaimCandidates(queue)` names or lies below one, every queue from
//     that one down to the victim's being over its own guarantee (what a sub-queue holds within
//     its guarantee is not borrowed, even when its parent borrows).
// The fit keeps a reclaim from making the preemptor borrow in turn, which would let the victim's
// queue reclaim back; a job larger than what is left of its guarantee waits like any other.
// The tree is read now: make a new rule once it changes. kNotFound for an unknown queue.
Result<PreemptionRule> QueueTreeRule(const QueueTree& tree, const QueueId& queue);

// Validated by PreemptionSearch::Create.
struct PreemptionOptions {
  // A job that started less than this long before `now` is not a victim: it keeps the progress
  // it is making and cannot be stopped again and again. A running job's own
  // RunningJob::min_runtime_seconds replaces it. >= 0.
  int64_t min_runtime_seconds = 0;
  // What stopping a job costs beyond its lost work, per GPU: the time it takes to be placed
  // again, start, load its checkpoint and warm up. It makes the search weigh a large job that
  // has just checkpointed against a small one that has not (see PreemptionSearch). >= 0.
  int64_t restart_cost_seconds = 300;
  // A domain with more candidate victims than this is searched greedily (see PreemptionSearch);
  // up to it, exactly. 0..64.
  int max_exact_candidates = 20;
  // Most scheduler calls (fit checks) the exact search of one domain may make; when they are
  // spent, the best plan found so far stands, not proven optimal. >= 1.
  int64_t max_fit_checks_per_domain = 4096;
  // Most branch-and-bound steps (each a pass over the domain's GPUs) the exact search of one
  // domain may take, spent or not on fit checks; when they are spent, as above. >= 1.
  int64_t max_search_steps_per_domain = 1 << 16;

  // kInvalidArgument naming the field and its value, e.g. "min_runtime_seconds: -5 (must be >=
  // 0)".
  Status Validate() const;
};

// A partial release: the `tasks` placements of `job` with the highest replica stop, and the job
// runs on at its smaller size.
struct Shrink {
  JobId job;
  int tasks = 0;

  friend bool operator==(const Shrink&, const Shrink&) = default;
};

// What to preempt so that the preemptor fits, and where it then goes.
struct PreemptionPlan {
  // The domain of the preemptor's required level that it gets: "leaf-3", "n7" (level "node"),
  // "n7/nvlink-1" (an NVLink domain inside a node), or "cluster" without a required level.
  std::string domain;
  std::vector<JobId> victims;  // ascending; empty when the job fits without preemption
  // Elastic jobs that shrink instead; a plan has shrinks or victims, never both.
  std::vector<Shrink> shrinks;
  // Every GPU of every victim, inside the domain or not: a gang victim with one task on another
  // leaf is stopped whole.
  int64_t preempted_gpu_milli = 0;
  int64_t lost_work_gpu_seconds = 0;
  // Lost work plus the restart cost of every preempted GPU: what the search minimised.
  int64_t wasted_gpu_seconds = 0;
  // The preemptor's placements, valid in the snapshot once the victims' placements are released.
  std::vector<scheduler::TaskPlacement> placements;
  // False when a domain that might have held a better plan was searched greedily or ran out of
  // fit checks.
  bool proven_optimal = true;
};

struct PreemptionDecision {
  std::optional<PreemptionPlan> plan;
  // Without a plan: why, in one line a person can act on, e.g. "no leaf can be freed for job
  // \"train\" (64 GPUs): leaf-1 has 8 free, 16 of non-preemptible jobs, ...".
  std::string reason;
  // Without a plan: one line per domain with its figures.
  std::vector<std::string> details;
  // Effort: scheduler calls made and domains searched.
  int64_t fit_checks = 0;
  int domains_searched = 0;
};

// The victim search. For each domain of the preemptor's required level (the whole cluster when it
// has none), among the eligible running jobs with a task there, it finds the set whose release
// lets the preemptor fit there wasting the fewest GPU-seconds, then with the fewest GPUs
// preempted, then the fewest victims, then the smallest list of job ids; the best domain wins,
// ties going to the smaller domain name. A job that fits without preemption gets a plan with no
// victims.
//
// The GPU-seconds wasted by stopping a job are its lost work (its GPUs times the seconds since
// its last checkpoint, or since its start when it never reported one) plus its GPUs times
// restart_cost_seconds. Lost work and GPUs preempted are one sum, not an order: ranking GPUs
// first would stop a 4-GPU job that has not saved for hours rather than an 8-GPU job that saved
// a minute ago; ranking lost work first would stop a 64-GPU job ten minutes old rather than a
// 4-GPU job three hours old, and pay its restart on 64 GPUs. Both terms are GPU time the fleet
// spends again, so their sum is what preemption costs.
//
// "Fits" is the real scheduler, on a scratch copy of the snapshot with the victims' tasks in the
// domain released, confined to the domain (scheduler::PlacementScope).
//
// Per domain: first a greedy pass (add the most useful candidates, i.e. the largest share of their
// GPUs inside the domain, until the job fits, then drop those it fits without), whose result bounds
// the rest. Then, with at most max_exact_candidates candidates, a branch and bound over the
// candidates in the same order, which prunes a branch when its cost plus the restart cost of the
// GPUs still missing cannot beat the best plan so far (of any domain), or when even all remaining
// candidates cannot free enough GPUs; it calls the scheduler only for sets that free enough GPUs.
// The result is exact unless a domain was searched greedily or ran out of fit checks or search
// steps.
//
// Not thread-safe (it drives the scheduler): one search per thread.
class PreemptionSearch {
 public:
  // kInvalidArgument when `options` do not validate or `may_preempt` is empty.
  // REQUIRES: `scheduler` outlives the search.
  static Result<PreemptionSearch> Create(scheduler::Scheduler& scheduler,
                                         PreemptionRule may_preempt, PreemptionOptions options);

  // Chooses the victims for `preemptor` among `running`, whose placements are applied to
  // `snapshot`. The snapshot is not changed. Errors: kInvalidArgument for an invalid preemptor
  // (spec or unknown required level) or a running job with a bad field (duplicate or empty id, a
  // time after `now_seconds`, negative lost work, a placement out of range);
  // kFailedPrecondition when the running jobs hold more on a node or GPU than the snapshot has
  // allocated there (a stale placement); kInternal when the scheduler fails.
  Result<PreemptionDecision> Find(const scheduler::ClusterSnapshot& snapshot, const Job& preemptor,
                                  const std::vector<RunningJob>& running, int64_t now_seconds,
                                  Random& random);

  const PreemptionOptions& options() const { return options_; }

 private:
  PreemptionSearch(scheduler::Scheduler& scheduler, PreemptionRule may_preempt,
                   PreemptionOptions options)
      : scheduler_(&scheduler), may_preempt_(std::move(may_preempt)), options_(options) {}

  scheduler::Scheduler* scheduler_;
  PreemptionRule may_preempt_;
  PreemptionOptions options_;
};

}  // namespace gpufleet::policy
