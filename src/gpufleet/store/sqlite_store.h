// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/store/group_commit.h"
#include "gpufleet/store/state_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace gpufleet::store {

// A StateStore in one SQLite database file.
//
// Durability: WAL journal mode with synchronous=FULL, so a Commit that returned OK survives a
// crash or power loss. Commits are grouped: the batches of the threads that call Commit while a
// transaction is being written go together into the next BEGIN IMMEDIATE transaction (the write
// lock is taken at the start, so a second process writing the same file waits up to the busy
// timeout instead of failing half-way), each inside its own savepoint and with its own revision,
// so that a batch that fails is undone alone and the others still commit; the group costs one
// fsync, which is what lets 10,000 agents registering at once be absorbed. Each caller returns
// once its own batch is durable (or has failed).
//
// Schema: an ordered list of migrations compiled into the code, each applied once in its own
// transaction and recorded in the table schema_migrations(version, name). Opening a database
// whose schema is newer than this code knows is kFailedPrecondition. The state index is a column
// of objects, set from IndexedState by every write, with an index on (kind, state, name).
//
// Thread-safe: each connection is used under its own std::mutex (SQLite's multi-thread mode needs
// exactly that). Writes, lists, events and revisions go through the writer connection and wait
// for a commit in progress. Get has a reader connection of its own: in WAL mode it reads the last
// committed state while a commit holds the writer, its fsync included, so that the objects a
// heartbeat reads one by one do not queue behind the cycle's and the submissions' commits (the
// heartbeat p99 at 1,000 submissions/s, bench/RESULTS.md).
//
// Errors: SQLite IO errors are kUnavailable, naming the path and SQLite's message; a file that is
// not a SQLite database is kFailedPrecondition and a corrupt one kDataLoss, both naming the path.
class SqliteStateStore final : public StateStore {
 public:
  // Opens the database at `path`, creating the file if it does not exist (its directory must),
  // and brings its schema up to date. The file (and its WAL) is made owner-only, 0600: it holds
  // secrets.
  static Result<std::unique_ptr<SqliteStateStore>> Open(const std::string& path);

  // The schema version this code writes (the version of its last migration).
  static int64_t LatestSchemaVersion();

  // Copies the store at `db_path` to the new file `backup_path` (0600) with SQLite's online
  // backup API, in one read transaction: safe while a server writes the store (in WAL mode the
  // read holds no lock that a commit waits for), and the copy is the state of one moment. The
  // copy is written beside `backup_path` and renamed into place once complete and checked, so a
  // failed backup leaves no partial file under that name. kAlreadyExists if `backup_path`
  // exists; kFailedPrecondition if `db_path` is not a gpufleet store. Returns the copy's schema
  // version.
  static Result<int64_t> Backup(const std::string& db_path, const std::string& backup_path);
  // Replaces the store at `db_path` with the backup at `backup_path`, after copying the store
  // it replaces to `db_path`.pre-restore.bak. Takes the DirectoryLock of db_path's directory
  // first, the lock every server holds on its data directory: kFailedPrecondition naming the
  // holder's pid while a server runs on the store. kFailedPrecondition for a backup that is not
  // a gpufleet store, fails SQLite's quick_check, or has a schema newer than this code (an older
  // one is migrated by the next server that opens it). Returns the backup's schema version.
  static Result<int64_t> Restore(const std::string& backup_path, const std::string& db_path);

  // The copy Open made before it migrated the store's schema ("DB.pre-migration-VERSION.bak",
  // VERSION the schema it had); empty when no migration ran on an existing store.
  const std::string& pre_migration_backup() const { return pre_migration_backup_; }

  ~SqliteStateStore() override;
  SqliteStateStore(const SqliteStateStore&) = delete;
  SqliteStateStore& operator=(const SqliteStateStore&) = delete;

  const std::string& path() const { return path_; }

