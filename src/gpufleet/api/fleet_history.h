// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {

// One sample of the fleet, taken by the scheduling loop (docs/dashboard.md, "History").
struct FleetSample {
  int64_t unix_ms = 0;          // when it was taken (the server's wall clock)
  int64_t gpus = 0;             // GPUs the scheduler sees
  int64_t allocated_milli = 0;  // GPU milli-units held by placed jobs
  // Measured: the sum over the fleet's GPUs of the utilization their agents last reported, in
  // GPU milli-units (8 GPUs at 50 % are 4000).
  int64_t busy_milli = 0;
  int64_t pending_jobs = 0;
  int64_t running_jobs = 0;  // jobs with placements (Scheduled, Running, Stopping)
  // A row of the coarse series stands for `samples` samples from `unix_ms` on: the figures above
  // are their means, the peaks their largest. A sample as taken is one, and Add sets its peaks
  // to its figures.
  int64_t peak_allocated_milli = 0;
  int64_t peak_busy_milli = 0;
  int64_t samples = 1;

  friend bool operator==(const FleetSample&, const FleetSample&) = default;
};

// The fleet's history, oldest first: the last `capacity` samples as taken, and before them, so
// that the history reaches back as far as the store keeps jobs, up to `coarse_capacity` coarse
// rows of kCoarseEvery samples each (an hour at one a minute) with their means and peaks. Stored
// as one document of rows, [[unix_ms, gpus, allocated_milli, busy_milli, pending_jobs,
// running_jobs, peak_allocated_milli, peak_busy_milli, samples], ...], "coarse" then "samples":
// a day of one sample a minute and 30 days of hours are about 110 KB. Thread-compatible.
class FleetHistory {
 public:
  static constexpr size_t kCoarseEvery = 60;

  // REQUIRES: capacity > 0.
  explicit FleetHistory(size_t capacity, size_t coarse_capacity = 0);

  // Appends `sample`, dropping the oldest past the capacity. A sample not later than the last
  // one (the wall clock stepped back) replaces the samples it is not later than, so the series
  // stays ordered.
  void Add(const FleetSample& sample);
  // The rows (coarse, then as taken) that end at or after `unix_ms`, oldest first.
  std::vector<FleetSample> Since(int64_t unix_ms) const;
  size_t size() const { return samples_.size(); }
  size_t coarse_size() const { return coarse_.size(); }
  size_t capacity() const { return capacity_; }

  // The stored document, and back. FromDocument keeps the last `capacity` samples and
  // `coarse_capacity` coarse rows (a sample past the capacity is folded into the coarse rows as
  // Add does) and returns kInvalidArgument naming the row for a malformed one. Rows of 6
  // integers (a document from before the coarse rows) are samples as taken.
  std::string ToDocument() const;
  static Result<FleetHistory> FromDocument(std::string_view document, size_t capacity,
                                           size_t coarse_capacity = 0);

  // The API's JSON of `samples` (GET /v1/history, docs/api.md).
  static wire::Json SamplesToJson(const std::vector<FleetSample>& samples);

 private:
  // While more than capacity + kCoarseEvery - 1 samples are kept, the oldest kCoarseEvery become
  // one coarse row (none without a coarse capacity: the oldest sample is dropped).
  void FoldOldest();

  size_t capacity_;
  size_t coarse_capacity_;
  std::deque<FleetSample> samples_;
  std::deque<FleetSample> coarse_;
};

// What the server keeps of the history while it records it (server_dashboard.cc). Thread-safe
// through `mu`, which the server takes before its gauges_mu_ and agents_mu_, never after.
struct FleetHistoryState {
  std::mutex mu;
  FleetHistory history{1};              // guarded by mu
  bool loaded = false;                  // read from the store; guarded by mu
  int64_t stored_version = 0;           // 0: not in the store yet; guarded by mu
  std::optional<MonoTime> last_sample;  // guarded by mu
};

}  // namespace gpufleet::api
