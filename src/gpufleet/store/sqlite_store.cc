// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/sqlite_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/store/directory_lock.h"

namespace gpufleet::store {
namespace {

// How long a statement waits for another connection's lock before failing with SQLITE_BUSY.
constexpr int kBusyTimeoutMillis = 5000;

// The status of SQLite error `rc` on connection `db` (null: none opened) while doing `what` to
// the database at `path`: a file that is not a database kFailedPrecondition, a corrupt one
// kDataLoss, a wrong statement kInternal, anything else (IO, a full disk, a lock held past the
// busy timeout) kUnavailable.
Status SqliteError(std::string_view path, sqlite3* db, int rc, std::string_view what);

// One schema change. Migrations run in order, each once, in its own transaction; a version is
// never reused or edited once released: change the schema by appending a migration.
struct Migration {
  int64_t version;
  const char* name;
  const char* sql;
};

constexpr Migration kMigrations[] = {
    {1, "objects, event logs and the store revision", R"sql(
CREATE TABLE objects (
  kind TEXT NOT NULL,
  name TEXT NOT NULL,
  data BLOB NOT NULL,
  version INTEGER NOT NULL,
  revision INTEGER NOT NULL,
  PRIMARY KEY (kind, name)
) WITHOUT ROWID;
CREATE TABLE events (
  seq INTEGER PRIMARY KEY,
  kind TEXT NOT NULL,
  name TEXT NOT NULL,
  revision INTEGER NOT NULL,
  text BLOB NOT NULL
);
CREATE INDEX events_by_object ON events (kind, name, seq);
CREATE TABLE store_meta (
  key TEXT PRIMARY KEY,
  value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO store_meta (key, value) VALUES ('revision', 0);
)sql"},
    // The state index (StateStore::ListWhere). gpufleet_indexed_state is IndexedState, registered
    // on the connection (RegisterFunctions): every write sets the column through it, and this
    // migration back-fills the objects of a store written before it.
    {2, "objects indexed by their top-level state", R"sql(
ALTER TABLE objects ADD COLUMN state TEXT NOT NULL DEFAULT '';
UPDATE objects SET state = gpufleet_indexed_state(data);
CREATE INDEX objects_by_state ON objects (kind, state, name);
)sql"},
};

// Indexed by SqliteStateStore::StatementId.
constexpr const char* kStatementSql[] = {
    "BEGIN IMMEDIATE",
    "COMMIT",
    "ROLLBACK",
    "SELECT data, version, revision FROM objects WHERE kind = ?1 AND name = ?2",
    "SELECT name, data, version, revision FROM objects WHERE kind = ?1 ORDER BY name",
    // ?3 is the prefix followed by byte 0xFF, which valid UTF-8 never contains: every name that
    // starts with the prefix sorts below it, and no other name between ?2 and it.
    ("SELECT name, data, version, revision FROM objects"
     " WHERE kind = ?1 AND name >= ?2 AND name < ?3 ORDER BY name"),
    ("INSERT INTO objects (kind, name, data, version, revision, state)"
     " VALUES (?1, ?2, ?3, ?4, ?5, gpufleet_indexed_state(?3))"),
    ("UPDATE objects SET data = ?3, version = ?4, revision = ?5,"
     " state = gpufleet_indexed_state(?3) WHERE kind = ?1 AND name = ?2"),
    "DELETE FROM objects WHERE kind = ?1 AND name = ?2",
    "INSERT INTO events (kind, name, revision, text) VALUES (?1, ?2, ?3, ?4)",
    "SELECT revision, text FROM events WHERE kind = ?1 AND name = ?2 ORDER BY seq",
    "SELECT value FROM store_meta WHERE key = 'revision'",
    "UPDATE store_meta SET value = ?1 WHERE key = 'revision'",
    "SAVEPOINT one_batch",
    "ROLLBACK TO one_batch",
    "RELEASE one_batch",
    "DELETE FROM events WHERE kind = ?1 AND name = ?2",
    "BEGIN",
    // The next indexed state of a kind after ?2: a skip scan of objects_by_state, one seek each.
    "SELECT state FROM objects WHERE kind = ?1 AND state > ?2 ORDER BY state LIMIT 1",
    // ?5 is the prefix followed by byte 0xFF (see above); ?6 the limit, -1 for none.
    ("SELECT name, data, version, revision FROM objects INDEXED BY objects_by_state"
     " WHERE kind = ?1 AND state = ?2 AND name > ?3 AND name >= ?4 AND name < ?5"
     " ORDER BY name LIMIT ?6"),
};

// Resets a statement and clears its bindings when the scope ends, so that no statement stays
// active (holding a read snapshot) and no binding outlives the string it points into.
class ResetOnExit {
 public:
  explicit ResetOnExit(sqlite3_stmt* statement) : statement_(statement) {}
  ~ResetOnExit() {
    sqlite3_reset(statement_);
    sqlite3_clear_bindings(statement_);
  }
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;

 private:
  sqlite3_stmt* statement_;
};

// Bindings point into the caller's strings (no copy; see ResetOnExit). A non-empty string_view
// has a non-null data(), and an empty one is bound as an empty value through "", never as NULL.
int BindText(sqlite3_stmt* statement, int index, std::string_view text) {
  return sqlite3_bind_text(statement, index, text.empty() ? "" : text.data(),
                           static_cast<int>(text.size()), nullptr);
}

int BindBlob(sqlite3_stmt* statement, int index, std::string_view blob) {
  if (blob.empty()) {
    return sqlite3_bind_zeroblob(statement, index, 0);
  }
  return sqlite3_bind_blob(statement, index, blob.data(), static_cast<int>(blob.size()), nullptr);
}

std::string ColumnText(sqlite3_stmt* statement, int column) {
  const auto* text = reinterpret_cast<const char*>(sqlite3_column_text(statement, column));
  const int size = sqlite3_column_bytes(statement, column);
  return text == nullptr ? std::string() : std::string(text, static_cast<size_t>(size));
}

std::string ColumnBlob(sqlite3_stmt* statement, int column) {
  const auto* blob = static_cast<const char*>(sqlite3_column_blob(statement, column));
  const int size = sqlite3_column_bytes(statement, column);
  return blob == nullptr ? std::string() : std::string(blob, static_cast<size_t>(size));
}

// Rows of (name, data, version, revision) of `kind`.
StoredObject ObjectFromListRow(sqlite3_stmt* statement, std::string_view kind) {
  return StoredObject{std::string(kind), ColumnText(statement, 0), ColumnBlob(statement, 1),
                      sqlite3_column_int64(statement, 2), sqlite3_column_int64(statement, 3)};
}

// gpufleet_indexed_state(data): IndexedState of a blob or text.
void IndexedStateFunction(sqlite3_context* context, int /*argc*/, sqlite3_value** argv) {
  const auto* data = static_cast<const char*>(sqlite3_value_blob(argv[0]));
  const int size = sqlite3_value_bytes(argv[0]);
  const std::string state =
      IndexedState(data == nullptr ? std::string_view() : std::string_view(data, size));
  sqlite3_result_text(context, state.data(), static_cast<int>(state.size()), SQLITE_TRANSIENT);
}

}  // namespace

void SqliteStateStore::Closer::operator()(sqlite3* db) const {
  sqlite3_close_v2(db);
}

void SqliteStateStore::Finalizer::operator()(sqlite3_stmt* statement) const {
  sqlite3_finalize(statement);
}

SqliteStateStore::SqliteStateStore(std::string path, sqlite3* db)
    : path_(std::move(path)), db_(db) {}

SqliteStateStore::~SqliteStateStore() = default;

int64_t SqliteStateStore::LatestSchemaVersion() {
  return std::end(kMigrations)[-1].version;
}

namespace {

// The database holds every job's spec, secret environment variables included, and the token
// hashes: only the server's user may read it. SQLite gives its WAL and shared-memory files the
// database file's mode, so creating the file 0600 (and taking group and other access from a file
// an older version made 0644) covers all three. ":memory:" and URIs are left to SQLite.
Status MakeOwnerOnly(const std::string& path) {
  if (path.empty() || path == ":memory:" || path.starts_with("file:")) {
    return Status::Ok();
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    char text[256];
    return UnavailableError(fmt::format("{}: unable to open the database file: {}", path,
                                        strerror_r(errno, text, sizeof(text))));
  }
  struct stat st = {};
  const bool tightened =
      fstat(fd, &st) == 0 && ((st.st_mode & 077) == 0 || fchmod(fd, st.st_mode & 0700) == 0);
  const int error = errno;
  close(fd);
  if (!tightened) {
    char text[256];
    return UnavailableError(fmt::format("{}: cannot make the database owner-only (0600): {}", path,
                                        strerror_r(error, text, sizeof(text))));
  }
  for (const char* suffix : {"-wal", "-shm"}) {
    const std::string side = path + suffix;
    if (chmod(side.c_str(), 0600) != 0 && errno != ENOENT) {
      char text[256];
      return UnavailableError(fmt::format("{}: cannot make it owner-only (0600): {}", side,
                                          strerror_r(errno, text, sizeof(text))));
    }
  }
  return Status::Ok();
}

struct CloseConnection {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Connection = std::unique_ptr<sqlite3, CloseConnection>;

// Opens the database at `path` with `flags`, waiting for other processes' locks up to the busy
// timeout.
Result<Connection> OpenConnection(const std::string& path, int flags, std::string_view what) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Connection db(raw);
  if (rc != SQLITE_OK) {
    return SqliteError(path, db.get(), rc, what);
  }
  sqlite3_extended_result_codes(db.get(), 1);
  if (const int busy = sqlite3_busy_timeout(db.get(), kBusyTimeoutMillis); busy != SQLITE_OK) {
    return SqliteError(path, db.get(), busy, what);
  }
  return db;
}

// The schema version of the gpufleet store open on `db`, after SQLite's quick_check of the whole
// file. kFailedPrecondition for a file that is not a gpufleet store, fails the check, or has a
// schema newer than this code knows.
Result<int64_t> CheckedSchemaVersion(sqlite3* db, const std::string& path, int64_t latest) {
  sqlite3_stmt* raw = nullptr;
  int rc = sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &raw, nullptr);
  std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> check(raw, &sqlite3_finalize);
  if (rc != SQLITE_OK) {
    return SqliteError(path, db, rc, "checking the database");
  }
  rc = sqlite3_step(check.get());
  if (rc != SQLITE_ROW) {
    return SqliteError(path, db, rc, "checking the database");
  }
  if (const std::string verdict = ColumnText(check.get(), 0); verdict != "ok") {
    return FailedPreconditionError(
        fmt::format("{}: SQLite's quick_check finds it damaged: {}", path, verdict));
  }
  check.reset();
  rc = sqlite3_prepare_v2(db, "SELECT MAX(version) FROM schema_migrations", -1, &raw, nullptr);
  std::unique_ptr<sqlite3_stmt, decltype(&sqlite3_finalize)> newest(raw, &sqlite3_finalize);
  if (rc != SQLITE_OK || sqlite3_step(newest.get()) != SQLITE_ROW ||
      sqlite3_column_type(newest.get(), 0) == SQLITE_NULL) {
    return FailedPreconditionError(
        fmt::format("{}: not a gpufleet store (no schema_migrations)", path));
  }
  const int64_t version = sqlite3_column_int64(newest.get(), 0);
  if (version > latest) {
    return FailedPreconditionError(fmt::format(
        "{}: schema version {} is newer than the {} this gpufleet knows; use a newer gpufleet",
        path, version, latest));
  }
  return version;
}

bool Exists(const std::string& path) {
  struct stat st = {};
  return stat(path.c_str(), &st) == 0;
}

enum class Replace { kNo, kYes };

// Copies the database open on `from` (at `from_path`) into the file `to` with SQLite's online
// backup API: one step over every page, in one read transaction of `from`, so the copy is the
// state of one moment while writers in WAL mode go on. Written to `to`.partial and renamed into
// place when complete and checked, so no partial copy is ever left under the name `to`.
Result<int64_t> CopyDatabase(sqlite3* from, const std::string& from_path, const std::string& to,
                             Replace replace, int64_t latest) {
  if (replace == Replace::kNo && Exists(to)) {
    return AlreadyExistsError(fmt::format("{}: exists; back up to a new file", to));
  }
  const std::string partial = to + ".partial";
  if (unlink(partial.c_str()) != 0 && errno != ENOENT) {
    char text[256];
    return UnavailableError(fmt::format("{}: cannot remove an old partial copy: {}", partial,
                                        strerror_r(errno, text, sizeof(text))));
  }
  GPUFLEET_RETURN_IF_ERROR(MakeOwnerOnly(partial));
  Result<int64_t> version = [&]() -> Result<int64_t> {
    GPUFLEET_ASSIGN_OR_RETURN(
        Connection copy,
        OpenConnection(partial, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, "opening the copy"));
    sqlite3_backup* backup = sqlite3_backup_init(copy.get(), "main", from, "main");
    if (backup == nullptr) {
      return SqliteError(partial, copy.get(), sqlite3_errcode(copy.get()), "starting the copy");
    }
    const int stepped = sqlite3_backup_step(backup, -1);
    const int finished = sqlite3_backup_finish(backup);
    if (stepped != SQLITE_DONE) {
      return SqliteError(from_path, from, stepped, fmt::format("copying to {}", partial));
    }
    if (finished != SQLITE_OK) {
      return SqliteError(partial, copy.get(), finished, "finishing the copy");
    }
    return CheckedSchemaVersion(copy.get(), partial, latest);
  }();
  if (version.ok()) {
    // link(2) refuses to replace a file that appeared meanwhile; rename(2) replaces atomically.
    const int moved = replace == Replace::kNo ? link(partial.c_str(), to.c_str())
                                              : rename(partial.c_str(), to.c_str());
    if (moved != 0) {
      char text[256];
      version = UnavailableError(fmt::format("{}: cannot put the copy in place: {}", to,
                                             strerror_r(errno, text, sizeof(text))));
    }
  }
  unlink(partial.c_str());
  return version;
}

}  // namespace

Result<int64_t> SqliteStateStore::Backup(const std::string& db_path,
                                         const std::string& backup_path) {
  if (!Exists(db_path)) {
    return NotFoundError(fmt::format("{}: no store there", db_path));
  }
  GPUFLEET_ASSIGN_OR_RETURN(Connection source,
                            OpenConnection(db_path, SQLITE_OPEN_READONLY, "opening the store"));
  return CopyDatabase(source.get(), db_path, backup_path, Replace::kNo, LatestSchemaVersion());
}

Result<int64_t> SqliteStateStore::Restore(const std::string& backup_path,
                                          const std::string& db_path) {
  std::string directory = std::filesystem::path(db_path).parent_path().string();
  GPUFLEET_ASSIGN_OR_RETURN(const DirectoryLock lock,
                            DirectoryLock::Acquire(directory.empty() ? "." : directory));
  if (!Exists(backup_path)) {
    return NotFoundError(fmt::format("{}: no backup there", backup_path));
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      Connection backup, OpenConnection(backup_path, SQLITE_OPEN_READONLY, "opening the backup"));
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t version,
                            CheckedSchemaVersion(backup.get(), backup_path, LatestSchemaVersion()));
  if (Exists(db_path)) {
    GPUFLEET_ASSIGN_OR_RETURN(Connection current,
                              OpenConnection(db_path, SQLITE_OPEN_READONLY, "opening the store"));
    GPUFLEET_RETURN_IF_ERROR(CopyDatabase(current.get(), db_path, db_path + ".pre-restore.bak",
                                          Replace::kYes, LatestSchemaVersion())
                                 .status());
  }
  // Into the store's own file through SQLite, not by renaming the backup over it: SQLite writes
  // the pages in one transaction of the store (its WAL included), so a crash leaves either store.
  GPUFLEET_RETURN_IF_ERROR(MakeOwnerOnly(db_path));
  GPUFLEET_ASSIGN_OR_RETURN(
      Connection store,
      OpenConnection(db_path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, "opening the store"));
  sqlite3_backup* copy = sqlite3_backup_init(store.get(), "main", backup.get(), "main");
  if (copy == nullptr) {
    return SqliteError(db_path, store.get(), sqlite3_errcode(store.get()), "starting the restore");
  }
  const int stepped = sqlite3_backup_step(copy, -1);
  const int finished = sqlite3_backup_finish(copy);
  if (stepped != SQLITE_DONE) {
    return SqliteError(db_path, store.get(), stepped, fmt::format("restoring {}", backup_path));
  }
  if (finished != SQLITE_OK) {
    return SqliteError(db_path, store.get(), finished, "finishing the restore");
  }
  return version;
}

