// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/http/client.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <fstream>
#include <utility>
#include <vector>

#include <fmt/core.h>

#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::http {
namespace {

std::string Describe(httplib::Error error) {
  switch (error) {
    case httplib::Error::Connection:
      return "connection refused or host unreachable";
    case httplib::Error::ConnectionTimeout:
      return "connection timed out";
    case httplib::Error::Read:
      return "connection lost while reading the answer";
    case httplib::Error::Write:
      return "connection lost while sending the request";
    case httplib::Error::SSLConnection:
      return "TLS handshake failed";
    case httplib::Error::SSLServerVerification:
      return "server certificate verification failed";
    default:
      return httplib::to_string(error);
  }
}

class HttpTransport final : public Transport {
 public:
  HttpTransport(std::string address, std::unique_ptr<httplib::Client> client)
      : address_(std::move(address)), client_(std::move(client)) {}

  bool unreachable() const override { return unreachable_; }

  Result<HttpResponse> Send(std::string_view method, std::string_view path, std::string_view body,
                            std::string_view content_type, std::string_view token) override {
    httplib::Headers headers;
    if (!token.empty()) {
      headers.emplace("Authorization", fmt::format("Bearer {}", token));
    }
    const std::string path_string(path);
    unreachable_ = false;
    httplib::Result result{nullptr, httplib::Error::Unknown};
    try {
      if (method == "GET") {
        result = client_->Get(path_string, headers);
      } else if (method == "POST") {
        result = client_->Post(path_string, headers, body.data(), body.size(),
                               std::string(content_type));
      } else if (method == "PATCH") {
        result = client_->Patch(path_string, headers, body.data(), body.size(),
                                std::string(content_type));
      } else if (method == "DELETE") {
        result = client_->Delete(path_string, headers);
      } else {
        return InvalidArgumentError(fmt::format("unsupported HTTP method {}", method));
      }
    } catch (const std::exception& e) {
      return UnavailableError(fmt::format("cannot reach {}: {}", address_, e.what()));
    }
    if (!result) {
      unreachable_ = result.error() == httplib::Error::Connection ||
                     result.error() == httplib::Error::ConnectionTimeout;
      return UnavailableError(
          fmt::format("cannot reach {}: {}", address_, Describe(result.error())));
    }
    HttpResponse response;
    response.status = result->status;
    response.body = result->body;
    response.content_type = result->get_header_value("Content-Type");
    response.location = result->get_header_value("Location");
    return response;
  }

 private:
  std::string address_;
  std::unique_ptr<httplib::Client> client_;
  bool unreachable_ = false;
};

// "http://host:port" or "https://host[:port]", optionally with a trailing "/".
Status ValidateAddress(std::string_view address) {
  std::string_view rest;
  if (address.starts_with("http://")) {
    rest = address.substr(7);
  } else if (address.starts_with("https://")) {
    rest = address.substr(8);
  } else {
    return InvalidArgumentError(
        fmt::format("server address \"{}\" must start with http:// or https://", address));
  }
  if (rest.ends_with('/')) {
    rest.remove_suffix(1);
  }
  if (rest.empty() || rest.find('/') != std::string_view::npos) {
    return InvalidArgumentError(
        fmt::format("server address \"{}\" must be scheme://host[:port]", address));
  }
  return Status::Ok();
}

// The transport of one server.
Result<std::unique_ptr<HttpTransport>> NewServerTransport(const std::string& address,
                                                          const std::string& ca_cert_file,
                                                          std::chrono::seconds timeout) {
  GPUFLEET_RETURN_IF_ERROR(ValidateAddress(address));
  const bool https = address.starts_with("https://");
  if (https && !ca_cert_file.empty() && !std::ifstream(ca_cert_file).good()) {
    return InvalidArgumentError(
        fmt::format("CA certificate \"{}\": cannot read it: {}", ca_cert_file,
                    std::strerror(errno)));  // NOLINT(concurrency-mt-unsafe)
  }
  std::string base = address;
  if (base.ends_with('/')) {
    base.pop_back();
  }
  std::unique_ptr<httplib::Client> client;
  try {
    client = std::make_unique<httplib::Client>(base);
  } catch (const std::exception& e) {
    return InvalidArgumentError(fmt::format("server address \"{}\": {}", address, e.what()));
  }
  if (!client->is_valid()) {
    return InvalidArgumentError(fmt::format("server address \"{}\" is not usable", address));
  }
  const auto seconds = static_cast<time_t>(timeout.count());
  client->set_connection_timeout(seconds, 0);
  client->set_read_timeout(seconds, 0);
  // Headers and body go out in separate writes: without this, Nagle's algorithm and the peer's
  // delayed ACK add about 40 ms to every POST.
  client->set_tcp_nodelay(true);
  client->set_write_timeout(seconds, 0);
  if (https && !ca_cert_file.empty()) {
    client->set_ca_cert_path(ca_cert_file);
  }
  return std::make_unique<HttpTransport>(address, std::move(client));
}

// "scheme://host:port" of a redirect's absolute URL; empty if it is not one.
std::string BaseOf(std::string_view url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) {
    return "";
  }
  return std::string(url.substr(0, url.find('/', scheme + 3)));
}

