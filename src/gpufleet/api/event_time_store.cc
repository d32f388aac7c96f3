// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/event_time_store.h"

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/core/rfc3339.h"

namespace gpufleet::api {
namespace {

// "@" + RFC 3339 to the second + " ": 22 bytes.
constexpr size_t kStampBytes = 22;

}  // namespace

std::string StampEventText(int64_t unix_nanos, std::string_view text) {
  return fmt::format("@{} {}", FormatRfc3339(unix_nanos), text);
}

EventText ParseEventText(std::string_view stored) {
  if (stored.size() < kStampBytes || stored[0] != '@' || stored[kStampBytes - 1] != ' ') {
    return {.at = std::nullopt, .message = stored};
  }
  const std::string_view at = stored.substr(1, kStampBytes - 2);
  if (!ParseRfc3339(at).ok()) {
    return {.at = std::nullopt, .message = stored};
  }
  return {.at = std::string(at), .message = stored.substr(kStampBytes)};
}

Result<store::StoredObject> EventTimeStore::DoGet(std::string_view kind, std::string_view name) {
  return inner_.Get(kind, name);
}

Result<std::vector<store::StoredObject>> EventTimeStore::DoList(std::string_view kind,
                                                                std::string_view name_prefix) {
  return inner_.List(kind, name_prefix);
}

Result<std::vector<store::StoredObject>> EventTimeStore::DoListWhere(
    std::string_view kind, const store::ListFilter& filter) {
  return inner_.ListWhere(kind, filter);
}

Status EventTimeStore::DoCommit(const store::WriteBatch& batch) {
  const int64_t now = wall_clock_.UnixNanos();
  store::WriteBatch stamped;
  for (const store::WriteOp& op : batch.ops()) {
    switch (op.type) {
      case store::WriteOpType::kCreate:
        stamped.Create(op.kind, op.name, op.data);
        break;
      case store::WriteOpType::kUpdate:
        stamped.Update(op.kind, op.name, op.data, op.expected_version);
        break;
      case store::WriteOpType::kDelete:
        stamped.Delete(op.kind, op.name, op.expected_version);
        break;
      case store::WriteOpType::kAppendEvent:
        // An event copied with its time (an object moved to a new key) keeps that time.
        stamped.AppendEvent(op.kind, op.name,
                            ParseEventText(op.data).at ? op.data : StampEventText(now, op.data));
        break;
      case store::WriteOpType::kDeleteEvents:
        stamped.DeleteEvents(op.kind, op.name);
        break;
    }
  }
  return inner_.Commit(stamped);
}

Result<int64_t> EventTimeStore::DoRevision() {
  return inner_.Revision();
}

Result<std::vector<store::StoredEvent>> EventTimeStore::DoEvents(std::string_view kind,
                                                                 std::string_view name) {
  return inner_.Events(kind, name);
}

}  // namespace gpufleet::api
