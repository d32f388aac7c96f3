// SPDX-License-Identifier: Apache-2.0
// PostgresStateStore against real PostgreSQL servers started by the tests (PostgresServer): the
// conformance suite, and what only this backend promises (sharing one database, surviving a
// server restart, keeping the password out of messages, the leader election and its fencing).
// Without the PostgreSQL binaries these tests fail: scripts/setup installs them.
#include "gpufleet/store/postgres_store.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <libpq-fe.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/store/state_store_conformance.h"
#include "gpufleet/store/testing/postgres_server.h"

namespace gpufleet::store {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::PostgresServer;

// An OK Result whose value matches `matcher`.
MATCHER_P(IsOkAndHolds, matcher, "") {
  if (!arg.ok()) {
    *result_listener << "which is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

// The server of every suite but PostgresOutageTest: started on first use, stopped (and its
// directory removed) when the program exits.
Result<PostgresServer*> SharedServer() {
  static Result<std::unique_ptr<PostgresServer>> server = PostgresServer::Start();
  if (!server.ok()) {
    return server.status();
  }
  return server->get();
}

// A fresh database name for each store under test.
std::string NextDatabaseName() {
  static int next = 0;
  return fmt::format("t{}", ++next);
}

std::vector<StateStoreBackend> PostgresBackends() {
  return {{"postgres", [](const std::string&) -> Result<std::shared_ptr<StateStore>> {
             GPUFLEET_ASSIGN_OR_RETURN(PostgresServer * server, SharedServer());
             GPUFLEET_ASSIGN_OR_RETURN(const std::string uri,
                                       server->CreateDatabase(NextDatabaseName()));
             GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<PostgresStateStore> store,
                                       PostgresStateStore::Open(uri));
             return std::shared_ptr<StateStore>(std::move(store));
           }}};
}

INSTANTIATE_TEST_SUITE_P(Postgres, StateStoreConformanceTest,
                         ::testing::ValuesIn(PostgresBackends()), StateStoreBackendName);

std::unique_ptr<PostgresStateStore> OpenOrFail(const std::string& uri) {
  Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri);
  EXPECT_OK(store);
  return store.ok() ? std::move(store).value() : nullptr;
}

// Each test on a new database of the shared server.
class PostgresStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<PostgresServer*> server = SharedServer();
    ASSERT_OK(server);
    server_ = *server;
    database_ = NextDatabaseName();
    Result<std::string> uri = server_->CreateDatabase(database_);
    ASSERT_OK(uri);
    uri_ = *uri;
  }

  // `database_`'s URI for `user` with `password` in the userinfo.
  std::string UriFor(const std::string& user, const std::string& password) const {
    return fmt::format("postgresql://{}:{}@127.0.0.1:{}/{}", user, password, server_->port(),
                       database_);
  }

  // Creates a login role that must give `password`, allowed to create the store's schema.
  void CreateRole(const std::string& role, const std::string& password) {
    ASSERT_OK(server_->Execute(
        database_, fmt::format("CREATE ROLE {} LOGIN PASSWORD '{}'; GRANT CREATE ON DATABASE {} "
                               "TO {}",
                               role, password, database_, role)));
  }

  PostgresServer* server_ = nullptr;
  std::string database_;
  std::string uri_;
};

TEST_F(PostgresStateStoreTest, CommittedStateSurvivesClosingAndReopening) {
  {
    std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->redacted_uri(), uri_);
    ASSERT_OK(store->Commit(WriteBatch().Create("node", "n1", "{}").Create("node", "n2", "{}")));
    ASSERT_OK(store->Commit(
        WriteBatch().Update("node", "n1", "v2", 1).AppendEvent("node", "n1", "updated")));
  }
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
  ASSERT_NE(store, nullptr);
  Result<StoredObject> n1 = store->Get("node", "n1");
  ASSERT_OK(n1);
  EXPECT_EQ(*n1, (StoredObject{"node", "n1", "v2", 2, 2}));
  Result<std::vector<StoredEvent>> events = store->Events("node", "n1");
  ASSERT_OK(events);
  EXPECT_THAT(*events, ElementsAre(StoredEvent{2, "updated"}));
  EXPECT_THAT(store->Revision(), IsOkAndHolds(2));
  ASSERT_OK(store->Commit(WriteBatch().Delete("node", "n2")));
  EXPECT_THAT(store->Revision(), IsOkAndHolds(3));
  // Reopening applied no migration twice.
  EXPECT_THAT(server_->QueryColumn(
                  database_, "SELECT version FROM gpufleet.schema_migrations ORDER BY version"),
              IsOkAndHolds(ElementsAre("1", "2", "3")));
}

