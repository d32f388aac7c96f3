// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/postgres_store.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <deque>
#include <limits>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <libpq-fe.h>

namespace gpufleet::store {
namespace {

// The fixed OIDs of the built-in types the statements bind (PostgreSQL's pg_type.dat).
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kTextOid = 25;
constexpr Oid kTextArrayOid = 1009;

// Parameters and results travel in PostgreSQL's binary format.
constexpr int kBinaryFormat = 1;

// The key of the advisory lock that serialises schema migrations across processes ("gpfleet").
constexpr int64_t kMigrationLockKey = 0x677066'6c656574;

// libpq settings that the URI may override: give up connecting after 10 s, and notice a dead
// server on an idle connection within about a minute.
constexpr std::array<const char*, 5> kDefaultKeywords = {"connect_timeout", "keepalives_idle",
                                                         "keepalives_interval", "keepalives_count",
                                                         "fallback_application_name"};
constexpr std::array<const char*, 5> kDefaultValues = {"10", "30", "10", "3", "gpufleet"};

// One schema change. Migrations run in order, each once, in the transaction that holds the
// migration lock; a version is never reused or edited once released: change the schema by
// appending a migration.
struct PostgresMigration {
  int64_t version;
  const char* name;
  const char* sql;
  // Run after `sql` in the same transaction (a back-fill that needs gpufleet's code), or null.
  Status (*then)(internal::PgSession& session) = nullptr;
};

// Migration 3: sets the state column of every object from IndexedState.
Status BackfillStates(internal::PgSession& session);

constexpr PostgresMigration kPostgresMigrations[] = {
    {1, "objects, event logs and the store revision", R"sql(
CREATE TABLE gpufleet.objects (
  kind text COLLATE "C" NOT NULL,
  name text COLLATE "C" NOT NULL,
  data bytea NOT NULL,
  version bigint NOT NULL,
  revision bigint NOT NULL,
  PRIMARY KEY (kind, name)
);
CREATE TABLE gpufleet.events (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  kind text COLLATE "C" NOT NULL,
  name text COLLATE "C" NOT NULL,
  revision bigint NOT NULL,
  text bytea NOT NULL
);
CREATE INDEX events_by_object ON gpufleet.events (kind, name, seq);
CREATE TABLE gpufleet.store_revision (
  id boolean PRIMARY KEY DEFAULT true CHECK (id),
  revision bigint NOT NULL
);
INSERT INTO gpufleet.store_revision (id, revision) VALUES (true, 0);
)sql"},
    {2, "leader leases", R"sql(
CREATE TABLE gpufleet.leader_lease (
  name text COLLATE "C" PRIMARY KEY,
  holder text NOT NULL,
  token bigint NOT NULL,
  expires_at timestamptz NOT NULL,
  address text NOT NULL
);
)sql"},
    // The state index (StateStore::ListWhere): every write sets the column from IndexedState;
    // BackfillStates fills it for the objects of a store written before this migration.
    {3, "objects indexed by their top-level state", R"sql(
ALTER TABLE gpufleet.objects ADD COLUMN state text COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX objects_by_state ON gpufleet.objects (kind, state, name);
)sql",
     BackfillStates},
};

struct ResultClearer {
  void operator()(PGresult* result) const { PQclear(result); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultClearer>;

// Statement parameters in binary format. Text and bytes point into the caller's strings, which
// must outlive the statement; integers are kept here. Thread-compatible.
class Params {
 public:
  Params& Text(std::string_view value) { return Add(value, kTextOid); }
  Params& Bytes(std::string_view value) { return Add(value, kByteaOid); }
  // A text[] in PostgreSQL's text format: {"a","b"} with quotes and backslashes escaped.
  Params& TextArray(const std::vector<std::string>& values) {
    std::string& literal = literals_.emplace_back("{");
    for (const std::string& value : values) {
      literal += literal.size() > 1 ? ",\"" : "\"";
      for (const char c : value) {
        if (c == '"' || c == '\\') {
          literal += '\\';
        }
        literal += c;
      }
      literal += '"';
    }
    literal += '}';
    types_.push_back(kTextArrayOid);
    values_.push_back(literal.c_str());  // text format: NUL-terminated, the length unused
    lengths_.push_back(0);
    formats_.push_back(0);
    return *this;
  }
  Params& Int(int64_t value) {
    std::array<char, 8>& bytes = integers_.emplace_back();
    auto bits = static_cast<uint64_t>(value);
    for (size_t i = bytes.size(); i > 0; --i) {  // big-endian
      bytes[i - 1] = static_cast<char>(bits & 0xff);
      bits >>= 8;
    }
    return Add(std::string_view(bytes.data(), bytes.size()), kInt8Oid);
  }

  int size() const { return static_cast<int>(types_.size()); }
  const Oid* types() const { return types_.data(); }
  const char* const* values() const { return values_.data(); }
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }

 private:
  Params& Add(std::string_view value, Oid type) {
    types_.push_back(type);
    // A non-null pointer even for an empty value: null would mean SQL NULL.
    values_.push_back(value.empty() ? "" : value.data());
    lengths_.push_back(static_cast<int>(value.size()));
    formats_.push_back(kBinaryFormat);
    return *this;
  }

  std::deque<std::array<char, 8>> integers_;  // a deque: growing it moves no element
  std::deque<std::string> literals_;
  std::vector<Oid> types_;
  std::vector<const char*> values_;
  std::vector<int> lengths_;
  std::vector<int> formats_;
};

std::string_view Field(const PGresult* result, int row, int column) {
  return {PQgetvalue(result, row, column), static_cast<size_t>(PQgetlength(result, row, column))};
}

Result<int64_t> Int64Field(const PGresult* result, int row, int column) {
  const std::string_view bytes = Field(result, row, column);
  if (bytes.size() != 8) {
    return InternalError(fmt::format("expected an 8-byte integer in column {}, got {} bytes",
                                     PQfname(result, column), bytes.size()));
  }
  uint64_t bits = 0;
  for (const char byte : bytes) {
    bits = (bits << 8) | static_cast<unsigned char>(byte);
  }
  return static_cast<int64_t>(bits);
}

// Rows changed by an INSERT, UPDATE or DELETE.
int64_t AffectedRows(const PGresult* result) {
  const std::string_view text = PQcmdTuples(const_cast<PGresult*>(result));
  int64_t rows = 0;
  std::from_chars(text.data(), text.data() + text.size(), rows);
  return rows;
}

// `text` with each secret replaced by "***", whitespace runs (libpq's multi-line messages)
// folded into single spaces and trimmed.
std::string Redact(std::string_view text, const std::vector<std::string>& secrets) {
  std::string redacted(text);
  for (const std::string& secret : secrets) {
    for (size_t at = redacted.find(secret); at != std::string::npos;
         at = redacted.find(secret, at + 3)) {
      redacted.replace(at, secret.size(), "***");
    }
  }
  std::string folded;
  for (const char c : redacted) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space) {
      folded += c;
    } else if (!folded.empty() && folded.back() != ' ') {
      folded += ' ';
    }
  }
  while (!folded.empty() && folded.back() == ' ') {
    folded.pop_back();
  }
  return folded;
}

