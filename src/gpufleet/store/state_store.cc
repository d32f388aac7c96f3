// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/state_store.h"

#include <algorithm>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "gpufleet/core/json_scan.h"

namespace gpufleet::store {
namespace {

// At most this many bytes of an offending value are quoted in an error message.
constexpr size_t kMaxQuotedBytes = 64;

// `value` in double quotes with non-printable and non-ASCII bytes as \xNN, cut after
// kMaxQuotedBytes bytes.
std::string Quote(std::string_view value) {
  std::string out = "\"";
  const size_t shown = std::min(value.size(), kMaxQuotedBytes);
  for (size_t i = 0; i < shown; ++i) {
    const auto byte = static_cast<unsigned char>(value[i]);
    if (byte == '"' || byte == '\\') {
      out += '\\';
      out += static_cast<char>(byte);
    } else if (byte >= 0x20 && byte < 0x7f) {
      out += static_cast<char>(byte);
    } else {
      out += fmt::format("\\x{:02x}", byte);
    }
  }
  out += '"';
  if (shown < value.size()) {
    out += fmt::format("... ({} bytes)", value.size());
  }
  return out;
}

// Decodes the UTF-8 sequence at value[pos] into code_point and advances pos past it; false if it is
// malformed (bad lead or continuation byte, truncated, overlong, surrogate, above U+10FFFF).
bool DecodeUtf8(std::string_view value, size_t& pos, char32_t& code_point) {
  const auto lead = static_cast<unsigned char>(value[pos]);
  size_t length = 0;
  char32_t min = 0;
  if (lead < 0x80) {
    code_point = lead;
    ++pos;
    return true;
  } else if ((lead & 0xe0) == 0xc0) {
    length = 2;
    min = 0x80;
    code_point = lead & 0x1f;
  } else if ((lead & 0xf0) == 0xe0) {
    length = 3;
    min = 0x800;
    code_point = lead & 0x0f;
  } else if ((lead & 0xf8) == 0xf0) {
    length = 4;
    min = 0x10000;
    code_point = lead & 0x07;
  } else {
    return false;
  }
  if (value.size() - pos < length) {
    return false;
  }
  for (size_t i = 1; i < length; ++i) {
    const auto byte = static_cast<unsigned char>(value[pos + i]);
    if ((byte & 0xc0) != 0x80) {
      return false;
    }
    code_point = (code_point << 6) | (byte & 0x3f);
  }
  if (code_point < min || code_point > 0x10ffff || (code_point >= 0xd800 && code_point <= 0xdfff)) {
    return false;
  }
  pos += length;
  return true;
}

// C0 controls, DEL and C1 controls (Unicode category Cc).
bool IsControl(char32_t code_point) {
  return code_point < 0x20 || (code_point >= 0x7f && code_point <= 0x9f);
}

Status ValidateDataSize(std::string_view field, std::string_view data) {
  if (data.size() > kMaxDataBytes) {
    return InvalidArgumentError(
        fmt::format("{} is {} bytes, more than the limit of {} bytes (1 MiB)", field, data.size(),
                    kMaxDataBytes));
  }
  return Status::Ok();
}

Status ValidateOp(const WriteOp& op) {
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("kind", op.kind));
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("name", op.name));
  switch (op.type) {
    case WriteOpType::kCreate:
      return ValidateDataSize("data", op.data);
    case WriteOpType::kUpdate:
      if (op.expected_version <= 0) {
        return InvalidArgumentError(
            fmt::format("expected_version {} of an update must be > 0", op.expected_version));
      }
      return ValidateDataSize("data", op.data);
    case WriteOpType::kDelete:
      if (op.expected_version < 0) {
        return InvalidArgumentError(
            fmt::format("expected_version {} of a delete must be >= 0 (0: unconditional)",
                        op.expected_version));
      }
      return Status::Ok();
    case WriteOpType::kAppendEvent:
      return ValidateDataSize("event text", op.data);
    case WriteOpType::kDeleteEvents:
      return Status::Ok();
  }
  return InvalidArgumentError("unknown operation type");
}

}  // namespace

const char* WriteOpTypeName(WriteOpType type) {
  switch (type) {
    case WriteOpType::kCreate:
      return "create";
    case WriteOpType::kUpdate:
      return "update";
    case WriteOpType::kDelete:
      return "delete";
    case WriteOpType::kAppendEvent:
      return "append-event";
    case WriteOpType::kDeleteEvents:
      return "delete-events";
  }
  return "unknown";
}

WriteBatch& WriteBatch::Create(std::string kind, std::string name, std::string data) {
  ops_.push_back(WriteOp{WriteOpType::kCreate, std::move(kind), std::move(name), std::move(data)});
  return *this;
}

