// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>
#include <string_view>

#include "gpufleet/api/server.h"

namespace gpufleet::api_testing {

// One API request handled in process, as the HTTP server would hand it over: `target` is the
// path with an optional query string ("/v1/jobs?state=Pending&limit=2"), percent-decoded as
// http::ParseTarget does; `token` becomes "Authorization: Bearer TOKEN" (none when empty).
// A target that does not parse answers 400 with the parser's message.
api::ApiResponse HandleRequest(api::ApiServer& server, std::string_view method,
                               std::string_view target, std::string_view token,
                               std::string body = "");

}  // namespace gpufleet::api_testing
