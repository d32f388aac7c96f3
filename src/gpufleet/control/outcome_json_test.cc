// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/outcome_json.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::control {
namespace {

using ::gpufleet::testing::StatusIs;
using reliability::ExitReason;
using reliability::HealthSeverity;
using ::testing::HasSubstr;

StoredOutcome Sample() {
  StoredOutcome outcome;
  reliability::OutcomeRecord& r = outcome.record;
  r.job = JobId("bert");
  r.attempt = 2;
  r.exit_reason = ExitReason::kInfraError;
  r.start = MonoTime{1'000'000'000};
  r.end = MonoTime{4'600'000'000'000};
  r.gpus = {GpuUuid("GPU-a"), GpuUuid("GPU-b")};
  r.nodes = {NodeId("n1")};
  r.xids = {{GpuUuid("GPU-b"), 79}};
  r.health_events = {{NodeId("n1"), GpuUuid("GPU-b"), "gpu-lost", HealthSeverity::kFail},
                     {NodeId("n1"), GpuUuid(), "ib-link-flap", HealthSeverity::kWarn}};
  outcome.cause = "gpu 1 of n1 must be drained now (task main-0)";
  return outcome;
}

TEST(OutcomeJson, RoundTrips) {
  const StoredOutcome outcome = Sample();
  const Json json = OutcomeToJson(outcome);
  EXPECT_EQ(json["exit_reason"], "infra-error");
  EXPECT_EQ(json["size"], 2);
  EXPECT_DOUBLE_EQ(json["duration_s"].get<double>(), 4599.0);
  EXPECT_FALSE(json["health_events"][1].contains("gpu")) << "a node-level check names no GPU";
  const Result<StoredOutcome> back = OutcomeFromJson(json);
  ASSERT_OK(back);
  EXPECT_EQ(OutcomeToJson(*back), json);
  EXPECT_EQ(back->record.health_events[0].severity, HealthSeverity::kFail);
  EXPECT_TRUE(back->record.health_events[1].gpu.empty());
}

TEST(OutcomeJson, AStoredRecordWithABadFieldIsNamed) {
  Json json = OutcomeToJson(Sample());
  json["gpus"][1] = 7;
  EXPECT_THAT(OutcomeFromJson(json),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpus[1]: 7")));
  json = OutcomeToJson(Sample());
  json.erase("end_ns");
  EXPECT_THAT(OutcomeFromJson(json), StatusIs(StatusCode::kInvalidArgument, "end_ns: missing"));
}

TEST(OutcomeName, IsJobSlashAttempt) {
  EXPECT_EQ(OutcomeName("bert", 3), "bert/3");
}

TEST(ParseExitReason, KnowsTheLibrarysNames) {
  EXPECT_EQ(ParseExitReason("hang"), ExitReason::kHang);
  EXPECT_EQ(ParseExitReason("app-error"), ExitReason::kAppError);
  EXPECT_EQ(ParseExitReason("crashed"), std::nullopt);
  EXPECT_EQ(ExitReasonNames(), "succeeded, cancelled, preempted, app-error, infra-error, hang");
}

TEST(ParseOutcomeReport, ReadsAFullReport) {
  const Result<OutcomeReport> report = ParseOutcomeReport(R"({
    "job": "bert", "attempt": 2, "exit_reason": "hang",
    "xids": [{"gpu": "GPU-b", "xid": 79}],
    "health_events": [{"node": "n1", "check": "nccl-timeout", "severity": "fail"}],
    "note": "NCCL watchdog: no progress for 30 min"})");
  ASSERT_OK(report);
  EXPECT_EQ(report->job, "bert");
  EXPECT_EQ(report->attempt, 2);
  EXPECT_EQ(report->exit_reason, ExitReason::kHang);
  ASSERT_EQ(report->xids.size(), 1u);
  EXPECT_EQ(report->xids[0].xid, 79);
  ASSERT_EQ(report->health_events.size(), 1u);
  EXPECT_TRUE(report->health_events[0].gpu.empty());
  EXPECT_EQ(report->note, "NCCL watchdog: no progress for 30 min");
}

TEST(ParseOutcomeReport, NamesTheBadFieldAndItsValue) {
  struct Case {
    const char* body;
    const char* error;
  };
  const Case cases[] = {
      {"not json", "body: not valid JSON"},
      {"[1]", "body: [1] (must be an object)"},
      {R"({"attempt": 1, "exit_reason": "hang"})", "job: missing"},
      {R"({"job": "", "attempt": 1, "exit_reason": "hang"})", "job: empty"},
      {R"({"job": "j", "attempt": "1", "exit_reason": "hang"})",
       "attempt: \"1\" (must be an integer)"},
      {R"({"job": "j", "attempt": 0, "exit_reason": "hang"})", "attempt: 0 (must be >= 1"},
      {R"({"job": "j", "attempt": 1, "exit_reason": "crashed"})",
       "exit_reason: unknown \"crashed\" (valid: succeeded, cancelled"},
      {R"({"job": "j", "attempt": 1, "exit_reason": "hang", "gpus": []})", "gpus: unknown field"},
      {R"({"job": "j", "attempt": 1, "exit_reason": "hang", "xids": {}})",
       "xids: {} (must be an array)"},
      {R"({"job": "j", "attempt": 1, "exit_reason": "hang", "xids": [{"gpu": "G", "xid": "79"}]})",
       "xids[0].xid: \"79\" (must be an integer)"},
      {R"({"job": "j", "attempt": 1, "exit_reason": "hang", "xids": [{"gpu": "G", "xid": 2000}]})",
       "xids[0].xid: 2000 (must be 1..1023)"},
      {R"({"job": "j", "attempt": 1, "exit_reason": "hang",
           "health_events": [{"node": "n", "check": "c", "severity": "bad"}]})",
       "health_events[0].severity: unknown \"bad\" (valid: warn, fail)"},
      {R"({"job": "j", "attempt": 1, "exit_reason": "hang",
           "health_events": [{"node": "n", "severity": "warn"}]})",
       "health_events[0].check: missing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    EXPECT_THAT(ParseOutcomeReport(c.body),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.error)));
  }
  const std::string long_note = std::string(R"({"job": "j", "attempt": 1, "exit_reason": "hang",
      "note": ")") + std::string(600, 'x') +
                                "\"}";
  EXPECT_THAT(ParseOutcomeReport(long_note),
              StatusIs(StatusCode::kInvalidArgument, "note: 600 bytes (at most 512)"));
}