// The smallest string above every string that starts with `prefix` (code point order, which is
// the bytewise order of UTF-8 and of COLLATE "C"): `prefix` with its last code point incremented,
// dropping trailing U+10FFFF; nullopt if there is none. REQUIRES: `prefix` is valid UTF-8.
std::optional<std::string> PrefixUpperBound(std::string_view prefix) {
  std::u32string code_points;
  for (size_t pos = 0; pos < prefix.size();) {
    const auto lead = static_cast<unsigned char>(prefix[pos]);
    const size_t length = lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
    char32_t code_point = length == 1   ? lead
                          : length == 2 ? lead & 0x1f
                          : length == 3 ? lead & 0x0f
                                        : lead & 0x07;
    for (size_t i = 1; i < length && pos + i < prefix.size(); ++i) {
      code_point = (code_point << 6) | (static_cast<unsigned char>(prefix[pos + i]) & 0x3f);
    }
    code_points += code_point;
    pos += length;
  }
  while (!code_points.empty() && code_points.back() >= 0x10ffff) {
    code_points.pop_back();
  }
  if (code_points.empty()) {
    return std::nullopt;
  }
  char32_t& last = code_points.back();
  last = last == 0xd7ff ? 0xe000 : last + 1;  // no string holds a surrogate
  std::string bound;
  for (const char32_t c : code_points) {
    if (c < 0x80) {
      bound += static_cast<char>(c);
    } else if (c < 0x800) {
      bound += static_cast<char>(0xc0 | (c >> 6));
      bound += static_cast<char>(0x80 | (c & 0x3f));
    } else if (c < 0x10000) {
      bound += static_cast<char>(0xe0 | (c >> 12));
      bound += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      bound += static_cast<char>(0x80 | (c & 0x3f));
    } else {
      bound += static_cast<char>(0xf0 | (c >> 18));
      bound += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
      bound += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
      bound += static_cast<char>(0x80 | (c & 0x3f));
    }
  }
  return bound;
}

struct ParsedUri {
  std::string redacted;
  std::vector<std::string> secrets;
};

// Checks `uri` and finds its password, as written and as libpq decodes it, from the userinfo
// ("postgresql://user:PASSWORD@host") or the query ("?password=PASSWORD"). No message quotes
// anything but the redacted URI.
Result<ParsedUri> ParseUri(std::string_view uri) {
  if (uri.size() > PostgresStateStore::kMaxUriBytes) {
    return InvalidArgumentError(
        fmt::format("the PostgreSQL URI is {} bytes, more than the limit of {}", uri.size(),
                    PostgresStateStore::kMaxUriBytes));
  }
  constexpr std::string_view kSchemes[] = {"postgresql://", "postgres://"};
  const auto scheme = std::find_if(std::begin(kSchemes), std::end(kSchemes),
                                   [&](std::string_view s) { return uri.starts_with(s); });
  if (scheme == std::end(kSchemes)) {
    return InvalidArgumentError(
        "the PostgreSQL URI must start with postgresql:// (a libpq connection URI such as "
        "postgresql://USER@HOST:PORT/DATABASE)");
  }
  for (size_t i = 0; i < uri.size(); ++i) {
    const auto byte = static_cast<unsigned char>(uri[i]);
    if (byte <= 0x20 || byte >= 0x7f) {
      return InvalidArgumentError(fmt::format(
          "the PostgreSQL URI has a space, control or non-ASCII byte at byte {} (percent-encode "
          "it)",
          i));
    }
  }

  ParsedUri parsed{std::string(uri), {}};
  std::vector<std::pair<size_t, size_t>> spans;  // where a password is written: offset, size
  // libpq's rule: the userinfo ends at the first '@' unless a '/' comes first.
  const size_t authority = scheme->size();
  const size_t end = uri.find_first_of("@/", authority);
  if (end != std::string_view::npos && uri[end] == '@') {
    const size_t colon = uri.find(':', authority);
    if (colon < end) {
      spans.emplace_back(colon + 1, end - colon - 1);
    }
  }
  if (const size_t query = uri.find('?'); query != std::string_view::npos) {
    for (size_t pos = query + 1; pos < uri.size();) {
      const size_t amp = std::min(uri.find('&', pos), uri.size());
      const std::string_view pair = uri.substr(pos, amp - pos);
      if (pair.starts_with("password=")) {
        spans.emplace_back(pos + 9, pair.size() - 9);
      }
      pos = amp + 1;
    }
  }
  std::sort(spans.rbegin(), spans.rend());  // from the back, so earlier offsets stay valid
  for (const auto& [offset, size] : spans) {
    if (size > 0) {
      parsed.secrets.emplace_back(uri.substr(offset, size));
      parsed.redacted.replace(offset, size, "***");
    }
  }

  char* error = nullptr;
  const std::string uri_string(uri);
  PQconninfoOption* options = PQconninfoParse(uri_string.c_str(), &error);
  if (options == nullptr) {
    const std::string detail = error != nullptr ? Redact(error, parsed.secrets) : "out of memory";
    PQfreemem(error);
    return InvalidArgumentError(
        fmt::format("the PostgreSQL URI {} is not valid: {}", parsed.redacted, detail));
  }
  Status status;
  for (const PQconninfoOption* option = options; option->keyword != nullptr; ++option) {
    if (option->val == nullptr) {
      continue;
    }
    const std::string_view keyword = option->keyword;
    const std::string_view value = option->val;
    if (keyword == "password" && !value.empty()) {
      parsed.secrets.emplace_back(value);
    } else if (keyword == "port" &&
               (value.empty() || value.find_first_not_of("0123456789,") != std::string::npos)) {
      status = InvalidArgumentError(
          fmt::format("the PostgreSQL URI {} has an invalid port", parsed.redacted));
    }
  }
  PQconninfoFree(options);
  GPUFLEET_RETURN_IF_ERROR(status);
  // Longest first, so that a secret inside another is not redacted half.
  std::sort(parsed.secrets.begin(), parsed.secrets.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  // The decoded password too, should it be written where the spans above do not look.
  parsed.redacted = Redact(parsed.redacted, parsed.secrets);
  return parsed;
}

}  // namespace

