// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/core/workload.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::control {

using wire::Json;

// A stored job document and its spec, parsed together.
struct ParsedJob {
  Json doc;
  // The record's spec (wire::StoredJobSpec) or the error it gave; null without a catalog.
  std::shared_ptr<const Result<Job>> spec;
};

// Parsed stored documents kept between uses: a node's heartbeat reads every job document of its
// node (up to ~100) every 10 s, and parsing them was most of its CPU. A document is found by its
// key and its text, compared in full, so it is never taken for another (a job deleted and
// submitted again under its name). Memory is bounded: the documents live in two generations;
// once the newer one holds `budget_bytes / 2` of text it becomes the older one, and what the older
// one held and nobody used since is dropped. Thread-safe; texts are compared and documents copied
// outside the lock.
class ParsedDocuments {
 public:
  // With `catalog` (which must outlive this), the spec of each document is parsed with it and
  // kept too: a job's spec never changes, and its tasks are sent to its agents every heartbeat.
  explicit ParsedDocuments(size_t budget_bytes, const GpuCatalog* catalog = nullptr)
      : budget_bytes_(budget_bytes), catalog_(catalog) {}

  // wire::ParseDocument(text), from the parse kept for `key` when that was of the same text.
  Json Parse(const std::string& key, const std::string& text) { return ParseJob(key, text).doc; }
  // The same with the document's spec.
  ParsedJob ParseJob(const std::string& key, const std::string& text);

  // The text kept, over both generations (for tests).
  size_t TextBytesForTest() const;

 private:
  struct Parsed {
    std::string text;
    Json doc;
    std::shared_ptr<const Result<Job>> spec;
  };
  using Generation = std::map<std::string, std::shared_ptr<const Parsed>>;
  // Puts `parsed` in the newer generation, which becomes the older one when full.
  // REQUIRES: mu_ held.
  void KeepLocked(const std::string& key, std::shared_ptr<const Parsed> parsed);

  const size_t budget_bytes_;
  const GpuCatalog* const catalog_;
  mutable std::mutex mu_;
  Generation newer_;        // guarded by mu_
  Generation older_;        // guarded by mu_
  size_t newer_bytes_ = 0;  // guarded by mu_
  size_t older_bytes_ = 0;  // guarded by mu_
};

}  // namespace gpufleet::control
