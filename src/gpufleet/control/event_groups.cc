// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/event_groups.h"

#include <cctype>
#include <map>

namespace gpufleet::control {
namespace {

constexpr std::string_view kGroupsField = "event_groups";

bool IsDigit(char c) {
  return std::isdigit(static_cast<unsigned char>(c)) != 0;
}

}  // namespace

std::string EventGroupKey(std::string_view message) {
  std::string key;
  key.reserve(message.size());
  for (size_t i = 0; i < message.size(); ++i) {
    if (!IsDigit(message[i])) {
      key += message[i];
      continue;
    }
    // 46.73 is one number; "node-3." ends a sentence after one.
    while (i + 1 < message.size() &&
           (IsDigit(message[i + 1]) ||
            (message[i + 1] == '.' && i + 2 < message.size() && IsDigit(message[i + 2])))) {
      ++i;
    }
    key += '#';
  }
  return key;
}

bool CountGroupedEvent(wire::Json& job, std::string_view event, std::string_view now) {
  wire::Json& groups = job[std::string(kGroupsField)];
  if (!groups.is_array()) {
    groups = wire::Json::array();
  }
  const std::string key = EventGroupKey(event);
  for (wire::Json& group : groups) {
    if (wire::StrOr(group, "key") == key) {
      group["message"] = event;
      group["count"] = wire::IntOr(group, "count", 1) + 1;
      group["last"] = now;
      return false;
    }
  }
  if (groups.size() >= kMaxEventGroups) {
    groups.erase(groups.begin());
  }
  groups.push_back({{"key", key}, {"message", event}, {"count", 1}, {"first", now}, {"last", now}});
  return true;
}

void ForgetEventGroups(wire::Json& job) {
  job.erase(std::string(kGroupsField));
}

wire::Json GroupEventItems(wire::Json items, const wire::Json& job) {
  // The latest log entry of each group.
  std::map<std::string, size_t> latest;
  for (size_t i = 0; i < items.size(); ++i) {
    latest[EventGroupKey(wire::StrOr(items[i], "message"))] = i;
  }
  for (wire::Json& item : items) {
    const wire::Json at = item.contains("at") ? item["at"] : wire::Json();
    item["count"] = 1;
    item["firstTime"] = at;
    item["lastTime"] = at;
  }
  for (const wire::Json& group : wire::ArrayOr(job, kGroupsField)) {
    const auto it = latest.find(wire::StrOr(group, "key"));
    if (it == latest.end()) {
      continue;  // its entry is gone (the log was cut)
    }
    wire::Json& item = items[it->second];
    item["message"] = wire::StrOr(group, "message");
    item["count"] = wire::IntOr(group, "count", 1);
    // The log's own time of its first event where the server stamped one.
    if (!item.contains("at")) {
      item["firstTime"] = wire::StrOr(group, "first");
    }
    if (const std::string last = wire::StrOr(group, "last"); !last.empty()) {
      item["lastTime"] = last;
    }
  }
  return items;
}

}  // namespace gpufleet::control
