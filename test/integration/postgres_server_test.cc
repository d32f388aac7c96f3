// SPDX-License-Identifier: Apache-2.0
// `gpufleet server --store postgresql://...` end to end, against a PostgreSQL server the test
// starts: an acknowledged submission survives a SIGKILL of the server, a lost database is 503 and
// the server recovers by itself when it is back, and the password never reaches its output.
#include "gpufleet/store/testing/postgres_server.h"

#include <signal.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/http.h"
#include "gpufleet/api/testing/server_process.h"
#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kAdminToken[] = "postgres-test-admin-token-0123456789";
constexpr char kPassword[] = "Pg-S3cret-Passw0rd";
constexpr auto kStartTimeout = std::chrono::seconds(20);

std::string JobSpec(const std::string& name) {
  return nlohmann::json{
      {"apiVersion", "gpufleet.io/v1"},
      {"kind", "Job"},
      {"metadata", {{"name", name}}},
      {"spec",
       {{"tasks",
         {{{"name", "main"},
           {"replicas", 1},
           {"resources", {{"cpu", "1"}, {"memory", "1Gi"}, {"gpus", {{"count", 1}}}}}}}}}}}
      .dump();
}

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
    httplib::Result answer = client.Post("/v1/jobs", JobSpec(name), "application/json");
    return answer ? answer->status : -1;
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

  // Polls /metrics (bounded: 40 tries, 0.25 s apart) until the server says it leads.
  static ::testing::AssertionResult LeadsSoon(httplib::Client& client) {
    for (int attempt = 0; attempt < 40; ++attempt) {
      httplib::Result answer = client.Get("/metrics");
      if (answer && answer->body.find("gpufleet_server_leader{") != std::string::npos &&
          answer->body.find("\"} 1\n", answer->body.find("gpufleet_server_leader{")) ==
              answer->body.find("\"}", answer->body.find("gpufleet_server_leader{"))) {
        return ::testing::AssertionSuccess();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return ::testing::AssertionFailure() << "the server did not lead within 10 s";
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
  EXPECT_TRUE(LeadsSoon(client));

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

// Clients keep submitting while the postmaster is SIGKILLed and started again: while it is down
// submissions are 503 and /readyz says why; once it is back the server recovers by itself, and
// every submission it acknowledged (201) is there. The load is bounded: 4 clients, at most 20 s.
TEST_F(PostgresServerEndToEndTest, AKilledPostmasterUnderLoadLosesNothingAcknowledged) {
  Result<std::unique_ptr<api_testing::ServerProcess>> server = StartServer();
  ASSERT_OK(server);
  const int port = (*server)->port();
  constexpr int kClients = 4;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::atomic<bool> stop{false};
  std::atomic<int> refused_while_down{0};
  std::atomic<bool> down{false};
  std::vector<std::vector<std::string>> acknowledged(kClients);
  // Joined however the test ends (std::jthread), before what they capture goes.
  std::vector<std::jthread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client client("127.0.0.1", port);
      client.set_bearer_token_auth(kAdminToken);
      client.set_read_timeout(std::chrono::seconds(10));
      for (int i = 0; !stop.load() && std::chrono::steady_clock::now() < deadline; ++i) {
        const std::string name = fmt::format("load-{}-{}", c, i);
        const int status = Submit(client, name);
        if (status == 201) {
          acknowledged[c].push_back(name);
        } else if (down.load() && status == 503) {
          ++refused_while_down;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      }
    });
  }
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
  stop.store(true);
  clients.clear();
  EXPECT_GT(refused_while_down.load(), 0) << "the load went on while the database was down";
  size_t total = 0;
  for (const std::vector<std::string>& names : acknowledged) {
    total += names.size();
    for (const std::string& name : names) {
      EXPECT_EQ(GetJob(client, name), 200) << name << " was acknowledged";
    }
  }
  EXPECT_GT(total, 0u);
  EXPECT_EQ(Submit(client, "after-crash"), 201);
  (*server)->KillAndWait(SIGTERM);
}

}  // namespace
}  // namespace gpufleet
