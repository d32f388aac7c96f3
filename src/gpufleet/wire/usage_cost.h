// SPDX-License-Identifier: Apache-2.0
// The cost of a usage report (GET /v1/usage, docs/usage.md) from a price per GPU-hour of each GPU
// model: the server adds it to its answer when it was given prices (`gpufleet server --prices`),
// the CLI when it is (`gpufleet report usage --prices`).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace gpufleet::wire {

// Prices per GPU-hour by GPU model, in millionths of the currency unit (integers: no rounding
// drift; "2.49" is 2490000).
struct PriceTable {
  std::map<std::string, int64_t> micros_per_gpu_hour;  // by canonical model name
};

// The cost of `hours` GPU-hours at `micros_per_gpu_hour`, in the currency unit.
double Cost(double hours, int64_t micros_per_gpu_hour);

// Adds "cost" to each row of a /v1/usage answer and to each of its "models", from `prices`; a
// row with a model that has no price gets "cost": null and the model is named in the returned
// list (sorted, once each).
std::vector<std::string> AddCosts(nlohmann::json& report, const PriceTable& prices);

}  // namespace gpufleet::wire
