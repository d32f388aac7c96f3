// SPDX-License-Identifier: Apache-2.0
// Hostile requests against the real `gpufleet server` binary (issue 33): each must fail alone, with
// a reason, and leave the server serving everyone else. A crash shows here as a dead process,
// which an in-process test could not tell from a failed assertion.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/testing/server_process.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;

constexpr char kHostileAdminToken[] = "hostile-requests-admin-token-0123456789";

// `depth` arrays nested in one another, between `prefix` and `suffix`: {"gpus": [[[...]]]}.
std::string DeepBody(int depth, const std::string& prefix = "", const std::string& suffix = "") {
  return prefix + std::string(static_cast<size_t>(depth), '[') +
         std::string(static_cast<size_t>(depth), ']') + suffix;
}

class HostileRequestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("gpufleet-hostile-{}-{}", getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "admin-token") << kHostileAdminToken << "\n";
    Result<std::unique_ptr<api_testing::ServerProcess>> server = api_testing::ServerProcess::Start(
        GPUFLEET_BINARY,
        {"--data-dir", (dir_ / "data").string(), "--listen", "127.0.0.1:0", "--admin-token-file",
         (dir_ / "admin-token").string()},
        std::chrono::seconds(20));
    ASSERT_OK(server);
    server_ = std::move(*server);
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  httplib::Result Send(const std::string& method, const std::string& path, const std::string& token,
                       const std::string& body = "") {
    httplib::Client client("127.0.0.1", server_->port());
    client.set_read_timeout(std::chrono::seconds(20));
    if (!token.empty()) {
      client.set_bearer_token_auth(token);
    }
    if (method == "GET") {
      return client.Get(path);
    }
    if (method == "PATCH") {
      return client.Patch(path, body, "application/json");
    }
    return client.Post(path, body, "application/json");
  }

  // The token a POST /v1/tokens with `request` made.
  std::string CreateToken(const Json& request) {
    const httplib::Result created = Send("POST", "/v1/tokens", kHostileAdminToken, request.dump());
    EXPECT_TRUE(created && created->status == 201) << (created ? created->body : "no answer");
    return created ? wire::ParseDocument(created->body).value("token", "") : "";
  }

  std::filesystem::path dir_;
  std::unique_ptr<api_testing::ServerProcess> server_;
};

