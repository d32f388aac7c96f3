// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gpufleet/store/state_store.h"

namespace gpufleet::store {

// A StateStore in memory, for tests and the simulator; nothing survives the object.
// Thread-safe: one std::mutex serialises every call.
class InMemoryStateStore final : public StateStore {
 public:
  InMemoryStateStore() = default;
  InMemoryStateStore(const InMemoryStateStore&) = delete;
  InMemoryStateStore& operator=(const InMemoryStateStore&) = delete;

 protected:
  Result<StoredObject> DoGet(std::string_view kind, std::string_view name) override;
  Result<std::vector<StoredObject>> DoList(std::string_view kind,
                                           std::string_view name_prefix) override;
  // Filters the kind's objects (IndexedState computed as it goes: nothing to keep exact).
  Result<std::vector<StoredObject>> DoListWhere(std::string_view kind,
                                                const ListFilter& filter) override;
  Status DoCommit(const WriteBatch& batch) override;
  Result<int64_t> DoRevision() override;
  Result<std::vector<StoredEvent>> DoEvents(std::string_view kind, std::string_view name) override;

 private:
  // (kind, name), ordered by kind then name: a kind's objects are contiguous and sorted.
  using Key = std::pair<std::string, std::string>;

  std::mutex mu_;
  std::map<Key, StoredObject> objects_;             // guarded by mu_
  std::map<Key, std::vector<StoredEvent>> events_;  // guarded by mu_
  int64_t revision_ = 0;                            // guarded by mu_
};

}  // namespace gpufleet::store
