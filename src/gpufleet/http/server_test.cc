// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/http/server.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/http/testing/raw_connection.h"

namespace gpufleet::http {
namespace {

using http_testing::RawConnection;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

Response Echo(const Request& request) {
  Response response;
  response.content_type = "text/plain";
  response.body = request.method + " " + request.path;
  for (const auto& [key, value] : request.query) {
    response.body += " [" + key + "=" + value + "]";
  }
  response.body += " auth=" + request.authorization + " body=" + request.body;
  return response;
}

Response RenderError(int status, const std::string& message) {
  Response response;
  response.status = status;
  response.body = "{\"error\":\"" + message + "\"}";
  return response;
}

Lane AllUser(std::string_view, std::string_view) {
  return Lane::kUser;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void Serve(ServerOptions options, Handler handler = Echo, LaneOf lane_of = AllUser) {
    Result<std::unique_ptr<Server>> started =
        Server::Start(std::move(options), std::move(handler), std::move(lane_of), RenderError);
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    server_ = std::move(started).value();
  }

  std::string RoundTrip(const std::string& request) {
    RawConnection connection(server_->port());
    EXPECT_TRUE(connection.connected());
    EXPECT_TRUE(connection.Send(request));
    return connection.ReadAll();
  }

  std::unique_ptr<Server> server_;
};

TEST_F(HttpServerTest, DecodesPathQueryAndAuthorization) {
  Serve({});
  const std::string answer = RoundTrip(
      "GET /v1/jobs/a%20b?team=ml+x&q=%2Fy HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n"
      "Connection: close\r\n\r\n");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("GET /v1/jobs/a b [q=/y] [team=ml x] auth=Bearer t body="));
}

TEST_F(HttpServerTest, SendsLocationRetryAfterAndFurtherHeadersWhenSet) {
  Serve({}, [](const Request& request) {
    Response response;
    response.status = request.path == "/moved" ? 307 : 503;
    response.location = request.path == "/moved" ? "http://leader:1/moved" : "";
    response.retry_after_s = request.path == "/moved" ? 0 : 2;
    response.headers = {{"X-Content-Type-Options", "nosniff"}, {"Cache-Control", "no-store"}};
    return response;
  });
  const std::string moved =
      RoundTrip("GET /moved HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(moved, StartsWith("HTTP/1.1 307"));
  EXPECT_THAT(moved, HasSubstr("Location: http://leader:1/moved\r\n"));
  EXPECT_THAT(moved, Not(HasSubstr("Retry-After")));
  const std::string busy = RoundTrip("GET /busy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(busy, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(busy, HasSubstr("Retry-After: 2\r\n"));
  EXPECT_THAT(busy, Not(HasSubstr("Location")));
  EXPECT_THAT(busy, HasSubstr("X-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\n"));
}

TEST_F(HttpServerTest, HandlersSeeEveryHeaderRepeatedOnesJoined) {
  Serve({}, [](const Request& request) {
    return Response{.body = request.header("accept") + "|" + request.header("X-PEER") + "|" +
                            request.header("absent") + "|" + request.headers.front().first};
  });
  const std::string answer = RoundTrip(
      "GET / HTTP/1.1\r\nHost: x\r\nAccept: a/b\r\nX-Peer: 1\r\nACCEPT: c/d\r\n"
      "Connection: close\r\n\r\n");
  EXPECT_THAT(answer, HasSubstr("\r\n\r\na/b, c/d|1||host"));
}

// A body streamed from a file (an image layer of gigabytes), several chunks long: sent whole,
// with its Content-Length; HEAD has the length and no body; the connection then serves the
// next request.
TEST_F(HttpServerTest, StreamsFileBodiesAndAnswersHeadWithoutABody) {
  const std::string path = ::testing::TempDir() + "/http_file_body_" + std::to_string(getpid());
  std::string content;
  for (int i = 0; content.size() < (size_t{1} << 20) + 7; ++i) {
    content += std::to_string(i) + ",";
  }
  std::ofstream(path) << content;
  const auto file = std::make_shared<OpenFile>(open(path.c_str(), O_RDONLY | O_CLOEXEC),
                                               static_cast<int64_t>(content.size()));
  ASSERT_GE(file->fd(), 0);
  std::remove(path.c_str());  // the open file is what is served
  Serve({}, [&](const Request& request) {
    if (request.path != "/file") {
      return Echo(request);
    }
    return Response{.content_type = "application/octet-stream", .file = file};
  });
  RawConnection connection(server_->port());
  ASSERT_TRUE(
      connection.Send("GET /file HTTP/1.1\r\nHost: x\r\n\r\nHEAD /file HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string answers = connection.ReadAll();
  const std::string length = "Content-Length: " + std::to_string(content.size()) + "\r\n";
  ASSERT_THAT(answers, StartsWith("HTTP/1.1 200"));
  const size_t body = answers.find("\r\n\r\n") + 4;
  EXPECT_THAT(answers.substr(0, body), HasSubstr(length));
  EXPECT_EQ(answers.substr(body, content.size()), content);
  const std::string rest = answers.substr(body + content.size());
  ASSERT_THAT(rest, StartsWith("HTTP/1.1 200"));
  const size_t head_end = rest.find("\r\n\r\n") + 4;
  EXPECT_THAT(rest.substr(0, head_end), HasSubstr(length));
  // Nothing between the HEAD answer's header and the next answer.
  EXPECT_THAT(rest.substr(head_end), StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(rest.substr(head_end), HasSubstr("GET /after"));
}

TEST_F(HttpServerTest, AnswersPipelinedRequestsInOrder) {
  Serve({});
  RawConnection connection(server_->port());
  ASSERT_TRUE(
      connection.Send("GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
                      "POST /second HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
                      "GET /third HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  const std::string answers = connection.ReadAll();
  const size_t first = answers.find("GET /first");
  const size_t second = answers.find("POST /second auth= body=abc");
  const size_t third = answers.find("GET /third");
  ASSERT_NE(first, std::string::npos) << answers;
  ASSERT_NE(second, std::string::npos) << answers;
  ASSERT_NE(third, std::string::npos) << answers;
  EXPECT_LT(first, second);
  EXPECT_LT(second, third);
}

TEST_F(HttpServerTest, RefusesAmbiguousFraming) {
  Serve({});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
       "HTTP/1.1 400"},
      {"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
       "HTTP/1.1 400"},
      {"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
       "3\r\nabc\r\n0\r\n\r\n",
       "HTTP/1.1 400"},
      {"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n"
       "3\r\nabc\r\n0\r\n\r\n",
       "HTTP/1.1 400"},
      {"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nabc", "HTTP/1.1 501"},
      {"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
       "HTTP/1.1 501"},
      {"GET /x%zz HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400"},
      {"GET /x?a=%4 HTTP/1.1\r\nHost: x\r\n\r\n", "HTTP/1.1 400"},
      {"BLAH\r\n\r\n", "HTTP/1.1 400"},
  };
  for (const auto& [request, status] : cases) {
    const std::string answer = RoundTrip(request);
    EXPECT_THAT(answer, StartsWith(status)) << request;
    // A refused request ends its connection, so nothing after it is read as a request.
    EXPECT_THAT(answer, HasSubstr("Connection: close")) << request;
    EXPECT_EQ(answer.find("body=abc"), std::string::npos) << request;
  }
}

TEST_F(HttpServerTest, ReadsChunkedBodies) {
  Serve({});
  const std::string answer = RoundTrip(
      "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
      "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("body=abcde"));
}

TEST_F(HttpServerTest, OneBodyLimitWhateverTheContentType) {
  ServerOptions options;
  options.max_body_bytes = 64 * 1024;
  Serve(options);
  const std::string form_body(20 * 1024, 'a');
  const std::string accepted = RoundTrip(
      "POST /x HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
      "Content-Length: " +
      std::to_string(form_body.size()) + "\r\nConnection: close\r\n\r\n" + form_body);
  EXPECT_THAT(accepted, StartsWith("HTTP/1.1 200"));
  const std::string big_body(64 * 1024 + 1, 'a');
  const std::string declared = RoundTrip(
      "POST /x HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(big_body.size()) + "\r\n\r\n" + big_body);
  EXPECT_THAT(declared, StartsWith("HTTP/1.1 413"));
  EXPECT_THAT(declared, HasSubstr("request body over 65536 bytes"));
  // Chunked, so the size is known only while reading.
  std::string chunked = "POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (int i = 0; i < 5; ++i) {
    chunked += "4000\r\n" + std::string(0x4000, 'b') + "\r\n";
  }
  chunked += "0\r\n\r\n";
  EXPECT_THAT(RoundTrip(chunked), StartsWith("HTTP/1.1 413"));
}

TEST_F(HttpServerTest, RefusesOversizedHeaders) {
  ServerOptions options;
  options.max_header_bytes = 4096;
  Serve(options);
  const std::string answer =
      RoundTrip("GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(8192, 'h') + "\r\n\r\n");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 431"));
}

TEST_F(HttpServerTest, AnswersExpectContinue) {
  Serve({});
  RawConnection connection(server_->port());
  ASSERT_TRUE(
      connection.Send("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n"
                      "Connection: close\r\n\r\n"));
  EXPECT_THAT(connection.ReadUntil("\r\n\r\n"), StartsWith("HTTP/1.1 100 Continue"));
  ASSERT_TRUE(connection.Send("hello"));
  const std::string answer = connection.ReadAll();
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("body=hello"));
}

TEST_F(HttpServerTest, SlowClientsAreCutOffAndDoNotDelayOthers) {
  ServerOptions options;
  options.header_timeout = std::chrono::milliseconds(800);
  options.user_threads = 2;
  options.io_threads = 1;
  Serve(options);
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(std::make_unique<RawConnection>(server_->port()));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send("GET /slow HTTP/1.1\r\nHost: x\r\n"));
  }
  // Every worker thread is free: the 64 connections hold sockets, not threads.
  EXPECT_THAT(RoundTrip("GET /fast HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
              HasSubstr("GET /fast"));
  EXPECT_GE(server_->stats().connections_open, 64);
  // Still sending one header line at a time, past the header deadline: cut off.
  for (auto& connection : slow) {
    (void)connection->Send("X-Slow: 1\r\n");
  }
  for (auto& connection : slow) {
    EXPECT_TRUE(connection->Closed());
  }
  // The socket closes before the read completes with its timeout: allow the count to follow.
  for (int i = 0; i < 200 && server_->stats().timeouts < 64; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(server_->stats().timeouts, 64);
}

TEST_F(HttpServerTest, CapsConnectionsPerClient) {
  ServerOptions options;
  options.max_connections_per_client = 2;
  Serve(options);
  RawConnection first(server_->port());
  RawConnection second(server_->port());
  ASSERT_TRUE(first.connected() && second.connected());
  // Both are admitted before the third is accepted: each answers a request.
  ASSERT_TRUE(first.Send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_THAT(first.ReadUntil("auth="), HasSubstr("GET /a"));
  ASSERT_TRUE(second.Send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_THAT(second.ReadUntil("auth="), HasSubstr("GET /b"));
  RawConnection third(server_->port());
  const std::string refused = third.ReadAll();
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(refused, HasSubstr("holds its maximum of 2 connections"));
  EXPECT_EQ(server_->stats().connections_refused, 1);
}

TEST_F(HttpServerTest, LimitsRequestsPerConnection) {
  ServerOptions options;
  options.max_requests_per_connection = 2;
  Serve(options);
  RawConnection connection(server_->port());
  ASSERT_TRUE(
      connection.Send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n"
                      "GET /3 HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string answers = connection.ReadAll();
  EXPECT_EQ(RawConnection::Count(answers, "HTTP/1.1 200"), 2) << answers;
  EXPECT_THAT(answers, HasSubstr("Connection: close"));
  EXPECT_EQ(answers.find("GET /3"), std::string::npos);
}

TEST_F(HttpServerTest, AgentLaneIsServedWhileUserWorkersAreBusy) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  ServerOptions options;
  options.user_threads = 1;
  options.agent_threads = 1;
  Serve(
      options,
      [&](const Request& request) {
        if (request.path == "/user") {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait_for(lock, std::chrono::seconds(10), [&] { return release; });
        }
        return Echo(request);
      },
      [](std::string_view, std::string_view path) {
        return path.starts_with("/agent") ? Lane::kAgent : Lane::kUser;
      });
  RawConnection blocked(server_->port());
  ASSERT_TRUE(blocked.Send("GET /user HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  RawConnection queued(server_->port());
  ASSERT_TRUE(queued.Send("GET /user HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
  EXPECT_THAT(RoundTrip("GET /agent/heartbeat HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
              HasSubstr("GET /agent/heartbeat"));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  EXPECT_THAT(blocked.ReadAll(), HasSubstr("GET /user"));
  EXPECT_THAT(queued.ReadAll(), HasSubstr("GET /user"));
}

TEST_F(HttpServerTest, AHandlerThatThrowsFailsOnlyItsRequest) {
  Serve({}, [](const Request& request) -> Response {
    if (request.path == "/throw") {
      throw std::runtime_error("boom");
    }
    return Echo(request);
  });
  const std::string failed =
      RoundTrip("GET /throw HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_THAT(failed, StartsWith("HTTP/1.1 500"));
  EXPECT_THAT(failed, HasSubstr("boom"));
  EXPECT_THAT(RoundTrip("GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
              StartsWith("HTTP/1.1 200"));
}

TEST_F(HttpServerTest, StopClosesIdleConnections) {
  Serve({});
  RawConnection idle(server_->port());
  ASSERT_TRUE(idle.connected());
  ASSERT_TRUE(idle.Send("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_THAT(idle.ReadUntil("auth="), HasSubstr("GET /a"));
  server_->Stop();
  EXPECT_TRUE(idle.Closed());
}

TEST(ParseTargetTest, SplitsAndDecodes) {
  Result<Request> parsed = ParseTarget("/a%2Fb/c?x=1&y=a+b&x=2&flag&=v&&");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->path, "/a/b/c");
  std::vector<std::pair<std::string, std::string>> query(parsed->query.begin(),
                                                         parsed->query.end());
  EXPECT_THAT(query, ::testing::ElementsAre(std::pair<std::string, std::string>{"", "v"},
                                            std::pair<std::string, std::string>{"flag", ""},
                                            std::pair<std::string, std::string>{"x", "1"},
                                            std::pair<std::string, std::string>{"x", "2"},
                                            std::pair<std::string, std::string>{"y", "a b"}));
  EXPECT_EQ(ParseTarget("/a+b")->path, "/a+b");  // '+' is a space in the query only
}

TEST(ParseTargetTest, NamesTheBadEscape) {
  Result<Request> parsed = ParseTarget("/ok?name=%G1");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("query: bad percent-escape at byte 9"));
  EXPECT_THAT(ParseTarget("/x%").status().message(),
              HasSubstr("path: bad percent-escape at byte 2"));
}

}  // namespace
}  // namespace gpufleet::http