// NewHttpTransport's transport (one HttpTransport per server) and NewLeaderFollowingTransport's:
// the leader followed.
class LeaderFollowingTransport final : public Transport {
 public:
  explicit LeaderFollowingTransport(std::vector<ServerTransport> servers)
      : servers_(std::move(servers)) {}

  Result<HttpResponse> Send(std::string_view method, std::string_view path, std::string_view body,
                            std::string_view content_type, std::string_view token) override {
    // A follower redirects to the leader; the leader it names may itself have just lost the
    // lease, hence more than one hop, but never a loop.
    constexpr int kMaxRedirects = 3;
    int redirects = 0;
    size_t unreachable = 0;
    while (true) {
      Transport& server = *servers_[current_].transport;
      Result<HttpResponse> response = server.Send(method, path, body, content_type, token);
      if (!response.ok()) {
        const bool skip = server.unreachable() && ++unreachable < servers_.size();
        current_ = (current_ + 1) % servers_.size();
        if (skip) {
          continue;
        }
        return response;
      }
      if (response->status != 307 || redirects == kMaxRedirects) {
        return response;
      }
      const std::string base = BaseOf(response->location);
      if (base.empty()) {
        return response;
      }
      ++redirects;
      // The token goes to the configured servers only: a redirect elsewhere (a compromised or
      // misconfigured server, or a proxy in between) is not followed.
      const auto known =
          std::find_if(servers_.begin(), servers_.end(),
                       [&](const ServerTransport& s) { return SameServer(s.address, base); });
      if (known == servers_.end()) {
        return FailedPreconditionError(fmt::format(
            "{} redirected {} {} to {}, which is not one of the configured servers ({}); list "
            "every server of the cluster in --server (comma-separated) to follow its leader",
            server_address(current_), method, path, base, configured()));
      }
      current_ = static_cast<size_t>(known - servers_.begin());
    }
  }

 private:
  const std::string& server_address(size_t index) const { return servers_[index].address; }
  std::string configured() const {
    std::string out;
    for (const ServerTransport& server : servers_) {
      out += (out.empty() ? "" : ",") + server.address;
    }
    return out;
  }

  static bool SameServer(std::string_view a, std::string_view b) {
    const auto trim = [](std::string_view text) {
      return text.ends_with('/') ? text.substr(0, text.size() - 1) : text;
    };
    return trim(a) == trim(b);
  }

  std::vector<ServerTransport> servers_;
  size_t current_ = 0;  // the server the next call goes to first
};

}  // namespace

Result<std::unique_ptr<Transport>> NewHttpTransport(const std::string& address,
                                                    const std::string& ca_cert_file,
                                                    std::chrono::seconds timeout) {
  std::vector<ServerTransport> servers;
  size_t start = 0;
  while (true) {
    const size_t comma = address.find(',', start);
    const std::string one = address.substr(start, comma - start);
    if (one.empty()) {
      return InvalidArgumentError(fmt::format(
          "server address \"{}\": an empty address in the comma-separated list", address));
    }
    GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<HttpTransport> transport,
                              NewServerTransport(one, ca_cert_file, timeout));
    servers.push_back({one, std::move(transport)});
    if (comma == std::string::npos) {
      break;
    }
    start = comma + 1;
  }
  return NewLeaderFollowingTransport(std::move(servers));
}

std::unique_ptr<Transport> NewLeaderFollowingTransport(std::vector<ServerTransport> servers) {
  return std::make_unique<LeaderFollowingTransport>(std::move(servers));
}

