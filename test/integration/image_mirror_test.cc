// SPDX-License-Identifier: Apache-2.0
// Peer-to-peer image distribution (agent/image_mirror.h) with real podman, Debian's
// docker-registry on loopback and a 128 MiB image the suite builds from random bytes: four nodes
// (each a PodmanRunner with a storage of its own and, with peer-to-peer, an ImageMirror) start
// a gang's four containers, and the registry's own access log says how often it served each
// layer. Labels `integration` and `podman`; skips only when podman cannot run at all.
#include "gpufleet/agent/image_mirror.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/runner/podman_runner.h"
#include "gpufleet/runner/process_runner.h"
#include "gpufleet/runner/testing/podman_testing.h"

namespace gpufleet {
namespace {

using agent::ImageMirror;
using agent::ImageMirrorOptions;
using runner::PodmanRunner;
using runner::PodmanRunnerOptions;
using runner::ProcessRunner;
using runner::TaskLaunch;
using runner::TaskRunner;
using runner::TaskState;
using runner::TaskStatus;
using runner_testing::LoopbackRegistry;
using runner_testing::ReadFile;
using runner_testing::Shell;
using runner_testing::WriteFile;
using ::testing::HasSubstr;

constexpr char kImage[] = "localhost/gpufleet-p2p-test:1";
constexpr char kSmallImage[] = "localhost/gpufleet-p2p-test-small:1";
constexpr int kNodes = 4;
constexpr int kImageMiB = 128;

std::string Sha256Hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += fmt::format("{:02x}", digest[i]);
  }
  return hex;
}

// What the registry's access log says it served: per blob digest, the GETs answered 200 and
// their bytes; and the bytes of manifests.
struct Served {
  std::map<std::string, int> blob_gets;
  int64_t blob_bytes = 0;
  int64_t manifest_bytes = 0;
};

Served ParseRegistryLog(const std::string& log) {
  Served served;
  static const std::regex kLine(
      R"re("GET /v2/[^ ]+/(blobs|manifests)/([^ ]+) HTTP/[0-9.]+" 200 ([0-9]+))re");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), kLine); it != std::sregex_iterator();
       ++it) {
    const int64_t bytes = std::stoll((*it)[3]);
    if ((*it)[1] == "blobs") {
      ++served.blob_gets[(*it)[2]];
      served.blob_bytes += bytes;
    } else {
      served.manifest_bytes += bytes;
    }
  }
  return served;
}

// A peer that dies mid-blob (`cut_off`: it promises the whole blob, sends half and closes), or
// one that lies (sends as many bytes as promised, none of them right).
class BadPeer {
 public:
  BadPeer(int64_t blob_size, bool cut_off)
      : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)), size_(blob_size), cut_off_(cut_off) {
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
        listen(fd_, 16) == 0 &&
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
      address_ = fmt::format("127.0.0.1:{}", ntohs(address.sin_port));
      thread_ = std::thread([this] { Serve(); });
    }
  }
  ~BadPeer() {
    stopping_ = true;
    shutdown(fd_, SHUT_RDWR);
    if (thread_.joinable()) {
      thread_.join();
    }
    close(fd_);
  }
  BadPeer(const BadPeer&) = delete;
  BadPeer& operator=(const BadPeer&) = delete;
  const std::string& address() const { return address_; }
  int requests() const { return requests_.load(); }

 private:
  void Serve() {
    while (!stopping_) {
      const int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) {
        return;
      }
      std::string request;
      char buffer[4096];
      while (request.find("\r\n\r\n") == std::string::npos) {
        const ssize_t n = read(client, buffer, sizeof(buffer));
        if (n <= 0) {
          break;
        }
        request.append(buffer, static_cast<size_t>(n));
      }
      ++requests_;
      std::string answer = fmt::format(
          "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
          size_);
      answer.append(static_cast<size_t>(cut_off_ ? size_ / 2 : size_), 'x');
      size_t sent = 0;
      while (sent < answer.size()) {
        const ssize_t n = write(client, answer.data() + sent, answer.size() - sent);
        if (n <= 0) {
          break;
        }
        sent += static_cast<size_t>(n);
      }
      close(client);  // the peer is gone
    }
  }

  int fd_;
  int64_t size_;
  bool cut_off_;
  std::string address_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> requests_{0};
};

