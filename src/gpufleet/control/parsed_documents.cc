// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/parsed_documents.h"

#include <utility>

#include "gpufleet/wire/job_record.h"

namespace gpufleet::control {

ParsedJob ParsedDocuments::ParseJob(const std::string& key, const std::string& text) {
  std::shared_ptr<const Parsed> kept;
  bool in_older = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const auto found = newer_.find(key); found != newer_.end()) {
      kept = found->second;
    } else if (const auto old = older_.find(key); old != older_.end()) {
      kept = old->second;
      in_older = true;
    }
  }
  if (kept != nullptr && kept->text == text) {
    if (in_older) {
      std::lock_guard<std::mutex> lock(mu_);
      KeepLocked(key, kept);
    }
    return ParsedJob{kept->doc, kept->spec};  // a copy: the caller may change it
  }
  Parsed fresh{text, wire::ParseDocument(text), nullptr};
  if (catalog_ != nullptr) {
    fresh.spec = std::make_shared<const Result<Job>>(wire::StoredJobSpec(fresh.doc, *catalog_));
  }
  auto parsed = std::make_shared<const Parsed>(std::move(fresh));
  ParsedJob copy{parsed->doc, parsed->spec};
  std::lock_guard<std::mutex> lock(mu_);
  KeepLocked(key, std::move(parsed));
  return copy;
}

void ParsedDocuments::KeepLocked(const std::string& key, std::shared_ptr<const Parsed> parsed) {
  const size_t bytes = parsed->text.size();
  auto [entry, inserted] = newer_.try_emplace(key, nullptr);
  if (!inserted) {
    newer_bytes_ -= entry->second->text.size();
  }
  entry->second = std::move(parsed);
  newer_bytes_ += bytes;
  if (newer_bytes_ >= budget_bytes_ / 2) {
    older_ = std::move(newer_);
    older_bytes_ = newer_bytes_;
    newer_.clear();
    newer_bytes_ = 0;
  }
}

size_t ParsedDocuments::TextBytesForTest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newer_bytes_ + older_bytes_;
}

}  // namespace gpufleet::control
