// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/autoscaler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::policy {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

// Target 70%, tolerance 10%, 1..10 replicas, no stabilization and no cooldown unless a test
// sets them.
AutoscalerOptions AutoscalerTestOptions() {
  return AutoscalerOptions{.min_replicas = 1,
                           .max_replicas = 10,
                           .target_utilization_milli = 700,
                           .tolerance_milli = 100,
                           .scale_up_stabilization_seconds = 0,
                           .scale_down_stabilization_seconds = 0,
                           .scale_up_cooldown_seconds = 0,
                           .scale_down_cooldown_seconds = 0};
}

Autoscaler MakeAutoscaler(const AutoscalerOptions& options = AutoscalerTestOptions()) {
  Result<Autoscaler> autoscaler = Autoscaler::Create(options);
  EXPECT_OK(autoscaler);
  return std::move(autoscaler).value();
}

// All replicas ready.
ScaleDecision AutoscaleOk(Autoscaler& autoscaler, int64_t now, int replicas, int64_t milli) {
  Result<ScaleDecision> decision = autoscaler.Decide({.now_seconds = now,
                                                      .current_replicas = replicas,
                                                      .ready_replicas = replicas,
                                                      .utilization_milli = milli});
  EXPECT_OK(decision);
  return decision.ok() ? std::move(decision).value() : ScaleDecision{};
}

TEST(AutoscalerOptions, DefaultsAreValid) {
  EXPECT_OK(AutoscalerOptions{}.Validate());
}

TEST(AutoscalerOptions, RejectsEachBadFieldByName) {
  struct Case {
    AutoscalerOptions options;
    const char* message;
  };
  auto with = [](auto change) {
    AutoscalerOptions options = AutoscalerTestOptions();
    change(options);
    return options;
  };
  const Case cases[] = {
      {with([](auto& o) { o.min_replicas = 0; }), "min_replicas: 0"},
      {with([](auto& o) { o.max_replicas = 0; }), "max_replicas: 0 (must be >= min_replicas 1)"},
      {with([](auto& o) { o.target_utilization_milli = 0; }), "target_utilization_milli: 0"},
      {with([](auto& o) { o.target_utilization_milli = 1001; }), "target_utilization_milli: 1001"},
      {with([](auto& o) { o.tolerance_milli = -1; }), "tolerance_milli: -1"},
      {with([](auto& o) { o.tolerance_milli = 1000; }), "tolerance_milli: 1000"},
      {with([](auto& o) { o.scale_up_stabilization_seconds = -1; }),
       "scale_up_stabilization_seconds: -1"},
      {with([](auto& o) { o.scale_down_stabilization_seconds = -2; }),
       "scale_down_stabilization_seconds: -2"},
      {with([](auto& o) { o.scale_up_cooldown_seconds = -3; }), "scale_up_cooldown_seconds: -3"},
      {with([](auto& o) { o.scale_down_cooldown_seconds = -4; }),
       "scale_down_cooldown_seconds: -4"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(c.options.Validate(), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
    EXPECT_THAT(Autoscaler::Create(c.options), StatusIs(StatusCode::kInvalidArgument));
  }
}

TEST(Autoscaler, ScalesUpToCeilOfReadyTimesMeasuredOverTarget) {
  Autoscaler autoscaler = MakeAutoscaler();
  // ceil(4 * 91 / 70) = ceil(5.2) = 6.
  const ScaleDecision decision = AutoscaleOk(autoscaler, 0, 4, 910);
  EXPECT_EQ(decision.recommendation, 6);
  EXPECT_EQ(decision.desired_replicas, 6);
  EXPECT_EQ(decision.reason, "utilization 91% of 4 ready against a target of 70%, needs 6; 4 -> 6");
}

TEST(Autoscaler, ScalesDownToCeilOfReadyTimesMeasuredOverTarget) {
  Autoscaler autoscaler = MakeAutoscaler();
  // ceil(10 * 30 / 70) = ceil(4.29) = 5.
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 10, 300).desired_replicas, 5);
}

