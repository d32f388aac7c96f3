// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/monitor.h"

#include <string>

#include <fmt/format.h>
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

// 32 GPUs on 8 nodes, two leaves. Every GPU runs quiet one-hour jobs through the job API; the
// GPUs in `bad_xids` fail three of them with the given XID (0: an unattributed hang).
class MonitorTest : public ::testing::Test {
 protected:
  ReliabilityMonitor Make(QuarantineRules rules, QuarantineBudget budget = {0.5, 0.5}) {
    auto monitor = ReliabilityMonitor::Create(fleet_, clock_, AttributionOptions(), budget, rules);
    EXPECT_OK(monitor);
    return std::move(monitor).value();
  }

  void RunJobs(ReliabilityMonitor& monitor, const std::map<std::string, int>& bad_xids) {
    for (int round = 0; round < 10; ++round) {
      for (int node = 0; node < 8; ++node) {
        for (int gpu = 0; gpu < 4; ++gpu) {
          const GpuUuid uuid = Gpu(node, gpu);
          if (!monitor.quarantine().AcceptsWork(uuid)) {
            continue;
          }
          const JobId job(fmt::format("j{}-{}", uuid.value(), round));
          ASSERT_OK(monitor.engine().JobStarted(job, 0, {uuid}));
          JobEnd end{job, ExitReason::kSucceeded, {}, {}};
          if (const auto it = bad_xids.find(uuid.value()); it != bad_xids.end() && round < 3) {
            end.exit_reason = it->second == 0 ? ExitReason::kHang : ExitReason::kInfraError;
            if (it->second != 0) {
              end.xids.push_back(XidEvent{uuid, it->second});
            }
          }
          clock_.Advance(std::chrono::minutes(1));
          ASSERT_OK(monitor.engine().JobEnded(end));
        }
      }
    }
  }

  FleetInventory fleet_ = MakeFleet(8, 4, 4);
  FakeClock clock_{Hours(1)};
};

TEST_F(MonitorTest, QuarantinesFlaggedSuspectsWithTheRulesDrainMode) {
  ReliabilityMonitor monitor = Make(QuarantineRules());
  RunJobs(monitor, {{"n1-g2", 79}, {"n5-g0", 0}});
  const Evaluation evaluation = monitor.Evaluate();
  ASSERT_EQ(evaluation.report.suspects.size(), 2u);
  ASSERT_EQ(evaluation.decisions.size(), 2u);
  for (const QuarantineDecision& decision : evaluation.decisions) {
    EXPECT_OK(decision.status);
    // XID 79 drains at once; a suspect with nothing but hangs waits for its job.
    EXPECT_EQ(decision.mode,
              decision.device.id == "n1-g2" ? DrainMode::kNow : DrainMode::kAfterJob);
  }
  EXPECT_FALSE(monitor.quarantine().AcceptsWork(Gpu(1, 2)));
  EXPECT_FALSE(monitor.quarantine().AcceptsWork(Gpu(5, 0)));
  const std::vector<AuditEntry>& log = monitor.quarantine().audit_log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].actor, "attribution");
  EXPECT_THAT(log[0].reason, HasSubstr("3 failures"));
  // Already out: no second decision.
  EXPECT_TRUE(monitor.Evaluate().decisions.empty());
}

TEST_F(MonitorTest, DisabledRulesOnlyReport) {
  QuarantineRules rules;
  rules.enabled = false;
  ReliabilityMonitor monitor = Make(rules);
  RunJobs(monitor, {{"n1-g2", 48}});
  const Evaluation evaluation = monitor.Evaluate();
  EXPECT_EQ(evaluation.report.suspects.size(), 1u);
  EXPECT_TRUE(evaluation.decisions.empty());
  EXPECT_TRUE(monitor.quarantine().AcceptsWork(Gpu(1, 2)));
}

