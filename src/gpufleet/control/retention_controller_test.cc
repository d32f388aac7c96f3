// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/retention_controller.h"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::control {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kDay = int64_t{86400} * 1'000'000'000;
// 2026-01-01T00:00:00Z: the fake wall clock starts here.
constexpr int64_t kStart = int64_t{1767225600} * 1'000'000'000;

// A store that runs `before_commit` once before the next commit that deletes something: a writer
// racing the collector between its read and its commit.
class RacingStore final : public store::StateStore {
 public:
  std::function<void()> before_delete;
  store::InMemoryStateStore inner;

 protected:
  Result<store::StoredObject> DoGet(std::string_view kind, std::string_view name) override {
    return inner.Get(kind, name);
  }
  Result<std::vector<store::StoredObject>> DoList(std::string_view kind,
                                                  std::string_view prefix) override {
    return inner.List(kind, prefix);
  }
  Result<std::vector<store::StoredObject>> DoListWhere(std::string_view kind,
                                                       const store::ListFilter& filter) override {
    return inner.ListWhere(kind, filter);
  }
  Status DoCommit(const store::WriteBatch& batch) override {
    const bool deletes = std::any_of(batch.ops().begin(), batch.ops().end(), [](const auto& op) {
      return op.type == store::WriteOpType::kDelete;
    });
    if (deletes && before_delete) {
      std::exchange(before_delete, nullptr)();
    }
    return inner.Commit(batch);
  }
  Result<int64_t> DoRevision() override { return inner.Revision(); }
  Result<std::vector<store::StoredEvent>> DoEvents(std::string_view kind,
                                                   std::string_view name) override {
    return inner.Events(kind, name);
  }
};

// Records the size of every commit.
class BatchSizes final : public store::CommitObserver {
 public:
  void Committed(const store::WriteBatch& batch) override { sizes.push_back(batch.size()); }
  std::vector<size_t> sizes;
};

class RetentionControllerTest : public ::testing::Test {
 protected:
  RetentionControllerTest() : clock_(MonoTime{kStart}) {}

  RetentionController Make(int batch_jobs = 500, int batches_per_step = 2) {
    return RetentionController({.store = store_,
                                .clock = clock_,
                                .wall_clock = &clock_,
                                .retain_finished = std::chrono::hours(24 * 30),
                                .batch_jobs = batch_jobs,
                                .batches_per_step = batches_per_step,
                                .scan_interval = std::chrono::minutes(10)});
  }

  void PutJob(const std::string& name, const std::string& state) {
    ASSERT_OK(store_.Commit(store::WriteBatch()
                                .Create(std::string(kJobsKind), name,
                                        wire::Json{{"name", name}, {"state", state}}.dump())
                                .AppendEvent(std::string(kJobsKind), name, "submitted")));
  }
  void SetState(store::StateStore& store, const std::string& name, const std::string& state) {
    const Result<store::StoredObject> job = store.Get(kJobsKind, name);
    ASSERT_OK(job);
    wire::Json doc = wire::ParseDocument(job->data);
    doc["state"] = state;
    ASSERT_OK(store.Commit(
        store::WriteBatch().Update(std::string(kJobsKind), name, doc.dump(), job->version)));
  }
  bool Exists(const std::string& name) { return store_.Get(kJobsKind, name).ok(); }

  FakeClock clock_;
  RacingStore store_;
};

TEST(ParseRetentionTest, UnitsZeroAndForever) {
  EXPECT_EQ(*ParseRetention("--retain-finished", "30d"), std::chrono::hours(24 * 30));
  EXPECT_EQ(*ParseRetention("--retain-finished", "12h"), std::chrono::hours(12));
  EXPECT_EQ(*ParseRetention("--retain-finished", "90m"), std::chrono::minutes(90));
  EXPECT_EQ(*ParseRetention("--retain-finished", "45s"), std::chrono::seconds(45));
  EXPECT_EQ(*ParseRetention("--retain-finished", "0"), Duration::zero());
  EXPECT_EQ(*ParseRetention("--retain-finished", "forever"), Duration::zero());
  for (const char* bad : {"", "d", "30", "30w", "-1d", "1.5d", "30 d", "99999999999d", "0x10d"}) {
    EXPECT_THAT(ParseRetention("--retain-finished", bad),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("--retain-finished")))
        << bad;
  }
}

