// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/outcome.h"

#include <functional>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/reliability/testing/test_fleet.h"

namespace gpufleet::reliability {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using testing::FailedWithXid;
using testing::Gpu;
using ::testing::HasSubstr;
using testing::MakeFleet;
using testing::MakeRun;

TEST(ValidateOutcome, AcceptsAWellFormedRecord) {
  const FleetInventory fleet = MakeFleet(2, 4, 2);
  OutcomeRecord record = MakeRun("j1", {Gpu(0, 0), Gpu(1, 3)}, 1, 2, ExitReason::kHang);
  record.xids.push_back(XidEvent{Gpu(1, 3), 79});
  record.health_events.push_back(
      HealthEvent{NodeId("n1"), Gpu(1, 3), "nvlink-down", HealthSeverity::kFail});
  record.health_events.push_back(HealthEvent{NodeId("n0"), GpuUuid(), "ib-link-flap"});
  EXPECT_OK(ValidateOutcome(record, fleet));
  EXPECT_EQ(record.size(), 2);
  EXPECT_EQ(record.duration(), std::chrono::hours(2));
}

TEST(ValidateOutcome, NamesTheFieldAndValueOfBadInput) {
  const FleetInventory fleet = MakeFleet(2, 4, 2);
  const struct {
    const char* error;
    std::function<void(OutcomeRecord&)> spoil;
  } cases[] = {
      {"job: empty id", [](OutcomeRecord& r) { r.job = JobId(); }},
      {"attempt: -1", [](OutcomeRecord& r) { r.attempt = -1; }},
      {"end: 0 ns is before start", [](OutcomeRecord& r) { r.end = MonoTime{0}; }},
      {"gpus[1]: unknown GPU \"n9-g0\"", [](OutcomeRecord& r) { r.gpus[1] = GpuUuid("n9-g0"); }},
      {"gpus[1]: GPU \"n0-g0\" listed twice", [](OutcomeRecord& r) { r.gpus[1] = Gpu(0, 0); }},
      {"nodes[0]: unknown node \"n9\"", [](OutcomeRecord& r) { r.nodes[0] = NodeId("n9"); }},
      {"nodes[1]: node \"n0\" listed twice", [](OutcomeRecord& r) { r.nodes[1] = NodeId("n0"); }},
      {"nodes: [n0] are not the nodes of the job's GPUs [n0, n1]",
       [](OutcomeRecord& r) { r.nodes.pop_back(); }},
      {"gpus, nodes: the record holds no device",
       [](OutcomeRecord& r) {
         r.gpus.clear();
         r.nodes.clear();
       }},
      {"xids[0].gpu: \"n0-g1\" is not one of the job's GPUs",
       [](OutcomeRecord& r) {
         r.xids.push_back(XidEvent{Gpu(0, 1), 79});
       }},
      {"xids[0].xid: 0 (must be 1..1023)",
       [](OutcomeRecord& r) {
         r.xids.push_back(XidEvent{Gpu(0, 0), 0});
       }},
      {"health_events[0].node: \"n2\" is not one of the job's nodes",
       [](OutcomeRecord& r) {
         r.health_events.push_back(HealthEvent{NodeId("n2"), {}, "x"});
       }},
      {"health_events[0].gpu: \"n1-g0\" is not a GPU the job held on node \"n0\"",
       [](OutcomeRecord& r) {
         r.health_events.push_back(HealthEvent{NodeId("n0"), Gpu(1, 0), "x"});
       }},
      {"health_events[0].check: empty",
       [](OutcomeRecord& r) {
         r.health_events.push_back(HealthEvent{NodeId("n0"), {}, ""});
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.error);
    OutcomeRecord record = MakeRun("j1", {Gpu(0, 0), Gpu(1, 0)}, 1, 2, ExitReason::kSucceeded);
    c.spoil(record);
    EXPECT_THAT(ValidateOutcome(record, fleet),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.error)));
  }
}

TEST(AttributeFailure, HardwareEvidenceNamesDevicesAndOutweighsTheExitCode) {
  const std::vector<GpuUuid> gpus = {Gpu(0, 0), Gpu(0, 1)};
  // No failure whatever was reported.
  OutcomeRecord succeeded = FailedWithXid("j", gpus, 0, 1, 79);
  succeeded.exit_reason = ExitReason::kSucceeded;
  EXPECT_EQ(AttributeFailure(succeeded).kind, FailureKind::kNone);
  EXPECT_EQ(AttributeFailure(MakeRun("j", gpus, 0, 1, ExitReason::kPreempted)).kind,
            FailureKind::kNone);
  // The application's fault, with or without an application XID.
  EXPECT_EQ(AttributeFailure(MakeRun("j", gpus, 0, 1, ExitReason::kAppError)).kind,
            FailureKind::kApplication);
  OutcomeRecord app_xid = FailedWithXid("j", gpus, 0, 1, 13);
  app_xid.exit_reason = ExitReason::kAppError;
  EXPECT_EQ(AttributeFailure(app_xid).kind, FailureKind::kApplication);
  // A blaming XID turns an "application error" into a GPU failure.
  OutcomeRecord fell_off = FailedWithXid("j", gpus, 0, 1, 79);
  fell_off.exit_reason = ExitReason::kAppError;
  fell_off.xids.push_back(XidEvent{Gpu(0, 0), 79});  // reported twice, named once
  const FailureAttribution blamed = AttributeFailure(fell_off);
  EXPECT_EQ(blamed.kind, FailureKind::kAttributed);
  EXPECT_THAT(blamed.gpus, ElementsAre(Gpu(0, 0)));
  // Nothing named: unattributed; a monitor XID or a warning names nothing.
  OutcomeRecord hang = FailedWithXid("j", gpus, 0, 1, 92);
  hang.exit_reason = ExitReason::kHang;
  hang.health_events.push_back(HealthEvent{NodeId("n0"), {}, "thermal", HealthSeverity::kWarn});
  EXPECT_EQ(AttributeFailure(hang).kind, FailureKind::kUnattributed);
  // A failing node check names the node; a failing GPU check the GPU.
  OutcomeRecord node_down = MakeRun("j", gpus, 0, 1, ExitReason::kInfraError);
  node_down.health_events.push_back(HealthEvent{NodeId("n0"), {}, "ib-link-down"});
  node_down.health_events.push_back(HealthEvent{NodeId("n0"), Gpu(0, 1), "ecc-dbe"});
  const FailureAttribution both = AttributeFailure(node_down);
  EXPECT_EQ(both.kind, FailureKind::kAttributed);
  EXPECT_THAT(both.nodes, ElementsAre(NodeId("n0")));
  EXPECT_THAT(both.gpus, ElementsAre(Gpu(0, 1)));
}

}  // namespace
}  // namespace gpufleet::reliability
