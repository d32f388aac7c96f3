// SPDX-License-Identifier: Apache-2.0
#include "config_file.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace gpufleet::app {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A command shaped like `gpufleet server`: options of each kind, a check and a `needs`.
struct Command {
  Command() {
    cmd = app.add_subcommand("server", "test");
    AddConfigFlags(*cmd);
    cmd->add_option("--listen", listen, "HOST:PORT");
    cmd->add_option("--cycle-interval-ms", cycle_ms, "ms")->check(CLI::Range(1, 60000));
    cmd->add_option("--policy", policy, "policy")->check(CLI::IsMember({"fgd", "best-fit"}));
    cmd->add_option("--store", store, "store");
    cmd->add_option("--peer", peers, "peers");
    CLI::Option* reclaim = cmd->add_flag("--idle-reclaim", idle_reclaim, "reclaim");
    cmd->add_option("--idle-reclaim-after-s", reclaim_after_s, "s")->needs(reclaim);
  }

  // Parses `args` (after "server") and applies the file at `path`.
  Status Run(std::vector<std::string> args, const std::string& path) {
    args.insert(args.begin(), "server");
    std::reverse(args.begin(), args.end());  // CLI11 takes them last first
    app.parse(args);
    return ApplyConfigFile(*cmd, path);
  }

  CLI::App app{"test"};
  CLI::App* cmd = nullptr;
  std::string listen = "127.0.0.1:8080";
  int cycle_ms = 1000;
  std::string policy = "fgd";
  std::string store;
  std::vector<std::string> peers;
  bool idle_reclaim = false;
  int reclaim_after_s = 3600;
};

class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/gpufleet-config-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& text) {
    const std::string path = (dir_ / "server.yaml").string();
    std::ofstream(path) << text;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(ConfigFileTest, FileSetsEveryKindOfOption) {
  Command command;
  const std::string path = Write(
      "listen: 0.0.0.0:9090\ncycle-interval-ms: 250\npolicy: best-fit\n"
      "peer: [a:1, b:2]\nidle-reclaim: true\nidle-reclaim-after-s: 60\n");
  ASSERT_TRUE(command.Run({}, path).ok());
  EXPECT_EQ(command.listen, "0.0.0.0:9090");
  EXPECT_EQ(command.cycle_ms, 250);
  EXPECT_EQ(command.policy, "best-fit");
  EXPECT_EQ(command.peers, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_TRUE(command.idle_reclaim);
  EXPECT_EQ(command.reclaim_after_s, 60);
}

TEST_F(ConfigFileTest, FlagsOverrideTheFile) {
  Command command;
  const std::string path = Write("listen: 0.0.0.0:9090\ncycle-interval-ms: 250\n");
  ASSERT_TRUE(command.Run({"--listen", "10.0.0.1:80"}, path).ok());
  EXPECT_EQ(command.listen, "10.0.0.1:80");
  EXPECT_EQ(command.cycle_ms, 250);
}

TEST_F(ConfigFileTest, EmptyFileSetsNothing) {
  Command command;
  ASSERT_TRUE(command.Run({}, Write("# nothing yet\n")).ok());
  EXPECT_EQ(command.listen, "127.0.0.1:8080");
}

TEST_F(ConfigFileTest, ErrorsNameFileLineKeyAndValue) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"listen: a:1\nlisen: 0.0.0.0:1\n", ":2: unknown key \"lisen\" (value \"0.0.0.0:1\")"},
      {"cycle-interval-ms: fast\n", ":1: cycle-interval-ms: bad value \"fast\""},
      {"cycle-interval-ms: 0\n", ":1: cycle-interval-ms: bad value \"0\""},
      {"policy: magic\n", ":1: policy: bad value \"magic\""},
      {"listen: [a:1, b:2]\n", ":1: listen: bad value \"[a:1, b:2]\": expected one value"},
      {"listen: {host: a}\n", ":1: listen: bad value \"{host: a}\": expected a plain value"},
      {"listen:\n", ":1: listen: bad value \"\": no value"},
      {"idle-reclaim: maybe\n", ":1: idle-reclaim: bad value \"maybe\": expected true or false"},
      {"config: other.yaml\n", ":1: unknown key \"config\""},
      {"help: true\n", ":1: unknown key \"help\""},
      {"idle-reclaim-after-s: 60\n", "idle-reclaim-after-s needs --idle-reclaim"},
      {"- listen\n", ":1: expected a mapping of settings"},
      {"listen: [a\n", "malformed YAML"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    Command command;
    const std::string path = Write(c.text);
    const Status status = command.Run({}, path);
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(path));
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

TEST_F(ConfigFileTest, MissingFileIsNotFound) {
  Command command;
  const Status status = command.Run({}, (dir_ / "absent.yaml").string());
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("absent.yaml"));
}

TEST_F(ConfigFileTest, EffectiveConfigShowsFlagsFileAndDefaultsAndReadsBack) {
  Command command;
  const std::string path = Write("cycle-interval-ms: 250\nstore: postgresql://gf:hunter2@db/gf\n");
  ASSERT_TRUE(command.Run({"--policy", "best-fit"}, path).ok());
  const std::string rendered = RenderEffectiveConfig(*command.cmd);
  EXPECT_THAT(rendered, HasSubstr("listen: \"127.0.0.1:8080\"\n"));
  EXPECT_THAT(rendered, HasSubstr("cycle-interval-ms: \"250\"\n"));
  EXPECT_THAT(rendered, HasSubstr("policy: \"best-fit\"\n"));
  EXPECT_THAT(rendered, HasSubstr("store: \"postgresql://gf:***@db/gf\"\n"));
  EXPECT_THAT(rendered, HasSubstr("peer: []\n"));
  EXPECT_THAT(rendered, HasSubstr("idle-reclaim: false\n"));
  EXPECT_THAT(rendered, Not(HasSubstr("config")));
  EXPECT_THAT(rendered, Not(HasSubstr("hunter2")));

  // The printed configuration is itself a valid file giving the same settings.
  Command again;
  ASSERT_TRUE(again.Run({}, Write(rendered)).ok());
  EXPECT_EQ(again.cycle_ms, 250);
  EXPECT_EQ(again.policy, "best-fit");
  EXPECT_EQ(again.listen, "127.0.0.1:8080");
}

}  // namespace
}  // namespace gpufleet::app
