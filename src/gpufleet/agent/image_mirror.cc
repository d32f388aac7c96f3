// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/image_mirror.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>
#include <openssl/evp.h>

#include "gpufleet/core/image_reference.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/http/server.h"
#include "gpufleet/os/files.h"

namespace gpufleet::agent {
namespace {

constexpr size_t kMaxManifestBytes = size_t{4} << 20;  // the distribution registry's own bound
constexpr size_t kMaxPathBytes = 1024;

// A running sha256.
class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new()) {
    // Fails only when OpenSSL cannot allocate: continuing would serve unchecked bytes.
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
      std::abort();
    }
  }
  ~Sha256() { EVP_MD_CTX_free(ctx_); }
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const char* data, size_t length) { EVP_DigestUpdate(ctx_, data, length); }
  // Lower-case hex.
  std::string Hex() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_DigestFinal_ex(ctx_, digest, &length);
    std::string hex;
    for (unsigned int i = 0; i < length; ++i) {
      hex += fmt::format("{:02x}", digest[i]);
    }
    return hex;
  }

 private:
  EVP_MD_CTX* ctx_;
};

// FNV-1a, 64 bits: the same on every node, for rendezvous hashing.
uint64_t Fnv1a(std::string_view text) {
  uint64_t hash = 14695981039346656037ULL;
  for (const char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 1099511628211ULL;
  }
  return hash;
}

// An answer in the distribution API's error format.
http::Response Error(int status, std::string_view code, std::string_view message) {
  std::string escaped;
  for (const char c : message) {
    if (c == '"' || c == '\\') {
      escaped += '\\';
    }
    escaped += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return http::Response{
      .status = status,
      .content_type = "application/json",
      .body = fmt::format(R"({{"errors":[{{"code":"{}","message":"{}"}}]}})", code, escaped)};
}

// The server's own refusals (a connection over the cap, a header past its deadline, a malformed
// request), in the same format: podman names the mirror's reason when it falls back.
http::Response ServerError(int status, const std::string& message) {
  return Error(status, status == 503 ? "UNAVAILABLE" : "UNSUPPORTED", message);
}

}  // namespace

struct ImageMirror::Impl {
  struct Entry {
    int64_t size = 0;
    uint64_t last_use = 0;
  };
  // One fetch of one digest under way; the requests that arrive meanwhile wait for it.
  struct Flight {
    bool done = false;
    Status status;
  };
  struct Registry {
    std::string address;   // HOST[:PORT]
    std::string base_url;  // http://HOST:PORT or https://HOST[:PORT]
  };

  ImageMirrorOptions options;
  // Set once the server listens (self may name its port), before Start returns; guarded by mu
  // until then, since a request may come first.
  std::string self;
  std::vector<std::string> candidates;         // peers and self, sorted, without duplicates
  std::map<std::string, Registry> registries;  // by RegistryKey
  std::string blob_dir;
  std::string tmp_dir;
  std::unique_ptr<http::Server> server;
  int port = 0;

  mutable std::mutex mu;
  std::condition_variable flight_done;
  std::map<std::string, Entry> entries;                    // by hex digest; guarded by mu
  std::map<std::string, std::shared_ptr<Flight>> flights;  // guarded by mu
  uint64_t use_clock = 0;                                  // guarded by mu
  uint64_t tmp_sequence = 0;                               // guarded by mu
  ImageMirrorStats stats;                                  // guarded by mu

  std::string BlobPath(const std::string& hex) const { return blob_dir + "/" + hex; }

  // Opens the cached blob and marks it used; nullptr when it is not cached. REQUIRES: mu held.
  std::shared_ptr<const http::OpenFile> OpenCached(const std::string& hex) {
    const auto it = entries.find(hex);
    if (it == entries.end()) {
      return nullptr;
    }
    const int fd = open(BlobPath(hex).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      stats.cached_bytes -= it->second.size;
      entries.erase(it);
      return nullptr;
    }
    it->second.last_use = ++use_clock;
    return std::make_shared<http::OpenFile>(fd, it->second.size);
  }

  // Removes the least recently used blobs until the cache fits. REQUIRES: mu held.
  void Evict() {
    while (stats.cached_bytes > options.cache_bytes && !entries.empty()) {
      auto oldest = entries.begin();
      for (auto it = entries.begin(); it != entries.end(); ++it) {
        if (it->second.last_use < oldest->second.last_use) {
          oldest = it;
        }
      }
      // A reader that has the file open goes on reading it.
      unlink(BlobPath(oldest->first).c_str());
      stats.cached_bytes -= oldest->second.size;
      ++stats.evictions;
      entries.erase(oldest);
    }
  }

