// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/http/server.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <fmt/format.h>

namespace gpufleet::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using ErrorCode = boost::system::error_code;

// After refusing a request the server drains what the client still sends for this long, so that
// closing the socket does not reset the connection before the client has read the answer.
constexpr std::chrono::milliseconds kLingerTime{1000};
constexpr size_t kMaxLingerBytes = size_t{4} << 20;
// A file body (Response::file) is read and sent this much at a time.
constexpr size_t kFileChunkBytes = size_t{256} << 10;

int HexValue(char c) {
  if (c >= '0' && c <= '9') {
    return c - '0';
  }
  if (c >= 'a' && c <= 'f') {
    return c - 'a' + 10;
  }
  if (c >= 'A' && c <= 'F') {
    return c - 'A' + 10;
  }
  return -1;
}

Result<std::string> PercentDecode(std::string_view text, bool plus_is_space, std::string_view what,
                                  size_t offset) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '%') {
      const int high = i + 1 < text.size() ? HexValue(text[i + 1]) : -1;
      const int low = i + 2 < text.size() ? HexValue(text[i + 2]) : -1;
      if (high < 0 || low < 0) {
        return InvalidArgumentError(fmt::format(
            "{}: bad percent-escape at byte {} of the request target", what, offset + i));
      }
      out.push_back(static_cast<char>(high * 16 + low));
      i += 2;
    } else if (c == '+' && plus_is_space) {
      out.push_back(' ');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::string_view View(beast::string_view text) {
  return {text.data(), text.size()};
}

// What every connection shares: the options, the handlers, the connection counts and counters.
struct Shared {
  ServerOptions options;
  Handler handler;
  LaneOf lane_of;
  ErrorRenderer render_error;
  asio::thread_pool* agent_pool = nullptr;
  asio::thread_pool* user_pool = nullptr;
  std::atomic<bool> stopping{false};

  std::mutex mu;
  int open = 0;                                   // guarded by mu
  std::unordered_map<std::string, int> per_peer;  // guarded by mu

  std::atomic<int64_t> accepted{0};
  std::atomic<int64_t> refused{0};
  std::atomic<int64_t> timeouts{0};
  std::atomic<int64_t> malformed{0};

  // Takes a connection slot for `peer`, or says which cap is full.
  std::optional<std::string> Admit(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu);
    if (open >= options.max_connections) {
      return fmt::format("the server holds its maximum of {} connections; retry later",
                         options.max_connections);
    }
    int& mine = per_peer[peer];
    if (mine >= options.max_connections_per_client) {
      if (mine == 0) {
        per_peer.erase(peer);
      }
      return fmt::format("{} holds its maximum of {} connections; retry later", peer,
                         options.max_connections_per_client);
    }
    ++mine;
    ++open;
    return std::nullopt;
  }

  void Release(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu);
    --open;
    auto it = per_peer.find(peer);
    if (it != per_peer.end() && --it->second <= 0) {
      per_peer.erase(it);
    }
  }
};

