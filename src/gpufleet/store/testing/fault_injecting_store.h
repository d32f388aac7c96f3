// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>
#include <vector>

#include "gpufleet/store/state_store.h"

namespace gpufleet::store::testing {

// A StateStore that forwards every call to `inner` but fails chosen commits (kUnavailable unless
// told otherwise), as leveldb's fault-injection Env does, for crash-safety tests of the store's
// callers.
//
//   FaultInjectingStateStore faulty(inner);
//   faulty.FailNthCommit(2);  // the second Commit from now fails; nothing of it is written
//
// Only commits that reach the backend count (empty and invalid batches are answered before).
// Thread-safe if `inner` is; `inner` must outlive this object.
class FaultInjectingStateStore final : public ForwardingStateStore {
 public:
  enum class FaultMode {
    // The batch is not passed on: nothing of it is written (a crash before the commit).
    kBeforeCommit,
    // The batch is committed, then the caller is told it failed (a crash after the commit,
    // before the reply): the caller cannot tell the two apart.
    kAfterCommit,
  };

  explicit FaultInjectingStateStore(StateStore& inner) : ForwardingStateStore(inner) {}
  FaultInjectingStateStore(const FaultInjectingStateStore&) = delete;
  FaultInjectingStateStore& operator=(const FaultInjectingStateStore&) = delete;

  // Makes the `n`-th commit from now (1: the next one) fail in `mode`, with `error` if it is not
  // OK (a backend's own refusal, e.g. store::NotLeaderError), else kUnavailable; one fault is
  // pending at a time, a later call replaces it. REQUIRES: n >= 1.
  void FailNthCommit(int64_t n, FaultMode mode = FaultMode::kBeforeCommit, Status error = {});
  // Cancels the pending fault, if any.
  void ClearFault();
  // Commits seen so far, failed ones included.
  int64_t commit_count() const;
  // Commits failed so far.
  int64_t injected_faults() const;
  // Objects read one by one (Get) so far.
  int64_t get_count() const;
  // Runs `hook` once, when the next Get has read its answer and before it returns it: a write
  // racing with a reader that acts on what it read.
  void AfterNextGet(std::function<void()> hook);

 protected:
  Result<StoredObject> DoGet(std::string_view kind, std::string_view name) override;
  // One Get per name, as the base StateStore does, so that each counts and meets the hook.
  Result<std::vector<StoredObject>> DoGetMany(std::string_view kind,
                                              const std::vector<std::string>& names) override;
  Status DoCommit(const WriteBatch& batch) override;

 private:
  mutable std::mutex mu_;
  int64_t commit_count_ = 0;                   // guarded by mu_
  int64_t fail_at_commit_ = 0;                 // guarded by mu_; 0: no fault pending
  FaultMode mode_ = FaultMode::kBeforeCommit;  // guarded by mu_
  Status error_;                               // guarded by mu_
  int64_t injected_faults_ = 0;                // guarded by mu_
  int64_t get_count_ = 0;                      // guarded by mu_
  std::function<void()> after_next_get_;       // guarded by mu_
};

}  // namespace gpufleet::store::testing
