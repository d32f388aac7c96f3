// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/idle_reclaim.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::policy {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kMinute = 60;

// 10% threshold, 30 minutes idle, 15 minutes warning, samples at most 5 minutes apart.
IdleReclaimOptions TestOptions() {
  return IdleReclaimOptions{.threshold_milli = 100,
                            .idle_seconds = 30 * kMinute,
                            .warning_seconds = 15 * kMinute,
                            .max_sample_gap_seconds = 5 * kMinute,
                            .action = ReclaimAction::kSuspend};
}

IdleReclaimer MakeReclaimer(const IdleReclaimOptions& options = TestOptions()) {
  Result<IdleReclaimer> reclaimer = IdleReclaimer::Create(options);
  EXPECT_OK(reclaimer);
  return std::move(reclaimer).value();
}

// One sample a minute of `milli` for `job` over [from, to] (seconds, inclusive).
void Feed(IdleReclaimer& reclaimer, const JobId& job, int64_t from, int64_t to, int64_t milli) {
  for (int64_t t = from; t <= to; t += kMinute) {
    ASSERT_OK(reclaimer.Observe(job, t, milli));
  }
}

std::vector<ReclaimEvent> DecideOk(IdleReclaimer& reclaimer, int64_t now, int pending) {
  Result<std::vector<ReclaimEvent>> events = reclaimer.Decide(now, pending);
  EXPECT_OK(events);
  return events.ok() ? std::move(events).value() : std::vector<ReclaimEvent>{};
}

IdleState StateOf(const IdleReclaimer& reclaimer, const JobId& job) {
  Result<IdleJobStatus> status = reclaimer.Describe(job);
  EXPECT_OK(status);
  return status.ok() ? status->state : IdleState::kIgnored;
}

TEST(IdleReclaimOptions, DefaultsAreValid) {
  EXPECT_OK(IdleReclaimOptions{}.Validate());
}

TEST(IdleReclaimOptions, RejectsEachBadFieldByName) {
  struct Case {
    IdleReclaimOptions options;
    const char* message;
  };
  auto with = [](auto change) {
    IdleReclaimOptions options = TestOptions();
    change(options);
    return options;
  };
  const Case cases[] = {
      {with([](auto& o) { o.threshold_milli = 0; }), "threshold_milli: 0"},
      {with([](auto& o) { o.threshold_milli = 1001; }), "threshold_milli: 1001"},
      {with([](auto& o) { o.idle_seconds = 0; }), "idle_seconds: 0"},
      {with([](auto& o) { o.warning_seconds = -5; }), "warning_seconds: -5"},
      {with([](auto& o) { o.max_sample_gap_seconds = 0; }), "max_sample_gap_seconds: 0"},
      {with([](auto& o) { o.action = static_cast<ReclaimAction>(7); }), "action: 7"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(c.options.Validate(), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
    EXPECT_THAT(IdleReclaimer::Create(c.options), StatusIs(StatusCode::kInvalidArgument));
  }
}

TEST(IdleReclaimOptions, ParsesActions) {
  EXPECT_EQ(ParseReclaimAction("suspend").value(), ReclaimAction::kSuspend);
  EXPECT_EQ(ParseReclaimAction("preempt").value(), ReclaimAction::kPreempt);
  EXPECT_THAT(ParseReclaimAction("kill"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"kill\"")));
}

TEST(IdleReclaimer, WarnsThenReclaimsAnIdleNotebookWhileJobsWait) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  const int64_t start = 13 * 3600 + 20 * kMinute;  // 13:20
  Feed(reclaimer, nb, start, start + 29 * kMinute, 50);
  EXPECT_THAT(DecideOk(reclaimer, start + 29 * kMinute, 12), IsEmpty());

  Feed(reclaimer, nb, start + 30 * kMinute, start + 30 * kMinute, 50);
  const std::vector<ReclaimEvent> warn = DecideOk(reclaimer, start + 30 * kMinute, 12);
  ASSERT_EQ(warn.size(), 1U);
  EXPECT_EQ(warn[0].kind, ReclaimEventKind::kWarn);
  EXPECT_EQ(warn[0].job, nb);
  EXPECT_EQ(warn[0].deadline_seconds, start + 45 * kMinute);
  EXPECT_EQ(warn[0].reason,
            "GPUs under 10% for 30m while 12 jobs wait; will be suspended at 14:05 unless used");
  EXPECT_EQ(StateOf(reclaimer, nb), IdleState::kWarned);
  EXPECT_EQ(reclaimer.Describe(nb)->last_reason, warn[0].reason);

  Feed(reclaimer, nb, start + 31 * kMinute, start + 44 * kMinute, 80);
  EXPECT_THAT(DecideOk(reclaimer, start + 44 * kMinute, 12), IsEmpty());
  Feed(reclaimer, nb, start + 45 * kMinute, start + 45 * kMinute, 80);
  const std::vector<ReclaimEvent> reclaim = DecideOk(reclaimer, start + 45 * kMinute, 3);
  ASSERT_EQ(reclaim.size(), 1U);
  EXPECT_EQ(reclaim[0].kind, ReclaimEventKind::kReclaim);
  EXPECT_EQ(reclaim[0].action, ReclaimAction::kSuspend);
  EXPECT_EQ(reclaim[0].reason, "GPUs under 10% for 45m while 3 jobs waited; suspended");
  EXPECT_EQ(StateOf(reclaimer, nb), IdleState::kReclaimed);
}