TEST_F(RetentionControllerTest, FinishedJobsLeaveWithTheirEventsAfterTheRetentionOnly) {
  for (const char* state : {"Succeeded", "Failed", "Cancelled"}) {
    PutJob(fmt::format("done-{}", state), state);
  }
  for (const char* state : {"Pending", "Scheduled", "Running", "Stopping"}) {
    PutJob(fmt::format("live-{}", state), state);
  }
  ASSERT_OK(store_.Commit(store::WriteBatch().Create("outcomes", "team/done-Failed", "{}")));
  RetentionController retention = Make();
  ASSERT_OK(retention.Step());  // the first scan waits a minute after the first step
  clock_.Advance(std::chrono::minutes(1));
  // The first pass stamps the finished jobs only.
  Result<RetentionController::StepResult> step = retention.Step();
  ASSERT_OK(step);
  EXPECT_TRUE(step->scanned);
  EXPECT_EQ(step->stamped, 3);
  EXPECT_EQ(step->deleted, 0);
  EXPECT_EQ(
      wire::StrOr(wire::ParseDocument(store_.Get(kJobsKind, "done-Failed")->data), "finished_at"),
      "2026-01-01T00:01:00Z");
  // A day short of the retention: nothing goes.
  clock_.Advance(std::chrono::nanoseconds(29 * kDay));
  step = retention.Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->deleted, 0);
  // Past it: the finished jobs and their event logs go; jobs that are not finished stay however
  // old they are, and the outcome records stay.
  clock_.Advance(std::chrono::nanoseconds(kDay) + std::chrono::minutes(1));
  step = retention.Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->deleted, 3);
  for (const char* state : {"Succeeded", "Failed", "Cancelled"}) {
    EXPECT_FALSE(Exists(fmt::format("done-{}", state))) << state;
    EXPECT_THAT(*store_.Events(kJobsKind, fmt::format("done-{}", state)), IsEmpty()) << state;
  }
  for (const char* state : {"Pending", "Scheduled", "Running", "Stopping"}) {
    EXPECT_TRUE(Exists(fmt::format("live-{}", state))) << state;
    EXPECT_EQ(store_.Events(kJobsKind, fmt::format("live-{}", state))->size(), 1u) << state;
  }
  EXPECT_OK(store_.Get("outcomes", "team/done-Failed").status());
}

TEST_F(RetentionControllerTest, NothingIsCollectedWhenRetentionIsForever) {
  PutJob("done", "Succeeded");
  RetentionController retention(
      {.store = store_, .clock = clock_, .wall_clock = &clock_, .retain_finished = {}});
  clock_.Advance(std::chrono::nanoseconds(1000 * kDay));
  ASSERT_OK(retention.Step());
  clock_.Advance(std::chrono::nanoseconds(1000 * kDay));
  ASSERT_OK(retention.Step());
  EXPECT_TRUE(Exists("done"));
  EXPECT_EQ(store_.Get(kJobsKind, "done")->version, 1);
}

// A (re)starting server schedules before its first scan lists every job.
TEST_F(RetentionControllerTest, TheFirstScanWaitsForTheFirstScanDelay) {
  PutJob("done", "Succeeded");
  RetentionController retention(
      {.store = store_, .clock = clock_, .wall_clock = &clock_});  // defaults: 30d, 1 min
  Result<RetentionController::StepResult> step = retention.Step();
  ASSERT_OK(step);
  EXPECT_FALSE(step->scanned);
  clock_.Advance(std::chrono::seconds(59));
  EXPECT_FALSE(retention.Step()->scanned);
  clock_.Advance(std::chrono::seconds(1));
  step = retention.Step();
  ASSERT_OK(step);
  EXPECT_TRUE(step->scanned);
  EXPECT_EQ(step->stamped, 1);
}