Result<std::unique_ptr<SqliteStateStore>> SqliteStateStore::Open(const std::string& path) {
  static_assert(std::size(kStatementSql) == kStatementCount);
  GPUFLEET_RETURN_IF_ERROR(MakeOwnerOnly(path));
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(
      path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  // The constructor is private, hence `new`; the handle is owned from here on, even on error.
  auto store = std::unique_ptr<SqliteStateStore>(new SqliteStateStore(path, db));
  if (db == nullptr) {
    return UnavailableError(fmt::format("{}: opening the database: out of memory", path));
  }
  if (rc != SQLITE_OK) {
    return store->Error(rc, "opening the database");
  }
  sqlite3_extended_result_codes(db, 1);
  GPUFLEET_RETURN_IF_ERROR(store->Configure());
  GPUFLEET_RETURN_IF_ERROR(store->RegisterFunctions());
  GPUFLEET_RETURN_IF_ERROR(store->ApplyMigrations());
  GPUFLEET_RETURN_IF_ERROR(store->PrepareStatements());
  GPUFLEET_RETURN_IF_ERROR(store->OpenReader());
  return store;
}

Status SqliteStateStore::OpenReader() {
  sqlite3* reader = nullptr;
  const int rc =
      sqlite3_open_v2(path_.c_str(), &reader, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nullptr);
  reader_.reset(reader);
  if (reader == nullptr) {
    return UnavailableError(fmt::format("{}: opening the reader connection: out of memory", path_));
  }
  const std::string what = "opening the reader connection";
  if (rc != SQLITE_OK) {
    return ErrorOn(reader, rc, what);
  }
  sqlite3_extended_result_codes(reader, 1);
  // A reader rarely waits (WAL recovery, a restarted WAL), and then as the writer waits for other
  // processes. It has no gpufleet_indexed_state: reads do not call it, as long as no migration
  // puts it in the schema itself (a generated column would).
  if (const int busy = sqlite3_busy_timeout(reader, kBusyTimeoutMillis); busy != SQLITE_OK) {
    return ErrorOn(reader, busy, what);
  }
  if (const int query_only = sqlite3_exec(reader, "PRAGMA query_only=1", nullptr, nullptr, nullptr);
      query_only != SQLITE_OK) {
    return ErrorOn(reader, query_only, what);
  }
  const char* get_sql = kStatementSql[static_cast<size_t>(StatementId::kGetObject)];
  sqlite3_stmt* prepared = nullptr;
  const int prepare =
      sqlite3_prepare_v3(reader, get_sql, -1, SQLITE_PREPARE_PERSISTENT, &prepared, nullptr);
  reader_get_.reset(prepared);
  if (prepare != SQLITE_OK) {
    return ErrorOn(reader, prepare, fmt::format("preparing \"{}\"", get_sql));
  }
  return Status::Ok();
}

Status SqliteStateStore::Configure() {
  const int rc = sqlite3_busy_timeout(db_.get(), kBusyTimeoutMillis);
  if (rc != SQLITE_OK) {
    return Error(rc, "setting the busy timeout");
  }
  // The first statement that reads the file: a file that is not a database fails here.
  GPUFLEET_ASSIGN_OR_RETURN(StatementPtr wal,
                            Prepare("PRAGMA journal_mode=WAL", "setting the WAL journal mode"));
  const int step = sqlite3_step(wal.get());
  if (step != SQLITE_ROW) {
    return Error(step, "setting the WAL journal mode");
  }
  const std::string mode = ColumnText(wal.get(), 0);
  if (mode != "wal") {
    return FailedPreconditionError(fmt::format(
        "{}: the database cannot use WAL journal mode (it is in mode \"{}\")", path_, mode));
  }
  return Exec("PRAGMA synchronous=FULL", "setting synchronous=FULL");
}

Status SqliteStateStore::RegisterFunctions() {
  const int rc =
      sqlite3_create_function_v2(db_.get(), "gpufleet_indexed_state", 1,
                                 SQLITE_UTF8 | SQLITE_DETERMINISTIC | SQLITE_DIRECTONLY, nullptr,
                                 IndexedStateFunction, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return Error(rc, "registering gpufleet_indexed_state");
  }
  return Status::Ok();
}

Status SqliteStateStore::ApplyMigrations() {
  GPUFLEET_RETURN_IF_ERROR(Exec(
      "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT "
      "NULL)",
      "creating the schema_migrations table"));
  GPUFLEET_ASSIGN_OR_RETURN(
      StatementPtr newest,
      Prepare("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", "reading the schema"));
  const int step = sqlite3_step(newest.get());
  if (step != SQLITE_ROW) {
    return Error(step, "reading the schema version");
  }
  const int64_t newest_version = sqlite3_column_int64(newest.get(), 0);
  newest.reset();
  if (newest_version > LatestSchemaVersion()) {
    return FailedPreconditionError(fmt::format(
        "{}: the database has schema version {}, newer than the {} this gpufleet knows; open it "
        "with a newer gpufleet",
        path_, newest_version, LatestSchemaVersion()));
  }

  // A store that a migration will change is copied first, so that an upgrade can be undone by
  // the older gpufleet with the copy (docs/operations.md, "Upgrade"). A new store has nothing to
  // keep; ":memory:" and URIs have no file beside which to keep it.
  const bool is_file = !path_.empty() && path_ != ":memory:" && !path_.starts_with("file:");
  if (newest_version > 0 && newest_version < LatestSchemaVersion() && is_file) {
    const std::string backup = fmt::format("{}.pre-migration-{}.bak", path_, newest_version);
    GPUFLEET_RETURN_IF_ERROR(
        CopyDatabase(db_.get(), path_, backup, Replace::kYes, LatestSchemaVersion()).status());
    pre_migration_backup_ = backup;
  }

  GPUFLEET_ASSIGN_OR_RETURN(
      StatementPtr applied,
      Prepare("SELECT COUNT(*) FROM schema_migrations WHERE version = ?1", "reading migrations"));
  GPUFLEET_ASSIGN_OR_RETURN(StatementPtr record,
                            Prepare("INSERT INTO schema_migrations (version, name) VALUES (?1, ?2)",
                                    "recording migrations"));
  for (const Migration& migration : kMigrations) {
    const std::string what =
        fmt::format("applying migration {} ({})", migration.version, migration.name);
    // BEGIN IMMEDIATE, then check: another process opening the same file at the same time waits
    // for this transaction and then finds the migration applied.
    GPUFLEET_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE", what));
    Status status = [&]() -> Status {
      ResetOnExit reset_applied(applied.get());
      sqlite3_bind_int64(applied.get(), 1, migration.version);
      const int rc = sqlite3_step(applied.get());
      if (rc != SQLITE_ROW) {
        return Error(rc, what);
      }
      if (sqlite3_column_int64(applied.get(), 0) > 0) {
        return Status::Ok();
      }
      GPUFLEET_RETURN_IF_ERROR(Exec(migration.sql, what));
      ResetOnExit reset_record(record.get());
      sqlite3_bind_int64(record.get(), 1, migration.version);
      BindText(record.get(), 2, migration.name);
      const int inserted = sqlite3_step(record.get());
      return inserted == SQLITE_DONE ? Status::Ok() : Error(inserted, what);
    }();
    if (status.ok()) {
      status = Exec("COMMIT", what);
    }
    if (!status.ok()) {
      if (sqlite3_get_autocommit(db_.get()) == 0) {
        (void)Exec("ROLLBACK", what);
      }
      return status;
    }
  }
  return Status::Ok();
}

Status SqliteStateStore::PrepareStatements() {
  for (size_t i = 0; i < kStatementCount; ++i) {
    sqlite3_stmt* prepared = nullptr;
    const int rc = sqlite3_prepare_v3(db_.get(), kStatementSql[i], -1, SQLITE_PREPARE_PERSISTENT,
                                      &prepared, nullptr);
    statements_[i].reset(prepared);
    if (rc != SQLITE_OK) {
      return Error(rc, fmt::format("preparing \"{}\"", kStatementSql[i]));
    }
  }
  return Status::Ok();
}

Result<SqliteStateStore::StatementPtr> SqliteStateStore::Prepare(const char* sql,
                                                                 std::string_view what) {
  sqlite3_stmt* prepared = nullptr;
  const int rc = sqlite3_prepare_v2(db_.get(), sql, -1, &prepared, nullptr);
  StatementPtr statement(prepared);
  if (rc != SQLITE_OK) {
    return Error(rc, what);
  }
  return statement;
}

Status SqliteStateStore::Exec(const char* sql, std::string_view what) {
  const int rc = sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return Error(rc, what);
  }
  return Status::Ok();
}

