// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/usage_cost.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gpufleet/wire/json_fields.h"

namespace gpufleet::wire {
namespace {

constexpr char kUsageCostAnswer[] = R"({
  "from": "2026-12-01T00:00:00Z", "to": "2026-12-02T00:00:00Z", "by": "team",
  "rows": [
    {"key": "nlp", "allocatedGpuHours": 10.5,
     "models": [{"model": "H100-80GB", "allocatedGpuHours": 10.0},
                {"model": "A100-80GB", "allocatedGpuHours": 0.5}]},
    {"key": "cv", "allocatedGpuHours": 1.0,
     "models": [{"model": "T4", "allocatedGpuHours": 1.0}]}]
})";

TEST(UsageCost, CostIsHoursTimesThePrice) {
  EXPECT_DOUBLE_EQ(Cost(10.0, 2'490'000), 24.9);
  EXPECT_DOUBLE_EQ(Cost(0.5, 0), 0.0);
}

TEST(AddCosts, PricesEachModelAndLeavesUnpricedRowsWithout) {
  Json report = ParseDocument(kUsageCostAnswer);
  PriceTable prices;
  prices.micros_per_gpu_hour = {{"H100-80GB", 2'000'000}, {"A100-80GB", 1'000'000}};
  EXPECT_EQ(AddCosts(report, prices), std::vector<std::string>{"T4"});
  EXPECT_DOUBLE_EQ(report["rows"][0]["cost"].get<double>(), 20.5);
  EXPECT_DOUBLE_EQ(report["rows"][0]["models"][1]["cost"].get<double>(), 0.5);
  EXPECT_TRUE(report["rows"][1]["cost"].is_null());
  EXPECT_TRUE(report["rows"][1]["models"][0]["cost"].is_null());
}

}  // namespace
}  // namespace gpufleet::wire