TEST(Autoscaler, AtTargetAndInsideTheToleranceBandNothingChanges) {
  Autoscaler autoscaler = MakeAutoscaler();
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 4, 700).desired_replicas, 4);
  // The band is |measured / target - 1| <= 10%: 63% .. 77% for a 70% target, both ends included.
  EXPECT_EQ(AutoscaleOk(autoscaler, 1, 4, 770).desired_replicas, 4);
  EXPECT_EQ(AutoscaleOk(autoscaler, 2, 4, 630).desired_replicas, 4);
  const ScaleDecision inside = AutoscaleOk(autoscaler, 3, 4, 640);
  EXPECT_EQ(inside.desired_replicas, 4);
  EXPECT_THAT(inside.reason, HasSubstr("within the tolerance"));
  EXPECT_EQ(AutoscaleOk(autoscaler, 4, 4, 771).desired_replicas, 5);   // ceil(4.41)
  EXPECT_EQ(AutoscaleOk(autoscaler, 5, 5, 629).desired_replicas, 5);   // ceil(4.49) = 5: no change
  EXPECT_EQ(AutoscaleOk(autoscaler, 6, 10, 629).desired_replicas, 9);  // ceil(8.99)
}

TEST(Autoscaler, ZeroToleranceReactsToAnyDifference) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.tolerance_milli = 0;
  Autoscaler autoscaler = MakeAutoscaler(options);
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 7, 700).desired_replicas, 7);
  EXPECT_EQ(AutoscaleOk(autoscaler, 1, 7, 701).desired_replicas, 8);
}

TEST(Autoscaler, ZeroUtilizationScalesDownToTheMinimum) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.min_replicas = 2;
  Autoscaler autoscaler = MakeAutoscaler(options);
  const ScaleDecision decision = AutoscaleOk(autoscaler, 0, 8, 0);
  EXPECT_EQ(decision.recommendation, 2);
  EXPECT_EQ(decision.desired_replicas, 2);
  EXPECT_THAT(decision.reason, HasSubstr("needs 0 (bounded to 2..10)"));
}

TEST(Autoscaler, ClampsToTheMaximum) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.target_utilization_milli = 500;
  Autoscaler autoscaler = MakeAutoscaler(options);
  const ScaleDecision decision = AutoscaleOk(autoscaler, 0, 8, 1000);
  EXPECT_EQ(decision.desired_replicas, 10);
  EXPECT_THAT(decision.reason, HasSubstr("needs 16 (bounded to 1..10)"));
  // Saturated at the maximum: stays there.
  EXPECT_EQ(AutoscaleOk(autoscaler, 60, 10, 1000).desired_replicas, 10);
}

TEST(Autoscaler, CountOutsideTheBoundsIsBroughtBackEvenInACooldown) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.min_replicas = 3;
  options.max_replicas = 6;
  options.scale_up_cooldown_seconds = 600;
  options.scale_down_cooldown_seconds = 600;
  Autoscaler autoscaler = MakeAutoscaler(options);
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 4, 1000).desired_replicas, 6);  // starts the cooldown
  EXPECT_EQ(AutoscaleOk(autoscaler, 10, 9, 700).desired_replicas, 6);
  EXPECT_EQ(AutoscaleOk(autoscaler, 20, 1, 700).desired_replicas, 3);
}

TEST(Autoscaler, StartingReplicasAreNotCountedTwice) {
  Autoscaler autoscaler = MakeAutoscaler();
  ASSERT_EQ(AutoscaleOk(autoscaler, 0, 4, 1000).desired_replicas, 6);  // ceil(5.71)
  // Two replicas are starting; the four ready ones are still saturated: ceil(4 * 100 / 70) = 6
  // is covered by the replicas on their way.
  Result<ScaleDecision> waiting = autoscaler.Decide(
      {.now_seconds = 60, .current_replicas = 6, .ready_replicas = 4, .utilization_milli = 1000});
  ASSERT_OK(waiting);
  EXPECT_EQ(waiting->desired_replicas, 6);
  // Below the target, the count follows what the ready replicas need; the starting ones go.
  Result<ScaleDecision> light = autoscaler.Decide(
      {.now_seconds = 61, .current_replicas = 6, .ready_replicas = 4, .utilization_milli = 600});
  ASSERT_OK(light);
  EXPECT_EQ(light->desired_replicas, 4);  // ceil(4 * 60 / 70) = 4
}

