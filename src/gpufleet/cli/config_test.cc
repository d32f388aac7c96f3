// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/cli/config.h"

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::cli {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

ConfigSources AllSources() {
  return ConfigSources{
      .flag_address = "http://flag:1",
      .flag_token = "flag-token",
      .env_address = "http://env:2",
      .env_token = "env-token",
      .file_text = "# mine\naddress = http://file:3\n\ntoken = \"file-token\"\n",
      .file_path = "/home/u/.config/gpufleet/config",
  };
}

TEST(ResolveConfig, FlagWinsOverEnvironmentOverFileOverDefault) {
  ConfigSources sources = AllSources();
  Result<CliConfig> config = ResolveConfig(sources);
  ASSERT_OK(config);
  EXPECT_EQ(config->address, "http://flag:1");
  EXPECT_EQ(config->token, "flag-token");

  sources.flag_address.reset();
  sources.flag_token = "";  // empty counts as absent
  config = ResolveConfig(sources);
  ASSERT_OK(config);
  EXPECT_EQ(config->address, "http://env:2");
  EXPECT_EQ(config->token, "env-token");

  sources.env_address.reset();
  sources.env_token.reset();
  config = ResolveConfig(sources);
  ASSERT_OK(config);
  EXPECT_EQ(config->address, "http://file:3");
  EXPECT_EQ(config->token, "file-token");

  sources.file_text.reset();
  config = ResolveConfig(sources);
  ASSERT_OK(config);
  EXPECT_EQ(config->address, "http://127.0.0.1:8080");
  EXPECT_EQ(config->token, "");
}

TEST(ResolveConfig, FieldsResolveIndependently) {
  ConfigSources sources = AllSources();
  sources.flag_address.reset();
  sources.env_token.reset();
  sources.flag_token.reset();
  Result<CliConfig> config = ResolveConfig(sources);
  ASSERT_OK(config);
  EXPECT_EQ(config->address, "http://env:2");
  EXPECT_EQ(config->token, "file-token");
}

TEST(ResolveConfig, MalformedLineNamesFileAndLine) {
  ConfigSources sources = AllSources();
  sources.file_text = "address = http://file:3\n# ok\nthis is not a setting\n";
  EXPECT_THAT(ResolveConfig(sources),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("/home/u/.config/gpufleet/config:3: expected \"key = value\"")));
}

TEST(ResolveConfig, UnknownKeyAndEmptyValueAreErrors) {
  EXPECT_THAT(ParseConfigFile("adress = x\n", "cfg"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cfg:1: unknown key \"adress\"")));
  EXPECT_THAT(ParseConfigFile("\n token =  \n", "cfg"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("cfg:2: empty value")));
}

class LoadConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    home_ = std::filesystem::temp_directory_path() /
            ("gpufleet_cli_config_" +
             std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(home_);
    std::filesystem::create_directories(home_ / ".config" / "gpufleet");
  }
  void TearDown() override { std::filesystem::remove_all(home_); }

  void WriteConfig(const std::string& text) {
    std::ofstream(home_ / ".config" / "gpufleet" / "config") << text;
  }

  std::filesystem::path home_;
};

TEST_F(LoadConfigTest, ReadsTheFileUnderHome) {
  WriteConfig("address = https://cluster:443\ntoken = secret\n");
  Result<CliConfig> config =
      LoadConfig(std::nullopt, std::nullopt, ConfigEnvironment{.home = home_.string()});
  ASSERT_OK(config);
  EXPECT_EQ(config->address, "https://cluster:443");
  EXPECT_EQ(config->token, "secret");

  config = LoadConfig(std::nullopt, "flag",
                      ConfigEnvironment{.address = "http://env:1", .home = home_.string()});
  ASSERT_OK(config);
  EXPECT_EQ(config->address, "http://env:1");
  EXPECT_EQ(config->token, "flag");
}

TEST_F(LoadConfigTest, CaCertFromFlagEnvironmentOrFile) {
  WriteConfig("address = https://cluster:443\nca_cert = /etc/gpufleet/ca.pem\n");
  Result<CliConfig> config =
      LoadConfig(std::nullopt, std::nullopt, ConfigEnvironment{.home = home_.string()});
  ASSERT_OK(config);
  EXPECT_EQ(config->ca_cert, "/etc/gpufleet/ca.pem");
  config = LoadConfig(std::nullopt, std::nullopt,
                      ConfigEnvironment{.ca_cert = "/env/ca.pem", .home = home_.string()});
  ASSERT_OK(config);
  EXPECT_EQ(config->ca_cert, "/env/ca.pem");
  config = LoadConfig(std::nullopt, std::nullopt,
                      ConfigEnvironment{.ca_cert = "/env/ca.pem", .home = home_.string()},
                      "/flag/ca.pem");
  ASSERT_OK(config);
  EXPECT_EQ(config->ca_cert, "/flag/ca.pem");
}

TEST_F(LoadConfigTest, MissingFileIsTheDefault) {
  Result<CliConfig> config =
      LoadConfig(std::nullopt, std::nullopt, ConfigEnvironment{.home = home_.string()});
  ASSERT_OK(config);
  EXPECT_EQ(config->address, kDefaultAddress);
  EXPECT_EQ(config->ca_cert, "");
}

TEST_F(LoadConfigTest, MalformedFileNamesItsPath) {
  WriteConfig("address http://x\n");
  EXPECT_THAT(LoadConfig(std::nullopt, std::nullopt, ConfigEnvironment{.home = home_.string()}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr((home_ / ".config/gpufleet/config").string() + ":1:")));
}

}  // namespace
}  // namespace gpufleet::cli
