// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/testing/postgres_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <libpq-fe.h>

namespace gpufleet::store::testing {
namespace {

// Start tries at most this many ports (another process may take a free port before the server
// binds it).
constexpr int kMaxStartAttempts = 5;
// pg_ctl waits at most this long for the server to start or stop.
constexpr const char* kPgCtlTimeoutSeconds = "60";
// The last bytes of a log quoted in an error.
constexpr size_t kLogTailBytes = 2000;

struct PostgresUser {
  uid_t uid;
  gid_t gid;
};

// The `postgres` user when running as root (initdb refuses root), nullopt otherwise.
Result<std::optional<PostgresUser>> UserToRunAs() {
  if (geteuid() != 0) {
    return std::optional<PostgresUser>();
  }
  passwd entry{};
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (getpwnam_r("postgres", &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr) {
    return FailedPreconditionError(
        "running as root, but there is no `postgres` user to run PostgreSQL as (install the "
        "postgresql package: scripts/setup)");
  }
  return std::optional<PostgresUser>(PostgresUser{entry.pw_uid, entry.pw_gid});
}

Result<std::string> FindBinDir() {
  if (const char* env = getenv("GPUFLEET_PG_BINDIR"); env != nullptr && *env != '\0') {
    if (!std::filesystem::exists(std::filesystem::path(env) / "initdb")) {
      return FailedPreconditionError(
          fmt::format("GPUFLEET_PG_BINDIR={} has no initdb", std::string(env)));
    }
    return std::string(env);
  }
  // The newest /usr/lib/postgresql/<major>/bin with initdb and pg_ctl.
  std::error_code error;
  int best_major = -1;
  std::string best;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/lib/postgresql", error)) {
    const std::string name = entry.path().filename().string();
    int major = 0;
    const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), major);
    const std::filesystem::path bin = entry.path() / "bin";
    if (ec == std::errc() && end == name.data() + name.size() && major > best_major &&
        std::filesystem::exists(bin / "initdb") && std::filesystem::exists(bin / "pg_ctl")) {
      best_major = major;
      best = bin.string();
    }
  }
  if (best.empty()) {
    return FailedPreconditionError(
        "no PostgreSQL server binaries (initdb, pg_ctl) in /usr/lib/postgresql/<version>/bin: "
        "install the postgresql package (scripts/setup) or set GPUFLEET_PG_BINDIR");
  }
  return best;
}

// The lowest port of the kernel's ephemeral range (Linux's default when it cannot be read).
int EphemeralRangeStart() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return in >> low && low > 1024 ? low : 32768;
}

// A loopback TCP port that was free a moment ago, below the kernel's ephemeral range: StartAgain
// reuses it after Crash, and a port of that range may meanwhile be taken by any outgoing
// connection on the machine (and kept for a minute in TIME_WAIT), failing the restart with
// "address already in use". The kernel never hands out a port below the range by itself.
Result<int> FreePort() {
  const int range_start = EphemeralRangeStart();
  const int lowest = std::max(1024, range_start - 12000);
  const int span = range_start - lowest;
  // Tests running at once start from different ports: where depends on the process id.
  const int first = static_cast<int>((static_cast<int64_t>(getpid()) * 7919) % span);
  int saved_errno = 0;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      return UnavailableError(fmt::format("socket: {}", std::strerror(errno)));
    }
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const int port = lowest + (first + attempt) % span;
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    saved_errno = errno;
    close(fd);
    if (bound) {
      return port;
    }
  }
  return UnavailableError(fmt::format("finding a free port in {}-{}: {}", lowest, range_start - 1,
                                      std::strerror(saved_errno)));
}

std::string LogTail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  const std::string text = contents.str();
  return text.size() > kLogTailBytes ? "..." + text.substr(text.size() - kLogTailBytes) : text;
}

bool IsSimpleName(std::string_view name) {
  if (name.empty()) {
    return false;
  }
  for (const char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
      return false;
    }
  }
  return true;
}

struct ConnectionCloser {
  void operator()(PGconn* conn) const { PQfinish(conn); }
};
struct ResultClearer {
  void operator()(PGresult* result) const { PQclear(result); }
};

}  // namespace