TEST_F(PostgresStateStoreTest, StoresOnOneDatabaseSeeEachOthersCommitsAndConflicts) {
  std::unique_ptr<PostgresStateStore> a = OpenOrFail(uri_);
  std::unique_ptr<PostgresStateStore> b = OpenOrFail(uri_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);

  ASSERT_OK(a->Commit(WriteBatch().Create("job", "j", "v1").AppendEvent("job", "j", "by a")));
  Result<StoredObject> seen = b->Get("job", "j");
  ASSERT_OK(seen);
  EXPECT_EQ(*seen, (StoredObject{"job", "j", "v1", 1, 1}));

  // Both read version 1; b writes first, so a's compare-and-set fails.
  ASSERT_OK(b->Commit(WriteBatch().Update("job", "j", "v2 by b", 1).AppendEvent("job", "j", "b")));
  EXPECT_THAT(a->Commit(WriteBatch().Update("job", "j", "v2 by a", 1)),
              StatusIs(StatusCode::kAborted,
                       HasSubstr("version conflict: job/j is at version 2, expected 1 (batch op 1 "
                                 "of 1: update)")));
  EXPECT_THAT(a->Commit(WriteBatch().Create("job", "j", "again")),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("job/j already exists")));
  ASSERT_OK(a->Commit(WriteBatch().Delete("job", "j", 2)));
  EXPECT_THAT(b->Commit(WriteBatch().Delete("job", "j")),
              StatusIs(StatusCode::kNotFound, HasSubstr("job/j not found")));

  // One revision counter for both.
  EXPECT_THAT(a->Revision(), IsOkAndHolds(3));
  EXPECT_THAT(b->Revision(), IsOkAndHolds(3));
  Result<std::vector<StoredEvent>> events = a->Events("job", "j");
  ASSERT_OK(events);
  EXPECT_THAT(*events, ElementsAre(StoredEvent{1, "by a"}, StoredEvent{2, "b"}));
}

