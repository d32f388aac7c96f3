// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/failure_sim.h"

#include <cmath>
#include <functional>
#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/failure_report.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

// 256 GPUs: 2 leaves x 16 nodes x 8 GPUs.
Cluster SmallCluster() {
  SyntheticClusterSpec spec;
  spec.leaves_per_block = 2;
  spec.nodes_per_leaf = 16;
  spec.gpus_per_node = 8;
  return MakeSyntheticCluster(spec, GpuCatalog::Default()).value();
}

std::vector<JobShape> SmallShapes() {
  return {{1, 2 * 3600}, {1, 6 * 3600}, {2, 4 * 3600}, {4, 3 * 3600}, {8, 8 * 3600}};
}

// Ten days on 256 GPUs with a harsh base rate and 4 % bad GPUs, so that a few days give the
// attribution enough failures; a 64-GPU large job. The reference model of issue 8: GPU faults
// only, the attribution quarantining by itself, no spares.
FailureSimOptions SmallOptions() {
  FailureSimOptions options;
  options.seed = 7;
  options.duration_seconds = 10 * 24 * 3600;
  options.faults.base_rate_per_gpu_hour = 1e-3;
  options.faults.bad_gpu_share = 0.04;
  options.faults.slow_gpu_share = 0;
  options.faults.node_rate_per_node_hour = 0;
  options.faults.nic_rate_per_node_hour = 0;
  options.diagnostics.enabled = false;
  options.large_job.gpus = 64;
  options.large_job.spare_nodes = 0;
  options.budget = {0.1, 0.2};
  return options;
}

// The same with the whole fault model and the diagnostics loop: 2 % fail-slow GPUs, node and
// NIC faults ten times the defaults so that ten days on 32 nodes see some.
FailureSimOptions LoopOptions() {
  FailureSimOptions options = SmallOptions();
  options.faults.slow_gpu_share = 0.02;
  options.faults.node_rate_per_node_hour = 2e-3;
  options.faults.nic_rate_per_node_hour = 6e-3;
  options.diagnostics.enabled = true;
  options.large_job.spare_nodes = 2;
  return options;
}

double LargeJobShares(const LargeJobStats& l) {
  return l.useful_hours + l.lost_hours + l.restart_hours + l.checkpoint_hours + l.waiting_hours +
         l.slowed_hours;
}

std::string Json(const std::vector<FailureSimResult>& results) {
  std::ostringstream out;
  WriteFailureJson(results, out);
  return out.str();
}

TEST(FailureSim, SameSeedSameResultAnotherSeedAnother) {
  const Cluster cluster = SmallCluster();
  const GpuCatalog catalog = GpuCatalog::Default();
  auto first = RunFailureSim(cluster, SmallShapes(), catalog, SmallOptions());
  auto second = RunFailureSim(cluster, SmallShapes(), catalog, SmallOptions());
  ASSERT_OK(first);
  ASSERT_OK(second);
  EXPECT_EQ(Json({*first}), Json({*second}));
  FailureSimOptions other = SmallOptions();
  other.seed = 8;
  auto third = RunFailureSim(cluster, SmallShapes(), catalog, other);
  ASSERT_OK(third);
  EXPECT_NE(Json({*first}), Json({*third}));
}

