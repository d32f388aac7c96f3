// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/fleet_history.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/core/rfc3339.h"

namespace gpufleet::api {

namespace {

// A sample as taken: one, its peaks its figures.
FleetSample TakenSample(FleetSample sample) {
  sample.peak_allocated_milli = sample.allocated_milli;
  sample.peak_busy_milli = sample.busy_milli;
  sample.samples = 1;
  return sample;
}

constexpr size_t kRowFields = 9;
constexpr size_t kOldRowFields = 6;  // before the coarse rows: no peaks, one sample each

wire::Json RowOf(const FleetSample& s) {
  return {s.unix_ms,      s.gpus,         s.allocated_milli,      s.busy_milli,
          s.pending_jobs, s.running_jobs, s.peak_allocated_milli, s.peak_busy_milli,
          s.samples};
}

Result<FleetSample> SampleOfRow(const wire::Json& row, std::string_view series, size_t index) {
  if (!row.is_array() || (row.size() != kRowFields && row.size() != kOldRowFields) ||
      !std::all_of(row.begin(), row.end(),
                   [](const wire::Json& v) { return v.is_number_integer(); })) {
    return InvalidArgumentError(fmt::format("fleet history: {}[{}] is not {} (or {}) integers: {}",
                                            series, index, kRowFields, kOldRowFields, row.dump()));
  }
  FleetSample sample{.unix_ms = row[0].get<int64_t>(),
                     .gpus = row[1].get<int64_t>(),
                     .allocated_milli = row[2].get<int64_t>(),
                     .busy_milli = row[3].get<int64_t>(),
                     .pending_jobs = row[4].get<int64_t>(),
                     .running_jobs = row[5].get<int64_t>()};
  if (row.size() == kOldRowFields) {
    return TakenSample(sample);
  }
  sample.peak_allocated_milli = row[6].get<int64_t>();
  sample.peak_busy_milli = row[7].get<int64_t>();
  sample.samples = row[8].get<int64_t>();
  if (sample.samples < 1) {
    return InvalidArgumentError(fmt::format(
        "fleet history: {}[{}] stands for {} samples (at least 1)", series, index, sample.samples));
  }
  return sample;
}

// One row for `rows`: when the first began, each figure's mean weighted by the samples a row
// stands for, and the largest peaks.
FleetSample Merge(std::deque<FleetSample>::const_iterator first,
                  std::deque<FleetSample>::const_iterator last) {
  FleetSample merged{.unix_ms = first->unix_ms, .samples = 0};
  FleetSample sums{};
  for (auto it = first; it != last; ++it) {
    merged.samples += it->samples;
    sums.gpus += it->gpus * it->samples;
    sums.allocated_milli += it->allocated_milli * it->samples;
    sums.busy_milli += it->busy_milli * it->samples;
    sums.pending_jobs += it->pending_jobs * it->samples;
    sums.running_jobs += it->running_jobs * it->samples;
    merged.peak_allocated_milli = std::max(merged.peak_allocated_milli, it->peak_allocated_milli);
    merged.peak_busy_milli = std::max(merged.peak_busy_milli, it->peak_busy_milli);
  }
  const auto mean = [&](int64_t sum) { return (sum + merged.samples / 2) / merged.samples; };
  merged.gpus = mean(sums.gpus);
  merged.allocated_milli = mean(sums.allocated_milli);
  merged.busy_milli = mean(sums.busy_milli);
  merged.pending_jobs = mean(sums.pending_jobs);
  merged.running_jobs = mean(sums.running_jobs);
  return merged;
}

}  // namespace

FleetHistory::FleetHistory(size_t capacity, size_t coarse_capacity)
    : capacity_(std::max<size_t>(1, capacity)), coarse_capacity_(coarse_capacity) {}

void FleetHistory::Add(const FleetSample& sample) {
  while (!samples_.empty() && samples_.back().unix_ms >= sample.unix_ms) {
    samples_.pop_back();
  }
  while (samples_.empty() && !coarse_.empty() && coarse_.back().unix_ms >= sample.unix_ms) {
    coarse_.pop_back();
  }
  samples_.push_back(sample.samples == 1 ? TakenSample(sample) : sample);
  FoldOldest();
}

void FleetHistory::FoldOldest() {
  if (coarse_capacity_ == 0) {
    while (samples_.size() > capacity_) {
      samples_.pop_front();
    }
    return;
  }
  while (samples_.size() >= capacity_ + kCoarseEvery) {
    const auto last = samples_.begin() + static_cast<std::ptrdiff_t>(kCoarseEvery);
    coarse_.push_back(Merge(samples_.begin(), last));
    samples_.erase(samples_.begin(), last);
  }
  while (coarse_.size() > coarse_capacity_) {
    coarse_.pop_front();
  }
}

std::vector<FleetSample> FleetHistory::Since(int64_t unix_ms) const {
  std::vector<FleetSample> out;
  // A coarse row ends where the next row begins.
  for (size_t i = 0; i < coarse_.size(); ++i) {
    const int64_t end = i + 1 < coarse_.size() ? coarse_[i + 1].unix_ms
                        : samples_.empty()     ? coarse_[i].unix_ms
                                               : samples_.front().unix_ms;
    if (end >= unix_ms) {
      out.push_back(coarse_[i]);
    }
  }
  const auto first =
      std::lower_bound(samples_.begin(), samples_.end(), unix_ms,
                       [](const FleetSample& sample, int64_t t) { return sample.unix_ms < t; });
  out.insert(out.end(), first, samples_.end());
  return out;
}

std::string FleetHistory::ToDocument() const {
  wire::Json rows = wire::Json::array();
  for (const FleetSample& s : samples_) {
    rows.push_back(RowOf(s));
  }
  wire::Json coarse = wire::Json::array();
  for (const FleetSample& s : coarse_) {
    coarse.push_back(RowOf(s));
  }
  return wire::Json{{"coarse", std::move(coarse)}, {"samples", std::move(rows)}}.dump();
}

Result<FleetHistory> FleetHistory::FromDocument(std::string_view document, size_t capacity,
                                                size_t coarse_capacity) {
  const wire::Json doc = wire::ParseDocument(document);
  if (!doc.is_object() || !doc.contains("samples") || !doc["samples"].is_array() ||
      (doc.contains("coarse") && !doc["coarse"].is_array())) {
    return InvalidArgumentError(
        "fleet history: not an object with a \"samples\" array (and a \"coarse\" one)");
  }
  FleetHistory history(capacity, coarse_capacity);
  if (doc.contains("coarse")) {
    const wire::Json& rows = doc["coarse"];
    for (size_t i = 0; i < rows.size(); ++i) {
      GPUFLEET_ASSIGN_OR_RETURN(const FleetSample row, SampleOfRow(rows[i], "coarse", i));
      if (coarse_capacity > 0 &&
          (history.coarse_.empty() || history.coarse_.back().unix_ms < row.unix_ms)) {
        history.coarse_.push_back(row);
      }
    }
    history.FoldOldest();
  }
  const wire::Json& rows = doc["samples"];
  for (size_t i = 0; i < rows.size(); ++i) {
    GPUFLEET_ASSIGN_OR_RETURN(const FleetSample row, SampleOfRow(rows[i], "samples", i));
    history.Add(row);
  }
  return history;
}

wire::Json FleetHistory::SamplesToJson(const std::vector<FleetSample>& samples) {
  wire::Json items = wire::Json::array();
  for (const FleetSample& s : samples) {
    items.push_back({{"at", FormatRfc3339(s.unix_ms * 1000000)},
                     {"unix_ms", s.unix_ms},
                     {"gpus", s.gpus},
                     {"allocated_milli", s.allocated_milli},
                     {"busy_milli", s.busy_milli},
                     {"pending_jobs", s.pending_jobs},
                     {"running_jobs", s.running_jobs},
                     {"peak_allocated_milli", s.peak_allocated_milli},
                     {"peak_busy_milli", s.peak_busy_milli},
                     {"samples", s.samples}});
  }
  return items;
}

}  // namespace gpufleet::api
