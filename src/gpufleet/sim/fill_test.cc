// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/fill.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::testing::StatusIs;

std::vector<Job> SmallTrace() {
  std::vector<Job> pods;
  for (int i = 0; i < 40; ++i) {
    Job pod;
    pod.id = JobId("pod-" + std::to_string(100 + i));
    GpuRequest gpus = NoGpu{};
    if (i % 4 == 1) {
      gpus = FractionalGpu{250 + 50 * (i % 3), 0};
    } else if (i % 4 == 2) {
      gpus = WholeGpus{1};
    } else if (i % 4 == 3) {
      gpus = WholeGpus{i % 8 == 3 ? 2 : 4};
    }
    pod.groups.push_back({"pod", 1, {{2000, 4096}, gpus}});
    pods.push_back(std::move(pod));
  }
  return pods;
}

Cluster SmallCluster(const GpuCatalog& catalog) {
  return MakeSyntheticCluster({1, 2, 4, 8, "T4", 64000, 262144}, catalog).value();
}

TEST(FillArrivalOrder, ShufflesThenAppendsCopiesUpToTheTarget) {
  const std::vector<Job> pods = SmallTrace();
  int64_t original = 0;
  for (const Job& pod : pods) {
    original += pod.RequestedGpuMilliTotal();
  }
  const int64_t capacity = original;
  const std::vector<Job> order = FillArrivalOrder(pods, capacity, 1.3, 42);
  ASSERT_GT(order.size(), pods.size());
  int64_t requested = 0;
  for (const Job& pod : order) {
    requested += pod.RequestedGpuMilliTotal();
  }
  EXPECT_LE(requested, 1.3 * capacity);
  EXPECT_GT(requested, 1.2 * capacity);
  EXPECT_EQ(order.back().id.value().find("-copy-") != std::string::npos, true);
  EXPECT_NE(order[0].id, pods[0].id);  // shuffled
  const std::vector<Job> again = FillArrivalOrder(pods, capacity, 1.3, 42);
  for (size_t i = 0; i < order.size(); ++i) {
    ASSERT_EQ(order[i].id, again[i].id);
  }
}

TEST(RunFill, RecordsAllocationPerArrivedPercent) {
  const GpuCatalog catalog = GpuCatalog::Default();
  FillOptions options;
  options.policy = "best-fit";
  auto result = RunFill(SmallCluster(catalog), SmallTrace(), catalog, options);
  ASSERT_OK(result);
  EXPECT_EQ(result->total_gpus, 64);
  ASSERT_FALSE(result->points.empty());
  double previous = 0;
  for (const FillPoint& point : result->points) {
    EXPECT_GE(point.allocation_percent, previous - 1e-9);  // pods never leave
    // One pod moves the load by up to 4 of the 64 GPUs, so a percent may run ahead by 6.25.
    EXPECT_LE(point.allocation_percent, std::min(100.0, point.arrived_percent + 6.25 + 1.0));
    previous = point.allocation_percent;
  }
  EXPECT_GT(result->pods_failed, 0);  // 130 % of capacity cannot all fit
}

TEST(RunFill, ParallelMatrixEqualsSerialRuns) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const Cluster cluster = SmallCluster(catalog);
  const std::vector<std::string> policies = {"fgd", "random", "gpu-packing"};
  const std::vector<uint64_t> seeds = {1, 2};
  auto parallel = RunFillMatrix(cluster, SmallTrace(), catalog, policies, seeds, {}, 3);
  ASSERT_OK(parallel);
  ASSERT_EQ(parallel->size(), 6U);
  for (size_t i = 0; i < parallel->size(); ++i) {
    FillOptions options;
    options.policy = policies[i / 2];
    options.seed = seeds[i % 2];
    auto serial = RunFill(cluster, SmallTrace(), catalog, options);
    ASSERT_OK(serial);
    ASSERT_EQ(serial->points.size(), (*parallel)[i].points.size());
    for (size_t p = 0; p < serial->points.size(); ++p) {
      EXPECT_EQ(serial->points[p].allocation_percent, (*parallel)[i].points[p].allocation_percent);
      EXPECT_EQ(serial->points[p].fragmentation_percent,
                (*parallel)[i].points[p].fragmentation_percent);
    }
  }
}

TEST(RunFill, UnknownPolicyIsAnError) {
  const GpuCatalog catalog = GpuCatalog::Default();
  FillOptions options;
  options.policy = "magic";
  EXPECT_THAT(RunFill(SmallCluster(catalog), SmallTrace(), catalog, options),
              StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::sim