TEST(FailureSim, QuarantineFindsTheBadGpusAndCutsFailures) {
  const Cluster cluster = SmallCluster();
  auto runs = RunFailureSimPair(cluster, SmallShapes(), GpuCatalog::Default(), SmallOptions(), 2);
  ASSERT_OK(runs);
  ASSERT_EQ(runs->size(), 2u);
  const FailureSimResult& with = (*runs)[0];
  const FailureSimResult& without = (*runs)[1];
  ASSERT_TRUE(with.quarantine);
  ASSERT_FALSE(without.quarantine);

  // The injection: 4 % of 256 GPUs, causing a large share of the hardware failures.
  ASSERT_EQ(with.bad_gpus.size(), 10u);
  for (const BadGpu& bad : with.bad_gpus) {
    EXPECT_GE(bad.multiplier, 50);
    EXPECT_LE(bad.multiplier, 100);
  }
  EXPECT_GT(without.hardware_failures, 120);
  EXPECT_GT(without.bad_gpu_failures, without.hardware_failures / 2);
  EXPECT_GT(without.app_failures, 0);

  // Found, with few healthy GPUs taken out, and the failure rate falls.
  EXPECT_GE(with.bad_found, 9);
  EXPECT_LT(with.found_90_seconds, 7 * 24 * 3600);
  EXPECT_GE(with.found_90_seconds, 0);
  EXPECT_LE(with.healthy_gpus_quarantined, 2);
  EXPECT_FALSE(with.audit_log.empty());
  EXPECT_EQ(with.audit_log.front().action, reliability::AuditAction::kQuarantined);
  const FailureComparison comparison = CompareFailureRuns(with, without);
  EXPECT_LT(comparison.rate_ratio, 0.6);
  EXPECT_GT(comparison.rate_ratio, 0.0);

  // The run without quarantine flags but takes nothing out.
  EXPECT_GE(without.bad_found, 9);
  EXPECT_TRUE(without.audit_log.empty());
  EXPECT_EQ(without.healthy_gpus_quarantined, 0);

  // The large job's time adds up, and quarantine helps it.
  for (const FailureSimResult* r : {&with, &without}) {
    const LargeJobStats& l = r->large_job;
    EXPECT_EQ(l.gpus, 64);
    EXPECT_NEAR(l.wall_hours, 240.0, 1e-9);
    EXPECT_NEAR(LargeJobShares(l), l.wall_hours, 1e-6);
    EXPECT_EQ(l.slowed_hours, 0);
    EXPECT_GT(l.failures, 0);
    EXPECT_GT(l.Ettr(), 0.3);
    EXPECT_LT(l.Ettr(), 1.0);
  }
  EXPECT_GT(with.large_job.Ettr(), without.large_job.Ettr());

  // The stream ran and the statistics are consistent.
  EXPECT_GT(with.jobs_finished, 100);
  EXPECT_GT(with.mean_busy_gpus, 100);
  EXPECT_EQ(with.hours.size(), 240u);
  EXPECT_FALSE(with.failed_runs_by_gpu_rank.empty());
  EXPECT_FALSE(with.concentration_curve.empty());
  EXPECT_GT(without.concentration.failed_share, 0.3);
  EXPECT_GT(without.concentration.avoidable, 0);
}

TEST(FailureSim, RejectsBadOptionsNamingTheField) {
  const struct {
    const char* field;
    std::function<void(FailureSimOptions&)> spoil;
  } cases[] = {
      {"duration_seconds: 0", [](FailureSimOptions& o) { o.duration_seconds = 0; }},
      {"target_load: 0", [](FailureSimOptions& o) { o.target_load = 0; }},
      {"analysis_interval_seconds: -5",
       [](FailureSimOptions& o) { o.analysis_interval_seconds = -5; }},
      {"faults.bad_gpu_share: 2", [](FailureSimOptions& o) { o.faults.bad_gpu_share = 2; }},
      {"faults.bad_multiplier: 100-50",
       [](FailureSimOptions& o) {
         o.faults.bad_multiplier_min = 100;
         o.faults.bad_multiplier_max = 50;
       }},
      {"faults.xid_share: -1", [](FailureSimOptions& o) { o.faults.xid_share = -1; }},
      {"large_job: gpus -8", [](FailureSimOptions& o) { o.large_job.gpus = -8; }},
      {"alpha: 2", [](FailureSimOptions& o) { o.attribution.alpha = 2; }},
      {"max_leaf_share: 3", [](FailureSimOptions& o) { o.budget.max_leaf_share = 3; }},
      {"placement_policy: unknown \"magic\"",
       [](FailureSimOptions& o) { o.placement_policy = "magic"; }},
      {"faults.slow_factor: 0.5", [](FailureSimOptions& o) { o.faults.slow_factor = 0.5; }},
      {"faults.slow_gpu_share: 0.995",
       [](FailureSimOptions& o) { o.faults.slow_gpu_share = 0.995; }},
      {"faults.nic_rate_per_node_hour: -1",
       [](FailureSimOptions& o) { o.faults.nic_rate_per_node_hour = -1; }},
      {"faults.node_repair_seconds: -3",
       [](FailureSimOptions& o) { o.faults.node_repair_seconds = -3; }},
      {"diagnostics.diagnostic_seconds: 0",
       [](FailureSimOptions& o) { o.diagnostics.diagnostic_seconds = 0; }},
      {"diagnostics.false_positive_rate: 1.5",
       [](FailureSimOptions& o) { o.diagnostics.false_positive_rate = 1.5; }},
      {"diagnostics.suspect_min_failures: 0",
       [](FailureSimOptions& o) { o.diagnostics.suspect_min_failures = 0; }},
      {"large_job.spare_nodes -1", [](FailureSimOptions& o) { o.large_job.spare_nodes = -1; }},
  };
  const Cluster cluster = SmallCluster();
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    FailureSimOptions options = SmallOptions();
    c.spoil(options);
    EXPECT_THAT(RunFailureSim(cluster, SmallShapes(), GpuCatalog::Default(), options),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.field)));
  }
  FailureSimOptions too_large = SmallOptions();
  too_large.large_job.gpus = 256;
  EXPECT_THAT(RunFailureSim(cluster, SmallShapes(), GpuCatalog::Default(), too_large),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("large_job.gpus: 256")));
  EXPECT_THAT(RunFailureSim(cluster, {{500, 3600}, {1, 0}}, GpuCatalog::Default(), SmallOptions()),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("shapes: no job of 1..192 GPUs")));
}

