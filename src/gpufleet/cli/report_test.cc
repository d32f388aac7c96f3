// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/report.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/http/testing/fake_transport.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::cli {
namespace {

using ::gpufleet::http_testing::FakeClient;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kReport[] = R"({
  "window_hours": 720, "fleet": {"gpus": 12, "nodes": 3},
  "runs": 40, "failed_runs": 4, "unattributed_failed_runs": 1, "application_failed_runs": 2,
  "summary": "these 1 GPUs (8.33% of the fleet) were involved in 75.0% of failed jobs; quarantining them would have avoided 3 failures",
  "suspects": [{"rank": 1, "device": "gpu", "id": "GPU-bad", "node": "node-1", "gpu": 2,
                "leaf": "leaf-0", "runs": 4, "failures": 3, "named_failures": 3,
                "gpu_hours": 0.5, "expected": 0.00012, "rate_ratio": null,
                "p_value": 2.9e-13, "q_value": 3.5e-12, "flagged": true,
                "xids": {"79": 3}, "health_checks": {}, "quarantined": true}],
  "runners_up": [{"rank": 2, "device": "node", "id": "node-2", "node": "node-2",
                  "leaf": "leaf-0", "runs": 9, "failures": 1, "named_failures": 0,
                  "gpu_hours": 4.5, "expected": 0.2, "p_value": 0.18, "q_value": 0.5,
                  "flagged": false, "xids": {}, "quarantined": false}],
  "quarantines": [{"device": "gpu", "id": "GPU-bad", "node": "node-1", "gpu": 2,
                   "source": "attribution", "mode": "now", "actor": "attribution",
                   "reason": "3 failures (3 named it) in 4 runs, 0.5 GPU-h, expected 0.00012, p=2.9e-13, q=3.5e-12, XIDs 79x3"}]
})";

TEST(RenderFailureReport, RanksTheSuspectsWithTheirEvidence) {
  const std::string text = RenderFailureReport(nlohmann::json::parse(kReport), false);
  EXPECT_THAT(text, StartsWith("Fleet: 12 GPUs on 3 nodes; 40 runs in the last 720 h, 4 failed (1 "
                               "naming no device), 2 application errors\n"
                               "these 1 GPUs (8.33% of the fleet) were involved in 75.0% of failed "
                               "jobs; quarantining them would have avoided 3 failures\n"));
  EXPECT_THAT(text, HasSubstr("RANK   DEVICE        WHERE         LEAF     RUNS   FAILURES"));
  EXPECT_THAT(text, HasSubstr("1      gpu GPU-bad   node-1/gpu2   leaf-0   4      3          3"
                              "       0.50        0.00012    2.9e-13   3.5e-12   79x3   yes"));
  EXPECT_THAT(text, Not(HasSubstr("node-2"))) << "runners-up only with -o wide";
  EXPECT_THAT(text, HasSubstr("QUARANTINED   WHERE         SOURCE        MODE"));
  EXPECT_THAT(text, HasSubstr("attribution   now    attribution   3 failures (3 named it) in 4 "
                              "runs, 0.5 GPU-h, expected 0....\n"));
}

TEST(RenderFailureReport, WideAddsTheRunnersUp) {
  const std::string text = RenderFailureReport(nlohmann::json::parse(kReport), true);
  EXPECT_THAT(text, HasSubstr("2      node node-2   node-2"));
  EXPECT_THAT(text, HasSubstr("q=3.5e-12, XIDs 79x3"));
}

TEST(RenderFailureReport, SaysSoWhenNothingStandsOut) {
  const std::string text = RenderFailureReport(
      nlohmann::json::parse(R"({"fleet": {"gpus": 8, "nodes": 1}, "runs": 3, "failed_runs": 0,
                                "suspects": [], "runners_up": [], "quarantines": []})"),
      false);
  EXPECT_THAT(text, HasSubstr("No suspects"));
  EXPECT_THAT(text, Not(HasSubstr("RANK")));
  EXPECT_THAT(text, HasSubstr("in the last <none> h")) << "a missing field is shown, not fatal";
}

TEST(RenderFailureReport, ShowsTheLoopAndAnOpenBreaker) {
  const nlohmann::json report = wire::ParseDocument(R"json({
    "fleet": {"gpus": 8, "nodes": 2}, "suspects": [], "quarantines": [],
    "breaker": {"open": true, "out": 5, "gpus": 8, "window_s": 300},
    "loop": [{"device": "gpu", "id": "GPU-n1-2", "node": "n1", "gpu": 2, "phase": "quarantined",
              "remediations": 1,
              "events": ["gpu 2 (GPU-n1-2) suspect: 3 failures", "remediation reset-gpu (1 of 3)"]}]
})json");
  std::string text = RenderFailureReport(report, false);
  EXPECT_THAT(text, HasSubstr("Circuit breaker OPEN: 5 of 8 GPUs went out within 300 s"));
  EXPECT_THAT(text, HasSubstr("LOOP           WHERE     PHASE         REMEDIATIONS   EVENT"));
  EXPECT_THAT(text, HasSubstr("gpu GPU-n1-2   n1/gpu2   quarantined   1              "
                              "remediation reset-gpu (1 of 3)"));
  EXPECT_THAT(text, Not(HasSubstr("suspect: 3 failures"))) << "every event only with -o wide";
  text = RenderFailureReport(report, true);
  EXPECT_THAT(text, HasSubstr("suspect: 3 failures"));
}

TEST(RunReport, FetchesAndPrintsTableOrJson) {
  FakeClient fake;
  fake.Answer("GET /v1/reports/failures", 200, kReport);
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(RunReport(fake.client, {"failures", ""}, out, err), 0);
  EXPECT_THAT(out.str(), HasSubstr("gpu GPU-bad"));
  out.str("");
  EXPECT_EQ(RunReport(fake.client, {"failures", "json"}, out, err), 0);
  EXPECT_EQ(nlohmann::json::parse(out.str())["suspects"][0]["id"], "GPU-bad");
  EXPECT_EQ(err.str(), "");
}

TEST(RunReport, ErrorsAreNamed) {
  FakeClient fake;
  fake.Answer(
      "GET /v1/reports/failures", 403,
      R"({"error": {"code": "PERMISSION_DENIED", "message": "GET /v1/reports/failures needs an admin token"}})");
  std::ostringstream out;
  std::ostringstream err;
  EXPECT_EQ(RunReport(fake.client, {"failures", ""}, out, err), 1);
  EXPECT_EQ(err.str(),
            "Error from server (PermissionDenied): GET /v1/reports/failures needs an admin "
            "token\n");
  err.str("");
  EXPECT_EQ(RunReport(fake.client, {"jobs", ""}, out, err), 1);
  EXPECT_EQ(err.str(), "error: unknown report \"jobs\" (expected failures, versions or usage)\n");
  err.str("");
  EXPECT_EQ(RunReport(fake.client, {"failures", "csv"}, out, err), 1);
  EXPECT_THAT(err.str(), HasSubstr("unknown output format \"csv\""));
  EXPECT_EQ(out.str(), "");
}

}  // namespace
}  // namespace gpufleet::cli