Status SqliteStateStore::Error(int rc, std::string_view what) const {
  return ErrorOn(db_.get(), rc, what);
}

Status SqliteStateStore::ErrorOn(sqlite3* db, int rc, std::string_view what) const {
  return SqliteError(path_, db, rc, what);
}

namespace {

Status SqliteError(std::string_view path, sqlite3* db, int rc, std::string_view what) {
  const char* detail = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  std::string message = fmt::format("{}: {}: {}", path, what, detail);
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
      return FailedPreconditionError(std::move(message));
    case SQLITE_CORRUPT:
      return Status(StatusCode::kDataLoss, std::move(message));
    case SQLITE_ERROR:
    case SQLITE_MISUSE:
    case SQLITE_RANGE:
    case SQLITE_MISMATCH:
    case SQLITE_CONSTRAINT:
      // A statement of ours is wrong, or the file holds a schema that is not ours.
      return InternalError(std::move(message));
    default:
      // IO errors, a full disk, a lock held for longer than the busy timeout, a read-only file.
      return UnavailableError(std::move(message));
  }
}

}  // namespace

sqlite3_stmt* SqliteStateStore::statement(StatementId id) const {
  return statements_[static_cast<size_t>(id)].get();
}

Status SqliteStateStore::Step(StatementId id, std::string_view what) {
  sqlite3_stmt* prepared = statement(id);
  ResetOnExit reset(prepared);
  const int rc = sqlite3_step(prepared);
  if (rc != SQLITE_DONE) {
    return Error(rc, what);
  }
  return Status::Ok();
}

