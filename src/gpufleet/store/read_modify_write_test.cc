// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/read_modify_write.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet::store {
namespace {

using ::testing::HasSubstr;

// Sets kind/name to `data` at the version `version` says it was read at.
WriteBatch UpdateAt(const std::string& data, int64_t version) {
  WriteBatch batch;
  batch.Update("jobs", "train", data, version);
  return batch;
}

class CommitWithRetriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    WriteBatch create;
    create.Create("jobs", "train", "v1");
    ASSERT_OK(store_.Commit(create));
  }
  InMemoryStateStore store_;
};

TEST_F(CommitWithRetriesTest, ReadsAgainAfterAConflictAndCommitsOnTheFreshVersion) {
  int calls = 0;
  const Status status = CommitWithRetries(store_, 5, "job \"train\" kept changing", [&] {
    ++calls;
    const Result<StoredObject> read = store_.Get("jobs", "train");
    if (calls == 1) {
      // Another writer commits between this attempt's read and its write.
      EXPECT_OK(store_.Commit(UpdateAt("theirs", read->version)));
    }
    return Write(UpdateAt("mine after " + read->data, read->version));
  });
  ASSERT_OK(status);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(store_.Get("jobs", "train")->data, "mine after theirs");
  EXPECT_EQ(store_.Get("jobs", "train")->version, 3);
}

TEST_F(CommitWithRetriesTest, GivesUpAfterTheLastAttemptNamingWhatKeptChanging) {
  ASSERT_OK(store_.Commit(UpdateAt("v2", 1)));
  int calls = 0;
  const Status status = CommitWithRetries(store_, 3, "job \"train\" kept changing; retry", [&] {
    ++calls;
    return Write(UpdateAt("stale", 1));
  });
  EXPECT_EQ(status.code(), StatusCode::kAborted);
  EXPECT_THAT(status.message(), HasSubstr("job \"train\" kept changing; retry"));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(store_.Get("jobs", "train")->data, "v2");
}

TEST_F(CommitWithRetriesTest, AnAttemptThatStopsWritesNothing) {
  int calls = 0;
  ASSERT_OK(CommitWithRetries(store_, 5, "job \"train\" kept changing", [&] {
    ++calls;
    return NoWrite();
  }));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(store_.Get("jobs", "train")->version, 1);
}

TEST_F(CommitWithRetriesTest, AnAttemptsErrorStopsWithIt) {
  int calls = 0;
  const Status status = CommitWithRetries(store_, 5, "job \"train\" kept changing", [&] {
    ++calls;
    return AttemptResult(Status(StatusCode::kUnavailable, "store is down"));
  });
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(store_.Get("jobs", "train")->version, 1);
}

TEST_F(CommitWithRetriesTest, OtherErrorsAreNotRetried) {
  int calls = 0;
  const Status status = CommitWithRetries(store_, 5, "job \"gone\" kept changing", [&] {
    ++calls;
    WriteBatch batch;
    batch.Update("jobs", "gone", "x", 1);
    return Write(batch);
  });
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace gpufleet::store
