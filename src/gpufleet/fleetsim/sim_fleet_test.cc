// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/sim_fleet.h"

#include <chrono>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::fleetsim {
namespace {

using ::gpufleet::testing::StatusIs;

constexpr char kTwoHourJob[] =
    R"({"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {"name": "long"},
"spec": {"tasks": [{"name": "main", "command": ["train"],
"env": {"GPUFLEET_SIM_DURATION_MS": "7200000"}, "resources": {"gpus": {"count": 2}}}]}})";

std::string StateOfJob(SimFleet& fleet, const std::string& name) {
  Result<api::ApiResponse> answer = fleet.AdminRequest("GET", "/v1/jobs/" + name, "");
  if (!answer.ok() || answer->status != 200) {
    return "unreadable";
  }
  return wire::ParseDocument(answer->body).value("state", "");
}

TEST(SimFleetEventDrivenTest, MovesStraightToWhatIsDue) {
  FleetOptions options;
  options.nodes = 2;
  options.event_driven = true;
  options.heartbeat_interval = std::chrono::minutes(15);
  options.node_timeout = std::chrono::minutes(60);
  options.cycle_interval = std::chrono::minutes(5);
  Result<std::unique_ptr<SimFleet>> made = SimFleet::Create(options);
  ASSERT_OK(made);
  SimFleet& fleet = **made;
  // Registration: the agents and the server's first cycle, all at the start.
  while (fleet.NextDue() <= fleet.Now()) {
    ASSERT_OK(fleet.Advance(Duration(0)));
  }
  const MonoTime submitted = fleet.Now();
  ASSERT_OK(fleet.AdminRequest("POST", "/v1/jobs", kTwoHourJob));
  // The submission is news: the server cycles, the node it placed the job on fetches and starts
  // it and reports it running, all without the clock moving.
  EXPECT_EQ(fleet.NextDue(), submitted);
  while (fleet.NextDue() <= fleet.Now()) {
    ASSERT_OK(fleet.Advance(Duration(0)));
  }
  EXPECT_EQ(fleet.Now(), submitted);
  EXPECT_EQ(StateOfJob(fleet, "long"), "Running");
  // Two hours: the idle cycles every 5 minutes, the two agents' heartbeats every 15, and the
  // end, reported at the moment the task ends (not at the next heartbeat).
  int steps = 0;
  while (StateOfJob(fleet, "long") == "Running" && steps < 1000) {
    ASSERT_OK(fleet.Advance(fleet.NextDue() - fleet.Now()));
    ++steps;
  }
  EXPECT_EQ(StateOfJob(fleet, "long"), "Succeeded");
  EXPECT_EQ(fleet.Now(), submitted + std::chrono::hours(2));
  EXPECT_LE(steps, 2 * 60 / 5 + 2 * 4 + 2);
}

TEST(SimFleetEventDrivenTest, RefusesDriftAndSeveralServers) {
  FleetOptions options;
  options.event_driven = true;
  options.max_drift = 0.01;
  EXPECT_THAT(SimFleet::Create(options), StatusIs(StatusCode::kInvalidArgument));
  options.max_drift = 0;
  options.servers = 2;
  EXPECT_THAT(SimFleet::Create(options), StatusIs(StatusCode::kInvalidArgument));
}

TEST(SimFleetPerSecondTest, NextDueIsTheNextSecond) {
  Result<std::unique_ptr<SimFleet>> made = SimFleet::Create(FleetOptions{});
  ASSERT_OK(made);
  EXPECT_EQ((*made)->NextDue(), (*made)->Now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace gpufleet::fleetsim
