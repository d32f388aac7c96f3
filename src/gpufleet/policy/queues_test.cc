// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/queues.h"

#include <cmath>
#include <numbers>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::policy {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kH100[] = "H100-80GB";
constexpr char kA100[] = "A100-80GB";

QueueSpec Queue(std::string path, GpuMilliByModel guarantee = {}, GpuMilliByModel limit = {},
                double weight = 1.0, bool may_borrow = true) {
  return {std::move(path), std::move(guarantee), std::move(limit), weight, may_borrow};
}

// The parent a child's path implies, as the server's tree builds it (control::BuildQueueTree).
QueueSpec ImplicitParent(std::string path) {
  QueueSpec spec = Queue(std::move(path));
  spec.implicit = true;
  return spec;
}

QueueTree MustCreate(std::vector<QueueSpec> specs, QueueTreeOptions options = {}) {
  auto tree = QueueTree::Create(std::move(specs), options);
  EXPECT_OK(tree);
  return std::move(tree).value();
}

PendingJob Pending(const std::string& id, const std::string& queue, int64_t submit,
                   int priority = 0) {
  return {JobId(id), QueueId(queue), priority, submit};
}

std::vector<std::string> Ids(const std::vector<PendingJob>& jobs) {
  std::vector<std::string> ids;
  for (const PendingJob& job : jobs) {
    ids.push_back(job.id.value());
  }
  return ids;
}

TEST(OverGuarantee, CountsEachModelsExcessLessTheAnyModelPool) {
  EXPECT_EQ(OverGuarantee({{kH100, 3000}}, {{kH100, 4000}}), 0);
  EXPECT_EQ(OverGuarantee({{kH100, 4000}}, {{kH100, 4000}}), 0);
  EXPECT_EQ(OverGuarantee({{kH100, 5000}, {kA100, 1000}}, {{kH100, 4000}}), 2000);
  // The any-model pool covers excess of any model.
  EXPECT_EQ(OverGuarantee({{kH100, 5000}, {kA100, 1000}}, {{kH100, 4000}, {"*", 1500}}), 500);
  EXPECT_EQ(OverGuarantee({{kA100, 1000}}, {{"*", 8000}}), 0);
  EXPECT_EQ(OverGuarantee({}, {}), 0);
}