Result<std::unique_ptr<PostgresServer>> PostgresServer::Create() {
  GPUFLEET_ASSIGN_OR_RETURN(std::string bin_dir, FindBinDir());
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<PostgresUser> user, UserToRunAs());
  std::string pattern = (std::filesystem::temp_directory_path() / "gpufleet_pg_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return UnavailableError(fmt::format("mkdtemp {}: {}", pattern, std::strerror(errno)));
  }
  // pg_ctl passes -o through a shell, single-quoted.
  if (pattern.find('\'') != std::string::npos) {
    return FailedPreconditionError(fmt::format("temporary directory {} has a quote", pattern));
  }
  // Owned from here on: the destructor removes the directory.
  auto server = std::unique_ptr<PostgresServer>(new PostgresServer(bin_dir, pattern));
  if (user && chown(pattern.c_str(), user->uid, user->gid) != 0) {
    return UnavailableError(fmt::format("chown {}: {}", pattern, std::strerror(errno)));
  }
  return server;
}

Status PostgresServer::StartOnAFreePort() {
  GPUFLEET_RETURN_IF_ERROR(StartWatchdog());
  Status started;
  for (int attempt = 0; attempt < kMaxStartAttempts; ++attempt) {
    GPUFLEET_ASSIGN_OR_RETURN(port_, FreePort());
    started = PgCtlStart();
    if (started.ok()) {
      return started;
    }
  }
  return started;
}

Result<std::unique_ptr<PostgresServer>> PostgresServer::Start() {
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<PostgresServer> server, Create());
  GPUFLEET_RETURN_IF_ERROR(server->InitDb());
  GPUFLEET_RETURN_IF_ERROR(server->StartOnAFreePort());
  return server;
}

Result<std::unique_ptr<PostgresServer>> PostgresServer::StartStandby(
    const PostgresServer& primary) {
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<PostgresServer> server, Create());
  // -R writes standby.signal and primary_conninfo; -X stream copies the WAL written meanwhile.
  GPUFLEET_RETURN_IF_ERROR(server->RunTool(
      "pg_basebackup",
      {"-D", server->dir_ + "/data", "-h", "127.0.0.1", "-p", std::to_string(primary.port()), "-U",
       "gf", "-R", "-X", "stream", "-c", "fast", "--no-sync"}));
  GPUFLEET_RETURN_IF_ERROR(server->StartOnAFreePort());
  return server;
}

Status PostgresServer::Promote() {
  return RunTool("pg_ctl", {"-D", dir_ + "/data", "-w", "-t", kPgCtlTimeoutSeconds, "promote"});
}

PostgresServer::~PostgresServer() {
  if (running_) {
    (void)RunTool("pg_ctl", {"-D", dir_ + "/data", "-m", "immediate", "-w", "-t",
                             kPgCtlTimeoutSeconds, "stop"});
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
  if (watchdog_fd_ >= 0) {
    close(watchdog_fd_);  // the watchdog finds nothing left to do, and exits
    int wait_status = 0;
    while (waitpid(watchdog_pid_, &wait_status, 0) < 0 && errno == EINTR) {
    }
  }
}

Status PostgresServer::StartWatchdog() {
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<PostgresUser> user, UserToRunAs());
  int fds[2];
  // Close-on-exec: no other child (pg_ctl, the server) may hold the write end open.
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return UnavailableError(fmt::format("pipe2: {}", std::strerror(errno)));
  }
  // Waits for end of input, then stops the server (if it runs) and removes the directory.
  const char* script =
      "cat >/dev/null; \"$1/pg_ctl\" -D \"$2/data\" -m immediate -w -t 60 stop >/dev/null 2>&1; "
      "rm -rf \"$2\"";
  const std::string shell = "/bin/sh";
  std::vector<char*> argv = {const_cast<char*>(shell.c_str()),
                             const_cast<char*>("-c"),
                             const_cast<char*>(script),
                             const_cast<char*>("gpufleet-pg-watchdog"),
                             const_cast<char*>(bin_dir_.c_str()),
                             const_cast<char*>(dir_.c_str()),
                             nullptr};
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec. Its own session, so that a signal to
    // the test's process group (Ctrl-C, a CTest timeout) leaves it to clean up; no stdout or
    // stderr, so that whoever reads the test's output does not wait for it.
    const int null_fd = open("/dev/null", O_WRONLY);
    if (null_fd < 0 || dup2(fds[0], 0) < 0 || dup2(null_fd, 1) < 0 || dup2(null_fd, 2) < 0 ||
        setsid() < 0) {
      _exit(126);
    }
    if (user && (setgroups(0, nullptr) != 0 || setgid(user->gid) != 0 || setuid(user->uid) != 0)) {
      _exit(126);
    }
    execv(shell.c_str(), argv.data());
    _exit(127);
  }
  const int fork_errno = errno;
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    return UnavailableError(fmt::format("fork: {}", std::strerror(fork_errno)));
  }
  watchdog_fd_ = fds[1];
  watchdog_pid_ = pid;
  return Status::Ok();
}