// Compare-and-set writers on separate connections (as several servers would be) lose no update,
// and the revision counter counts every commit once.
TEST_F(PostgresStateStoreTest, WritersOnSeparateConnectionsLoseNoUpdate) {
  constexpr int kWriters = 4;
  constexpr int kIncrementsPerWriter = 50;
  constexpr int kMaxAttempts = 10000;  // a livelock fails the test instead of hanging it
  std::unique_ptr<PostgresStateStore> setup = OpenOrFail(uri_);
  ASSERT_NE(setup, nullptr);
  ASSERT_OK(setup->Commit(WriteBatch().Create("counter", "c", "0")));

  std::vector<std::string> errors(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([this, w, &errors] {
      Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri_);
      if (!store.ok()) {
        errors[w] = store.status().ToString();
        return;
      }
      for (int i = 0; i < kIncrementsPerWriter; ++i) {
        bool done = false;
        for (int attempt = 0; attempt < kMaxAttempts && !done; ++attempt) {
          Result<StoredObject> counter = (*store)->Get("counter", "c");
          if (!counter.ok()) {
            errors[w] = counter.status().ToString();
            return;
          }
          int64_t value = 0;
          std::from_chars(counter->data.data(), counter->data.data() + counter->data.size(), value);
          const Status status = (*store)->Commit(
              WriteBatch().Update("counter", "c", std::to_string(value + 1), counter->version));
          if (status.ok()) {
            done = true;
          } else if (status.code() != StatusCode::kAborted) {
            errors[w] = status.ToString();
            return;
          }
        }
        if (!done) {
          errors[w] = "gave up after too many conflicts";
          return;
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
  Result<StoredObject> counter = setup->Get("counter", "c");
  ASSERT_OK(counter);
  EXPECT_EQ(counter->data, std::to_string(kWriters * kIncrementsPerWriter));
  EXPECT_THAT(setup->Revision(), IsOkAndHolds(1 + kWriters * kIncrementsPerWriter));
}

// Commits on separate connections that touch no common object still get one revision each, in
// commit order: revisions 1..N, and the events of one log in that order.
TEST_F(PostgresStateStoreTest, CommitsOnSeparateConnectionsGetOneRevisionEachInOrder) {
  constexpr int kWriters = 4;
  constexpr int kCommitsPerWriter = 15;
  std::vector<std::string> errors(kWriters);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([this, w, &errors] {
      Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri_);
      if (!store.ok()) {
        errors[w] = store.status().ToString();
        return;
      }
      for (int i = 0; i < kCommitsPerWriter; ++i) {
        const std::string name = fmt::format("w{}-{}", w, i);
        const Status status = (*store)->Commit(
            WriteBatch().Create("item", name, "{}").AppendEvent("log", "all", name));
        if (!status.ok()) {
          errors[w] = status.ToString();
          return;
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
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
  ASSERT_NE(store, nullptr);
  constexpr int kCommits = kWriters * kCommitsPerWriter;
  EXPECT_THAT(store->Revision(), IsOkAndHolds(kCommits));
  Result<std::vector<StoredEvent>> events = store->Events("log", "all");
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), static_cast<size_t>(kCommits));
  for (int i = 0; i < kCommits; ++i) {
    const StoredEvent& event = (*events)[static_cast<size_t>(i)];
    EXPECT_EQ(event.revision, i + 1) << event.text;
    Result<StoredObject> item = store->Get("item", event.text);
    ASSERT_OK(item);
    EXPECT_EQ(item->revision, event.revision) << event.text;
  }
}

TEST_F(PostgresStateStoreTest, StoresOpeningANewDatabaseAtOnceCreateTheSchemaOnce) {
  constexpr int kOpeners = 4;
  std::vector<Status> results(kOpeners);
  std::vector<std::thread> threads;
  for (int i = 0; i < kOpeners; ++i) {
    threads.emplace_back(
        [this, i, &results] { results[i] = PostgresStateStore::Open(uri_).status(); });
  }
  for (std::thread& thread : threads) {
    thread.join();
  }
  for (const Status& status : results) {
    EXPECT_OK(status);
  }
  EXPECT_THAT(server_->QueryColumn(
                  database_, "SELECT version FROM gpufleet.schema_migrations ORDER BY version"),
              IsOkAndHolds(ElementsAre("1", "2", "3")));
}

TEST_F(PostgresStateStoreTest, ADatabaseWithANewerSchemaIsRefused) {
  ASSERT_NE(OpenOrFail(uri_), nullptr);
  ASSERT_OK(server_->Execute(
      database_, "INSERT INTO gpufleet.schema_migrations (version, name) VALUES (999, 'future')"));
  EXPECT_THAT(
      PostgresStateStore::Open(uri_),
      StatusIs(StatusCode::kFailedPrecondition,
               HasSubstr(fmt::format("schema version 999, newer than the {} this gpufleet knows",
                                     PostgresStateStore::LatestSchemaVersion()))));
}

TEST_F(PostgresStateStoreTest, ADatabaseWrittenBeforeTheStateIndexIsBackFilledOnce) {
  {
    std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
    ASSERT_NE(store, nullptr);
    // Names that need quoting in an array literal, a malformed document, another kind.
    ASSERT_OK(
        store->Commit(WriteBatch()
                          .Create("jobs", R"(a"quote\back,{brace})", R"({"state": "Running"})")
                          .Create("jobs", "broken", "{\"state\": \"Run")
                          .Create("jobs", "done", R"({"state": "Succeeded"})")
                          .Create("nodes", "n1", R"({"state": "Ready"})")));
  }
  // Back to the schema of version 2, as a database written by an older gpufleet has it, plus
  // 2,500 jobs that older code wrote (more than one back-fill statement's worth).
  ASSERT_OK(server_->Execute(database_, R"sql(
DROP INDEX gpufleet.objects_by_state;
ALTER TABLE gpufleet.objects DROP COLUMN state;
DELETE FROM gpufleet.schema_migrations WHERE version > 2;
INSERT INTO gpufleet.objects (kind, name, data, version, revision)
  SELECT 'jobs', 'bulk-' || lpad(i::text, 4, '0'),
         convert_to('{"state": "' || (CASE WHEN i % 100 = 0 THEN 'Running' ELSE 'Failed' END)
                    || '"}', 'UTF8'), 1, 1
  FROM generate_series(1, 2500) AS i;
)sql"));
  for (int reopen = 0; reopen < 2; ++reopen) {
    std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
    ASSERT_NE(store, nullptr);
    Result<std::vector<StoredObject>> active =
        store->ListWhere("jobs", {.states = {"Succeeded", "Failed"}, .exclude_states = true});
    ASSERT_OK(active);
    std::vector<std::string> names;
    for (const StoredObject& object : *active) {
      names.push_back(object.name);
    }
    ASSERT_EQ(names.size(), 27u);
    EXPECT_EQ(names[0], R"(a"quote\back,{brace})");
    EXPECT_EQ(names[1], "broken");
    EXPECT_EQ(names[2], "bulk-0100");
    EXPECT_EQ(names[26], "bulk-2500");
    Result<std::vector<StoredObject>> ready = store->ListWhere("nodes", {.states = {"Ready"}});
    ASSERT_OK(ready);
    EXPECT_EQ(ready->size(), 1u);
  }
  EXPECT_THAT(server_->QueryColumn(
                  database_, "SELECT version FROM gpufleet.schema_migrations ORDER BY version"),
              IsOkAndHolds(ElementsAre("1", "2", "3")));
}

TEST_F(PostgresStateStoreTest, ConcurrentCommitsAreGroupedAndFailAlone) {
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->Commit(WriteBatch().Create("t", "taken", "{}")));
  // Another connection holds the store revision's row lock, so the first committer waits on it
  // and the rest queue behind that one.
  std::unique_ptr<PGconn, decltype(&PQfinish)> other(PQconnectdb(uri_.c_str()), &PQfinish);
  ASSERT_EQ(PQstatus(other.get()), CONNECTION_OK);
  PQclear(PQexec(other.get(), "BEGIN"));
  PGresult* locked =
      PQexec(other.get(), "SELECT revision FROM gpufleet.store_revision WHERE id FOR UPDATE");
  ASSERT_EQ(PQresultStatus(locked), PGRES_TUPLES_OK);
  PQclear(locked);
  constexpr int kThreads = 8;
  std::vector<Status> results(kThreads, Status::Ok());
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      WriteBatch batch;
      batch.Create("t", "obj-" + std::to_string(i), "{}");
      batch.AppendEvent("t", "obj-" + std::to_string(i), "made");
      if (i % 2 == 1) {
        batch.Create("t", "taken", "{}");  // fails: the whole batch is undone, alone
      }
      results[static_cast<size_t>(i)] = store->Commit(batch);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PQclear(PQexec(other.get(), "COMMIT"));
  for (std::thread& thread : threads) {
    thread.join();
  }
  std::set<int64_t> revisions;
  for (int i = 0; i < kThreads; ++i) {
    const std::string name = "obj-" + std::to_string(i);
    if (i % 2 == 1) {
      EXPECT_THAT(results[static_cast<size_t>(i)],
                  StatusIs(StatusCode::kAlreadyExists, HasSubstr("batch op 3 of 3")));
      EXPECT_THAT(store->Get("t", name), StatusIs(StatusCode::kNotFound));
      EXPECT_THAT(store->Events("t", name), IsOkAndHolds(::testing::IsEmpty()));
      continue;
    }
    EXPECT_OK(results[static_cast<size_t>(i)]);
    const Result<StoredObject> object = store->Get("t", name);
    ASSERT_OK(object);
    revisions.insert(object->revision);
    const Result<std::vector<StoredEvent>> events = store->Events("t", name);
    ASSERT_OK(events);
    ASSERT_EQ(events->size(), 1u);
    EXPECT_EQ((*events)[0].revision, object->revision);
  }
  // Revisions 2..5, one per successful batch, none for the failed ones.
  EXPECT_EQ(revisions, (std::set<int64_t>{2, 3, 4, 5}));
  EXPECT_THAT(store->Revision(), IsOkAndHolds(5));
  EXPECT_EQ(store->List("t")->size(), 5u);
}

TEST_F(PostgresStateStoreTest, ListPrefixesEndingInTheHighestCodePointsAreExact) {
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
  ASSERT_NE(store, nullptr);
  const std::string d7ff = "\xed\x9f\xbf";           // U+D7FF, the last code point below surrogates
  const std::string e000 = "\xee\x80\x80";           // U+E000, the first above them
  const std::string max = "\xf4\x8f\xbf\xbf";        // U+10FFFF
  const std::string below_max = "\xf4\x8f\xbf\xbe";  // U+10FFFE
  WriteBatch batch;
  for (const std::string& name : {"a" + d7ff, "a" + d7ff + "b", "a" + e000, max, max + "x",
                                  max + max, below_max + "z", std::string("z")}) {
    batch.Create("k", name, "{}");
  }
  ASSERT_OK(store->Commit(batch));
  const auto names = [&](const std::string& prefix) {
    std::vector<std::string> found;
    Result<std::vector<StoredObject>> objects = store->List("k", prefix);
    EXPECT_OK(objects);
    if (objects.ok()) {
      for (const StoredObject& object : *objects) {
        found.push_back(object.name);
      }
    }
    return found;
  };
  EXPECT_THAT(names("a" + d7ff), ElementsAre("a" + d7ff, "a" + d7ff + "b"));
  EXPECT_THAT(names(max), ElementsAre(max, max + "x", max + max));
  EXPECT_THAT(names(below_max), ElementsAre(below_max + "z"));
  EXPECT_THAT(names(max + max), ElementsAre(max + max));
}

TEST_F(PostgresStateStoreTest, APasswordNeverAppearsInAnErrorMessage) {
  const std::string password = "S3cretPassw0rd";
  CreateRole("app", password);

  // The right password in the URI works; the redacted URI hides it.
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(UriFor("app", password));
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(store->redacted_uri(),
              AllOf(HasSubstr("app:***@127.0.0.1"), Not(HasSubstr(password))));
  ASSERT_OK(store->Commit(WriteBatch().Create("node", "n1", "{}")));

  const std::string wrong = "Wr0ngPassw0rd";
  const std::vector<std::string> uris = {
      UriFor("app", wrong),
      fmt::format("postgresql://app@127.0.0.1:{}/{}?password={}", server_->port(), database_,
                  wrong),
      // Nothing listens on port 1.
      fmt::format("postgresql://app:{}@127.0.0.1:1/{}", wrong, database_),
  };
  for (const std::string& uri : uris) {
    SCOPED_TRACE(uri);
    Result<std::unique_ptr<PostgresStateStore>> opened = PostgresStateStore::Open(uri);
    EXPECT_THAT(opened,
                StatusIs(StatusCode::kUnavailable, AllOf(HasSubstr("***"), Not(HasSubstr(wrong)))));
  }
  EXPECT_THAT(PostgresStateStore::Open(UriFor("app", wrong)),
              StatusIs(StatusCode::kUnavailable, HasSubstr("password authentication failed")));
  // libpq quotes a malformed percent-encoded value in its message.
  EXPECT_THAT(PostgresStateStore::Open(UriFor("app", "Wr0ng%zzPass")),
              StatusIs(StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("percent-encoded"), Not(HasSubstr("Wr0ng")))));
}

TEST_F(PostgresStateStoreTest, APasswordFileIsUsedWhenTheUriHasNone) {
  const std::string password = "Fr0mTheFile";
  CreateRole("filer", password);
  std::string pattern = ::testing::TempDir() + "/gpufleet_pgpass_XXXXXX";
  const int fd = mkstemp(pattern.data());
  ASSERT_GE(fd, 0);
  const std::string line =
      fmt::format("127.0.0.1:{}:{}:filer:{}\n", server_->port(), database_, password);
  ASSERT_EQ(write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  close(fd);  // mkstemp made it 0600, as libpq requires
  ASSERT_EQ(setenv("PGPASSFILE", pattern.c_str(), 1), 0);
  const std::string uri =
      fmt::format("postgresql://filer@127.0.0.1:{}/{}", server_->port(), database_);
  Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri);
  unsetenv("PGPASSFILE");
  std::filesystem::remove(pattern);
  ASSERT_OK(store);
  EXPECT_OK((*store)->Commit(WriteBatch().Create("node", "n1", "{}")));
}

TEST_F(PostgresStateStoreTest, AnOversizedOrMalformedUriIsInvalidArgument) {
  struct Case {
    std::string uri;
    std::string message;
  };
  const std::string base =
      fmt::format("postgresql://gf@127.0.0.1:{}/{}", server_->port(), database_);
  const std::vector<Case> cases = {
      {base + "?application_name=" + std::string(5000, 'x'), "more than the limit of 4096"},
      {"", "must start with postgresql://"},
      {"mysql://gf@127.0.0.1/db", "must start with postgresql://"},
      {"host=127.0.0.1 dbname=x password=secret", "must start with postgresql://"},
      {base + " ", "space, control or non-ASCII byte at byte"},
      {base + "\n", "space, control or non-ASCII byte at byte"},
      {"postgresql://gf@127.0.0.1:port/db", "invalid port"},
      {base + "?no_such_option=1", "is not valid"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    EXPECT_THAT(PostgresStateStore::Open(c.uri),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.message)));
  }
  EXPECT_THAT(PostgresStateStore::Open("host=127.0.0.1 dbname=x password=secret"),
              StatusIs(StatusCode::kInvalidArgument, Not(HasSubstr("secret"))));
  EXPECT_OK(PostgresStateStore::Open("postgres://" + base.substr(13)));
}

TEST_F(PostgresStateStoreTest, AConnectionTheServerEndsIsReplacedOnTheNextCall) {
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->Commit(WriteBatch().Create("node", "n1", "{}")));
  EXPECT_THAT(
      server_->QueryColumn(
          database_, fmt::format("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                                 "datname = '{}' AND application_name = 'gpufleet'",
                                 database_)),
      IsOkAndHolds(ElementsAre("t")));
  // The dead idle connection is noticed and replaced within the same call.
  EXPECT_OK(store->Get("node", "n1"));
  ASSERT_OK(store->Commit(WriteBatch().Create("node", "n2", "{}")));
  EXPECT_THAT(store->Revision(), IsOkAndHolds(2));
}

// The connection drops while COMMIT runs (a deferred trigger ends the session): the caller cannot
// know whether the batch was applied, and is told so.
TEST_F(PostgresStateStoreTest, ACommitWhoseAnswerIsLostIsUnavailableWithItsOutcomeUnknown) {
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri_);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(server_->Execute(database_, R"sql(
CREATE FUNCTION gpufleet.end_session() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.name = 'doomed' THEN
    PERFORM pg_terminate_backend(pg_backend_pid());
  END IF;
  RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER end_session_at_commit AFTER INSERT ON gpufleet.objects
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION gpufleet.end_session();
)sql"));
  EXPECT_THAT(
      store->Commit(WriteBatch().Create("node", "doomed", "{}")),
      StatusIs(StatusCode::kUnavailable, HasSubstr("the outcome of the commit is unknown")));
  // Here it was not applied; the store carries on with a new connection.
  EXPECT_THAT(store->Get("node", "doomed"), StatusIs(StatusCode::kNotFound));
  ASSERT_OK(store->Commit(WriteBatch().Create("node", "fine", "{}")));
  EXPECT_THAT(store->Revision(), IsOkAndHolds(1));
}

// Stops and starts its own server.
TEST(PostgresOutageTest, AStoppedServerIsUnavailableAndTheStoreRecoversWhenItIsBack) {
  Result<std::unique_ptr<PostgresServer>> server = PostgresServer::Start();
  ASSERT_OK(server);
  const std::string uri = (*server)->Uri();
  std::unique_ptr<PostgresStateStore> store = OpenOrFail(uri);
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->Commit(WriteBatch().Create("job", "j1", "{}")));

  ASSERT_OK((*server)->Stop());
  EXPECT_THAT(store->Get("job", "j1"), StatusIs(StatusCode::kUnavailable, HasSubstr(uri)));
  EXPECT_THAT(store->Commit(WriteBatch().Create("job", "j2", "{}")),
              StatusIs(StatusCode::kUnavailable, HasSubstr("connecting")));
  EXPECT_THAT(store->List("job"), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(store->Revision(), StatusIs(StatusCode::kUnavailable));
  EXPECT_THAT(store->Events("job", "j1"), StatusIs(StatusCode::kUnavailable));

  ASSERT_OK((*server)->StartAgain());
  Result<StoredObject> j1 = store->Get("job", "j1");
  ASSERT_OK(j1);
  EXPECT_EQ(*j1, (StoredObject{"job", "j1", "{}", 1, 1}));
  EXPECT_THAT(store->Get("job", "j2"), StatusIs(StatusCode::kNotFound));
  ASSERT_OK(store->Commit(WriteBatch().Create("job", "j2", "{}")));
  EXPECT_THAT(store->Revision(), IsOkAndHolds(2));

  // Stopped while idle, started again before the next call: that call does not fail at all.
  ASSERT_OK((*server)->Stop());
  ASSERT_OK((*server)->StartAgain());
  EXPECT_OK(store->Commit(WriteBatch().Create("job", "j3", "{}")));
  EXPECT_THAT(store->Revision(), IsOkAndHolds(3));
}

// ---- leader election ----------------------------------------------------------------------
// PostgresLeaderElection: one leader per lease, takeover after expiry with a higher token, and
// fencing: a deposed holder's commits are refused and change nothing. Expiry is brought about by
// moving the lease's expires_at into the past (as if the holder had stopped renewing long ago), so
// that no test waits on a wall clock.

// One server's view of the database: its store and its election.
struct Campaigner {
  std::unique_ptr<PostgresStateStore> store;
  std::unique_ptr<PostgresLeaderElection> election;
};

// Each test on a new database of the shared server, as PostgresStateStoreTest.
class PostgresLeaderElectionTest : public PostgresStateStoreTest {
 protected:
  Campaigner Join(const std::string& identity) {
    Campaigner campaigner;
    Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri_);
    EXPECT_OK(store);
    if (!store.ok()) {
      return campaigner;
    }
    campaigner.store = std::move(store).value();
    Result<std::unique_ptr<PostgresLeaderElection>> election = PostgresLeaderElection::Open(
        uri_, *campaigner.store,
        {.identity = identity, .address = "http://" + identity + ":8080", .lease = kLease});
    EXPECT_OK(election);
    if (election.ok()) {
      campaigner.election = std::move(election).value();
    }
    return campaigner;
  }

  // As if the holder had not renewed for longer than the lease.
  void ExpireLease() {
    ASSERT_OK(server_->Execute(
        database_, "UPDATE gpufleet.leader_lease SET expires_at = now() - interval '1 second'"));
  }

  std::vector<std::string> Column(const std::string& sql) {
    Result<std::vector<std::string>> column = server_->QueryColumn(database_, sql);
    EXPECT_OK(column);
    return column.ok() ? *column : std::vector<std::string>();
  }

  static constexpr std::chrono::milliseconds kLease{5000};
};

TEST_F(PostgresLeaderElectionTest, OneCampaignerHoldsTheLeaseAndTheOtherFollows) {
  Campaigner a = Join("a");
  Campaigner b = Join("b");
  ASSERT_NE(a.election, nullptr);
  ASSERT_NE(b.election, nullptr);
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 1, "a", "http://a:8080"}));
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(LeaseState{false, 1, "a", "http://a:8080"}));
  // Renewing keeps the token; the lease runs for its duration on the database's clock.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 1, "a", "http://a:8080"}));
  const std::vector<std::string> left = Column(
      "SELECT (extract(epoch FROM expires_at - now()) * 1000)::bigint FROM gpufleet.leader_lease");
  ASSERT_EQ(left.size(), 1u);
  EXPECT_GT(std::stoll(left[0]), 4000);
  EXPECT_LE(std::stoll(left[0]), 5000);

  EXPECT_OK(a.store->Commit(WriteBatch().Create("job", "j1", "by a")));
  EXPECT_THAT(b.store->Commit(WriteBatch().Create("job", "j2", "by b")),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("not the leader"), HasSubstr("does not hold the lease"),
                             HasSubstr("the leader is a at http://a:8080"))));
  EXPECT_THAT(Column("SELECT name FROM gpufleet.objects ORDER BY name"), ElementsAre("j1"));
  // Reads are not fenced.
  EXPECT_THAT(b.store->Get("job", "j1"),
              IsOkAndHolds(::testing::Field(&StoredObject::data, "by a")));
}

