// SPDX-License-Identifier: Apache-2.0
// What only the SQLite backend promises: durability across reopen, migrations, refusing files it
// cannot use. Its StateStore behaviour is in state_store_conformance_test.cc.
#include "gpufleet/store/sqlite_store.h"

#include <sqlite3.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/directory_lock.h"
#include "gpufleet/store/testing/fault_injecting_store.h"

namespace gpufleet::store {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using FaultMode = testing::FaultInjectingStateStore::FaultMode;

class SqliteStateStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_sqlite_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
    path_ = dir_ + "/state.db";
  }

  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::unique_ptr<SqliteStateStore> OpenOrDie() {
    Result<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(path_);
    EXPECT_OK(store);
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // Runs `sql` on the file through a connection of its own; the integer results, row by row.
  std::vector<int64_t> RawQuery(const std::string& sql) {
    sqlite3* db = nullptr;
    EXPECT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    std::vector<int64_t> values;
    sqlite3_stmt* statement = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &statement, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db);
    int rc = SQLITE_ROW;
    while (statement != nullptr && (rc = sqlite3_step(statement)) == SQLITE_ROW) {
      values.push_back(sqlite3_column_int64(statement, 0));
    }
    EXPECT_EQ(rc, SQLITE_DONE) << sqlite3_errmsg(db);
    sqlite3_finalize(statement);
    sqlite3_close(db);
    return values;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(SqliteStateStoreTest, CommittedStateSurvivesClosingAndReopening) {
  {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->path(), path_);
    ASSERT_OK(store->Commit(WriteBatch().Create("node", "n1", "{}").Create("node", "n2", "{}")));
    ASSERT_OK(store->Commit(
        WriteBatch().Update("node", "n1", "v2", 1).AppendEvent("node", "n1", "updated")));
    ASSERT_OK(store->Commit(WriteBatch().Delete("node", "n2")));
  }
  std::unique_ptr<SqliteStateStore> store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  Result<int64_t> revision = store->Revision();
  ASSERT_OK(revision);
  EXPECT_EQ(*revision, 3);
  Result<StoredObject> n1 = store->Get("node", "n1");
  ASSERT_OK(n1);
  EXPECT_EQ(*n1, (StoredObject{"node", "n1", "v2", 2, 2}));
  EXPECT_THAT(store->Get("node", "n2"), StatusIs(StatusCode::kNotFound));
  Result<std::vector<StoredEvent>> events = store->Events("node", "n1");
  ASSERT_OK(events);
  EXPECT_THAT(*events, ElementsAre(StoredEvent{2, "updated"}));

  // The revision carries on from where it was.
  ASSERT_OK(store->Commit(WriteBatch().Create("node", "n3", "{}")));
  revision = store->Revision();
  ASSERT_OK(revision);
  EXPECT_EQ(*revision, 4);
}

TEST_F(SqliteStateStoreTest, UsesWriteAheadLogging) {
  ASSERT_NE(OpenOrDie(), nullptr);
  // journal_mode=WAL is stored in the file; a fresh connection reports it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* statement = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &statement, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(statement), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(statement, 0)), "wal");
  sqlite3_finalize(statement);
  sqlite3_close(db);
}