Result<std::optional<StoredObject>> SqliteStateStore::ReadObject(sqlite3_stmt* get,
                                                                 std::string_view kind,
                                                                 std::string_view name) const {
  ResetOnExit reset(get);
  BindText(get, 1, kind);
  BindText(get, 2, name);
  const int rc = sqlite3_step(get);
  if (rc == SQLITE_DONE) {
    return std::optional<StoredObject>();
  }
  if (rc != SQLITE_ROW) {
    return ErrorOn(sqlite3_db_handle(get), rc, fmt::format("reading {}/{}", kind, name));
  }
  return std::optional<StoredObject>(StoredObject{std::string(kind), std::string(name),
                                                  ColumnBlob(get, 0), sqlite3_column_int64(get, 1),
                                                  sqlite3_column_int64(get, 2)});
}

Result<int64_t> SqliteStateStore::ReadRevision() {
  sqlite3_stmt* get = statement(StatementId::kGetRevision);
  ResetOnExit reset(get);
  const int rc = sqlite3_step(get);
  if (rc != SQLITE_ROW) {
    return rc == SQLITE_DONE ? Status(StatusCode::kDataLoss,
                                      fmt::format("{}: the store revision is missing", path_))
                             : Error(rc, "reading the store revision");
  }
  return sqlite3_column_int64(get, 0);
}

