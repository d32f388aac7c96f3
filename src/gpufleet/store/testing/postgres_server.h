// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/status.h"

namespace gpufleet::store::testing {

// A throwaway PostgreSQL server for tests: `initdb` into a new temporary directory, then the
// server on 127.0.0.1 and a free port, its unix socket in that directory (`-k`), so that nothing
// outside the directory is touched. The destructor stops it and removes the directory.
//
//   Result<std::unique_ptr<PostgresServer>> server = PostgresServer::Start();
//   Result<std::string> uri = (*server)->CreateDatabase("t1");  // postgresql://gf@127.0.0.1:P/t1
//
// The binaries come from $GPUFLEET_PG_BINDIR or the newest /usr/lib/postgresql/<version>/bin
// (Debian's `postgresql` package; scripts/setup installs it); without them Start is
// kFailedPrecondition, so that tests fail rather than skip. initdb refuses to run as root: as
// root (CI), initdb and pg_ctl run as the `postgres` user the package creates.
//
// A test program that dies without running the destructor (a crash, SIGKILL, a closed stdout)
// leaves no server behind: a small watchdog process, started with the server, stops it and removes
// the directory once the test program's end of a pipe closes.
//
// Authentication: the superuser `gf` is trusted on loopback, for replication too; any other role
// must give its password (scram-sha-256). For speed the server runs with fsync=off: it survives its
// own restarts (Stop, StartAgain), not a machine crash. A standby retries a lost primary every
// 200 ms (wal_retrieve_retry_interval; its default of 5 s can delay a promotion as long).
//
// Not thread-safe.
class PostgresServer {
 public:
  // Creates the cluster and starts the server.
  static Result<std::unique_ptr<PostgresServer>> Start();
  // A hot standby of `primary` (which must run): `pg_basebackup -R -X stream` from it into a new
  // temporary directory, then the standby started on a port of its own, streaming from the
  // primary. Read-only until Promote. For synchronous replication set the primary's
  // synchronous_standby_names once the standby streams (pg_stat_replication).
  static Result<std::unique_ptr<PostgresServer>> StartStandby(const PostgresServer& primary);

  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // Stops the server (fast shutdown: open connections are closed). Its data stays.
  Status Stop();
  // Kills the postmaster with SIGKILL, as a crash would, and waits (at most 10 s) until every
  // process of the server is gone. Its data stays; StartAgain recovers it from its WAL.
  Status Crash();
  // Starts the stopped (or crashed) server again, on the same port and data.
  Status StartAgain();
  // `pg_ctl promote`, waiting until it is done: a standby becomes a primary that accepts writes.
  Status Promote();

  int port() const { return port_; }
  // The directory of the PostgreSQL programs it runs (pg_dump and pg_restore are there too).
  const std::string& bin_dir() const { return bin_dir_; }
  // The temporary directory (data, logs, unix socket).
  const std::string& dir() const { return dir_; }
  // "postgresql://gf@127.0.0.1:<port>/<database>".
  std::string Uri(std::string_view database = "postgres") const;

  // Creates an empty database `name` (letters, digits and '_') and returns its URI.
  Result<std::string> CreateDatabase(std::string_view name);
  // Runs `sql` (one or more statements) in `database` as the superuser.
  Status Execute(std::string_view database, const std::string& sql);
  // Runs the query `sql` in `database` as the superuser: its first column, row by row, as text.
  Result<std::vector<std::string>> QueryColumn(std::string_view database, const std::string& sql);

 private:
  PostgresServer(std::string bin_dir, std::string dir) : bin_dir_(bin_dir), dir_(dir) {}
  // An object owning a new temporary directory (the postgres user's when root), no server yet.
  static Result<std::unique_ptr<PostgresServer>> Create();
  // The watchdog, then pg_ctl start on a free port (a few tries: another process may take it).
  Status StartOnAFreePort();

  // Runs the server binary `program` with `args`, as the postgres user when root, its output
  // appended to <dir>/<program>.log. kUnavailable naming the log's tail if it fails.
  Status RunTool(const std::string& program, const std::vector<std::string>& args) const;
  Status InitDb();
  // pg_ctl start on port_, waiting until the server accepts connections.
  Status PgCtlStart();
  // The live (not zombie) processes whose working directory is the data directory: the
  // postmaster and its backends.
  std::vector<pid_t> ServerProcesses() const;
  // Starts the watchdog (see the class comment).
  Status StartWatchdog();

  const std::string bin_dir_;
  const std::string dir_;
  int port_ = 0;
  bool running_ = false;
  // Our end of the watchdog's pipe and its pid; -1 while there is none.
  int watchdog_fd_ = -1;
  pid_t watchdog_pid_ = -1;
};

}  // namespace gpufleet::store::testing
