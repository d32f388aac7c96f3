// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/task_logs.h"

#include <string>

#include <gtest/gtest.h>

namespace gpufleet::control {
namespace {

TaskLogCache::Entry LogTail(const std::string& task_id, size_t bytes, int64_t size) {
  return {.node = "node-0",
          .report = {.task_id = task_id, .text = std::string(bytes, 'x'), .size = size}};
}

TEST(TaskLogCacheTest, ATaskKeepsItsLatestTail) {
  TaskLogCache cache(1000);
  EXPECT_FALSE(cache.Get("j/main-0/1").has_value());
  cache.Put(LogTail("j/main-0/1", 100, 100));
  cache.Put(LogTail("j/main-0/1", 300, 5000));
  const std::optional<TaskLogCache::Entry> kept = cache.Get("j/main-0/1");
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->report.size, 5000);
  EXPECT_EQ(cache.bytes(), 300u);
}

// The cache is bounded: past its bytes, the tails put longest ago go first, whatever their task.
TEST(TaskLogCacheTest, PastItsBoundTheTailsPutLongestAgoAreDropped) {
  TaskLogCache cache(1000);
  cache.Put(LogTail("a/main-0/1", 400, 400));
  cache.Put(LogTail("b/main-0/1", 400, 400));
  cache.Put(LogTail("a/main-0/1", 400, 800));  // a again: now b is the oldest
  cache.Put(LogTail("c/main-0/1", 400, 400));
  EXPECT_FALSE(cache.Get("b/main-0/1").has_value());
  EXPECT_TRUE(cache.Get("a/main-0/1").has_value());
  EXPECT_TRUE(cache.Get("c/main-0/1").has_value());
  EXPECT_EQ(cache.bytes(), 800u);
  // One tail larger than the whole bound is not kept at all.
  TaskLogCache tiny(10);
  tiny.Put(LogTail("a/main-0/1", 11, 11));
  EXPECT_FALSE(tiny.Get("a/main-0/1").has_value());
  EXPECT_EQ(tiny.bytes(), 0u);
}

}  // namespace
}  // namespace gpufleet::control