// The database holds secrets (jobs' environment, token hashes): the server's user alone may read
// it, its write-ahead log included, whatever the umask; a file an older version made 0644 is
// tightened on open.
TEST_F(SqliteStateStoreTest, TheDatabaseAndItsLogAreOwnerOnly) {
  const auto mode_of = [](const std::string& path) {
    return std::filesystem::status(path).permissions() & std::filesystem::perms::all;
  };
  const mode_t old_umask = umask(0);
  {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(store->Commit(WriteBatch().Create("jobs", "j", R"({"env": {"KEY": "secret"}})")));
    for (const std::string& path : {path_, path_ + "-wal", path_ + "-shm"}) {
      ASSERT_TRUE(std::filesystem::exists(path)) << path;
      EXPECT_EQ(mode_of(path),
                std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)
          << path;
    }
  }
  std::filesystem::permissions(
      path_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                 std::filesystem::perms::group_read | std::filesystem::perms::others_read);
  ASSERT_NE(OpenOrDie(), nullptr);
  umask(old_umask);
  EXPECT_EQ(mode_of(path_),
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

TEST_F(SqliteStateStoreTest, MigrationsAreAppliedOnce) {
  std::vector<int64_t> expected;
  for (int64_t version = 1; version <= SqliteStateStore::LatestSchemaVersion(); ++version) {
    expected.push_back(version);
  }
  {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(store->Commit(WriteBatch().Create("node", "n1", "{}")));
  }
  EXPECT_EQ(RawQuery("SELECT version FROM schema_migrations ORDER BY version"), expected);
  // Re-applying migration 1 would fail (CREATE TABLE objects) or reset the revision.
  for (int reopen = 0; reopen < 2; ++reopen) {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    Result<int64_t> revision = store->Revision();
    ASSERT_OK(revision);
    EXPECT_EQ(*revision, 1);
    EXPECT_OK(store->Get("node", "n1"));
  }
  EXPECT_EQ(RawQuery("SELECT version FROM schema_migrations ORDER BY version"), expected);
}

TEST_F(SqliteStateStoreTest, RefusesADatabaseWithANewerSchema) {
  ASSERT_NE(OpenOrDie(), nullptr);
  const int64_t newer = SqliteStateStore::LatestSchemaVersion() + 1;
  RawQuery("INSERT INTO schema_migrations (version, name) VALUES (" + std::to_string(newer) +
           ", 'from the future')");
  EXPECT_THAT(SqliteStateStore::Open(path_),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path_), HasSubstr("schema version " + std::to_string(newer)),
                             HasSubstr("newer"))));
}

TEST_F(SqliteStateStoreTest, RefusesAFileThatIsNotADatabase) {
  {
    std::ofstream garbage(path_);
    garbage << "this is not a SQLite database, just some text that is long enough to have a "
               "header of a hundred bytes, which SQLite reads before anything else it does\n";
  }
  EXPECT_THAT(SqliteStateStore::Open(path_),
              StatusIs(StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(path_), HasSubstr("not a database"))));
}

TEST_F(SqliteStateStoreTest, RefusesAPathInAMissingDirectory) {
  const std::string path = dir_ + "/missing/state.db";
  EXPECT_THAT(
      SqliteStateStore::Open(path),
      StatusIs(StatusCode::kUnavailable, AllOf(HasSubstr(path), HasSubstr("unable to open"))));
}

TEST_F(SqliteStateStoreTest, FaultInjectorFailsExactlyTheNthCommitAndWritesNothingOfIt) {
  std::unique_ptr<SqliteStateStore> inner = OpenOrDie();
  ASSERT_NE(inner, nullptr);
  testing::FaultInjectingStateStore store(*inner);
  store.FailNthCommit(3);
  ASSERT_OK(store.Commit(WriteBatch().Create("pod", "p1", "{}")));
  ASSERT_OK(store.Commit(WriteBatch().Create("pod", "p2", "{}")));
  EXPECT_OK(store.Commit(WriteBatch()));  // answered before the backend: not counted
  EXPECT_THAT(store.Commit(WriteBatch().Create("pod", "p3", "{}").AppendEvent("pod", "p1", "x")),
              StatusIs(StatusCode::kUnavailable, HasSubstr("injected fault: commit 3")));
  ASSERT_OK(store.Commit(WriteBatch().Create("pod", "p4", "{}")));
  EXPECT_EQ(store.commit_count(), 4);
  EXPECT_EQ(store.injected_faults(), 1);

  EXPECT_THAT(inner->Get("pod", "p3"), StatusIs(StatusCode::kNotFound));
  Result<std::vector<StoredEvent>> events = inner->Events("pod", "p1");
  ASSERT_OK(events);
  EXPECT_THAT(*events, IsEmpty());
  Result<std::vector<StoredObject>> pods = store.List("pod");
  ASSERT_OK(pods);
  ASSERT_EQ(pods->size(), 3u);
  EXPECT_EQ((*pods)[2], (StoredObject{"pod", "p4", "{}", 1, 3}));
  Result<int64_t> revision = store.Revision();
  ASSERT_OK(revision);
  EXPECT_EQ(*revision, 3);
}

