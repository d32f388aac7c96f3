// SPDX-License-Identifier: Apache-2.0
// The HTTP transport with several servers (docs/ha.md) against real loopback servers: a
// follower's 307 is followed to the leader, and a server that cannot be reached is skipped.
#include <memory>
#include <string>
#include <thread>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/client.h"
#include "gpufleet/http/cpp_httplib.h"

namespace gpufleet::http {
namespace {

using ::gpufleet::testing::StatusIs;

// An httplib server on 127.0.0.1 and a free port, serving on a thread until destroyed.
class LoopbackServer {
 public:
  LoopbackServer() : port_(server_.bind_to_any_port("127.0.0.1")) {
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // Stopping a server that is not running yet would not stop it.
    while (!server_.is_running()) {
      std::this_thread::yield();
    }
  }
  ~LoopbackServer() {
    server_.stop();
    thread_.join();
  }
  httplib::Server& server() { return server_; }
  std::string address() const { return fmt::format("http://127.0.0.1:{}", port_); }

 private:
  httplib::Server server_;
  const int port_;
  std::thread thread_;
};

// An address nothing listens on: a port bound and released.
std::string DeadAddress() {
  LoopbackServer gone;
  return gone.address();
}

TEST(LeaderFollowingTransport, FollowsAFollowersRedirectAndStaysWithTheLeader) {
  LoopbackServer leader;
  LoopbackServer follower;
  int follower_posts = 0;
  std::string leader_saw;
  leader.server().Post("/v1/jobs", [&](const httplib::Request& request, httplib::Response& out) {
    leader_saw = request.body + " " + request.get_header_value("Authorization") + " " +
                 request.get_param_value("x");
    out.status = 201;
    out.set_content(R"({"name": "j"})", "application/json");
  });
  follower.server().Post("/v1/jobs", [&](const httplib::Request& request, httplib::Response& out) {
    ++follower_posts;
    out.status = 307;
    out.set_header("Location", leader.address() + request.target);
    out.set_content(R"({"error": {"code": "UNAVAILABLE", "message": "a follower"}})",
                    "application/json");
  });
  ApiClient client(follower.address() + "," + leader.address(), "secret");
  EXPECT_OK(client.Post("/v1/jobs?x=1", "spec", "application/yaml"));
  EXPECT_EQ(leader_saw, "spec Bearer secret 1");
  // The next call goes to the leader directly.
  EXPECT_OK(client.Post("/v1/jobs", "spec", "application/yaml"));
  EXPECT_EQ(follower_posts, 1);
}

// The token goes only to the servers the client was given: a redirect anywhere else is an error
// that names both, and the other host never sees a request.
TEST(LeaderFollowingTransport, DoesNotFollowARedirectToAServerNotConfigured) {
  LoopbackServer elsewhere;
  LoopbackServer server;
  int elsewhere_requests = 0;
  elsewhere.server().Post("/v1/jobs", [&](const httplib::Request&, httplib::Response& out) {
    ++elsewhere_requests;
    out.status = 201;
  });
  server.server().Post("/v1/jobs", [&](const httplib::Request& request, httplib::Response& out) {
    out.status = 307;
    out.set_header("Location", elsewhere.address() + request.target);
  });
  ApiClient client(server.address(), "secret");
  EXPECT_THAT(client.Post("/v1/jobs", "spec", "application/yaml"),
              StatusIs(StatusCode::kFailedPrecondition,
                       ::testing::AllOf(
                           ::testing::HasSubstr(server.address() + " redirected POST /v1/jobs to " +
                                                elsewhere.address()),
                           ::testing::HasSubstr("not one of the configured"))));
  EXPECT_EQ(elsewhere_requests, 0);
}

TEST(LeaderFollowingTransport, SkipsAServerThatCannotBeReached) {
  LoopbackServer live;
  live.server().Get("/v1/nodes", [](const httplib::Request&, httplib::Response& out) {
    out.set_content(R"({"items": []})", "application/json");
  });
  ApiClient client(DeadAddress() + "," + live.address(), "");
  EXPECT_OK(client.Get("/v1/nodes"));
  ApiClient none(DeadAddress() + "," + DeadAddress(), "");
  EXPECT_THAT(none.Get("/v1/nodes"), StatusIs(StatusCode::kUnavailable));
}

TEST(LeaderFollowingTransport, RedirectsEndAfterAFewHops) {
  LoopbackServer loop;
  loop.server().Get("/v1/nodes", [&](const httplib::Request&, httplib::Response& out) {
    out.status = 307;
    out.set_header("Location", loop.address() + "/v1/nodes");
    out.set_content(R"({"error": {"code": "UNAVAILABLE", "message": "no leader yet"}})",
                    "application/json");
  });
  ApiClient client(loop.address(), "");
  EXPECT_THAT(client.Get("/v1/nodes"), StatusIs(StatusCode::kUnavailable, "no leader yet"));
}

TEST(LeaderFollowingTransport, AnEmptyAddressInTheListIsInvalid) {
  ApiClient client("http://a:1,,http://b:2", "");
  EXPECT_THAT(client.Get("/v1/nodes"), StatusIs(StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace gpufleet::http