TEST(IdleReclaimer, PreemptActionAndOneWaitingJobAreWordedAsSuch) {
  IdleReclaimOptions options = TestOptions();
  options.action = ReclaimAction::kPreempt;
  options.threshold_milli = 125;
  options.warning_seconds = 15 * kMinute + 30;
  IdleReclaimer reclaimer = MakeReclaimer(options);
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 30 * kMinute, 0);
  const std::vector<ReclaimEvent> warn = DecideOk(reclaimer, 30 * kMinute, 1);
  ASSERT_EQ(warn.size(), 1U);
  // The deadline 00:45:30 is shown rounded up, never earlier than the real one.
  EXPECT_EQ(warn[0].reason,
            "GPUs under 12.5% for 30m while 1 job waits; will be preempted at 00:46 unless used");
  Feed(reclaimer, nb, 31 * kMinute, 46 * kMinute, 0);
  const std::vector<ReclaimEvent> reclaim = DecideOk(reclaimer, 46 * kMinute, 1);
  ASSERT_EQ(reclaim.size(), 1U);
  EXPECT_EQ(reclaim[0].action, ReclaimAction::kPreempt);
  EXPECT_EQ(reclaim[0].reason, "GPUs under 12.5% for 46m while 1 job waited; preempted");
}

TEST(IdleReclaimer, ASampleExactlyAtTheThresholdCountsAsBusy) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId at("at");
  const JobId below("below");
  ASSERT_OK(reclaimer.Track(at, JobKind::kInteractive));
  ASSERT_OK(reclaimer.Track(below, JobKind::kInteractive));
  Feed(reclaimer, at, 0, 40 * kMinute, 100);
  Feed(reclaimer, below, 0, 40 * kMinute, 99);
  EXPECT_THAT(DecideOk(reclaimer, 40 * kMinute, 5),
              ElementsAre(AllOf(Field(&ReclaimEvent::job, below),
                                Field(&ReclaimEvent::kind, ReclaimEventKind::kWarn))));
  EXPECT_EQ(StateOf(reclaimer, at), IdleState::kWatching);
}

TEST(IdleReclaimer, IdlePeriodIsMeasuredFromTheFirstIdleSampleAndEndsInclusive) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 10 * kMinute, 700);
  Feed(reclaimer, nb, 11 * kMinute, 41 * kMinute, 20);
  EXPECT_THAT(DecideOk(reclaimer, 41 * kMinute - 1, 2), IsEmpty());
  EXPECT_EQ(reclaimer.Describe(nb)->idle_since_seconds, 11 * kMinute);
  EXPECT_THAT(DecideOk(reclaimer, 41 * kMinute, 2),
              ElementsAre(Field(&ReclaimEvent::kind, ReclaimEventKind::kWarn)));
}

