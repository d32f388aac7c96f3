// SPDX-License-Identifier: Apache-2.0
// `gpufleet server --store postgresql://...` end to end, against a PostgreSQL server the test
// starts: an acknowledged submission survives a SIGKILL of the server, a lost database is 503 and
// the server recovers by itself when it is back, and the password never reaches its output; two
// servers on one database elect a leader (LeaderElectionEndToEndTest).
#include "gpufleet/store/testing/postgres_server.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/testing/job_spec_json.h"
#include "gpufleet/api/testing/server_process.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/client.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdminToken[] = "postgres-test-admin-token-0123456789";
constexpr char kPassword[] = "Pg-S3cret-Passw0rd";
constexpr auto kStartTimeout = std::chrono::seconds(20);
// The target: a follower leads and schedules again within 10 s of the leader's death
// (with the default lease of 5 s, renewed every second).
constexpr auto kFailoverTarget = std::chrono::seconds(10);
using Clock = std::chrono::steady_clock;

// Calls `done` every 100 ms until it holds or `timeout` has passed; whether it held.
bool WaitFor(std::chrono::milliseconds timeout, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return done();
}

// POSTs a one-task job; the HTTP status (-1 without an answer).
int SubmitOneTaskJob(httplib::Client& client, const std::string& name) {
  httplib::Result answer =
      client.Post("/v1/jobs", api_testing::OneTaskJobJson(name), "application/json");
  return answer ? answer->status : -1;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// `clients` threads that POST one-task jobs named PREFIX-C-I to the server on `port` until
// Stop() or `duration` has passed, each pausing 20 ms after an answer other than 201. `observe`,
// if given, sees every answer's status on the client's thread. Stop joins them; the destructor
// stops them too, before what they capture goes.
class SubmissionLoad {
 public:
  SubmissionLoad(int port, int clients, std::string prefix, std::chrono::seconds duration,
                 std::function<void(int status)> observe = nullptr)
      : acknowledged_(clients) {
    const Clock::time_point deadline = Clock::now() + duration;
    for (int c = 0; c < clients; ++c) {
      threads_.emplace_back([this, c, port, prefix, deadline, observe] {
        httplib::Client client("127.0.0.1", port);
        client.set_bearer_token_auth(kAdminToken);
        client.set_read_timeout(std::chrono::seconds(10));
        for (int i = 0; !stop_.load() && Clock::now() < deadline; ++i) {
          const std::string name = fmt::format("{}-{}-{}", prefix, c, i);
          const int status = SubmitOneTaskJob(client, name);
          if (observe) {
            observe(status);
          }
          if (status == 201) {
            acknowledged_[c].push_back(name);
          } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
          }
        }
      });
    }
  }
  ~SubmissionLoad() { Stop(); }

  void Stop() {
    stop_.store(true);
    threads_.clear();
  }
  // The names the server acknowledged (201). REQUIRES: Stop() was called.
  std::vector<std::string> Acknowledged() const {
    std::vector<std::string> names;
    for (const std::vector<std::string>& some : acknowledged_) {
      names.insert(names.end(), some.begin(), some.end());
    }
    return names;
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::vector<std::string>> acknowledged_;  // one per client thread
  std::vector<std::jthread> threads_;
};

class PostgresServerEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gpufleet-pg-e2e-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    std::ofstream(dir_ / "admin-token") << kAdminToken << "\n";
    Result<std::unique_ptr<store::testing::PostgresServer>> postgres =
        store::testing::PostgresServer::Start();
    ASSERT_OK(postgres);
    postgres_ = std::move(postgres).value();
    ASSERT_OK(postgres_->CreateDatabase("gpufleet"));
    // A role that must give its password, as in production.
    ASSERT_OK(postgres_->Execute(
        "gpufleet", fmt::format("CREATE ROLE app LOGIN PASSWORD '{}'; GRANT CREATE ON DATABASE "
                                "gpufleet TO app",
                                kPassword)));
  }

  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  Result<std::unique_ptr<api_testing::ServerProcess>> StartServer() {
    const std::string uri =
        fmt::format("postgresql://app:{}@127.0.0.1:{}/gpufleet", kPassword, postgres_->port());
    return api_testing::ServerProcess::Start(
        GPUFLEET_BINARY,
        {"--store", uri, "--listen", "127.0.0.1:0", "--simulated-nodes", "2x8",
         "--admin-token-file", (dir_ / "admin-token").string(), "--cycle-interval-ms", "20"},
        kStartTimeout);
  }

  static int Submit(httplib::Client& client, const std::string& name) {
    return SubmitOneTaskJob(client, name);
  }

  // Polls /readyz (bounded: 30 tries, 0.5 s apart; a cycle runs every 20 ms) until it answers
  // `status` with a body that holds `text`.
  static ::testing::AssertionResult ReadyzBecomes(httplib::Client& client, int status,
                                                  const std::string& text) {
    std::string last;
    for (int attempt = 0; attempt < 30; ++attempt) {
      httplib::Result answer = client.Get("/readyz");
      if (answer && answer->status == status && answer->body.find(text) != std::string::npos) {
        return ::testing::AssertionSuccess();
      }
      last = answer ? fmt::format("{} {}", answer->status, answer->body)
                    : fmt::format("no answer ({})", httplib::to_string(answer.error()));
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return ::testing::AssertionFailure() << "/readyz last answered: " << last;
  }

  // GET /metrics of the server on `port` ("" without a 200).
  static std::string Metrics(int port) {
    httplib::Client client("127.0.0.1", port);
    client.set_bearer_token_auth(kAdminToken);
    client.set_connection_timeout(std::chrono::seconds(1));
    httplib::Result answer = client.Get("/metrics");
    return answer && answer->status == 200 ? answer->body : "";
  }

  // Whether /metrics says the server leads (gpufleet_server_leader{server="..."} 1).
  static bool Leads(int port) {
    const std::string metrics = Metrics(port);
    const size_t line = metrics.find("\ngpufleet_server_leader{");
    return line != std::string::npos &&
           metrics.compare(metrics.find('\n', line + 1) - 2, 2, " 1") == 0;
  }

  static int GetJob(httplib::Client& client, const std::string& name) {
    httplib::Result answer = client.Get("/v1/jobs/" + name);
    return answer ? answer->status : -1;
  }

  std::filesystem::path dir_;
  std::unique_ptr<store::testing::PostgresServer> postgres_;
};

