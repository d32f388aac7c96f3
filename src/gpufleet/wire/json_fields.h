// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

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

inline Json ParseDocument(const std::string& text) {
  Json j = Json::parse(text, nullptr, false);
  return j.is_object() ? j : Json::object();
}

// ParseDocument without the top-level member `skipped` (and all under it): the scheduling view
// reads a job's state and placements thousands of times a cycle and never its spec, and building
// the spec's objects was most of that cost.
inline Json ParseDocumentWithout(const std::string& text, std::string_view skipped) {
  Json j = Json::parse(
      text,
      [skipped](int depth, Json::parse_event_t event, Json& parsed) {
        return !(depth == 1 && event == Json::parse_event_t::key && parsed == skipped);
      },
      false);
  return j.is_object() ? j : Json::object();
}

}  // namespace gpufleet::wire
