// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/testing/api_request.h"

#include <utility>

#include "gpufleet/http/server.h"

namespace gpufleet::api_testing {

api::ApiResponse HandleRequest(api::ApiServer& server, std::string_view method,
                               std::string_view target, std::string_view token, std::string body) {
  Result<http::Request> request = http::ParseTarget(target);
  if (!request.ok()) {
    return api::ApiResponse{.status = 400, .body = request.status().ToString()};
  }
  request->method = std::string(method);
  request->target = std::string(target);
  if (!token.empty()) {
    request->authorization = "Bearer " + std::string(token);
  }
  request->body = std::move(body);
  return server.Handle(*request);
}

}  // namespace gpufleet::api_testing