WriteBatch& WriteBatch::Update(std::string kind, std::string name, std::string data,
                               int64_t expected_version) {
  ops_.push_back(WriteOp{WriteOpType::kUpdate, std::move(kind), std::move(name), std::move(data),
                         expected_version});
  return *this;
}

WriteBatch& WriteBatch::Delete(std::string kind, std::string name, int64_t expected_version) {
  ops_.push_back(
      WriteOp{WriteOpType::kDelete, std::move(kind), std::move(name), {}, expected_version});
  return *this;
}

WriteBatch& WriteBatch::AppendEvent(std::string kind, std::string name, std::string text) {
  ops_.push_back(
      WriteOp{WriteOpType::kAppendEvent, std::move(kind), std::move(name), std::move(text)});
  return *this;
}

WriteBatch& WriteBatch::DeleteEvents(std::string kind, std::string name) {
  ops_.push_back(WriteOp{WriteOpType::kDeleteEvents, std::move(kind), std::move(name), {}});
  return *this;
}

WriteBatch& WriteBatch::Append(const WriteBatch& other) {
  ops_.insert(ops_.end(), other.ops_.begin(), other.ops_.end());
  return *this;
}

Result<StoredObject> StateStore::Get(std::string_view kind, std::string_view name) {
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("kind", kind));
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("name", name));
  return DoGet(kind, name);
}

Result<std::vector<StoredObject>> StateStore::GetMany(std::string_view kind,
                                                      const std::vector<std::string>& names) {
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("kind", kind));
  for (const std::string& name : names) {
    GPUFLEET_RETURN_IF_ERROR(ValidateKey("name", name));
  }
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted.empty()) {
    return std::vector<StoredObject>();
  }
  return DoGetMany(kind, sorted);
}

Result<std::vector<StoredObject>> StateStore::DoGetMany(std::string_view kind,
                                                        const std::vector<std::string>& names) {
  std::vector<StoredObject> found;
  for (const std::string& name : names) {
    Result<StoredObject> object = DoGet(kind, name);
    if (object.ok()) {
      found.push_back(std::move(*object));
    } else if (object.status().code() != StatusCode::kNotFound) {
      return object.status();
    }
  }
  return found;
}

Result<std::vector<StoredObject>> StateStore::List(std::string_view kind,
                                                   std::string_view name_prefix) {
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("kind", kind));
  if (!name_prefix.empty()) {
    GPUFLEET_RETURN_IF_ERROR(ValidateKey("name prefix", name_prefix));
  }
  return DoList(kind, name_prefix);
}

Result<std::vector<StoredObject>> StateStore::ListWhere(std::string_view kind,
                                                        const ListFilter& filter) {
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("kind", kind));
  if (!filter.name_prefix.empty()) {
    GPUFLEET_RETURN_IF_ERROR(ValidateKey("name prefix", filter.name_prefix));
  }
  if (!filter.start_after.empty()) {
    GPUFLEET_RETURN_IF_ERROR(ValidateKey("start after", filter.start_after));
  }
  for (const std::string& state : filter.states) {
    if (!state.empty()) {
      GPUFLEET_RETURN_IF_ERROR(ValidateKey("state", state));
    }
  }
  return DoListWhere(kind, filter);
}

Status StateStore::Commit(const WriteBatch& batch) {
  GPUFLEET_RETURN_IF_ERROR(ValidateBatch(batch));
  if (batch.empty()) {
    return Status::Ok();
  }
  Status status = DoCommit(batch);
  std::lock_guard<std::mutex> lock(observers_mu_);
  for (CommitObserver* observer : observers_) {
    if (status.ok()) {
      observer->Committed(batch);
    } else {
      observer->CommitFailed(batch);
    }
  }
  return status;
}

void StateStore::AddObserver(CommitObserver* observer) {
  std::lock_guard<std::mutex> lock(observers_mu_);
  observers_.push_back(observer);
}

void StateStore::RemoveObserver(CommitObserver* observer) {
  std::lock_guard<std::mutex> lock(observers_mu_);
  std::erase(observers_, observer);
}

Result<int64_t> StateStore::Revision() {
  return DoRevision();
}

Result<std::vector<StoredEvent>> StateStore::Events(std::string_view kind, std::string_view name) {
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("kind", kind));
  GPUFLEET_RETURN_IF_ERROR(ValidateKey("name", name));
  return DoEvents(kind, name);
}

