// SPDX-License-Identifier: Apache-2.0
// The client side of the REST API (`docs/api.md`): a transport seam and the JSON client on it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpufleet/core/status.h"

namespace gpufleet::http {

// One HTTP answer, whatever its status.
struct HttpResponse {
  int status = 0;
  std::string body;
  std::string content_type;
  // The Location header (a redirect's target); empty when absent.
  std::string location;
};

// Sends one request. A non-2xx answer is a response, not an error; errors are failures to get
// any answer (connection refused, TLS failure, timeout), as kUnavailable naming the address.
class Transport {
 public:
  virtual ~Transport() = default;
  // `method` is "GET", "POST", "PATCH" or "DELETE"; `path` starts with "/" and may carry a query
  // string; an empty `content_type` sends no Content-Type header; an empty `token` sends no
  // Authorization header.
  virtual Result<HttpResponse> Send(std::string_view method, std::string_view path,
                                    std::string_view body, std::string_view content_type,
                                    std::string_view token) = 0;
  // Whether the last Send failed before the request left (connection refused): nothing reached
  // the server, so another server may be tried at once.
  virtual bool unreachable() const { return false; }
};

// The cpp-httplib transport for "http://host:port" or "https://host:port", with `timeout` for
// connecting, for each write and for each read (so one call blocks at most about 3 x timeout).
// HTTPS verifies the server's certificate and host name against `ca_cert_file` (PEM) when given,
// else against the system's trusted certificates; `ca_cert_file` is ignored for http://.
// Returns kInvalidArgument for an address with another scheme or an unreadable `ca_cert_file`.
//
// Several servers (docs/ha.md): `address` may list several, comma-separated. The transport
// follows a follower's 307 to the leader (a few hops at most; the leader's address is added to
// the list) and goes on with the leader. A server that cannot be connected to is skipped for the
// next one at once (nothing was sent, so nothing is applied twice); after any other failure the
// call fails and the next call starts at the next server. Thread-compatible.
Result<std::unique_ptr<Transport>> NewHttpTransport(
    const std::string& address, const std::string& ca_cert_file = "",
    std::chrono::seconds timeout = std::chrono::seconds(10));

// One server of several and the transport that reaches it.
struct ServerTransport {
  std::string address;
  std::unique_ptr<Transport> transport;
};

// NewHttpTransport's way with several servers over any transports (the simulator's in-process
// links): `servers` in the order to try them; each address as the servers' redirects name it.
// REQUIRES: `servers` is not empty.
std::unique_ptr<Transport> NewLeaderFollowingTransport(std::vector<ServerTransport> servers);

// A JSON client of `gpufleet server`. Thread-compatible.
class ApiClient {
 public:
  // Talks to `address` over cpp-httplib (NewHttpTransport); a malformed address or unreadable
  // CA file makes every call fail with kInvalidArgument.
  ApiClient(std::string address, std::string token, const std::string& ca_cert_file = "",
            std::chrono::seconds timeout = std::chrono::seconds(10));
  // For tests: any transport.
  ApiClient(std::unique_ptr<Transport> transport, std::string address, std::string token);

  // A 2xx answer's JSON body (null for an empty body). A non-2xx answer becomes a Status with
  // the code named by the server's `error.code` and its `error.message` verbatim (or, without
  // that shape, the code of the HTTP status and the body); no answer at all is kUnavailable.
  Result<nlohmann::json> Get(std::string_view path);
  Result<nlohmann::json> Post(std::string_view path, std::string_view body,
                              std::string_view content_type);
  Result<nlohmann::json> Patch(std::string_view path, std::string_view body,
                               std::string_view content_type);
  Result<nlohmann::json> Delete(std::string_view path);

  // Whether the last failed call failed because the server answered with an error (as opposed
  // to no answer or an unreadable one).
  bool last_error_from_server() const { return last_error_from_server_; }
  const std::string& address() const { return address_; }
  // A POST with another bearer token than the client's (an agent's node credential, when one
  // client serves the agents of a simulated fleet).
  Result<nlohmann::json> PostWithToken(std::string_view token, std::string_view path,
                                       std::string_view body, std::string_view content_type);

 private:
  Result<nlohmann::json> Call(std::string_view method, std::string_view path, std::string_view body,
                              std::string_view content_type, std::string_view token);

  std::unique_ptr<Transport> transport_;
  Status transport_error_;
  std::string address_;
  std::string token_;
  bool last_error_from_server_ = false;
};

// "NOT_FOUND" -> kNotFound; kUnknown for a name that is none of the canonical codes.
StatusCode StatusCodeFromName(std::string_view name);

// The canonical code an HTTP status stands for, as `docs/api.md` maps them.
StatusCode StatusCodeFromHttp(int http_status);

// Percent-encodes one path segment or query value (RFC 3986 unreserved characters stay).
std::string UrlEncode(std::string_view text);

}  // namespace gpufleet::http
