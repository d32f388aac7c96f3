// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/http/client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/testing/fake_transport.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::http {
namespace {

using ::gpufleet::http_testing::FakeClient;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(ApiClient, TwoHundredIsTheJsonBody) {
  FakeClient fake("secret");
  fake.Answer("GET /v1/nodes", 200, R"({"items": []})");
  Result<nlohmann::json> answer = fake.client.Get("/v1/nodes");
  ASSERT_OK(answer);
  EXPECT_EQ(*answer, wire::ParseDocument(R"({"items": []})"));
  ASSERT_EQ(fake.state->requests.size(), 1U);
  EXPECT_EQ(fake.state->requests[0].method, "GET");
  EXPECT_EQ(fake.state->requests[0].token, "secret");
}

TEST(ApiClient, ServerErrorKeepsCodeAndMessageVerbatim) {
  FakeClient fake;
  fake.Answer("POST /v1/jobs", 400,
              R"js({"error": {"code": "INVALID_ARGUMENT",
                  "message": "spec.tasks[0].replicas: 0 (must be at least 1)"}})js");
  EXPECT_THAT(
      fake.client.Post("/v1/jobs", "x", "application/yaml"),
      StatusIs(StatusCode::kInvalidArgument, "spec.tasks[0].replicas: 0 (must be at least 1)"));
  EXPECT_TRUE(fake.client.last_error_from_server());
}

TEST(ApiClient, ErrorWithoutTheShapeFallsBackToTheHttpStatus) {
  FakeClient fake;
  fake.Answer("GET /v1/queues", 503, "overloaded\n");
  EXPECT_THAT(fake.client.Get("/v1/queues"),
              StatusIs(StatusCode::kUnavailable, "HTTP 503: overloaded"));
  fake.Answer("GET /v1/queues", 409, R"({"error": {"code": "SOMETHING_NEW", "message": "m"}})");
  EXPECT_THAT(fake.client.Get("/v1/queues"), StatusIs(StatusCode::kUnknown, "m"));
}

TEST(ApiClient, TransportFailureIsNotFromTheServer) {
  FakeClient fake;
  fake.Fail("GET /v1/nodes", UnavailableError("cannot reach http://fake:8080: Connection"));
  EXPECT_THAT(fake.client.Get("/v1/nodes"), StatusIs(StatusCode::kUnavailable));
  EXPECT_FALSE(fake.client.last_error_from_server());
}

TEST(ApiClient, SuccessWithBadJsonIsInternal) {
  FakeClient fake;
  fake.Answer("GET /v1/nodes", 200, "<html>");
  EXPECT_THAT(fake.client.Get("/v1/nodes"), StatusIs(StatusCode::kInternal));
}

TEST(ApiClient, RealTransportRejectsBadAddressesAndNamesUnreachableOnes) {
  ApiClient bad("ftp://host:21", "");
  EXPECT_THAT(bad.Get("/v1/nodes"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("http:// or https://")));
  // Port 1 on loopback: nothing listens there, so the connection is refused at once.
  ApiClient unreachable("http://127.0.0.1:1", "");
  EXPECT_THAT(unreachable.Get("/v1/nodes"),
              StatusIs(StatusCode::kUnavailable, HasSubstr("http://127.0.0.1:1")));
}

TEST(ApiClient, UnreadableCaCertIsNamed) {
  ApiClient client("https://127.0.0.1:1", "", "/nonexistent/ca.pem");
  EXPECT_THAT(client.Get("/v1/nodes"),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("CA certificate \"/nonexistent/ca.pem\": cannot read it")));
}

TEST(StatusCodeFromName, RoundTripsEveryCode) {
  for (int i = 0; i <= static_cast<int>(StatusCode::kUnauthenticated); ++i) {
    const auto code = static_cast<StatusCode>(i);
    EXPECT_EQ(StatusCodeFromName(StatusCodeName(code)), code);
  }
  EXPECT_EQ(StatusCodeFromName("NOPE"), StatusCode::kUnknown);
}

TEST(UrlEncode, KeepsUnreservedCharacters) {
  EXPECT_EQ(UrlEncode("node-0001_a.b~"), "node-0001_a.b~");
  EXPECT_EQ(UrlEncode("research/nlp x"), "research%2Fnlp%20x");
}

}  // namespace
}  // namespace gpufleet::http
