// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpufleet/core/ids.h"
#include "gpufleet/core/status.h"

// Hierarchical queues with guaranteed quota, limits, weights and borrowing, and the fair-share
// order of pending jobs (docs/utilization.md). The server, the simulator, preemption and idle
// reclaim all account jobs here, so they agree on who is over its guarantee.
//
// Vocabulary:
//   queue       a node of the tree, named by its path "org/team/project"; its parent is the path
//               without the last segment ("org/team"), top-level queues have no slash.
//   guarantee   milli-GPU the queue is promised, per GPU model; key kAnyGpuModel adds a pool of
//               any model on top of the per-model amounts.
//   limit       most milli-GPU the queue may hold, per model; key kAnyGpuModel limits the total
//               over all models. No entry: unlimited.
//   allocated   milli-GPU held now by the jobs of the queue and of every queue below it.
//   over        how much of the allocation its guarantee does not cover (see OverGuarantee).
//   borrowed    the same, for a queue: what it holds of idle quota that others could reclaim.
//   usage       allocated GPU-seconds decayed with a half-life: recent use weighs more.
namespace gpufleet::policy {

// Milli-GPU by GPU model name (the catalog's canonical names).
using GpuMilliByModel = std::map<std::string, int64_t>;

// In a guarantee: a pool of any model on top of the per-model amounts. In a limit: the total.
inline constexpr std::string_view kAnyGpuModel = "*";

// The milli-GPU of `allocation` that `guarantee` does not cover: each model's excess over its own
// guarantee, summed, less the any-model pool (never below 0).
int64_t OverGuarantee(const GpuMilliByModel& allocation, const GpuMilliByModel& guarantee);

// The sum over models, kAnyGpuModel included.
int64_t TotalMilli(const GpuMilliByModel& amounts);

// One queue of the tree, as configured.
struct QueueSpec {
  std::string path;           // "org/team/project"; segments non-empty, no spaces
  GpuMilliByModel guarantee;  // >= 0 each; empty: no guarantee
  GpuMilliByModel limit;      // >= the guarantee; empty: unlimited
  double weight = 1.0;        // share of fair share among its siblings; > 0
  bool may_borrow = true;     // may hold more than its guarantee out of idle quota
  // Not created by anyone: the parent a child's path implies ("research" of "research/cv"),
  // with no guarantee. Errors about it say so, and how to create it.
  bool implicit = false;
};

struct QueueTreeOptions {
  // Usage loses half its weight every half-life (Slurm's PriorityDecayHalfLife defaults to 7 days).
  int64_t usage_half_life_seconds = 7 * 24 * 3600;
};

// A job waiting to start, as the fair-share order sees it.
struct PendingJob {
  JobId id;
  QueueId queue;
  int priority = 0;  // higher first
  int64_t submit_seconds = 0;
  // A job a device or node failure requeued: first in its queue among jobs of its priority.
  bool expedited = false;
};

enum class AdmissionOutcome {
  kWithinGuarantee,      // every queue on the path stays within its guarantee
  kBorrowing,            // some of it comes out of idle quota
  kOverLimit,            // a queue on the path would pass its limit
  kBorrowingNotAllowed,  // it would borrow at a queue that may not
  kNoIdleQuota,          // it would borrow more than the cluster has unallocated
};
const char* AdmissionOutcomeName(AdmissionOutcome outcome);

// Whether a job may start, as far as quota goes; the scheduler still decides whether it fits.
struct Admission {
  AdmissionOutcome outcome = AdmissionOutcome::kWithinGuarantee;
  // Milli-GPU of the request that the job's own queue's guarantee does not cover.
  int64_t borrowed_milli = 0;
  std::string reason;  // empty when admitted; else one line naming the queue, model and numbers

  bool admitted() const {
    return outcome == AdmissionOutcome::kWithinGuarantee || outcome == AdmissionOutcome::kBorrowing;
  }
};

// A queue holding more than its guarantee: where a starving queue can reclaim from.
struct QueueExcess {
  QueueId queue;
  int64_t over_milli = 0;
  // Levels up from the starving queue to the common parent: 0 for a sibling of the starving
  // queue, 1 for a sibling of its parent, and so on.
  int distance = 0;
};

// What `gpufleet get queues` shows for one queue.
struct QueueStatus {
  QueueId queue;
  GpuMilliByModel guarantee;
  GpuMilliByModel limit;
  GpuMilliByModel allocated;
  int64_t borrowed_milli = 0;
  std::map<std::string, double> usage_gpu_seconds;  // decayed
  double weight_share = 0;                          // weight / the siblings' total weight
  // Dominant usage share among the siblings / weight_share: below 1 the queue got less than its
  // weight's share of recent use and its jobs go first.
  double fair_share_ratio = 0;
};

// The queue tree with its accounting. A job's allocation counts toward its queue and every
// ancestor. Pure bookkeeping: no clock (time comes in through Advance), no IO. Thread-compatible.
class QueueTree {
 public:
  // Validates the specs: every error names the spec (index and path), the field and the value:
  // malformed or duplicate paths, an undefined parent, negative amounts, a limit below the
  // guarantee, children whose guarantees exceed their parent's, a weight that is not > 0, a
  // half-life that is not > 0. kInvalidArgument.
  static Result<QueueTree> Create(std::vector<QueueSpec> specs, QueueTreeOptions options = {});