TEST_F(PostgresLeaderElectionTest, AnExpiredLeaseIsTakenOverWithAHigherTokenAndFencesTheOldHolder) {
  Campaigner a = Join("a");
  Campaigner b = Join("b");
  ASSERT_NE(a.election, nullptr);
  ASSERT_NE(b.election, nullptr);
  ASSERT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, true)));
  ASSERT_OK(a.store->Commit(WriteBatch().Create("job", "j1", "v1")));
  // a stops renewing; while its lease lasts b cannot take it, once it has expired b can.
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, false)));
  ExpireLease();
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(LeaseState{true, 2, "b", "http://b:8080"}));

  // a's store still believes it holds token 1 (a has not campaigned since): the database
  // refuses its late write, and the row is not changed.
  const std::vector<std::string> revision_before =
      Column("SELECT revision FROM gpufleet.store_revision");
  EXPECT_THAT(
      a.store->Commit(WriteBatch().Update("job", "j1", "late write by a", 1)),
      StatusIs(StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("not the leader: fencing token 1 is stale"), HasSubstr("at token 2"),
                     HasSubstr("the leader is b at http://b:8080"))));
  EXPECT_THAT(Column("SELECT encode(data, 'escape') || ' ' || version FROM gpufleet.objects"),
              ElementsAre("v1 1"));
  EXPECT_EQ(Column("SELECT revision FROM gpufleet.store_revision"), revision_before);
  EXPECT_THAT(Column("SELECT count(*) FROM gpufleet.events"), ElementsAre("0"));

  EXPECT_OK(b.store->Commit(WriteBatch().Update("job", "j1", "v2 by b", 1)));
  // a, campaigning again, learns it follows b and stays fenced.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{false, 2, "b", "http://b:8080"}));
  EXPECT_THAT(a.store->Commit(WriteBatch().Create("job", "j3", "")),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("does not hold the lease")));
}