TEST_F(PostgresServerEndToEndTest, SurvivesACrashAndALostDatabaseWithoutPrintingThePassword) {
  Result<std::unique_ptr<api_testing::ServerProcess>> server = StartServer();
  ASSERT_OK(server);
  {
    httplib::Client client("127.0.0.1", (*server)->port());
    client.set_bearer_token_auth(kAdminToken);
    ASSERT_EQ(Submit(client, "before-crash"), 201);
  }
  (*server)->KillAndWait(SIGKILL);
  std::string output = (*server)->output();

  server = StartServer();
  ASSERT_OK(server);
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_bearer_token_auth(kAdminToken);
  client.set_read_timeout(std::chrono::seconds(30));
  EXPECT_EQ(GetJob(client, "before-crash"), 200);
  // The killed server's leader lease runs out first (docs/ha.md): until then the new one follows.
  EXPECT_TRUE(WaitFor(std::chrono::seconds(10), [&] { return Leads((*server)->port()); }));

  // The database goes away: requests that need it are 503, the server stays up, and /readyz says
  // it is not ready once a scheduling cycle has failed to reach the store.
  ASSERT_OK(postgres_->Stop());
  EXPECT_EQ(Submit(client, "while-down"), 503);
  EXPECT_TRUE(ReadyzBecomes(client, 503, "the state store is unreachable"));
  ASSERT_OK(postgres_->StartAgain());
  EXPECT_TRUE(ReadyzBecomes(client, 200, "ok"));
  // Back: the server carries on by itself, and nothing acknowledged was lost.
  EXPECT_EQ(Submit(client, "after-restart"), 201);
  EXPECT_EQ(GetJob(client, "before-crash"), 200);
  EXPECT_EQ(GetJob(client, "after-restart"), 200);
  EXPECT_EQ(GetJob(client, "while-down"), 404);

  (*server)->KillAndWait(SIGTERM);
  output += (*server)->output();
  EXPECT_THAT(output, HasSubstr("store postgresql://app:***@127.0.0.1"));
  EXPECT_THAT(output, Not(HasSubstr(kPassword)));
}