// One connection: TLS handshake (when served over TLS), then requests one at a time, each read
// under a deadline, handled on its lane's workers and answered in order.
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  // `admitted` says whether the connection took a slot (Release on close); a connection over a
  // cap is answered 503 with `refusal` and closed.
  Session(std::shared_ptr<Shared> shared, std::string peer, bool admitted, Stream stream)
      : shared_(std::move(shared)),
        peer_(std::move(peer)),
        admitted_(admitted),
        stream_(std::move(stream)) {}

  ~Session() {
    if (admitted_) {
      shared_->Release(peer_);
    }
  }

  void Run(std::optional<std::string> refusal) {
    if constexpr (kTls) {
      Lowest().expires_after(shared_->options.header_timeout);
      stream_.async_handshake(
          asio::ssl::stream_base::server,
          [self = this->shared_from_this(), refusal = std::move(refusal)](const ErrorCode& ec) {
            if (ec) {
              self->CountTimeout(ec);
              return self->Close();
            }
            self->Begin(refusal);
          });
    } else {
      Begin(refusal);
    }
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void Begin(const std::optional<std::string>& refusal) {
    if (refusal.has_value()) {
      return Refuse(503, *refusal);
    }
    ReadHeader();
  }

  void ReadHeader() {
    request_ = Request();
    parser_.emplace();
    parser_->header_limit(shared_->options.max_header_bytes);
    parser_->body_limit(shared_->options.max_body_bytes);
    Lowest().expires_after(served_ == 0 ? shared_->options.header_timeout
                                        : shared_->options.idle_timeout);
    bhttp::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](const ErrorCode& ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(const ErrorCode& ec) {
    if (ec) {
      return OnReadError(ec);
    }
    const auto& header = parser_->get();
    if (header.count(bhttp::field::content_length) > 1) {
      return Refuse(400, "malformed HTTP request: more than one Content-Length header");
    }
    if (header.count(bhttp::field::transfer_encoding) > 1) {
      return Refuse(400, "malformed HTTP request: more than one Transfer-Encoding header");
    }
    if (const auto te = header.find(bhttp::field::transfer_encoding);
        te != header.end() && !beast::iequals(te->value(), "chunked")) {
      return Refuse(501, fmt::format("Transfer-Encoding \"{}\" is not supported (only chunked)",
                                     View(te->value())));
    }
    if (const auto length = parser_->content_length();
        length.has_value() && *length > shared_->options.max_body_bytes) {
      return Refuse(413,
                    fmt::format("request body over {} bytes", shared_->options.max_body_bytes));
    }
    Result<Request> target = ParseTarget(View(header.target()));
    if (!target.ok()) {
      return Refuse(400, target.status().message());
    }
    request_ = std::move(target).value();
    request_.method = std::string(View(header.method_string()));
    request_.target = std::string(View(header.target()));
    lane_ = shared_->lane_of(request_.method, request_.path);
    const auto expect = header.find(bhttp::field::expect);
    if (expect != header.end() && beast::iequals(expect->value(), "100-continue") &&
        !parser_->is_done()) {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      Lowest().expires_after(shared_->options.write_timeout);
      asio::async_write(stream_, asio::buffer(kContinue),
                        [self = this->shared_from_this()](const ErrorCode& write_error, size_t) {
                          if (write_error) {
                            self->CountTimeout(write_error);
                            return self->Close();
                          }
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    if (parser_->is_done()) {
      return OnBody({});
    }
    Lowest().expires_after(shared_->options.body_timeout);
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](const ErrorCode& ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(const ErrorCode& ec) {
    if (ec) {
      return OnReadError(ec);
    }
    keep_alive_ = parser_->keep_alive();
    auto message = parser_->release();
    if (const auto auth = message.find(bhttp::field::authorization); auth != message.end()) {
      request_.authorization = std::string(View(auth->value()));
    }
    for (const auto& field : message) {
      std::string name(View(field.name_string()));
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      request_.headers.emplace_back(std::move(name), std::string(View(field.value())));
    }
    request_.body = std::move(message.body());
    parser_.reset();
    Lowest().expires_never();
    if (lane_ == Lane::kInline) {
      return Respond(Call(request_));
    }
    asio::thread_pool* pool = lane_ == Lane::kAgent ? shared_->agent_pool : shared_->user_pool;
    asio::post(*pool, [self = this->shared_from_this()] {
      Response response = self->Call(self->request_);
      asio::post(self->stream_.get_executor(), [self, response = std::move(response)]() mutable {
        self->Respond(std::move(response));
      });
    });
  }

  // A handler that throws (out of memory, say) fails its own request, not the worker thread.
  Response Call(const Request& request) {
    try {
      return shared_->handler(request);
    } catch (const std::exception& e) {
      return shared_->render_error(500, fmt::format("internal error: {}", e.what()));
    }
  }

  void Respond(Response response, bool force_close = false) {
    ++served_;
    const bool keep = !force_close && keep_alive_ && !shared_->stopping.load() &&
                      served_ < shared_->options.max_requests_per_connection;
    // A HEAD answer has the headers of the GET answer and no body.
    const bool head = request_.method == "HEAD";
    bhttp::response_header<> header;
    header.version(11);
    header.result(static_cast<unsigned>(response.status));
    header.set(bhttp::field::content_type, response.content_type);
    if (!response.location.empty()) {
      header.set(bhttp::field::location, response.location);
    }
    if (response.retry_after_s > 0) {
      header.set(bhttp::field::retry_after, std::to_string(response.retry_after_s));
    }
    for (const auto& [name, value] : response.headers) {
      header.set(name, value);
    }
    Lowest().expires_after(shared_->options.write_timeout);
    if (response.file != nullptr && !head) {
      return RespondWithFile(std::move(header), std::move(response.file), keep);
    }
    response_.emplace(std::move(header));
    response_->keep_alive(keep);
    if (head) {
      response_->content_length(response.file != nullptr
                                    ? static_cast<uint64_t>(response.file->size())
                                    : response.body.size());
    } else {
      response_->body() = std::move(response.body);
      response_->prepare_payload();
    }
    bhttp::async_write(stream_, *response_,
                       [self = this->shared_from_this(), keep](const ErrorCode& ec, size_t) {
                         self->response_.reset();
                         self->OnWritten(ec, keep);
                       });
  }

  // Sends the header, then the file a chunk at a time, each under its own write deadline.
  void RespondWithFile(bhttp::response_header<> header, std::shared_ptr<const OpenFile> file,
                       bool keep) {
    file_ = std::move(file);
    file_offset_ = 0;
    file_buffer_.resize(kFileChunkBytes);
    file_response_.emplace(std::move(header));
    file_response_->keep_alive(keep);
    file_response_->content_length(static_cast<uint64_t>(file_->size()));
    file_response_->body().data = nullptr;
    file_response_->body().more = true;
    file_serializer_.emplace(*file_response_);
    bhttp::async_write_header(stream_, *file_serializer_,
                              [self = this->shared_from_this(), keep](const ErrorCode& ec, size_t) {
                                if (ec) {
                                  return self->OnFileWritten(ec, keep);
                                }
                                self->WriteFileChunk(keep);
                              });
  }

  void WriteFileChunk(bool keep) {
    const int64_t left = file_->size() - file_offset_;
    auto& body = file_response_->body();
    if (left <= 0) {
      body.data = nullptr;
      body.size = 0;
      body.more = false;
    } else {
      const ssize_t n = pread(file_->fd(), file_buffer_.data(),
                              std::min(file_buffer_.size(), static_cast<size_t>(left)),
                              static_cast<off_t>(file_offset_));
      if (n <= 0) {
        // The file is shorter than the Content-Length already sent: only closing can say so.
        return OnFileWritten(asio::error::make_error_code(asio::error::eof), keep);
      }
      file_offset_ += n;
      body.data = file_buffer_.data();
      body.size = static_cast<size_t>(n);
      body.more = true;
    }
    Lowest().expires_after(shared_->options.write_timeout);
    bhttp::async_write(stream_, *file_serializer_,
                       [self = this->shared_from_this(), keep](ErrorCode ec, size_t) {
                         if (ec == bhttp::error::need_buffer) {
                           ec = {};  // the chunk is written; the serializer wants the next
                         }
                         if (ec || self->file_serializer_->is_done()) {
                           return self->OnFileWritten(ec, keep);
                         }
                         self->WriteFileChunk(keep);
                       });
  }

  void OnFileWritten(const ErrorCode& ec, bool keep) {
    file_serializer_.reset();
    file_response_.reset();
    file_.reset();
    file_buffer_ = {};
    OnWritten(ec, keep);
  }

  void OnWritten(const ErrorCode& ec, bool keep) {
    if (ec) {
      CountTimeout(ec);
      return Close();
    }
    if (!keep) {
      return Shutdown();
    }
    ReadHeader();
  }

  // Answers a request the server refuses itself, then closes the connection.
  void Refuse(int status, const std::string& message) {
    shared_->malformed.fetch_add(1);
    keep_alive_ = false;
    Respond(shared_->render_error(status, message), /*force_close=*/true);
  }

  void OnReadError(const ErrorCode& ec) {
    if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset || ec == asio::error::operation_aborted) {
      return Close();
    }
    if (ec == beast::error::timeout) {
      shared_->timeouts.fetch_add(1);
      return Close();  // the stream has closed the socket already
    }
    if (ec == bhttp::error::body_limit) {
      return Refuse(413,
                    fmt::format("request body over {} bytes", shared_->options.max_body_bytes));
    }
    if (ec == bhttp::error::header_limit) {
      return Refuse(
          431, fmt::format("request headers over {} bytes", shared_->options.max_header_bytes));
    }
    if (ec.category() == bhttp::make_error_code(bhttp::error::bad_method).category()) {
      return Refuse(400, fmt::format("malformed HTTP request: {}", ec.message()));
    }
    Close();
  }

  void CountTimeout(const ErrorCode& ec) {
    if (ec == beast::error::timeout) {
      shared_->timeouts.fetch_add(1);
    }
  }

  void Shutdown() {
    if constexpr (kTls) {
      Lowest().expires_after(kLingerTime);
      stream_.async_shutdown(
          [self = this->shared_from_this()](const ErrorCode&) { self->Close(); });
    } else {
      ErrorCode ignored;
      Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
      Lowest().expires_after(kLingerTime);
      Drain();
    }
  }

  void Drain() {
    Lowest().async_read_some(asio::buffer(drain_buffer_),
                             [self = this->shared_from_this()](const ErrorCode& ec, size_t bytes) {
                               self->drained_ += bytes;
                               if (ec || self->drained_ > kMaxLingerBytes) {
                                 return self->Close();
                               }
                               self->Drain();
                             });
  }

  void Close() {
    ErrorCode ignored;
    Lowest().socket().close(ignored);
  }

  std::shared_ptr<Shared> shared_;
  std::string peer_;
  bool admitted_ = false;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<bhttp::response<bhttp::string_body>> response_;
  // A file body being sent (Respond with Response::file).
  std::shared_ptr<const OpenFile> file_;
  int64_t file_offset_ = 0;
  std::vector<char> file_buffer_;
  std::optional<bhttp::response<bhttp::buffer_body>> file_response_;
  std::optional<bhttp::response_serializer<bhttp::buffer_body>> file_serializer_;
  Request request_;
  Lane lane_ = Lane::kUser;
  bool keep_alive_ = true;
  int served_ = 0;
  std::array<char, 16 * 1024> drain_buffer_{};
  size_t drained_ = 0;
};

class Listener : public std::enable_shared_from_this<Listener> {
 public:
  Listener(asio::io_context& io, std::shared_ptr<Shared> shared, tcp::acceptor acceptor,
           asio::ssl::context* tls)
      : io_(io),
        shared_(std::move(shared)),
        acceptor_(std::move(acceptor)),
        retry_timer_(acceptor_.get_executor()),
        tls_(tls) {}

  void Accept() {
    acceptor_.async_accept(asio::make_strand(io_),
                           [self = shared_from_this()](const ErrorCode& ec, tcp::socket socket) {
                             self->OnAccept(ec, std::move(socket));
                           });
  }

  void Close() {
    ErrorCode ignored;
    acceptor_.close(ignored);
    retry_timer_.cancel();
  }

  asio::any_io_executor executor() { return acceptor_.get_executor(); }

 private:
  void OnAccept(const ErrorCode& ec, tcp::socket socket) {
    if (!acceptor_.is_open() || ec == asio::error::operation_aborted) {
      return;
    }
    if (ec) {
      // Out of file descriptors, most likely: wait rather than spin.
      retry_timer_.expires_after(std::chrono::milliseconds(50));
      retry_timer_.async_wait([self = shared_from_this()](const ErrorCode& wait_error) {
        if (!wait_error) {
          self->Accept();
        }
      });
      return;
    }
    ErrorCode endpoint_error;
    const tcp::endpoint remote = socket.remote_endpoint(endpoint_error);
    const std::string peer = endpoint_error ? "unknown" : remote.address().to_string();
    std::optional<std::string> refusal = shared_->Admit(peer);
    if (refusal.has_value()) {
      shared_->refused.fetch_add(1);
    } else {
      shared_->accepted.fetch_add(1);
    }
    ErrorCode ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    if (tls_ != nullptr) {
      using TlsStream = beast::ssl_stream<beast::tcp_stream>;
      std::make_shared<Session<TlsStream>>(shared_, peer, !refusal.has_value(),
                                           TlsStream(beast::tcp_stream(std::move(socket)), *tls_))
          ->Run(std::move(refusal));
    } else {
      std::make_shared<Session<beast::tcp_stream>>(shared_, peer, !refusal.has_value(),
                                                   beast::tcp_stream(std::move(socket)))
          ->Run(std::move(refusal));
    }
    Accept();
  }

  asio::io_context& io_;
  std::shared_ptr<Shared> shared_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;
  asio::ssl::context* tls_;
};

Result<tcp::endpoint> ResolveListenAddress(asio::io_context& io, const std::string& host,
                                           int port) {
  ErrorCode ec;
  const asio::ip::address address = asio::ip::make_address(host, ec);
  if (!ec) {
    return tcp::endpoint(address, static_cast<uint16_t>(port));
  }
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) {
    return InvalidArgumentError(
        fmt::format("listen address \"{}\": {}", host, ec ? ec.message() : "no address"));
  }
  return results.begin()->endpoint();
}

}  // namespace

std::string Request::header(std::string_view name) const {
  std::string values;
  for (const auto& [key, value] : headers) {
    if (beast::iequals(beast::string_view(key.data(), key.size()),
                       beast::string_view(name.data(), name.size()))) {
      values += (values.empty() ? "" : ", ") + value;
    }
  }
  return values;
}

Result<Request> ParseTarget(std::string_view target) {
  Request request;
  const size_t question = target.find('?');
  GPUFLEET_ASSIGN_OR_RETURN(request.path,
                            PercentDecode(target.substr(0, question), false, "path", 0));
  if (question == std::string_view::npos) {
    return request;
  }
  size_t offset = question + 1;
  std::string_view rest = target.substr(offset);
  while (!rest.empty()) {
    const size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    if (!pair.empty()) {
      const size_t eq = pair.find('=');
      GPUFLEET_ASSIGN_OR_RETURN(std::string key,
                                PercentDecode(pair.substr(0, eq), true, "query", offset));
      std::string value;
      if (eq != std::string_view::npos) {
        GPUFLEET_ASSIGN_OR_RETURN(
            value, PercentDecode(pair.substr(eq + 1), true, "query", offset + eq + 1));
      }
      request.query.emplace(std::move(key), std::move(value));
    }
    if (amp == std::string_view::npos) {
      break;
    }
    offset += amp + 1;
    rest = rest.substr(amp + 1);
  }
  return request;
}

// Stop joins the threads, then drops the pools with any queued work, then the IO context with
// every connection; the TLS context outlives them all.
struct Server::Impl {
  std::optional<asio::ssl::context> tls;
  std::optional<asio::io_context> io;
  std::unique_ptr<asio::thread_pool> agent_pool;
  std::unique_ptr<asio::thread_pool> user_pool;
  std::shared_ptr<Shared> shared;
  std::shared_ptr<Listener> listener;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::vector<std::thread> io_threads;
  bool stopped = false;

  explicit Impl(int thread_count) { io.emplace(thread_count); }
};

Server::Server(std::unique_ptr<Impl> impl, int port) : impl_(std::move(impl)), port_(port) {}

Server::~Server() {
  Stop();
}

Result<std::unique_ptr<Server>> Server::Start(ServerOptions options, Handler handler,
                                              LaneOf lane_of, ErrorRenderer render_error) {
  const int io_threads = std::max(1, options.io_threads);
  auto impl = std::make_unique<Impl>(io_threads);
  if (!options.tls_cert_file.empty() || !options.tls_key_file.empty()) {
    impl->tls.emplace(asio::ssl::context::tls_server);
    impl->tls->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                           asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 |
                           asio::ssl::context::no_tlsv1_1);
    ErrorCode ec;
    impl->tls->use_certificate_chain_file(options.tls_cert_file, ec);
    if (ec) {
      return InvalidArgumentError(fmt::format("TLS certificate \"{}\" not usable: {}",
                                              options.tls_cert_file, ec.message()));
    }
    impl->tls->use_private_key_file(options.tls_key_file, asio::ssl::context::pem, ec);
    if (ec) {
      return InvalidArgumentError(fmt::format("TLS key \"{}\" not usable with \"{}\": {}",
                                              options.tls_key_file, options.tls_cert_file,
                                              ec.message()));
    }
  }
  GPUFLEET_ASSIGN_OR_RETURN(const tcp::endpoint endpoint,
                            ResolveListenAddress(*impl->io, options.host, options.port));
  tcp::acceptor acceptor(asio::make_strand(*impl->io));
  ErrorCode ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) {
    acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  }
  if (!ec) {
    acceptor.bind(endpoint, ec);
  }
  if (!ec) {
    acceptor.listen(asio::socket_base::max_listen_connections, ec);
  }
  if (ec) {
    return UnavailableError(
        fmt::format("cannot listen on {}:{}: {}", options.host, options.port, ec.message()));
  }
  const int port = acceptor.local_endpoint().port();

  impl->agent_pool = std::make_unique<asio::thread_pool>(std::max(1, options.agent_threads));
  impl->user_pool = std::make_unique<asio::thread_pool>(std::max(1, options.user_threads));
  impl->shared = std::make_shared<Shared>();
  impl->shared->options = std::move(options);
  impl->shared->handler = std::move(handler);
  impl->shared->lane_of = std::move(lane_of);
  impl->shared->render_error = std::move(render_error);
  impl->shared->agent_pool = impl->agent_pool.get();
  impl->shared->user_pool = impl->user_pool.get();
  impl->listener = std::make_shared<Listener>(*impl->io, impl->shared, std::move(acceptor),
                                              impl->tls ? &*impl->tls : nullptr);
  impl->listener->Accept();
  impl->work.emplace(impl->io->get_executor());
  for (int i = 0; i < io_threads; ++i) {
    impl->io_threads.emplace_back([io = &*impl->io] {
      for (;;) {
        try {
          io->run();
          return;
        } catch (const std::exception& e) {
          std::fprintf(stderr, "gpufleet http: connection handler failed: %s\n", e.what());
        }
      }
    });
  }
  return std::unique_ptr<Server>(new Server(std::move(impl), port));
}