namespace internal {

// One call's use of the connection: runs statements and turns failures into Status values that
// name the redacted URI and what was being done. Not thread-safe (used under the store's mutex).
class PgSession {
 public:
  PgSession(PGconn* conn, const std::string& label, const std::vector<std::string>& secrets)
      : conn_(conn), label_(label), secrets_(secrets) {}

  // Runs one statement with `params`; the result if it succeeded.
  Result<ResultPtr> Query(std::string_view what, const char* sql, const Params& params = Params()) {
    ResultPtr result(PQexecParams(conn_, sql, params.size(), params.types(), params.values(),
                                  params.lengths(), params.formats(), kBinaryFormat));
    const ExecStatusType status = PQresultStatus(result.get());
    if (result == nullptr || (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)) {
      return Error(result.get(), what);
    }
    return result;
  }

  // Runs statements without parameters or results (several, separated by semicolons).
  Status Exec(std::string_view what, const char* sql) {
    ResultPtr result(PQexec(conn_, sql));
    const ExecStatusType status = PQresultStatus(result.get());
    if (result == nullptr || (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK)) {
      return Error(result.get(), what);
    }
    return Status::Ok();
  }

  // Commits the open transaction. Once called, a lost connection leaves the outcome unknown.
  Status Commit() {
    commit_sent_ = true;
    Result<ResultPtr> result = Query("committing", "COMMIT");
    if (!result.ok()) {
      if (lost()) {
        return UnavailableError(fmt::format(
            "{}: committing: the connection was lost after COMMIT was sent, so the outcome of "
            "the commit is unknown (it may or may not have been applied): {}",
            label_, Redact(PQerrorMessage(conn_), secrets_)));
      }
      return result.status();
    }
    // A transaction that failed earlier answers COMMIT with ROLLBACK.
    if (std::string_view(PQcmdStatus(result->get())) != "COMMIT") {
      return InternalError(fmt::format("{}: committing: the transaction was rolled back", label_));
    }
    return Status::Ok();
  }

  bool lost() const { return PQstatus(conn_) == CONNECTION_BAD; }
  bool commit_sent() const { return commit_sent_; }
  PGTransactionStatusType transaction_status() const { return PQtransactionStatus(conn_); }

  // The status of a failed statement: kUnavailable for a lost connection and for conditions a
  // retry may cure (a server shutting down, out of resources, serialisation failures), kInternal
  // for statements of ours that are wrong or a schema that is not ours.
  Status Error(const PGresult* result, std::string_view what) const {
    const char* result_message = result != nullptr ? PQresultErrorMessage(result) : "";
    const std::string detail =
        Redact(*result_message != '\0' ? result_message : PQerrorMessage(conn_), secrets_);
    std::string message = fmt::format("{}: {}: {}", label_, what, detail);
    if (lost()) {
      return UnavailableError(std::move(message));
    }
    const char* field = result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    const std::string_view sqlstate = field != nullptr ? field : "";
    const std::string_view sqlclass = sqlstate.substr(0, 2);
    if (sqlclass == "08" || sqlclass == "40" || sqlclass == "53" || sqlclass == "55" ||
        sqlclass == "57" || sqlclass == "58") {
      return UnavailableError(std::move(message));
    }
    if (sqlstate == "42501") {  // insufficient privilege
      return FailedPreconditionError(std::move(message));
    }
    if (sqlstate == "XX001" || sqlstate == "XX002") {  // data or index corrupted
      return Status(StatusCode::kDataLoss, std::move(message));
    }
    return InternalError(std::move(message));
  }

 private:
  PGconn* const conn_;
  const std::string& label_;
  const std::vector<std::string>& secrets_;
  bool commit_sent_ = false;
};

}  // namespace internal

namespace {

using internal::PgSession;

// Rows of (name, data, version, revision) of `kind`.
Result<std::vector<StoredObject>> ObjectsFromRows(const PGresult* result, std::string_view kind,
                                                  std::string_view name_prefix) {
  std::vector<StoredObject> objects;
  objects.reserve(static_cast<size_t>(PQntuples(result)));
  for (int row = 0; row < PQntuples(result); ++row) {
    StoredObject object{std::string(kind), std::string(Field(result, row, 0)),
                        std::string(Field(result, row, 1))};
    GPUFLEET_ASSIGN_OR_RETURN(object.version, Int64Field(result, row, 2));
    GPUFLEET_ASSIGN_OR_RETURN(object.revision, Int64Field(result, row, 3));
    if (object.name.starts_with(name_prefix)) {
      objects.push_back(std::move(object));
    }
  }
  return objects;
}

// Why an update or delete of `op` changed no row: the object is absent, or at another version.
Status MissOrConflict(PgSession& session, const WriteOp& op, std::string_view what) {
  GPUFLEET_ASSIGN_OR_RETURN(
      ResultPtr row,
      session.Query(what, "SELECT version FROM gpufleet.objects WHERE kind = $1 AND name = $2",
                    Params().Text(op.kind).Text(op.name)));
  if (PQntuples(row.get()) == 0) {
    return ObjectNotFoundError(op.kind, op.name);
  }
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t version, Int64Field(row.get(), 0, 0));
  return VersionConflictError(op.kind, op.name, version, op.expected_version);
}

