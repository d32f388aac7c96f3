// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/job_lifecycle.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::control {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

Json RunningJob(int tasks) {
  Json job = {{"name", "train"}, {"state", "Running"}, {"placements", Json::array()}};
  for (int i = 0; i < tasks; ++i) {
    job["placements"].push_back(
        {{"task", "workers-" + std::to_string(i)}, {"node", "n1"}, {"phase", "Running"}});
  }
  return job;
}

TEST(JobState, NamesRoundTripAndUnknownIsRefused) {
  for (const JobState state : kJobStates) {
    EXPECT_EQ(ParseJobState(JobStateName(state)), state);
  }
  EXPECT_EQ(ParseJobState("Terminating"), std::nullopt);
  EXPECT_THAT(JobStateNames(), HasSubstr("Stopping"));
}

TEST(JobState, StoppingHoldsResourcesButIsNoLongerWanted) {
  EXPECT_TRUE(HoldsResources(JobState::kStopping));
  EXPECT_FALSE(RunIsWanted(JobState::kStopping));
  EXPECT_TRUE(RunIsWanted(JobState::kRunning));
  EXPECT_FALSE(HoldsResources(JobState::kPreempted));
  EXPECT_TRUE(IsFinished(JobState::kCancelled));
  EXPECT_FALSE(IsFinished(JobState::kStopping));
}

TEST(EndRun, AJobWithLiveTasksStopsAndKeepsItsPlacements) {
  Json job = RunningJob(3);
  const Result<std::string> event = EndRun(job, JobState::kCancelled, "cancelled by alice", "t0");
  ASSERT_OK(event.status());
  EXPECT_THAT(*event, HasSubstr("Stopping, then Cancelled"));
  EXPECT_EQ(job["state"], "Stopping");
  EXPECT_EQ(job["placements"].size(), 3u);
  EXPECT_EQ(job["stopping"]["then"], "Cancelled");
  EXPECT_EQ(job["stopping"]["since"], "t0");
  EXPECT_EQ(DescribeStopping(job), "3 of 3 tasks still running");
  EXPECT_EQ(FinishStoppingIfDone(job), std::nullopt);

  MarkPlacementGone(job["placements"][0], "not running on n1");
  job["placements"][1]["phase"] = "Failed";
  EXPECT_EQ(DescribeStopping(job), "1 of 3 tasks still running");
  EXPECT_EQ(FinishStoppingIfDone(job), std::nullopt);
  EXPECT_EQ(job["state"], "Stopping");

  MarkPlacementGone(job["placements"][2], "node n1 lost");
  const std::optional<std::string> finished = FinishStoppingIfDone(job);
  ASSERT_TRUE(finished.has_value());
  EXPECT_THAT(*finished, HasSubstr("now Cancelled"));
  EXPECT_EQ(job["state"], "Cancelled");
  EXPECT_EQ(job["reason"], "cancelled by alice");
  EXPECT_TRUE(job["placements"].empty());
  EXPECT_FALSE(job.contains("stopping"));
}

TEST(EndRun, AJobWhoseTasksAllEndedTakesTheEndStateAtOnce) {
  Json job = RunningJob(2);
  job["placements"][0]["phase"] = "Succeeded";
  job["placements"][1]["phase"] = "Succeeded";
  ASSERT_OK(EndRun(job, JobState::kSucceeded, "every task exited with code 0", "").status());
  EXPECT_EQ(job["state"], "Succeeded");
  EXPECT_TRUE(job["placements"].empty());
}

TEST(EndRun, ACancelOverridesTheRequeueOfAStoppingJob) {
  Json job = RunningJob(1);
  ASSERT_OK(EndRun(job, JobState::kPending, "requeued: node n1 is NotReady", "").status());
  ASSERT_OK(EndRun(job, JobState::kCancelled, "cancelled by bob", "").status());
  EXPECT_EQ(job["stopping"]["then"], "Cancelled");
  MarkPlacementGone(job["placements"][0], "gone");
  ASSERT_TRUE(FinishStoppingIfDone(job).has_value());
  EXPECT_EQ(job["state"], "Cancelled");
}

