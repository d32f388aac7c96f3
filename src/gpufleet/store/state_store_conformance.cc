// SPDX-License-Identifier: Apache-2.0
// One conformance suite for every StateStore backend: each test runs against each backend a test
// binary instantiates it with (state_store_conformance.h).
#include "gpufleet/store/state_store_conformance.h"

#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/state_store.h"

namespace gpufleet::store {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST_P(StateStoreConformanceTest, CreateThenGetReturnsVersionOneAtTheNewRevision) {
  ASSERT_OK(store().Commit(WriteBatch().Create("node", "n1", R"({"gpus": 8})")));
  Result<StoredObject> object = store().Get("node", "n1");
  ASSERT_OK(object);
  EXPECT_EQ(*object, (StoredObject{"node", "n1", R"({"gpus": 8})", 1, 1}));
}

TEST_P(StateStoreConformanceTest, GetOfAMissingObjectIsNotFound) {
  EXPECT_THAT(store().Get("node", "n1"), StatusIs(StatusCode::kNotFound, HasSubstr("node/n1")));
  CreateOrFail("node", "n1", "{}");
  EXPECT_THAT(store().Get("pod", "n1"), StatusIs(StatusCode::kNotFound));
}

TEST_P(StateStoreConformanceTest, CreatingAnExistingObjectIsAlreadyExists) {
  CreateOrFail("node", "n1", "1");
  EXPECT_THAT(store().Commit(WriteBatch().Create("node", "n1", "2")),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("node/n1 already exists")));
  Result<StoredObject> object = store().Get("node", "n1");
  ASSERT_OK(object);
  EXPECT_EQ(object->data, "1");
  EXPECT_EQ(object->version, 1);
}

TEST_P(StateStoreConformanceTest, DataIsOpaqueBytesAndMayBeEmpty) {
  const std::string binary("a\0b\xff", 4);
  CreateOrFail("blob", "binary", binary);
  CreateOrFail("blob", "empty", "");
  Result<StoredObject> object = store().Get("blob", "binary");
  ASSERT_OK(object);
  EXPECT_EQ(object->data, binary);
  object = store().Get("blob", "empty");
  ASSERT_OK(object);
  EXPECT_EQ(object->data, "");
}

TEST_P(StateStoreConformanceTest, ListReturnsOneKindSortedByNameFilteredByPrefix) {
  for (const char* name : {"b", "ab\xc3\xa9", "ac", "abc", "a", "ab"}) {
    CreateOrFail("pod", name, "{}");
  }
  CreateOrFail("node", "ab", "{}");
  CreateOrFail("poda", "ab", "{}");

  EXPECT_THAT(ListNames("pod"), ElementsAre("a", "ab", "abc", "ab\xc3\xa9", "ac", "b"));
  EXPECT_THAT(ListNames("pod", "ab"), ElementsAre("ab", "abc", "ab\xc3\xa9"));
  EXPECT_THAT(ListNames("pod", "ab\xc3\xa9"), ElementsAre("ab\xc3\xa9"));
  EXPECT_THAT(ListNames("pod", "abcd"), IsEmpty());
  EXPECT_THAT(ListNames("node"), ElementsAre("ab"));
  EXPECT_THAT(ListNames("job"), IsEmpty());

  Result<std::vector<StoredObject>> objects = store().List("node");
  ASSERT_OK(objects);
  ASSERT_EQ(objects->size(), 1u);
  EXPECT_EQ((*objects)[0], (StoredObject{"node", "ab", "{}", 1, 7}));
}

TEST_P(StateStoreConformanceTest, ListRefusesAnInvalidPrefix) {
  EXPECT_THAT(store().List("pod", "ab\xc3"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("name prefix")));
}

TEST_P(StateStoreConformanceTest, UpdateIsACompareAndSetOnTheVersion) {
  CreateOrFail("job", "train", "v1");
  ASSERT_OK(store().Commit(WriteBatch().Update("job", "train", "v2", 1)));
  Result<StoredObject> object = store().Get("job", "train");
  ASSERT_OK(object);
  EXPECT_EQ(*object, (StoredObject{"job", "train", "v2", 2, 2}));

  EXPECT_THAT(store().Commit(WriteBatch().Update("job", "train", "stale", 1)),
              StatusIs(StatusCode::kAborted,
                       HasSubstr("version conflict: job/train is at version 2, expected 1")));
  object = store().Get("job", "train");
  ASSERT_OK(object);
  EXPECT_EQ(object->data, "v2");

  EXPECT_THAT(store().Commit(WriteBatch().Update("job", "missing", "x", 1)),
              StatusIs(StatusCode::kNotFound, HasSubstr("job/missing")));
  EXPECT_THAT(store().Commit(WriteBatch().Update("job", "train", "x", 0)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("expected_version")));
}