TEST(IdleReclaimer, NotebookThatWakesUpDuringItsWarningIsWithdrawnAndStartsOver) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 30 * kMinute, 10);
  ASSERT_EQ(DecideOk(reclaimer, 30 * kMinute, 4).size(), 1U);
  Feed(reclaimer, nb, 31 * kMinute, 35 * kMinute, 10);
  Feed(reclaimer, nb, 36 * kMinute, 36 * kMinute, 640);
  const std::vector<ReclaimEvent> withdrawn = DecideOk(reclaimer, 37 * kMinute, 4);
  ASSERT_EQ(withdrawn.size(), 1U);
  EXPECT_EQ(withdrawn[0].kind, ReclaimEventKind::kWithdraw);
  EXPECT_EQ(withdrawn[0].reason, "GPUs busy again (64% at 00:36); warning withdrawn");
  EXPECT_EQ(StateOf(reclaimer, nb), IdleState::kWatching);
  // Idle again: no reclaim at the old deadline, a new warning only after a full idle period.
  Feed(reclaimer, nb, 37 * kMinute, 66 * kMinute, 10);
  EXPECT_THAT(DecideOk(reclaimer, 66 * kMinute, 4), IsEmpty());
  Feed(reclaimer, nb, 67 * kMinute, 67 * kMinute, 10);
  EXPECT_THAT(DecideOk(reclaimer, 67 * kMinute, 4),
              ElementsAre(Field(&ReclaimEvent::kind, ReclaimEventKind::kWarn)));
}

TEST(IdleReclaimer, BusyBlipBetweenDecisionsStillWithdrawsTheWarning) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 30 * kMinute, 10);
  ASSERT_EQ(DecideOk(reclaimer, 30 * kMinute, 4).size(), 1U);
  Feed(reclaimer, nb, 31 * kMinute, 33 * kMinute, 10);
  Feed(reclaimer, nb, 34 * kMinute, 34 * kMinute, 900);
  Feed(reclaimer, nb, 35 * kMinute, 45 * kMinute, 10);
  const std::vector<ReclaimEvent> events = DecideOk(reclaimer, 45 * kMinute, 4);
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, ReclaimEventKind::kWithdraw);
  EXPECT_EQ(events[0].reason, "GPUs busy again (90% at 00:34); warning withdrawn");
}

TEST(IdleReclaimer, NoWarningWhileNothingWaits) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 3 * 60 * kMinute, 0);
  EXPECT_THAT(DecideOk(reclaimer, 3 * 60 * kMinute, 0), IsEmpty());
  EXPECT_EQ(StateOf(reclaimer, nb), IdleState::kWatching);
}

TEST(IdleReclaimer, QueueThatEmptiesWithdrawsTheWarningAndRefillingWarnsAgainAfresh) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 30 * kMinute, 0);
  ASSERT_EQ(DecideOk(reclaimer, 30 * kMinute, 2).size(), 1U);
  Feed(reclaimer, nb, 31 * kMinute, 40 * kMinute, 0);
  const std::vector<ReclaimEvent> withdrawn = DecideOk(reclaimer, 40 * kMinute, 0);
  ASSERT_EQ(withdrawn.size(), 1U);
  EXPECT_EQ(withdrawn[0].kind, ReclaimEventKind::kWithdraw);
  EXPECT_EQ(withdrawn[0].reason, "no jobs wait for GPUs any more; warning withdrawn");
  // Past the old deadline: still idle, the queue refills, the owner gets a full new warning.
  Feed(reclaimer, nb, 41 * kMinute, 50 * kMinute, 0);
  const std::vector<ReclaimEvent> again = DecideOk(reclaimer, 50 * kMinute, 1);
  ASSERT_EQ(again.size(), 1U);
  EXPECT_EQ(again[0].kind, ReclaimEventKind::kWarn);
  EXPECT_EQ(again[0].deadline_seconds, 65 * kMinute);
  Feed(reclaimer, nb, 51 * kMinute, 64 * kMinute, 0);
  EXPECT_THAT(DecideOk(reclaimer, 64 * kMinute, 1), IsEmpty());
}