TEST(QueueTree, RejectsBadSpecsNamingTheQueueFieldAndValue) {
  struct Case {
    std::vector<QueueSpec> specs;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{Queue("")}, "queues[0] (\"\").path: is empty"},
      {{Queue("org//team")}, "path: has an empty segment"},
      {{Queue("org/")}, "path: has an empty segment"},
      {{Queue("my team")}, "contains a space"},
      {{Queue("org"), Queue("org")}, "queues[1] (\"org\").path: defined twice"},
      {{Queue("org/team")}, "queues[0] (\"org/team\"): parent \"org\" is not defined"},
      {{Queue("org", {{kH100, -1000}})}, "guarantee[\"H100-80GB\"]: -1 GPUs is negative"},
      {{Queue("org", {}, {{"*", -1}})}, "limit[\"*\"]: -0.001 GPUs is negative"},
      {{Queue("org", {}, {}, 0.0)}, "queues[0] (\"org\").weight: 0 (must be > 0)"},
      {{Queue("org", {}, {}, -2.0)}, "weight: -2 (must be > 0)"},
      {{Queue("org", {{kH100, 8000}}, {{kH100, 4000}})},
       "limit[\"H100-80GB\"]: 4 GPUs is below the guarantee of 8 GPUs"},
      {{Queue("org", {{kH100, 8000}, {kA100, 8000}}, {{"*", 10000}})},
       "limit[\"*\"]: 10 GPUs is below the guarantee of 16 GPUs"},
      {{Queue("org", {{kH100, 8000}}), Queue("org/a", {{kH100, 5000}}),
        Queue("org/b", {{kH100, 4000}})},
       "queue \"org\": its children's guarantees of H100-80GB (9 GPUs) exceed its own (8 GPUs)"},
      {{Queue("org", {{"*", 8000}}), Queue("org/a", {{kH100, 5000}}),
        Queue("org/b", {{kA100, 4000}})},
       "its children's guarantees (9 GPUs in all) exceed its own (8 GPUs)"},
      {{ImplicitParent("org"), Queue("org/a", {{kH100, 16000}})},
       "queue \"org\": its children's guarantees of H100-80GB (16 GPUs) exceed its own (0 GPUs); "
       "\"org\" was created implicitly as the parent of \"org/a\", with no guarantee: create it "
       "first with one that covers its children (gpufleet create queue org --guarantee "
       "H100-80GB=16)"},
      {{ImplicitParent("org"), Queue("org/a", {{"*", 2000}}), Queue("org/b", {{"*", 500}})},
       "(2.5 GPUs in all) exceed its own (0 GPUs); \"org\" was created implicitly as the parent "
       "of \"org/a\", \"org/b\""},
      {{Queue("org", {{kH100, 1500}}), Queue("org/a", {{kH100, 2000}})},
       "guarantees of H100-80GB (2 GPUs) exceed its own (1.5 GPUs)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(QueueTree::Create(c.specs),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  QueueTreeOptions options;
  options.usage_half_life_seconds = 0;
  EXPECT_THAT(QueueTree::Create({Queue("org")}, options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("usage_half_life_seconds: 0")));
}

TEST(QueueTree, ChildGuaranteesMayExactlyFillTheParentsAndUseItsAnyModelPool) {
  EXPECT_OK(QueueTree::Create({Queue("org", {{kH100, 8000}}), Queue("org/a", {{kH100, 4000}}),
                               Queue("org/b", {{kH100, 4000}})}));
  EXPECT_OK(QueueTree::Create({Queue("org", {{"*", 8000}}), Queue("org/a", {{kH100, 4000}}),
                               Queue("org/b", {{kA100, 4000}})}));
}

TEST(QueueTree, AddUsageAddsToOneQueueAndRejectsBadAmounts) {
  QueueTree tree = MustCreate({Queue("a"), Queue("a/b")});
  ASSERT_OK(tree.AddUsage(QueueId("a/b"), {{kH100, 7200.5}}));
  ASSERT_OK(tree.AddUsage(QueueId("a/b"), {{kH100, 0.5}}));
  EXPECT_EQ(tree.StatusOf(QueueId("a/b"))->usage_gpu_seconds.at(kH100), 7201);
  EXPECT_TRUE(tree.StatusOf(QueueId("a"))->usage_gpu_seconds.empty());
  EXPECT_THAT(tree.AddUsage(QueueId("a"), {{kH100, -1}}), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(tree.AddUsage(QueueId("a"), {{kA100, std::nan("")}}),
              StatusIs(StatusCode::kInvalidArgument));
  EXPECT_TRUE(tree.StatusOf(QueueId("a"))->usage_gpu_seconds.empty());
  EXPECT_THAT(tree.AddUsage(QueueId("z"), {{kH100, 1}}), StatusIs(StatusCode::kNotFound));
}

TEST(QueueTree, ListsQueuesParentsFirst) {
  const QueueTree tree = MustCreate({Queue("b/x"), Queue("a"), Queue("b")});
  EXPECT_THAT(tree.Queues(), ElementsAre(QueueId("a"), QueueId("b"), QueueId("b/x")));
}

TEST(QueueTree, AllocationCountsTowardTheQueueAndEveryAncestor) {
  QueueTree tree = MustCreate({Queue("org"), Queue("org/team"), Queue("org/team/p1"),
                               Queue("org/team/p2"), Queue("other")});
  ASSERT_OK(tree.Charge(JobId("j1"), QueueId("org/team/p1"), {{kH100, 2000}}));
  ASSERT_OK(tree.Charge(JobId("j2"), QueueId("org/team/p2"), {{kH100, 1000}, {kA100, 500}}));
  auto status = [&](const std::string& queue) { return tree.StatusOf(QueueId(queue)).value(); };
  EXPECT_EQ(status("org/team/p1").allocated, (GpuMilliByModel{{kH100, 2000}}));
  EXPECT_EQ(status("org/team").allocated, (GpuMilliByModel{{kA100, 500}, {kH100, 3000}}));
  EXPECT_EQ(status("org").allocated, (GpuMilliByModel{{kA100, 500}, {kH100, 3000}}));
  EXPECT_TRUE(status("other").allocated.empty());
  EXPECT_EQ(tree.QueueOfJob(JobId("j2")).value(), QueueId("org/team/p2"));

  ASSERT_OK(tree.Release(JobId("j2")));
  EXPECT_EQ(status("org").allocated, (GpuMilliByModel{{kH100, 2000}}));
  EXPECT_TRUE(status("org/team/p2").allocated.empty());
}

TEST(QueueTree, ChargeAndReleaseErrors) {
  QueueTree tree = MustCreate({Queue("org")});
  EXPECT_THAT(tree.Charge(JobId("j"), QueueId("nope"), {{kH100, 1000}}),
              StatusIs(StatusCode::kNotFound, HasSubstr("queue \"nope\": not defined")));
  EXPECT_THAT(tree.Charge(JobId("j"), QueueId("org"), {{kH100, -5}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("-0.005 GPUs is negative")));
  ASSERT_OK(tree.Charge(JobId("j"), QueueId("org"), {{kH100, 1000}}));
  EXPECT_THAT(tree.Charge(JobId("j"), QueueId("org"), {{kH100, 1000}}),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("job \"j\": already charged")));
  ASSERT_OK(tree.Release(JobId("j")));
  EXPECT_THAT(tree.Release(JobId("j")),
              StatusIs(StatusCode::kNotFound, HasSubstr("job \"j\": holds nothing")));
  EXPECT_THAT(tree.QueueOfJob(JobId("j")), StatusIs(StatusCode::kNotFound));
}

TEST(QueueTree, QuotaExactlyFullIsWithinGuaranteeAndOneMoreMilliBorrows) {
  QueueTree tree = MustCreate({Queue("team", {{kH100, 8000}})});
  ASSERT_OK(tree.Charge(JobId("running"), QueueId("team"), {{kH100, 6000}}));
  const Admission fills = tree.CheckAdmission(QueueId("team"), {{kH100, 2000}}).value();
  EXPECT_EQ(fills.outcome, AdmissionOutcome::kWithinGuarantee);
  EXPECT_EQ(fills.borrowed_milli, 0);
  EXPECT_TRUE(fills.admitted());
  const Admission over = tree.CheckAdmission(QueueId("team"), {{kH100, 2001}}).value();
  EXPECT_EQ(over.outcome, AdmissionOutcome::kBorrowing);
  EXPECT_EQ(over.borrowed_milli, 1);
  EXPECT_TRUE(over.admitted());

  ASSERT_OK(tree.Charge(JobId("fills"), QueueId("team"), {{kH100, 2000}}));
  EXPECT_EQ(tree.Borrowed(QueueId("team")).value(), 0);
  EXPECT_THAT(tree.ReclaimCandidates(QueueId("team")),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("holds its whole guarantee (8000 of 8000 milli-GPU)")));
}

TEST(QueueTree, AJobThatExactlyFillsTheLimitIsAdmittedAndOneMoreIsNot) {
  QueueTree tree = MustCreate({Queue("org", {{kH100, 4000}}, {{"*", 16000}}),
                               Queue("org/team", {{kH100, 4000}}, {{kH100, 8000}})});
  ASSERT_OK(tree.Charge(JobId("a"), QueueId("org/team"), {{kH100, 6000}}));
  EXPECT_TRUE(tree.CheckAdmission(QueueId("org/team"), {{kH100, 2000}})->admitted());
  const Admission over = tree.CheckAdmission(QueueId("org/team"), {{kH100, 2001}}).value();
  EXPECT_EQ(over.outcome, AdmissionOutcome::kOverLimit);
  EXPECT_THAT(over.reason,
              HasSubstr("queue \"org/team\" limit[\"H100-80GB\"]: 6000 milli-GPU held + 2001 "
                        "asked > 8000"));
  // The parent's total limit counts every model.
  ASSERT_OK(tree.Charge(JobId("b"), QueueId("org/team"), {{kA100, 9000}}));
  const Admission parent = tree.CheckAdmission(QueueId("org/team"), {{kA100, 1001}}).value();
  EXPECT_EQ(parent.outcome, AdmissionOutcome::kOverLimit);
  EXPECT_THAT(parent.reason, HasSubstr("queue \"org\" limit[\"*\"]: 15000 milli-GPU held"));
  EXPECT_TRUE(tree.CheckAdmission(QueueId("org/team"), {{kA100, 1000}})->admitted());
  // Past its H100 limit (charged without admission), the team is refused more H100s, but an
  // A100 request is held back only by the parent's total.
  ASSERT_OK(tree.Charge(JobId("c"), QueueId("org/team"), {{kH100, 3000}}));
  EXPECT_THAT(tree.CheckAdmission(QueueId("org/team"), {{kH100, 1}})->reason,
              HasSubstr("queue \"org/team\" limit[\"H100-80GB\"]"));
  EXPECT_THAT(tree.CheckAdmission(QueueId("org/team"), {{kA100, 1}})->reason,
              HasSubstr("queue \"org\" limit[\"*\"]: 18000 milli-GPU held + 1 asked > 16000"));
}

TEST(QueueTree, ZeroGuaranteeBorrowsEverythingOrNothing) {
  QueueTree tree =
      MustCreate({Queue("scavenger"), Queue("strict", {}, {}, 1.0, /*may_borrow=*/false)});
  const Admission scavenger = tree.CheckAdmission(QueueId("scavenger"), {{kH100, 1000}}).value();
  EXPECT_EQ(scavenger.outcome, AdmissionOutcome::kBorrowing);
  EXPECT_EQ(scavenger.borrowed_milli, 1000);
  const Admission strict = tree.CheckAdmission(QueueId("strict"), {{kH100, 1000}}).value();
  EXPECT_EQ(strict.outcome, AdmissionOutcome::kBorrowingNotAllowed);
  EXPECT_THAT(strict.reason, HasSubstr("queue \"strict\" may not borrow: 1000 milli-GPU"));
  // Asking for nothing never borrows.
  EXPECT_EQ(tree.CheckAdmission(QueueId("strict"), {})->outcome,
            AdmissionOutcome::kWithinGuarantee);
}

TEST(QueueTree, BorrowingNeedsIdleCapacityWhenTheCapacityIsKnown) {
  QueueTree tree = MustCreate({Queue("a", {{kH100, 8000}}), Queue("b", {{kH100, 8000}})});
  tree.SetCapacity({{kH100, 16000}});
  ASSERT_OK(tree.Charge(JobId("a1"), QueueId("a"), {{kH100, 6000}}));
  // b's unused guarantee (8000) and a's own 2000 are idle: a may take 10000 in all.
  EXPECT_EQ(tree.CheckAdmission(QueueId("a"), {{kH100, 10000}})->outcome,
            AdmissionOutcome::kBorrowing);
  const Admission none = tree.CheckAdmission(QueueId("a"), {{kH100, 10001}}).value();
  EXPECT_EQ(none.outcome, AdmissionOutcome::kNoIdleQuota);
  EXPECT_THAT(none.reason, HasSubstr("6000 milli-GPU held + 10001 asked > capacity 16000"));
  ASSERT_OK(tree.Charge(JobId("a2"), QueueId("a"), {{kH100, 10000}}));
  EXPECT_EQ(tree.Borrowed(QueueId("a")).value(), 8000);
}

// org (16 GPUs) > team (8) > {p1 (4), p2 (0)}; p2 borrows p1's idle guarantee inside the team.
TEST(QueueTree, DeepHierarchyAttributesBorrowingBottomUp) {
  QueueTree tree = MustCreate({
      Queue("org", {{kH100, 16000}}, {}, 1.0, /*may_borrow=*/false),
      Queue("org/team", {{kH100, 8000}}, {}, 1.0, /*may_borrow=*/false),
      Queue("org/team/p1", {{kH100, 4000}}),
      Queue("org/team/p2"),
      Queue("org/team/p2/x"),
  });
  // Within the team's guarantee: p2/x borrows at its own levels only, which may borrow.
  const Admission inside = tree.CheckAdmission(QueueId("org/team/p2/x"), {{kH100, 8000}}).value();
  EXPECT_EQ(inside.outcome, AdmissionOutcome::kBorrowing);
  EXPECT_EQ(inside.borrowed_milli, 8000);
  // Past the team's guarantee the team itself would borrow, which it may not.
  const Admission past = tree.CheckAdmission(QueueId("org/team/p2/x"), {{kH100, 8001}}).value();
  EXPECT_EQ(past.outcome, AdmissionOutcome::kBorrowingNotAllowed);
  EXPECT_THAT(past.reason, HasSubstr("queue \"org/team\" may not borrow: 1 milli-GPU"));

  // p2/x takes the whole team guarantee; p1's own guarantee is still its own: a p1 job within
  // it is not borrowing even though the team is then over its guarantee.
  ASSERT_OK(tree.Charge(JobId("x"), QueueId("org/team/p2/x"), {{kH100, 8000}}));
  const Admission p1 = tree.CheckAdmission(QueueId("org/team/p1"), {{kH100, 4000}}).value();
  EXPECT_EQ(p1.outcome, AdmissionOutcome::kWithinGuarantee);
  EXPECT_EQ(p1.borrowed_milli, 0);
  EXPECT_EQ(tree.Borrowed(QueueId("org/team/p2")).value(), 8000);
  EXPECT_EQ(tree.Borrowed(QueueId("org/team")).value(), 0);
  EXPECT_EQ(tree.Borrowed(QueueId("org")).value(), 0);
}

TEST(QueueTree, ReclaimCandidatesAreOverGuaranteeRelativesNearestFirst) {
  QueueTree tree = MustCreate({
      Queue("a", {{kH100, 16000}}),
      Queue("a/starved", {{kH100, 8000}}),
      Queue("a/greedy", {{kH100, 4000}}),
      Queue("a/modest", {{kH100, 4000}}),
      Queue("b", {{kH100, 8000}}),
      Queue("c", {{kH100, 8000}}),
  });
  ASSERT_OK(tree.Charge(JobId("g"), QueueId("a/greedy"), {{kH100, 7000}}));
  ASSERT_OK(tree.Charge(JobId("m"), QueueId("a/modest"), {{kH100, 4000}}));
  ASSERT_OK(tree.Charge(JobId("b"), QueueId("b"), {{kH100, 10000}}));
  ASSERT_OK(tree.Charge(JobId("c"), QueueId("c"), {{kH100, 12000}}));
  ASSERT_OK(tree.Charge(JobId("s"), QueueId("a/starved"), {{kH100, 1000}}));
  const std::vector<QueueExcess> candidates = tree.ReclaimCandidates(QueueId("a/starved")).value();
  ASSERT_EQ(candidates.size(), 3U);
  EXPECT_EQ(candidates[0].queue, QueueId("a/greedy"));
  EXPECT_EQ(candidates[0].over_milli, 3000);
  EXPECT_EQ(candidates[0].distance, 0);
  EXPECT_EQ(candidates[1].queue, QueueId("c"));
  EXPECT_EQ(candidates[1].over_milli, 4000);
  EXPECT_EQ(candidates[1].distance, 1);
  EXPECT_EQ(candidates[2].queue, QueueId("b"));
  EXPECT_EQ(candidates[2].over_milli, 2000);
  EXPECT_THAT(tree.ReclaimCandidates(QueueId("zzz")), StatusIs(StatusCode::kNotFound));
}

TEST(QueueTree, UsageAccruesAndDecaysWithTheHalfLife) {
  QueueTreeOptions options;
  options.usage_half_life_seconds = 3600;
  QueueTree tree = MustCreate({Queue("team")}, options);
  ASSERT_OK(tree.Charge(JobId("j"), QueueId("team"), {{kH100, 2000}}));
  ASSERT_OK(tree.Advance(3600));
  // Two GPUs for one half-life: 2 x (h / ln2) x (1 - 1/2) GPU-seconds, a little over 2 x 3600 x
  // 0.72 since the early seconds have decayed.
  const double accrued = 2 * 3600 / std::numbers::ln2 * 0.5;
  EXPECT_NEAR(tree.StatusOf(QueueId("team"))->usage_gpu_seconds.at(kH100), accrued, 1e-6);
  ASSERT_OK(tree.Release(JobId("j")));
  ASSERT_OK(tree.Advance(7200));
  EXPECT_NEAR(tree.StatusOf(QueueId("team"))->usage_gpu_seconds.at(kH100), accrued / 2, 1e-6);
  // Advancing in steps gives the same as one step.
  ASSERT_OK(tree.Advance(7200 + 1800));
  ASSERT_OK(tree.Advance(7200 + 3600));
  EXPECT_NEAR(tree.StatusOf(QueueId("team"))->usage_gpu_seconds.at(kH100), accrued / 4, 1e-6);
  EXPECT_THAT(tree.Advance(100),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("now_seconds: 100 is before the last advance at 10800")));
}