  // Fetches `path` from `base_url` into the cache as blob `hex`, checking its digest.
  Status FetchInto(const std::string& base_url, const std::string& path, bool to_peer,
                   const std::string& hex, int64_t* bytes_counter) {
    std::string tmp;
    {
      std::lock_guard<std::mutex> lock(mu);
      tmp = fmt::format("{}/{}.{}", tmp_dir, hex, ++tmp_sequence);
    }
    const os::UniqueFd file(open(tmp.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600));
    if (!file.valid()) {
      return Status(StatusCode::kUnavailable,
                    fmt::format("cannot create {}: {}", tmp, std::strerror(errno)));
    }
    const int fd = file.get();
    httplib::Client client(base_url);
    client.set_connection_timeout(to_peer ? options.peer_connect_timeout
                                          : std::chrono::milliseconds(10'000));
    client.set_read_timeout(options.read_timeout);
    client.set_follow_location(true);
    httplib::Headers headers;
    if (to_peer) {
      headers.emplace(kPeerHeader, "1");
    }
    Sha256 sha;
    int64_t received = 0;
    int status = 0;
    std::string failure;
    const httplib::Result result = client.Get(
        path, headers,
        [&](const httplib::Response& response) {
          status = response.status;
          if (status != 200) {
            return false;
          }
          if (response.has_header("Content-Length")) {
            const std::string length = response.get_header_value("Content-Length");
            if (std::strtoll(length.c_str(), nullptr, 10) > options.cache_bytes) {
              failure = fmt::format("blob of {} bytes is over the cache's {}", length,
                                    options.cache_bytes);
              return false;
            }
          }
          return true;
        },
        [&](const char* data, size_t length) {
          received += static_cast<int64_t>(length);
          if (received > options.cache_bytes) {
            failure = "blob is over the cache's size";
            return false;
          }
          sha.Update(data, length);
          size_t done = 0;
          while (done < length) {
            const ssize_t n = write(fd, data + done, length - done);
            if (n < 0) {
              if (errno == EINTR) {
                continue;
              }
              failure = fmt::format("cannot write {}: {}", tmp, std::strerror(errno));
              return false;
            }
            done += static_cast<size_t>(n);
          }
          return true;
        });
    const auto fail = [&](StatusCode code, std::string message) {
      unlink(tmp.c_str());
      return Status(code, std::move(message));
    };
    if (!failure.empty()) {
      return fail(StatusCode::kResourceExhausted, failure);
    }
    if (status != 0 && status != 200) {
      return fail(status == 404 ? StatusCode::kNotFound : StatusCode::kUnavailable,
                  fmt::format("{}{} answered {}", base_url, path, status));
    }
    if (!result) {
      return fail(StatusCode::kUnavailable,
                  fmt::format("{}{}: {}", base_url, path, httplib::to_string(result.error())));
    }
    if (sha.Hex() != hex) {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.digest_mismatches;
      unlink(tmp.c_str());
      return Status(
          StatusCode::kDataLoss,
          fmt::format("{}{}: the bytes do not match digest sha256:{}", base_url, path, hex));
    }
    if (rename(tmp.c_str(), BlobPath(hex).c_str()) != 0) {
      return fail(StatusCode::kUnavailable,
                  fmt::format("cannot keep {}: {}", BlobPath(hex), std::strerror(errno)));
    }
    std::lock_guard<std::mutex> lock(mu);
    *bytes_counter += received;
    Entry& entry = entries[hex];
    stats.cached_bytes += received - entry.size;
    entry.size = received;
    entry.last_use = ++use_clock;
    Evict();
    return Status();
  }

  // Fetches blob `hex` of `name` into the cache: from the chosen peer when `use_peers` and that
  // is not this mirror, else (or when the peer fails) from the registry.
  Status Fetch(const Registry& registry, const std::string& key, const std::string& name,
               const std::string& hex, bool use_peers) {
    const std::string digest = "sha256:" + hex;
    if (use_peers) {
      std::string chooser;
      bool chose_self = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        chooser = ChooseFetcher(candidates, hex);
        chose_self = chooser == self;
      }
      if (!chose_self) {
        const Status from_peer =
            FetchInto("http://" + chooser, fmt::format("/v2/{}/{}/blobs/{}", key, name, digest),
                      /*to_peer=*/true, hex, &stats.peer_bytes);
        if (from_peer.ok()) {
          return from_peer;
        }
        std::lock_guard<std::mutex> lock(mu);
        ++stats.peer_failures;
      }
    }
    return FetchInto(registry.base_url, fmt::format("/v2/{}/blobs/{}", name, digest),
                     /*to_peer=*/false, hex, &stats.registry_bytes);
  }

  // The blob, cached first if it is not: an open file of its size.
  Result<std::shared_ptr<const http::OpenFile>> Blob(const Registry& registry,
                                                     const std::string& key,
                                                     const std::string& name,
                                                     const std::string& hex, bool use_peers) {
    std::shared_ptr<Flight> flight;
    bool leader = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      if (std::shared_ptr<const http::OpenFile> file = OpenCached(hex)) {
        ++stats.cache_hits;
        return file;
      }
      auto [it, inserted] = flights.emplace(hex, nullptr);
      if (inserted) {
        it->second = std::make_shared<Flight>();
        leader = true;
      }
      flight = it->second;
    }
    if (leader) {
      const Status fetched = Fetch(registry, key, name, hex, use_peers);
      std::lock_guard<std::mutex> lock(mu);
      flight->status = fetched;
      flight->done = true;
      flights.erase(hex);
      flight_done.notify_all();
    }
    std::unique_lock<std::mutex> lock(mu);
    flight_done.wait(lock, [&] { return flight->done; });
    if (!flight->status.ok()) {
      return flight->status;
    }
    if (std::shared_ptr<const http::OpenFile> file = OpenCached(hex)) {
      return file;
    }
    return Status(StatusCode::kUnavailable, "the blob was evicted as soon as it was fetched");
  }