// The PostgreSQL backup path of docs/operations.md ("Back up and restore"): pg_dump of the store
// while the server runs, pg_restore into a fresh database, and a server on that database serves
// the jobs and nodes as they were at the dump (a job submitted after it is not there).
TEST_F(PostgresServerEndToEndTest, PgDumpAndPgRestoreCarryTheStoreToAFreshDatabase) {
  Result<std::unique_ptr<api_testing::ServerProcess>> server = StartServer();
  ASSERT_OK(server);
  {
    httplib::Client client("127.0.0.1", (*server)->port());
    client.set_bearer_token_auth(kAdminToken);
    for (const char* name : {"dumped-0", "dumped-1", "dumped-2"}) {
      ASSERT_EQ(Submit(client, name), 201);
    }
    const std::string dump = (dir_ / "gpufleet.dump").string();
    // As docs/operations.md has it: the custom format, as the role the server uses.
    ASSERT_EQ(std::system(fmt::format("PGPASSWORD='{}' '{}/pg_dump' --format=custom --file='{}' "
                                      "'postgresql://app@127.0.0.1:{}/gpufleet'",
                                      kPassword, postgres_->bin_dir(), dump, postgres_->port())
                              .c_str()),
              0);
    ASSERT_EQ(Submit(client, "after-dump"), 201);
    ASSERT_OK(postgres_->CreateDatabase("restored"));
    ASSERT_OK(postgres_->Execute("restored", "GRANT CREATE ON DATABASE restored TO app"));
    ASSERT_EQ(std::system(fmt::format("PGPASSWORD='{}' '{}/pg_restore' --no-owner --exit-on-error "
                                      "--dbname='postgresql://app@127.0.0.1:{}/restored' '{}'",
                                      kPassword, postgres_->bin_dir(), postgres_->port(), dump)
                              .c_str()),
              0);
  }
  (*server)->KillAndWait(SIGTERM);

  const std::string restored =
      fmt::format("postgresql://app:{}@127.0.0.1:{}/restored", kPassword, postgres_->port());
  server = api_testing::ServerProcess::Start(
      GPUFLEET_BINARY,
      {"--store", restored, "--listen", "127.0.0.1:0", "--admin-token-file",
       (dir_ / "admin-token").string(), "--cycle-interval-ms", "20"},
      kStartTimeout);
  ASSERT_OK(server);
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_bearer_token_auth(kAdminToken);
  client.set_read_timeout(std::chrono::seconds(30));
  for (const char* name : {"dumped-0", "dumped-1", "dumped-2"}) {
    EXPECT_EQ(GetJob(client, name), 200) << name;
  }
  EXPECT_EQ(GetJob(client, "after-dump"), 404);
  // The nodes of the first server (--simulated-nodes 2x8), which this one was not given.
  httplib::Result nodes = client.Get("/v1/nodes");
  ASSERT_TRUE(nodes);
  ASSERT_EQ(nodes->status, 200);
  Result<nlohmann::json> listed = wire::ParseJson(nodes->body);
  ASSERT_OK(listed);
  ASSERT_TRUE(listed->contains("items")) << nodes->body;
  EXPECT_EQ((*listed)["items"].size(), 2u) << nodes->body;
  (*server)->KillAndWait(SIGTERM);
}

// Clients keep submitting while the postmaster is SIGKILLed and started again: while it is down
// submissions are 503 and /readyz says why; once it is back the server recovers by itself, and
// every submission it acknowledged (201) is there. The load is bounded: 4 clients, at most 20 s.
TEST_F(PostgresServerEndToEndTest, AKilledPostmasterUnderLoadLosesNothingAcknowledged) {
  Result<std::unique_ptr<api_testing::ServerProcess>> server = StartServer();
  ASSERT_OK(server);
  const int port = (*server)->port();
  std::atomic<int> refused_while_down{0};
  std::atomic<bool> down{false};
  SubmissionLoad load(port, 4, "load", std::chrono::seconds(20), [&](int status) {
    if (down.load() && status == 503) {
      ++refused_while_down;
    }
  });
  httplib::Client client("127.0.0.1", port);
  client.set_bearer_token_auth(kAdminToken);
  client.set_read_timeout(std::chrono::seconds(30));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  down.store(true);
  ASSERT_OK(postgres_->Crash());
  EXPECT_TRUE(ReadyzBecomes(client, 503, "the state store is unreachable"));
  ASSERT_OK(postgres_->StartAgain());
  down.store(false);
  EXPECT_TRUE(ReadyzBecomes(client, 200, "ok"));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  load.Stop();
  EXPECT_GT(refused_while_down.load(), 0) << "the load went on while the database was down";
  const std::vector<std::string> acknowledged = load.Acknowledged();
  for (const std::string& name : acknowledged) {
    EXPECT_EQ(GetJob(client, name), 200) << name << " was acknowledged";
  }
  EXPECT_FALSE(acknowledged.empty());
  EXPECT_EQ(Submit(client, "after-crash"), 201);
  (*server)->KillAndWait(SIGTERM);
}