// Applies one operation inside the open transaction; each is one statement when it succeeds.
Status ApplyOp(PgSession& session, const WriteOp& op, int64_t revision) {
  const std::string what = fmt::format("{} {}/{}", WriteOpTypeName(op.type), op.kind, op.name);
  switch (op.type) {
    case WriteOpType::kAppendEvent:
      return session
          .Query(what,
                 "INSERT INTO gpufleet.events (kind, name, revision, text) VALUES ($1, $2, $3, $4)",
                 Params().Text(op.kind).Text(op.name).Int(revision).Bytes(op.data))
          .status();
    case WriteOpType::kDeleteEvents:
      return session
          .Query(what, "DELETE FROM gpufleet.events WHERE kind = $1 AND name = $2",
                 Params().Text(op.kind).Text(op.name))
          .status();
    case WriteOpType::kCreate: {
      GPUFLEET_ASSIGN_OR_RETURN(
          ResultPtr inserted,
          session.Query(what,
                        "INSERT INTO gpufleet.objects (kind, name, data, version, revision, state)"
                        " VALUES ($1, $2, $3, 1, $4, $5) ON CONFLICT (kind, name) DO NOTHING",
                        Params().Text(op.kind).Text(op.name).Bytes(op.data).Int(revision).Text(
                            IndexedState(op.data))));
      return AffectedRows(inserted.get()) == 1 ? Status::Ok() : ObjectExistsError(op.kind, op.name);
    }
    case WriteOpType::kUpdate: {
      GPUFLEET_ASSIGN_OR_RETURN(
          ResultPtr updated,
          session.Query(what,
                        "UPDATE gpufleet.objects SET data = $3, version = version + 1,"
                        " revision = $5, state = $6 WHERE kind = $1 AND name = $2 AND version = $4",
                        Params()
                            .Text(op.kind)
                            .Text(op.name)
                            .Bytes(op.data)
                            .Int(op.expected_version)
                            .Int(revision)
                            .Text(IndexedState(op.data))));
      return AffectedRows(updated.get()) == 1 ? Status::Ok() : MissOrConflict(session, op, what);
    }
    case WriteOpType::kDelete: {
      GPUFLEET_ASSIGN_OR_RETURN(
          ResultPtr deleted,
          session.Query(what,
                        "DELETE FROM gpufleet.objects"
                        " WHERE kind = $1 AND name = $2 AND ($3 = 0 OR version = $3)",
                        Params().Text(op.kind).Text(op.name).Int(op.expected_version)));
      return AffectedRows(deleted.get()) == 1 ? Status::Ok() : MissOrConflict(session, op, what);
    }
  }
  return InternalError("unknown operation type");
}

// The fencing check of a commit (PostgresStateStore's class comment): the lease `lease` must
// hold `token`, unexpired. The share lock on its row lasts until the transaction ends, so no one
// takes the lease over while this commit is under way.
Status CheckFence(PgSession& session, const std::string& lease, int64_t token) {
  GPUFLEET_ASSIGN_OR_RETURN(
      ResultPtr row, session.Query("checking the leader lease",
                                   "SELECT holder, address, token,"
                                   " (CASE WHEN expires_at > now() THEN 1 ELSE 0 END)::bigint"
                                   " FROM gpufleet.leader_lease WHERE name = $1 FOR SHARE",
                                   Params().Text(lease)));
  if (PQntuples(row.get()) == 0) {
    return NotLeaderError(fmt::format("no server has taken the lease \"{}\" yet", lease));
  }
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t current, Int64Field(row.get(), 0, 2));
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t live, Int64Field(row.get(), 0, 3));
  if (current == token && token != 0 && live == 1) {
    return Status::Ok();
  }
  const std::string leader = live == 1 ? fmt::format("the leader is {} at {}",
                                                     Field(row.get(), 0, 0), Field(row.get(), 0, 1))
                                       : "no leader holds it now";
  if (token == 0) {
    return NotLeaderError(fmt::format("this server does not hold the lease \"{}\" (token {}); {}",
                                      lease, current, leader));
  }
  if (current != token) {
    return NotLeaderError(
        fmt::format("fencing token {} is stale, the lease \"{}\" is at token {}; {}", token, lease,
                    current, leader));
  }
  return NotLeaderError(fmt::format(
      "the lease \"{}\" of fencing token {} expired before it was renewed", lease, token));
}

