// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/json_fields.h"

#include <utility>

#include <fmt/format.h>

namespace gpufleet::wire {
namespace {

// Parses `text`, leaving out the top-level member `skipped` when it is not empty. A container
// that would nest deeper than the limit is discarded as the parser meets it (so nothing deep is
// ever built) and the parse reports it once it has read the rest.
Result<Json> ParseWithin(std::string_view text, const JsonLimits& limits,
                         std::string_view skipped) {
  if (text.size() > limits.max_bytes) {
    return InvalidArgumentError(
        fmt::format("{} bytes of JSON, more than {}", text.size(), limits.max_bytes));
  }
  bool too_deep = false;
  const auto keep = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if ((event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) &&
        depth >= limits.max_depth) {
      too_deep = true;
      return false;
    }
    return skipped.empty() ||
           !(depth == 1 && event == Json::parse_event_t::key && parsed == skipped);
  };
  try {
    Json value = Json::parse(text.begin(), text.end(), keep);
    if (too_deep) {
      return InvalidArgumentError(
          fmt::format("JSON nested deeper than {} levels", limits.max_depth));
    }
    return value;
  } catch (const Json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: ..." without its tag.
    std::string_view what = e.what();
    if (const size_t tag_end = what.find("] "); tag_end != std::string_view::npos) {
      what.remove_prefix(tag_end + 2);
    }
    return InvalidArgumentError(fmt::format("not valid JSON: {}", what));
  }
}

Json ObjectOrEmpty(Result<Json> parsed) {
  return parsed.ok() && parsed->is_object() ? std::move(parsed).value() : Json::object();
}

}  // namespace

Result<Json> ParseJson(std::string_view text, const JsonLimits& limits) {
  return ParseWithin(text, limits, "");
}

std::string ShownValue(const Json& value) {
  std::string text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

Json ParseDocument(std::string_view text) {
  return ObjectOrEmpty(ParseWithin(text, {}, ""));
}

Json ParseDocumentWithout(std::string_view text, std::string_view skipped) {
  return ObjectOrEmpty(ParseWithin(text, {}, skipped));
}

}  // namespace gpufleet::wire
