// SPDX-License-Identifier: Apache-2.0
// One conformance suite for every StateStore backend: each test runs against each backend a test
// binary instantiates it with (state_store_conformance.h).
#include "gpufleet/store/state_store_conformance.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/random.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/state_store.h"

namespace gpufleet::store {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::Contains;
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

TEST_P(StateStoreConformanceTest, GetManyReturnsTheNamedObjectsThatExistSortedByName) {
  CreateOrFail("job", "team/b", "B");
  CreateOrFail("job", "team/a", "A");
  CreateOrFail("job", "team/a-b", "AB");  // a prefix of another name is no match
  CreateOrFail("node", "team/c", "not a job");
  ASSERT_OK(store().Commit(WriteBatch().Update("job", "team/b", "B2", 1)));
  Result<std::vector<StoredObject>> found =
      store().GetMany("job", {"team/b", "team/c", "team/a", "team/b", "gone"});
  ASSERT_OK(found);
  ASSERT_EQ(found->size(), 2u);
  const Result<StoredObject> a = store().Get("job", "team/a");
  const Result<StoredObject> b = store().Get("job", "team/b");
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_EQ((*found)[0], *a);
  EXPECT_EQ((*found)[1], *b);
  EXPECT_EQ((*found)[1].data, "B2");
  EXPECT_EQ((*found)[1].version, 2);
  ASSERT_OK(store().GetMany("job", {}));
  EXPECT_TRUE(store().GetMany("job", {})->empty());
  EXPECT_THAT(store().GetMany("job", {"team/a", std::string("bad\nname")}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("name")));
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

// ---- the state index (ListWhere) ------------------------------------------------------------

// Names of `objects`, in order.
std::vector<std::string> Names(const std::vector<StoredObject>& objects) {
  std::vector<std::string> names;
  for (const StoredObject& object : objects) {
    names.push_back(object.name);
  }
  return names;
}

std::string JobWithState(std::string_view state) {
  return fmt::format(R"({{"spec": {{"state": "Nested"}}, "state": "{}", "n": 1}})", state);
}

// ListWhere's answer, or the error's text (a failed call fails the comparison).
std::vector<std::string> ListWhereNames(StateStore& store, std::string_view kind,
                                        const ListFilter& filter) {
  Result<std::vector<StoredObject>> objects = store.ListWhere(kind, filter);
  if (!objects.ok()) {
    return {objects.status().ToString()};
  }
  return Names(*objects);
}

// What ListWhere must return, computed from a full List and IndexedState.
std::vector<std::string> ExpectedNames(StateStore& store, std::string_view kind,
                                       const ListFilter& filter) {
  Result<std::vector<StoredObject>> all = store.List(kind);
  EXPECT_OK(all);
  std::vector<std::string> names;
  if (!all.ok()) {
    return names;
  }
  for (const StoredObject& object : *all) {
    const bool listed = std::find(filter.states.begin(), filter.states.end(),
                                  IndexedState(object.data)) != filter.states.end();
    if (InListRange(filter, object.name) && listed != filter.exclude_states &&
        (filter.limit == 0 || names.size() < filter.limit)) {
      names.push_back(object.name);
    }
  }
  return names;
}

const ListFilter kNotFinished{.states = {"Succeeded", "Failed", "Cancelled"},
                              .exclude_states = true};

TEST_P(StateStoreConformanceTest, ListWhereFollowsCreatesUpdatesBatchesAndDeletes) {
  ASSERT_OK(store().Commit(WriteBatch()
                               .Create("jobs", "a", JobWithState("Pending"))
                               .Create("jobs", "b", JobWithState("Running"))
                               .Create("jobs", "c", JobWithState("Succeeded"))
                               .Create("other", "a", JobWithState("Running"))));
  EXPECT_THAT(ListWhereNames(store(), "jobs", kNotFinished), ElementsAre("a", "b"));
  EXPECT_THAT(ListWhereNames(store(), "jobs", {.states = {"Running"}}), ElementsAre("b"));
  EXPECT_THAT(ListWhereNames(store(), "jobs", {.states = {"Running", "Succeeded"}}),
              ElementsAre("b", "c"));
  EXPECT_THAT(ListWhereNames(store(), "jobs", {}), IsEmpty());  // no state asked for
  EXPECT_THAT(ListWhereNames(store(), "jobs", {.exclude_states = true}),
              ElementsAre("a", "b", "c"));

  // A compare-and-set that finishes b, in a batch with a create and an update of the create.
  ASSERT_OK(store().Commit(WriteBatch()
                               .Update("jobs", "b", JobWithState("Failed"), 1)
                               .Create("jobs", "d", JobWithState("Pending"))
                               .Update("jobs", "d", JobWithState("Scheduled"), 1)));
  EXPECT_THAT(ListWhereNames(store(), "jobs", kNotFinished), ElementsAre("a", "d"));
  EXPECT_THAT(ListWhereNames(store(), "jobs", {.states = {"Scheduled"}}), ElementsAre("d"));
  Result<std::vector<StoredObject>> listed = store().ListWhere("jobs", {.states = {"Failed"}});
  ASSERT_OK(listed);
  EXPECT_THAT(*listed, ElementsAre(StoredObject{"jobs", "b", JobWithState("Failed"), 2, 2}));

  // A failed batch (a version conflict after a state change) changes nothing of the index.
  EXPECT_THAT(store().Commit(WriteBatch()
                                 .Update("jobs", "a", JobWithState("Cancelled"), 1)
                                 .Update("jobs", "d", JobWithState("Cancelled"), 7)),
              StatusIs(StatusCode::kAborted));
  EXPECT_THAT(ListWhereNames(store(), "jobs", kNotFinished), ElementsAre("a", "d"));

  // Deleted, re-created in another state; a finished job resubmitted under its name.
  ASSERT_OK(store().Commit(WriteBatch().Delete("jobs", "a").Delete("jobs", "c", 1)));
  EXPECT_THAT(ListWhereNames(store(), "jobs", kNotFinished), ElementsAre("d"));
  ASSERT_OK(store().Commit(WriteBatch().Create("jobs", "c", JobWithState("Running"))));
  EXPECT_THAT(ListWhereNames(store(), "jobs", kNotFinished), ElementsAre("c", "d"));
  EXPECT_THAT(ListWhereNames(store(), "jobs", {.states = {"Succeeded"}}), IsEmpty());
  EXPECT_THAT(ListWhereNames(store(), "other", kNotFinished), ElementsAre("a"));
}

TEST_P(StateStoreConformanceTest, DocumentsWithoutAReadableStateAreIndexedUnderEmpty) {
  const std::string bad_utf8 = "{\"state\": \"Run\xff\"}";
  ASSERT_OK(store().Commit(WriteBatch()
                               .Create("jobs", "binary", std::string("\0\xff{", 3))
                               .Create("jobs", "empty", "")
                               .Create("jobs", "escaped", R"({"state": "Succ\u0065eded"})")
                               .Create("jobs", "finished", JobWithState("Succeeded"))
                               .Create("jobs", "number", R"({"state": 7})")
                               .Create("jobs", "running", JobWithState("Running"))
                               .Create("jobs", "stateless", R"({"spec": {"state": "Failed"}})")
                               .Create("jobs", "truncated", R"({"state": "Succeeded)")
                               .Create("jobs", "utf8", bad_utf8)));
  // A job that must not be missed is listed when its state cannot be read.
  EXPECT_THAT(ListWhereNames(store(), "jobs", kNotFinished),
              ElementsAre("binary", "empty", "escaped", "number", "running", "stateless",
                          "truncated", "utf8"));
  EXPECT_THAT(
      ListWhereNames(store(), "jobs", {.states = {""}}),
      ElementsAre("binary", "empty", "escaped", "number", "stateless", "truncated", "utf8"));
  EXPECT_THAT(ListWhereNames(store(), "jobs", {.states = {"Succeeded"}}), ElementsAre("finished"));
  // Data comes back as written.
  Result<std::vector<StoredObject>> listed = store().ListWhere("jobs", {.states = {""}});
  ASSERT_OK(listed);
  ASSERT_EQ(listed->size(), 7u);
  EXPECT_EQ((*listed)[0].data, std::string("\0\xff{", 3));
  EXPECT_EQ((*listed)[6].data, bad_utf8);
  // A stateless document that gains a state, and one that loses it.
  ASSERT_OK(store().Commit(WriteBatch()
                               .Update("jobs", "stateless", JobWithState("Failed"), 1)
                               .Update("jobs", "running", "not json", 1)));
  EXPECT_THAT(ListWhereNames(store(), "jobs", {.states = {"Failed", "Running"}}),
              ElementsAre("stateless"));
  EXPECT_THAT(ListWhereNames(store(), "jobs", kNotFinished), Contains("running"));
}

TEST_P(StateStoreConformanceTest, ListWherePagesByPrefixStartAndLimitAcrossStates) {
  WriteBatch batch;
  const char* states[] = {"Pending", "Running", "Succeeded", "Stopping"};
  for (int i = 0; i < 12; ++i) {
    batch.Create("jobs", fmt::format("team-{}/job-{:02}", i % 2, i), JobWithState(states[i % 4]));
  }
  ASSERT_OK(store().Commit(batch));
  // Team 0 holds jobs 0, 2, ..., 10 in states Pending, Succeeded, Pending, ...
  const ListFilter team0{.name_prefix = "team-0/", .states = {"Pending", "Succeeded"}};
  EXPECT_THAT(ListWhereNames(store(), "jobs", team0),
              ElementsAre("team-0/job-00", "team-0/job-02", "team-0/job-04", "team-0/job-06",
                          "team-0/job-08", "team-0/job-10"));
  ListFilter page = kNotFinished;
  page.limit = 4;
  std::vector<std::string> all;
  for (int pages = 0; pages < 10; ++pages) {
    const std::vector<std::string> names = ListWhereNames(store(), "jobs", page);
    EXPECT_EQ(names, ExpectedNames(store(), "jobs", page));
    all.insert(all.end(), names.begin(), names.end());
    if (names.size() < page.limit) {
      break;
    }
    page.start_after = names.back();
  }
  EXPECT_EQ(all, ExpectedNames(store(), "jobs", kNotFinished));
  EXPECT_EQ(all.size(), 9u);
  EXPECT_THAT(ListWhereNames(store(), "jobs",
                             {.name_prefix = "team-1/",
                              .states = {"Running"},
                              .start_after = "team-1/job-01",
                              .limit = 1}),
              ElementsAre("team-1/job-05"));
}

// Random batches of creates, compare-and-set updates (some at a wrong version), deletes and
// malformed documents: after each, every query the index serves equals a filter over List.
TEST_P(StateStoreConformanceTest, TheStateIndexStaysExactUnderRandomWrites) {
  Random random(15);
  const std::vector<std::string> documents = {JobWithState("Pending"),
                                              JobWithState("Running"),
                                              JobWithState("Succeeded"),
                                              JobWithState("Failed"),
                                              JobWithState("Cancelled"),
                                              JobWithState("Stopping"),
                                              "{}",
                                              "{\"state\": ",
                                              R"({"state": "Fail\u0065d"})"};
  const std::vector<ListFilter> filters = {
      kNotFinished,
      {.states = {"Running", "Stopping"}},
      {.states = {"", "Failed"}, .exclude_states = true, .limit = 3},
      {.name_prefix = "j1", .states = {"Pending", "Succeeded", ""}},
  };
  for (int step = 0; step < 60; ++step) {
    WriteBatch batch;
    const uint64_t ops = 1 + random.Uniform(3);
    for (uint64_t op = 0; op < ops; ++op) {
      const std::string name = fmt::format("j{}", random.Uniform(16));
      const std::string& data = documents[random.Uniform(documents.size())];
      Result<StoredObject> current = store().Get("jobs", name);
      const int64_t version = current.ok() ? current->version : 0;
      const bool wrong = random.Uniform(8) == 0;  // an expected failure of the whole batch
      if (!current.ok()) {
        batch.Create("jobs", name, data);
      } else if (random.Uniform(4) == 0) {
        batch.Delete("jobs", name, wrong ? version + 1 : version);
      } else {
        batch.Update("jobs", name, data, wrong ? version + 1 : version);
      }
    }
    (void)store().Commit(batch);  // a batch touching one name twice may fail: also a case
    for (const ListFilter& filter : filters) {
      ASSERT_EQ(ListWhereNames(store(), "jobs", filter), ExpectedNames(store(), "jobs", filter))
          << "step " << step;
    }
  }
}

}  // namespace
}  // namespace gpufleet::store
