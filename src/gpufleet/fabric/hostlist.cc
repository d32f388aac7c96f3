// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fabric/hostlist.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <map>

#include <fmt/format.h>

namespace gpufleet::fabric {
namespace {

constexpr size_t kMaxNames = 1000000;

// Splits at commas outside brackets.
std::vector<std::string_view> SplitTopLevel(std::string_view text) {
  std::vector<std::string_view> parts;
  int depth = 0;
  size_t begin = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') {
      ++depth;
    } else if (text[i] == ']') {
      --depth;
    } else if (text[i] == ',' && depth == 0) {
      parts.push_back(text.substr(begin, i - begin));
      begin = i + 1;
    }
  }
  parts.push_back(text.substr(begin));
  return parts;
}

bool AllDigits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Result<uint64_t> ToNumber(std::string_view digits, std::string_view hostlist) {
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (!AllDigits(digits) || error != std::errc() || end != digits.data() + digits.size()) {
    return InvalidArgumentError(
        fmt::format("hostlist \"{}\": \"{}\" is not a number or range", hostlist, digits));
  }
  return value;
}

// The numbers of one bracket body, "0-3,7", formatted with their widths.
Result<std::vector<std::string>> ExpandBracket(std::string_view body, std::string_view hostlist) {
  std::vector<std::string> values;
  for (std::string_view item : SplitTopLevel(body)) {
    const size_t dash = item.find('-');
    const std::string_view first = item.substr(0, dash);
    GPUFLEET_ASSIGN_OR_RETURN(const uint64_t low, ToNumber(first, hostlist));
    uint64_t high = low;
    if (dash != std::string_view::npos) {
      GPUFLEET_ASSIGN_OR_RETURN(high, ToNumber(item.substr(dash + 1), hostlist));
    }
    if (high < low) {
      return InvalidArgumentError(
          fmt::format("hostlist \"{}\": range \"{}\" runs backwards", hostlist, item));
    }
    if (high - low >= kMaxNames) {
      return InvalidArgumentError(
          fmt::format("hostlist \"{}\": range \"{}\" is too long", hostlist, item));
    }
    const size_t width = first.size() > 1 && first[0] == '0' ? first.size() : 0;
    for (uint64_t v = low; v <= high; ++v) {
      values.push_back(fmt::format("{:0{}}", v, width));
    }
  }
  return values;
}

Status ExpandOne(std::string_view entry, std::string_view hostlist, std::vector<std::string>& out) {
  std::vector<std::string> partial = {""};
  size_t i = 0;
  while (i < entry.size()) {
    const size_t open = entry.find('[', i);
    const size_t close_before = entry.find(']', i);
    if (close_before != std::string_view::npos &&
        (open == std::string_view::npos || close_before < open)) {
      return InvalidArgumentError(fmt::format("hostlist \"{}\": unbalanced ']'", hostlist));
    }
    const std::string_view literal =
        entry.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    for (std::string& name : partial) {
      name += literal;
    }
    if (open == std::string_view::npos) {
      break;
    }
    const size_t close = entry.find(']', open);
    if (close == std::string_view::npos) {
      return InvalidArgumentError(fmt::format("hostlist \"{}\": unbalanced '['", hostlist));
    }
    GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::string> values,
                              ExpandBracket(entry.substr(open + 1, close - open - 1), hostlist));
    if (partial.size() * values.size() + out.size() > kMaxNames) {
      return InvalidArgumentError(
          fmt::format("hostlist \"{}\": more than {} names", hostlist, kMaxNames));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * values.size());
    for (const std::string& name : partial) {
      for (const std::string& value : values) {
        next.push_back(name + value);
      }
    }
    partial = std::move(next);
    i = close + 1;
  }
  for (std::string& name : partial) {
    if (name.empty()) {
      return InvalidArgumentError(fmt::format("hostlist \"{}\": empty name", hostlist));
    }
    out.push_back(std::move(name));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::string>> ExpandHostlist(std::string_view hostlist) {
  std::vector<std::string> names;
  if (hostlist.empty()) {
    return InvalidArgumentError("hostlist is empty");
  }
  for (std::string_view entry : SplitTopLevel(hostlist)) {
    GPUFLEET_RETURN_IF_ERROR(ExpandOne(entry, hostlist, names));
  }
  return names;
}

std::string CompressHostlist(const std::vector<std::string>& names) {
  struct Number {
    uint64_t value;
    std::string digits;
  };
  // Prefix -> numbers, prefixes in order of first appearance; names without a trailing number
  // stand alone.
  std::vector<std::string> order;
  std::map<std::string, std::vector<Number>> by_prefix;
  std::map<std::string, bool> plain;
  for (const std::string& name : names) {
    size_t start = name.size();
    while (start > 0 && name[start - 1] >= '0' && name[start - 1] <= '9') {
      --start;
    }
    const std::string digits = name.substr(start);
    uint64_t value = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (digits.empty() || digits.size() > 18 || error != std::errc()) {
      if (!plain.emplace(name, true).second) {
        continue;
      }
      order.push_back("\x01" + name);
      continue;
    }
    const std::string prefix = name.substr(0, start);
    auto [it, inserted] = by_prefix.try_emplace(prefix);
    if (inserted) {
      order.push_back(prefix);
    }
    it->second.push_back(Number{value, digits});
  }
  std::vector<std::string> parts;
  for (const std::string& key : order) {
    if (!key.empty() && key[0] == '\x01') {
      parts.push_back(key.substr(1));
      continue;
    }
    std::vector<Number>& numbers = by_prefix[key];
    // One width for the group when every number has the same number of digits; natural numbers
    // when none is zero-padded; otherwise one group per width.
    std::map<size_t, std::vector<Number>> by_width;
    const bool same_length = std::all_of(numbers.begin(), numbers.end(), [&](const Number& n) {
      return n.digits.size() == numbers.front().digits.size();
    });
    const bool padded = std::any_of(numbers.begin(), numbers.end(), [](const Number& n) {
      return n.digits.size() > 1 && n.digits[0] == '0';
    });
    for (Number& number : numbers) {
      const size_t width = same_length ? number.digits.size() : (padded ? number.digits.size() : 0);
      by_width[width].push_back(std::move(number));
    }
    for (auto& [width, group] : by_width) {
      std::sort(group.begin(), group.end(),
                [](const Number& a, const Number& b) { return a.value < b.value; });
      group.erase(std::unique(group.begin(), group.end(),
                              [](const Number& a, const Number& b) { return a.value == b.value; }),
                  group.end());
      if (group.size() == 1) {
        parts.push_back(key + group[0].digits);
        continue;
      }
      std::vector<std::string> ranges;
      size_t i = 0;
      while (i < group.size()) {
        size_t j = i;
        while (j + 1 < group.size() && group[j + 1].value == group[j].value + 1) {
          ++j;
        }
        ranges.push_back(i == j ? group[i].digits
                                : fmt::format("{}-{}", group[i].digits, group[j].digits));
        i = j + 1;
      }
      parts.push_back(fmt::format("{}[{}]", key, fmt::join(ranges, ",")));
    }
  }
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace gpufleet::fabric
