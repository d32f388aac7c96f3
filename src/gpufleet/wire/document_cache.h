// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "gpufleet/wire/json_fields.h"

namespace gpufleet::wire {

// Parsed JSON documents kept from one use to the next, by group and key: a caller that parses the
// same stored documents again and again parses only those whose text changed. A node's heartbeat
// reads every job document of its node (up to ~100) every 10 s, and parsing them was most of its
// cost. The text is compared in full, so a document is never taken for another. Thread-safe.
class ParsedDocumentCache {
 public:
  // ParseDocument(text), from the parse kept for group/key when that was of the same text.
  Json Parse(const std::string& group, const std::string& key, const std::string& text);
  // Keeps, of `group`, only the documents parsed since the last EndUse(group): a job that left
  // the node is dropped at its next heartbeat.
  void EndUse(const std::string& group);
  // Documents kept, over all groups.
  size_t size() const;

 private:
  struct Entry {
    std::string text;
    std::shared_ptr<const Json> doc;
    bool used = false;
  };
  mutable std::mutex mu_;
  std::map<std::string, std::map<std::string, Entry>> groups_;  // guarded by mu_
};

}  // namespace gpufleet::wire