TEST(Autoscaler, NothingReadyHoldsTheCountWithinBounds) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.min_replicas = 2;
  Autoscaler autoscaler = MakeAutoscaler(options);
  Result<ScaleDecision> starting = autoscaler.Decide(
      {.now_seconds = 0, .current_replicas = 5, .ready_replicas = 0, .utilization_milli = 0});
  ASSERT_OK(starting);
  EXPECT_EQ(starting->desired_replicas, 5);
  EXPECT_THAT(starting->reason, HasSubstr("no ready replica"));
  Result<ScaleDecision> none = autoscaler.Decide(
      {.now_seconds = 1, .current_replicas = 0, .ready_replicas = 0, .utilization_milli = 0});
  ASSERT_OK(none);
  EXPECT_EQ(none->desired_replicas, 2);
}

TEST(Autoscaler, ScaleDownGoesToTheHighestRecommendationOfTheWindow) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.scale_down_stabilization_seconds = 300;
  Autoscaler autoscaler = MakeAutoscaler(options);
  // Recommendations 10 at t=0 (the count found), then 8, 6, 5 a minute apart.
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 10, 700).desired_replicas, 10);
  EXPECT_EQ(AutoscaleOk(autoscaler, 60, 10, 540).desired_replicas, 10);   // ceil(7.71) = 8
  EXPECT_EQ(AutoscaleOk(autoscaler, 120, 10, 400).desired_replicas, 10);  // ceil(5.71) = 6
  const ScaleDecision held = AutoscaleOk(autoscaler, 180, 10, 330);       // ceil(4.71) = 5
  EXPECT_EQ(held.recommendation, 5);
  EXPECT_EQ(held.desired_replicas, 10);
  EXPECT_THAT(held.reason, HasSubstr("scale-down held at 10 by the 5m stabilization window"));
  // t=300: the window (0, 300] has lost t=0's 10; the highest left is 8.
  EXPECT_EQ(AutoscaleOk(autoscaler, 300, 10, 330).desired_replicas, 8);
  EXPECT_EQ(AutoscaleOk(autoscaler, 360, 8, 410).desired_replicas, 6);  // 8 left the window
  EXPECT_EQ(AutoscaleOk(autoscaler, 420, 6, 550).desired_replicas, 5);
}

TEST(Autoscaler, ScaleUpIsImmediateDespiteTheScaleDownWindow) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.scale_down_stabilization_seconds = 300;
  Autoscaler autoscaler = MakeAutoscaler(options);
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 4, 700).desired_replicas, 4);
  EXPECT_EQ(AutoscaleOk(autoscaler, 15, 4, 1000).desired_replicas, 6);
}

TEST(Autoscaler, ScaleUpWindowWaitsForASustainedRise) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.scale_up_stabilization_seconds = 120;
  Autoscaler autoscaler = MakeAutoscaler(options);
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 4, 700).desired_replicas, 4);
  const ScaleDecision held = AutoscaleOk(autoscaler, 60, 4, 1000);
  EXPECT_EQ(held.recommendation, 6);
  EXPECT_EQ(held.desired_replicas, 4);
  EXPECT_THAT(held.reason, HasSubstr("scale-up held at 4 by the 2m stabilization window"));
  EXPECT_EQ(AutoscaleOk(autoscaler, 120, 4, 1000).desired_replicas, 6);
}

