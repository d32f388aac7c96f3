// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/state_store.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet::store {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(WriteBatch, KeepsTheOperationsInOrder) {
  WriteBatch batch;
  EXPECT_TRUE(batch.empty());
  batch.Create("pod", "a", "1").Update("pod", "a", "2", 1).AppendEvent("pod", "a", "e");
  batch.Delete("pod", "a");
  ASSERT_EQ(batch.size(), 4u);
  EXPECT_EQ(batch.ops()[0].type, WriteOpType::kCreate);
  EXPECT_EQ(batch.ops()[1].type, WriteOpType::kUpdate);
  EXPECT_EQ(batch.ops()[1].expected_version, 1);
  EXPECT_EQ(batch.ops()[2].data, "e");
  EXPECT_EQ(batch.ops()[3].type, WriteOpType::kDelete);
  EXPECT_EQ(batch.ops()[3].expected_version, 0);
  EXPECT_STREQ(WriteOpTypeName(WriteOpType::kAppendEvent), "append-event");
}

class RecordingObserver : public CommitObserver {
 public:
  void Committed(const WriteBatch& batch) override {
    for (const WriteOp& op : batch.ops()) {
      seen.push_back(op.kind + "/" + op.name);
    }
  }
  void CommitFailed(const WriteBatch& batch) override {
    for (const WriteOp& op : batch.ops()) {
      failed.push_back(op.kind + "/" + op.name);
    }
  }
  std::vector<std::string> seen;
  std::vector<std::string> failed;
};

TEST(CommitObserver, SeesSuccessfulCommitsOnlyUntilRemoved) {
  InMemoryStateStore store;
  RecordingObserver observer;
  store.AddObserver(&observer);
  WriteBatch create;
  create.Create("jobs", "a", "{}").AppendEvent("jobs", "a", "created");
  ASSERT_TRUE(store.Commit(create).ok());
  // A failed commit (a second create of the same object) and an empty one are not reported.
  EXPECT_FALSE(store.Commit(create).ok());
  EXPECT_TRUE(store.Commit(WriteBatch()).ok());
  EXPECT_EQ(observer.seen, (std::vector<std::string>{"jobs/a", "jobs/a"}));
  store.RemoveObserver(&observer);
  WriteBatch update;
  update.Update("jobs", "a", "{\"x\": 1}", 1);
  ASSERT_TRUE(store.Commit(update).ok());
  EXPECT_EQ(observer.seen.size(), 2u);
}

TEST(CommitObserver, IsToldOfCommitsTheBackendRefusedNotOfInvalidBatches) {
  InMemoryStateStore store;
  RecordingObserver observer;
  store.AddObserver(&observer);
  ASSERT_OK(store.Commit(WriteBatch().Create("jobs", "a", "{}")));
  // The backend refuses a second create: the observer may read the object again.
  EXPECT_EQ(store.Commit(WriteBatch().Create("jobs", "a", "{}")).code(),
            StatusCode::kAlreadyExists);
  // A batch that fails validation never reached the backend: nothing to read again.
  EXPECT_EQ(store.Commit(WriteBatch().Create("jobs", "", "{}")).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(observer.seen, (std::vector<std::string>{"jobs/a"}));
  EXPECT_EQ(observer.failed, (std::vector<std::string>{"jobs/a"}));
  store.RemoveObserver(&observer);
}

TEST(WriteBatch, AppendKeepsBothBatchesInOrder) {
  WriteBatch first;
  first.Create("jobs", "a", "{}");
  WriteBatch second;
  second.AppendEvent("jobs", "b", "hello").Delete("jobs", "c");
  first.Append(second);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first.ops()[0].name, "a");
  EXPECT_EQ(first.ops()[1].type, WriteOpType::kAppendEvent);
  EXPECT_EQ(first.ops()[2].type, WriteOpType::kDelete);
}

TEST(ValidateKey, AcceptsPrintableUtf8UpToTheLimit) {
  EXPECT_OK(ValidateKey("name", "a"));
  EXPECT_OK(ValidateKey("name", "gpu-node-01.rack/7:a_b"));
  EXPECT_OK(ValidateKey("name", "\xc2\xa0\xe2\x82\xac\xf0\x9f\x9a\x80"));  // U+00A0 € 🚀
  EXPECT_OK(ValidateKey("name", "\xf4\x8f\xbf\xbf"));                      // U+10FFFF
  EXPECT_OK(ValidateKey("name", std::string(kMaxKeyBytes, 'x')));
}

TEST(ValidateKey, RefusesMalformedUtf8) {
  for (const char* bad : {"\x80", "\xff", "\xc1\xbf", "\xe0\x80\x80", "\xf4\x90\x80\x80",
                          "\xf8\x88\x80\x80\x80", "\xc3"}) {
    SCOPED_TRACE(bad);
    EXPECT_THAT(ValidateKey("kind", bad),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("is not valid UTF-8")));
  }
}

TEST(ValidateKey, QuotesLongValuesShortened) {
  const Status status = ValidateKey("name", std::string(300, 'y'));
  EXPECT_THAT(status, StatusIs(StatusCode::kInvalidArgument,
                               HasSubstr("name \"" + std::string(64, 'y') + "\"... (300 bytes)")));
}

TEST(AnnotateOpError, NamesTheOperation) {
  WriteBatch batch;
  batch.Create("a", "b", "").Update("pod", "p", "", 3);
  const Status status =
      AnnotateOpError(VersionConflictError("pod", "p", 4, 3), 1, batch.size(), batch.ops()[1]);
  EXPECT_THAT(status, StatusIs(StatusCode::kAborted,
                               "version conflict: pod/p is at version 4, expected 3 "
                               "(batch op 2 of 2: update)"));
}

TEST(IndexedState, ReadsTheTopLevelStringOrNothing) {
  EXPECT_EQ(IndexedState(R"({"spec": {"state": "Nested"}, "state": "Running"})"), "Running");
  EXPECT_EQ(IndexedState(R"({"spec": {"state": "Running"}})"), "");
  EXPECT_EQ(IndexedState(R"({"state": 3})"), "");
  EXPECT_EQ(IndexedState(R"({"state": "Run\u006eing"})"), "");  // escaped: unreadable
  EXPECT_EQ(IndexedState(R"({"state": "Runn)"), "");
  EXPECT_EQ(IndexedState("[\"state\", \"Running\"]"), "");
  EXPECT_EQ(IndexedState(std::string(R"({"state": "a)") + '\x01' + "\"}"), "");  // control
  EXPECT_EQ(IndexedState("{\"state\": \"\xff\xfe\"}"), "");                      // not UTF-8
  EXPECT_EQ(IndexedState("{\"state\": \"" + std::string(kMaxKeyBytes + 1, 'x') + "\"}"), "");
  EXPECT_EQ(IndexedState(""), "");
}

TEST(StateStore, ListWhereRefusesInvalidArgumentsNamingTheField) {
  InMemoryStateStore store;
  const ListFilter not_finished{.states = {"Succeeded"}, .exclude_states = true};
  EXPECT_THAT(store.ListWhere("", not_finished), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(store.ListWhere("jobs", {.name_prefix = "a\x01"}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("name prefix")));
  EXPECT_THAT(store.ListWhere("jobs", {.states = {"\xff"}}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("state")));
  EXPECT_THAT(store.ListWhere("jobs", {.start_after = std::string(300, 'x')}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("start after")));
}

}  // namespace
}  // namespace gpufleet::store
