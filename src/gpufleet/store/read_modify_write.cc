// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/read_modify_write.h"

#include <string>

namespace gpufleet::store {

Status CommitWithRetries(StateStore& store, int attempts, std::string_view conflict_message,
                         const std::function<AttemptResult()>& attempt) {
  for (int i = 0; i < attempts; ++i) {
    const AttemptResult batch = attempt();
    if (!batch.ok()) {
      return batch.status();
    }
    if (!batch->has_value()) {
      return Status::Ok();
    }
    const Status status = store.Commit(**batch);
    if (status.code() != StatusCode::kAborted) {
      return status;
    }
  }
  return Status(StatusCode::kAborted, std::string(conflict_message));
}

}  // namespace gpufleet::store
