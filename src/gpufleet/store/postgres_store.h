// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/store/group_commit.h"
#include "gpufleet/store/leader_election.h"
#include "gpufleet/store/state_store.h"

struct pg_conn;

namespace gpufleet::store {
namespace internal {
class PgSession;
}  // namespace internal

// A StateStore in a PostgreSQL database, reached through libpq.
//
// Location: a libpq connection URI, "postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?...]"
// (also "postgres://"). The password comes from the URI or, better, from libpq's password file
// (PGPASSFILE, ~/.pgpass); it never appears in an error message: every message names the URI
// with the password replaced by "***" (redacted_uri()).
//
// Schema: the tables live in the PostgreSQL schema "gpufleet" (objects, events, store_revision,
// schema_migrations), created on Open if missing. An ordered list of migrations compiled into the
// code is applied once each, under a transaction-scoped advisory lock so that servers opening one
// database at the same time do not race; a database whose schema is newer than this code knows is
// kFailedPrecondition. Kinds and names are `text COLLATE "C"` (bytewise order, as List promises);
// data and event text are `bytea`. The database must use the UTF8 encoding. The state index is a
// column of objects that every write sets from IndexedState, with an index on (kind, state, name).
//
// Durability and concurrency: each Commit is one transaction with synchronous_commit on, so an OK
// means the batch is in PostgreSQL's durable WAL (and on a synchronous standby if the server is
// configured with one). The transaction first locks the single store_revision row (SELECT ... FOR
// UPDATE), which serialises commits across all connections and processes sharing the database:
// the revision counter grows by exactly one per commit and each operation's version check sees
// every earlier commit. Several PostgresStateStore objects (in one or more processes) may share a
// database; each sees the others' commits.
//
// Group commit (GroupCommitQueue), as SqliteStateStore's: the batches of the threads that call
// Commit while a transaction is under way go together into the next one, each inside its own
// savepoint and with its own revision, so that a batch that fails is undone alone and the others
// still commit; the group costs one WAL flush (and one fencing check). Each caller returns once its
// own batch is durable or has failed; a failure of the transaction itself (the connection lost, the
// lease gone, the outcome of COMMIT unknown) is every batch's answer.
//
// Connection loss: a call that finds the connection lost (server restarted, network cut) is
// kUnavailable, and the next call connects again; a call on a connection that turns out to have
// been lost while idle reconnects and retries once by itself, where doing so cannot apply a batch
// twice. A Commit whose COMMIT was sent but whose answer was lost is kUnavailable saying that its
// outcome is unknown (the batch may or may not have been applied).
//
// Fencing: once a PostgresLeaderElection campaigns for this store, every Commit checks, in its own
// transaction and before anything else, that the election's lease row holds this store's token
// and has not expired, and takes a share lock on the row (SELECT ... FOR SHARE) so that no other
// server can take the lease over until the commit ends. A commit without the lease is
// kFailedPrecondition "not the leader: ..." and changes nothing.
//
// Thread-safe: one connection, and a std::mutex serialises every call on it.
class PostgresStateStore final : public StateStore {
 public:
  // A URI longer than this is kInvalidArgument.
  static constexpr size_t kMaxUriBytes = 4096;

  // Connects to the database at `uri` and brings its schema up to date. kInvalidArgument if `uri`
  // is not a valid libpq URI; kUnavailable if the server cannot be reached or refuses the
  // connection; kFailedPrecondition if the database is not UTF8 or its schema is too new.
  static Result<std::unique_ptr<PostgresStateStore>> Open(const std::string& uri);

  // The schema version this code writes (the version of its last migration).
  static int64_t LatestSchemaVersion();

  ~PostgresStateStore() override;
  PostgresStateStore(const PostgresStateStore&) = delete;
  PostgresStateStore& operator=(const PostgresStateStore&) = delete;

  // The URI with its password, if any, replaced by "***": safe to print.
  const std::string& redacted_uri() const { return redacted_uri_; }

