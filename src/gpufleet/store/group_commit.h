// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <vector>

#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

namespace gpufleet::store {

// Group commit, shared by the SQLite and PostgreSQL backends: the batches of the threads that
// call Commit while a group is being written go together into the next group, written by the
// first of those threads to find no group in progress; the others wait for it. The backend's
// writer writes a whole group in one transaction (one fsync or WAL flush), each batch in a
// savepoint of its own so that one failing batch is undone alone. Thread-safe.
class GroupCommitQueue {
 public:
  // A batch waiting for its group; the group's writer sets `status`.
  struct Pending {
    const WriteBatch* batch = nullptr;
    Status status = Status::Ok();
    bool done = false;  // guarded by mu_
  };
  // Writes `group` (in arrival order) and sets each one's status.
  using GroupWriter = std::function<void(const std::vector<Pending*>& group)>;

  // Queues `batch` and returns its status once the group holding it is written, by this thread
  // (calling `write` with every batch queued so far) or by another's.
  Status Commit(const WriteBatch& batch, const GroupWriter& write);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending*> queue_;  // guarded by mu_
  bool writing_ = false;         // guarded by mu_
};

}  // namespace gpufleet::store
