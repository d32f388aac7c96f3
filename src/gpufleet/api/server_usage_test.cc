// SPDX-License-Identifier: Apache-2.0
// GET /v1/usage through ApiServer (server_usage.cc) on a fake clock: one agent node of 8
// H100-80GB whose heartbeats carry GPU utilization, jobs of two teams placed, run, cancelled and
// preempted minute by minute, and the ledger read back exactly, also by a restarted server.
#include <chrono>
#include <memory>
#include <string>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/agent_node_fixture.h"
#include "gpufleet/api/testing/api_request.h"
#include "gpufleet/control/usage_ledger.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

// `name` asking for `gpus` (YAML of resources.gpus) for one task.
std::string UsageJobYaml(const std::string& name, const std::string& gpus, int priority = 0) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  priority: {}
  tasks:
    - name: main
      command: [sleep, infinity]
      resources: {{cpu: "4", memory: 16Gi, gpus: {}}}
)",
                     name, priority, gpus);
}

constexpr double kMinute = 1.0 / 60;  // GPU-hours of one GPU for one minute

class ServerUsageTest : public api_testing::AgentNodeServerTest {
 protected:
  // GET /v1/usage with the query given whole ("from=...&to=...").
  ApiResponse Usage(const std::string& token, const std::string& query,
                    ApiServer* server = nullptr) {
    return api_testing::HandleRequest(server != nullptr ? *server : *server_, "GET",
                                      "/v1/usage?" + query, token);
  }

