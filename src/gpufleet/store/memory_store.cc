// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/memory_store.h"

#include <optional>
#include <set>

namespace gpufleet::store {

Result<StoredObject> InMemoryStateStore::DoGet(std::string_view kind, std::string_view name) {
  std::lock_guard lock(mu_);
  const auto it = objects_.find(Key(kind, name));
  if (it == objects_.end()) {
    return ObjectNotFoundError(kind, name);
  }
  return it->second;
}

Result<std::vector<StoredObject>> InMemoryStateStore::DoList(std::string_view kind,
                                                             std::string_view name_prefix) {
  std::lock_guard lock(mu_);
  std::vector<StoredObject> objects;
  for (auto it = objects_.lower_bound(Key(kind, name_prefix));
       it != objects_.end() && it->first.first == kind && it->first.second.starts_with(name_prefix);
       ++it) {
    objects.push_back(it->second);
  }
  return objects;
}

Result<std::vector<StoredObject>> InMemoryStateStore::DoListWhere(std::string_view kind,
                                                                  const ListFilter& filter) {
  std::lock_guard lock(mu_);
  const std::set<std::string> states(filter.states.begin(), filter.states.end());
  std::vector<StoredObject> objects;
  for (auto it = objects_.lower_bound(Key(kind, filter.name_prefix));
       it != objects_.end() && it->first.first == kind &&
       it->first.second.starts_with(filter.name_prefix) &&
       (filter.limit == 0 || objects.size() < filter.limit);
       ++it) {
    if (InListRange(filter, it->first.second) &&
        states.contains(IndexedState(it->second.data)) != filter.exclude_states) {
      objects.push_back(it->second);
    }
  }
  return objects;
}

Status InMemoryStateStore::DoCommit(const WriteBatch& batch) {
  std::lock_guard lock(mu_);
  const int64_t revision = revision_ + 1;
  // The batch's writes, applied only once every operation has succeeded: the object as the
  // batch leaves it, or nullopt once deleted. Later operations read through this overlay.
  std::map<Key, std::optional<StoredObject>> staged;
  std::vector<std::pair<Key, StoredEvent>> appended;
  std::set<Key> cleared;  // event logs the batch deletes (before its later appends)
  const auto current = [&](const Key& key) -> const StoredObject* {
    if (const auto it = staged.find(key); it != staged.end()) {
      return it->second ? &*it->second : nullptr;
    }
    const auto it = objects_.find(key);
    return it == objects_.end() ? nullptr : &it->second;
  };

  for (size_t i = 0; i < batch.size(); ++i) {
    const WriteOp& op = batch.ops()[i];
    Key key(op.kind, op.name);
    const StoredObject* existing = current(key);
    Status status;
    switch (op.type) {
      case WriteOpType::kCreate:
        if (existing != nullptr) {
          status = ObjectExistsError(op.kind, op.name);
        } else {
          staged[key] = StoredObject{op.kind, op.name, op.data, 1, revision};
        }
        break;
      case WriteOpType::kUpdate:
        if (existing == nullptr) {
          status = ObjectNotFoundError(op.kind, op.name);
        } else if (existing->version != op.expected_version) {
          status = VersionConflictError(op.kind, op.name, existing->version, op.expected_version);
        } else {
          StoredObject next{op.kind, op.name, op.data, existing->version + 1, revision};
          staged[key] = std::move(next);
        }
        break;
      case WriteOpType::kDelete:
        if (existing == nullptr) {
          status = ObjectNotFoundError(op.kind, op.name);
        } else if (op.expected_version != 0 && existing->version != op.expected_version) {
          status = VersionConflictError(op.kind, op.name, existing->version, op.expected_version);
        } else {
          staged[key] = std::nullopt;
        }
        break;
      case WriteOpType::kAppendEvent:
        appended.emplace_back(std::move(key), StoredEvent{revision, op.data});
        break;
      case WriteOpType::kDeleteEvents:
        std::erase_if(appended, [&](const auto& entry) { return entry.first == key; });
        cleared.insert(std::move(key));
        break;
    }
    if (!status.ok()) {
      return AnnotateOpError(status, i, batch.size(), op);
    }
  }

  for (auto& [key, object] : staged) {
    if (object) {
      objects_[key] = std::move(*object);
    } else {
      objects_.erase(key);
    }
  }
  for (const Key& key : cleared) {
    events_.erase(key);
  }
  for (auto& [key, event] : appended) {
    events_[key].push_back(std::move(event));
  }
  revision_ = revision;
  return Status::Ok();
}

Result<int64_t> InMemoryStateStore::DoRevision() {
  std::lock_guard lock(mu_);
  return revision_;
}

Result<std::vector<StoredEvent>> InMemoryStateStore::DoEvents(std::string_view kind,
                                                              std::string_view name) {
  std::lock_guard lock(mu_);
  const auto it = events_.find(Key(kind, name));
  if (it == events_.end()) {
    return std::vector<StoredEvent>{};
  }
  return it->second;
}

}  // namespace gpufleet::store