TEST_F(SqliteStateStoreTest, FaultInjectorCanFailACommitAfterWritingIt) {
  std::unique_ptr<SqliteStateStore> inner = OpenOrDie();
  ASSERT_NE(inner, nullptr);
  testing::FaultInjectingStateStore store(*inner);
  store.FailNthCommit(1, FaultMode::kAfterCommit);
  EXPECT_THAT(store.Commit(WriteBatch().Create("pod", "p1", "{}")),
              StatusIs(StatusCode::kUnavailable, HasSubstr("after it was written")));
  EXPECT_OK(store.Get("pod", "p1"));

  store.FailNthCommit(1);
  store.ClearFault();
  EXPECT_OK(store.Commit(WriteBatch().Create("pod", "p2", "{}")));
  EXPECT_EQ(store.injected_faults(), 1);
}

// Group commit: batches committed while another transaction holds the write lock queue up and go
// into one transaction together, each in its own savepoint. A failing batch of the group is
// undone alone; every successful one is durable with a revision of its own.
TEST_F(SqliteStateStoreTest, ConcurrentCommitsAreGroupedAndFailAlone) {
  std::unique_ptr<SqliteStateStore> store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->Commit(WriteBatch().Create("t", "taken", "{}")));
  // Another connection holds the write lock, so the first committer waits on it and the rest
  // queue behind that one.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
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
  ASSERT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
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
      EXPECT_THAT(*store->Events("t", name), IsEmpty());
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
  EXPECT_EQ(*store->Revision(), 5);
  store.reset();
  std::unique_ptr<SqliteStateStore> reopened = OpenOrDie();
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(*reopened->Revision(), 5);
  EXPECT_EQ(reopened->List("t")->size(), 5u);
}