TEST_F(MonitorTest, BudgetDenialsAreReportedAndLogged) {
  ReliabilityMonitor monitor = Make(QuarantineRules(), {1.0, 0.0625});  // 1 GPU per leaf
  RunJobs(monitor, {{"n0-g0", 79}, {"n1-g1", 79}, {"n4-g0", 79}});
  const Evaluation evaluation = monitor.Evaluate();
  ASSERT_EQ(evaluation.decisions.size(), 3u);
  int denied = 0;
  for (const QuarantineDecision& decision : evaluation.decisions) {
    denied += decision.status.code() == StatusCode::kResourceExhausted;
  }
  EXPECT_EQ(denied, 1);  // the second one in leaf0
  EXPECT_EQ(monitor.quarantine().gpus_out(), 2);
  EXPECT_EQ(monitor.quarantine().audit_log().size(), 3u);
}

TEST_F(MonitorTest, ReleaseStartsTheDeviceClean) {
  ReliabilityMonitor monitor = Make(QuarantineRules());
  RunJobs(monitor, {{"n2-g3", 95}});
  ASSERT_EQ(monitor.Evaluate().decisions.size(), 1u);
  EXPECT_THAT(monitor.Release(Device::OfGpu(GpuUuid("n2-g9")), "operator:cy", "swapped"),
              StatusIs(StatusCode::kNotFound, HasSubstr("n2-g9")));
  EXPECT_THAT(monitor.Release(Device::OfGpu(Gpu(2, 2)), "operator:cy", "swapped"),
              StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_OK(monitor.Release(Device::OfGpu(Gpu(2, 3)), "operator:cy", "swapped"));
  EXPECT_TRUE(monitor.quarantine().AcceptsWork(Gpu(2, 3)));
  const Evaluation after = monitor.Evaluate();
  EXPECT_TRUE(after.report.suspects.empty());
  EXPECT_TRUE(after.decisions.empty());
}

TEST_F(MonitorTest, HealthRulesGoThroughTheSamePath) {
  ReliabilityMonitor monitor = Make(QuarantineRules());
  EXPECT_THAT(monitor.QuarantineForXid(Gpu(0, 0), 13, "health-rule"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("xid: 13 is an application XID")));
  EXPECT_THAT(monitor.QuarantineForXid(Gpu(0, 0), 92, "health-rule"),
              StatusIs(StatusCode::kInvalidArgument));
  ASSERT_OK(monitor.QuarantineForXid(Gpu(0, 0), 79, "health-rule"));
  ASSERT_OK(monitor.QuarantineForXid(Gpu(0, 1), 63, "health-rule"));
  EXPECT_THAT(monitor.QuarantineForXid(Gpu(0, 1), 48, "health-rule"),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_EQ(monitor.quarantine().Find(Device::OfGpu(Gpu(0, 0)))->mode, DrainMode::kNow);
  EXPECT_EQ(monitor.quarantine().Find(Device::OfGpu(Gpu(0, 1)))->mode, DrainMode::kAfterJob);
  const AuditEntry& entry = monitor.quarantine().audit_log().front();
  EXPECT_EQ(entry.source, QuarantineSource::kHealthRule);
  EXPECT_EQ(entry.reason, "xid 79 (drain-now)");
}

TEST(EvidenceSummary, ReadsAsOneLine) {
  DeviceEvidence evidence;
  evidence.failures = 5;
  evidence.attributed_failures = 3;
  evidence.runs = 41;
  evidence.gpu_hours = 310.24;
  evidence.expected = 0.2134;
  evidence.p_value = 1.234e-8;
  evidence.q_value = 3.4e-5;
  evidence.xids = {{48, 1}, {79, 2}};
  evidence.health_checks = {{"nvlink-down", 1}};
  EXPECT_EQ(EvidenceSummary(evidence),
            "5 failures (3 named it) in 41 runs, 310.2 GPU-h, expected 0.213, p=1.2e-08, "
            "q=3.4e-05, XIDs 48x1 79x2, nvlink-down x1");
}

TEST(ConcentrationSummary, SaysWhoWasInvolvedAndWhatItCost) {
  const FailureConcentration c{3, 4, 0.25, 10, 7, 0.7, 0.35, 6.65};
  EXPECT_EQ(ConcentrationSummary(c),
            "these 4 GPUs (25.00% of the fleet) were involved in 70.0% of failed jobs; "
            "quarantining them would have avoided 7 failures");
}

}  // namespace
}  // namespace gpufleet::reliability
