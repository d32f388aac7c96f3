// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/task_ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpufleet::fleetsim {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

MonoTime At(int seconds) {
  return MonoTime{int64_t{seconds} * 1'000'000'000};
}

TaskSpan Span(std::string task, std::string node, std::vector<std::string> gpus, int start,
              std::optional<int> end) {
  return {.task_id = std::move(task),
          .node = std::move(node),
          .gpu_uuids = std::move(gpus),
          .start = At(start),
          .end = end.has_value() ? std::optional<MonoTime>(At(*end)) : std::nullopt};
}

TEST(SplitTaskIdTest, TeamScopedAndBareKeys) {
  const TaskIdParts team = SplitTaskId("nlp/bert/workers-3/2");
  EXPECT_EQ(team.job, "nlp/bert");
  EXPECT_EQ(team.task, "workers-3");
  EXPECT_EQ(team.attempt, "2");
  const TaskIdParts bare = SplitTaskId("job-1/main-0/1");
  EXPECT_EQ(bare.job, "job-1");
  EXPECT_EQ(bare.task, "main-0");
  EXPECT_EQ(bare.attempt, "1");
}

TEST(CheckExclusiveUseTest, GpuReusedAfterItsTaskEndedIsFine) {
  const std::vector<TaskSpan> spans = {Span("a/main-0/1", "n0", {"GPU-1"}, 0, 10),
                                       Span("b/main-0/1", "n0", {"GPU-1"}, 10, 20)};
  EXPECT_THAT(CheckExclusiveUse(spans, At(30)), IsEmpty());
}

TEST(CheckExclusiveUseTest, GpuHeldByTwoTasksAtOnce) {
  const std::vector<TaskSpan> spans = {Span("a/main-0/1", "n0", {"GPU-1", "GPU-2"}, 0, 10),
                                       Span("b/main-0/1", "n0", {"GPU-2"}, 9, 20)};
  EXPECT_THAT(CheckExclusiveUse(spans, At(30)),
              ElementsAre(HasSubstr("GPU n0/GPU-2: b/main-0/1 started on n0 at 9.000 s while "
                                    "a/main-0/1 on n0 held it until 10.000 s")));
}

TEST(CheckExclusiveUseTest, SameUuidOnTwoNodesIsTwoGpus) {
  const std::vector<TaskSpan> spans = {Span("a/main-0/1", "n0", {"GPU-1"}, 0, 10),
                                       Span("b/main-0/1", "n1", {"GPU-1"}, 5, 20)};
  EXPECT_THAT(CheckExclusiveUse(spans, At(30)), IsEmpty());
}

TEST(CheckExclusiveUseTest, LiveSpanLastsUntilNow) {
  const std::vector<TaskSpan> spans = {Span("a/main-0/1", "n0", {"GPU-1"}, 0, std::nullopt),
                                       Span("b/main-0/1", "n0", {"GPU-1"}, 25, 26)};
  EXPECT_THAT(CheckExclusiveUse(spans, At(30)), SizeIs(1));
  EXPECT_THAT(CheckExclusiveUse(spans, At(20)), IsEmpty());
}

TEST(CheckExclusiveUseTest, TwoAttemptsOfOneJobAtOnce) {
  const std::vector<TaskSpan> spans = {Span("a/main-0/1", "n0", {"GPU-1"}, 0, 10),
                                       Span("a/main-0/2", "n1", {"GPU-7"}, 5, 20)};
  EXPECT_THAT(CheckExclusiveUse(spans, At(30)),
              ElementsAre(HasSubstr("job a: a/main-0/2 started on n1 at 5.000 s")));
}

TEST(CheckExclusiveUseTest, TasksOfOneAttemptRunTogether) {
  const std::vector<TaskSpan> spans = {Span("a/main-0/1", "n0", {"GPU-1"}, 0, 10),
                                       Span("a/main-1/1", "n1", {"GPU-7"}, 1, 10)};
  EXPECT_THAT(CheckExclusiveUse(spans, At(30)), IsEmpty());
}

TEST(CheckExclusiveUseTest, OneTaskInTwoPlaces) {
  const std::vector<TaskSpan> spans = {Span("a/main-0/1", "n0", {"GPU-1"}, 0, 10),
                                       Span("a/main-0/1", "n1", {"GPU-7"}, 5, 20)};
  EXPECT_THAT(CheckExclusiveUse(spans, At(30)),
              ElementsAre(HasSubstr("task a/main-0/1: a/main-0/1 started on n1")));
}

TEST(CheckGangsWholeTest, PartlyStartedGangPastTheWindow) {
  const std::vector<TaskSpan> spans = {Span("g/main-0/1", "n0", {"GPU-1"}, 0, 200)};
  EXPECT_THAT(
      CheckGangsWhole(spans, {{"g", 2}}, std::chrono::seconds(100), At(300)),
      ElementsAre(HasSubstr("gang g attempt 1: 1 of 2 tasks ran partly started for 200.0 s")));
  EXPECT_THAT(CheckGangsWhole(spans, {{"g", 2}}, std::chrono::seconds(250), At(300)), IsEmpty());
}

TEST(CheckGangsWholeTest, WholeGangStartedWithinTheWindow) {
  const std::vector<TaskSpan> spans = {Span("g/main-0/1", "n0", {"GPU-1"}, 0, 500),
                                       Span("g/main-1/1", "n1", {"GPU-1"}, 30, 500)};
  EXPECT_THAT(CheckGangsWhole(spans, {{"g", 2}}, std::chrono::seconds(60), At(600)), IsEmpty());
  EXPECT_THAT(CheckGangsWhole(spans, {{"g", 2}}, std::chrono::seconds(20), At(600)), SizeIs(1));
}

TEST(TaskLedgerTest, RecordsStartsAndEnds) {
  TaskLedger ledger;
  ledger.Started("a/main-0/1", "n0", {"GPU-1"}, At(1));
  ledger.Started("b/main-0/1", "n1", {"GPU-2"}, At(2));
  ledger.Ended("a/main-0/1", "n0", At(5));
  ledger.Ended("a/main-0/1", "n0", At(9));  // a second report keeps the first end
  EXPECT_EQ(ledger.live(), 1U);
  ledger.EndAllOn("n1", At(7));
  EXPECT_EQ(ledger.live(), 0U);
  ASSERT_THAT(ledger.spans(), SizeIs(2));
  EXPECT_EQ(ledger.spans()[0].end, At(5));
  EXPECT_EQ(ledger.spans()[1].end, At(7));
}

TEST(DriftingClockTest, RunsAtItsRateAndMapsBack) {
  FakeClock base(At(100));
  DriftingClock fast(base, 1.01);
  base.Advance(std::chrono::seconds(100));
  EXPECT_EQ(fast.Now(), At(201));
  EXPECT_EQ(fast.ToBase(fast.Now()), base.Now());
}

TEST(CheckGracesTest, AShortStopOrFenceGraceIsNamedAndAnUnchangedFenceIsRecordedOnce) {
  using std::chrono::seconds;
  TaskLedger ledger;
  ledger.Grace({.node = "node-0", .task_id = "", .grace = seconds(30), .at = At(1)});
  ledger.Grace({.node = "node-0", .task_id = "", .grace = seconds(30), .at = At(2)});
  ledger.Grace({.node = "node-0", .task_id = "a/main-0/1", .grace = seconds(30), .at = At(3)});
  EXPECT_THAT(ledger.graces(), SizeIs(2));
  EXPECT_THAT(CheckGraces(ledger.graces(), seconds(30)), IsEmpty());
  ledger.Grace({.node = "node-1", .task_id = "", .grace = seconds(14), .at = At(4)});
  ledger.Grace({.node = "node-1", .task_id = "b/main-0/1", .grace = seconds(5), .at = At(5)});
  EXPECT_THAT(
      CheckGraces(ledger.graces(), seconds(30)),
      ElementsAre(HasSubstr("node-1 at 4.000 s: the lease's fence with a grace of 14.000 s"),
                  HasSubstr("stop b/main-0/1 with a grace of 5.000 s")));
}

}  // namespace
}  // namespace gpufleet::fleetsim