Result<StoredObject> SqliteStateStore::DoGet(std::string_view kind, std::string_view name) {
  std::lock_guard lock(read_mu_);
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<StoredObject> object,
                            ReadObject(reader_get_.get(), kind, name));
  if (!object) {
    return ObjectNotFoundError(kind, name);
  }
  return std::move(*object);
}

Result<std::vector<StoredObject>> SqliteStateStore::DoList(std::string_view kind,
                                                           std::string_view name_prefix) {
  std::lock_guard lock(mu_);
  const bool with_prefix = !name_prefix.empty();
  sqlite3_stmt* list =
      statement(with_prefix ? StatementId::kListObjectsWithPrefix : StatementId::kListObjects);
  ResetOnExit reset(list);
  const std::string upper = std::string(name_prefix) + '\xff';
  BindText(list, 1, kind);
  if (with_prefix) {
    BindText(list, 2, name_prefix);
    BindText(list, 3, upper);
  }
  std::vector<StoredObject> objects;
  int rc = SQLITE_ROW;
  while ((rc = sqlite3_step(list)) == SQLITE_ROW) {
    StoredObject object = ObjectFromListRow(list, kind);
    if (object.name.starts_with(name_prefix)) {
      objects.push_back(std::move(object));
    }
  }
  if (rc != SQLITE_DONE) {
    return Error(rc, fmt::format("listing {}", kind));
  }
  return objects;
}