 protected:
  Result<StoredObject> DoGet(std::string_view kind, std::string_view name) override;
  Result<std::vector<StoredObject>> DoList(std::string_view kind,
                                           std::string_view name_prefix) override;
  Result<std::vector<StoredObject>> DoListWhere(std::string_view kind,
                                                const ListFilter& filter) override;
  Status DoCommit(const WriteBatch& batch) override;
  Result<int64_t> DoRevision() override;
  Result<std::vector<StoredEvent>> DoEvents(std::string_view kind, std::string_view name) override;

 private:
  // The prepared statements, by purpose (sqlite_store.cc holds their SQL).
  enum class StatementId {
    kBegin,
    kCommit,
    kRollback,
    kGetObject,
    kListObjects,
    kListObjectsWithPrefix,
    kInsertObject,
    kUpdateObject,
    kDeleteObject,
    kInsertEvent,
    kListEvents,
    kGetRevision,
    kSetRevision,
    kSavepoint,
    kRollbackToSavepoint,
    kReleaseSavepoint,
    kDeleteEvents,
    kBeginRead,
    kNextState,
    kListState,
  };
  static constexpr size_t kStatementCount = 20;

  struct Closer {
    void operator()(sqlite3* db) const;
  };
  struct Finalizer {
    void operator()(sqlite3_stmt* statement) const;
  };
  using StatementPtr = std::unique_ptr<sqlite3_stmt, Finalizer>;

  SqliteStateStore(std::string path, sqlite3* db);

  // Sets the journal mode, synchronous level and busy timeout.
  Status Configure();
  // Registers gpufleet_indexed_state(data), IndexedState as an SQL function.
  Status RegisterFunctions();
  Status ApplyMigrations();
  Status PrepareStatements();
  // Prepares a statement for one use (Open only; the hot paths use statements_).
  Result<StatementPtr> Prepare(const char* sql, std::string_view what);
  // Runs `sql` (statements without results).
  Status Exec(const char* sql, std::string_view what);
  // The status of SQLite error `rc` on the writer connection while doing `what`.
  Status Error(int rc, std::string_view what) const;
  // The same on connection `db`.
  Status ErrorOn(sqlite3* db, int rc, std::string_view what) const;
  // Opens the reader connection and prepares its statement (Open, after the migrations).
  Status OpenReader();

  sqlite3_stmt* statement(StatementId id) const;
  // Runs `id`, which returns no rows, with the parameters bound to it, and resets it.
  Status Step(StatementId id, std::string_view what);
  // The object kind/name read by `get` (a kGetObject statement of either connection), or nullopt
  // if absent. REQUIRES: the mutex of get's connection held.
  Result<std::optional<StoredObject>> ReadObject(sqlite3_stmt* get, std::string_view kind,
                                                 std::string_view name) const;
  // REQUIRES: mu_ held.
  Result<int64_t> ReadRevision();
  // Applies one operation inside the open transaction. REQUIRES: mu_ held.
  Status ApplyOp(const WriteOp& op, int64_t revision);
  // Applies every operation of `batch` at `revision`, stopping at the first failure (whose
  // error names the operation). REQUIRES: mu_ held, a transaction open.
  Status ApplyBatch(const WriteBatch& batch, int64_t revision);
  // Commits `group` in one transaction and sets each one's status. REQUIRES: mu_ held.
  void CommitGroup(const std::vector<GroupCommitQueue::Pending*>& group);

  const std::string path_;
  std::string pre_migration_backup_;  // set by ApplyMigrations
  std::mutex mu_;
  // The connection and its statements; after Open, used only under mu_. Declared in this order
  // so that the statements are finalized before the connection closes.
  std::unique_ptr<sqlite3, Closer> db_;
  std::array<StatementPtr, kStatementCount> statements_;

  // The reader connection and its one statement (kGetObject's SQL), used only under read_mu_.
  std::mutex read_mu_;
  std::unique_ptr<sqlite3, Closer> reader_;
  StatementPtr reader_get_;

  GroupCommitQueue group_commits_;
};

}  // namespace gpufleet::store
