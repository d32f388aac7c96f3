// SPDX-License-Identifier: Apache-2.0
// `gpufleet server --tls-cert --tls-key` end to end: the built binary serves HTTPS and the CLI's
// client reaches it with --ca-cert, and refuses it without.
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/api/testing/self_signed_cert.h"
#include "gpufleet/api/testing/server_process.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/client.h"

namespace gpufleet {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kTlsAdminToken[] = "tls-test-admin-token-0123456789";

class ServerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "gpufleet-tls-test-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    cert_ = (dir_ / "cert.pem").string();
    key_ = (dir_ / "key.pem").string();
    ASSERT_OK(api_testing::WriteSelfSignedCert(cert_, key_));
    std::ofstream(dir_ / "admin-token") << kTlsAdminToken << "\n";
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  std::filesystem::path dir_;
  std::string cert_;
  std::string key_;
};

TEST_F(ServerTlsTest, TheCliReachesAnHttpsServerWithItsCaCertOnly) {
  Result<std::unique_ptr<api_testing::ServerProcess>> server = api_testing::ServerProcess::Start(
      GPUFLEET_BINARY,
      {"--data-dir", (dir_ / "data").string(), "--listen", "127.0.0.1:0", "--tls-cert", cert_,
       "--tls-key", key_, "--admin-token-file", (dir_ / "admin-token").string()},
      std::chrono::seconds(20));
  ASSERT_OK(server);
  EXPECT_THAT((*server)->output(), HasSubstr("listening on https://127.0.0.1:"));
  const std::string address = "https://127.0.0.1:" + std::to_string((*server)->port());

  http::ApiClient trusting(address, kTlsAdminToken, cert_);
  Result<nlohmann::json> queues = trusting.Get("/v1/queues");
  ASSERT_OK(queues);
  EXPECT_EQ((*queues)["items"][0]["name"], "default");

  http::ApiClient untrusting(address, kTlsAdminToken);
  EXPECT_THAT(untrusting.Get("/v1/queues"),
              StatusIs(StatusCode::kUnavailable, HasSubstr("certificate verification failed")));
  http::ApiClient plain("http://127.0.0.1:" + std::to_string((*server)->port()), kTlsAdminToken);
  EXPECT_THAT(plain.Get("/v1/queues"), StatusIs(StatusCode::kUnavailable));
}

TEST_F(ServerTlsTest, AMissingKeyStopsTheStartNamingTheFile) {
  Result<std::unique_ptr<api_testing::ServerProcess>> server = api_testing::ServerProcess::Start(
      GPUFLEET_BINARY,
      {"--data-dir", (dir_ / "data").string(), "--listen", "127.0.0.1:0", "--tls-cert", cert_,
       "--tls-key", (dir_ / "missing-key.pem").string()},
      std::chrono::seconds(20));
  EXPECT_THAT(server, StatusIs(StatusCode::kUnavailable,
                               HasSubstr("TLS key \"" + (dir_ / "missing-key.pem").string() +
                                         "\": cannot read it")));
  // Checked before anything was written: no store, so no admin token was spent.
  EXPECT_FALSE(std::filesystem::exists(dir_ / "data"));
}

}  // namespace
}  // namespace gpufleet