TEST_F(PostgresLeaderElectionTest, AHolderWhoseLeaseExpiredCannotCommitUntilItRenews) {
  Campaigner a = Join("a");
  ASSERT_NE(a.election, nullptr);
  ASSERT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::token, 1)));
  ExpireLease();
  EXPECT_THAT(a.store->Commit(WriteBatch().Create("job", "j1", "")),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("of fencing token 1 expired before it was renewed")));
  // No one took over meanwhile: renewing keeps the term and its token.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 1, "a", "http://a:8080"}));
  EXPECT_OK(a.store->Commit(WriteBatch().Create("job", "j1", "")));
}

TEST_F(PostgresLeaderElectionTest, ResigningHandsTheLeaseOverAtOnce) {
  Campaigner a = Join("a");
  Campaigner b = Join("b");
  ASSERT_NE(a.election, nullptr);
  ASSERT_NE(b.election, nullptr);
  ASSERT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, true)));
  ASSERT_OK(a.election->Resign());
  EXPECT_THAT(a.store->Commit(WriteBatch().Create("job", "j1", "")),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not the leader")));
  EXPECT_THAT(b.election->Campaign(), IsOkAndHolds(LeaseState{true, 2, "b", "http://b:8080"}));
  // Coming back, a starts a new term only once b's lease has expired.
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(::testing::Field(&LeaseState::leader, false)));
  ExpireLease();
  EXPECT_THAT(a.election->Campaign(), IsOkAndHolds(LeaseState{true, 3, "a", "http://a:8080"}));
}

TEST_F(PostgresLeaderElectionTest, AnEmptyIdentityOrATinyLeaseIsInvalid) {
  Result<std::unique_ptr<PostgresStateStore>> store = PostgresStateStore::Open(uri_);
  ASSERT_OK(store);
  EXPECT_THAT(PostgresLeaderElection::Open(uri_, **store, {.identity = ""}).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("identity")));
  EXPECT_THAT(PostgresLeaderElection::Open(
                  uri_, **store, {.identity = "a", .lease = std::chrono::milliseconds(10)})
                  .status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("10 ms")));
}

}  // namespace
}  // namespace gpufleet::store