Result<std::vector<StoredObject>> SqliteStateStore::DoListWhere(std::string_view kind,
                                                                const ListFilter& filter) {
  std::lock_guard lock(mu_);
  const std::string what = fmt::format("listing {} by state", kind);
  // One read transaction: the states found and the objects listed come from one snapshot, so an
  // object changing state in between (another process's commit) cannot be missed.
  GPUFLEET_RETURN_IF_ERROR(Step(StatementId::kBeginRead, what));
  const std::string upper = filter.name_prefix + '\xff';
  const auto distinct_states = [&]() -> Result<std::vector<std::string>> {
    std::vector<std::string> states;
    sqlite3_stmt* next = statement(StatementId::kNextState);
    std::string after;
    while (true) {
      ResetOnExit reset(next);
      BindText(next, 1, kind);
      BindText(next, 2, after);
      const int rc = sqlite3_step(next);
      if (rc == SQLITE_DONE) {
        return states;
      }
      if (rc != SQLITE_ROW) {
        return Error(rc, what);
      }
      after = ColumnText(next, 0);
      states.push_back(after);
    }
  };
  const auto list_state = [&](const std::string& state) -> Result<std::vector<StoredObject>> {
    sqlite3_stmt* list = statement(StatementId::kListState);
    ResetOnExit reset(list);
    BindText(list, 1, kind);
    BindText(list, 2, state);
    BindText(list, 3, filter.start_after);
    BindText(list, 4, filter.name_prefix);
    BindText(list, 5, upper);
    sqlite3_bind_int64(list, 6, filter.limit == 0 ? -1 : static_cast<int64_t>(filter.limit));
    std::vector<StoredObject> objects;
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(list)) == SQLITE_ROW) {
      objects.push_back(ObjectFromListRow(list, kind));
    }
    if (rc != SQLITE_DONE) {
      return Error(rc, what);
    }
    return objects;
  };
  Result<std::vector<StoredObject>> objects = ListWhereByState(filter, distinct_states, list_state);
  const Status end = Step(objects.ok() ? StatementId::kCommit : StatementId::kRollback, what);
  GPUFLEET_RETURN_IF_ERROR(objects.status());
  GPUFLEET_RETURN_IF_ERROR(end);
  return objects;
}

