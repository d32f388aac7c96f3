// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/event_groups.h"

#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace gpufleet::control {
namespace {

using wire::Json;

TEST(EventGroupKey, LeavesOutTheNumbers) {
  EXPECT_EQ(EventGroupKey("unschedulable: 32 lack free resources, 46.73 free"),
            "unschedulable: # lack free resources, # free");
  EXPECT_EQ(EventGroupKey("scheduled on node-3."), "scheduled on node-#.");
  EXPECT_EQ(EventGroupKey("no numbers"), "no numbers");
}

TEST(CountGroupedEvent, AHundredIdenticalCyclesAreOneEventCountedAHundredTimes) {
  Json job = Json::object();
  int appended = 0;
  for (int cycle = 0; cycle < 100; ++cycle) {
    const std::string now = fmt::format("2026-12-07T07:{:02}:00Z", 12 + cycle / 20);
    appended += CountGroupedEvent(job, "unschedulable: 8 lack free resources", now) ? 1 : 0;
  }
  EXPECT_EQ(appended, 1);
  const Json items =
      GroupEventItems(Json::array({{{"revision", 4},
                                    {"message", "unschedulable: 8 lack free resources"},
                                    {"at", "2026-12-07T07:12:00Z"}}}),
                      job);
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0]["count"], 100);
  EXPECT_EQ(items[0]["firstTime"], "2026-12-07T07:12:00Z");
  EXPECT_EQ(items[0]["lastTime"], "2026-12-07T07:16:00Z");
}

TEST(CountGroupedEvent, OtherFiguresCountAndADifferentReasonStartsANewEntry) {
  Json job = Json::object();
  EXPECT_TRUE(CountGroupedEvent(job, "unschedulable: 32 lack free resources, 46.73 free", "t1"));
  EXPECT_FALSE(CountGroupedEvent(job, "unschedulable: 30 lack free resources, 40 free", "t2"));
  EXPECT_TRUE(CountGroupedEvent(job, "unschedulable: queue \"cv\" is over its limit", "t3"));
  EXPECT_FALSE(CountGroupedEvent(job, "unschedulable: 29 lack free resources, 39.5 free", "t4"));
  const Json items = GroupEventItems(
      Json::array(
          {{{"revision", 2}, {"message", "submitted by alice"}},
           {{"revision", 3}, {"message", "unschedulable: 32 lack free resources, 46.73 free"}},
           {{"revision", 5}, {"message", "unschedulable: queue \"cv\" is over its limit"}}}),
      job);
  ASSERT_EQ(items.size(), 3u);
  // An entry of no group, as every entry stored before events were grouped: one event.
  EXPECT_EQ(items[0]["count"], 1);
  EXPECT_TRUE(items[0]["firstTime"].is_null());
  // The group's latest figures, its count and its span.
  EXPECT_EQ(items[1]["message"], "unschedulable: 29 lack free resources, 39.5 free");
  EXPECT_EQ(items[1]["count"], 3);
  EXPECT_EQ(items[1]["firstTime"], "t1");
  EXPECT_EQ(items[1]["lastTime"], "t4");
  EXPECT_EQ(items[2]["count"], 1);
  EXPECT_EQ(items[2]["lastTime"], "t3");
}

TEST(CountGroupedEvent, AJobKeepsABoundedNumberOfGroups) {
  Json job = Json::object();
  for (size_t i = 0; i < 3 * kMaxEventGroups; ++i) {
    // Distinct reasons (letters, not figures): each opens a group.
    EXPECT_TRUE(CountGroupedEvent(job, "unschedulable: " + std::string(i + 1, 'x'), "t"));
  }
  EXPECT_EQ(job["event_groups"].size(), kMaxEventGroups);
  ForgetEventGroups(job);
  EXPECT_FALSE(job.contains("event_groups"));
  EXPECT_TRUE(CountGroupedEvent(job, "unschedulable: x", "t")) << "a new attempt starts afresh";
}

}  // namespace
}  // namespace gpufleet::control
