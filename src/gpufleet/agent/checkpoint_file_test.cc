// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/checkpoint_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

TEST(CheckpointLine, ReadsUnixSecondsWithOrWithoutAFractionOrANote) {
  EXPECT_EQ(ParseCheckpointLine("1765119600").value(), 1765119600);
  EXPECT_EQ(ParseCheckpointLine("1765119600.75").value(), 1765119600);
  EXPECT_EQ(ParseCheckpointLine("1765119600 step=1200 ckpt/step-1200.pt").value(), 1765119600);
  EXPECT_EQ(ParseCheckpointLine("1765119600.5\tstep=3").value(), 1765119600);
}

TEST(CheckpointLine, RefusesWhatIsNotATime) {
  for (const char* line : {"", "step=1200", "17651196OO", "-5", "1765119600x", " 1765119600"}) {
    SCOPED_TRACE(line);
    EXPECT_THAT(ParseCheckpointLine(line),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("not a number")));
  }
  for (const char* line : {"0", "4000000001", "99999999999999999999999"}) {
    SCOPED_TRACE(line);
    EXPECT_THAT(ParseCheckpointLine(line),
                StatusIs(StatusCode::kInvalidArgument, HasSubstr("out of range")));
  }
}

class CheckpointFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_checkpoint_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    dir_ = pattern;
    path_ = dir_ + "/task.checkpoint";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Append(const std::string& text) const {
    std::ofstream out(path_, std::ios::app);
    out << text;
  }

  std::string dir_;
  std::string path_;
};

TEST_F(CheckpointFileTest, ReadsTheLastCompleteLine) {
  EXPECT_THAT(ReadCheckpointFile(path_), StatusIs(StatusCode::kNotFound));
  Append("");
  Result<CheckpointRead> read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_FALSE(read->unix_seconds.has_value());
  EXPECT_EQ(read->rejected, "");

  Append("1765119600 step=100\n1765119900 step=200\n");
  read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_EQ(read->unix_seconds, 1765119900);
  EXPECT_EQ(read->size, 40);

  // A line still being written is left for the next read.
  Append("1765120200 st");
  read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_EQ(read->unix_seconds, 1765119900);
  Append("ep=300\n");
  read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_EQ(read->unix_seconds, 1765120200);
}

TEST_F(CheckpointFileTest, IgnoresAMalformedOrOverlongLastLine) {
  Append("1765119600\nsaved!\n");
  Result<CheckpointRead> read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_FALSE(read->unix_seconds.has_value());
  EXPECT_EQ(read->rejected, "not a number");

  Append("1765119900 " + std::string(kMaxCheckpointLineBytes, 'x') + "\n");
  read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_FALSE(read->unix_seconds.has_value());
  EXPECT_EQ(read->rejected, "line too long");

  // A huge file costs one bounded read of its end.
  Append(std::string(1 << 20, 'y'));
  read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_EQ(read->rejected, "line too long");
}

TEST_F(CheckpointFileTest, RefusesALinkOrAFileThatIsNotRegular) {
  const std::string target = dir_ + "/secret";
  std::ofstream(target) << "1765119600\n";
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  Result<CheckpointRead> read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_EQ(read->rejected, "a symbolic link");
  EXPECT_FALSE(read->unix_seconds.has_value());

  ASSERT_EQ(unlink(path_.c_str()), 0);
  // A FIFO would block a plain open until someone writes.
  ASSERT_EQ(mkfifo(path_.c_str(), 0600), 0);
  read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_EQ(read->rejected, "not a regular file");

  ASSERT_EQ(unlink(path_.c_str()), 0);
  ASSERT_EQ(mkdir(path_.c_str(), 0700), 0);
  read = ReadCheckpointFile(path_);
  ASSERT_OK(read);
  EXPECT_EQ(read->rejected, "not a regular file");
}

}  // namespace
}  // namespace gpufleet::agent