TEST(EndRun, RefusesJobsWithoutARunAndStatesThatEndNoRun) {
  Json pending = {{"name", "p"}, {"state", "Pending"}};
  EXPECT_THAT(EndRun(pending, JobState::kCancelled, "x", "").status(),
              StatusIs(StatusCode::kFailedPrecondition));
  Json running = RunningJob(1);
  EXPECT_THAT(EndRun(running, JobState::kRunning, "x", "").status(),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(running["state"], "Running");
}

TEST(TransitionJob, AllowsOnlyThePlainTransitions) {
  Json job = {{"name", "j"}, {"state", "Pending"}};
  ASSERT_OK(TransitionJob(job, JobState::kScheduled, "").status());
  ASSERT_OK(TransitionJob(job, JobState::kRunning, "").status());
  // A running job is never cancelled without stopping its tasks.
  EXPECT_THAT(TransitionJob(job, JobState::kCancelled, "x").status(),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_THAT(TransitionJob(job, JobState::kPending, "x").status(),
              StatusIs(StatusCode::kFailedPrecondition));
  EXPECT_EQ(job["state"], "Running");
  Json preempted = {{"name", "v"}, {"state", "Preempted"}};
  const Result<std::string> event = TransitionJob(preempted, JobState::kPending, "requeued");
  ASSERT_OK(event.status());
  EXPECT_EQ(*event, "Pending: requeued");
}

TEST(FinishStoppingIfDone, AStopRecordThatDoesNotParseEndsAsAFailure) {
  Json job = {{"name", "j"},
              {"state", "Stopping"},
              {"stopping", {{"then", "Bogus"}}},
              {"placements", Json::array()}};
  ASSERT_TRUE(FinishStoppingIfDone(job).has_value());
  EXPECT_EQ(job["state"], "Failed");
}

TEST(DescribeStopping, SaysHowManyTasksRunAndWhenSigkillComes) {
  Json job = RunningJob(8);
  ASSERT_OK(
      EndRun(job, JobState::kCancelled, "cancelled by alice", "2026-12-01T10:00:00Z").status());
  for (int i = 0; i < 5; ++i) {
    MarkPlacementGone(job["placements"][i], "gone");
  }
  const Result<int64_t> since = ParseRfc3339("2026-12-01T10:00:00Z");
  ASSERT_OK(since);
  EXPECT_EQ(FormatRfc3339(*since), "2026-12-01T10:00:00Z");
  EXPECT_EQ(DescribeStopping(job, *since + int64_t{12'000'000'000}, std::chrono::seconds(30)),
            "3 of 8 tasks still running; SIGTERM sent 12s ago, SIGKILL at 30s");
  EXPECT_EQ(DescribeStopping(job), "3 of 8 tasks still running");
  EXPECT_FALSE(ParseRfc3339("yesterday").ok());
  EXPECT_FALSE(ParseRfc3339("2026-13-01T10:00:00Z").ok());
}

TEST(PartlyStartedGang, OnlyAGangSomeOfWhoseTasksStartedAndNamesAFewOfTheOthers) {
  Json job = {{"placements", Json::array()}};
  for (int i = 0; i < 21; ++i) {
    job["placements"].push_back({{"task", fmt::format("w-{}", i)}, {"node", "node-a"}});
  }
  EXPECT_EQ(PartlyStartedGang(job), std::nullopt) << "none started";
  job["placements"][0]["phase"] = "Running";
  job["placements"][1]["phase"] = "Waiting";
  const std::optional<std::string> why = PartlyStartedGang(job);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(*why,
            "1 of 21 tasks started; not started: w-1 on node-a (Waiting), w-2 on node-a (not "
            "reported), w-3 on node-a (not reported), w-4 on node-a (not reported), w-5 on node-a "
            "(not reported), w-6 on node-a (not reported), w-7 on node-a (not reported), w-8 on "
            "node-a (not reported) and 12 more");
  for (Json& placement : job["placements"]) {
    placement["phase"] = "Succeeded";
  }
  EXPECT_EQ(PartlyStartedGang(job), std::nullopt) << "all started";
}

}  // namespace
}  // namespace gpufleet::control
