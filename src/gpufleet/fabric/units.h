// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gpufleet/core/status.h"

// Link speeds and bandwidths as integers: megabits per second. Network speeds are written in bits
// ("400G", "400Gb/s", "1.6T"), NVLink bandwidths usually in bytes ("450GB/s"); both parse here.
namespace gpufleet::fabric {

inline constexpr int64_t kMbpsPerGbps = 1000;

// "400G", "400Gb/s", "400Gbps", "100M", "1.6T", "1.6Tb/s" (bits) or "450GB/s", "1.8TB/s"
// (bytes, times 8) to Mb/s. A bare number is Gb/s. kInvalidArgument naming `field` and the text
// for anything else, and for a negative or zero speed.
Result<int64_t> ParseSpeedMbps(std::string_view text, std::string_view field);

// "400G" for 400000, "1.6T" for 1600000, "25G", "100M": the shortest exact form in bits.
std::string FormatSpeed(int64_t mbps);
// "450GB/s" for 3600000: bytes per second, for NVLink figures.
std::string FormatByteSpeed(int64_t mbps);
// "204.8 Tb/s", "12.8 Tb/s", "400 Gb/s": for reports.
std::string FormatBandwidth(double mbps);

// Gigabytes per second (10^9 bytes) from Mb/s.
inline double GigabytesPerSecond(int64_t mbps) {
  return static_cast<double>(mbps) / 8000.0;
}

}  // namespace gpufleet::fabric
