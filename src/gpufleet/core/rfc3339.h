// SPDX-License-Identifier: Apache-2.0
// RFC 3339 times (what the server stamps on jobs and events, what users pass to --from and
// `since`), read and written in one place.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gpufleet/core/status.h"

namespace gpufleet {

// Unix nanoseconds as RFC 3339 in UTC to the second, e.g. "2026-11-29T20:39:00Z".
std::string FormatRfc3339(int64_t unix_nanos);

// "YYYY-MM-DDTHH:MM:SS", an optional fraction of a second (".5", up to nanoseconds; further
// digits are dropped), then "Z" or a numeric offset ("+01:00", "-05:30"), as Unix nanoseconds.
// Second 60 (a leap second) is read as the first second of the next minute, as the Unix time
// scale has no leap seconds. kInvalidArgument quoting `text` for anything else (a date that does
// not exist, hour 24, a missing zone, a space for the "T").
Result<int64_t> ParseRfc3339(std::string_view text);

}  // namespace gpufleet
