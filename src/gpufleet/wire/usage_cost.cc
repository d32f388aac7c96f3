// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/usage_cost.h"

#include <set>

namespace gpufleet::wire {
namespace {

using json = nlohmann::json;

// Millionths of the currency unit in one.
constexpr double kPriceMicrosPerUnit = 1'000'000;

}  // namespace

double Cost(double hours, int64_t micros_per_gpu_hour) {
  return hours * static_cast<double>(micros_per_gpu_hour) / kPriceMicrosPerUnit;
}

std::vector<std::string> AddCosts(json& report, const PriceTable& prices) {
  std::set<std::string> unpriced;
  if (!report.contains("rows") || !report["rows"].is_array()) {
    return {};
  }
  for (json& row : report["rows"]) {
    double total = 0;
    bool complete = row.contains("models") && row["models"].is_array();
    if (!complete) {
      row["cost"] = nullptr;
      continue;
    }
    for (json& model : row["models"]) {
      const std::string name = model.contains("model") && model["model"].is_string()
                                   ? model["model"].get<std::string>()
                                   : "";
      const auto price = prices.micros_per_gpu_hour.find(name);
      const json& hours = model.contains("allocatedGpuHours") ? model["allocatedGpuHours"] : json();
      if (price == prices.micros_per_gpu_hour.end() || !hours.is_number()) {
        unpriced.insert(name);
        model["cost"] = nullptr;
        complete = false;
        continue;
      }
      model["cost"] = Cost(hours.get<double>(), price->second);
      total += model["cost"].get<double>();
    }
    row["cost"] = complete ? json(total) : json();
  }
  return {unpriced.begin(), unpriced.end()};
}

}  // namespace gpufleet::wire