  Json UsageJson(const std::string& token, const std::string& query) {
    const ApiResponse response = Usage(token, query);
    EXPECT_EQ(response.status, 200) << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  Json Job(const std::string& name) {
    return Json::parse(Call("GET", "/v1/jobs/" + name, admin_).body, nullptr, false);
  }

  void Submit(const std::string& token, const std::string& yaml) {
    const ApiResponse response = Call("POST", "/v1/jobs", token, yaml);
    ASSERT_EQ(response.status, 201) << response.body;
  }

  static const Json* Row(const Json& report, const std::string& key) {
    for (const Json& row : report["rows"]) {
      if (row["key"] == key) {
        return &row;
      }
    }
    return nullptr;
  }
};

constexpr const char* kFirstHour = "from=1970-01-01T00:00:00Z&to=1970-01-01T01:00:00Z";

// The scripted timeline (minutes from 00:00; heartbeats at each minute, then a cycle):
//   00:00 team-a submits train (2 GPUs), team-b submits nb (a 250-milli share)
//   00:01 both placed (their runs start); 00:02 tasks handed out; 00:03 first reported running
//   all GPUs at 50 % utilization
//   00:10 train cancelled: Stopping, its tasks still reported at 00:11, gone at 00:12
//   00:20 the ledger over 00:00-01:00: train 2 x 11 GPU-min, nb (still going) 1/4 x 19 GPU-min
TEST_F(ServerUsageTest, ExactGpuHoursOfSharesAndStoppedRunsSurviveARestart) {
  StartServer();
  Submit(alice_, UsageJobYaml("train", "{count: 2}"));
  Submit(bob_, UsageJobYaml("nb", "{milli: 250}"));
  Minutes(10, 50);  // 00:10
  ASSERT_EQ(Job("team-a/train")["state"], "Running");
  ASSERT_EQ(Job("team-b/nb")["state"], "Running");
  ASSERT_EQ(Call("POST", "/v1/jobs/team-a/train/cancel", alice_).status, 200);
  Minute(50);  // 00:11 still reported
  EXPECT_EQ(Job("team-a/train")["state"], "Stopping");
  Minute(50);  // 00:12 gone: the run ends now, not at the cancel
  EXPECT_EQ(Job("team-a/train")["state"], "Cancelled");
  // Busy time costs no store write per heartbeat: nb's document is written by the flush (every
  // 5 minutes: 00:15, 00:20) and not by the heartbeats between.
  const auto nb_version = [&] {
    const Result<store::StoredObject> stored = store_.Get("jobs", "team-b/nb");
    return stored.ok() ? stored->version : -1;
  };
  Minutes(2, 50);  // 00:14
  const int64_t before_flush = nb_version();
  Minute(50);  // 00:15: the flush
  EXPECT_EQ(nb_version(), before_flush + 1);
  Minutes(4, 50);  // 00:19
  EXPECT_EQ(nb_version(), before_flush + 1);
  Minute(50);  // 00:20

  const Json report = UsageJson(admin_, kFirstHour);
  EXPECT_EQ(report["from"], "1970-01-01T00:00:00Z");
  EXPECT_EQ(report["to"], "1970-01-01T01:00:00Z");
  EXPECT_EQ(report["by"], "team");
  ASSERT_EQ(report["rows"].size(), 2u) << report.dump();
  const Json* a = Row(report, "team-a");
  const Json* b = Row(report, "team-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_NEAR((*a)["allocatedGpuHours"].get<double>(), 2 * 11 * kMinute, 1e-6);
  EXPECT_NEAR((*b)["allocatedGpuHours"].get<double>(), 0.25 * 19 * kMinute, 1e-6);
  // Busy: 50 % of each GPU from the first heartbeat with the tasks running (00:03, crediting the
  // minute before it) to the last before the run ended (00:11): 9 minutes.
  EXPECT_NEAR((*a)["busyGpuHours"].get<double>(), 2 * 0.5 * 9 * kMinute, 1e-6);
  EXPECT_NEAR((*a)["idleGpuHours"].get<double>(), 2 * 11 * kMinute - 2 * 0.5 * 9 * kMinute, 1e-6);
  // nb: 00:03 to 00:20, 18 heartbeats.
  EXPECT_NEAR((*b)["busyGpuHours"].get<double>(), 0.25 * 0.5 * 18 * kMinute, 1e-6);
  EXPECT_EQ((*a)["models"][0]["model"], "H100-80GB");
  // The fleet's 8 GPUs exist from 00:00 until now (00:20), not for the hour asked about.
  EXPECT_NEAR(report["unallocatedGpuHours"].get<double>(),
              8 * 20 * kMinute - 22 * kMinute - 0.25 * 19 * kMinute, 1e-6);

  // The ended run is a stored record; the busy time of the run going was written by the flush
  // (every 5 minutes).
  EXPECT_OK(store_.Get(std::string(control::kUsageKind), "team-a/train/1").status());
  EXPECT_GT(Job("team-b/nb")["usage_run"]["busy"].get<int64_t>(), 0);

  // A server started again on the same store gives the ended run the same hours.
  Result<std::unique_ptr<ApiServer>> again =
      ApiServer::Create({.store = store_,
                         .catalog = catalog_,
                         .clock = clock_,
                         .wall_clock = &clock_,
                         .node_timeout = std::chrono::minutes(10)});
  ASSERT_OK(again);
  const ApiResponse restarted = Usage(admin_, kFirstHour, again->get());
  ASSERT_EQ(restarted.status, 200) << restarted.body;
  const Json restarted_report = Json::parse(restarted.body);
  const Json* a2 = Row(restarted_report, "team-a");
  ASSERT_NE(a2, nullptr);
  EXPECT_EQ(*a2, *a);
}

// The job page's elapsed time and measured busy %: GET /v1/jobs/NAME's "progress" while it holds
// GPUs, from the same stamp and busy credits as the ledger; none once it ended.
TEST_F(ServerUsageTest, ARunningJobSaysHowLongItRanAndHowBusyItKeptItsGpus) {
  StartServer();
  Submit(alice_, UsageJobYaml("train", "{count: 2}"));
  EXPECT_FALSE(Job("team-a/train").contains("progress"));  // pending: no run yet
  Minutes(10, 50);                                         // 00:10
  const Json running = Job("team-a/train");
  ASSERT_EQ(running["state"], "Running");
  ASSERT_TRUE(running.contains("progress")) << running.dump();
  // Placed at 00:01; busy at 50 % from the heartbeat of 00:03 (crediting the minute before)
  // to 00:10: 8 of its 9 minutes.
  EXPECT_EQ(running["progress"]["elapsed_s"], 9 * 60);
  EXPECT_NEAR(running["progress"]["busy_pct"].get<double>(), 50.0 * 8 / 9, 0.01);
  ASSERT_EQ(Call("POST", "/v1/jobs/team-a/train/cancel", alice_).status, 200);
  Minutes(2, 50);
  ASSERT_EQ(Job("team-a/train")["state"], "Cancelled");
  EXPECT_FALSE(Job("team-a/train").contains("progress"));
}

TEST_F(ServerUsageTest, AMemberSeesItsTeamOnlyAndNoFleetTotals) {
  StartServer();
  Submit(alice_, UsageJobYaml("train", "{count: 1}"));
  Submit(bob_, UsageJobYaml("other", "{count: 1}"));
  Minutes(4, 100);
  const Json mine = UsageJson(alice_, std::string(kFirstHour) + "&by=user");
  ASSERT_EQ(mine["rows"].size(), 1u) << mine.dump();
  EXPECT_EQ(mine["rows"][0]["key"], "alice");
  EXPECT_EQ(mine["by"], "user");
  EXPECT_TRUE(mine["unallocatedGpuHours"].is_null());
  const Json all = UsageJson(admin_, std::string(kFirstHour) + "&by=queue");
  ASSERT_EQ(all["rows"].size(), 1u);  // both in the default queue
  EXPECT_EQ(all["rows"][0]["key"], "default");
  EXPECT_NEAR(all["rows"][0]["allocatedGpuHours"].get<double>(), 2 * 3 * kMinute, 1e-6);
  EXPECT_TRUE(all["unallocatedGpuHours"].is_number());
}

TEST_F(ServerUsageTest, AServerGivenPricesAnswersTheCostOfEachRow) {
  StartServer();
  Submit(alice_, UsageJobYaml("train", "{count: 2}"));
  Minutes(10, 50);
  EXPECT_FALSE(UsageJson(admin_, kFirstHour)["rows"][0].contains("cost")) << "no prices: no cost";
  wire::PriceTable prices;
  prices.micros_per_gpu_hour = {{"H100-80GB", 2'500'000}};
  Result<std::unique_ptr<ApiServer>> priced =
      ApiServer::Create({.store = store_,
                         .catalog = catalog_,
                         .clock = clock_,
                         .wall_clock = &clock_,
                         .node_timeout = std::chrono::minutes(10),
                         .usage_prices = prices});
  ASSERT_OK(priced);
  const ApiResponse response = Usage(admin_, kFirstHour, priced->get());
  ASSERT_EQ(response.status, 200) << response.body;
  const Json report = wire::ParseDocument(response.body);
  const Json* a = Row(report, "team-a");
  ASSERT_NE(a, nullptr) << report.dump();
  EXPECT_NEAR((*a)["cost"].get<double>(), 2.5 * (*a)["allocatedGpuHours"].get<double>(), 1e-9);
  EXPECT_GT((*a)["cost"].get<double>(), 0);
  EXPECT_NEAR((*a)["models"][0]["cost"].get<double>(), (*a)["cost"].get<double>(), 1e-9);
}

TEST_F(ServerUsageTest, BadQueriesAre400NamingTheFieldAndAgentsAreRefused) {
  StartServer();
  struct Case {
    std::string query;
    std::string message;
  };
  for (const Case& c : {
           Case{"to=1970-01-01T01:00:00Z", "from: missing"},
           Case{"from=monday&to=1970-01-01T01:00:00Z", "from: \"monday\""},
           Case{"from=1970-01-01T00:00:00Z", "to: missing"},
           Case{"from=1970-01-01T02:00:00Z&to=1970-01-01T01:00:00Z", "is not after"},
           Case{std::string(kFirstHour) + "&by=<script>", "by: \"<script>\""},
       }) {
    SCOPED_TRACE(c.query);
    const ApiResponse response = Usage(admin_, c.query);
    EXPECT_EQ(response.status, 400);
    const std::string escaped = Json(c.message).dump();  // as the JSON body carries it
    EXPECT_THAT(response.body, HasSubstr(escaped.substr(1, escaped.size() - 2)));
  }
  EXPECT_EQ(Usage(agent_, kFirstHour).status, 403);
  EXPECT_EQ(Usage("wrong", kFirstHour).status, 401);
}

}  // namespace
}  // namespace gpufleet::api