// A backlog far larger than a batch is worked through a bounded commit at a time, a bounded
// number per step, and the scan is not repeated until it is done.
TEST_F(RetentionControllerTest, AHugeBacklogIsCollectedInBoundedBatches) {
  constexpr int kJobs = 2500;
  store::WriteBatch fill;
  for (int i = 0; i < kJobs; ++i) {
    const std::string name = fmt::format("old-{:05}", i);
    fill.Create(std::string(kJobsKind), name,
                wire::Json{{"state", "Succeeded"}, {"finished_at", "2025-01-01T00:00:00Z"}}.dump());
    fill.AppendEvent(std::string(kJobsKind), name, "submitted");
  }
  ASSERT_OK(store_.Commit(fill));
  PutJob("running", "Running");
  BatchSizes sizes;
  store_.AddObserver(&sizes);
  RetentionController retention = Make(/*batch_jobs=*/100, /*batches_per_step=*/2);
  ASSERT_OK(retention.Step());  // the first scan waits a minute after the first step
  clock_.Advance(std::chrono::minutes(1));
  int steps = 0;
  int scans = 0;
  int deleted = 0;
  while (Exists("old-02499") || Exists("old-00000")) {
    ASSERT_LT(steps, 100);
    const Result<RetentionController::StepResult> step = retention.Step();
    ASSERT_OK(step);
    EXPECT_LE(step->deleted, 200);
    scans += step->scanned ? 1 : 0;
    deleted += step->deleted;
    ++steps;
  }
  store_.RemoveObserver(&sizes);
  EXPECT_EQ(deleted, kJobs);
  EXPECT_EQ(steps, kJobs / 200 + 1);
  EXPECT_EQ(scans, 1);
  EXPECT_EQ(retention.backlog(), 0u);
  EXPECT_LE(*std::max_element(sizes.sizes.begin(), sizes.sizes.end()), 200u);  // 2 ops a job
  EXPECT_TRUE(Exists("running"));
  EXPECT_THAT(*store_.Events(kJobsKind, "old-01234"), IsEmpty());
}

// Hostile timing: a job submitted again under a collected name between the scan and the delete,
// a job written between the collector's read and its commit, and a job that finishes while a pass
// is under way. None is deleted by that pass; the others of the batch still are.
TEST_F(RetentionControllerTest, AJobChangingWhileBeingCollectedIsLeftAlone) {
  for (const char* name : {"a", "b", "c", "d"}) {
    PutJob(name, "Succeeded");
  }
  PutJob("finishing", "Running");
  RetentionController retention = Make();
  ASSERT_OK(retention.Step());
  clock_.Advance(std::chrono::minutes(1));
  ASSERT_OK(retention.Step());  // stamps a-d
  clock_.Advance(std::chrono::nanoseconds(31 * kDay));
  // Before the deleting commit: "b" is resubmitted (Pending now), "c" gets a write (an outcome
  // note, its version moves), and "finishing" finishes.
  store_.before_delete = [&] {
    SetState(store_.inner, "b", "Pending");
    SetState(store_.inner, "c", "Succeeded");
    SetState(store_.inner, "finishing", "Succeeded");
  };
  Result<RetentionController::StepResult> step = retention.Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->deleted, 2);  // a and d
  EXPECT_EQ(step->skipped, 2);
  EXPECT_FALSE(Exists("a"));
  EXPECT_TRUE(Exists("b"));
  EXPECT_TRUE(Exists("c"));
  EXPECT_FALSE(Exists("d"));
  EXPECT_TRUE(Exists("finishing"));
  EXPECT_EQ(store_.Events(kJobsKind, "b")->size(), 1u);
  // "b" is not finished: later passes leave it; "c" goes once the next scan finds it again;
  // "finishing" is stamped now and kept for its own retention.
  clock_.Advance(std::chrono::minutes(10));
  step = retention.Step();
  ASSERT_OK(step);
  EXPECT_EQ(step->deleted, 1);
  EXPECT_EQ(step->stamped, 1);
  EXPECT_TRUE(Exists("b"));
  EXPECT_FALSE(Exists("c"));
  EXPECT_TRUE(Exists("finishing"));
}

}  // namespace
}  // namespace gpufleet::control