// Two servers on the database (docs/ha.md): one leads, the other follows (reads served, writes
// redirected, the clients following the redirect); the follower leads and schedules within 10 s of
// a SIGKILL of the leader (the measured failover is printed); a leader paused past its lease and
// resumed commits nothing and exits.
class LeaderElectionEndToEndTest : public PostgresServerEndToEndTest {
 protected:
  // The leader first, then a follower.
  void StartPair() {
    Result<std::unique_ptr<api_testing::ServerProcess>> leader = StartServer();
    ASSERT_OK(leader);
    leader_ = std::move(leader).value();
    ASSERT_TRUE(WaitFor(std::chrono::seconds(10), [&] { return Leads(leader_->port()); }))
        << leader_->output();
    Result<std::unique_ptr<api_testing::ServerProcess>> follower = StartServer();
    ASSERT_OK(follower);
    follower_ = std::move(follower).value();
    ASSERT_THAT(follower_->output(), HasSubstr("following"));
  }

  static std::string Address(const api_testing::ServerProcess& server) {
    return fmt::format("http://127.0.0.1:{}", server.port());
  }

  // The job's state as `server` serves it ("" when it cannot say).
  static std::string JobState(const api_testing::ServerProcess& server, const std::string& name) {
    httplib::Client client("127.0.0.1", server.port());
    client.set_bearer_token_auth(kAdminToken);
    client.set_connection_timeout(std::chrono::seconds(1));
    httplib::Result answer = client.Get("/v1/jobs/" + name);
    if (!answer || answer->status != 200) {
      return answer ? fmt::format("HTTP {}", answer->status) : "";
    }
    const nlohmann::json job = nlohmann::json::parse(answer->body, nullptr, false);
    return job.is_object() && job.contains("state") && job["state"].is_string()
               ? job["state"].get<std::string>()
               : "";
  }

  static bool Placed(const api_testing::ServerProcess& server, const std::string& name) {
    const std::string state = JobState(server, name);
    return state == "Scheduled" || state == "Running";
  }

  std::unique_ptr<api_testing::ServerProcess> leader_;
  std::unique_ptr<api_testing::ServerProcess> follower_;
};

TEST_F(LeaderElectionEndToEndTest, TheFollowerRedirectsWritesAndLeadsWithinTenSecondsOfAKill) {
  StartPair();
  ASSERT_NE(follower_, nullptr);
  EXPECT_FALSE(Leads(follower_->port()));
  // Its first campaign tells it who leads.
  EXPECT_TRUE(WaitFor(std::chrono::seconds(5), [&] {
    return Metrics(follower_->port()).find(fmt::format("address=\"{}\"", Address(*leader_))) !=
           std::string::npos;
  })) << Metrics(follower_->port());

  // A write sent to the follower is a 307 to the same target on the leader.
  {
    httplib::Client raw("127.0.0.1", follower_->port());
    raw.set_bearer_token_auth(kAdminToken);
    httplib::Result answer =
        raw.Post("/v1/jobs?dry=1", api_testing::OneTaskJobJson("raw"), "application/json");
    ASSERT_TRUE(answer);
    EXPECT_EQ(answer->status, 307);
    EXPECT_EQ(answer->get_header_value("Location"), Address(*leader_) + "/v1/jobs?dry=1");
  }
  // The clients follow it to a server they were given: a submission through the follower lands
  // on the leader, and the follower serves the job from the store.
  http::ApiClient through_follower(Address(*follower_) + "," + Address(*leader_), kAdminToken);
  ASSERT_OK(
      through_follower.Post("/v1/jobs", api_testing::OneTaskJobJson("j1"), "application/json"));
  EXPECT_TRUE(WaitFor(std::chrono::seconds(5), [&] { return Placed(*follower_, "j1"); }))
      << JobState(*follower_, "j1");

  // SIGKILL the leader; a client that knows both servers goes on with the follower once it
  // leads.
  const std::string dead = Address(*leader_);
  const Clock::time_point killed = Clock::now();
  leader_->KillAndWait(SIGKILL);
  http::ApiClient both(dead + "," + Address(*follower_), kAdminToken);
  double led_after = -1;
  ASSERT_TRUE(WaitFor(kFailoverTarget + std::chrono::seconds(5), [&] {
    if (led_after < 0 && Leads(follower_->port())) {
      led_after = SecondsSince(killed);
    }
    return both.Post("/v1/jobs", api_testing::OneTaskJobJson("j2"), "application/json").ok();
  })) << follower_->output();
  ASSERT_TRUE(WaitFor(std::chrono::seconds(5), [&] { return Placed(*follower_, "j2"); }))
      << JobState(*follower_, "j2") << "\n"
      << follower_->output();
  const double failover = SecondsSince(killed);
  if (led_after < 0) {
    led_after = failover;
  }
  std::printf("failover: leads %.2f s, schedules a new job %.2f s after the SIGKILL\n", led_after,
              failover);
  EXPECT_LT(failover, std::chrono::duration<double>(kFailoverTarget).count());
  EXPECT_TRUE(Placed(*follower_, "j1")) << "the old leader's placement is kept";
  EXPECT_THAT(follower_->output(), HasSubstr("rebuilt its view from the store"));
  EXPECT_EQ(follower_->KillAndWait(SIGTERM), 0);
}