  http::Response HandleBlob(const http::Request& req, const Registry& registry,
                            const std::string& key, const std::string& name,
                            const std::string& digest) {
    if (digest.rfind("sha256:", 0) != 0 || !ValidateImageDigest(digest).ok()) {
      return Error(400, "DIGEST_INVALID", "only sha256 digests are served");
    }
    const std::string hex = digest.substr(7);
    const bool from_peer = !req.header(kPeerHeader).empty();
    auto blob = Blob(registry, key, name, hex, /*use_peers=*/!from_peer);
    if (!blob.ok()) {
      if (!from_peer) {
        // podman takes every blob from the place that gave it the manifest: sent to the
        // registry, it gets the blob (or the registry's own error) there, and checks its digest.
        return http::Response{
            .status = 307,
            .location = fmt::format("{}/v2/{}/blobs/{}", registry.base_url, name, digest)};
      }
      const int status = blob.status().code() == StatusCode::kNotFound ? 404 : 502;
      return Error(status, "BLOB_UNKNOWN", blob.status().message());
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.blob_requests;
    }
    return http::Response{.content_type = "application/octet-stream",
                          .headers = {{"Docker-Content-Digest", digest}},
                          .file = std::move(blob).value()};
  }

  http::Response HandleManifest(const http::Request& req, const Registry& registry,
                                const std::string& name, const std::string& reference) {
    if (!req.header(kPeerHeader).empty()) {
      return Error(404, "MANIFEST_UNKNOWN", "peers fetch manifests from the registry");
    }
    const bool by_digest = reference.find(':') != std::string::npos;
    if (by_digest
            ? (reference.rfind("sha256:", 0) != 0 || !ValidateImageDigest(reference).ok())
            : !ValidateImageReference(fmt::format("{}/{}:{}", registry.address, name, reference))
                   .ok()) {
      return Error(400, "MANIFEST_INVALID", "not a tag or a sha256 digest");
    }
    httplib::Headers headers;
    const std::string accept = req.header("Accept");
    if (!accept.empty()) {
      headers.emplace("Accept", accept);
    }
    httplib::Client client(registry.base_url);
    client.set_connection_timeout(std::chrono::seconds(10));
    client.set_read_timeout(options.read_timeout);
    client.set_follow_location(true);
    std::string body;
    bool too_big = false;
    int status = 0;
    std::string content_type;
    const httplib::Result result = client.Get(
        fmt::format("/v2/{}/manifests/{}", name, reference), headers,
        [&](const httplib::Response& response) {
          status = response.status;
          content_type = response.get_header_value("Content-Type");
          return true;
        },
        [&](const char* data, size_t length) {
          if (body.size() + length > kMaxManifestBytes) {
            too_big = true;
            return false;
          }
          body.append(data, length);
          return true;
        });
    if (too_big) {
      return Error(502, "MANIFEST_INVALID", "manifest over 4 MiB");
    }
    if (!result) {
      return Error(502, "UNAVAILABLE",
                   fmt::format("{}: {}", registry.base_url, httplib::to_string(result.error())));
    }
    if (status != 200) {
      return http::Response{
          .status = status,
          .content_type = content_type.empty() ? "application/json" : content_type,
          .body = std::move(body)};
    }
    Sha256 sha;
    sha.Update(body.data(), body.size());
    const std::string digest = "sha256:" + sha.Hex();
    if (by_digest && digest != reference) {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.digest_mismatches;
      return Error(502, "MANIFEST_INVALID", "the registry's manifest has another digest");
    }
    return http::Response{.content_type = content_type,
                          .body = std::move(body),
                          .headers = {{"Docker-Content-Digest", digest}}};
  }

