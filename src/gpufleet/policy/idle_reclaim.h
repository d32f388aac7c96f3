// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/ids.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"

// Idle reclaim of interactive jobs (notebooks): a notebook whose GPUs stay under a utilization
// threshold for an idle period while other work waits is warned, and reclaimed (suspended or
// preempted) when it is still idle at the end of a warning period, so that its GPUs go back to
// the batch queue. The owner sees why: every warning, withdrawal and reclaim carries a reason.
//
// Time is integer seconds on any time line the caller picks (Unix seconds in the server,
// simulated seconds in the simulator); the reasons print times of day as "HH:MM" of that time
// line (UTC for Unix seconds).
namespace gpufleet::policy {

// What happens to a reclaimed job. The caller carries it out: a suspended job keeps its place and
// resumes when it is scheduled again; a preempted one is ended and requeued.
enum class ReclaimAction { kSuspend, kPreempt };
const char* ReclaimActionName(ReclaimAction action);  // "suspend", "preempt"
// "suspend" or "preempt"; kInvalidArgument naming the text otherwise.
Result<ReclaimAction> ParseReclaimAction(std::string_view text);

// Validated by IdleReclaimer::Create.
struct IdleReclaimOptions {
  // A job is idle while its GPU utilization (milli, averaged over its GPUs) is strictly below
  // this; a sample exactly at the threshold counts as busy. 1..1000.
  int64_t threshold_milli = 100;
  // How long a job must stay idle, while work waits, before it is warned. > 0.
  int64_t idle_seconds = 30 * 60;
  // Time between the warning and the reclaim, for the owner to use the GPUs again. > 0.
  int64_t warning_seconds = 15 * 60;
  // Samples further apart than this leave a gap: what happened in it is unknown, so the gap ends
  // the idle run (the idle time starts again from the next idle sample), and a job whose latest
  // sample is older than this counts as not idle. Missing data never leads to a reclaim. > 0.
  int64_t max_sample_gap_seconds = 5 * 60;
  ReclaimAction action = ReclaimAction::kSuspend;

  // kInvalidArgument naming the field and its value, e.g. "threshold_milli: 0 (must be in
  // 1..1000)".
  Status Validate() const;
};

enum class ReclaimEventKind {
  kWarn,      // the job will be reclaimed at `deadline_seconds` unless it is used
  kWithdraw,  // an earlier warning no longer holds (busy again, queue empty, no samples)
  kReclaim,   // carry out `action` now
};
const char* ReclaimEventKindName(ReclaimEventKind kind);  // "warn", "withdraw", "reclaim"

// One output of IdleReclaimer::Decide, meant both for the caller (act on kReclaim) and for the
// job's owner (`describe`, events): `reason` is a sentence such as "GPUs under 10% for 30m while
// 12 jobs wait; will be suspended at 14:05 unless used".
struct ReclaimEvent {
  ReclaimEventKind kind = ReclaimEventKind::kWarn;
  JobId job;
  ReclaimAction action = ReclaimAction::kSuspend;
  int64_t time_seconds = 0;      // the `now` of the Decide call that made it
  int64_t deadline_seconds = 0;  // kWarn: when the job is reclaimed; otherwise 0
  std::string reason;

  friend bool operator==(const ReclaimEvent&, const ReclaimEvent&) = default;
};

// Where a tracked job stands.
enum class IdleState {
  kIgnored,    // not interactive: never warned nor reclaimed
  kWatching,   // interactive, not warned
  kWarned,     // warned; reclaimed at the deadline unless used
  kReclaimed,  // reclaimed; stays so until tracked again
};
const char* IdleStateName(IdleState state);  // "ignored", "watching", "warned", "reclaimed"

struct IdleJobStatus {
  IdleState state = IdleState::kWatching;
  // Start of the current idle run; nullopt when the job is not idle (or has no samples).
  std::optional<int64_t> idle_since_seconds;
  int64_t deadline_seconds = 0;  // kWarned only
  std::string last_reason;       // reason of the job's latest event; empty before the first
};

// The state machine of idle reclaim, fed with utilization samples and asked, now and then, what
// to do. Pure and deterministic: the same calls give the same events, ordered by job id. Not
// thread-safe (thread-compatible): the owner serialises the calls.
//
// Per interactive job:
//   watching --idle >= idle_seconds and jobs wait--> warned (kWarn)
//   warned --busy sample, gap, stale samples or no job waiting--> watching (kWithdraw)
//   warned --deadline reached, idle throughout, jobs wait--> reclaimed (kReclaim)
// A job warned and then withdrawn because the queue emptied, and still idle, is warned again
// (with a full warning period) as soon as jobs wait again.
class IdleReclaimer {
 public:
  // kInvalidArgument when `options` do not validate.
  static Result<IdleReclaimer> Create(const IdleReclaimOptions& options);

  const IdleReclaimOptions& options() const { return options_; }

  // Starts watching a running job. A job that is not JobKind::kInteractive is remembered as
  // ignored: its samples are accepted and dropped. Tracking a reclaimed job again (it resumed)
  // starts it afresh. kAlreadyExists when the job is tracked and not reclaimed.
  Status Track(const JobId& job, JobKind kind);
  // Forgets a job (it ended); a no-op for an unknown job.
  void Untrack(const JobId& job);

  // Records the job's GPU utilization (milli, averaged over its GPUs) at `time_seconds`.
  // kNotFound for a job that is not tracked; kInvalidArgument for a utilization outside
  // 0..1000 or a time before the job's previous sample. Samples of ignored and reclaimed jobs
  // are dropped.
  Status Observe(const JobId& job, int64_t time_seconds, int64_t utilization_milli);

  // The warnings, withdrawals and reclaims due at `now_seconds`, with `pending_jobs` jobs waiting
  // for GPUs, ordered by job id. kInvalidArgument for a negative `pending_jobs` or a `now_seconds`
  // before the previous call's.
  Result<std::vector<ReclaimEvent>> Decide(int64_t now_seconds, int pending_jobs);

  // kNotFound for a job that is not tracked.
  Result<IdleJobStatus> Describe(const JobId& job) const;

 private:
  struct JobRecord {
    IdleState state = IdleState::kWatching;
    std::optional<int64_t> last_sample_seconds;
    int64_t last_sample_milli = 0;
    std::optional<int64_t> idle_since_seconds;  // start of the current idle run
    int64_t warned_at_seconds = 0;
    int64_t deadline_seconds = 0;
    // Why the latest idle run ended: a busy sample or a gap in the samples.
    std::string run_break_reason;
    std::string last_reason;
  };

  explicit IdleReclaimer(const IdleReclaimOptions& options) : options_(options) {}

  // Whether the job is idle at `now`: an unbroken run of idle samples up to a fresh one.
  bool IdleAt(const JobRecord& record, int64_t now) const;
  std::optional<ReclaimEvent> Step(const JobId& id, JobRecord& record, int64_t now,
                                   int pending_jobs) const;

  IdleReclaimOptions options_;
  std::map<JobId, JobRecord> jobs_;
  std::optional<int64_t> last_decide_seconds_;
};

}  // namespace gpufleet::policy