// Everything of a group commit between BEGIN and COMMIT, COMMIT included; with a `fence_lease`,
// first the fencing check. Each batch runs inside a savepoint: one that fails is rolled back alone
// and gets its error in `statuses` (one per batch, reset here: a retried call starts afresh); the
// others get OK and a revision each. A failure of the transaction itself is returned.
Status CommitInTransaction(PgSession& session, const std::vector<const WriteBatch*>& batches,
                           const std::string& fence_lease, int64_t fence_token,
                           std::vector<Status>& statuses) {
  statuses.assign(batches.size(), Status::Ok());
  if (!fence_lease.empty()) {
    GPUFLEET_RETURN_IF_ERROR(CheckFence(session, fence_lease, fence_token));
  }
  // The row lock serialises commits across connections until this transaction ends; statements
  // after it (READ COMMITTED: a new snapshot each) see every earlier commit.
  GPUFLEET_ASSIGN_OR_RETURN(
      ResultPtr locked,
      session.Query("locking the store revision",
                    "SELECT revision FROM gpufleet.store_revision WHERE id FOR UPDATE"));
  if (PQntuples(locked.get()) != 1) {
    return Status(StatusCode::kDataLoss, "the store revision is missing");
  }
  GPUFLEET_ASSIGN_OR_RETURN(int64_t revision, Int64Field(locked.get(), 0, 0));
  const bool grouped = batches.size() > 1;
  for (size_t b = 0; b < batches.size(); ++b) {
    const WriteBatch& batch = *batches[b];
    if (grouped) {
      GPUFLEET_RETURN_IF_ERROR(session.Exec("opening a savepoint", "SAVEPOINT one_batch"));
    }
    for (size_t i = 0; i < batch.size() && statuses[b].ok(); ++i) {
      const Status status = ApplyOp(session, batch.ops()[i], revision + 1);
      if (!status.ok()) {
        statuses[b] = AnnotateOpError(status, i, batch.size(), batch.ops()[i]);
      }
    }
    if (!grouped) {
      GPUFLEET_RETURN_IF_ERROR(statuses[b]);
    } else if (!statuses[b].ok()) {
      if (session.lost()) {
        return statuses[b];
      }
      GPUFLEET_RETURN_IF_ERROR(
          session.Exec("rolling back to a savepoint", "ROLLBACK TO SAVEPOINT one_batch"));
    }
    if (grouped) {
      GPUFLEET_RETURN_IF_ERROR(
          session.Exec("releasing a savepoint", "RELEASE SAVEPOINT one_batch"));
    }
    revision += statuses[b].ok() ? 1 : 0;
  }
  GPUFLEET_RETURN_IF_ERROR(session
                               .Query("writing the store revision",
                                      "UPDATE gpufleet.store_revision SET revision = $1 WHERE id",
                                      Params().Int(revision))
                               .status());
  return session.Commit();
}

// Objects read and written per statement by BackfillStates.
constexpr int kBackfillRows = 1000;

Status BackfillStates(PgSession& session) {
  const char* what = "back-filling the state index";
  std::string kind;
  std::string name;
  while (true) {
    GPUFLEET_ASSIGN_OR_RETURN(
        ResultPtr rows,
        session.Query(what,
                      "SELECT kind, name, data FROM gpufleet.objects WHERE (kind, name) > ($1, $2)"
                      " ORDER BY kind, name LIMIT $3",
                      Params().Text(kind).Text(name).Int(kBackfillRows)));
    const int count = PQntuples(rows.get());
    if (count == 0) {
      return Status::Ok();
    }
    std::vector<std::string> kinds;
    std::vector<std::string> names;
    std::vector<std::string> states;
    for (int row = 0; row < count; ++row) {
      std::string state = IndexedState(Field(rows.get(), row, 2));
      if (!state.empty()) {
        kinds.emplace_back(Field(rows.get(), row, 0));
        names.emplace_back(Field(rows.get(), row, 1));
        states.push_back(std::move(state));
      }
    }
    kind = std::string(Field(rows.get(), count - 1, 0));
    name = std::string(Field(rows.get(), count - 1, 1));
    if (!kinds.empty()) {
      GPUFLEET_RETURN_IF_ERROR(
          session
              .Query(what,
                     "UPDATE gpufleet.objects AS o SET state = u.state"
                     " FROM unnest($1::text[], $2::text[], $3::text[]) AS u(kind, name, state)"
                     " WHERE o.kind = u.kind AND o.name = u.name",
                     Params().TextArray(kinds).TextArray(names).TextArray(states))
              .status());
    }
  }
}

Status MigrateInTransaction(PgSession& session, const std::string& label) {
  GPUFLEET_RETURN_IF_ERROR(session
                               .Query("taking the migration lock",
                                      "SELECT pg_advisory_xact_lock($1)",
                                      Params().Int(kMigrationLockKey))
                               .status());
  GPUFLEET_RETURN_IF_ERROR(session.Exec("creating the schema_migrations table", R"sql(
CREATE SCHEMA IF NOT EXISTS gpufleet;
CREATE TABLE IF NOT EXISTS gpufleet.schema_migrations (
  version bigint PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now()
);
)sql"));
  GPUFLEET_ASSIGN_OR_RETURN(
      ResultPtr newest,
      session.Query("reading the schema version",
                    "SELECT COALESCE(MAX(version), 0)::bigint FROM gpufleet.schema_migrations"));
  GPUFLEET_ASSIGN_OR_RETURN(const int64_t newest_version, Int64Field(newest.get(), 0, 0));
  if (newest_version > PostgresStateStore::LatestSchemaVersion()) {
    return FailedPreconditionError(fmt::format(
        "{}: the database has schema version {}, newer than the {} this gpufleet knows; open it "
        "with a newer gpufleet",
        label, newest_version, PostgresStateStore::LatestSchemaVersion()));
  }
  for (const PostgresMigration& migration : kPostgresMigrations) {
    if (migration.version <= newest_version) {
      continue;
    }
    const std::string what =
        fmt::format("applying migration {} ({})", migration.version, migration.name);
    GPUFLEET_RETURN_IF_ERROR(session.Exec(what, migration.sql));
    if (migration.then != nullptr) {
      GPUFLEET_RETURN_IF_ERROR(migration.then(session));
    }
    GPUFLEET_RETURN_IF_ERROR(
        session
            .Query(what, "INSERT INTO gpufleet.schema_migrations (version, name) VALUES ($1, $2)",
                   Params().Int(migration.version).Text(migration.name))
            .status());
  }
  return session.Commit();
}

// Runs `body` between BEGIN and its own COMMIT; rolls back if it fails with the connection alive.
Status InTransaction(PgSession& session, const std::function<Status(PgSession&)>& body) {
  GPUFLEET_RETURN_IF_ERROR(session.Exec("beginning a transaction", "BEGIN"));
  Status status = body(session);
  if (!status.ok() && !session.lost() && session.transaction_status() != PQTRANS_IDLE) {
    const Status rollback = session.Exec("rolling back", "ROLLBACK");
    if (!rollback.ok()) {
      status = Status(status.code(), status.message() + "; then " + rollback.message());
    }
  }
  return status;
}

void IgnoreNotice(void* /*arg*/, const char* /*message*/) {}

}  // namespace

