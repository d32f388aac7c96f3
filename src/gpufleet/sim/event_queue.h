// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

namespace gpufleet::sim {

// The simulator's clock: events ordered by (time, sequence), so events at the same time run in
// the order they were scheduled and a run is deterministic. Time is in seconds of simulated time.
// Not thread-safe.
class EventQueue {
 public:
  using Callback = std::function<void()>;

  // REQUIRES: time >= now().
  void ScheduleAt(int64_t time, Callback callback);
  void ScheduleAfter(int64_t delay, Callback callback) {
    ScheduleAt(now_ + delay, std::move(callback));
  }

  // Runs the next event, advancing now(); false when none is left.
  bool RunNext();
  bool empty() const { return events_.empty(); }
  int64_t now() const { return now_; }
  // Time of the next event. REQUIRES: !empty().
  int64_t next_time() const { return events_.top().time; }

 private:
  struct Event {
    int64_t time;
    uint64_t sequence;
    Callback callback;
  };
  struct Later {
    bool operator()(const Event& a, const Event& b) const {
      return a.time != b.time ? a.time > b.time : a.sequence > b.sequence;
    }
  };

  std::priority_queue<Event, std::vector<Event>, Later> events_;
  uint64_t next_sequence_ = 0;
  int64_t now_ = 0;
};

}  // namespace gpufleet::sim
