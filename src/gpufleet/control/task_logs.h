// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "gpufleet/wire/agent_protocol.h"

// The tails of task logs the agents shipped (docs/agent.md, "Task logs"), in the server's memory
// only: a bounded cache, not a record. It is lost when the server stops and not shared with the
// other servers of docs/ha.md; the node keeps the whole file (agent --state-dir/logs).
namespace gpufleet::control {

// What a server keeps of log tails in all: 4,096 tasks' full 16 KiB tails.
inline constexpr size_t kTaskLogCacheBytes = 64 * 1024 * 1024;

// Thread-safe.
class TaskLogCache {
 public:
  struct Entry {
    std::string node;
    wire::TaskLogReport report;
    int64_t received_ns = 0;  // the control plane's UsageNowNanos when it came
  };

  // At most `max_bytes` of log text in all: past it, the tails put longest ago are dropped.
  explicit TaskLogCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Keeps `entry` for its task id, in place of what was kept for it.
  void Put(Entry entry);
  std::optional<Entry> Get(const std::string& task_id) const;
  size_t bytes() const;

 private:
  struct Kept {
    Entry entry;
    uint64_t order = 0;
  };
  void DropOldestLocked();

  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::map<std::string, Kept> by_task_;    // guarded by mu_
  std::map<uint64_t, std::string> order_;  // put order -> task id; guarded by mu_
  uint64_t next_order_ = 0;                // guarded by mu_
  size_t bytes_ = 0;                       // guarded by mu_
};

}  // namespace gpufleet::control
