// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/fleet_history.h"

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/core/rfc3339.h"

namespace gpufleet::api {

FleetHistory::FleetHistory(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}

void FleetHistory::Add(const FleetSample& sample) {
  while (!samples_.empty() && samples_.back().unix_ms >= sample.unix_ms) {
    samples_.pop_back();
  }
  samples_.push_back(sample);
  while (samples_.size() > capacity_) {
    samples_.pop_front();
  }
}

std::vector<FleetSample> FleetHistory::Since(int64_t unix_ms) const {
  const auto first =
      std::lower_bound(samples_.begin(), samples_.end(), unix_ms,
                       [](const FleetSample& sample, int64_t t) { return sample.unix_ms < t; });
  return std::vector<FleetSample>(first, samples_.end());
}

std::string FleetHistory::ToDocument() const {
  wire::Json rows = wire::Json::array();
  for (const FleetSample& s : samples_) {
    rows.push_back(
        {s.unix_ms, s.gpus, s.allocated_milli, s.busy_milli, s.pending_jobs, s.running_jobs});
  }
  return wire::Json{{"samples", std::move(rows)}}.dump();
}

Result<FleetHistory> FleetHistory::FromDocument(std::string_view document, size_t capacity) {
  const wire::Json doc = wire::ParseDocument(document);
  if (!doc.is_object() || !doc.contains("samples") || !doc["samples"].is_array()) {
    return InvalidArgumentError("fleet history: not an object with a \"samples\" array");
  }
  FleetHistory history(capacity);
  const wire::Json& rows = doc["samples"];
  for (size_t i = 0; i < rows.size(); ++i) {
    const wire::Json& row = rows[i];
    if (!row.is_array() || row.size() != 6 ||
        !std::all_of(row.begin(), row.end(),
                     [](const wire::Json& v) { return v.is_number_integer(); })) {
      return InvalidArgumentError(
          fmt::format("fleet history: samples[{}] is not 6 integers: {}", i, row.dump()));
    }
    history.Add({.unix_ms = row[0].get<int64_t>(),
                 .gpus = row[1].get<int64_t>(),
                 .allocated_milli = row[2].get<int64_t>(),
                 .busy_milli = row[3].get<int64_t>(),
                 .pending_jobs = row[4].get<int64_t>(),
                 .running_jobs = row[5].get<int64_t>()});
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
                     {"running_jobs", s.running_jobs}});
  }
  return items;
}

}  // namespace gpufleet::api
