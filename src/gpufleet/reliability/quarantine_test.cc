// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/quarantine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/reliability/testing/test_fleet.h"

namespace gpufleet::reliability {
namespace {

using ::gpufleet::testing::StatusIs;
using testing::Gpu;
using ::testing::HasSubstr;
using testing::Hours;
using testing::MakeFleet;

QuarantineRequest Request(const Device& device, DrainMode mode = DrainMode::kAfterJob) {
  return QuarantineRequest{device, mode, QuarantineSource::kAttribution, "attribution",
                           "5 failures in 12 runs"};
}

// 16 GPUs: leaf0 = n0, n1; leaf1 = n2, n3; four GPUs per node.
class QuarantineTest : public ::testing::Test {
 protected:
  QuarantineManager Make(double fleet_share, double leaf_share) {
    auto manager = QuarantineManager::Create(fleet_, clock_, {fleet_share, leaf_share});
    EXPECT_OK(manager);
    return std::move(manager).value();
  }

  FleetInventory fleet_ = MakeFleet(4, 4, 2);
  FakeClock clock_{Hours(1)};
};

TEST_F(QuarantineTest, QuarantinedDevicesTakeNoWork) {
  QuarantineManager manager = Make(0.5, 0.5);
  ASSERT_OK(manager.Quarantine(Request(Device::OfGpu(Gpu(0, 1)), DrainMode::kNow)));
  ASSERT_OK(manager.Quarantine(Request(Device::OfNode(NodeId("n2")))));
  EXPECT_FALSE(manager.AcceptsWork(Gpu(0, 1)));
  EXPECT_TRUE(manager.AcceptsWork(Gpu(0, 0)));
  for (int gpu = 0; gpu < 4; ++gpu) {
    EXPECT_FALSE(manager.AcceptsWork(Gpu(2, gpu)));
  }
  EXPECT_FALSE(manager.AcceptsWork(GpuUuid("unknown")));
  EXPECT_TRUE(manager.IsQuarantined(Device::OfNode(NodeId("n2"))));
  EXPECT_FALSE(manager.IsQuarantined(Device::OfGpu(Gpu(2, 0))));  // only through its node
  EXPECT_EQ(manager.gpus_out(), 5);
  EXPECT_EQ(manager.GpusOutInLeaf(0), 1);
  EXPECT_EQ(manager.GpusOutInLeaf(1), 4);
  const auto entry = manager.Find(Device::OfGpu(Gpu(0, 1)));
  ASSERT_TRUE(entry.has_value());
  EXPECT_EQ(entry->mode, DrainMode::kNow);
  EXPECT_EQ(entry->since, Hours(1));
  EXPECT_EQ(manager.Entries().size(), 2u);
}

TEST_F(QuarantineTest, BudgetCapsEachLeafAndTheFleet) {
  QuarantineManager manager = Make(0.25, 0.25);  // 4 GPUs in the fleet, 2 per leaf
  EXPECT_EQ(manager.FleetLimit(), 4);
  EXPECT_EQ(manager.LeafLimit(0), 2);
  ASSERT_OK(manager.Quarantine(Request(Device::OfGpu(Gpu(0, 0)))));
  ASSERT_OK(manager.Quarantine(Request(Device::OfGpu(Gpu(1, 0)))));
  EXPECT_THAT(manager.Quarantine(Request(Device::OfGpu(Gpu(0, 2)))),
              StatusIs(StatusCode::kResourceExhausted,
                       HasSubstr("leaf \"leaf0\" budget: 2 of 8 GPUs out, 1 more would pass the "
                                 "limit of 2 (25%)")));
  EXPECT_TRUE(manager.AcceptsWork(Gpu(0, 2)));
  EXPECT_EQ(manager.gpus_out(), 2);
  ASSERT_OK(manager.Quarantine(Request(Device::OfGpu(Gpu(2, 0)))));
  ASSERT_OK(manager.Quarantine(Request(Device::OfGpu(Gpu(3, 0)))));
  EXPECT_THAT(
      manager.Quarantine(Request(Device::OfGpu(Gpu(3, 1)))),
      StatusIs(StatusCode::kResourceExhausted,
               HasSubstr("fleet budget: 4 of 16 GPUs out, 1 more would pass the limit of 4")));
  // A node counts all its GPUs.
  QuarantineManager nodes = Make(1.0, 0.5);  // 4 GPUs per leaf
  ASSERT_OK(nodes.Quarantine(Request(Device::OfGpu(Gpu(0, 0)))));
  EXPECT_THAT(nodes.Quarantine(Request(Device::OfNode(NodeId("n1")))),
              StatusIs(StatusCode::kResourceExhausted, HasSubstr("4 more")));
  // ...but not twice: three more GPUs for n0, whose GPU 0 is out already.
  ASSERT_OK(nodes.Quarantine(Request(Device::OfNode(NodeId("n0")))));
  EXPECT_EQ(nodes.GpusOutInLeaf(0), 4);
}

TEST_F(QuarantineTest, ReleasePutsADeviceBackAndRejectsBadInputWithoutChange) {
  QuarantineManager manager = Make(1.0, 1.0);
  ASSERT_OK(manager.Quarantine(Request(Device::OfNode(NodeId("n1")))));
  ASSERT_OK(manager.Quarantine(Request(Device::OfGpu(Gpu(0, 0)))));
  const size_t logged = manager.audit_log().size();
  EXPECT_THAT(manager.Release(Device::OfGpu(GpuUuid("GPU-missing")), "operator:ana", "repaired"),
              StatusIs(StatusCode::kNotFound, HasSubstr("unknown device: gpu GPU-missing")));
  EXPECT_THAT(manager.Release(Device::OfNode(NodeId("n3")), "operator:ana", "repaired"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("node n3")));
  EXPECT_THAT(manager.Release(Device::OfGpu(Gpu(1, 0)), "operator:ana", "repaired"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not quarantined")));
  EXPECT_THAT(manager.Release(Device::OfNode(NodeId("n1")), "", "repaired"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("actor: empty")));
  EXPECT_THAT(manager.Release(Device::OfNode(NodeId("n1")), "operator:ana", ""),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("reason: empty")));
  EXPECT_EQ(manager.audit_log().size(), logged);
  EXPECT_EQ(manager.gpus_out(), 5);

  ASSERT_OK(manager.Release(Device::OfNode(NodeId("n1")), "operator:ana", "NIC replaced"));
  EXPECT_TRUE(manager.AcceptsWork(Gpu(1, 2)));
  EXPECT_FALSE(manager.AcceptsWork(Gpu(0, 0)));
  EXPECT_EQ(manager.gpus_out(), 1);
  EXPECT_EQ(manager.audit_log().size(), logged + 1);
}

TEST_F(QuarantineTest, RejectsBadRequestsWithoutChangeOrLog) {
  QuarantineManager manager = Make(0.5, 0.5);
  ASSERT_OK(manager.Quarantine(Request(Device::OfNode(NodeId("n0")))));
  QuarantineRequest no_actor = Request(Device::OfGpu(Gpu(1, 0)));
  no_actor.actor.clear();
  EXPECT_THAT(manager.Quarantine(no_actor),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("actor: empty")));
  QuarantineRequest no_reason = Request(Device::OfGpu(Gpu(1, 0)));
  no_reason.reason.clear();
  EXPECT_THAT(manager.Quarantine(no_reason),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("reason: empty")));
  EXPECT_THAT(manager.Quarantine(Request(Device::OfNode(NodeId("n9")))),
              StatusIs(StatusCode::kNotFound, HasSubstr("unknown device: node n9")));
  EXPECT_THAT(manager.Quarantine(Request(Device::OfNode(NodeId("n0")))),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("node n0 is already quarantined")));
  EXPECT_THAT(manager.Quarantine(Request(Device::OfGpu(Gpu(0, 3)))),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("its node \"n0\"")));
  EXPECT_EQ(manager.audit_log().size(), 1u);
  EXPECT_EQ(manager.gpus_out(), 4);
}

