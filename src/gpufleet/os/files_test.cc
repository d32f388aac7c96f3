// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/os/files.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::os {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

// A fresh directory under the test's temporary directory, removed at the end.
class ScratchDirectory {
 public:
  ScratchDirectory() {
    std::string pattern = ::testing::TempDir() + "gpufleet_os_XXXXXX";
    path_ = mkdtemp(pattern.data()) != nullptr ? pattern : "";
  }
  ~ScratchDirectory() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(UniqueFd, ClosesWhatItOwnsAndHandsItOver) {
  int raw = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  {
    UniqueFd owner(raw);
    UniqueFd moved(std::move(owner));
    EXPECT_FALSE(owner.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
    EXPECT_EQ(moved.get(), raw);
  }
  EXPECT_EQ(fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);

  raw = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(raw, 0);
  UniqueFd released(raw);
  EXPECT_EQ(released.Release(), raw);
  EXPECT_FALSE(released.valid());
  EXPECT_NE(fcntl(raw, F_GETFD), -1);
  close(raw);
}

TEST(ReadSmallFile, ContentOrNothingWhenAbsent) {
  ScratchDirectory dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/state";
  const Result<std::optional<std::string>> absent = ReadSmallFile(path);
  ASSERT_OK(absent);
  EXPECT_EQ(*absent, std::nullopt);

  const std::string big(10'000, 'x');  // more than one read
  ASSERT_OK(WriteFileAtomically(path, big));
  const Result<std::optional<std::string>> read = ReadSmallFile(path);
  ASSERT_OK(read);
  EXPECT_EQ(*read, big);

  EXPECT_THAT(ReadSmallFile(dir.path()), StatusIs(StatusCode::kUnavailable, HasSubstr(dir.path())));
}

TEST(WriteFileAtomically, ReplacesTheFileWholeWithTheModeAndNoTemporaryLeft) {
  ScratchDirectory dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string path = dir.path() + "/token";
  const mode_t umask_bits = umask(0);
  umask(umask_bits);
  for (const Durability durability : {Durability::kProcessCrash, Durability::kMachineCrash}) {
    ASSERT_OK(WriteFileAtomically(path, "first\n", durability));
    ASSERT_OK(WriteFileAtomically(path, "second\n", durability, 0640));
    EXPECT_EQ(*ReadSmallFile(path), "second\n");
    EXPECT_FALSE(std::filesystem::exists(path + std::string(kAtomicWriteSuffix)));
    struct stat info = {};
    ASSERT_EQ(stat(path.c_str(), &info), 0);
    EXPECT_EQ(info.st_mode & 0777, 0640U & ~umask_bits);
    ASSERT_EQ(unlink(path.c_str()), 0);
  }
  ASSERT_OK(WriteFileAtomically(path, "secret\n"));
  struct stat info = {};
  ASSERT_EQ(stat(path.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600U & ~umask_bits);
}

TEST(WriteFileAtomically, FailsNamingThePathAndLeavesTheOldFile) {
  ScratchDirectory dir;
  ASSERT_FALSE(dir.path().empty());
  EXPECT_THAT(WriteFileAtomically(dir.path() + "/missing/file", "x"),
              StatusIs(StatusCode::kUnavailable, HasSubstr(dir.path() + "/missing/file.tmp")));
  // A directory in the way of the rename: the temporary file is removed again.
  const std::string blocked = dir.path() + "/blocked";
  ASSERT_TRUE(std::filesystem::create_directory(blocked));
  ASSERT_TRUE(std::filesystem::create_directory(blocked + "/inside"));
  EXPECT_THAT(WriteFileAtomically(blocked, "x"),
              StatusIs(StatusCode::kUnavailable, HasSubstr("cannot rename")));
  EXPECT_FALSE(std::filesystem::exists(blocked + std::string(kAtomicWriteSuffix)));
  EXPECT_TRUE(std::filesystem::is_directory(blocked + "/inside"));
}

TEST(ErrnoText, TheSystemsText) {
  EXPECT_EQ(ErrnoText(ENOENT), "No such file or directory");
}

}  // namespace
}  // namespace gpufleet::os
