// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/fleet_sim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::fleetsim {
namespace {

using ::gpufleet::testing::StatusIs;

TEST(FleetSimTest, ASmallFleetFillsToItsLoad) {
  const SystemClock timer;
  Result<FleetSimResult> result = RunFleetSim({.nodes = 16,
                                               .gpus_per_node = 8,
                                               .nodes_per_leaf = 4,
                                               .duration = std::chrono::minutes(3),
                                               .warmup = std::chrono::minutes(1),
                                               .load = 0.8,
                                               .timer = &timer});
  ASSERT_OK(result);
  EXPECT_EQ(result->gpus, 128);
  EXPECT_GT(result->jobs_submitted, 10);
  EXPECT_GT(result->task_runs, 10);
  // Whole jobs arrive at 80 % of the fleet from the start: most of it is held at the end.
  EXPECT_GT(result->allocated_pct, 40);
  EXPECT_LE(result->allocated_pct, 100);
  // The first minute is left out of the figures.
  EXPECT_EQ(result->requests.at("cycle").count, 120);
  EXPECT_EQ(result->simulated_second.count, 120);
  EXPECT_GE(result->requests.at("heartbeat").count, 16 * 12);
  EXPECT_EQ(result->requests.count("register"), 0u);
  const nlohmann::json json = FleetSimResultJson(*result);
  EXPECT_EQ(json["nodes"], 16);
  EXPECT_TRUE(json["requests"]["heartbeat"].contains("p99_ms"));
}

TEST(FleetSimTest, RefusesABadLoad) {
  const SystemClock timer;
  EXPECT_THAT(RunFleetSim({.load = 0, .timer = &timer}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(RunFleetSim({}), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::fleetsim