void PostgresStateStore::Closer::operator()(pg_conn* conn) const {
  PQfinish(conn);
}

PostgresStateStore::PostgresStateStore(std::string uri, std::string redacted_uri,
                                       std::vector<std::string> secrets)
    : uri_(std::move(uri)), redacted_uri_(std::move(redacted_uri)), secrets_(std::move(secrets)) {}

PostgresStateStore::~PostgresStateStore() = default;

int64_t PostgresStateStore::LatestSchemaVersion() {
  return std::end(kPostgresMigrations)[-1].version;
}

Result<std::unique_ptr<PostgresStateStore>> PostgresStateStore::Open(const std::string& uri) {
  GPUFLEET_ASSIGN_OR_RETURN(ParsedUri parsed, ParseUri(uri));
  // The constructor is private, hence `new`.
  auto store = std::unique_ptr<PostgresStateStore>(
      new PostgresStateStore(uri, std::move(parsed.redacted), std::move(parsed.secrets)));
  const Status status = store->Run([&](PgSession& session) {
    return InTransaction(session, [&](PgSession& in_transaction) {
      return MigrateInTransaction(in_transaction, store->redacted_uri_);
    });
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  return store;
}

Status PostgresStateStore::Connect() {
  std::array<const char*, kDefaultKeywords.size() + 2> keywords{};
  std::array<const char*, kDefaultValues.size() + 2> values{};
  std::copy(kDefaultKeywords.begin(), kDefaultKeywords.end(), keywords.begin());
  std::copy(kDefaultValues.begin(), kDefaultValues.end(), values.begin());
  // Expanded last, so that what the URI says overrides the defaults.
  keywords[kDefaultKeywords.size()] = "dbname";
  values[kDefaultValues.size()] = uri_.c_str();
  conn_.reset(PQconnectdbParams(keywords.data(), values.data(), /*expand_dbname=*/1));
  if (conn_ == nullptr) {
    return UnavailableError(fmt::format("{}: connecting: out of memory", redacted_uri_));
  }
  if (PQstatus(conn_.get()) != CONNECTION_OK) {
    Status status = UnavailableError(fmt::format("{}: connecting: {}", redacted_uri_,
                                                 Redact(PQerrorMessage(conn_.get()), secrets_)));
    conn_.reset();
    return status;
  }
  PQsetNoticeProcessor(conn_.get(), IgnoreNotice, nullptr);
  const char* encoding = PQparameterStatus(conn_.get(), "server_encoding");
  if (encoding == nullptr || std::string_view(encoding) != "UTF8") {
    conn_.reset();
    return FailedPreconditionError(
        fmt::format("{}: the database's encoding is {}, not UTF8 (create it with ENCODING 'UTF8')",
                    redacted_uri_, encoding != nullptr ? encoding : "unknown"));
  }
  PgSession session(conn_.get(), redacted_uri_, secrets_);
  Status status = session.Exec("setting up the session",
                               "SET client_encoding TO 'UTF8'; SET synchronous_commit TO on");
  if (!status.ok()) {
    conn_.reset();
  }
  return status;
}

Status PostgresStateStore::Run(const std::function<Status(PgSession&)>& body) {
  std::lock_guard lock(mu_);
  const bool reused = conn_ != nullptr;
  if (!reused) {
    GPUFLEET_RETURN_IF_ERROR(Connect());
  }
  bool retry = false;
  Status status;
  {
    PgSession session(conn_.get(), redacted_uri_, secrets_);
    status = body(session);
    // A connection that died while idle (the server restarted, an idle timeout) fails the first
    // statement; nothing of this call took effect unless COMMIT was sent.
    retry = !status.ok() && session.lost() && reused && !session.commit_sent();
  }
  if (retry) {
    conn_.reset();
    GPUFLEET_RETURN_IF_ERROR(Connect());
    PgSession session(conn_.get(), redacted_uri_, secrets_);
    status = body(session);
  }
  // Lost, or (after a failed rollback) still inside a transaction: start afresh next time.
  if (PQstatus(conn_.get()) == CONNECTION_BAD || PQtransactionStatus(conn_.get()) != PQTRANS_IDLE) {
    conn_.reset();
  }
  return status;
}

Result<StoredObject> PostgresStateStore::DoGet(std::string_view kind, std::string_view name) {
  std::optional<StoredObject> object;
  const Status status = Run([&](PgSession& session) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(ResultPtr row,
                              session.Query(fmt::format("reading {}/{}", kind, name),
                                            "SELECT data, version, revision FROM gpufleet.objects"
                                            " WHERE kind = $1 AND name = $2",
                                            Params().Text(kind).Text(name)));
    object.reset();
    if (PQntuples(row.get()) == 0) {
      return Status::Ok();
    }
    StoredObject found{std::string(kind), std::string(name), std::string(Field(row.get(), 0, 0))};
    GPUFLEET_ASSIGN_OR_RETURN(found.version, Int64Field(row.get(), 0, 1));
    GPUFLEET_ASSIGN_OR_RETURN(found.revision, Int64Field(row.get(), 0, 2));
    object = std::move(found);
    return Status::Ok();
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  if (!object) {
    return ObjectNotFoundError(kind, name);
  }
  return std::move(*object);
}

Result<std::vector<StoredObject>> PostgresStateStore::DoGetMany(
    std::string_view kind, const std::vector<std::string>& names) {
  // One query: the names travel as one parameter, split on a newline, which no valid key holds.
  const std::string joined = fmt::format("{}", fmt::join(names, "\n"));
  std::vector<StoredObject> found;
  const Status status = Run([&](PgSession& session) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(
        ResultPtr rows, session.Query(fmt::format("reading {} {} objects", names.size(), kind),
                                      "SELECT name, data, version, revision FROM gpufleet.objects"
                                      " WHERE kind = $1 AND name = ANY(string_to_array($2, E'\\n'))"
                                      " ORDER BY name",
                                      Params().Text(kind).Text(joined)));
    found.clear();
    for (int row = 0; row < PQntuples(rows.get()); ++row) {
      StoredObject object{std::string(kind), std::string(Field(rows.get(), row, 0)),
                          std::string(Field(rows.get(), row, 1))};
      GPUFLEET_ASSIGN_OR_RETURN(object.version, Int64Field(rows.get(), row, 2));
      GPUFLEET_ASSIGN_OR_RETURN(object.revision, Int64Field(rows.get(), row, 3));
      found.push_back(std::move(object));
    }
    return Status::Ok();
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  return found;
}

Result<std::vector<StoredObject>> PostgresStateStore::DoList(std::string_view kind,
                                                             std::string_view name_prefix) {
  const std::optional<std::string> upper =
      name_prefix.empty() ? std::nullopt : PrefixUpperBound(name_prefix);
  std::vector<StoredObject> objects;
  const Status status = Run([&](PgSession& session) -> Status {
    const std::string what = fmt::format("listing {}", kind);
    Result<ResultPtr> rows =
        upper ? session.Query(what,
                              "SELECT name, data, version, revision FROM gpufleet.objects"
                              " WHERE kind = $1 AND name >= $2 AND name < $3 ORDER BY name",
                              Params().Text(kind).Text(name_prefix).Text(*upper))
              : session.Query(what,
                              "SELECT name, data, version, revision FROM gpufleet.objects"
                              " WHERE kind = $1 AND name >= $2 ORDER BY name",
                              Params().Text(kind).Text(name_prefix));
    GPUFLEET_RETURN_IF_ERROR(rows.status());
    GPUFLEET_ASSIGN_OR_RETURN(objects, ObjectsFromRows(rows->get(), kind, name_prefix));
    return Status::Ok();
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  return objects;
}

Result<std::vector<StoredObject>> PostgresStateStore::DoListWhere(std::string_view kind,
                                                                  const ListFilter& filter) {
  const std::string what = fmt::format("listing {} by state", kind);
  const std::optional<std::string> upper =
      filter.name_prefix.empty() ? std::nullopt : PrefixUpperBound(filter.name_prefix);
  const int64_t limit =
      filter.limit == 0 ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(filter.limit);
  std::vector<StoredObject> objects;
  const Status status = Run([&](PgSession& session) -> Status {
    return InTransaction(session, [&](PgSession& in_transaction) -> Status {
      // One snapshot for the states found and the objects listed: an object changing state in
      // between cannot be missed.
      GPUFLEET_RETURN_IF_ERROR(
          in_transaction.Exec(what, "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"));
      const auto distinct_states = [&]() -> Result<std::vector<std::string>> {
        std::vector<std::string> states;
        while (true) {
          // A skip scan of objects_by_state, one index seek per state.
          GPUFLEET_ASSIGN_OR_RETURN(
              ResultPtr row,
              in_transaction.Query(what,
                                   "SELECT state FROM gpufleet.objects WHERE kind = $1"
                                   " AND state > $2 ORDER BY state LIMIT 1",
                                   Params().Text(kind).Text(states.empty() ? "" : states.back())));
          if (PQntuples(row.get()) == 0) {
            return states;
          }
          states.emplace_back(Field(row.get(), 0, 0));
        }
      };
      const auto list_state = [&](const std::string& state) -> Result<std::vector<StoredObject>> {
        Params params;
        params.Text(kind).Text(state).Text(filter.start_after).Text(filter.name_prefix).Int(limit);
        Result<ResultPtr> rows =
            upper ? in_transaction.Query(
                        what,
                        "SELECT name, data, version, revision FROM gpufleet.objects"
                        " WHERE kind = $1 AND state = $2 AND name > $3 AND name >= $4"
                        " AND name < $6 ORDER BY name LIMIT $5",
                        params.Text(*upper))
                  : in_transaction.Query(
                        what,
                        "SELECT name, data, version, revision FROM gpufleet.objects"
                        " WHERE kind = $1 AND state = $2 AND name > $3 AND name >= $4"
                        " ORDER BY name LIMIT $5",
                        params);
        GPUFLEET_RETURN_IF_ERROR(rows.status());
        return ObjectsFromRows(rows->get(), kind, filter.name_prefix);
      };
      GPUFLEET_ASSIGN_OR_RETURN(objects, ListWhereByState(filter, distinct_states, list_state));
      return in_transaction.Exec(what, "COMMIT");
    });
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  return objects;
}

Status PostgresStateStore::DoCommit(const WriteBatch& batch) {
  return group_commits_.Commit(
      batch, [&](const std::vector<GroupCommitQueue::Pending*>& group) { CommitGroup(group); });
}

void PostgresStateStore::CommitGroup(const std::vector<GroupCommitQueue::Pending*>& group) {
  std::vector<const WriteBatch*> batches;
  for (const GroupCommitQueue::Pending* pending : group) {
    batches.push_back(pending->batch);
  }
  std::vector<Status> statuses;
  const Status status = Run([&](PgSession& session) {
    return InTransaction(session, [&](PgSession& in_transaction) {
      // mu_ is held: Run takes it.
      return CommitInTransaction(in_transaction, batches, fence_lease_, fence_token_.load(),
                                 statuses);
    });
  });
  for (size_t i = 0; i < group.size(); ++i) {
    // Nothing of the group is durable unless the transaction committed.
    group[i]->status = !status.ok() && (statuses.size() != group.size() || statuses[i].ok())
                           ? status
                           : statuses[i];
  }
}

Result<int64_t> PostgresStateStore::DoRevision() {
  int64_t revision = 0;
  const Status status = Run([&](PgSession& session) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(
        ResultPtr row, session.Query("reading the store revision",
                                     "SELECT revision FROM gpufleet.store_revision WHERE id"));
    if (PQntuples(row.get()) != 1) {
      return Status(StatusCode::kDataLoss,
                    fmt::format("{}: the store revision is missing", redacted_uri_));
    }
    GPUFLEET_ASSIGN_OR_RETURN(revision, Int64Field(row.get(), 0, 0));
    return Status::Ok();
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  return revision;
}

Result<std::vector<StoredEvent>> PostgresStateStore::DoEvents(std::string_view kind,
                                                              std::string_view name) {
  std::vector<StoredEvent> events;
  const Status status = Run([&](PgSession& session) -> Status {
    GPUFLEET_ASSIGN_OR_RETURN(ResultPtr rows,
                              session.Query(fmt::format("reading the events of {}/{}", kind, name),
                                            "SELECT revision, text FROM gpufleet.events"
                                            " WHERE kind = $1 AND name = $2 ORDER BY seq",
                                            Params().Text(kind).Text(name)));
    events.clear();
    for (int row = 0; row < PQntuples(rows.get()); ++row) {
      StoredEvent event;
      GPUFLEET_ASSIGN_OR_RETURN(event.revision, Int64Field(rows.get(), row, 0));
      event.text = std::string(Field(rows.get(), row, 1));
      events.push_back(std::move(event));
    }
    return Status::Ok();
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  return events;
}

// ---- leader election ------------------------------------------------------------------------

PostgresLeaderElection::PostgresLeaderElection(std::unique_ptr<PostgresStateStore> connection,
                                               PostgresStateStore& store, Options options)
    : connection_(std::move(connection)),
      store_(store),
      options_(std::move(options)),
      address_(options_.address) {}

void PostgresLeaderElection::SetAddress(std::string address) {
  std::lock_guard lock(address_mu_);
  address_ = std::move(address);
}

Result<std::unique_ptr<PostgresLeaderElection>> PostgresLeaderElection::Open(
    const std::string& uri, PostgresStateStore& store, Options options) {
  if (options.lease_name.empty() || options.identity.empty()) {
    return InvalidArgumentError(
        fmt::format("leader election: the lease name \"{}\" and the identity \"{}\" must not be "
                    "empty",
                    options.lease_name, options.identity));
  }
  if (options.lease < std::chrono::milliseconds(100)) {
    return InvalidArgumentError(
        fmt::format("leader election: the lease of {} ms is under the minimum of 100 ms",
                    options.lease.count()));
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<PostgresStateStore> connection,
                            PostgresStateStore::Open(uri));
  {
    std::lock_guard lock(store.mu_);
    store.fence_lease_ = options.lease_name;
    store.fence_token_ = 0;
  }
  // The constructor is private, hence `new`.
  return std::unique_ptr<PostgresLeaderElection>(
      new PostgresLeaderElection(std::move(connection), store, std::move(options)));
}

void PostgresLeaderElection::Fence(int64_t token) {
  store_.fence_token_.store(token);
}

Result<LeaseState> PostgresLeaderElection::Campaign() {
  std::string address;
  {
    std::lock_guard lock(address_mu_);
    address = address_;
  }
  LeaseState state;
  const Status status = connection_->Run([&](PgSession& session) -> Status {
    state = LeaseState();
    // One statement: take the lease if it is free or expired (a new holder: the token goes up),
    // renew it if it is ours; otherwise change nothing and return no row. Timed by the
    // database's clock, the one clock every server shares.
    GPUFLEET_ASSIGN_OR_RETURN(
        ResultPtr taken,
        session.Query(
            "campaigning for the leader lease",
            "INSERT INTO gpufleet.leader_lease AS l (name, holder, token, expires_at, address)"
            " VALUES ($1, $2, 1, now() + ($3::float8 / 1000.0) * interval '1 second', $4)"
            " ON CONFLICT (name) DO UPDATE SET"
            " token = CASE WHEN l.holder = EXCLUDED.holder THEN l.token ELSE l.token + 1 END,"
            " holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,"
            " address = EXCLUDED.address"
            " WHERE l.holder = EXCLUDED.holder OR l.expires_at <= now()"
            " RETURNING token",
            Params()
                .Text(options_.lease_name)
                .Text(options_.identity)
                .Int(options_.lease.count())
                .Text(address)));
    if (PQntuples(taken.get()) == 1) {
      state.leader = true;
      state.holder = options_.identity;
      state.address = address;
      GPUFLEET_ASSIGN_OR_RETURN(state.token, Int64Field(taken.get(), 0, 0));
      return Status::Ok();
    }
    GPUFLEET_ASSIGN_OR_RETURN(
        ResultPtr row, session.Query("reading the leader lease",
                                     "SELECT holder, address, token,"
                                     " (CASE WHEN expires_at > now() THEN 1 ELSE 0 END)::bigint"
                                     " FROM gpufleet.leader_lease WHERE name = $1",
                                     Params().Text(options_.lease_name)));
    if (PQntuples(row.get()) == 1) {
      GPUFLEET_ASSIGN_OR_RETURN(state.token, Int64Field(row.get(), 0, 2));
      GPUFLEET_ASSIGN_OR_RETURN(const int64_t live, Int64Field(row.get(), 0, 3));
      if (live == 1) {
        state.holder = std::string(Field(row.get(), 0, 0));
        state.address = std::string(Field(row.get(), 0, 1));
      }
    }
    return Status::Ok();
  });
  GPUFLEET_RETURN_IF_ERROR(status);
  Fence(state.leader ? state.token : 0);
  return state;
}

Status PostgresLeaderElection::Resign() {
  Fence(0);
  return connection_->Run([&](PgSession& session) {
    return session
        .Query("resigning the leader lease",
               "UPDATE gpufleet.leader_lease SET holder = '', address = '', expires_at = now()"
               " WHERE name = $1 AND holder = $2",
               Params().Text(options_.lease_name).Text(options_.identity))
        .status();
  });
}

}  // namespace gpufleet::store