Status SqliteStateStore::DoCommit(const WriteBatch& batch) {
  return group_commits_.Commit(batch, [&](const std::vector<GroupCommitQueue::Pending*>& group) {
    std::lock_guard lock(mu_);
    CommitGroup(group);
  });
}

void SqliteStateStore::CommitGroup(const std::vector<GroupCommitQueue::Pending*>& group) {
  const auto fail_all = [&](const Status& status) {
    for (GroupCommitQueue::Pending* pending : group) {
      pending->status = status;
    }
  };
  if (Status begin = Step(StatementId::kBegin, "beginning a transaction"); !begin.ok()) {
    fail_all(begin);
    return;
  }
  Status status = Status::Ok();
  Result<int64_t> previous = ReadRevision();
  int64_t revision = previous.ok() ? *previous : 0;
  if (!previous.ok()) {
    status = previous.status();
    fail_all(status);
  } else if (group.size() == 1) {
    group[0]->status = ApplyBatch(*group[0]->batch, revision + 1);
    status = group[0]->status;
    revision += status.ok() ? 1 : 0;
  } else {
    // Each batch inside a savepoint, so that one failing batch is undone alone and the others
    // still commit; each successful batch gets its own revision.
    for (GroupCommitQueue::Pending* pending : group) {
      status = Step(StatementId::kSavepoint, "opening a savepoint");
      if (!status.ok()) {
        break;
      }
      pending->status = ApplyBatch(*pending->batch, revision + 1);
      if (pending->status.ok()) {
        ++revision;
      } else {
        status = Step(StatementId::kRollbackToSavepoint, "rolling back to a savepoint");
        if (!status.ok()) {
          break;
        }
      }
      status = Step(StatementId::kReleaseSavepoint, "releasing a savepoint");
      if (!status.ok()) {
        break;
      }
    }
  }
  if (status.ok() || group.size() > 1) {
    if (status.ok()) {
      sqlite3_stmt* set = statement(StatementId::kSetRevision);
      sqlite3_bind_int64(set, 1, revision);
      status = Step(StatementId::kSetRevision, "writing the store revision");
    }
    if (status.ok()) {
      status = Step(StatementId::kCommit, "committing");
    }
    if (!status.ok()) {
      fail_all(status);  // nothing of the group is durable
    }
  }
  // A failed operation of a lone batch, or a failed COMMIT (which may leave the transaction
  // open): roll back.
  if (!status.ok() && sqlite3_get_autocommit(db_.get()) == 0) {
    const Status rollback = Step(StatementId::kRollback, "rolling back");
    if (!rollback.ok()) {
      for (GroupCommitQueue::Pending* pending : group) {
        pending->status = Status(pending->status.code(),
                                 pending->status.message() + "; then " + rollback.message());
      }
    }
  }
}