class ImageMirrorTest : public ::testing::Test {
 protected:
  // One 128 MiB image, pushed once to one registry, for the whole suite.
  static void SetUpTestSuite() {
    suite_dir_ = fmt::format("{}/image_mirror_test_{}", ::testing::TempDir(), getpid());
    std::filesystem::remove_all(suite_dir_);
    std::filesystem::create_directories(suite_dir_ + "/rootfs/bin");
    WriteFile(suite_dir_ + "/containers.conf", "[containers]\ndefault_ulimits = []\n");
    if (const std::string error = Shell(PodmanPrefix("builder") + " version"); !error.empty()) {
      skip_reason_ = "podman cannot run here (install it with scripts/setup): " + error;
      return;
    }
    // Random bytes, so that the layer does not compress away.
    // A small image (busybox) for the cache's eviction, and a probe of the storage driver:
    // overlay where it works (a container then shares its image's layer instead of copying
    // 128 MiB, as vfs does), else vfs.
    setup_error_ =
        Shell(fmt::format("set -e; cd {0}; cp /bin/busybox rootfs/bin/; "
                          "for a in sh true; do ln -sf busybox rootfs/bin/$a; done; "
                          "tar -C rootfs -cf small.tar .; {1} import small.tar {2} >/dev/null",
                          suite_dir_, PodmanPrefix("builder"), kSmallImage));
    if (!setup_error_.empty()) {
      return;
    }
    storage_driver_ = "overlay";
    if (!Shell(fmt::format("{0} import {1}/small.tar localhost/probe:1 >/dev/null && {0} run --rm "
                           "--runtime runc localhost/probe:1 true",
                           PodmanPrefix("probe"), suite_dir_))
             .empty()) {
      storage_driver_ = "vfs";
    }
    Shell(PodmanPrefix("probe") + " rmi --all --force >/dev/null 2>&1");
    // Random bytes, so that the layer does not compress away.
    setup_error_ = Shell(fmt::format(
        "set -e; cd {0}; head -c {3}M /dev/urandom > rootfs/random; tar -C rootfs -cf big.tar .; "
        "rm rootfs/random; {1} import big.tar {2} >/dev/null; rm big.tar",
        suite_dir_, PodmanPrefix("builder"), kImage, kImageMiB));
    if (!setup_error_.empty()) {
      return;
    }
    registry_ = new LoopbackRegistry(suite_dir_, PodmanPrefix("builder"), kImage, "big:1");
    setup_error_ = registry_->error();
    if (setup_error_.empty()) {
      setup_error_ = Shell(fmt::format("{} push --tls-verify=false {} {}/small:1",
                                       PodmanPrefix("builder"), kSmallImage, registry_->address()));
    }
  }

  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
    std::error_code ignored;
    std::filesystem::remove_all(suite_dir_, ignored);
  }

  // podman on `node`'s storage (the builder's is always vfs: it is made before the probe).
  static std::string PodmanPrefix(const std::string& node) {
    return fmt::format(
        "CONTAINERS_CONF={0}/containers.conf podman --root {0}/{1}/storage --runroot {0}/{1}/run "
        "--tmpdir {0}/{1}/tmp --storage-driver {2}",
        suite_dir_, node, node == "builder" ? "vfs" : storage_driver_);
  }

  void SetUp() override {
    if (!skip_reason_.empty()) {
      GTEST_SKIP() << skip_reason_;
    }
    ASSERT_EQ(setup_error_, "") << "cannot build or push the test image";
    // The blobs, by digest (the registry keeps the manifests as blobs too); the largest is the
    // big image's layer, and the manifests name the configs and the small image's layer.
    std::map<std::string, int64_t> sizes;
    std::vector<std::string> manifests;
    for (const std::string& file : registry_->BlobFiles()) {
      const std::string hex = std::filesystem::path(file).parent_path().filename().string();
      sizes[hex] = static_cast<int64_t>(std::filesystem::file_size(file));
      if (sizes[hex] > layer_bytes_) {
        layer_bytes_ = sizes[hex];
        layer_hex_ = hex;
      }
      if (sizes[hex] < 4096 && ReadFile(file).find("\"layers\":") != std::string::npos) {
        manifests.push_back(ReadFile(file));
      }
    }
    static const std::regex kConfig(R"re("config":\{[^}]*"digest":"sha256:([0-9a-f]{64})")re");
    static const std::regex kLayer(R"re("layers":\[\{[^}]*"digest":"sha256:([0-9a-f]{64})")re");
    for (const std::string& manifest : manifests) {
      std::smatch config;
      std::smatch layer;
      ASSERT_TRUE(std::regex_search(manifest, config, kConfig)) << manifest;
      ASSERT_TRUE(std::regex_search(manifest, layer, kLayer)) << manifest;
      if (layer[1] == layer_hex_) {
        config_hex_ = config[1];
        config_bytes_ = sizes[config_hex_];
      } else {
        small_layer_hex_ = layer[1];
        small_layer_bytes_ = sizes[small_layer_hex_];
      }
    }
    image_bytes_ = layer_bytes_ + config_bytes_;
    ASSERT_GT(config_bytes_, 0);
    ASSERT_GT(small_layer_bytes_, 0);
    log_offset_ = registry_->log().size();
  }

  void TearDown() override {
    std::string remove_images;  // on every node at once
    for (Node& node : nodes_) {
      if (node.runner != nullptr) {
        for (const TaskStatus& status : node.runner->Poll()) {
          (void)node.runner->Forget(status.task_id);
        }
      }
      node.runner.reset();
      remove_images += PodmanPrefix(node.name) + " rmi --all --force >/dev/null 2>&1 & ";
    }
    Shell(remove_images + "wait");
    for (const Node& node : nodes_) {
      std::error_code ignored;
      std::filesystem::remove_all(suite_dir_ + "/" + node.name, ignored);
    }
  }

  struct Node {
    std::string name;
    std::unique_ptr<ImageMirror> mirror;
    std::unique_ptr<PodmanRunner> runner;
  };

  // A mirror for node `name`, in front of the suite's registry.
  static ImageMirrorOptions MirrorOptions(const std::string& name) {
    ImageMirrorOptions options;
    options.registries = {registry_->address()};
    options.insecure_registries = {registry_->address()};
    options.cache_dir = fmt::format("{}/{}/mirror", suite_dir_, name);
    return options;
  }

  // Opens node `name`'s runner, pulling through `mirror` when there is one.
  void OpenRunner(Node& node) {
    const std::string dir = suite_dir_ + "/" + node.name;
    std::filesystem::create_directories(dir);
    PodmanRunnerOptions options;
    options.storage_root = dir + "/storage";
    options.run_root = dir + "/run";
    options.tmp_dir = dir + "/tmp";
    options.storage_driver = storage_driver_;
    options.containers_conf = suite_dir_ + "/containers.conf";
    options.instance = fmt::format("p2p-test-{}-{}", getpid(), node.name);
    options.fence_dir = dir + "/fences";
    options.pull_dir = dir + "/pulls";
    options.insecure_registries = {registry_->address()};
    if (node.mirror != nullptr) {
      options.registries_conf = dir + "/registries.conf";
      WriteFile(options.registries_conf, node.mirror->RegistriesConf());
    }
    Result<std::unique_ptr<ProcessRunner>> processes = ProcessRunner::Open(dir + "/tasks", clock_);
    ASSERT_OK(processes);
    Result<std::unique_ptr<PodmanRunner>> runner =
        PodmanRunner::Open(options, std::move(processes).value(), clock_);
    ASSERT_OK(runner);
    node.runner = std::move(runner).value();
  }

  // Four nodes, with or without peer-to-peer (then every mirror has all four as peers).
  void OpenGang(bool peer_to_peer, const std::string& prefix) {
    nodes_.resize(kNodes);
    std::vector<std::string> peers;
    for (int i = 0; i < kNodes; ++i) {
      nodes_[i].name = fmt::format("{}{}", prefix, i);
      if (peer_to_peer) {
        const int port = runner_testing::FreeLoopbackPort();
        peers.push_back(fmt::format("127.0.0.1:{}", port));
      }
    }
    for (int i = 0; i < kNodes && peer_to_peer; ++i) {
      ImageMirrorOptions options = MirrorOptions(nodes_[i].name);
      options.port = std::stoi(peers[i].substr(peers[i].find(':') + 1));
      options.peers = peers;
      Result<std::unique_ptr<ImageMirror>> mirror = ImageMirror::Start(options);
      ASSERT_OK(mirror);
      nodes_[i].mirror = std::move(mirror).value();
    }
    for (Node& node : nodes_) {
      ASSERT_NO_FATAL_FAILURE(OpenRunner(node));
    }
  }

  TaskLaunch GangTask(int index) const {
    TaskLaunch launch;
    launch.task_id = fmt::format("gang/main-{}/1", index);
    launch.argv = {"/bin/sh", "-c", "test -s /random"};
    launch.image = registry_->address() + "/big:1";
    launch.image_pull_policy = ImagePullPolicy::kIfNotPresent;
    launch.log_path = fmt::format("{}/{}/main.log", suite_dir_, nodes_[index].name);
    return launch;
  }

  // Starts the gang's tasks together and waits for each to end; the seconds until the last did.
  double StartGang() {
    const MonoTime start = clock_.Now();
    for (int i = 0; i < kNodes; ++i) {
      EXPECT_OK(nodes_[i].runner->Start(GangTask(i)));
    }
    for (int i = 0; i < kNodes; ++i) {
      TaskStatus status = WaitForEnd(*nodes_[i].runner, GangTask(i).task_id);
      EXPECT_EQ(status.state, TaskState::kExited) << runner::DescribeTaskStatus(status);
      EXPECT_EQ(status.exit_code, 0) << ReadFile(GangTask(i).log_path);
    }
    return std::chrono::duration<double>(clock_.Now() - start).count();
  }

  TaskStatus WaitForEnd(TaskRunner& runner, const std::string& task_id) {
    const MonoTime deadline = clock_.Now() + std::chrono::seconds(120);
    TaskStatus status;
    while (clock_.Now() < deadline) {
      for (const TaskStatus& polled : runner.Poll()) {
        if (polled.task_id == task_id) {
          status = polled;
        }
      }
      if (runner::IsFinal(status.state)) {
        return status;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << task_id << " still " << runner::DescribeTaskStatus(status);
    return status;
  }

  Served ServedSinceSetUp() const { return ParseRegistryLog(registry_->log().substr(log_offset_)); }

  static std::string suite_dir_;
  static std::string storage_driver_;
  static std::string skip_reason_;
  static std::string setup_error_;
  static LoopbackRegistry* registry_;
  SystemClock clock_;
  std::vector<Node> nodes_;
  int64_t image_bytes_ = 0;
  int64_t layer_bytes_ = 0;
  std::string layer_hex_;
  int64_t config_bytes_ = 0;
  std::string config_hex_;
  int64_t small_layer_bytes_ = 0;  // the small image's layer
  std::string small_layer_hex_;
  size_t log_offset_ = 0;
};

std::string ImageMirrorTest::suite_dir_;
std::string ImageMirrorTest::storage_driver_ = "vfs";
std::string ImageMirrorTest::skip_reason_;
std::string ImageMirrorTest::setup_error_;
LoopbackRegistry* ImageMirrorTest::registry_ = nullptr;

// The issue's figure: registry bytes for a 4-node gang's start, without peer-to-peer (each node
// pulls the image: 4x) and with it (each blob from the registry once: <= 1.25x).
TEST_F(ImageMirrorTest, AGangOfFourFetchesEachLayerFromTheRegistryOnce) {
  ASSERT_NO_FATAL_FAILURE(OpenGang(/*peer_to_peer=*/false, "plain"));
  const double plain_s = StartGang();
  const Served plain = ServedSinceSetUp();
  TearDown();
  nodes_.clear();
  log_offset_ = registry_->log().size();

  ASSERT_NO_FATAL_FAILURE(OpenGang(/*peer_to_peer=*/true, "p2p"));
  const double p2p_s = StartGang();
  const Served p2p = ServedSinceSetUp();
  int64_t registry_bytes = 0;
  int64_t peer_bytes = 0;
  int64_t peer_failures = 0;
  for (const Node& node : nodes_) {
    const agent::ImageMirrorStats stats = node.mirror->stats();
    registry_bytes += stats.registry_bytes;
    peer_bytes += stats.peer_bytes;
    peer_failures += stats.peer_failures;
  }

  fmt::print("image: {} bytes in blobs (layer {} bytes); {} nodes; storage driver {}\n",
             image_bytes_, layer_bytes_, kNodes, storage_driver_);
  fmt::print("{:<12} {:>10} {:>16} {:>9} {:>16} {:>10}\n", "mode", "blob GETs", "registry bytes",
             "x image", "manifest bytes", "gang s");
  for (const auto& [mode, served, seconds] :
       {std::tuple{"registry", plain, plain_s}, std::tuple{"p2p", p2p, p2p_s}}) {
    int gets = 0;
    for (const auto& [digest, count] : served.blob_gets) {
      gets += count;
    }
    fmt::print("{:<12} {:>10} {:>16} {:>9.2f} {:>16} {:>10.1f}\n", mode, gets, served.blob_bytes,
               static_cast<double>(served.blob_bytes) / static_cast<double>(image_bytes_),
               served.manifest_bytes, seconds);
  }

  // Without peers every node fetched every blob.
  EXPECT_EQ(plain.blob_bytes, kNodes * image_bytes_);
  for (const auto& [digest, count] : plain.blob_gets) {
    EXPECT_EQ(count, kNodes) << digest;
  }
  // With them, each blob came from the registry once, and the other nodes had it from a peer.
  EXPECT_EQ(p2p.blob_gets.size(), plain.blob_gets.size());
  for (const auto& [digest, count] : p2p.blob_gets) {
    EXPECT_EQ(count, 1) << digest;
  }
  EXPECT_LE(static_cast<double>(p2p.blob_bytes + p2p.manifest_bytes),
            1.25 * static_cast<double>(image_bytes_));
  EXPECT_EQ(registry_bytes, image_bytes_);
  EXPECT_EQ(peer_bytes, (kNodes - 1) * image_bytes_);
  EXPECT_EQ(peer_failures, 0);
}

// The peer chosen for the big layer dies mid-blob: the node's mirror still serves the layer,
// fetched from the registry, and the half blob is never stored or served. (podman itself, when
// its mirror fails, pulls from the registry: the mirror is only the first place it tries.)
TEST_F(ImageMirrorTest, APeerThatDiesMidBlobLeavesTheBlobToTheRegistry) {
  BadPeer peer(layer_bytes_, /*cut_off=*/true);
  ASSERT_NE(peer.address(), "");
  ImageMirrorOptions options = MirrorOptions("cutoff");
  options.peers = {peer.address()};
  // A name for this mirror that makes the dying peer the big layer's fetcher.
  for (int i = 0; options.self.empty() || ImageMirror::ChooseFetcher({options.self, peer.address()},
                                                                     layer_hex_) != peer.address();
       ++i) {
    options.self = fmt::format("node-{}:1", i);
  }
  Result<std::unique_ptr<ImageMirror>> started = ImageMirror::Start(options);
  ASSERT_OK(started);
  const std::unique_ptr<ImageMirror> mirror = std::move(started).value();
  httplib::Client client(fmt::format("127.0.0.1:{}", mirror->port()));
  client.set_read_timeout(std::chrono::seconds(120));
  const std::string key = ImageMirror::RegistryKey(registry_->address());

  const httplib::Result got =
      client.Get(fmt::format("/v2/{}/big/blobs/sha256:{}", key, layer_hex_));
  ASSERT_TRUE(got) << httplib::to_string(got.error());
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(Sha256Hex(got->body), layer_hex_);
  EXPECT_EQ(peer.requests(), 1);
  const agent::ImageMirrorStats stats = mirror->stats();
  EXPECT_EQ(stats.peer_failures, 1);
  EXPECT_EQ(stats.peer_bytes, 0);
  EXPECT_EQ(stats.registry_bytes, layer_bytes_);
  EXPECT_EQ(stats.cached_bytes, layer_bytes_);
  EXPECT_EQ(ServedSinceSetUp().blob_gets["sha256:" + layer_hex_], 1);
}

// A peer that sends wrong bytes is caught by the digest; hostile requests get 4xx and fetch
// nothing; the cache keeps at most cache_bytes.
TEST_F(ImageMirrorTest, ServesOnlyVerifiedContentAndRefusesEverythingElse) {
  BadPeer liar(config_bytes_, /*cut_off=*/false);
  ImageMirrorOptions options = MirrorOptions("liar");
  options.peers = {liar.address()};
  // Room for the small image's layer, not for the config beside it.
  options.cache_bytes = small_layer_bytes_ + 1;
  // A name for this mirror that makes the liar the config's fetcher, and itself the layer's.
  for (int i = 0;
       options.self.empty() ||
       ImageMirror::ChooseFetcher({options.self, liar.address()}, config_hex_) != liar.address() ||
       ImageMirror::ChooseFetcher({options.self, liar.address()}, small_layer_hex_) != options.self;
       ++i) {
    options.self = fmt::format("node-{}:1", i);
  }
  Result<std::unique_ptr<ImageMirror>> started = ImageMirror::Start(options);
  ASSERT_OK(started);
  const std::unique_ptr<ImageMirror> mirror = std::move(started).value();
  httplib::Client client(fmt::format("127.0.0.1:{}", mirror->port()));
  client.set_read_timeout(std::chrono::seconds(120));
  const std::string key = ImageMirror::RegistryKey(registry_->address());
  const std::string config = fmt::format("/v2/{}/big/blobs/sha256:{}", key, config_hex_);

  const httplib::Result got = client.Get(config);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->status, 200);
  EXPECT_EQ(Sha256Hex(got->body), config_hex_);
  EXPECT_EQ(got->get_header_value("Docker-Content-Digest"), "sha256:" + config_hex_);
  EXPECT_EQ(liar.requests(), 1);
  EXPECT_EQ(mirror->stats().digest_mismatches, 1);
  EXPECT_EQ(mirror->stats().peer_failures, 1);
  EXPECT_EQ(mirror->stats().registry_bytes, config_bytes_);
  // Again, as a HEAD and a GET: from the cache, neither peer nor registry asked.
  const httplib::Result head = client.Head(config);
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->get_header_value("Content-Length"), std::to_string(config_bytes_));
  const httplib::Result again = client.Get(config);
  ASSERT_TRUE(again);
  EXPECT_EQ(Sha256Hex(again->body), config_hex_);
  EXPECT_EQ(liar.requests(), 1);
  EXPECT_EQ(mirror->stats().cache_hits, 2);
  EXPECT_EQ(ServedSinceSetUp().blob_gets["sha256:" + config_hex_], 1);

  // The small image's layer does not fit beside the config: the config, least recently served,
  // goes.
  ASSERT_EQ(client.Get(fmt::format("/v2/{}/small/blobs/sha256:{}", key, small_layer_hex_))->status,
            200);
  EXPECT_EQ(mirror->stats().evictions, 1);
  EXPECT_EQ(mirror->stats().cached_bytes, small_layer_bytes_);

  // The API is there; a tag is resolved at the registry, with the manifest's digest.
  EXPECT_EQ(client.Get("/v2/")->status, 200);
  const httplib::Result manifest =
      client.Get(fmt::format("/v2/{}/big/manifests/1", key),
                 {{"Accept", "application/vnd.oci.image.manifest.v1+json"},
                  {"Accept", "application/vnd.docker.distribution.manifest.v2+json"}});
  ASSERT_TRUE(manifest);
  EXPECT_EQ(manifest->status, 200);
  EXPECT_EQ(manifest->get_header_value("Docker-Content-Digest"),
            "sha256:" + Sha256Hex(manifest->body));
  EXPECT_THAT(manifest->body, HasSubstr(layer_hex_));
  // Peers are never served a manifest, nor anything by tag.
  EXPECT_EQ(
      client.Get(fmt::format("/v2/{}/big/manifests/1", key), {{agent::kPeerHeader, "1"}})->status,
      404);

  const std::string log_before = registry_->log();
  const std::string blob = fmt::format("/v2/{}/big/blobs/sha256:{}", key, layer_hex_);
  EXPECT_EQ(client.Get(fmt::format("/v2/nvcr.io/big/blobs/sha256:{}", layer_hex_))->status, 404);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/big/blobs/sha256:abc", key))->status, 400);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/big/blobs/md5:{}", key, layer_hex_))->status, 400);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/../../etc/blobs/sha256:{}", key, layer_hex_))->status,
            400);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/big/tags/list", key))->status, 404);
  EXPECT_EQ(client.Get("/v2/" + std::string(2000, 'a'))->status, 404);
  const httplib::Result put = client.Put(blob, "x", "application/octet-stream");
  EXPECT_TRUE(!put || put->status >= 400);
  const httplib::Result del = client.Delete(blob);
  EXPECT_TRUE(!del || del->status >= 400);
  EXPECT_EQ(registry_->log().size(), log_before.size()) << "a refused request reached the registry";

  // A blob over the cache of a mirror: podman is sent to the registry for it; a peer is not.
  ImageMirrorOptions small = MirrorOptions("small");
  small.cache_bytes = 1000;
  Result<std::unique_ptr<ImageMirror>> small_mirror = ImageMirror::Start(small);
  ASSERT_OK(small_mirror);
  httplib::Client small_client(fmt::format("127.0.0.1:{}", (*small_mirror)->port()));
  const httplib::Result redirected = small_client.Get(blob);
  ASSERT_TRUE(redirected);
  EXPECT_EQ(redirected->status, 307);
  EXPECT_EQ(redirected->get_header_value("Location"),
            fmt::format("http://{}/v2/big/blobs/sha256:{}", registry_->address(), layer_hex_));
  EXPECT_EQ(small_client.Get(blob, {{agent::kPeerHeader, "1"}})->status, 502);
  EXPECT_EQ((*small_mirror)->stats().cached_bytes, 0);
}

}  // namespace
}  // namespace gpufleet
