// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/workload_history.h"

#include <chrono>
#include <map>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using ::gpufleet::testing::StatusIs;
using scheduler::TaskShape;
using scheduler::testing::MakeJob;
using ::testing::HasSubstr;

constexpr MonoTime kStart{0};
constexpr Duration kHour = std::chrono::hours(1);

// The target's weight of each (GPU share, GPU count) pair.
std::map<std::pair<int64_t, int>, double> Weights(const WorkloadHistory& history) {
  std::map<std::pair<int64_t, int>, double> out;
  const scheduler::TargetWorkload target = history.Target();
  for (const scheduler::TaskClass& task_class : target.classes()) {
    out[{task_class.shape.gpu_milli, task_class.shape.num_gpus}] += task_class.weight;
  }
  return out;
}

WorkloadHistoryOptions Options(Duration half_life = std::chrono::hours(24), size_t max_shapes = 64,
                               double coverage = 1.0) {
  return {.half_life = half_life, .max_shapes = max_shapes, .coverage = coverage};
}

TEST(WorkloadHistory, EmptyHistoryGivesAnEmptyTarget) {
  WorkloadHistory history(Options());
  EXPECT_TRUE(history.Target().empty());
  // Jobs without GPUs weigh nothing, so they leave the target empty too.
  history.Record(MakeJob("cpu", 4, GpuRequest{}), kStart);
  history.Record(MakeJob("zero", 2, WholeGpus{0}), kStart);
  EXPECT_TRUE(history.empty());
  EXPECT_TRUE(history.Target().empty());
}

TEST(WorkloadHistory, ShapesAreWeightedByTheGpusTheyAskFor) {
  WorkloadHistory history(Options());
  // Four 1-GPU tasks and one task of a 250-milli share against one 8-GPU task: 4 + 0.25 + 8.
  history.Record(MakeJob("small", 4, WholeGpus{1}), kStart);
  history.Record(MakeJob("share", 1, FractionalGpu{250}), kStart);
  history.Record(MakeJob("big", 1, WholeGpus{8}), kStart);
  const auto weights = Weights(history);
  ASSERT_EQ(weights.size(), 3u);
  EXPECT_NEAR((weights.at({1000, 8})), 8 / 12.25, 1e-9);
  EXPECT_NEAR((weights.at({1000, 1})), 4 / 12.25, 1e-9);
  EXPECT_NEAR((weights.at({250, 1})), 0.25 / 12.25, 1e-9);
}

TEST(WorkloadHistory, OldShapesLoseHalfTheirWeightEachHalfLife) {
  WorkloadHistory history(Options(std::chrono::hours(6)));
  history.Record(MakeJob("old", 1, WholeGpus{8}), kStart);
  // Two half-lives later 8 GPUs weigh as 2: equal to a fresh 2-GPU task.
  history.Record(MakeJob("new", 1, WholeGpus{2}), kStart + 12 * kHour);
  auto weights = Weights(history);
  EXPECT_NEAR((weights.at({1000, 8})), 0.5, 1e-9);
  EXPECT_NEAR((weights.at({1000, 2})), 0.5, 1e-9);
  // A record stamped earlier than the last one counts as of the last one: nothing grows.
  history.Record(MakeJob("late", 1, WholeGpus{2}), kStart);
  weights = Weights(history);
  EXPECT_NEAR((weights.at({1000, 2})), 2.0 / 3, 1e-9);
  // Years later the old shapes are forgotten once a new one is recorded.
  history.Record(MakeJob("much-later", 1, WholeGpus{4}), kStart + 24 * 365 * kHour);
  weights = Weights(history);
  ASSERT_EQ(weights.size(), 1u);
  EXPECT_NEAR((weights.at({1000, 4})), 1.0, 1e-9);
}

TEST(WorkloadHistory, CoverageKeepsTheHeaviestShapes) {
  WorkloadHistory history(Options(std::chrono::hours(24), 64, 0.9));
  history.Record(MakeJob("a", 1, WholeGpus{8}), kStart);  // 8 of 8.5
  history.Record(MakeJob("b", 1, FractionalGpu{500}), kStart);
  const auto weights = Weights(history);
  ASSERT_EQ(weights.size(), 1u);
  EXPECT_NEAR((weights.at({1000, 8})), 1.0, 1e-9);
}

TEST(WorkloadHistory, ManyDistinctShapesStayWithinTheCapAndKeepTheirGpus) {
  WorkloadHistory history(Options(std::chrono::hours(24), 8));
  // A hostile stream: 100,000 distinct shapes (every CPU amount), and one common shape.
  for (int i = 0; i < 100000; ++i) {
    history.Record(MakeJob("j", 1, FractionalGpu{100}, {1000 + i, 1024}), kStart);
    if (i % 10 == 0) {
      history.Record(MakeJob("common", 1, WholeGpus{4}, {8000, 1024}), kStart);
    }
    ASSERT_LE(history.size(), 8u);
  }
  // The rare shares merged into each other, not into the 4-GPU shape: 10,000 x 4 GPUs against
  // 100,000 x 0.1 GPU.
  const auto weights = Weights(history);
  ASSERT_EQ(weights.size(), 2u);
  EXPECT_NEAR((weights.at({1000, 4})), 0.8, 1e-6);
  EXPECT_NEAR((weights.at({100, 1})), 0.2, 1e-6);
}

TEST(WorkloadHistory, MigTasksAreLeftOutAndModelsKept) {
  WorkloadHistory history(Options());
  Job job = MakeJob("a100", 2, WholeGpus{1});
  job.allowed_gpu_models = {"A100-80GB"};
  history.Record(job, kStart);
  history.Record(MakeJob("mig", 1, MigGpus{.profile = "1g.10gb"}), kStart);
  const auto target = history.Target();
  ASSERT_EQ(target.classes().size(), 1u);
  EXPECT_EQ(target.classes()[0].shape.gpu_models, std::vector<std::string>{"A100-80GB"});
}

TEST(WorkloadHistoryOptions, BadValuesAreRefusedNamingTheField) {
  EXPECT_THAT(Options(Duration::zero()).Validate(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("half_life")));
  EXPECT_THAT(Options(kHour, 0).Validate(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_shapes")));
  EXPECT_THAT(Options(kHour, 4, 1.5).Validate(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("coverage")));
  EXPECT_OK(WorkloadHistoryOptions{}.Validate());
  EXPECT_TRUE(NeedsTargetWorkload("gpufleet"));
  EXPECT_FALSE(NeedsTargetWorkload("best-fit"));
}

}  // namespace
}  // namespace gpufleet::policy
