// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <string>

namespace gpufleet::sim::testing {

// Non-overlapping occurrences of `needle` in `text`.
inline int CountOf(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos;
       pos = text.find(needle, pos + needle.size())) {
    ++count;
  }
  return count;
}

}  // namespace gpufleet::sim::testing