  http::Response Handle(const http::Request& req) {
    http::Response res = Route(req);
    res.headers.emplace_back("Docker-Distribution-API-Version", "registry/2.0");
    return res;
  }

  http::Response Route(const http::Request& req) {
    if (req.method != "GET" && req.method != "HEAD") {
      return Error(405, "UNSUPPORTED", "the mirror answers GET and HEAD only");
    }
    const std::string& path = req.path;
    if (path == "/v2/" || path == "/v2") {
      return http::Response{.body = "{}"};
    }
    if (path.size() > kMaxPathBytes || path.rfind("/v2/", 0) != 0) {
      return Error(404, "NAME_UNKNOWN", "no such route");
    }
    // /v2/<key>/<name>/<kind>/<reference>
    const std::string rest = path.substr(4);
    const size_t key_end = rest.find('/');
    const size_t ref_start = rest.rfind('/');
    const size_t kind_start = ref_start == std::string::npos || ref_start == 0
                                  ? std::string::npos
                                  : rest.rfind('/', ref_start - 1);
    if (key_end == std::string::npos || kind_start == std::string::npos || kind_start <= key_end) {
      return Error(404, "NAME_UNKNOWN", "no such route");
    }
    const std::string key = rest.substr(0, key_end);
    const std::string name = rest.substr(key_end + 1, kind_start - key_end - 1);
    const std::string kind = rest.substr(kind_start + 1, ref_start - kind_start - 1);
    const std::string reference = rest.substr(ref_start + 1);
    const auto registry = registries.find(key);
    if (registry == registries.end()) {
      return Error(404, "NAME_UNKNOWN", "not a mirrored registry: " + key);
    }
    if (!ValidateImageReference(fmt::format("{}/{}", registry->second.address, name)).ok()) {
      return Error(400, "NAME_INVALID", "invalid repository name");
    }
    if (kind == "blobs") {
      return HandleBlob(req, registry->second, key, name, reference);
    }
    if (kind == "manifests") {
      return HandleManifest(req, registry->second, name, reference);
    }
    return Error(404, "NAME_UNKNOWN", "no such route");
  }
};

