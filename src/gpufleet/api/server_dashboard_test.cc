// SPDX-License-Identifier: Apache-2.0
// The dashboard's routes (server_dashboard.cc): its embedded files without a token, the fleet
// history the loop records and keeps in the store, the GPUs' utilization and /v1/whoami.
#include <chrono>
#include <memory>
#include <string>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/server.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet::api {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

std::string OneGpuJob(const std::string& name) {
  return Json{{"apiVersion", "gpufleet.io/v1"},
              {"kind", "Job"},
              {"metadata", {{"name", name}}},
              {"spec",
               {{"tasks",
                 {{{"name", "main"},
                   {"resources", {{"cpu", "1"}, {"memory", "1Gi"}, {"gpus", {{"count", 1}}}}}}}}}}}
      .dump();
}

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clock_.Advance(std::chrono::seconds(1796288177));  // 2026-12-03T08:56:17Z
    MakeServer();
    SyntheticClusterSpec spec;
    spec.blocks = 1;
    spec.leaves_per_block = 1;
    spec.nodes_per_leaf = 2;
    Result<Cluster> cluster = MakeSyntheticCluster(spec, catalog_);
    ASSERT_OK(cluster);
    ASSERT_OK(server_->RegisterNodes(*cluster));
    store::WriteBatch batch;
    batch.Create(std::string(control::kTeamsKind), "team-a",
                 control::TeamToJson({.name = "team-a"}).dump());
    ASSERT_OK(store_.Commit(batch));
    Result<std::string> admin =
        server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    ASSERT_OK(admin);
    admin_ = *admin;
    Result<std::string> alice =
        server_->authenticator().CreateToken(control::Role::kMember, "team-a", "alice");
    ASSERT_OK(alice);
    alice_ = *alice;
  }

  void MakeServer() {
    Result<std::unique_ptr<ApiServer>> server =
        ApiServer::Create({.store = store_,
                           .catalog = catalog_,
                           .clock = clock_,
                           .wall_clock = &clock_,
                           .history_interval = std::chrono::seconds(60),
                           .history_capacity = 3});
    ASSERT_OK(server);
    server_ = std::move(server).value();
  }

  ApiResponse Call(const std::string& method, const std::string& path, const std::string& token,
                   const std::string& body = "") {
    ApiRequest request;
    request.method = method;
    const size_t question = path.find('?');
    request.path = path.substr(0, question);
    if (question != std::string::npos) {
      const std::string query = path.substr(question + 1);
      const size_t equals = query.find('=');
      request.query.emplace(query.substr(0, equals), query.substr(equals + 1));
    }
    if (!token.empty()) {
      request.authorization = "Bearer " + token;
    }
    request.body = body;
    return server_->Handle(request);
  }

  Json History(const std::string& query = "") {
    const ApiResponse response = Call("GET", "/v1/history" + query, alice_);
    EXPECT_EQ(response.status, 200) << response.body;
    return Json::parse(response.body, nullptr, false);
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<ApiServer> server_;
  std::string admin_;
  std::string alice_;
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
  // Nothing else is served without a token, and no file outside the embedded ones.
  EXPECT_EQ(Call("GET", "/assets/../CMakeLists.txt", "").status, 404);
  EXPECT_EQ(Call("GET", "/assets/missing.js", "").status, 404);
  EXPECT_EQ(Call("POST", "/", "").status, 404);
  EXPECT_EQ(Call("GET", "/v1/history", "").status, 401);
  EXPECT_EQ(Call("GET", "/v1/utilization", "").status, 401);
  EXPECT_EQ(Call("GET", "/v1/whoami", "wrong").status, 401);
}

TEST_F(DashboardTest, WhoAmINamesTheRoleAndTeam) {
  EXPECT_EQ(Json::parse(Call("GET", "/v1/whoami", alice_).body),
            (Json{{"role", "member"}, {"team", "team-a"}, {"name", "alice"}}));
  EXPECT_EQ(Json::parse(Call("GET", "/v1/whoami", admin_).body)["role"], "admin");
}

TEST_F(DashboardTest, TheLoopSamplesTheFleetEveryIntervalAndKeepsTheLastCapacity) {
  ASSERT_EQ(Call("POST", "/v1/jobs", alice_, OneGpuJob("train")).status, 201);
  ASSERT_OK(server_->RunSchedulingCycle());
  Json history = History();
  ASSERT_EQ(history["items"].size(), 1u) << history.dump();
  const Json& first = history["items"][0];
  EXPECT_EQ(first["at"], "2026-12-03T08:56:17Z");
  EXPECT_EQ(first["gpus"], 16);
  EXPECT_EQ(first["allocated_milli"], 1000);
  EXPECT_EQ(first["running_jobs"], 1);
  EXPECT_EQ(first["pending_jobs"], 0);
  EXPECT_EQ(history["interval_s"], 60.0);
  EXPECT_EQ(history["capacity"], 3);

  // Within the interval: no new sample.
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(History()["items"].size(), 1u);
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(std::chrono::seconds(60));
    ASSERT_OK(server_->RunSchedulingCycle());
  }
  history = History();
  ASSERT_EQ(history["items"].size(), 3u);
  EXPECT_EQ(history["items"][0]["at"], "2026-12-03T08:58:47Z");  // 08:56:17, 08:57:47 dropped
  EXPECT_EQ(History("?since=2026-12-03T08:59:47Z")["items"].size(), 2u);
  const ApiResponse bad = Call("GET", "/v1/history?since=yesterday", alice_);
  EXPECT_EQ(bad.status, 400);
  EXPECT_THAT(bad.body, HasSubstr("since: \\\"yesterday\\\" is not an RFC 3339 time"));
}

TEST_F(DashboardTest, HistorySurvivesARestartOnTheSameStore) {
  ASSERT_OK(server_->RunSchedulingCycle());
  clock_.Advance(std::chrono::seconds(60));
  ASSERT_OK(server_->RunSchedulingCycle());
  ASSERT_EQ(History()["items"].size(), 2u);
  server_->Stop();
  MakeServer();
  // Before the new server's first sample it answers from the store; after, it continues.
  EXPECT_EQ(History()["items"].size(), 2u);
  clock_.Advance(std::chrono::seconds(60));
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(History()["items"].size(), 3u);
}

TEST_F(DashboardTest, AnUnreadableStoredHistoryStartsANewSeries) {
  store::WriteBatch batch;
  batch.Create("history", "fleet", R"({"samples": "garbage"})");
  ASSERT_OK(store_.Commit(batch));
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(History()["items"].size(), 1u);
  ASSERT_OK(server_->RunSchedulingCycle());  // the loop goes on
}

TEST_F(DashboardTest, UtilizationIsEmptyWithoutAgentReports) {
  const ApiResponse response = Call("GET", "/v1/utilization", alice_);
  EXPECT_EQ(response.status, 200);
  EXPECT_EQ(Json::parse(response.body), (Json{{"items", Json::array()}}));
}

}  // namespace
}  // namespace gpufleet::api
