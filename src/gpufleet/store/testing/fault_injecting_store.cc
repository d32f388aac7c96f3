// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/testing/fault_injecting_store.h"

#include <utility>

#include <fmt/format.h>

namespace gpufleet::store::testing {

void FaultInjectingStateStore::FailNthCommit(int64_t n, FaultMode mode, Status error) {
  std::lock_guard lock(mu_);
  fail_at_commit_ = n >= 1 ? commit_count_ + n : 0;
  mode_ = mode;
  error_ = std::move(error);
}

void FaultInjectingStateStore::ClearFault() {
  std::lock_guard lock(mu_);
  fail_at_commit_ = 0;
}

int64_t FaultInjectingStateStore::get_count() const {
  std::lock_guard lock(mu_);
  return get_count_;
}

int64_t FaultInjectingStateStore::commit_count() const {
  std::lock_guard lock(mu_);
  return commit_count_;
}

int64_t FaultInjectingStateStore::injected_faults() const {
  std::lock_guard lock(mu_);
  return injected_faults_;
}

Result<StoredObject> FaultInjectingStateStore::DoGet(std::string_view kind, std::string_view name) {
  std::function<void()> hook;
  {
    std::lock_guard lock(mu_);
    ++get_count_;
    hook = std::exchange(after_next_get_, nullptr);
  }
  Result<StoredObject> read = inner().Get(kind, name);
  if (hook) {
    hook();
  }
  return read;
}

Result<std::vector<StoredObject>> FaultInjectingStateStore::DoGetMany(
    std::string_view kind, const std::vector<std::string>& names) {
  return StateStore::DoGetMany(kind, names);
}

void FaultInjectingStateStore::AfterNextGet(std::function<void()> hook) {
  std::lock_guard lock(mu_);
  after_next_get_ = std::move(hook);
}

Status FaultInjectingStateStore::DoCommit(const WriteBatch& batch) {
  int64_t commit = 0;
  bool fail = false;
  FaultMode mode = FaultMode::kBeforeCommit;
  Status error;
  {
    std::lock_guard lock(mu_);
    commit = ++commit_count_;
    fail = commit == fail_at_commit_;
    if (fail) {
      fail_at_commit_ = 0;
      mode = mode_;
      error = error_;
      ++injected_faults_;
    }
  }
  if (!fail) {
    return inner().Commit(batch);
  }
  if (mode == FaultMode::kAfterCommit) {
    GPUFLEET_RETURN_IF_ERROR(inner().Commit(batch));
  }
  if (!error.ok()) {
    return error;
  }
  return UnavailableError(fmt::format(
      "injected fault: commit {} ({} operations) failed {}", commit, batch.size(),
      mode == FaultMode::kAfterCommit ? "after it was written" : "before it was written"));
}

}  // namespace gpufleet::store::testing
