// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/mig_sim.h"

#include <sstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/testing/charts.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::sim::testing::ChartsIn;
using ::gpufleet::sim::testing::ChartsWithSeries;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

class MigSimTest : public ::testing::Test {
 protected:
  // One node of eight H100s for one day: small enough for a unit test, busy enough that the
  // layout matters.
  static MigSimOptions Small() {
    MigSimOptions options;
    options.seed = 3;
    options.duration_seconds = 86400;
    options.node_groups = {{"H100-80GB", 1}};
    options.load = 0.8;
    options.mean_duration_seconds = 1800;
    options.patience_seconds = 3600;
    return options;
  }

  MigSimResult Run(const MigSimOptions& options, MigMode mode) {
    Result<MigSimResult> result = RunMigSim(options, mode, catalog_);
    EXPECT_OK(result);
    return result.ok() ? *result : MigSimResult{};
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
};

TEST_F(MigSimTest, EveryTaskIsServedAbandonedOrStillWaiting) {
  for (MigMode mode : {MigMode::kFixed, MigMode::kCreateOnly, MigMode::kRepartition}) {
    SCOPED_TRACE(MigModeName(mode));
    const MigSimResult r = Run(Small(), mode);
    EXPECT_GT(r.submitted, 100);
    EXPECT_EQ(r.served + r.abandoned + r.waiting_at_end, r.submitted);
    int submitted = 0;
    int served = 0;
    int abandoned = 0;
    for (const MigSizeStats& stats : r.by_size) {
      submitted += stats.submitted;
      served += stats.served;
      abandoned += stats.abandoned;
    }
    EXPECT_EQ(submitted, r.submitted);
    EXPECT_EQ(served, r.served);
    EXPECT_EQ(abandoned, r.abandoned);
    EXPECT_GT(r.slice_utilization, 0);
    EXPECT_LE(r.slice_utilization, 1);
    EXPECT_EQ(r.total_gpus, 8);
    EXPECT_EQ(r.total_slices, 56);
    ASSERT_EQ(r.buckets.size(), 24U);
    int arrived = 0;
    for (const MigBucket& bucket : r.buckets) {
      arrived += bucket.arrived;
      EXPECT_LE(bucket.slice_utilization, 1);
    }
    EXPECT_EQ(arrived, r.submitted);
  }
}

TEST_F(MigSimTest, OnlyTheRepartitionRunChangesLayouts) {
  const MigSimResult fixed = Run(Small(), MigMode::kFixed);
  const MigSimResult create_only = Run(Small(), MigMode::kCreateOnly);
  const MigSimResult repartition = Run(Small(), MigMode::kRepartition);
  EXPECT_EQ(fixed.submitted, repartition.submitted);  // the same arrivals
  EXPECT_EQ(fixed.planner_runs, 0);
  EXPECT_EQ(fixed.gpus_reconfigured, 0);
  EXPECT_EQ(create_only.gpus_reconfigured, 0);
  EXPECT_GT(repartition.planner_runs, 0);
  EXPECT_GT(repartition.gpus_reconfigured, 0);
  EXPECT_GT(repartition.instances_destroyed, 0);
  // The mix shifts, so a layout that adapts serves more and keeps more slices busy.
  EXPECT_GT(repartition.served, fixed.served);
  EXPECT_GT(repartition.slice_utilization, fixed.slice_utilization);
}

TEST_F(MigSimTest, AFixedLayoutWithoutA7gNeverServesOne) {
  MigSimOptions options = Small();
  options.day_mix = {0, 0, 0, 0, 1};
  options.night_mix = {0, 0, 0, 0, 1};
  options.initial_layout = {{3, 3}};
  options.duration_seconds = 6 * 3600;
  const MigSimResult fixed = Run(options, MigMode::kFixed);
  EXPECT_GT(fixed.submitted, 0);
  EXPECT_EQ(fixed.served, 0);
  const MigSimResult repartition = Run(options, MigMode::kRepartition);
  EXPECT_GT(repartition.served, 0);
  EXPECT_EQ(repartition.by_size[4].served, repartition.served);
}

TEST_F(MigSimTest, SameSeedSameBytes) {
  MigSimOptions options = Small();
  options.duration_seconds = 8 * 3600;
  Result<std::vector<MigSimResult>> first = RunMigSims(options, catalog_, 1);
  Result<std::vector<MigSimResult>> second = RunMigSims(options, catalog_, 3);
  ASSERT_OK(first);
  ASSERT_OK(second);
  std::ostringstream a;
  std::ostringstream b;
  ASSERT_OK(WriteMigReport(*first, options, "MIG", a));
  ASSERT_OK(WriteMigReport(*second, options, "MIG", b));
  EXPECT_EQ(a.str(), b.str());
  std::ostringstream summary_a;
  std::ostringstream summary_b;
  PrintMigSummary(*first, summary_a);
  PrintMigSummary(*second, summary_b);
  EXPECT_EQ(summary_a.str(), summary_b.str());
  options.seed = 4;
  Result<std::vector<MigSimResult>> other = RunMigSims(options, catalog_, 1);
  ASSERT_OK(other);
  std::ostringstream c;
  ASSERT_OK(WriteMigReport(*other, options, "MIG", c));
  EXPECT_NE(a.str(), c.str());
}

TEST_F(MigSimTest, TheReportHasTheRunsAndTheCharts) {
  MigSimOptions options = Small();
  options.duration_seconds = 4 * 3600;
  Result<std::vector<MigSimResult>> results = RunMigSims(options, catalog_, 1);
  ASSERT_OK(results);
  std::ostringstream html;
  ASSERT_OK(WriteMigReport(*results, options, "MIG <repartitioning>", html));
  const std::string page = html.str();
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0U);
  EXPECT_THAT(page, HasSubstr("<title>MIG &lt;repartitioning&gt;</title>"));
  EXPECT_THAT(page, HasSubstr("<td>repartition</td>"));
  EXPECT_THAT(page, HasSubstr("<td>create-only</td>"));
  EXPECT_GT(ChartsWithSeries(ChartsIn(page), "fixed"), 0);
  EXPECT_THAT(page, HasSubstr("GPU-slice utilization"));
  EXPECT_THAT(page, HasSubstr("Served share by instance size"));
  std::ostringstream summary;
  PrintMigSummary(*results, summary);
  EXPECT_THAT(summary.str(), HasSubstr("GPU-slice utilization"));
  EXPECT_THAT(WriteMigReport({}, options, "MIG", html), StatusIs(StatusCode::kInvalidArgument));
}