TEST_P(StateStoreConformanceTest, DeleteChecksTheVersionUnlessItIsZero) {
  CreateOrFail("job", "a", "{}");
  CreateOrFail("job", "b", "{}");
  EXPECT_THAT(store().Commit(WriteBatch().Delete("job", "a", 2)),
              StatusIs(StatusCode::kAborted,
                       HasSubstr("version conflict: job/a is at version 1, expected 2")));
  ASSERT_OK(store().Commit(WriteBatch().Delete("job", "a", 1)));
  ASSERT_OK(store().Commit(WriteBatch().Delete("job", "b", 0)));
  EXPECT_THAT(store().Get("job", "a"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(ListNames("job"), IsEmpty());
  EXPECT_THAT(store().Commit(WriteBatch().Delete("job", "a")),
              StatusIs(StatusCode::kNotFound, HasSubstr("job/a")));

  // A re-created object starts again at version 1; its revision tells it apart.
  CreateOrFail("job", "a", "again");
  Result<StoredObject> object = store().Get("job", "a");
  ASSERT_OK(object);
  EXPECT_EQ(*object, (StoredObject{"job", "a", "again", 1, 5}));
}

TEST_P(StateStoreConformanceTest, ABatchThatFailsInTheMiddleWritesNothing) {
  CreateOrFail("node", "n1", "old");
  const int64_t revision = RevisionOrZero();

  WriteBatch batch;
  batch.Create("pod", "p1", "{}")
      .Update("node", "n1", "new", 1)
      .AppendEvent("node", "n1", "bound p1")
      .Create("node", "n1", "duplicate")
      .Create("pod", "p2", "{}");
  EXPECT_THAT(store().Commit(batch),
              StatusIs(StatusCode::kAlreadyExists,
                       HasSubstr("node/n1 already exists (batch op 4 of 5: create)")));

  EXPECT_THAT(store().Get("pod", "p1"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(store().Get("pod", "p2"), StatusIs(StatusCode::kNotFound));
  Result<StoredObject> node = store().Get("node", "n1");
  ASSERT_OK(node);
  EXPECT_EQ(*node, (StoredObject{"node", "n1", "old", 1, 1}));
  Result<std::vector<StoredEvent>> events = store().Events("node", "n1");
  ASSERT_OK(events);
  EXPECT_THAT(*events, IsEmpty());
  EXPECT_EQ(RevisionOrZero(), revision);

  // An invalid operation anywhere is refused before anything is tried.
  WriteBatch invalid;
  invalid.Create("pod", "p1", "{}").Create("pod", "", "{}");
  EXPECT_THAT(store().Commit(invalid),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("name must not be empty (batch op 2 of 2: create)")));
  EXPECT_THAT(store().Get("pod", "p1"), StatusIs(StatusCode::kNotFound));
}

TEST_P(StateStoreConformanceTest, OperationsOfABatchSeeTheEarlierOnes) {
  WriteBatch batch;
  batch.Create("pod", "p1", "a").Update("pod", "p1", "b", 1).Update("pod", "p1", "c", 2);
  batch.Create("pod", "p2", "x").Delete("pod", "p2", 1).Create("pod", "p2", "y");
  ASSERT_OK(store().Commit(batch));
  EXPECT_EQ(RevisionOrZero(), 1);
  Result<StoredObject> p1 = store().Get("pod", "p1");
  ASSERT_OK(p1);
  EXPECT_EQ(*p1, (StoredObject{"pod", "p1", "c", 3, 1}));
  Result<StoredObject> p2 = store().Get("pod", "p2");
  ASSERT_OK(p2);
  EXPECT_EQ(*p2, (StoredObject{"pod", "p2", "y", 1, 1}));
}

TEST_P(StateStoreConformanceTest, EventsAreKeptInOrderPerObject) {
  CreateOrFail("job", "j", "{}");
  ASSERT_OK(store().Commit(WriteBatch().AppendEvent("job", "j", "queued")));
  ASSERT_OK(store().Commit(WriteBatch()
                               .AppendEvent("job", "j", "scheduled")
                               .AppendEvent("job", "other", "elsewhere")
                               .AppendEvent("job", "j", "running")));
  ASSERT_OK(store().Commit(WriteBatch().Delete("job", "j").AppendEvent("job", "j", "deleted")));

  Result<std::vector<StoredEvent>> events = store().Events("job", "j");
  ASSERT_OK(events);
  EXPECT_THAT(*events, ElementsAre(StoredEvent{2, "queued"}, StoredEvent{3, "scheduled"},
                                   StoredEvent{3, "running"}, StoredEvent{4, "deleted"}));
  events = store().Events("job", "other");
  ASSERT_OK(events);
  EXPECT_THAT(*events, ElementsAre(StoredEvent{3, "elsewhere"}));
  events = store().Events("job", "never");
  ASSERT_OK(events);
  EXPECT_THAT(*events, IsEmpty());
}

// Garbage collection: an object leaves with its event log; appends after the deletion in the
// same batch start a new log, appends before it go too; other logs are untouched.
TEST_P(StateStoreConformanceTest, DeleteEventsRemovesOneObjectsWholeLog) {
  CreateOrFail("job", "j", "{}");
  ASSERT_OK(store().Commit(
      WriteBatch().AppendEvent("job", "j", "queued").AppendEvent("job", "other", "kept")));
  ASSERT_OK(store().Commit(WriteBatch()
                               .AppendEvent("job", "j", "finished")
                               .Delete("job", "j", 1)
                               .DeleteEvents("job", "j")
                               .AppendEvent("job", "j", "after")));
  EXPECT_THAT(store().Get("job", "j"), StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(*store().Events("job", "j"), ElementsAre(StoredEvent{3, "after"}));
  EXPECT_THAT(*store().Events("job", "other"), ElementsAre(StoredEvent{2, "kept"}));
  // No log at all is not an error; a failing batch deletes nothing.
  ASSERT_OK(store().Commit(WriteBatch().DeleteEvents("job", "never")));
  EXPECT_THAT(store().Commit(WriteBatch().DeleteEvents("job", "other").Delete("job", "missing")),
              StatusIs(StatusCode::kNotFound));
  EXPECT_THAT(*store().Events("job", "other"), ElementsAre(StoredEvent{2, "kept"}));
}

TEST_P(StateStoreConformanceTest, RevisionGrowsByOnePerSuccessfulCommit) {
  EXPECT_EQ(RevisionOrZero(), 0);
  CreateOrFail("node", "n1", "{}");
  EXPECT_EQ(RevisionOrZero(), 1);
  ASSERT_OK(store().Commit(WriteBatch().Create("node", "n2", "{}").Create("node", "n3", "{}")));
  EXPECT_EQ(RevisionOrZero(), 2);
  EXPECT_THAT(store().Commit(WriteBatch().Create("node", "n1", "{}")),
              StatusIs(StatusCode::kAlreadyExists));
  EXPECT_OK(store().Commit(WriteBatch()));  // empty: nothing to write, no new revision
  EXPECT_EQ(RevisionOrZero(), 2);
  ASSERT_OK(store().Commit(WriteBatch().Update("node", "n2", "{}", 1)));
  EXPECT_EQ(RevisionOrZero(), 3);
  ASSERT_OK(store().Commit(WriteBatch().Delete("node", "n2")));
  EXPECT_EQ(RevisionOrZero(), 4);

  Result<std::vector<StoredObject>> nodes = store().List("node");
  ASSERT_OK(nodes);
  ASSERT_EQ(nodes->size(), 2u);
  EXPECT_EQ((*nodes)[0].revision, 1);
  EXPECT_EQ((*nodes)[1].revision, 2);
}

TEST_P(StateStoreConformanceTest, InvalidKindsAndNamesAreRefusedNamingTheFieldAndValue) {
  struct Case {
    std::string kind;
    std::string name;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "n", "kind must not be empty"},
      {"node", "", "name must not be empty"},
      {"node", "bad\x01name", R"(name "bad\x01name" contains control character U+0001)"},
      {"no\x7f", "n", R"(kind "no\x7f" contains control character U+007F)"},
      {"node", "c1\xc2\x85", R"(name "c1\xc2\x85" contains control character U+0085)"},
      {"node", "tab\t", R"(name "tab\x09" contains control character U+0009)"},
      {"node", "bad\xc3(", R"(name "bad\xc3(" is not valid UTF-8 (at byte 3))"},
      {"node", "over\xc0\xaf", "is not valid UTF-8"},     // overlong '/'
      {"node", "sur\xed\xa0\x80", "is not valid UTF-8"},  // surrogate U+D800
      {"node", "cut\xe2\x82", "is not valid UTF-8"},      // truncated
      {"node", std::string(254, 'x'), "is 254 bytes, more than the limit of 253"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(store().Commit(WriteBatch().Create(c.kind, c.name, "{}")),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
    EXPECT_THAT(store().Get(c.kind, c.name),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
    EXPECT_THAT(store().Events(c.kind, c.name), StatusIs(StatusCode::kInvalidArgument));
  }
  EXPECT_THAT(store().List(""), StatusIs(StatusCode::kInvalidArgument, HasSubstr("kind")));
  EXPECT_EQ(RevisionOrZero(), 0);

  // The limits are inclusive, and any non-control character is fine.
  CreateOrFail("node", std::string(253, 'x'), "{}");
  CreateOrFail("Größe", "名前 with spaces/and:punctuation", "{}");
  EXPECT_OK(store().Get("Größe", "名前 with spaces/and:punctuation"));
}

TEST_P(StateStoreConformanceTest, DataAndEventTextAreLimitedToOneMebibyte) {
  const std::string limit(kMaxDataBytes, 'd');
  const std::string over(kMaxDataBytes + 1, 'd');
  CreateOrFail("blob", "max", limit);
  Result<StoredObject> object = store().Get("blob", "max");
  ASSERT_OK(object);
  EXPECT_EQ(object->data.size(), kMaxDataBytes);
  EXPECT_THAT(store().Commit(WriteBatch().Create("blob", "over", over)),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("data is 1048577 bytes, more than the limit of 1048576")));
  EXPECT_THAT(store().Commit(WriteBatch().Update("blob", "max", over, 1)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("data")));
  EXPECT_THAT(store().Commit(WriteBatch().AppendEvent("blob", "max", over)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("event text")));
  EXPECT_THAT(store().Get("blob", "over"), StatusIs(StatusCode::kNotFound));
}

// Optimistic concurrency: writers that read, modify and compare-and-set, retrying on kAborted,
// never lose an update.
TEST_P(StateStoreConformanceTest, ConcurrentCompareAndSetWritersLoseNoUpdate) {
  constexpr int kThreads = 4;
  constexpr int kIncrementsPerThread = 200;
  // Bounds every retry loop: a livelock fails the test instead of hanging it.
  constexpr int kMaxAttempts = 100000;
  CreateOrFail("counter", "c", "0");

  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  threads.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([this, t, &errors] {
      for (int i = 0; i < kIncrementsPerThread && errors[t].empty(); ++i) {
        bool done = false;
        for (int attempt = 0; attempt < kMaxAttempts && !done; ++attempt) {
          Result<StoredObject> counter = store().Get("counter", "c");
          if (!counter.ok()) {
            errors[t] = counter.status().ToString();
            return;
          }
          int64_t value = 0;
          const std::string& data = counter->data;
          if (std::from_chars(data.data(), data.data() + data.size(), value).ec != std::errc()) {
            errors[t] = "counter data is not a number: " + data;
            return;
          }
          const Status status = store().Commit(
              WriteBatch().Update("counter", "c", std::to_string(value + 1), counter->version));
          if (status.ok()) {
            done = true;
          } else if (status.code() != StatusCode::kAborted) {
            errors[t] = status.ToString();
            return;
          }
        }
        if (!done) {
          errors[t] = "gave up after too many conflicts";
        }
      }
    });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (const std::string& error : errors) {
    EXPECT_EQ(error, "");
  }
  Result<StoredObject> counter = store().Get("counter", "c");
  ASSERT_OK(counter);
  EXPECT_EQ(counter->data, "800");
  EXPECT_EQ(counter->version, 1 + kThreads * kIncrementsPerThread);
  EXPECT_EQ(RevisionOrZero(), 1 + kThreads * kIncrementsPerThread);
}

}  // namespace
}  // namespace gpufleet::store