ServerStats Server::stats() const {
  ServerStats stats;
  const Shared& shared = *impl_->shared;
  {
    std::lock_guard<std::mutex> lock(impl_->shared->mu);
    stats.connections_open = shared.open;
  }
  stats.connections_accepted = shared.accepted.load();
  stats.connections_refused = shared.refused.load();
  stats.timeouts = shared.timeouts.load();
  stats.malformed_requests = shared.malformed.load();
  return stats;
}

void Server::Stop() {
  if (impl_ == nullptr || impl_->stopped) {
    return;
  }
  impl_->stopped = true;
  impl_->shared->stopping = true;
  asio::post(impl_->listener->executor(), [listener = impl_->listener] { listener->Close(); });
  // Handlers already running finish; queued ones are dropped with their connections.
  impl_->agent_pool->stop();
  impl_->user_pool->stop();
  impl_->agent_pool->join();
  impl_->user_pool->join();
  impl_->work.reset();
  impl_->io->stop();
  for (std::thread& thread : impl_->io_threads) {
    thread.join();
  }
  impl_->io_threads.clear();
  // Dropping the queued work and the IO context closes every connection now, not at destruction.
  impl_->agent_pool.reset();
  impl_->user_pool.reset();
  impl_->listener.reset();
  impl_->io.reset();
}

}  // namespace gpufleet::http
