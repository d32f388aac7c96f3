// SPDX-License-Identifier: Apache-2.0
// A scripted http::Transport for tests: answers by "METHOD PATH" and records every request.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufleet/http/client.h"

namespace gpufleet::http_testing {

struct RecordedRequest {
  std::string method;
  std::string path;
  std::string body;
  std::string content_type;
  std::string token;
};

// Not thread-safe. Shared state lives in a shared_ptr so that the test keeps a handle after the
// http::ApiClient took ownership of the transport.
class FakeTransport final : public http::Transport {
 public:
  struct State {
    std::map<std::string, Result<http::HttpResponse>> answers;
    std::vector<RecordedRequest> requests;
  };

  explicit FakeTransport(std::shared_ptr<State> state) : state_(std::move(state)) {}

  Result<http::HttpResponse> Send(std::string_view method, std::string_view path,
                                  std::string_view body, std::string_view content_type,
                                  std::string_view token) override {
    state_->requests.push_back({std::string(method), std::string(path), std::string(body),
                                std::string(content_type), std::string(token)});
    const auto it = state_->answers.find(std::string(method) + " " + std::string(path));
    if (it == state_->answers.end()) {
      return http::HttpResponse{
          .status = 404,
          .body = R"({"error": {"code": "NOT_FOUND", "message": "no route"}})",
          .content_type = "application/json"};
    }
    return it->second;
  }

 private:
  std::shared_ptr<State> state_;
};

// An http::ApiClient on a FakeTransport, with the handle to script and inspect it.
struct FakeClient {
  explicit FakeClient(std::string token = "tok")
      : state(std::make_shared<FakeTransport::State>()),
        client(std::make_unique<FakeTransport>(state), "http://fake:8080", std::move(token)) {}

  void Answer(const std::string& method_and_path, int status, std::string body) {
    state->answers.insert_or_assign(
        method_and_path, Result<http::HttpResponse>(
                             http::HttpResponse{status, std::move(body), "application/json"}));
  }
  void Fail(const std::string& method_and_path, Status status) {
    state->answers.insert_or_assign(method_and_path, Result<http::HttpResponse>(std::move(status)));
  }

  std::shared_ptr<FakeTransport::State> state;
  http::ApiClient client;
};

}  // namespace gpufleet::http_testing