Status PostgresServer::InitDb() {
  GPUFLEET_RETURN_IF_ERROR(RunTool("initdb", {"-D", dir_ + "/data", "-U", "gf", "-A", "trust", "-E",
                                              "UTF8", "--locale=C", "--no-sync"}));
  // The superuser needs no password on loopback; every other role gives one.
  std::ofstream hba(dir_ + "/data/pg_hba.conf", std::ios::trunc);
  hba << "local all all trust\n"
         "host all gf 127.0.0.1/32 trust\n"
         "host replication gf 127.0.0.1/32 trust\n"
         "host all all 127.0.0.1/32 scram-sha-256\n";
  hba.close();
  if (!hba) {
    return UnavailableError(fmt::format("writing {}/data/pg_hba.conf", dir_));
  }
  return Status::Ok();
}

Status PostgresServer::PgCtlStart() {
  const std::string options = fmt::format(
      "-p {} -k '{}' -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off "
      "-c shared_buffers=16MB -c max_connections=50 -c wal_retrieve_retry_interval=200ms",
      port_, dir_);
  GPUFLEET_RETURN_IF_ERROR(
      RunTool("pg_ctl", {"-D", dir_ + "/data", "-l", dir_ + "/postgres.log", "-o", options, "-w",
                         "-t", kPgCtlTimeoutSeconds, "start"}));
  running_ = true;
  return Status::Ok();
}

Status PostgresServer::Stop() {
  GPUFLEET_RETURN_IF_ERROR(RunTool(
      "pg_ctl", {"-D", dir_ + "/data", "-m", "fast", "-w", "-t", kPgCtlTimeoutSeconds, "stop"}));
  running_ = false;
  return Status::Ok();
}

