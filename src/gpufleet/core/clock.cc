// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/core/clock.h"

namespace gpufleet {

MonoTime SystemClock::Now() const {
  return MonoTime{
      std::chrono::duration_cast<Duration>(std::chrono::steady_clock::now().time_since_epoch())
          .count()};
}

int64_t SystemClock::UnixNanos() const {
  return std::chrono::duration_cast<Duration>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace gpufleet