  // The cluster's GPU capacity per model: borrowing beyond it is kNoIdleQuota, and each model's
  // usage counts in proportion to its scarcity in the dominant share. Without it, borrowing is
  // bounded only by the scheduler, and a GPU-second of any model weighs the same.
  void SetCapacity(GpuMilliByModel capacity);

  // Records that `job` of `queue` now holds `allocation`. kNotFound for an unknown queue,
  // kAlreadyExists for a job already charged, kInvalidArgument for a negative amount. Admission
  // is not checked here (see CheckAdmission). REQUIRES: Advance(now) was called for the time of
  // the change, so that usage accrues over the right intervals.
  Status Charge(const JobId& job, const QueueId& queue, const GpuMilliByModel& allocation);
  // Gives back what Charge recorded for `job`. kNotFound when it holds nothing.
  Status Release(const JobId& job);

  // Accrues usage up to `now_seconds` (the time of the first Advance when none came before; 0 at
  // creation) and decays it. kInvalidArgument when `now_seconds` is before the last Advance.
  Status Advance(int64_t now_seconds);

  // Whether a job of `queue` asking for `request` may start now: every queue on the path stays
  // within its limit, and the part of the request not covered by guarantees (attributed bottom
  // up: what the job's queue's guarantee covers is never borrowing higher up) comes from idle
  // quota at queues that may borrow. kNotFound for an unknown queue.
  Result<Admission> CheckAdmission(const QueueId& queue, const GpuMilliByModel& request) const;

  // Sorts `jobs` into start order: higher priority first; then fair share, level by level down
  // the tree (at the first level where two jobs' queue paths part, the sibling with the lower
  // dominant decayed usage per unit of weight goes first, as in hierarchical DRF and Slurm's fair
  // tree); then expedited jobs; then earlier submit time; then job id. Stable and deterministic.
  // kNotFound, with `jobs` unchanged, when a job names an unknown queue.
  Status Order(std::vector<PendingJob>& jobs) const;
  // The positions in `jobs` in the order Order sorts them into, for a caller that keeps more of
  // each job than PendingJob holds. kNotFound when a job names an unknown queue.
  Result<std::vector<size_t>> OrderedPositions(const std::vector<PendingJob>& jobs) const;

  // Milli-GPU `queue` holds beyond its guarantee (0 within it). kNotFound for an unknown queue.
  Result<int64_t> Borrowed(const QueueId& queue) const;

  // For a queue that holds less than its guarantee: the queues over their guarantee that it may
  // reclaim from, i.e. every sibling of the queue or of one of its ancestors that is over its
  // guarantee, nearest relatives first, then the largest excess, then path. kNotFound for an
  // unknown queue; kFailedPrecondition when the queue already holds its whole guarantee.
  Result<std::vector<QueueExcess>> ReclaimCandidates(const QueueId& starving) const;

  // Adds decayed GPU-seconds by model to the usage of `queue` alone (not its ancestors, which
  // have their own), e.g. what a server recorded before it restarted. kNotFound for an unknown
  // queue; kInvalidArgument for an amount that is negative or not finite.
  Status AddUsage(const QueueId& queue, const std::map<std::string, double>& gpu_seconds);

  Result<QueueStatus> StatusOf(const QueueId& queue) const;
  // Every queue's path, parents before children, siblings by path.
  std::vector<QueueId> Queues() const;
  // The queue a job was charged to; kNotFound when it holds nothing.
  Result<QueueId> QueueOfJob(const JobId& job) const;
  int64_t last_advance_seconds() const { return last_advance_seconds_; }

 private:
  struct Node {
    QueueSpec spec;
    int parent = -1;
    std::vector<int> children;
    int depth = 0;
    GpuMilliByModel allocated;
    std::map<std::string, double> usage;  // decayed GPU-seconds
  };
  struct Charged {
    int queue = 0;
    GpuMilliByModel allocation;
  };

  QueueTree() = default;
  Result<int> IndexOf(const QueueId& queue) const;
  // Ancestors of `queue` and the queue itself, outermost first.
  std::vector<int> PathOf(int queue) const;
  // Dominant decayed usage per unit of weight: the order key among siblings.
  double FairShareKey(int queue) const;

  QueueTreeOptions options_;
  std::vector<Node> nodes_;  // parents before children, siblings by path
  std::map<std::string, int, std::less<>> index_;
  GpuMilliByModel capacity_;
  std::unordered_map<JobId, Charged> charged_;
  int64_t last_advance_seconds_ = 0;
};

}  // namespace gpufleet::policy
