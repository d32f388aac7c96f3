// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/event_time_store.h"

#include <chrono>

#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"

namespace gpufleet::api {
namespace {

TEST(EventText, ATimeAtTheHeadIsReadApart) {
  const std::string stored = StampEventText(1796288177'000'000'000, "submitted by alice");
  EXPECT_EQ(stored, "@2026-12-03T08:56:17Z submitted by alice");
  const EventText text = ParseEventText(stored);
  EXPECT_EQ(text.at, "2026-12-03T08:56:17Z");
  EXPECT_EQ(text.message, "submitted by alice");
}

TEST(EventText, TextWithoutATimeIsAllMessage) {
  for (const std::string_view stored :
       {"", "placed on node-a", "@alice asked for it", "@2026-12-03T08:56:17Zx no space",
        "@2026-13-03T08:56:17Z month 13"}) {
    SCOPED_TRACE(stored);
    const EventText text = ParseEventText(stored);
    EXPECT_FALSE(text.at.has_value());
    EXPECT_EQ(text.message, stored);
  }
}

TEST(EventTimeStore, StampsEventsWithTheCommitsTimeAndKeepsTimesGivenBefore) {
  store::InMemoryStateStore inner;
  FakeClock clock;
  clock.Advance(std::chrono::seconds(1796288177));
  EventTimeStore timed(inner, clock);
  store::WriteBatch batch;
  batch.Create("jobs", "a", "{}");
  batch.AppendEvent("jobs", "a", "submitted");
  batch.AppendEvent("jobs", "a", "@2026-01-01T00:00:00Z moved with its time");
  ASSERT_OK(timed.Commit(batch));
  const Result<std::vector<store::StoredEvent>> events = timed.Events("jobs", "a");
  ASSERT_OK(events);
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].text, "@2026-12-03T08:56:17Z submitted");
  EXPECT_EQ((*events)[1].text, "@2026-01-01T00:00:00Z moved with its time");
  // Everything else is the inner store's.
  EXPECT_EQ(inner.Get("jobs", "a")->data, "{}");
  EXPECT_EQ(*timed.Revision(), *inner.Revision());
  EXPECT_EQ(timed.List("jobs")->size(), 1u);
}

}  // namespace
}  // namespace gpufleet::api
