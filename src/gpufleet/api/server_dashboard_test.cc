// SPDX-License-Identifier: Apache-2.0
// The dashboard's routes (server_dashboard.cc): its embedded files without a token, the fleet
// history the loop records and keeps in the store, the GPUs' utilization and /v1/whoami; the
// headers every answer carries for browsers, and the times of a job's events.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/event_time_store.h"
#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/agent_node_fixture.h"
#include "gpufleet/api/testing/job_spec_json.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::AllOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

// node-a (8 H100s) heartbeating every minute; the server samples the fleet every minute.
class DashboardTest : public api_testing::AgentNodeServerTest {
 protected:
  void SetUp() override {
    clock_.Advance(std::chrono::seconds(1796288177));  // 2026-12-03T08:56:17Z
    StartServer();
  }

  Json History(const std::string& query = "") {
    const ApiResponse response = Call("GET", "/v1/history" + query, alice_);
    EXPECT_EQ(response.status, 200) << response.body;
    return Json::parse(response.body, nullptr, false);
  }
};

TEST_F(DashboardTest, ServesThePageAndItsAssetsWithoutAToken) {
  const ApiResponse page = Call("GET", "/", "");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_THAT(page.body, HasSubstr("<script src=\"/assets/app.js\"></script>"));
  const ApiResponse script = Call("GET", "/assets/app.js", "");
  EXPECT_EQ(script.status, 200);
  EXPECT_EQ(script.content_type, "text/javascript; charset=utf-8");
  EXPECT_THAT(script.body, HasSubstr("sessionStorage"));
  // The chart library is bundled from web/node_modules at build time.
  const ApiResponse chart = Call("GET", "/assets/uPlot.iife.min.js", "");
  EXPECT_EQ(chart.status, 200);
  EXPECT_THAT(chart.body, HasSubstr("uPlot"));
  EXPECT_EQ(Call("GET", "/assets/uPlot.min.css", "").content_type, "text/css; charset=utf-8");
  // No file but the embedded ones, and no data without a token.
  EXPECT_EQ(Call("GET", "/assets/../CMakeLists.txt", "").status, 404);
  EXPECT_EQ(Call("GET", "/assets/missing.js", "").status, 404);
  EXPECT_EQ(Call("POST", "/", "").status, 404);
  EXPECT_EQ(Call("GET", "/v1/history", "").status, 401);
  EXPECT_EQ(Call("GET", "/v1/utilization", "").status, 401);
  EXPECT_EQ(Call("GET", "/v1/whoami", "wrong").status, 401);
  EXPECT_EQ(Call("GET", "/v1/history", agent_).status, 403);
}

TEST_F(DashboardTest, EveryAnswerCarriesTheBrowserSecurityHeaders) {
  const std::tuple<std::string, std::string, int> calls[] = {
      {"/", "", 200},
      {"/assets/app.js", "", 200},
      {"/v1/jobs", alice_, 200},
      {"/v1/whoami", "wrong", 401},
      {"/v1/jobs/nope", alice_, 404},
  };
  for (const auto& [path, token, status] : calls) {
    SCOPED_TRACE(path);
    const ApiResponse response = Call("GET", path, token);
    EXPECT_EQ(response.status, status);
    std::map<std::string, std::string> headers(response.headers.begin(), response.headers.end());
    EXPECT_THAT(headers["Content-Security-Policy"],
                AllOf(HasSubstr("default-src 'self';"), HasSubstr("script-src 'self';"),
                      HasSubstr("object-src 'none';"), HasSubstr("frame-ancestors 'none'"),
                      Not(HasSubstr("unsafe-"))));
    EXPECT_EQ(headers["X-Content-Type-Options"], "nosniff");
    EXPECT_EQ(headers["X-Frame-Options"], "DENY");
    EXPECT_EQ(headers["Referrer-Policy"], "no-referrer");
    EXPECT_EQ(headers["Cache-Control"], "no-store");
  }
  // The page lives within the policy: no inline script, style or event handler.
  const std::string page = Call("GET", "/", "").body;
  EXPECT_THAT(page, Not(ContainsRegex("<script>|<script [^s]|<style| style=| on[a-z]+=")));
  EXPECT_THAT(page, HasSubstr("<meta name=\"referrer\" content=\"no-referrer\">"));
}

TEST_F(DashboardTest, WhoAmINamesTheRoleAndTeam) {
  EXPECT_EQ(Json::parse(Call("GET", "/v1/whoami", alice_).body),
            (Json{{"role", "member"}, {"team", "team-a"}, {"name", "alice"}}));
  EXPECT_EQ(Json::parse(Call("GET", "/v1/whoami", admin_).body)["role"], "admin");
}

