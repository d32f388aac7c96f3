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

  friend bool operator==(const FleetSample&, const FleetSample&) = default;
};

// The fleet's recent history: the last `capacity` samples, oldest first. Stored as one document
// of rows, [[unix_ms, gpus, allocated_milli, busy_milli, pending_jobs, running_jobs], ...], so
// that a day of one sample a minute is about 70 KB. Thread-compatible.
class FleetHistory {
 public:
  // REQUIRES: capacity > 0.
  explicit FleetHistory(size_t capacity);

  // Appends `sample`, dropping the oldest past the capacity. A sample not later than the last
  // one (the wall clock stepped back) replaces the samples it is not later than, so the series
  // stays ordered.
  void Add(const FleetSample& sample);
  // The samples taken at or after `unix_ms`, oldest first.
  std::vector<FleetSample> Since(int64_t unix_ms) const;
  size_t size() const { return samples_.size(); }
  size_t capacity() const { return capacity_; }

  // The stored document, and back. FromJson keeps the last `capacity` well-formed rows and
  // returns kInvalidArgument naming the row for a malformed one.
  std::string ToDocument() const;
  static Result<FleetHistory> FromDocument(std::string_view document, size_t capacity);

  // The API's JSON of `samples` (GET /v1/history, docs/api.md).
  static wire::Json SamplesToJson(const std::vector<FleetSample>& samples);

 private:
  size_t capacity_;
  std::deque<FleetSample> samples_;
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