Status PostgresServer::Crash() {
  const std::string lock_file = dir_ + "/data/postmaster.pid";
  std::ifstream in(lock_file);
  pid_t postmaster = 0;
  if (!(in >> postmaster) || postmaster <= 0) {
    return FailedPreconditionError(fmt::format("no postmaster pid in {}", lock_file));
  }
  if (kill(postmaster, SIGKILL) != 0) {
    return UnavailableError(
        fmt::format("kill -KILL {} (postmaster): {}", postmaster, std::strerror(errno)));
  }
  running_ = false;
  // The backends notice their postmaster is gone and exit; until they have, a new postmaster
  // would find its shared memory still in use.
  constexpr int kPolls = 200;
  for (int poll = 0; poll < kPolls; ++poll) {
    if (ServerProcesses().empty()) {
      // A postmaster no one has reaped yet (a container whose init does not reap) still answers
      // kill(pid, 0), and a new one would take it for a server still running: its lock files go.
      std::error_code ignored;
      std::filesystem::remove(lock_file, ignored);
      std::filesystem::remove(fmt::format("{}/.s.PGSQL.{}.lock", dir_, port_), ignored);
      return Status::Ok();
    }
    usleep(50'000);
  }
  return UnavailableError(
      fmt::format("processes of the killed server in {} still run after 10 s", dir_));
}

std::vector<pid_t> PostgresServer::ServerProcesses() const {
  std::vector<pid_t> processes;
  const std::filesystem::path data = std::filesystem::path(dir_) / "data";
  std::error_code error;
  for (const std::filesystem::directory_entry& entry :
       std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    pid_t pid = 0;
    if (std::from_chars(name.data(), name.data() + name.size(), pid).ec != std::errc() ||
        pid <= 0) {
      continue;
    }
    std::error_code unreadable;
    const std::filesystem::path cwd =
        std::filesystem::read_symlink(entry.path() / "cwd", unreadable);
    if (unreadable || cwd != data) {
      continue;
    }
    // "PID (COMM) STATE ...": a zombie has exited.
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t paren = text.rfind(')');
    if (paren != std::string::npos && paren + 2 < text.size() && text[paren + 2] == 'Z') {
      continue;
    }
    processes.push_back(pid);
  }
  return processes;
}

Status PostgresServer::StartAgain() {
  return PgCtlStart();
}

std::string PostgresServer::Uri(std::string_view database) const {
  return fmt::format("postgresql://gf@127.0.0.1:{}/{}", port_, database);
}

Status PostgresServer::RunTool(const std::string& program,
                               const std::vector<std::string>& args) const {
  GPUFLEET_ASSIGN_OR_RETURN(std::optional<PostgresUser> user, UserToRunAs());
  const std::string log_path = fmt::format("{}/{}.log", dir_, program);
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    return UnavailableError(fmt::format("opening {}: {}", log_path, std::strerror(errno)));
  }
  const std::string path = bin_dir_ + "/" + program;
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(path.c_str()));
  for (const std::string& arg : args) {
    argv.push_back(const_cast<char*>(arg.c_str()));
  }
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec.
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd < 0 || dup2(null_fd, 0) < 0 || dup2(log, 1) < 0 || dup2(log, 2) < 0) {
      _exit(126);
    }
    if (user && (setgroups(0, nullptr) != 0 || setgid(user->gid) != 0 || setuid(user->uid) != 0)) {
      _exit(126);
    }
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  const int fork_errno = errno;
  close(log);
  if (pid < 0) {
    return UnavailableError(fmt::format("fork: {}", std::strerror(fork_errno)));
  }
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0) {
    if (errno != EINTR) {
      return UnavailableError(fmt::format("waitpid: {}", std::strerror(errno)));
    }
  }
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    std::string tail = LogTail(log_path);
    if (program == "pg_ctl") {
      tail += "\n--- postgres.log:\n" + LogTail(dir_ + "/postgres.log");
    }
    return UnavailableError(fmt::format("{} {} failed (wait status {}): {}", path,
                                        args.empty() ? "" : args.back(), wait_status, tail));
  }
  return Status::Ok();
}

Result<std::string> PostgresServer::CreateDatabase(std::string_view name) {
  if (!IsSimpleName(name)) {
    return InvalidArgumentError(fmt::format("database name \"{}\" is not [a-z0-9_]+", name));
  }
  GPUFLEET_RETURN_IF_ERROR(Execute("postgres", fmt::format("CREATE DATABASE {}", name)));
  return Uri(name);
}

Status PostgresServer::Execute(std::string_view database, const std::string& sql) {
  return QueryColumn(database, sql).status();
}

Result<std::vector<std::string>> PostgresServer::QueryColumn(std::string_view database,
                                                             const std::string& sql) {
  const std::string uri = Uri(database);
  std::unique_ptr<PGconn, ConnectionCloser> conn(PQconnectdb(uri.c_str()));
  if (conn == nullptr || PQstatus(conn.get()) != CONNECTION_OK) {
    return UnavailableError(fmt::format("connecting to {}: {}", uri,
                                        conn ? PQerrorMessage(conn.get()) : "out of memory"));
  }
  std::unique_ptr<PGresult, ResultClearer> result(PQexec(conn.get(), sql.c_str()));
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    return UnavailableError(
        fmt::format("{} on {}: {}", sql, uri, PQresultErrorMessage(result.get())));
  }
  std::vector<std::string> column;
  if (status == PGRES_TUPLES_OK && PQnfields(result.get()) > 0) {
    for (int row = 0; row < PQntuples(result.get()); ++row) {
      column.emplace_back(PQgetvalue(result.get(), row, 0));
    }
  }
  return column;
}

}  // namespace gpufleet::store::testing
