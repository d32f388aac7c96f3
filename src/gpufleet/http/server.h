// SPDX-License-Identifier: Apache-2.0
#pragma once

// gpufleet's HTTP/1.1 server, on Boost.Beast and Asio: connections are read asynchronously, so a
// slow or idle client costs a socket and a buffer, never a thread. Handlers run on worker pools
// of their own (one for agents, one for everyone else), so a flood of user requests cannot delay
// a heartbeat. Framing is strict: conflicting or repeated Content-Length, Content-Length with
// Transfer-Encoding and any Transfer-Encoding but chunked are refused; pipelined requests are
// answered in order; one body limit holds whatever the Content-Type. A body too large for memory
// (an image layer) is streamed from a file (Response::file). Every server of gpufleet that
// listens (the API, the agent's /metrics, the agent's image mirror) is this one, so each has the
// same deadlines and connection caps.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/os/files.h"

namespace gpufleet::http {

// One request as a handler sees it: the path and query percent-decoded.
struct Request {
  std::string method;
  std::string path;  // without the query string
  std::multimap<std::string, std::string> query;
  std::string authorization;  // the Authorization header, empty when absent
  std::string body;
  // The request target as sent (path and query, still percent-encoded): for redirects.
  std::string target;
  // Every header as sent, names lower-case, in order.
  std::vector<std::pair<std::string, std::string>> headers;

  // The values of header `name` (in any case), joined by ", " as RFC 9110 allows for a repeated
  // header; empty when absent.
  std::string header(std::string_view name) const;
};

// An open file, closed when the last holder lets go: as Response::file, a body streamed from
// disk. Thread-safe: it is only read with pread.
class OpenFile {
 public:
  // Takes `fd`; `size` is the number of bytes a body of it has, from offset 0.
  OpenFile(int fd, int64_t size) : fd_(fd), size_(size) {}

  int fd() const { return fd_.get(); }
  int64_t size() const { return size_; }

 private:
  os::UniqueFd fd_;
  int64_t size_;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // The Location header of a redirect; empty: none.
  std::string location;
  // The Retry-After header (seconds) of a 503 or 429; 0: none.
  int retry_after_s = 0;
  // Further headers, in this order (the API's security headers).
  std::vector<std::pair<std::string, std::string>> headers;
  // When set, the body is the file's `size()` bytes instead of `body`, sent a chunk at a time,
  // each chunk under write_timeout: a client that reads slowly holds a socket, never a thread.
  // A file found shorter than its size while it is sent ends the connection mid-body.
  std::shared_ptr<const OpenFile> file;
};

// Which workers run a request's handler.
enum class Lane {
  kInline,  // cheap and lock-free (a health probe): run on the connection's IO thread
  kAgent,   // node agents' registration and heartbeats: a pool the user API cannot fill
  kUser,    // everything else
};

using Handler = std::function<Response(const Request&)>;
using LaneOf = std::function<Lane(std::string_view method, std::string_view path)>;
// Renders an answer the server gives itself (a malformed request, a timeout, too many
// connections), so that it looks like the application's own errors.
using ErrorRenderer = std::function<Response(int status, const std::string& message)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 picks a free port
  // PEM files; both empty serves plain HTTP.
  std::string tls_cert_file;
  std::string tls_key_file;

  size_t max_body_bytes = size_t{1} << 20;
  uint32_t max_header_bytes = 16 * 1024;
  // From the connection's start, or the end of the previous answer, to the request's last
  // header line: a client sending one header line every few seconds is cut off here.
  std::chrono::milliseconds header_timeout{10'000};
  // How long a kept-alive connection may wait for its next request.
  std::chrono::milliseconds idle_timeout{30'000};
  std::chrono::milliseconds body_timeout{30'000};
  // Writing an answer; for a file body (Response::file), each chunk of it.
  std::chrono::milliseconds write_timeout{30'000};
  // Connections held at once; one more is answered 503 and closed at once, never queued.
  int max_connections = 4096;
  int max_connections_per_client = 256;  // per remote address
  int max_requests_per_connection = 1000;

  int io_threads = 2;
  int agent_threads = 4;
  int user_threads = 8;
};

// Counters for /metrics.
struct ServerStats {
  int64_t connections_open = 0;
  int64_t connections_accepted = 0;
  int64_t connections_refused = 0;  // over a connection cap
  int64_t timeouts = 0;             // header, body, idle or write deadline passed
  int64_t malformed_requests = 0;   // answered 4xx/5xx by the server itself
};

// Splits a request target into its percent-decoded path and query ('+' is a space in the query
// only). A bad escape is an InvalidArgument naming its byte.
Result<Request> ParseTarget(std::string_view target);

class Server {
 public:
  // Listens and serves until Stop. The handlers must stay valid until Stop returns.
  static Result<std::unique_ptr<Server>> Start(ServerOptions options, Handler handler,
                                               LaneOf lane_of, ErrorRenderer render_error);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  ServerStats stats() const;
  // Stops accepting, abandons requests not yet handled and closes every connection; waits for
  // handlers already running.
  void Stop();

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl, int port);
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace gpufleet::http
