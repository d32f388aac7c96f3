// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpufleet/core/status.h"

// Lenient readers of the server's own stored JSON documents: a missing or mistyped field reads as
// the fallback. They never throw. (Documents from clients are checked strictly instead.)
namespace gpufleet::wire {

using Json = nlohmann::json;

inline int64_t IntOr(const Json& j, std::string_view key, int64_t fallback) {
  if (!j.is_object()) {
    return fallback;
  }
  const auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

inline bool BoolOr(const Json& j, std::string_view key, bool fallback) {
  if (!j.is_object()) {
    return fallback;
  }
  const auto it = j.find(key);
  return it != j.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

inline std::string StrOr(const Json& j, std::string_view key, std::string fallback = "") {
  if (!j.is_object()) {
    return fallback;
  }
  const auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

inline const Json& ArrayOr(const Json& j, std::string_view key) {
  static const Json kEmpty = Json::array();
  if (!j.is_object()) {
    return kEmpty;
  }
  const auto it = j.find(key);
  return it != j.end() && it->is_array() ? *it : kEmpty;
}

inline std::map<std::string, std::string> StringMapOr(const Json& j, std::string_view key) {
  std::map<std::string, std::string> out;
  if (!j.is_object()) {
    return out;
  }
  const auto it = j.find(key);
  if (it == j.end() || !it->is_object()) {
    return out;
  }
  for (const auto& [k, v] : it->items()) {
    if (v.is_string()) {
      out[k] = v.get<std::string>();
    }
  }
  return out;
}

// `value` as an error message quotes it: compact JSON, cut to 80 characters.
std::string ShownValue(const Json& value);

// The one JSON parse for what the server, the agent and the CLI read: request bodies, stored
// documents and responses. nlohmann's parser is iterative, but copying, comparing and dump()
// recurse, so a value nested 100,000 deep (200 KB) overflowed a worker's stack: a value nested
// deeper than `max_depth` objects and arrays, or text longer than `max_bytes`, is refused before
// anything is built from it.
struct JsonLimits {
  int max_depth = 64;  // the deepest document the server writes nests about 8 deep
  size_t max_bytes = size_t{64} << 20;
};

// The value `text` holds. kInvalidArgument when it is not JSON ("not valid JSON: " and where),
// nests too deep ("JSON nested deeper than 64 levels") or is too long; the caller names its field.
Result<Json> ParseJson(std::string_view text, const JsonLimits& limits = {});

// ParseJson for the server's own stored documents: the object `text` holds, or an empty object
// when it holds no object within the limits (lenient, as the readers above).
Json ParseDocument(std::string_view text);

// ParseDocument without the top-level member `skipped` (and all under it): the scheduling view
// reads a job's state and placements thousands of times a cycle and never its spec, and building
// the spec's objects was most of that cost.
Json ParseDocumentWithout(std::string_view text, std::string_view skipped);

}  // namespace gpufleet::wire
