// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

// Retention of finished jobs (issue 15, "Scale"; `gpufleet server --retain-finished`): a job
// that has been Succeeded, Failed or Cancelled for longer than the retention leaves the store
// with its event log, so that the store, restarts and the lists that read every job grow with
// the active jobs and the retention window, not with the fleet's whole history. Only finished
// jobs are ever deleted, each by a compare-and-set on the version read, so a job that changes
// while it is being collected (resubmitted, or anything else written to it) is left for the
// next pass.
//
// What stays: the reliability outcome records (kind "outcomes", what failure attribution and
// `gpufleet get outcomes` read) and the queues' decayed usage (kind "queue-usage") are separate
// objects and are kept; nodes' event logs are kept. What goes: the job document (spec, placements,
// state, reason) and its event log, so `gpufleet get job`/`describe`/`events` answer 404 for it.
//
// A finished job carries `finished_at` (RFC 3339) from the first pass that sees it finished
// (up to one scan interval after it finished; jobs of a store written before retention existed
// are stamped when first seen, so nothing is deleted earlier than the retention after an
// upgrade). The age is measured from that stamp with the wall clock.
namespace gpufleet::control {

// The default retention: 30 days, the window a Slurm site's `sacct` users and a Kubernetes
// user's `kubectl get jobs` habits expect to look back over, and the example.
inline constexpr Duration kDefaultRetainFinished = std::chrono::hours(24 * 30);

// Parses a retention: a non-negative integer with a unit s, m, h or d ("30d", "12h"), or "0" or
// "forever" (keep every finished job: returns 0). kInvalidArgument naming `field` and the value
// otherwise.
Result<Duration> ParseRetention(std::string_view field, std::string_view text);

// Not thread-safe: the leader's scheduling loop calls Step, one call at a time.
class RetentionController {
 public:
  struct Options {
    // Must outlive the controller.
    store::StateStore& store;
    const Clock& clock;
    // The age of a finished job is measured with it; null: nothing is ever collected.
    const WallClock* wall_clock = nullptr;
    // 0: keep every finished job.
    Duration retain_finished = kDefaultRetainFinished;
    // Jobs stamped or deleted by one commit, and commits by one Step, at most: a huge backlog is
    // worked through over many cycles, never in one long transaction or one long cycle.
    int batch_jobs = 500;
    int batches_per_step = 2;
    // How often the jobs are scanned for finished ones (when no work is left from the last
    // scan). The scan lists the jobs once; its cost grows with what retention keeps.
    Duration scan_interval = std::chrono::minutes(10);
  };

  struct StepResult {
    bool scanned = false;
    int stamped = 0;  // finished jobs given their finished_at
    int deleted = 0;  // finished jobs removed with their events
    int skipped = 0;  // changed since the scan (left for the next one)
  };

  explicit RetentionController(Options options) : options_(options) {}

  // One bounded step: scans when due and nothing is left to do, then stamps or deletes at most
  // batches_per_step x batch_jobs jobs. A store error ends the step (the work is found again by
  // the next scan).
  Result<StepResult> Step();

  // Jobs found by the last scan and not yet stamped or deleted.
  size_t backlog() const { return expired_.size() + unstamped_.size(); }

 private:
  Status Scan(int64_t now_unix_nanos);
  // Stamps or deletes (`remove`) up to batch_jobs names from `names`.
  Status RunBatch(std::deque<std::string>& names, bool remove, int64_t now_unix_nanos,
                  StepResult& result);

  Options options_;
  std::deque<std::string> expired_;    // finished longer than the retention
  std::deque<std::string> unstamped_;  // finished, without finished_at
  std::optional<MonoTime> last_scan_;
};

}  // namespace gpufleet::control