TEST(QueueTree, ShortUsageIsAlmostLinear) {
  QueueTree tree = MustCreate({Queue("team")});  // 7-day half-life
  ASSERT_OK(tree.Charge(JobId("j"), QueueId("team"), {{kH100, 1000}}));
  ASSERT_OK(tree.Advance(60));
  EXPECT_NEAR(tree.StatusOf(QueueId("team"))->usage_gpu_seconds.at(kH100), 60.0, 0.01);
}

TEST(QueueTree, OrdersByPriorityThenFairShareThenAgeThenId) {
  QueueTree tree = MustCreate({Queue("heavy"), Queue("light")});
  ASSERT_OK(tree.Charge(JobId("h"), QueueId("heavy"), {{kH100, 4000}}));
  ASSERT_OK(tree.Charge(JobId("l"), QueueId("light"), {{kH100, 1000}}));
  ASSERT_OK(tree.Advance(100));
  std::vector<PendingJob> jobs = {
      Pending("h-old", "heavy", 1),
      Pending("l-new", "light", 50),
      Pending("h-urgent", "heavy", 90, /*priority=*/5),
      Pending("l-old-b", "light", 10),
      Pending("l-old-a", "light", 10),
  };
  ASSERT_OK(tree.Order(jobs));
  EXPECT_THAT(Ids(jobs), ElementsAre("h-urgent", "l-old-a", "l-old-b", "l-new", "h-old"));
}

