// SPDX-License-Identifier: Apache-2.0
// The image mirror's pure parts and its refusals; the mirror against podman and a registry is in
// test/integration/image_mirror_test.cc.
#include "gpufleet/agent/image_mirror.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/http/testing/raw_connection.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::http_testing::RawConnection;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Hex(int i) {
  return fmt::format("{:064x}", static_cast<uint64_t>(i) * 2654435761U);
}

TEST(ImageMirrorTest, RegistryKeysArePathComponents) {
  EXPECT_EQ(ImageMirror::RegistryKey("127.0.0.1:15000"), "127.0.0.1_15000");
  EXPECT_EQ(ImageMirror::RegistryKey("NVCR.io"), "nvcr.io");
}

TEST(ImageMirrorTest, RendezvousSpreadsBlobsAndALeavingPeerMovesOnlyItsOwn) {
  const std::vector<std::string> four = {"10.0.0.1:5050", "10.0.0.2:5050", "10.0.0.3:5050",
                                         "10.0.0.4:5050"};
  const std::vector<std::string> three(four.begin(), four.begin() + 3);
  std::map<std::string, int> share;
  for (int i = 0; i < 4000; ++i) {
    const std::string chosen = ImageMirror::ChooseFetcher(four, Hex(i));
    ++share[chosen];
    // The same on every node, whatever the order of its list.
    EXPECT_EQ(ImageMirror::ChooseFetcher({four[3], four[1], four[0], four[2]}, Hex(i)), chosen);
    const std::string without_last = ImageMirror::ChooseFetcher(three, Hex(i));
    if (chosen != four[3]) {
      EXPECT_EQ(without_last, chosen) << "a blob moved though its peer stayed";
    }
  }
  for (const std::string& peer : four) {
    EXPECT_GT(share[peer], 800) << peer;
    EXPECT_LT(share[peer], 1200) << peer;
  }
}

TEST(ImageMirrorTest, BadOptionsAreRefusedNamingThem) {
  const std::string dir = fmt::format("{}/image_mirror_options_{}", ::testing::TempDir(), getpid());
  ImageMirrorOptions options;
  options.cache_dir = dir;
  EXPECT_THAT(ImageMirror::Start(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no registry")));
  options.registries = {"http://registry:5000"};
  EXPECT_THAT(ImageMirror::Start(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"http://registry:5000\"")));
  options.registries = {"registry:5000"};
  options.cache_bytes = 0;
  EXPECT_THAT(ImageMirror::Start(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cache_bytes 0")));
  options.cache_bytes = 1;
  options.cache_dir = "";
  EXPECT_THAT(ImageMirror::Start(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cache_dir")));
  options.cache_dir = dir;
  options.max_connections_per_client = 0;
  EXPECT_THAT(ImageMirror::Start(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("max_connections_per_client 0")));
  options.max_connections_per_client = 1;
  options.header_timeout = std::chrono::milliseconds(-1);
  EXPECT_THAT(ImageMirror::Start(options).status(),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("header_timeout -1 ms")));
  std::filesystem::remove_all(dir);
}

// Listens on loopback: no registry behind it, so only what needs none.
class ImageMirrorIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fmt::format("{}/image_mirror_{}", ::testing::TempDir(), getpid());
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A mirror of a registry that is not there, on the fixture's cache.
  ImageMirrorOptions Options() const {
    ImageMirrorOptions options;
    options.registries = {"127.0.0.1:1"};
    options.insecure_registries = {"127.0.0.1:1"};
    options.cache_dir = dir_;
    return options;
  }
  std::string dir_;
};

TEST_F(ImageMirrorIntegrationTest, KeepsTheBlobsOfBeforeARestartWithinItsCache) {
  std::filesystem::create_directories(dir_ + "/sha256");
  for (int i = 0; i < 3; ++i) {
    std::ofstream(dir_ + "/sha256/" + Hex(i)) << std::string(100, 'x');
  }
  std::ofstream(dir_ + "/sha256/not-a-digest") << "ignored";
  ImageMirrorOptions options = Options();
  options.cache_bytes = 250;
  Result<std::unique_ptr<ImageMirror>> mirror = ImageMirror::Start(options);
  ASSERT_OK(mirror);
  EXPECT_EQ((*mirror)->stats().cached_bytes, 200);
  EXPECT_EQ((*mirror)->stats().evictions, 1);

  // podman is pointed at the mirror, on loopback, for the mirrored registry only.
  EXPECT_EQ((*mirror)->RegistriesConf(),
            fmt::format("# Written by the gpufleet agent: podman pulls through the node's image "
                        "mirror first.\n\n[[registry]]\nlocation = \"127.0.0.1:1\"\ninsecure = "
                        "true\n\n[[registry.mirror]]\nlocation = \"127.0.0.1:{}/127.0.0.1_1\"\n"
                        "insecure = true\n",
                        (*mirror)->port()));

  httplib::Client client(fmt::format("127.0.0.1:{}", (*mirror)->port()));
  const std::string key = ImageMirror::RegistryKey("127.0.0.1:1");
  EXPECT_EQ(client.Get("/v2/")->status, 200);
  // A kept blob is served without its registry (which is not there).
  const std::string kept = Hex(2);
  const httplib::Result blob = client.Get(fmt::format("/v2/{}/x/blobs/sha256:{}", key, kept));
  ASSERT_TRUE(blob);
  EXPECT_EQ(blob->status, 200);
  EXPECT_EQ(blob->body, std::string(100, 'x'));
  // Another registry, a bad name or digest: refused before anything is fetched.
  EXPECT_EQ(client.Get(fmt::format("/v2/docker.io/x/blobs/sha256:{}", kept))->status, 404);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/X/blobs/sha256:{}", key, kept))->status, 400);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/x/blobs/sha512:{}", key, kept))->status, 400);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/x/manifests/-bad", key))->status, 400);
  EXPECT_EQ(client.Get("/etc/passwd")->status, 404);
  // A blob its registry cannot give: podman is sent there; a peer gets an error.
  const httplib::Result missing = client.Get(fmt::format("/v2/{}/x/blobs/sha256:{}", key, Hex(9)));
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 307);
  EXPECT_EQ(client.Get(fmt::format("/v2/{}/x/blobs/sha256:{}", key, Hex(9)), {{kPeerHeader, "1"}})
                ->status,
            502);
}

