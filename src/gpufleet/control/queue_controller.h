// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "gpufleet/control/lifecycle_controller.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/policy/queues.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/store/state_store.h"

// The queue side of the scheduling cycle (docs/utilization.md): the queue tree with quota and
// fair share, the order of pending jobs, admission of placements, and preemption for priority and
// for reclaiming guarantees, with the preemptors' reservations. It reads the view and the stored
// queues and returns the job writes it decides; the server commits them. The one store document
// it writes itself is its own: the queue tree's decayed usage (kQueueUsageKind), which outlives a
// restart.
namespace gpufleet::control {

// A Pending job of the view, as the cycle tries it.
struct PendingEntry {
  const std::string* name = nullptr;
  ViewJob* job = nullptr;
};

// The view's Pending jobs in name order, to be put in queue order by OrderPending.
std::vector<PendingEntry> PendingEntries(SchedulingView& view);

// Victims to stop for a preemptor: their writes (Stopping, `preempted_by`) and the preemptor's
// event, to be committed together; the reservation starts once they are (Reserve).
struct PreemptionPlan {
  std::vector<JobWrite> victim_writes;
  std::string preemptor_event;
  // The preemptor's new pending reason.
  std::string pending_reason;
};

// Not thread-safe except Statuses: every other method belongs to the thread that runs cycles.
class QueueController {
 public:
  struct Options {
    // Must outlive the controller.
    store::StateStore& store;
    const GpuCatalog& catalog;
    const Clock& clock;
    const WallClock* wall_clock = nullptr;  // null: usage saved without a time, not decayed
    MonoTime started_at;                    // cycle seconds count from here
    std::chrono::seconds usage_half_life{std::chrono::hours(24 * 7)};
    std::chrono::seconds min_runtime_before_preemption{60};
    // The most checkpoint grace a victim's notice gives (Job::checkpoint_grace_seconds is cut to
    // it); 0: no notices.
    std::chrono::seconds max_checkpoint_grace{300};
  };
  explicit QueueController(Options options);

  // Seconds since the server started on its clock: the tree's time.
  int64_t CycleSeconds() const;

  // Before the cycle orders its jobs: ends the reservations whose preemptor is placed, gone or
  // expired (the returned batch holds their events), follows the stored queues (rebuilding the
  // tree when they changed) and charges what the view's jobs hold.
  store::WriteBatch Update(SchedulingView& view, uint64_t cycle);

  // Pending jobs in queue order: reserved preemptors first, then priority and fair share, and a
  // job requeued for a preemptor that still waits right behind it.
  void OrderPending(std::vector<PendingEntry>& pending) const;

  // Charges an admitted placement to its queue; otherwise returns why it is refused.
  std::optional<std::string> Admit(const std::string& name, const ViewJob& job,
                                   const std::vector<scheduler::TaskPlacement>& placed,
                                   const scheduler::ClusterSnapshot& snapshot);

  bool HasReservation(const std::string& name) const { return reservations_.count(name) > 0; }
  // Why the job's queue would refuse `placed` now, charging nothing (explain's what-ifs), or
  // nullopt.
  std::optional<std::string> QuotaRefusal(const std::string& queue,
                                          const std::vector<scheduler::TaskPlacement>& placed,
                                          const scheduler::ClusterSnapshot& snapshot) const;
  // CycleSeconds() when the job's allocation was first charged (about when it started), or
  // nullopt for a job not charged.
  std::optional<int64_t> ChargedSince(const std::string& name) const;
  // Before `next_job` is tried, the reserved preemptors' planned GPUs are held in the snapshot
  // (once per cycle; nothing for a reserved preemptor itself), and given back after the loop.
  void HoldReservedGpus(SchedulingView& view, const std::string& next_job);
  void ReleaseReservedGpus(SchedulingView& view);