Status ValidateKey(std::string_view field, std::string_view value) {
  if (value.empty()) {
    return InvalidArgumentError(fmt::format("{} must not be empty", field));
  }
  if (value.size() > kMaxKeyBytes) {
    return InvalidArgumentError(fmt::format("{} {} is {} bytes, more than the limit of {}", field,
                                            Quote(value), value.size(), kMaxKeyBytes));
  }
  size_t pos = 0;
  while (pos < value.size()) {
    const size_t start = pos;
    char32_t code_point = 0;
    if (!DecodeUtf8(value, pos, code_point)) {
      return InvalidArgumentError(
          fmt::format("{} {} is not valid UTF-8 (at byte {})", field, Quote(value), start));
    }
    if (IsControl(code_point)) {
      return InvalidArgumentError(fmt::format("{} {} contains control character U+{:04X}", field,
                                              Quote(value), static_cast<uint32_t>(code_point)));
    }
  }
  return Status::Ok();
}

std::string IndexedState(std::string_view data) {
  std::optional<std::string> state = TopLevelString(data, "state");
  if (!state || !ValidateKey("state", *state).ok()) {
    return "";
  }
  return std::move(*state);
}

bool InListRange(const ListFilter& filter, std::string_view name) {
  return name.starts_with(filter.name_prefix) && name > filter.start_after;
}

Result<std::vector<StoredObject>> ListWhereByState(
    const ListFilter& filter,
    const std::function<Result<std::vector<std::string>>()>& distinct_states,
    const std::function<Result<std::vector<StoredObject>>(const std::string& state)>& list_state) {
  std::set<std::string> wanted(filter.states.begin(), filter.states.end());
  if (filter.exclude_states) {
    GPUFLEET_ASSIGN_OR_RETURN(std::vector<std::string> present, distinct_states());
    present.emplace_back();  // "", which distinct_states need not find: a miss costs one seek
    std::set<std::string> kept;
    for (const std::string& state : present) {
      if (!wanted.contains(state)) {
        kept.insert(state);
      }
    }
    wanted = std::move(kept);
  }
  std::vector<StoredObject> objects;
  for (const std::string& state : wanted) {
    GPUFLEET_ASSIGN_OR_RETURN(std::vector<StoredObject> of_state, list_state(state));
    const auto middle = static_cast<std::ptrdiff_t>(objects.size());
    objects.insert(objects.end(), std::make_move_iterator(of_state.begin()),
                   std::make_move_iterator(of_state.end()));
    std::inplace_merge(
        objects.begin(), objects.begin() + middle, objects.end(),
        [](const StoredObject& a, const StoredObject& b) { return a.name < b.name; });
    if (filter.limit > 0 && objects.size() > filter.limit) {
      objects.resize(filter.limit);
    }
  }
  return objects;
}

Status ValidateBatch(const WriteBatch& batch) {
  for (size_t i = 0; i < batch.size(); ++i) {
    const Status status = ValidateOp(batch.ops()[i]);
    if (!status.ok()) {
      return AnnotateOpError(status, i, batch.size(), batch.ops()[i]);
    }
  }
  return Status::Ok();
}

Status AnnotateOpError(const Status& status, size_t index, size_t size, const WriteOp& op) {
  return Status(status.code(), fmt::format("{} (batch op {} of {}: {})", status.message(),
                                           index + 1, size, WriteOpTypeName(op.type)));
}

Status VersionConflictError(std::string_view kind, std::string_view name, int64_t actual,
                            int64_t expected) {
  return Status(StatusCode::kAborted, fmt::format("version conflict: {}/{} is at version {}, "
                                                  "expected {}",
                                                  kind, name, actual, expected));
}

Status ObjectNotFoundError(std::string_view kind, std::string_view name) {
  return NotFoundError(fmt::format("{}/{} not found", kind, name));
}

Status ObjectExistsError(std::string_view kind, std::string_view name) {
  return AlreadyExistsError(fmt::format("{}/{} already exists", kind, name));
}

Result<StoredObject> ForwardingStateStore::DoGet(std::string_view kind, std::string_view name) {
  return inner_.Get(kind, name);
}

Result<std::vector<StoredObject>> ForwardingStateStore::DoGetMany(
    std::string_view kind, const std::vector<std::string>& names) {
  return inner_.GetMany(kind, names);
}

Result<std::vector<StoredObject>> ForwardingStateStore::DoList(std::string_view kind,
                                                               std::string_view name_prefix) {
  return inner_.List(kind, name_prefix);
}

Result<std::vector<StoredObject>> ForwardingStateStore::DoListWhere(std::string_view kind,
                                                                    const ListFilter& filter) {
  return inner_.ListWhere(kind, filter);
}

Status ForwardingStateStore::DoCommit(const WriteBatch& batch) {
  return inner_.Commit(batch);
}

Result<int64_t> ForwardingStateStore::DoRevision() {
  return inner_.Revision();
}

Result<std::vector<StoredEvent>> ForwardingStateStore::DoEvents(std::string_view kind,
                                                                std::string_view name) {
  return inner_.Events(kind, name);
}

}  // namespace gpufleet::store