TEST(FailureSim, DiagnosticsQuarantineTheBadAndSlowGpusAndFewSoundOnes) {
  const Cluster cluster = SmallCluster();
  auto runs = RunFailureSimPair(cluster, SmallShapes(), GpuCatalog::Default(), LoopOptions(), 2);
  ASSERT_OK(runs);
  const FailureSimResult& with = (*runs)[0];
  const FailureSimResult& without = (*runs)[1];

  // The injection: 10 bad and 5 fail-slow GPUs, node and NIC faults that failed runs.
  ASSERT_EQ(with.bad_gpus.size(), 10u);
  ASSERT_EQ(with.slow_gpus.size(), 5u);
  for (const SlowGpu& slow : with.slow_gpus) {
    EXPECT_DOUBLE_EQ(slow.slow_factor, 1.34);
    for (const BadGpu& bad : with.bad_gpus) {
      EXPECT_NE(slow.uuid, bad.uuid);
    }
  }
  EXPECT_GT(with.node_faults, 0);
  EXPECT_GT(with.nic_faults, 0);
  EXPECT_GT(with.node_failures + with.nic_failures, 0);

  // Suspects are diagnosed; only a failed diagnostic quarantines, by the health rule.
  EXPECT_GT(with.diagnostics, with.diagnostics_failed);
  EXPECT_GE(with.bad_quarantined, 8);
  EXPECT_GE(with.slow_found, 4);
  EXPECT_GE(with.slow_quarantined, 3);
  EXPECT_LE(with.healthy_gpus_quarantined, 3);
  ASSERT_FALSE(with.audit_log.empty());
  for (const reliability::AuditEntry& entry : with.audit_log) {
    EXPECT_EQ(entry.source, reliability::QuarantineSource::kHealthRule);
    EXPECT_EQ(entry.actor, "diagnostic");
  }
  for (const SlowGpu& slow : with.slow_gpus) {
    if (slow.quarantined_seconds >= 0) {
      EXPECT_GE(slow.quarantined_seconds, slow.found_seconds);
    }
  }

  // The run without the loop finds the slow GPUs by comparison but diagnoses nothing.
  EXPECT_EQ(without.diagnostics, 0);
  EXPECT_EQ(without.bad_quarantined, 0);
  EXPECT_GE(without.slow_found, 4);

  // A fail-slow GPU in the large job slows it; the loop takes it out at a checkpoint.
  for (const FailureSimResult* r : {&with, &without}) {
    EXPECT_NEAR(LargeJobShares(r->large_job), r->large_job.wall_hours, 1e-6);
  }
  EXPECT_LT(with.large_job.slowed_hours, without.large_job.slowed_hours);
  EXPECT_GT(with.large_job.Ettr(), without.large_job.Ettr());
}

TEST(FailureSim, ASoundDiagnosticReadmitsTheGpu) {
  FailureSimOptions options = LoopOptions();
  options.rules.enabled = true;
  options.diagnostics.bad_sensitivity = 0;
  options.diagnostics.slow_sensitivity = 0;
  options.diagnostics.false_positive_rate = 0;
  auto run = RunFailureSim(SmallCluster(), SmallShapes(), GpuCatalog::Default(), options);
  ASSERT_OK(run);
  EXPECT_GT(run->diagnostics, 20);
  EXPECT_EQ(run->diagnostics_failed, 0);
  EXPECT_TRUE(run->audit_log.empty());
  EXPECT_EQ(run->bad_quarantined, 0);
  EXPECT_EQ(run->healthy_gpus_quarantined, 0);
}