TEST_F(LeaderElectionEndToEndTest, ALeaderPausedPastItsLeaseCommitsNothingAndExits) {
  StartPair();
  ASSERT_NE(follower_, nullptr);
  ASSERT_EQ(kill(leader_->pid(), SIGSTOP), 0);
  ASSERT_TRUE(WaitFor(kFailoverTarget, [&] { return Leads(follower_->port()); }))
      << follower_->output();
  http::ApiClient through_follower(Address(*follower_), kAdminToken);
  ASSERT_OK(through_follower.Post("/v1/jobs", api_testing::OneTaskJobJson("during-pause"),
                                  "application/json"));

  // A submission reaches the paused leader (the kernel accepts the connection); when it
  // resumes it still believes it leads until its next campaign. Whichever comes first, the
  // database refuses its write (fencing) or it redirects: it commits nothing.
  int late_status = 0;
  std::string late_body;
  std::string late_retry_after;
  std::thread late([&] {
    httplib::Client raw("127.0.0.1", leader_->port());
    raw.set_bearer_token_auth(kAdminToken);
    raw.set_read_timeout(std::chrono::seconds(20));
    httplib::Result answer =
        raw.Post("/v1/jobs", api_testing::OneTaskJobJson("late"), "application/json");
    late_status = answer ? answer->status : -1;
    late_body = answer ? answer->body : httplib::to_string(answer.error());
    late_retry_after = answer ? answer->get_header_value("Retry-After") : "";
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(kill(leader_->pid(), SIGCONT), 0);
  late.join();
  std::printf("the resumed leader answered the late write: %d %s\n", late_status,
              late_body.c_str());
  // Refused by the fencing check, it is 503 with Retry-After (the write belongs to the new leader
  // the message names), not 400.
  EXPECT_TRUE(late_status == 307 ||
              (late_status == 503 && late_retry_after == "1" &&
               late_body.find("no longer the leader and wrote nothing") != std::string::npos &&
               late_body.find("not the leader") != std::string::npos))
      << late_status << " " << late_body;
  EXPECT_EQ(JobState(*follower_, "late"), "HTTP 404");

  // Deposed, it exits (status 1) so that its supervisor restarts it as a follower.
  EXPECT_TRUE(WaitFor(std::chrono::seconds(10), [&] {
    return leader_->output().find("lost the leader lease") != std::string::npos;
  })) << leader_->output();
  // The message comes just before the exit: wait (bounded) until it has exited, a zombie.
  EXPECT_TRUE(WaitFor(std::chrono::seconds(10), [&] {
    std::ifstream stat(fmt::format("/proc/{}/stat", leader_->pid()));
    std::string pid;
    std::string command;
    std::string state;
    stat >> pid >> command >> state;
    return state == "Z";
  }));
  const int status = leader_->KillAndWait(SIGKILL);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_THAT(leader_->output(), HasSubstr("no longer the leader"));
  EXPECT_TRUE(Placed(*follower_, "during-pause"));
  EXPECT_TRUE(Leads(follower_->port()));
  EXPECT_EQ(follower_->KillAndWait(SIGTERM), 0);
}

// A streaming-replication pair (docs/ha.md, "A replicated database"): a primary and a hot standby
// (pg_basebackup -R) with synchronous replication, so that a commit is acknowledged only once the
// standby has it. The server names both hosts in one libpq URI with
// target_session_attrs=read-write, so it writes to whichever accepts writes. Clients submit while
// the primary is SIGKILLed and the standby promoted: the server finds the promoted standby by
// itself, and every submission it acknowledged is there. Bounded: 3 clients, at most 25 s.
TEST(StreamingReplicationEndToEndTest, APromotedStandbyHasEverythingAcknowledged) {
  Result<std::unique_ptr<store::testing::PostgresServer>> primary =
      store::testing::PostgresServer::Start();
  ASSERT_OK(primary);
  ASSERT_OK((*primary)->CreateDatabase("gpufleet"));
  Result<std::unique_ptr<store::testing::PostgresServer>> standby =
      store::testing::PostgresServer::StartStandby(**primary);
  ASSERT_OK(standby);
  // Synchronous once the standby streams: from then on a COMMIT returns only when the standby has
  // flushed it.
  ASSERT_TRUE(WaitFor(std::chrono::seconds(20), [&] {
    const Result<std::vector<std::string>> state =
        (*primary)->QueryColumn("postgres", "SELECT state FROM pg_stat_replication");
    return state.ok() && state->size() == 1 && (*state)[0] == "streaming";
  }));
  ASSERT_OK((*primary)->Execute("postgres", "ALTER SYSTEM SET synchronous_standby_names = '*'"));
  ASSERT_OK((*primary)->Execute("postgres", "SELECT pg_reload_conf()"));
  ASSERT_TRUE(WaitFor(std::chrono::seconds(10), [&] {
    const Result<std::vector<std::string>> state =
        (*primary)->QueryColumn("postgres", "SELECT sync_state FROM pg_stat_replication");
    return state.ok() && state->size() == 1 && (*state)[0] == "sync";
  }));

  std::string pattern =
      (std::filesystem::temp_directory_path() / "gpufleet-pg-repl-XXXXXX").string();
  ASSERT_NE(mkdtemp(pattern.data()), nullptr);
  const std::filesystem::path dir = pattern;
  std::ofstream(dir / "admin-token") << kAdminToken << "\n";
  const std::string uri = fmt::format(
      "postgresql://gf@127.0.0.1:{},127.0.0.1:{}/gpufleet?target_session_attrs=read-write",
      (*primary)->port(), (*standby)->port());
  Result<std::unique_ptr<api_testing::ServerProcess>> server = api_testing::ServerProcess::Start(
      GPUFLEET_BINARY,
      {"--store", uri, "--listen", "127.0.0.1:0", "--simulated-nodes", "2x8", "--admin-token-file",
       (dir / "admin-token").string(), "--cycle-interval-ms", "20"},
      kStartTimeout);
  ASSERT_OK(server);
  const int port = (*server)->port();

  std::atomic<bool> promoted{false};
  std::atomic<int> after_promotion{0};
  SubmissionLoad load(port, 3, "repl", std::chrono::seconds(25), [&](int status) {
    if (status == 201 && promoted.load()) {
      ++after_promotion;
    }
  });
  // Wait (bounded) until the standby holds some acknowledged submissions, then lose the primary.
  ASSERT_TRUE(WaitFor(std::chrono::seconds(10), [&] {
    const Result<std::vector<std::string>> jobs = (*standby)->QueryColumn(
        "gpufleet", "SELECT count(*) FROM gpufleet.objects WHERE kind = 'jobs'");
    return jobs.ok() && jobs->size() == 1 && std::atoi((*jobs)[0].c_str()) >= 10;
  }));
  ASSERT_OK((*primary)->Crash());
  const Clock::time_point crashed = Clock::now();
  ASSERT_OK((*standby)->Promote());
  const double promoted_after = SecondsSince(crashed);
  promoted.store(true);
  EXPECT_TRUE(WaitFor(std::chrono::seconds(15), [&] { return after_promotion.load() >= 3; }))
      << (*server)->output();
  std::printf(
      "the standby was promoted %.2f s after the primary was killed; the server wrote to it "
      "%.2f s after the kill\n",
      promoted_after, SecondsSince(crashed));
  load.Stop();

  httplib::Client client("127.0.0.1", port);
  client.set_bearer_token_auth(kAdminToken);
  client.set_read_timeout(std::chrono::seconds(10));
  const std::vector<std::string> acknowledged = load.Acknowledged();
  for (const std::string& name : acknowledged) {
    httplib::Result answer = client.Get("/v1/jobs/" + name);
    EXPECT_TRUE(answer && answer->status == 200) << name << " was acknowledged";
  }
  std::printf("%zu acknowledged submissions, all on the promoted standby\n", acknowledged.size());
  EXPECT_GT(acknowledged.size(), 10u);
  EXPECT_EQ((*server)->KillAndWait(SIGTERM), 0);
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace gpufleet
