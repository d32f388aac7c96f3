// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>

// Text for the reasons the policies give job owners ("GPUs under 10% for 30m ... at 14:05").
namespace gpufleet::policy {

// "30m", "1h30m", "45s", "2d3h": the largest two units from the first non-zero one, truncated
// ("1h" for 3605 s); "0s" for zero; negative spans with a leading "-".
std::string FormatSpan(int64_t seconds);

// "14:05": the time of day of `seconds` on its time line (UTC for Unix seconds), truncated to the
// minute; negative times count back from midnight.
std::string FormatClock(int64_t seconds);

// "10%", "12.5%", "100%" for a utilization or share in milli.
std::string FormatPercentMilli(int64_t milli);

}  // namespace gpufleet::policy