TEST_F(DashboardTest, TheLoopSamplesAllocationAndMeasuredUtilizationEveryInterval) {
  ASSERT_EQ(Call("POST", "/v1/jobs", alice_, api_testing::OneTaskJobJson("train", 2)).status, 201);
  Minute(50);  // the job is placed; every GPU reports 50 %
  Minute(50);
  Json history = History();
  ASSERT_GE(history["items"].size(), 2u) << history.dump();
  const Json& last = history["items"].back();
  EXPECT_EQ(last["at"], "2026-12-03T08:58:17Z");
  EXPECT_EQ(last["gpus"], 8);
  EXPECT_EQ(last["allocated_milli"], 2000);
  EXPECT_EQ(last["busy_milli"], 4000);  // 8 GPUs at 50 %
  EXPECT_EQ(last["running_jobs"], 1);
  EXPECT_EQ(history["interval_s"], 60.0);
  EXPECT_EQ(history["capacity"], 1440);
  const size_t samples = history["items"].size();
  // Within the interval no new sample is taken.
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(History()["items"].size(), samples);
  EXPECT_EQ(History("?since=2026-12-03T08:58:17Z")["items"].size(), 1u);
  const ApiResponse bad = Call("GET", "/v1/history?since=yesterday", alice_);
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("since: \\\"yesterday\\\" is not an RFC 3339 time"));

  const Json utilization = Json::parse(Call("GET", "/v1/utilization", alice_).body);
  ASSERT_EQ(utilization["items"].size(), 8u);
  EXPECT_EQ(utilization["items"][3],
            (Json{{"node", "node-a"}, {"gpu", 3}, {"utilization_pct", 50}}));
}

TEST_F(DashboardTest, HistorySurvivesARestartOnTheSameStore) {
  Minutes(2, 10);
  const size_t samples = History()["items"].size();
  ASSERT_GE(samples, 2u);
  server_->Stop();
  Result<std::unique_ptr<ApiServer>> again = ApiServer::Create(
      {.store = store_, .catalog = catalog_, .clock = clock_, .wall_clock = &clock_});
  ASSERT_OK(again);
  server_ = std::move(again).value();
  // Before its first sample the new server answers from the store; then it continues the series.
  EXPECT_EQ(History()["items"].size(), samples);
  clock_.Advance(std::chrono::minutes(1));
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(History()["items"].size(), samples + 1);
}

TEST_F(DashboardTest, AnUnreadableStoredHistoryStartsANewSeries) {
  server_->Stop();
  // The first server's sample is in the store; it is overwritten with a document of no series.
  Result<store::StoredObject> stored = store_.Get("history", "fleet");
  ASSERT_OK(stored);
  store::WriteBatch batch;
  batch.Update("history", "fleet", R"({"samples": "garbage"})", stored->version);
  ASSERT_OK(store_.Commit(batch));
  Result<std::unique_ptr<ApiServer>> again = ApiServer::Create(
      {.store = store_, .catalog = catalog_, .clock = clock_, .wall_clock = &clock_});
  ASSERT_OK(again);
  server_ = std::move(again).value();
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(History()["items"].size(), 1u);
  clock_.Advance(std::chrono::minutes(1));
  ASSERT_OK(server_->RunSchedulingCycle());  // the loop goes on, and so does the series
  EXPECT_EQ(History()["items"].size(), 2u);
}

TEST_F(DashboardTest, AJobsTimelineSaysWhenEachEventHappened) {
  // An event written by a server whose store stamps no time has none.
  ASSERT_EQ(Call("POST", "/v1/jobs", alice_, api_testing::OneTaskJobJson("old", 1)).status, 201);
  server_->Stop();
  EventTimeStore timed(store_, clock_);
  struct StopFirst {  // the server goes before the store it writes to
    std::unique_ptr<ApiServer>& server;
    ~StopFirst() { server.reset(); }
  } stop_first{server_};
  Result<std::unique_ptr<ApiServer>> again = ApiServer::Create(
      {.store = timed, .catalog = catalog_, .clock = clock_, .wall_clock = &clock_});
  ASSERT_OK(again);
  server_ = std::move(again).value();
  ASSERT_EQ(Call("POST", "/v1/jobs", alice_, api_testing::OneTaskJobJson("train", 2)).status, 201);
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_OK(server_->RunSchedulingCycle());  // placed on node-a

  const ApiResponse response = Call("GET", "/v1/jobs/train/events", alice_);
  ASSERT_EQ(response.status, 200) << response.body;
  const Json events = wire::ParseDocument(response.body)["items"];
  ASSERT_GE(events.size(), 2u) << events.dump();
  EXPECT_EQ(events[0]["at"], "2026-12-03T08:56:17Z");
  EXPECT_EQ(events[0]["message"], "submitted by alice to queue default");
  EXPECT_EQ(events.back()["at"], "2026-12-03T08:56:47Z") << events.dump();
  EXPECT_THAT(events.back()["message"].get<std::string>(), Not(HasSubstr("@")));
  const Json old = Json::parse(Call("GET", "/v1/jobs/old/events", alice_).body)["items"];
  ASSERT_FALSE(old.empty());
  EXPECT_FALSE(old[0].contains("at")) << old.dump();
  EXPECT_EQ(old[0]["message"], "submitted by alice to queue default");
}

}  // namespace
}  // namespace gpufleet::api