TEST_F(SqliteStateStoreTest, AGetDoesNotWaitForACommitInProgress) {
  std::unique_ptr<SqliteStateStore> store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  ASSERT_OK(store->Commit(WriteBatch().Create("t", "read", R"({"n":1})")));
  // Another connection holds the write lock, so the commit below waits for it inside the store,
  // holding the writer connection, until that lock is released after the Get.
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  std::atomic<bool> committed = false;
  Status commit = Status::Ok();
  std::thread writer([&] {
    commit = store->Commit(WriteBatch().Update("t", "read", R"({"n":2})", 1));
    committed.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // A Get through the writer connection would wait for that commit, which waits for `other`:
  // returned only after the busy timeout failed the commit.
  const Result<StoredObject> during = store->Get("t", "read");
  const bool commit_done_before_the_get = committed.load();
  ASSERT_EQ(sqlite3_exec(other, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(other);
  writer.join();
  EXPECT_FALSE(commit_done_before_the_get);
  ASSERT_OK(during);
  EXPECT_EQ(during->data, R"({"n":1})");  // the last committed state
  EXPECT_OK(commit);
  // Once the commit has returned, a Get sees it.
  const Result<StoredObject> after = store->Get("t", "read");
  ASSERT_OK(after);
  EXPECT_EQ(after->data, R"({"n":2})");
  EXPECT_EQ(after->version, 2);
}

// Names of the objects ListWhere returns, or the error.
std::vector<std::string> ListWhereNames(StateStore& store, std::string_view kind,
                                        const ListFilter& filter) {
  Result<std::vector<StoredObject>> objects = store.ListWhere(kind, filter);
  if (!objects.ok()) {
    return {objects.status().ToString()};
  }
  std::vector<std::string> names;
  for (const StoredObject& object : *objects) {
    names.push_back(object.name);
  }
  return names;
}

const ListFilter kNotFinished{.states = {"Succeeded", "Failed", "Cancelled"},
                              .exclude_states = true};

TEST_F(SqliteStateStoreTest, AStoreWrittenBeforeTheStateIndexIsBackFilledOnce) {
  {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(store->Commit(WriteBatch()
                                .Create("jobs", "done", R"({"state": "Succeeded"})")
                                .Create("jobs", "running", R"({"state": "Running"})")
                                .Create("jobs", "broken", "{\"state\": \"Run")
                                .Create("nodes", "n1", R"({"state": "Ready"})")));
  }
  // Back to the schema of version 1, as a store written by an older gpufleet has it, plus an
  // object that older code wrote.
  RawQuery("DROP INDEX objects_by_state");
  RawQuery("ALTER TABLE objects DROP COLUMN state");
  RawQuery("DELETE FROM schema_migrations WHERE version > 1");
  RawQuery(R"(INSERT INTO objects (kind, name, data, version, revision)
              VALUES ('jobs', 'pending', CAST('{"state": "Pending"}' AS BLOB), 1, 1))");
  for (int reopen = 0; reopen < 2; ++reopen) {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    EXPECT_THAT(ListWhereNames(*store, "jobs", kNotFinished),
                ElementsAre("broken", "pending", "running"));
    EXPECT_THAT(ListWhereNames(*store, "jobs", {.states = {"Succeeded"}}), ElementsAre("done"));
    EXPECT_THAT(ListWhereNames(*store, "nodes", {.states = {"Ready"}}), ElementsAre("n1"));
    EXPECT_EQ(RawQuery("SELECT COUNT(*) FROM schema_migrations WHERE version = 2"),
              std::vector<int64_t>{1});
  }
}

// A server killed with its jobs written: the reopened store's index lists every active job.
TEST_F(SqliteStateStoreTest, ACrashedWriterLeavesNoActiveJobOutOfTheIndex) {
  ASSERT_NE(OpenOrDie(), nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Result<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(path_);
    for (int i = 0; store.ok() && i < 20; ++i) {
      const std::string name = fmt::format("job-{:02}", i);
      WriteBatch batch;
      batch.Create("jobs", name, R"({"state": "Pending"})");
      batch.Update("jobs", name, i % 2 == 0 ? R"({"state": "Running"})" : R"({"state": "Failed"})",
                   1);
      if (!(*store)->Commit(batch).ok()) {
        _exit(2);
      }
    }
    _exit(store.ok() ? 9 : 3);  // no destructor runs: the WAL is left as a crash leaves it
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 9);
  std::unique_ptr<SqliteStateStore> store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  const std::vector<std::string> active = ListWhereNames(*store, "jobs", kNotFinished);
  EXPECT_EQ(active.size(), 10u);
  for (int i = 0; i < 20; i += 2) {
    EXPECT_THAT(active, Contains(fmt::format("job-{:02}", i)));
  }
}

// `gpufleet admin backup` while the server runs, then `restore` once it is stopped: jobs, nodes
// and tokens come back as they were at the backup, and what was written after it is gone (kept
// in the pre-restore copy).
TEST_F(SqliteStateStoreTest, BackupWhileOpenAndRestoreRoundTrip) {
  const std::string backup = dir_ + "/backup.db";
  {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    ASSERT_OK(store->Commit(WriteBatch()
                                .Create("jobs", "nlp/bert", R"({"state": "Running"})")
                                .Create("nodes", "n1", R"({"state": "Ready"})")
                                .Create("tokens", "ab12", R"({"role": "admin"})")
                                .AppendEvent("jobs", "nlp/bert", "submitted")));
    const Result<int64_t> version = SqliteStateStore::Backup(path_, backup);
    ASSERT_OK(version);
    EXPECT_EQ(*version, SqliteStateStore::LatestSchemaVersion());
    ASSERT_OK(store->Commit(WriteBatch().Create("jobs", "nlp/after", R"({"state": "Pending"})")));
    EXPECT_THAT(SqliteStateStore::Backup(path_, backup),
                StatusIs(StatusCode::kAlreadyExists, HasSubstr("backup.db: exists")));
  }
  struct stat st = {};
  ASSERT_EQ(stat(backup.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(std::filesystem::exists(backup + ".partial"));

  const Result<int64_t> restored = SqliteStateStore::Restore(backup, path_);
  ASSERT_OK(restored);
  EXPECT_EQ(*restored, SqliteStateStore::LatestSchemaVersion());
  std::unique_ptr<SqliteStateStore> store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  EXPECT_OK(store->Get("jobs", "nlp/bert"));
  EXPECT_OK(store->Get("nodes", "n1"));
  EXPECT_OK(store->Get("tokens", "ab12"));
  EXPECT_THAT(store->Get("jobs", "nlp/after").status(), StatusIs(StatusCode::kNotFound));
  const Result<std::vector<StoredEvent>> events = store->Events("jobs", "nlp/bert");
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].text, "submitted");
  // Writable after the restore, and the store it replaced kept beside it.
  EXPECT_OK(store->Commit(WriteBatch().Create("jobs", "nlp/next", "{}")));
  const std::string replaced = path_ + ".pre-restore.bak";
  ASSERT_TRUE(std::filesystem::exists(replaced));
  Result<std::unique_ptr<SqliteStateStore>> before = SqliteStateStore::Open(replaced);
  ASSERT_OK(before);
  EXPECT_OK((*before)->Get("jobs", "nlp/after"));
}

TEST_F(SqliteStateStoreTest, RestoreIsRefusedWhileAServerHoldsTheDataDirectory) {
  ASSERT_NE(OpenOrDie(), nullptr);
  const std::string backup = dir_ + "/backup.db";
  ASSERT_OK(SqliteStateStore::Backup(path_, backup));
  // The lock `gpufleet server` takes on its data directory. flock locks belong to open file
  // descriptions, so Restore's own attempt is refused in this process as in another.
  Result<DirectoryLock> server = DirectoryLock::Acquire(dir_);
  ASSERT_OK(server);
  EXPECT_THAT(SqliteStateStore::Restore(backup, path_),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr(fmt::format("in use by process {}", getpid()))));
}

TEST_F(SqliteStateStoreTest, BackupAndRestoreRefuseWhatIsNotAGpufleetStore) {
  const std::string other = dir_ + "/other.db";
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(other.c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t (x INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
    sqlite3_close(db);
  }
  EXPECT_THAT(SqliteStateStore::Restore(other, path_),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not a gpufleet store")));
  EXPECT_FALSE(std::filesystem::exists(path_));
  EXPECT_THAT(SqliteStateStore::Backup(other, dir_ + "/copy.db"),
              StatusIs(StatusCode::kFailedPrecondition, HasSubstr("not a gpufleet store")));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/copy.db"));
  EXPECT_THAT(SqliteStateStore::Backup(dir_ + "/missing.db", dir_ + "/copy.db"),
              StatusIs(StatusCode::kNotFound, HasSubstr("missing.db: no store there")));
}

// An upgrade that migrates the schema copies the store first, at the version it had.
TEST_F(SqliteStateStoreTest, AMigrationBacksTheStoreUpFirst) {
  {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->pre_migration_backup(), "");  // a new store: nothing to keep
    ASSERT_OK(store->Commit(WriteBatch().Create("jobs", "old", R"({"state": "Running"})")));
  }
  RawQuery("DROP INDEX objects_by_state");
  RawQuery("ALTER TABLE objects DROP COLUMN state");
  RawQuery("DELETE FROM schema_migrations WHERE version > 1");
  {
    std::unique_ptr<SqliteStateStore> store = OpenOrDie();
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->pre_migration_backup(), path_ + ".pre-migration-1.bak");
  }
  const std::string migrated = path_;
  path_ += ".pre-migration-1.bak";
  EXPECT_EQ(RawQuery("SELECT MAX(version) FROM schema_migrations"), std::vector<int64_t>{1});
  EXPECT_EQ(RawQuery("SELECT COUNT(*) FROM objects WHERE name = 'old'"), std::vector<int64_t>{1});
  path_ = migrated;
  // Up to date now: the next open copies nothing.
  std::unique_ptr<SqliteStateStore> store = OpenOrDie();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->pre_migration_backup(), "");
}

}  // namespace
}  // namespace gpufleet::store
