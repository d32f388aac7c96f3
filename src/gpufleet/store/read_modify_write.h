// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <functional>
#include <optional>
#include <string_view>
#include <utility>

#include "gpufleet/core/status.h"
#include "gpufleet/store/state_store.h"

// The one compare-and-set retry loop of the store's users: read, decide, write at the version
// read, and start again from the read when another writer got there first.
namespace gpufleet::store {

// What one attempt decides: the batch to commit (Write), nothing to write (NoWrite: it has
// decided the outcome itself), or an error to stop with.
using AttemptResult = Result<std::optional<WriteBatch>>;
inline AttemptResult Write(WriteBatch batch) {
  return std::optional<WriteBatch>(std::move(batch));
}
inline AttemptResult NoWrite() {
  return std::optional<WriteBatch>();
}

// Calls `attempt` and commits the batch it returns; while the commit is refused with kAborted
// (a version conflict: the objects changed since `attempt` read them), calls it again, at most
// `attempts` times in all. `attempt` reads what it needs afresh each time.
//
// Returns OK when the batch was committed or `attempt` wrote nothing; the error of `attempt` or
// of the commit (other than kAborted); or, when every attempt conflicted, kAborted with
// `conflict_message` (what a person should retry, e.g. "job \"train\" kept changing; retry the
// cancel"). `attempt` tells its caller what it decided through what it captures.
Status CommitWithRetries(StateStore& store, int attempts, std::string_view conflict_message,
                         const std::function<AttemptResult()>& attempt);

}  // namespace gpufleet::store