TEST(FailureSim, FailSlowGpusSlowTheirGangs) {
  FailureSimOptions options = SmallOptions();
  options.faults.slow_gpu_share = 0.1;
  options.faults.slow_factor = 2;
  FailureSimOptions sound = options;
  sound.faults.slow_gpu_share = 0;
  auto slow = RunFailureSim(SmallCluster(), SmallShapes(), GpuCatalog::Default(), options);
  auto fast = RunFailureSim(SmallCluster(), SmallShapes(), GpuCatalog::Default(), sound);
  ASSERT_OK(slow);
  ASSERT_OK(fast);
  // 64 GPUs of which about 10 % run at half speed: the large job is all but always slowed.
  EXPECT_GT(slow->large_job.slowed_hours, 0.3 * slow->large_job.wall_hours);
  EXPECT_NEAR(LargeJobShares(slow->large_job), slow->large_job.wall_hours, 1e-6);
  EXPECT_EQ(fast->large_job.slowed_hours, 0);
  EXPECT_LT(slow->large_job.Ettr(), fast->large_job.Ettr());
  EXPECT_LT(slow->jobs_finished, fast->jobs_finished);
}

TEST(FailureSim, CheckpointIntervalFromTheMeasuredFailureRate) {
  FailureSimOptions options = SmallOptions();
  options.rules.enabled = false;
  options.large_job.checkpoint_from_failure_rate = true;
  auto run = RunFailureSim(SmallCluster(), SmallShapes(), GpuCatalog::Default(), options);
  ASSERT_OK(run);
  const LargeJobStats& l = run->large_job;
  ASSERT_GT(l.failures, 10);
  // Young/Daly: sqrt(2 x 30 s x MTBF), MTBF from the job's own runs (one failure of prior).
  const double mtbf_seconds = (l.wall_hours - l.waiting_hours) * 3600 / (l.failures + 1);
  EXPECT_NEAR(static_cast<double>(l.suggested_checkpoint_seconds), std::sqrt(2 * 30 * mtbf_seconds),
              0.2 * std::sqrt(2 * 30 * mtbf_seconds));
  EXPECT_GT(l.checkpoint_interval_seconds, 60);
  EXPECT_LT(l.checkpoint_interval_seconds, 30 * 60);
  FailureSimOptions fixed = options;
  fixed.large_job.checkpoint_from_failure_rate = false;
  auto fixed_run = RunFailureSim(SmallCluster(), SmallShapes(), GpuCatalog::Default(), fixed);
  ASSERT_OK(fixed_run);
  EXPECT_EQ(fixed_run->large_job.checkpoint_interval_seconds, 30 * 60);
}

TEST(JobShapesFromTrace, KeepsWholeGpuJobs) {
  Trace trace;
  auto add = [&](std::vector<TaskGroup> groups, int64_t duration) {
    TraceJob job;
    job.job.groups = std::move(groups);
    job.duration_seconds = duration;
    trace.jobs.push_back(std::move(job));
  };
  add({TaskGroup{"a", 2, TaskRequest{{}, WholeGpus{4}}},
       TaskGroup{"b", 1, TaskRequest{{}, NoGpu{}}}},
      100);
  add({TaskGroup{"a", 1, TaskRequest{{}, FractionalGpu{500, 0}}}}, 100);
  add({TaskGroup{"a", 1, TaskRequest{{}, NoGpu{}}}}, 100);
  add({TaskGroup{"a", 1, TaskRequest{{}, WholeGpus{1}}}}, 0);
  const std::vector<JobShape> shapes = JobShapesFromTrace(trace);
  ASSERT_EQ(shapes.size(), 1u);
  EXPECT_EQ(shapes[0].gpus, 8);
  EXPECT_EQ(shapes[0].duration_seconds, 100);
}

TEST(FailureSimResult, RatesBetweenSumsTheHoursInRange) {
  FailureSimResult result;
  result.hours = {{10, 1, 0, 100.0}, {20, 2, 1, 200.0}, {30, 0, 0, 300.0}};
  const FailureRates rates = result.RatesBetween(1, 99);
  EXPECT_EQ(rates.from_hour, 1);
  EXPECT_EQ(rates.to_hour, 3);
  EXPECT_EQ(rates.runs_ended, 50);
  EXPECT_EQ(rates.failed_runs, 2);
  EXPECT_DOUBLE_EQ(rates.busy_gpu_hours, 500.0);
  EXPECT_DOUBLE_EQ(rates.PerThousandGpuHours(), 4.0);
  EXPECT_DOUBLE_EQ(rates.FailedShare(), 0.04);
  EXPECT_EQ(result.RatesBetween(-3, 0).runs_ended, 0);
}

}  // namespace
}  // namespace gpufleet::sim