TEST_F(MigSimTest, RejectsBadOptions) {
  auto error = [&](auto change) {
    MigSimOptions options = Small();
    change(options);
    return RunMigSim(options, MigMode::kFixed, catalog_).status();
  };
  EXPECT_THAT(error([](MigSimOptions& o) { o.duration_seconds = 0; }),
              StatusIs(StatusCode::kInvalidArgument, "duration_seconds: 0 (must be positive)"));
  EXPECT_THAT(error([](MigSimOptions& o) {
                o.node_groups = {{"L40S", 1}};
              }),
              StatusIs(StatusCode::kInvalidArgument, "node_groups[0].model: L40S has no MIG"));
  EXPECT_THAT(error([](MigSimOptions& o) {
                o.node_groups = {{"Z1", 1}};
              }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("node_groups[0].model: unknown")));
  EXPECT_THAT(
      error([](MigSimOptions& o) {
        o.node_groups = {{"H100", 0}};
      }),
      StatusIs(StatusCode::kInvalidArgument, "node_groups[0].nodes: 0 (must be at least 1)"));
  EXPECT_THAT(error([](MigSimOptions& o) {
                o.initial_layout = {{7}, {4, 4}};
              }),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("initial_layout[1]: sizes 4,4 do not fit on one H100-80GB")));
  EXPECT_THAT(error([](MigSimOptions& o) { o.initial_layout = {{5}}; }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("initial_layout[0]: sizes 5")));
  EXPECT_THAT(error([](MigSimOptions& o) { o.load = 0; }),
              StatusIs(StatusCode::kInvalidArgument, "load: 0 (must be in (0, 4])"));
  EXPECT_THAT(error([](MigSimOptions& o) {
                o.day_mix = {0, 0, -1, 0, 0};
              }),
              StatusIs(StatusCode::kInvalidArgument, "day_mix[2]: -1 (must not be negative)"));
  EXPECT_THAT(error([](MigSimOptions& o) {
                o.night_mix = {0, 0, 0, 0, 0};
              }),
              StatusIs(StatusCode::kInvalidArgument, "night_mix: all shares are zero"));
  EXPECT_THAT(error([](MigSimOptions& o) { o.gpus_per_node = 65; }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpus_per_node: 65")));
  EXPECT_THAT(error([](MigSimOptions& o) { o.mean_duration_seconds = 10; }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("mean_duration_seconds: 10")));
  EXPECT_THAT(error([](MigSimOptions& o) { o.replan_interval_seconds = 0; }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("replan_interval_seconds: 0")));
  EXPECT_THAT(error([](MigSimOptions& o) { o.max_plan_requests = 0; }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_plan_requests: 0")));
  EXPECT_THAT(error([](MigSimOptions& o) { o.sample_seconds = 1; }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("sample_seconds: 1")));
  EXPECT_THAT(error([](MigSimOptions& o) { o.patience_seconds = -1; }),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("patience_seconds: -1")));
}

}  // namespace
}  // namespace gpufleet::sim