TEST(IdleReclaimer, GapInSamplesRestartsTheIdleTime) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 20 * kMinute, 0);
  // Six minutes without a sample (more than the 5 minute gap): the run starts again at 26m.
  Feed(reclaimer, nb, 26 * kMinute, 55 * kMinute, 0);
  EXPECT_EQ(reclaimer.Describe(nb)->idle_since_seconds, 26 * kMinute);
  EXPECT_THAT(DecideOk(reclaimer, 55 * kMinute, 1), IsEmpty());
  Feed(reclaimer, nb, 56 * kMinute, 56 * kMinute, 0);
  EXPECT_THAT(DecideOk(reclaimer, 56 * kMinute, 1),
              ElementsAre(Field(&ReclaimEvent::kind, ReclaimEventKind::kWarn)));
}

TEST(IdleReclaimer, ASampleExactlyOneGapApartKeepsTheRun) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  for (int64_t t = 0; t <= 30 * kMinute; t += 5 * kMinute) {
    ASSERT_OK(reclaimer.Observe(nb, t, 0));
  }
  EXPECT_EQ(reclaimer.Describe(nb)->idle_since_seconds, 0);
  EXPECT_THAT(DecideOk(reclaimer, 35 * kMinute, 1),
              ElementsAre(Field(&ReclaimEvent::kind, ReclaimEventKind::kWarn)));
}

TEST(IdleReclaimer, StaleSamplesNeverLeadToAReclaim) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 30 * kMinute, 0);
  ASSERT_EQ(DecideOk(reclaimer, 30 * kMinute, 1).size(), 1U);
  Feed(reclaimer, nb, 31 * kMinute, 40 * kMinute, 0);
  // The agent stops reporting: at the deadline the latest sample is 10 minutes old.
  const std::vector<ReclaimEvent> events = DecideOk(reclaimer, 50 * kMinute, 1);
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, ReclaimEventKind::kWithdraw);
  EXPECT_EQ(events[0].reason, "no utilization sample since 00:40; warning withdrawn");
  // Samples resume idle after the gap: the idle time starts again from them.
  Feed(reclaimer, nb, 51 * kMinute, 60 * kMinute, 0);
  EXPECT_THAT(DecideOk(reclaimer, 60 * kMinute, 1), IsEmpty());
  EXPECT_EQ(reclaimer.Describe(nb)->idle_since_seconds, 51 * kMinute);
}

TEST(IdleReclaimer, GapDuringTheWarningWithdrawsItEvenWhenSamplesResumeIdle) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 30 * kMinute, 0);
  ASSERT_EQ(DecideOk(reclaimer, 30 * kMinute, 1).size(), 1U);
  Feed(reclaimer, nb, 31 * kMinute, 32 * kMinute, 0);
  Feed(reclaimer, nb, 39 * kMinute, 45 * kMinute, 0);
  const std::vector<ReclaimEvent> events = DecideOk(reclaimer, 45 * kMinute, 1);
  ASSERT_EQ(events.size(), 1U);
  EXPECT_EQ(events[0].kind, ReclaimEventKind::kWithdraw);
  EXPECT_EQ(events[0].reason, "no utilization samples between 00:32 and 00:39; warning withdrawn");
}

TEST(IdleReclaimer, JobWithoutSamplesIsNeverIdle) {
  IdleReclaimer reclaimer = MakeReclaimer();
  ASSERT_OK(reclaimer.Track(JobId("nb"), JobKind::kInteractive));
  EXPECT_THAT(DecideOk(reclaimer, 10 * 3600, 10), IsEmpty());
}

