// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/task_logs.h"

#include <utility>

namespace gpufleet::control {

void TaskLogCache::Put(Entry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string task_id = entry.report.task_id;
  if (const auto kept = by_task_.find(task_id); kept != by_task_.end()) {
    bytes_ -= kept->second.entry.report.text.size();
    order_.erase(kept->second.order);
    by_task_.erase(kept);
  }
  bytes_ += entry.report.text.size();
  const uint64_t order = next_order_++;
  order_.emplace(order, task_id);
  by_task_[task_id] = Kept{std::move(entry), order};
  while (bytes_ > max_bytes_ && !order_.empty()) {
    DropOldestLocked();
  }
}

void TaskLogCache::DropOldestLocked() {
  const auto oldest = order_.begin();
  const auto kept = by_task_.find(oldest->second);
  bytes_ -= kept->second.entry.report.text.size();
  by_task_.erase(kept);
  order_.erase(oldest);
}

std::optional<TaskLogCache::Entry> TaskLogCache::Get(const std::string& task_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto kept = by_task_.find(task_id);
  if (kept == by_task_.end()) {
    return std::nullopt;
  }
  return kept->second.entry;
}

size_t TaskLogCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace gpufleet::control