TEST_F(QuarantineTest, AuditLogRecordsEveryDecisionInOrder) {
  QuarantineManager manager = Make(0.25, 0.25);
  ASSERT_OK(manager.Quarantine(Request(Device::OfGpu(Gpu(0, 0)), DrainMode::kNow)));
  clock_.Advance(std::chrono::minutes(30));
  ASSERT_OK(manager.Quarantine(QuarantineRequest{Device::OfGpu(Gpu(0, 1)), DrainMode::kAfterJob,
                                                 QuarantineSource::kHealthRule, "health-rule",
                                                 "xid 63"}));
  EXPECT_FALSE(manager.Quarantine(Request(Device::OfGpu(Gpu(1, 1)))).ok());  // leaf budget
  clock_.Advance(std::chrono::hours(2));
  ASSERT_OK(manager.Release(Device::OfGpu(Gpu(0, 0)), "operator:bo", "field diag passed"));

  const std::vector<AuditEntry>& log = manager.audit_log();
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[0].sequence, 1);
  EXPECT_EQ(log[0].action, AuditAction::kQuarantined);
  EXPECT_EQ(log[0].device, Device::OfGpu(Gpu(0, 0)));
  EXPECT_EQ(log[0].mode, DrainMode::kNow);
  EXPECT_EQ(log[0].time, Hours(1));
  EXPECT_EQ(log[0].leaf, "leaf0");
  EXPECT_EQ(log[0].gpus_out, 1);
  EXPECT_EQ(log[1].source, QuarantineSource::kHealthRule);
  EXPECT_EQ(log[1].reason, "xid 63");
  EXPECT_EQ(log[1].time, Hours(1.5));
  EXPECT_EQ(log[1].leaf_gpus_out, 2);
  EXPECT_EQ(log[2].action, AuditAction::kDenied);
  EXPECT_THAT(log[2].reason, HasSubstr("denied: leaf \"leaf0\" budget"));
  EXPECT_EQ(log[2].gpus_out, 2);
  EXPECT_EQ(log[3].sequence, 4);
  EXPECT_EQ(log[3].action, AuditAction::kReleased);
  EXPECT_EQ(log[3].actor, "operator:bo");
  EXPECT_EQ(log[3].reason, "field diag passed");
  EXPECT_EQ(log[3].time, Hours(3.5));
  EXPECT_EQ(log[3].gpus_out, 1);
  EXPECT_STREQ(AuditActionName(log[3].action), "released");
}

TEST(QuarantineBudget, ValidateNamesTheField) {
  EXPECT_THAT((QuarantineBudget{1.5, 0.1}).Validate(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_fleet_share: 1.5")));
  EXPECT_THAT((QuarantineBudget{0.1, -0.1}).Validate(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_leaf_share: -0.1")));
  const FleetInventory fleet = MakeFleet(1, 1, 1);
  FakeClock clock;
  EXPECT_THAT(QuarantineManager::Create(fleet, clock, {0.1, 2.0}),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::reliability
