// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/event_queue.h"

#include <utility>

namespace gpufleet::sim {

void EventQueue::ScheduleAt(int64_t time, Callback callback) {
  events_.push(Event{time < now_ ? now_ : time, next_sequence_++, std::move(callback)});
}

bool EventQueue::RunNext() {
  if (events_.empty()) {
    return false;
  }
  // Copy out before popping: the callback may schedule more events.
  Event event = events_.top();
  events_.pop();
  now_ = event.time;
  event.callback();
  return true;
}

}  // namespace gpufleet::sim