ApiClient::ApiClient(std::string address, std::string token, const std::string& ca_cert_file,
                     std::chrono::seconds timeout)
    : address_(std::move(address)), token_(std::move(token)) {
  Result<std::unique_ptr<Transport>> transport = NewHttpTransport(address_, ca_cert_file, timeout);
  if (transport.ok()) {
    transport_ = std::move(transport).value();
  } else {
    transport_error_ = transport.status();
  }
}

ApiClient::ApiClient(std::unique_ptr<Transport> transport, std::string address, std::string token)
    : transport_(std::move(transport)), address_(std::move(address)), token_(std::move(token)) {}

Result<nlohmann::json> ApiClient::Get(std::string_view path) {
  return Call("GET", path, "", "", token_);
}

Result<nlohmann::json> ApiClient::Post(std::string_view path, std::string_view body,
                                       std::string_view content_type) {
  return Call("POST", path, body, content_type, token_);
}

Result<nlohmann::json> ApiClient::PostWithToken(std::string_view token, std::string_view path,
                                                std::string_view body,
                                                std::string_view content_type) {
  return Call("POST", path, body, content_type, token);
}

Result<nlohmann::json> ApiClient::Patch(std::string_view path, std::string_view body,
                                        std::string_view content_type) {
  return Call("PATCH", path, body, content_type, token_);
}

Result<nlohmann::json> ApiClient::Delete(std::string_view path) {
  return Call("DELETE", path, "", "", token_);
}

Result<nlohmann::json> ApiClient::Call(std::string_view method, std::string_view path,
                                       std::string_view body, std::string_view content_type,
                                       std::string_view token) {
  last_error_from_server_ = false;
  if (transport_ == nullptr) {
    return transport_error_;
  }
  GPUFLEET_ASSIGN_OR_RETURN(const HttpResponse response,
                            transport_->Send(method, path, body, content_type, token));
  const Result<nlohmann::json> parsed = wire::ParseJson(response.body);
  if (response.status >= 200 && response.status < 300) {
    if (response.body.empty()) {
      return nlohmann::json();
    }
    if (!parsed.ok()) {
      return InternalError(fmt::format("{} {} answered HTTP {} with a body that is not JSON: {}",
                                       method, path, response.status, parsed.status().message()));
    }
    return parsed;
  }
  last_error_from_server_ = true;
  const nlohmann::json json = parsed.ok() ? *parsed : nlohmann::json();
  if (json.is_object() && json.contains("error") && json["error"].is_object()) {
    const nlohmann::json& error = json["error"];
    const auto text_of = [&error](const char* key) {
      const auto it = error.find(key);
      return it != error.end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    const std::string code = text_of("code");
    const std::string message = text_of("message");
    StatusCode status_code = StatusCodeFromName(code);
    if (status_code == StatusCode::kOk || (status_code == StatusCode::kUnknown && code.empty())) {
      status_code = StatusCodeFromHttp(response.status);
    }
    return Status(status_code, message);
  }
  std::string text = response.body;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.pop_back();
  }
  return Status(StatusCodeFromHttp(response.status),
                text.empty() ? fmt::format("HTTP {}", response.status)
                             : fmt::format("HTTP {}: {}", response.status, text));
}

StatusCode StatusCodeFromName(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(StatusCode::kUnauthenticated); ++i) {
    const auto code = static_cast<StatusCode>(i);
    if (name == StatusCodeName(code)) {
      return code;
    }
  }
  return StatusCode::kUnknown;
}

StatusCode StatusCodeFromHttp(int http_status) {
  switch (http_status) {
    case 400:
      return StatusCode::kInvalidArgument;
    case 401:
      return StatusCode::kUnauthenticated;
    case 403:
      return StatusCode::kPermissionDenied;
    case 404:
      return StatusCode::kNotFound;
    case 409:
      return StatusCode::kAborted;
    case 413:
    case 429:
      return StatusCode::kResourceExhausted;
    case 501:
      return StatusCode::kUnimplemented;
    case 503:
      return StatusCode::kUnavailable;
    case 504:
      return StatusCode::kDeadlineExceeded;
    default:
      return http_status >= 500 ? StatusCode::kInternal : StatusCode::kUnknown;
  }
}

std::string UrlEncode(std::string_view text) {
  std::string encoded;
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte >= 'A' && byte <= 'Z') || (byte >= 'a' && byte <= 'z') ||
        (byte >= '0' && byte <= '9') || c == '-' || c == '.' || c == '_' || c == '~') {
      encoded += c;
    } else {
      encoded += fmt::format("%{:02X}", byte);
    }
  }
  return encoded;
}

}  // namespace gpufleet::http