TEST(QueueTree, AnExpeditedJobLeadsItsQueueAtItsPriorityOnly) {
  QueueTree tree = MustCreate({Queue("heavy"), Queue("light")});
  ASSERT_OK(tree.Charge(JobId("h"), QueueId("heavy"), {{kH100, 4000}}));
  ASSERT_OK(tree.Advance(100));
  PendingJob requeued = Pending("h-requeued", "heavy", 60);
  requeued.expedited = true;
  std::vector<PendingJob> jobs = {Pending("h-old", "heavy", 1), requeued,
                                  Pending("h-urgent", "heavy", 90, /*priority=*/5),
                                  Pending("l-old", "light", 10)};
  ASSERT_OK(tree.Order(jobs));
  // Ahead of its own queue's older job, not of a higher priority nor of a queue below its share.
  EXPECT_THAT(Ids(jobs), ElementsAre("h-urgent", "l-old", "h-requeued", "h-old"));
}

TEST(QueueTree, WeightScalesTheFairShare) {
  QueueTree tree = MustCreate({Queue("big", {}, {}, 4.0), Queue("small", {}, {}, 1.0)});
  ASSERT_OK(tree.Charge(JobId("b"), QueueId("big"), {{kH100, 3000}}));
  ASSERT_OK(tree.Charge(JobId("s"), QueueId("small"), {{kH100, 1000}}));
  ASSERT_OK(tree.Advance(1000));
  // big used 3x as much with 4x the weight: it is further below its share.
  std::vector<PendingJob> jobs = {Pending("s1", "small", 0), Pending("b1", "big", 5)};
  ASSERT_OK(tree.Order(jobs));
  EXPECT_THAT(Ids(jobs), ElementsAre("b1", "s1"));
  EXPECT_LT(tree.StatusOf(QueueId("big"))->fair_share_ratio, 1.0);
  EXPECT_GT(tree.StatusOf(QueueId("small"))->fair_share_ratio, 1.0);
  EXPECT_DOUBLE_EQ(tree.StatusOf(QueueId("big"))->weight_share, 0.8);
}

