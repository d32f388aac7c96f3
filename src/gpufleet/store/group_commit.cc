// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/group_commit.h"

namespace gpufleet::store {

Status GroupCommitQueue::Commit(const WriteBatch& batch, const GroupWriter& write) {
  Pending me{.batch = &batch};
  std::unique_lock lock(mu_);
  queue_.push_back(&me);
  cv_.wait(lock, [&] { return me.done || !writing_; });
  if (me.done) {
    return me.status;
  }
  writing_ = true;
  std::vector<Pending*> taken;
  taken.swap(queue_);
  lock.unlock();
  write(taken);
  lock.lock();
  for (Pending* pending : taken) {
    pending->done = true;
  }
  writing_ = false;
  lock.unlock();
  cv_.notify_all();
  return me.status;
}

}  // namespace gpufleet::store