TEST(Autoscaler, CooldownsAreSeparateForUpAndDown) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.scale_up_cooldown_seconds = 120;
  options.scale_down_cooldown_seconds = 600;
  Autoscaler autoscaler = MakeAutoscaler(options);
  EXPECT_EQ(AutoscaleOk(autoscaler, 0, 4, 1000).desired_replicas, 6);
  const ScaleDecision held = AutoscaleOk(autoscaler, 60, 6, 1000);
  EXPECT_EQ(held.recommendation, 9);
  EXPECT_EQ(held.desired_replicas, 6);
  EXPECT_THAT(held.reason, HasSubstr("scale-up to 9 waits 1m for the cooldown"));
  EXPECT_EQ(AutoscaleOk(autoscaler, 120, 6, 1000).desired_replicas, 9);
  // Down: 600 s after the last change (t=120).
  EXPECT_EQ(AutoscaleOk(autoscaler, 300, 9, 100).desired_replicas, 9);
  EXPECT_EQ(AutoscaleOk(autoscaler, 719, 9, 100).desired_replicas, 9);
  EXPECT_EQ(AutoscaleOk(autoscaler, 720, 9, 100).desired_replicas, 2);
}

TEST(Autoscaler, FlappingInputIsDampedByTheScaleDownWindow) {
  AutoscalerOptions options = AutoscalerTestOptions();
  options.scale_down_stabilization_seconds = 300;
  Autoscaler autoscaler = MakeAutoscaler(options);
  // Utilization alternates between 90% and 40% every 15 s: the count steps up, never down.
  int replicas = 4;
  int changes = 0;
  for (int64_t t = 0; t < 1800; t += 15) {
    const int64_t milli = (t / 15) % 2 == 0 ? 900 : 400;
    const int desired = AutoscaleOk(autoscaler, t, replicas, milli).desired_replicas;
    EXPECT_GE(desired, replicas) << "at t=" << t;
    changes += desired != replicas ? 1 : 0;
    replicas = desired;
  }
  // 4 -> 6 -> 8 -> 10: a handful of changes in 120 decisions.
  EXPECT_EQ(replicas, 10);
  EXPECT_EQ(changes, 3);
}

TEST(Autoscaler, WithoutAWindowFlappingInputFlaps) {
  Autoscaler autoscaler = MakeAutoscaler();
  int replicas = 4;
  int changes = 0;
  for (int64_t t = 0; t < 300; t += 15) {
    const int64_t milli = replicas == 4 ? 900 : 400;
    const int desired = AutoscaleOk(autoscaler, t, replicas, milli).desired_replicas;
    changes += desired != replicas ? 1 : 0;
    replicas = desired;
  }
  EXPECT_EQ(changes, 20);  // 4 -> 6 -> 4 -> ... on every decision
}

TEST(Autoscaler, IsDeterministic) {
  auto run = [] {
    AutoscalerOptions options = AutoscalerTestOptions();
    options.scale_down_stabilization_seconds = 120;
    options.scale_up_cooldown_seconds = 30;
    Autoscaler autoscaler = MakeAutoscaler(options);
    std::vector<ScaleDecision> decisions;
    int replicas = 3;
    for (int64_t t = 0; t < 600; t += 20) {
      decisions.push_back(AutoscaleOk(autoscaler, t, replicas, (t * 37) % 1001));
      replicas = decisions.back().desired_replicas;
    }
    return decisions;
  };
  EXPECT_EQ(run(), run());
}

TEST(Autoscaler, RejectsBadInputByName) {
  Autoscaler autoscaler = MakeAutoscaler();
  EXPECT_THAT(autoscaler.Decide({.now_seconds = 0, .current_replicas = -1}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("current_replicas: -1")));
  EXPECT_THAT(autoscaler.Decide({.now_seconds = 0, .current_replicas = 2, .ready_replicas = 3}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("ready_replicas: 3")));
  EXPECT_THAT(autoscaler.Decide({.now_seconds = 0,
                                 .current_replicas = 2,
                                 .ready_replicas = 2,
                                 .utilization_milli = 1200}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("utilization_milli: 1200")));
  ASSERT_OK(autoscaler.Decide({.now_seconds = 100, .current_replicas = 2, .ready_replicas = 2}));
  EXPECT_THAT(autoscaler.Decide({.now_seconds = 99, .current_replicas = 2, .ready_replicas = 2}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("now_seconds: 99")));
}

}  // namespace
}  // namespace gpufleet::policy