TEST(IdleReclaimer, ReclaimedJobGetsNoMoreEventsUntilTrackedAgain) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  Feed(reclaimer, nb, 0, 30 * kMinute, 0);
  ASSERT_EQ(DecideOk(reclaimer, 30 * kMinute, 1).size(), 1U);
  Feed(reclaimer, nb, 31 * kMinute, 45 * kMinute, 0);
  ASSERT_EQ(DecideOk(reclaimer, 45 * kMinute, 1).size(), 1U);
  // Late samples of the reclaimed job are dropped, and it is not reclaimed twice.
  Feed(reclaimer, nb, 46 * kMinute, 120 * kMinute, 0);
  EXPECT_THAT(DecideOk(reclaimer, 120 * kMinute, 1), IsEmpty());
  EXPECT_EQ(StateOf(reclaimer, nb), IdleState::kReclaimed);
  // It resumes: watched afresh, with no idle time carried over.
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  EXPECT_EQ(StateOf(reclaimer, nb), IdleState::kWatching);
  EXPECT_EQ(reclaimer.Describe(nb)->idle_since_seconds, std::nullopt);
  Feed(reclaimer, nb, 121 * kMinute, 150 * kMinute, 0);
  EXPECT_THAT(DecideOk(reclaimer, 150 * kMinute, 1), IsEmpty());
  EXPECT_THAT(DecideOk(reclaimer, 151 * kMinute, 1),
              ElementsAre(Field(&ReclaimEvent::kind, ReclaimEventKind::kWarn)));
}

TEST(IdleReclaimer, NonInteractiveJobsAreIgnored) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId batch("batch");
  const JobId serving("serving");
  ASSERT_OK(reclaimer.Track(batch, JobKind::kBatch));
  ASSERT_OK(reclaimer.Track(serving, JobKind::kInference));
  Feed(reclaimer, batch, 0, 120 * kMinute, 0);
  Feed(reclaimer, serving, 0, 120 * kMinute, 0);
  EXPECT_THAT(DecideOk(reclaimer, 120 * kMinute, 50), IsEmpty());
  EXPECT_EQ(StateOf(reclaimer, batch), IdleState::kIgnored);
  EXPECT_EQ(StateOf(reclaimer, serving), IdleState::kIgnored);
}

TEST(IdleReclaimer, EventsAreOrderedByJobAndReproducible) {
  auto run = [] {
    IdleReclaimer reclaimer = MakeReclaimer();
    for (const char* name : {"nb-c", "nb-a", "nb-b"}) {
      EXPECT_OK(reclaimer.Track(JobId(name), JobKind::kInteractive));
      Feed(reclaimer, JobId(name), 0, 30 * kMinute, 0);
    }
    return DecideOk(reclaimer, 30 * kMinute, 3);
  };
  const std::vector<ReclaimEvent> first = run();
  ASSERT_EQ(first.size(), 3U);
  EXPECT_EQ(first[0].job, JobId("nb-a"));
  EXPECT_EQ(first[1].job, JobId("nb-b"));
  EXPECT_EQ(first[2].job, JobId("nb-c"));
  EXPECT_EQ(run(), first);
}

TEST(IdleReclaimer, RejectsBadCalls) {
  IdleReclaimer reclaimer = MakeReclaimer();
  const JobId nb("nb");
  EXPECT_THAT(reclaimer.Observe(nb, 0, 0), StatusIs(StatusCode::kNotFound, HasSubstr("'nb'")));
  EXPECT_THAT(reclaimer.Describe(nb), StatusIs(StatusCode::kNotFound));
  ASSERT_OK(reclaimer.Track(nb, JobKind::kInteractive));
  EXPECT_THAT(reclaimer.Track(nb, JobKind::kInteractive), StatusIs(StatusCode::kAlreadyExists));
  EXPECT_THAT(reclaimer.Observe(nb, 0, 1001),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("utilization_milli: 1001")));
  EXPECT_THAT(reclaimer.Observe(nb, 0, -1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("utilization_milli: -1")));
  ASSERT_OK(reclaimer.Observe(nb, 100, 0));
  EXPECT_THAT(reclaimer.Observe(nb, 99, 0),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("time_seconds: 99")));
  EXPECT_THAT(reclaimer.Decide(100, -1),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("pending_jobs: -1")));
  ASSERT_OK(reclaimer.Decide(100, 0));
  EXPECT_THAT(reclaimer.Decide(50, 0),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("now_seconds: 50")));
  reclaimer.Untrack(nb);
  EXPECT_THAT(reclaimer.Describe(nb), StatusIs(StatusCode::kNotFound));
  reclaimer.Untrack(nb);
}

}  // namespace
}  // namespace gpufleet::policy
