// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>

namespace gpufleet {

using Duration = std::chrono::nanoseconds;

// A point on a monotonic time line (nanoseconds since an arbitrary origin). Used for intervals
// and ordering only; wall-clock times for people come from WallClock.
struct MonoTime {
  int64_t nanos = 0;

  friend auto operator<=>(const MonoTime&, const MonoTime&) = default;
  friend MonoTime operator+(MonoTime t, Duration d) { return MonoTime{t.nanos + d.count()}; }
  friend Duration operator-(MonoTime a, MonoTime b) { return Duration(a.nanos - b.nanos); }
};

// Source of monotonic time. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual MonoTime Now() const = 0;
};

// Source of wall-clock time (Unix nanoseconds) for user-facing timestamps. Thread-safe.
class WallClock {
 public:
  virtual ~WallClock() = default;
  virtual int64_t UnixNanos() const = 0;
};

// The real clocks; the only place (with random.cc and apps/) that reads the system's time.
class SystemClock final : public Clock, public WallClock {
 public:
  MonoTime Now() const override;
  int64_t UnixNanos() const override;
};

// A clock that moves only when told to. Thread-compatible: advance it from the test thread.
class FakeClock final : public Clock, public WallClock {
 public:
  explicit FakeClock(MonoTime start = MonoTime{}) : now_(start) {}
  MonoTime Now() const override { return now_; }
  int64_t UnixNanos() const override { return now_.nanos; }
  void Advance(Duration delta) { now_ = now_ + delta; }
  void Set(MonoTime time) { now_ = time; }

 private:
  MonoTime now_;
};

}  // namespace gpufleet