  // The victims whose stop makes room for `preemptor` (their stop starting at `now_text`), or
  // nullopt when preemption cannot help. A Running victim whose spec asks for a checkpoint grace
  // gets a notice instead (PreemptionNotice, from `now_ns`, the server's UsageNowNanos) and stops
  // when EndNoticedRuns ends its run. Once the plan's writes are committed, Reserve(name)
  // keeps the GPUs they free for the preemptor.
  Result<std::optional<PreemptionPlan>> PlanPreemption(
      SchedulingView& view, scheduler::Scheduler& scheduler, const std::string& name,
      const Job& preemptor, const std::string& queue, uint64_t cycle, const std::string& now_text,
      int64_t now_ns, Random& random);
  void Reserve(const std::string& name);
  // Whether GPUs are reserved for any preemptor: an elastic job does not grow into them.
  bool HasReservations() const { return !reservations_.empty(); }

  // After the cycle: publishes the tree's figures (Statuses) and saves the usage at most once
  // a minute.
  void Publish();
  // Saves the usage now, advanced to this moment (at Stop).
  void SaveUsageNow();
  // What `gpufleet get queues` shows beyond the stored queue: the last cycle's figures.
  // Thread-safe.
  std::map<std::string, policy::QueueStatus> Statuses();

 private:
  // How many of an elastic job's tasks a shrink may release: those above its minimum, at least
  // one task staying; 0 for any other job (policy::RunningJob::releasable_tasks).
  int ReleasableTasks(const ViewJob& job) const;
  // Marks the `tasks` highest ranks of the elastic job `job` (its document `doc`) for release,
  // each with the notice a victim would get (or a release at once without one), and its
  // world_size smaller by as many; returns the event.
  std::string ShrinkRun(wire::Json& doc, const ViewJob& job, int tasks, const std::string& why,
                        int64_t now_ns) const;

  struct Reservation {
    std::string domain;
    std::vector<std::string> victims;
    std::vector<scheduler::TaskPlacement> placements;  // the preemption plan's, for the job
    std::vector<std::string> placement_nodes;          // by name: snapshot indices may move
    int64_t until_seconds = 0;                         // CycleSeconds()
    uint64_t until_cycle = 0;
    bool placed_this_cycle = false;
  };
  struct ChargedJob {
    policy::GpuMilliByModel allocation;
    int64_t since_seconds = 0;  // CycleSeconds() when it was first charged
    int64_t version = 0;        // of the job document it was computed from
  };

  store::WriteBatch DropEndedReservations(SchedulingView& view, uint64_t cycle);
  void FollowStoredQueues(SchedulingView& view, std::map<std::string, int64_t>& since_before);
  void OrderByFairShare(std::vector<PendingEntry>& pending) const;
  std::optional<std::string> AdmitByQuota(const std::string& name, const ViewJob& job,
                                          const std::vector<scheduler::TaskPlacement>& placed,
                                          const scheduler::ClusterSnapshot& snapshot);
  Status LoadUsage();
  void SaveUsageIfDue();
  void SaveUsage();

  Options options_;
  std::optional<policy::QueueTree> tree_;
  // The queues that set a minimum runtime before preemption (Queue::min_runtime_seconds).
  std::map<std::string, int64_t, std::less<>> queue_min_runtime_;
  std::map<std::string, ChargedJob> charged_;
  bool usage_loaded_ = false;
  std::optional<MonoTime> usage_saved_at_;
  std::map<std::string, Reservation> reservations_;  // by preemptor
  // A plan waiting for its writes to commit (PlanPreemption, then Reserve).
  std::optional<std::pair<std::string, Reservation>> planned_;
  // What HoldReservedGpus applied this cycle; nullopt before it ran.
  std::optional<std::vector<scheduler::TaskPlacement>> held_placements_;
  std::mutex status_mu_;
  std::map<std::string, policy::QueueStatus> status_;  // guarded by status_mu_
};

}  // namespace gpufleet::control
