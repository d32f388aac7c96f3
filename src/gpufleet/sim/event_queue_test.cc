// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/event_queue.h"

#include <string>

#include <gtest/gtest.h>

namespace gpufleet::sim {
namespace {

TEST(EventQueue, RunsByTimeThenBySchedulingOrder) {
  EventQueue queue;
  std::string log;
  queue.ScheduleAt(10, [&] { log += "b"; });
  queue.ScheduleAt(5, [&] { log += "a"; });
  queue.ScheduleAt(10, [&] { log += "c"; });
  queue.ScheduleAt(10, [&] {
    log += "d";
    queue.ScheduleAfter(0, [&] { log += "e"; });  // same time, after the others
  });
  while (queue.RunNext()) {
  }
  EXPECT_EQ(log, "abcde");
  EXPECT_EQ(queue.now(), 10);
}

TEST(EventQueue, PastTimesRunNow) {
  EventQueue queue;
  int64_t seen = -1;
  queue.ScheduleAt(7, [&] { queue.ScheduleAt(3, [&] { seen = queue.now(); }); });
  while (queue.RunNext()) {
  }
  EXPECT_EQ(seen, 7);
}

}  // namespace
}  // namespace gpufleet::sim
