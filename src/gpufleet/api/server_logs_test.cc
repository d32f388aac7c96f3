// SPDX-License-Identifier: Apache-2.0
// GET /v1/jobs/NAME/logs and POST /v1/agents/NODE/logs through ApiServer (server_logs.cc,
// ControlPlane::RecordTaskLog): one agent node, jobs of two teams, and every hostile request the
// route and the agent's side of it can get.
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/testing/agent_node_fixture.h"
#include "gpufleet/api/testing/job_spec_json.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

using ::testing::HasSubstr;

class ServerLogsTest : public api_testing::AgentNodeServerTest {
 protected:
  // Submits `name` as `token`, lets node-a run its tasks and record their provenance.
  void SubmitAndRun(const std::string& token, const std::string& name) {
    const ApiResponse submitted =
        Call("POST", "/v1/jobs", token, api_testing::GangJobJson(name, 2, 1));
    ASSERT_EQ(submitted.status, 201) << submitted.body;
    Minutes(3, 50);  // placed, handed out, reported running
    for (const std::string& id : desired_) {
      wire::ProvenanceReport report;
      report.task_id = id;
      report.command = {"train"};
      const ApiResponse recorded = Call("POST", "/v1/agents/node-a/provenance", agent_,
                                        wire::ProvenanceReportToJson(report));
      ASSERT_EQ(recorded.status / 100, 2) << recorded.body;
    }
  }

  ApiResponse ShipLog(const std::string& task_id, const std::string& text, int64_t size,
                      const std::string& node = "node-a", bool final = false) {
    return Call("POST", fmt::format("/v1/agents/{}/logs", node), agent_,
                wire::TaskLogReportToJson(
                    {.task_id = task_id, .text = text, .size = size, .final = final}));
  }

  nlohmann::json Logs(const std::string& path, const std::string& token, int status = 200) {
    const ApiResponse response = Call("GET", path, token);
    EXPECT_EQ(response.status, status) << path << ": " << response.body;
    return wire::ParseDocument(response.body);
  }
};

TEST_F(ServerLogsTest, ATeamReadsTheTailsItsAgentShippedPerTask) {
  StartServer();
  SubmitAndRun(alice_, "train");
  // Runs recorded, nothing shipped yet: each task says why it has no text.
  const nlohmann::json before = Logs("/v1/jobs/train/logs", alice_);
  ASSERT_EQ(before["items"].size(), 2u) << before.dump();
  EXPECT_TRUE(before["items"][0]["text"].is_null());
  EXPECT_THAT(before["items"][0]["why"].get<std::string>(), HasSubstr("no log received yet"));

  ASSERT_EQ(ShipLog("team-a/train/main-0/1", "step 9\nloss 0.25\n", 4096).status, 200);
  const nlohmann::json logs = Logs("/v1/jobs/train/logs?task=main-0", alice_);
  EXPECT_EQ(logs["job"], "train");
  EXPECT_EQ(logs["state"], "Running");
  ASSERT_EQ(logs["items"].size(), 1u) << logs.dump();
  const nlohmann::json& main0 = logs["items"][0];
  EXPECT_EQ(main0["task"], "main-0");
  EXPECT_EQ(main0["attempt"], 1);
  EXPECT_EQ(main0["node"], "node-a");
  EXPECT_EQ(main0["text"], "step 9\nloss 0.25\n");
  EXPECT_EQ(main0["size"], 4096);
  EXPECT_EQ(main0["from"], 4096 - 17);
  EXPECT_EQ(main0["final"], false);
  // An admin reads it by TEAM/NAME.
  EXPECT_EQ(Logs("/v1/jobs/team-a/train/logs?task=main-0", admin_)["items"][0]["text"],
            "step 9\nloss 0.25\n");
}

TEST_F(ServerLogsTest, HostileReadersAndWritersAreRefused) {
  StartServer();
  SubmitAndRun(alice_, "train");
  ASSERT_EQ(ShipLog("team-a/train/main-0/1", "secret weights path\n", 20).status, 200);
  // Another team's job is not found, as GET /v1/jobs/NAME says (also by TEAM/NAME).
  const ApiResponse other = Call("GET", "/v1/jobs/team-a/train/logs", bob_);
  EXPECT_EQ(other.status, 404) << other.body;
  EXPECT_THAT(other.body, ::testing::Not(HasSubstr("secret")));
  EXPECT_EQ(Call("GET", "/v1/jobs/train/logs", bob_).status, 404);
  // Odd and oversized task names are 400 naming the field; a task the job lacks is 404 naming
  // the tasks it has.
  for (const std::string& odd :
       std::vector<std::string>{"..%2F..%2Fx", "main-0%2F1", "main%200", std::string(300, 'a')}) {
    const ApiResponse response = Call("GET", "/v1/jobs/train/logs?task=" + odd, alice_);
    EXPECT_EQ(response.status, 400) << odd << ": " << response.body;
    EXPECT_THAT(response.body, HasSubstr("task: "));
  }
  EXPECT_THAT(Logs("/v1/jobs/train/logs?task=main-7", alice_, 404).dump(),
              HasSubstr("its tasks: main-0, main-1"));
  // A job with no runs answers so, and a task of it is 404.
  ASSERT_EQ(Call("POST", "/v1/jobs", alice_, api_testing::GangJobJson("never-ran", 2, 1)).status,
            201);
  const nlohmann::json none = Logs("/v1/jobs/never-ran/logs", alice_);
  EXPECT_TRUE(none["items"].empty());
  EXPECT_THAT(none["why"].get<std::string>(), HasSubstr("no runs yet"));
  EXPECT_THAT(Logs("/v1/jobs/never-ran/logs?task=main-0", alice_, 404).dump(),
              HasSubstr("no runs yet"));
  // Only agents (and admins) ship logs; a member cannot plant one.
  EXPECT_EQ(Call("POST", "/v1/agents/node-a/logs", alice_,
                 wire::TaskLogReportToJson({.task_id = "team-a/train/main-0/1", .size = 0}))
                .status,
            403);
  // An agent ships only its own node's runs, and only runs that were recorded.
  EXPECT_EQ(ShipLog("team-a/train/main-0/1", "x", 1, "node-b").status, 403);
  EXPECT_EQ(ShipLog("team-b/other/main-0/1", "x", 1).status, 404);
  // A tail past the bound is refused, naming the field.
  const ApiResponse big =
      ShipLog("team-a/train/main-0/1", std::string(wire::kMaxTaskLogTailBytes + 1, 'x'), 1 << 20);
  EXPECT_EQ(big.status, 400);
  EXPECT_THAT(big.body, HasSubstr("text: "));
  // What was kept is the last good tail.
  EXPECT_EQ(Logs("/v1/jobs/train/logs?task=main-0", alice_)["items"][0]["text"],
            "secret weights path\n");
}

}  // namespace
}  // namespace gpufleet::api
