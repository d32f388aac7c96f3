// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/wire/document_cache.h"

#include <utility>

namespace gpufleet::wire {

Json ParsedDocumentCache::Parse(const std::string& group, const std::string& key,
                                const std::string& text) {
  std::shared_ptr<const Json> kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = groups_.find(group);
    if (found != groups_.end()) {
      if (auto entry = found->second.find(key);
          entry != found->second.end() && entry->second.text == text) {
        entry->second.used = true;
        kept = entry->second.doc;
      }
    }
  }
  if (kept != nullptr) {
    return *kept;  // a copy, outside the lock: the caller may change it
  }
  auto parsed = std::make_shared<const Json>(ParseDocument(text));
  Json copy = *parsed;
  std::lock_guard<std::mutex> lock(mu_);
  groups_[group][key] = Entry{text, std::move(parsed), true};
  return copy;
}

void ParsedDocumentCache::EndUse(const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto found = groups_.find(group);
  if (found == groups_.end()) {
    return;
  }
  std::map<std::string, Entry>& entries = found->second;
  for (auto entry = entries.begin(); entry != entries.end();) {
    if (entry->second.used) {
      entry->second.used = false;
      ++entry;
    } else {
      entry = entries.erase(entry);
    }
  }
  if (entries.empty()) {
    groups_.erase(found);
  }
}

size_t ParsedDocumentCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t count = 0;
  for (const auto& [group, entries] : groups_) {
    count += entries.size();
  }
  return count;
}

}  // namespace gpufleet::wire
