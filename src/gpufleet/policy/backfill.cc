// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/backfill.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::TaskPlacement;

// Takes running jobs' placements out of a snapshot for a what-if and puts them back, last out
// first in, so the snapshot ends as it began.
class ReleasedPlacements {
 public:
  explicit ReleasedPlacements(ClusterSnapshot& snapshot) : snapshot_(snapshot) {}

  void Release(const std::vector<TaskPlacement>& placements) {
    for (const TaskPlacement& placement : placements) {
      snapshot_.Release(placement);
      released_.push_back(&placement);
    }
  }

  Status Restore() {
    for (auto it = released_.rbegin(); it != released_.rend(); ++it) {
      Status applied = snapshot_.Apply(**it);
      if (!applied.ok()) {
        // Release leaves the MIG instances a task created on the GPU, free: take those again
        // rather than creating them a second time.
        TaskPlacement again = **it;
        for (scheduler::GpuAssignment& gpu : again.gpus) {
          gpu.mig_created = false;
        }
        applied = snapshot_.Apply(again);
      }
      if (!applied.ok()) {
        return InternalError(
            fmt::format("backfill: cannot restore a released placement: {}", applied.ToString()));
      }
    }
    released_.clear();
    return Status::Ok();
  }

 private:
  ClusterSnapshot& snapshot_;
  std::vector<const TaskPlacement*> released_;
};

// Where `head` would go in `snapshot` as it is; the snapshot is left unchanged.
std::optional<std::vector<TaskPlacement>> TryPlace(scheduler::Scheduler& scheduler, const Job& head,
                                                   ClusterSnapshot& snapshot, Random& random) {
  scheduler::ScheduleResult result = scheduler.Schedule(head, snapshot, random);
  if (!result.scheduled()) {
    return std::nullopt;
  }
  for (auto it = result.placements.rbegin(); it != result.placements.rend(); ++it) {
    snapshot.Revert(*it);
  }
  return std::move(result.placements);
}

}  // namespace

int64_t PlannedEndSeconds(const RunningJob& job, int64_t now_seconds,
                          const BackfillOptions& options) {
  if (job.estimate_seconds <= 0) {
    return kNeverEnds;
  }
  const int64_t limit = job.start_seconds + job.estimate_seconds;
  if (now_seconds <= limit) {
    return limit;
  }
  return std::max(now_seconds, limit + options.overrun_grace_seconds);
}

BackfillPlanner::BackfillPlanner(scheduler::Scheduler& scheduler, BackfillOptions options)
    : scheduler_(scheduler), options_(options) {}

Result<Reservation> BackfillPlanner::Reserve(const Job& head,
                                             const std::vector<RunningJob>& running,
                                             int64_t now_seconds, ClusterSnapshot& snapshot,
                                             Random& random) {
  Reservation reservation;
  reservation.job = head.id;
  if (auto placed = TryPlace(scheduler_, head, snapshot, random)) {
    reservation.shadow_seconds = now_seconds;
    reservation.placements = std::move(*placed);
    return reservation;
  }
  std::vector<int64_t> ends(running.size());
  std::vector<size_t> order(running.size());
  for (size_t i = 0; i < running.size(); ++i) {
    ends[i] = PlannedEndSeconds(running[i], now_seconds, options_);
  }
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ends[a] != ends[b] ? ends[a] < ends[b] : running[a].id < running[b].id;
  });

  const int64_t needed_milli = head.RequestedGpuMilliTotal();
  ReleasedPlacements released(snapshot);
  for (size_t next = 0; next < order.size() && ends[order[next]] != kNeverEnds;) {
    // Jobs planned to end at the same second leave together, as they will.
    const int64_t end = ends[order[next]];
    for (; next < order.size() && ends[order[next]] == end; ++next) {
      released.Release(running[order[next]].placements);
    }
    if (snapshot.TotalGpuMilli() - snapshot.AllocatedGpuMilli() < needed_milli) {
      continue;
    }
    if (auto placed = TryPlace(scheduler_, head, snapshot, random)) {
      reservation.shadow_seconds = end;
      reservation.placements = std::move(*placed);
      break;
    }
  }
  GPUFLEET_RETURN_IF_ERROR(released.Restore());
  return reservation;
}

Result<bool> BackfillPlanner::KeepsReservation(const Reservation& reservation, const Job& head,
                                               const RunningJob& candidate,
                                               const std::vector<RunningJob>& running,
                                               int64_t now_seconds, ClusterSnapshot& snapshot,
                                               Random& random) {
  if (!reservation.exists() ||
      PlannedEndSeconds(candidate, now_seconds, options_) <= reservation.shadow_seconds) {
    return true;
  }
  // The cluster at the shadow time: everything planned to end by then has left, the candidate
  // has not.
  ReleasedPlacements released(snapshot);
  for (const RunningJob& job : running) {
    if (PlannedEndSeconds(job, now_seconds, options_) <= reservation.shadow_seconds) {
      released.Release(job.placements);
    }
  }
  const bool fits = TryPlace(scheduler_, head, snapshot, random).has_value();
  GPUFLEET_RETURN_IF_ERROR(released.Restore());
  return fits;
}

}  // namespace gpufleet::policy