 protected:
  Result<StoredObject> DoGet(std::string_view kind, std::string_view name) override;
  Result<std::vector<StoredObject>> DoGetMany(std::string_view kind,
                                              const std::vector<std::string>& names) override;
  Result<std::vector<StoredObject>> DoList(std::string_view kind,
                                           std::string_view name_prefix) override;
  Result<std::vector<StoredObject>> DoListWhere(std::string_view kind,
                                                const ListFilter& filter) override;
  Status DoCommit(const WriteBatch& batch) override;
  Result<int64_t> DoRevision() override;
  Result<std::vector<StoredEvent>> DoEvents(std::string_view kind, std::string_view name) override;

 private:
  friend class PostgresLeaderElection;

  struct Closer {
    void operator()(pg_conn* conn) const;
  };

  PostgresStateStore(std::string uri, std::string redacted_uri, std::vector<std::string> secrets);

  // Commits `group` in one transaction and sets each one's status.
  void CommitGroup(const std::vector<GroupCommitQueue::Pending*>& group);

  // Connects (again) and prepares the session. REQUIRES: mu_ held.
  Status Connect();
  // Runs `body` under mu_ on a live connection, connecting first if there is none. A connection
  // found lost is dropped (the next call connects again). If it was a connection from an earlier
  // call (most likely it died while idle) and `body` had not sent COMMIT, so that nothing of it
  // took effect, `body` runs once more on a new connection.
  Status Run(const std::function<Status(internal::PgSession&)>& body);

  const std::string uri_;
  const std::string redacted_uri_;
  // The password as written in the URI and as decoded: scrubbed from every message.
  const std::vector<std::string> secrets_;
  std::mutex mu_;
  // The connection, or null while there is none (before Open, after it was found lost); guarded
  // by mu_.
  std::unique_ptr<pg_conn, Closer> conn_;
  // Fencing (set by PostgresLeaderElection): the lease every commit checks ("" before any
  // election: no check; guarded by mu_), and the token this store's commits must find there (0:
  // none held, every commit refused). The token is atomic so that a campaign never waits for a
  // commit under way to set it.
  std::string fence_lease_;
  std::atomic<int64_t> fence_token_{0};
  GroupCommitQueue group_commits_;
};

// The PostgreSQL LeaderElection: one row of the table gpufleet.leader_lease per lease name,
// (name, holder, token, expires_at, address), taken and renewed by one statement that does
// nothing unless the campaigner holds the lease or it has expired, timed by the database's clock
// (now()), bumping the token whenever the holder changes. Campaigns run on a connection of their
// own, so a long commit does not hold up a renewal. Fences the commits of `store` (see
// PostgresStateStore): they succeed only while this election holds the lease.
//
// Thread-safe.
class PostgresLeaderElection final : public LeaderElection {
 public:
  struct Options {
    // The lease's row; servers electing one leader use the same name.
    std::string lease_name = "scheduler";
    // Unique to this campaigner; a restarted server must use a new one (its old term ends).
    std::string identity;
    // How other servers and clients reach this one when it leads ("http://host:port").
    std::string address;
    std::chrono::milliseconds lease{5000};
  };

  // Connects to `uri` (the database of `store`), and from now on fences `store`'s commits by the
  // lease. kInvalidArgument for an empty identity or lease name, or a lease under 100 ms; the
  // errors of PostgresStateStore::Open.
  static Result<std::unique_ptr<PostgresLeaderElection>> Open(const std::string& uri,
                                                              PostgresStateStore& store,
                                                              Options options);

  const std::string& identity() const override { return options_.identity; }
  Duration lease_duration() const override { return options_.lease; }
  Result<LeaseState> Campaign() override;
  Status Resign() override;
  // Changes the address the next campaigns record (a server that learns its port once bound).
  void SetAddress(std::string address);

 private:
  PostgresLeaderElection(std::unique_ptr<PostgresStateStore> connection, PostgresStateStore& store,
                         Options options);
  // Sets the token `store_`'s commits must find (0: refuse them).
  void Fence(int64_t token);

  // Its own connection to the database (a PostgresStateStore for its Run).
  std::unique_ptr<PostgresStateStore> connection_;
  PostgresStateStore& store_;
  const Options options_;
  std::mutex address_mu_;
  std::string address_;  // guarded by address_mu_
};

}  // namespace gpufleet::store