// Issue 33: 40 slow connections stalled the mirror (a pull took 97 s) because each held one of its
// worker threads. Now they hold sockets: a real request is answered while they hang on (within
// RawConnection's 5 s read timeout, the mirror's 10 s default deadline never passing), and the
// server cuts them off at the header deadline.
TEST_F(ImageMirrorIntegrationTest, SlowClientsDoNotStallTheMirrorAndAreCutOff) {
  std::filesystem::create_directories(dir_ + "/sha256");
  const std::string kept = Hex(1);
  std::ofstream(dir_ + "/sha256/" + kept) << std::string(3000, 'k');
  ImageMirrorOptions options = Options();
  options.handler_threads = 2;
  Result<std::unique_ptr<ImageMirror>> mirror = ImageMirror::Start(options);
  ASSERT_OK(mirror);
  const int port = (*mirror)->port();
  const std::string key = ImageMirror::RegistryKey("127.0.0.1:1");

  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(std::make_unique<RawConnection>(port));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->Send(
        fmt::format("GET /v2/{}/x/blobs/sha256:{} HTTP/1.1\r\nHost: x\r\n", key, kept)));
  }
  RawConnection pull(port);
  ASSERT_TRUE(pull.Send(fmt::format(
      "GET /v2/{}/x/blobs/sha256:{} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", key, kept)));
  const std::string answer = pull.ReadAll();
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(answer, HasSubstr("Docker-Content-Digest: sha256:" + kept));
  EXPECT_THAT(answer, HasSubstr("\r\n\r\n" + std::string(3000, 'k')));

  // A second mirror on the same cache with a short header deadline: the slow ones are closed by
  // the server (a recv that returns 0), not left to the client's own timeout.
  mirror->reset();
  options.header_timeout = std::chrono::milliseconds(500);
  mirror = ImageMirror::Start(options);
  ASSERT_OK(mirror);
  slow.clear();
  for (int i = 0; i < 40; ++i) {
    slow.push_back(std::make_unique<RawConnection>((*mirror)->port()));
    ASSERT_TRUE(slow.back()->connected());
    if (i % 2 == 0) {  // half trickle a header, half send nothing
      ASSERT_TRUE(slow.back()->Send("GET /v2/ HTTP/1.1\r\n"));
    }
  }
  for (size_t i = 0; i < slow.size(); i += 2) {
    (void)slow[i]->Send("X-Slow: 1\r\n");
  }
  for (auto& connection : slow) {
    EXPECT_TRUE(connection->Closed());
  }
}

// A connection over the mirror's cap is answered 503 at once and closed, in the distribution
// API's error format, rather than queued: podman, refused by a mirror, pulls from the registry.
TEST_F(ImageMirrorIntegrationTest, AConnectionOverTheCapIsRefusedAtOnce) {
  ImageMirrorOptions options = Options();
  options.max_connections = 4;
  Result<std::unique_ptr<ImageMirror>> mirror = ImageMirror::Start(options);
  ASSERT_OK(mirror);
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(std::make_unique<RawConnection>((*mirror)->port()));
    ASSERT_TRUE(idle.back()->connected());
  }
  RawConnection fifth((*mirror)->port());
  ASSERT_TRUE(fifth.Send("GET /v2/ HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string refused = fifth.ReadAll();
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(refused,
              HasSubstr(R"({"errors":[{"code":"UNAVAILABLE","message":"the server holds)"));
  EXPECT_THAT(refused, HasSubstr("Connection: close"));
}

}  // namespace
}  // namespace gpufleet::agent