std::string ImageMirror::RegistryKey(std::string_view registry) {
  std::string key;
  for (const char c : registry) {
    key += c == ':' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return key;
}

std::string ImageMirror::ChooseFetcher(const std::vector<std::string>& candidates,
                                       std::string_view hex) {
  const std::string* best = &candidates.front();
  uint64_t best_score = 0;
  for (const std::string& candidate : candidates) {
    const uint64_t score = Fnv1a(fmt::format("{}/{}", candidate, hex));
    if (score > best_score || (score == best_score && candidate < *best)) {
      best_score = score;
      best = &candidate;
    }
  }
  return *best;
}

Result<std::unique_ptr<ImageMirror>> ImageMirror::Start(ImageMirrorOptions options) {
  if (options.registries.empty()) {
    return Status(StatusCode::kInvalidArgument, "image mirror: no registry to mirror");
  }
  if (options.cache_dir.empty()) {
    return Status(StatusCode::kInvalidArgument, "image mirror: cache_dir is empty");
  }
  if (options.cache_bytes <= 0) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("image mirror: cache_bytes {} is not positive", options.cache_bytes));
  }
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"max_connections", options.max_connections},
        {"max_connections_per_client", options.max_connections_per_client},
        {"handler_threads", options.handler_threads}}) {
    if (value <= 0) {
      return Status(StatusCode::kInvalidArgument,
                    fmt::format("image mirror: {} {} is not positive", field, value));
    }
  }
  if (options.header_timeout <= std::chrono::milliseconds::zero()) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("image mirror: header_timeout {} ms is not positive",
                              options.header_timeout.count()));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  for (const std::string& registry : options.registries) {
    if (!ValidateImageReference(registry + "/x").ok() || registry.find('/') != std::string::npos) {
      return Status(
          StatusCode::kInvalidArgument,
          fmt::format("image mirror: registry \"{}\" is not HOST or HOST:PORT", registry));
    }
    const bool insecure =
        std::find(options.insecure_registries.begin(), options.insecure_registries.end(),
                  registry) != options.insecure_registries.end();
    impl->registries[RegistryKey(registry)] =
        Impl::Registry{registry, (insecure ? "http://" : "https://") + registry};
  }
  impl->blob_dir = options.cache_dir + "/sha256";
  impl->tmp_dir = options.cache_dir + "/tmp";
  std::error_code error;
  std::filesystem::remove_all(impl->tmp_dir, error);
  std::filesystem::create_directories(impl->blob_dir, error);
  if (!error) {
    std::filesystem::create_directories(impl->tmp_dir, error);
  }
  if (error) {
    return Status(StatusCode::kInvalidArgument,
                  fmt::format("image mirror: cannot create cache_dir \"{}\": {}", options.cache_dir,
                              error.message()));
  }
  // Blobs a previous mirror kept were checked before they were renamed into place.
  for (const auto& file : std::filesystem::directory_iterator(impl->blob_dir, error)) {
    const std::string hex = file.path().filename().string();
    if (!ValidateImageDigest("sha256:" + hex).ok() || !file.is_regular_file()) {
      continue;
    }
    const auto size = static_cast<int64_t>(file.file_size(error));
    impl->entries[hex] = Impl::Entry{size, 0};
    impl->stats.cached_bytes += size;
  }
  impl->Evict();

  http::ServerOptions server_options;
  server_options.host = options.host;
  server_options.port = options.port;
  server_options.max_body_bytes = 1024;  // GET and HEAD only
  server_options.header_timeout = options.header_timeout;
  server_options.idle_timeout = options.header_timeout;
  server_options.body_timeout = options.header_timeout;
  server_options.write_timeout = std::chrono::seconds(60);
  server_options.max_connections = options.max_connections;
  server_options.max_connections_per_client = options.max_connections_per_client;
  server_options.max_requests_per_connection = 100;
  server_options.io_threads = 2;
  server_options.agent_threads = 1;  // unused: every request is on the user lane
  server_options.user_threads = options.handler_threads;
  Impl* raw = impl.get();
  Result<std::unique_ptr<http::Server>> server = http::Server::Start(
      std::move(server_options), [raw](const http::Request& req) { return raw->Handle(req); },
      [](std::string_view, std::string_view) { return http::Lane::kUser; }, ServerError);
  if (!server.ok()) {
    return Status(server.status().code(),
                  fmt::format("image mirror: {}", server.status().message()));
  }
  impl->server = std::move(server).value();
  impl->port = impl->server->port();
  {
    std::lock_guard<std::mutex> lock(impl->mu);
    impl->self =
        options.self.empty() ? fmt::format("{}:{}", options.host, impl->port) : options.self;
    std::set<std::string> candidates(options.peers.begin(), options.peers.end());
    candidates.insert(impl->self);
    impl->candidates.assign(candidates.begin(), candidates.end());
  }
  return std::unique_ptr<ImageMirror>(new ImageMirror(std::move(impl)));
}

ImageMirror::ImageMirror(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ImageMirror::~ImageMirror() {
  impl_->server->Stop();
}

int ImageMirror::port() const {
  return impl_->port;
}
const std::string& ImageMirror::self() const {
  return impl_->self;
}

ImageMirrorStats ImageMirror::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

std::string ImageMirror::RegistriesConf() const {
  const std::string host = impl_->options.host == "0.0.0.0" ? "127.0.0.1" : impl_->options.host;
  std::string conf =
      "# Written by the gpufleet agent: podman pulls through the node's image mirror first.\n";
  for (const auto& [key, registry] : impl_->registries) {
    conf += fmt::format(
        "\n[[registry]]\nlocation = \"{}\"\ninsecure = {}\n\n[[registry.mirror]]\n"
        "location = \"{}:{}/{}\"\ninsecure = true\n",
        registry.address, registry.base_url.rfind("http://", 0) == 0, host, impl_->port, key);
  }
  return conf;
}

}  // namespace gpufleet::agent