TEST_F(HostileRequestsTest, ABodyNestedDeepFailsAloneOnEveryRoute) {
  ASSERT_EQ(Send("POST", "/v1/teams", kHostileAdminToken, R"({"name": "a"})")->status, 201);
  const std::string member = CreateToken({{"role", "member"}, {"team", "a"}, {"name", "m"}});
  const std::string join = CreateToken({{"role", "agent"}, {"name", "join"}});
  const std::string node = CreateToken({{"role", "agent"}, {"node", "node-1"}, {"name", "n1"}});
  // 100,000 deep: about 200 KB, under the 1 MiB body limit.
  constexpr int kDepth = 100'000;
  struct Case {
    std::string method;
    std::string path;
    std::string token;
    std::string body;
  };
  const std::vector<Case> cases = {
      {"PATCH", "/v1/deployments/nowhere", member, DeepBody(kDepth, R"({"autoscaling": )", "}")},
      {"PATCH", "/v1/deployments/nowhere", member, DeepBody(kDepth)},
      {"POST", "/v1/deployments", member, DeepBody(kDepth, R"({"name": "d", "template": )", "}")},
      {"POST", "/v1/agents/register", join, DeepBody(kDepth, R"({"node": )", "}")},
      {"POST", "/v1/agents/register", node, DeepBody(kDepth)},
      {"POST", "/v1/agents/node-1/heartbeat", node, DeepBody(kDepth, R"({"gpus": )", "}")},
      // A provenance report may hold 64 KiB: 30,000 deep fits.
      {"POST", "/v1/agents/node-1/provenance", node, DeepBody(30'000)},
      {"POST", "/v1/queues", kHostileAdminToken,
       DeepBody(kDepth, R"({"name": "q", "guarantee": )", "}")},
      {"POST", "/v1/tokens", kHostileAdminToken, DeepBody(kDepth, R"({"name": )", "}")},
      {"POST", "/v1/teams", kHostileAdminToken, DeepBody(kDepth)},
      {"POST", "/v1/outcomes", kHostileAdminToken, DeepBody(kDepth, R"({"job": )", "}")},
      {"POST", "/v1/nodes/node-1/quarantine", kHostileAdminToken,
       DeepBody(kDepth, R"({"gpu": )", "}")},
      {"POST", "/v1/jobs", member, DeepBody(kDepth)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} {} ({} bytes)", c.method, c.path, c.body.size()));
    const httplib::Result answer = Send(c.method, c.path, c.token, c.body);
    ASSERT_TRUE(answer) << "no answer: " << httplib::to_string(answer.error()) << "\n"
                        << server_->output();
    EXPECT_EQ(answer->status, 400) << answer->body;
    EXPECT_THAT(answer->body, HasSubstr("deeper than")) << answer->body;
    const httplib::Result health = Send("GET", "/healthz", "");
    ASSERT_TRUE(health) << "the server stopped answering:\n" << server_->output();
    EXPECT_EQ(health->status, 200);
  }
  // Still alive: it was not killed by a signal.
  EXPECT_EQ(waitpid(server_->pid(), nullptr, WNOHANG), 0);
}

// Every verb prints text that other users wrote (a job's command and provenance in `get -o yaml`,
// a name quoted back in an error): the real binary must not hand a control character of it to the
// reader's terminal.
TEST_F(HostileRequestsTest, TheCliPrintsNoControlCharacterFromTheServer) {
  const Json tasks =
      Json::array({{{"name", "main"}, {"command", {"echo", "\x1b[2J\x1b[31mred\r"}}}});
  const Json provenance = {{"git.commit", "abc\x1b]0;owned\x07"},
                           {"lr",
                            "1e-4\xc2\x9b"
                            "2J"}};
  const Json job = {{"apiVersion", "gpufleet.io/v1"},
                    {"kind", "Job"},
                    {"metadata", {{"name", "escapes"}}},
                    {"spec", {{"provenance", provenance}, {"tasks", tasks}}}};
  const httplib::Result submitted = Send("POST", "/v1/jobs", kHostileAdminToken, job.dump());
  ASSERT_TRUE(submitted && submitted->status == 201) << (submitted ? submitted->body : "");
  const auto run = [&](const std::string& verb) {
    const std::string command =
        fmt::format("{} {} --server http://127.0.0.1:{} --token {} 2>&1", GPUFLEET_BINARY, verb,
                    server_->port(), kHostileAdminToken);
    FILE* pipe = popen(command.c_str(), "r");
    std::string output;
    if (pipe == nullptr) {
      ADD_FAILURE() << "cannot run " << command;
      return output;
    }
    char buffer[4096];
    for (size_t n; (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0;) {
      output.append(buffer, n);
    }
    pclose(pipe);
    return output;
  };
  const std::string yaml = run("get job escapes -o yaml");
  EXPECT_THAT(yaml, HasSubstr("red")) << yaml;
  // The server quotes the name back in its 404; the shell passes the escape as it is.
  const std::string error = run("describe job \"$(printf 'no\\033[2Jsuch\\302\\233')\"");
  EXPECT_THAT(error, HasSubstr("no\\x1b[2Jsuch\\u009b")) << error;
  for (const std::string* output : {&yaml, &error}) {
    for (const char control : {'\x1b', '\x07', '\r'}) {
      EXPECT_EQ(output->find(control), std::string::npos) << static_cast<int>(control) << *output;
    }
    EXPECT_EQ(output->find("\xc2\x9b"), std::string::npos) << *output;
  }
}

}  // namespace
}  // namespace gpufleet