TEST(ReadHealthReasons, SeparatesXidsWithTheirCountsFromOtherChecks) {
  const Json reasons = {
      "XID 79: GPU has fallen off the bus; drain now (reset the GPU)",
      "XID 13 (x3): Graphics Engine Exception; application error, never drain (fix the job)",
      "GPU lost (NVML_ERROR_GPU_IS_LOST): it no longer answers; drain now, reboot the node",
      "temperature 84 C, 3 C below the 87 C slowdown threshold (want at least 5 C)",
      "remapped rows wait for a GPU reset; drain after the running job"};
  const GpuHealthReading reading = ReadHealthReasons(reasons);
  EXPECT_EQ(reading.xids, (std::map<int, int>{{13, 3}, {79, 1}}));
  ASSERT_EQ(reading.checks.size(), 3u);
  EXPECT_EQ(reading.checks[0].name, "gpu-lost");
  EXPECT_EQ(reading.checks[0].severity, HealthSeverity::kFail);
  EXPECT_EQ(reading.checks[1].name, "thermal");
  EXPECT_EQ(reading.checks[1].severity, HealthSeverity::kWarn);
  EXPECT_EQ(reading.checks[2].name, "row-remap");
  EXPECT_EQ(reading.checks[2].severity, HealthSeverity::kFail);
  EXPECT_TRUE(ReadHealthReasons(Json()).xids.empty());
}

TEST(InferExitReason, FromTheJobsStateAndReason) {
  struct Case {
    const char* state;
    const char* reason;
    bool evidence;
    ExitReason want;
  };
  const Case cases[] = {
      {"Succeeded", "", false, ExitReason::kSucceeded},
      {"Succeeded", "", true, ExitReason::kSucceeded},
      {"Cancelled", "cancelled by root", false, ExitReason::kCancelled},
      {"Preempted", "", false, ExitReason::kPreempted},
      {"Pending", "preempted: gpu 3 of n1 was quarantined and drains now", false,
       ExitReason::kPreempted},
      {"Failed", "task main-0 on n1 failed: exited with code 7", false, ExitReason::kAppError},
      {"Failed", "task main-0 on n1 failed: exited with code 7", true, ExitReason::kInfraError},
      {"Pending", "requeued: node n1 is NotReady (task main-0 ran there)", false,
       ExitReason::kInfraError},
      {"Failed", "node n1 is NotReady (task main-0 ran there)", false, ExitReason::kInfraError},
      {"Pending", "requeued: gpu 3 of n1 must be drained now (task main-0)", false,
       ExitReason::kInfraError},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.state) + " " + c.reason);
    EXPECT_EQ(InferExitReason({{"state", c.state}, {"reason", c.reason}}, c.evidence), c.want);
  }
}

}  // namespace
}  // namespace gpufleet::control