Status SqliteStateStore::ApplyBatch(const WriteBatch& batch, int64_t revision) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const Status status = ApplyOp(batch.ops()[i], revision);
    if (!status.ok()) {
      return AnnotateOpError(status, i, batch.size(), batch.ops()[i]);
    }
  }
  return Status::Ok();
}

Status SqliteStateStore::ApplyOp(const WriteOp& op, int64_t revision) {
  const std::string what = fmt::format("{} {}/{}", WriteOpTypeName(op.type), op.kind, op.name);
  if (op.type == WriteOpType::kDeleteEvents) {
    sqlite3_stmt* erase = statement(StatementId::kDeleteEvents);
    BindText(erase, 1, op.kind);
    BindText(erase, 2, op.name);
    return Step(StatementId::kDeleteEvents, what);
  }
  if (op.type == WriteOpType::kAppendEvent) {
    sqlite3_stmt* insert = statement(StatementId::kInsertEvent);
    BindText(insert, 1, op.kind);
    BindText(insert, 2, op.name);
    sqlite3_bind_int64(insert, 3, revision);
    BindBlob(insert, 4, op.data);
    return Step(StatementId::kInsertEvent, what);
  }

  GPUFLEET_ASSIGN_OR_RETURN(const std::optional<StoredObject> existing,
                            ReadObject(statement(StatementId::kGetObject), op.kind, op.name));
  if (op.type == WriteOpType::kCreate) {
    if (existing) {
      return ObjectExistsError(op.kind, op.name);
    }
    sqlite3_stmt* insert = statement(StatementId::kInsertObject);
    BindText(insert, 1, op.kind);
    BindText(insert, 2, op.name);
    BindBlob(insert, 3, op.data);
    sqlite3_bind_int64(insert, 4, 1);
    sqlite3_bind_int64(insert, 5, revision);
    return Step(StatementId::kInsertObject, what);
  }

  if (!existing) {
    return ObjectNotFoundError(op.kind, op.name);
  }
  const bool unconditional = op.type == WriteOpType::kDelete && op.expected_version == 0;
  if (!unconditional && existing->version != op.expected_version) {
    return VersionConflictError(op.kind, op.name, existing->version, op.expected_version);
  }
  if (op.type == WriteOpType::kDelete) {
    sqlite3_stmt* erase = statement(StatementId::kDeleteObject);
    BindText(erase, 1, op.kind);
    BindText(erase, 2, op.name);
    return Step(StatementId::kDeleteObject, what);
  }
  sqlite3_stmt* update = statement(StatementId::kUpdateObject);
  BindText(update, 1, op.kind);
  BindText(update, 2, op.name);
  BindBlob(update, 3, op.data);
  sqlite3_bind_int64(update, 4, existing->version + 1);
  sqlite3_bind_int64(update, 5, revision);
  return Step(StatementId::kUpdateObject, what);
}

Result<int64_t> SqliteStateStore::DoRevision() {
  std::lock_guard lock(mu_);
  return ReadRevision();
}

Result<std::vector<StoredEvent>> SqliteStateStore::DoEvents(std::string_view kind,
                                                            std::string_view name) {
  std::lock_guard lock(mu_);
  sqlite3_stmt* list = statement(StatementId::kListEvents);
  ResetOnExit reset(list);
  BindText(list, 1, kind);
  BindText(list, 2, name);
  std::vector<StoredEvent> events;
  int rc = SQLITE_ROW;
  while ((rc = sqlite3_step(list)) == SQLITE_ROW) {
    events.push_back(StoredEvent{sqlite3_column_int64(list, 0), ColumnBlob(list, 1)});
  }
  if (rc != SQLITE_DONE) {
    return Error(rc, fmt::format("reading the events of {}/{}", kind, name));
  }
  return events;
}

}  // namespace gpufleet::store