// x used more than y in all, although x/idle used nothing: y's jobs go first, because the tree
// is compared from the top down, not leaf against leaf.
TEST(QueueTree, ComparesFairShareLevelByLevelDownTheTree) {
  QueueTree tree = MustCreate(
      {Queue("x"), Queue("x/busy"), Queue("x/idle"), Queue("y"), Queue("y/p"), Queue("y/q")});
  ASSERT_OK(tree.Charge(JobId("xb"), QueueId("x/busy"), {{kH100, 8000}}));
  ASSERT_OK(tree.Charge(JobId("yp"), QueueId("y/p"), {{kH100, 2000}}));
  ASSERT_OK(tree.Charge(JobId("yq"), QueueId("y/q"), {{kH100, 1000}}));
  ASSERT_OK(tree.Advance(600));
  std::vector<PendingJob> jobs = {Pending("x-idle", "x/idle", 0), Pending("x-busy", "x/busy", 0),
                                  Pending("y-p", "y/p", 5), Pending("y-q", "y/q", 9)};
  ASSERT_OK(tree.Order(jobs));
  EXPECT_THAT(Ids(jobs), ElementsAre("y-q", "y-p", "x-idle", "x-busy"));
}

TEST(QueueTree, DominantShareUsesTheScarcestModel) {
  QueueTree tree = MustCreate({Queue("a"), Queue("b")});
  tree.SetCapacity({{kH100, 8000}, {kA100, 64000}});
  // a: 4 of 8 H100 (half the H100s); b: 16 of 64 A100 (a quarter of the A100s).
  ASSERT_OK(tree.Charge(JobId("a"), QueueId("a"), {{kH100, 4000}}));
  ASSERT_OK(tree.Charge(JobId("b"), QueueId("b"), {{kA100, 16000}}));
  ASSERT_OK(tree.Advance(100));
  std::vector<PendingJob> jobs = {Pending("a1", "a", 0), Pending("b1", "b", 1)};
  ASSERT_OK(tree.Order(jobs));
  EXPECT_THAT(Ids(jobs), ElementsAre("b1", "a1"));
}

TEST(QueueTree, OrderIsDeterministicAndRejectsUnknownQueues) {
  const QueueTree tree = MustCreate({Queue("a"), Queue("b")});
  std::vector<PendingJob> jobs = {Pending("j3", "b", 7), Pending("j1", "a", 7),
                                  Pending("j2", "b", 7)};
  std::vector<PendingJob> reversed(jobs.rbegin(), jobs.rend());
  ASSERT_OK(tree.Order(jobs));
  ASSERT_OK(tree.Order(reversed));
  EXPECT_THAT(Ids(jobs), ElementsAre("j1", "j2", "j3"));
  EXPECT_EQ(Ids(jobs), Ids(reversed));

  std::vector<PendingJob> bad = {Pending("j2", "b", 1), Pending("j1", "ghost", 0)};
  EXPECT_THAT(tree.Order(bad), StatusIs(StatusCode::kNotFound, HasSubstr("\"ghost\"")));
  EXPECT_THAT(Ids(bad), ElementsAre("j2", "j1"));
}

}  // namespace
}  // namespace gpufleet::policy
