// SPDX-License-Identifier: Apache-2.0
// Small text helpers the runners share. Private to the runner module.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace gpufleet::runner::internal {

// "a,b" -> {"a", "b"}; "" -> {}.
inline std::vector<std::string> SplitCommas(std::string_view text) {
  std::vector<std::string> items;
  while (!text.empty()) {
    const size_t comma = text.find(',');
    items.emplace_back(text.substr(0, comma));
    text = comma == std::string_view::npos ? std::string_view() : text.substr(comma + 1);
  }
  return items;
}

}  // namespace gpufleet::runner::internal
