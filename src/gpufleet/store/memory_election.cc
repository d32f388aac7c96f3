// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/store/memory_election.h"

#include <utility>

#include <fmt/core.h>

namespace gpufleet::store {

LeaseState MemoryLease::Campaign(const std::string& identity, const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  const MonoTime now = clock_.Now();
  const bool expired = holder_.empty() || expires_at_ <= now;
  if (holder_ == identity || expired) {
    if (holder_ != identity) {
      ++token_;
      holder_ = identity;
    }
    address_ = address;
    expires_at_ = now + duration_;
    return {.leader = true, .token = token_, .holder = holder_, .address = address_};
  }
  return {.leader = false, .token = token_, .holder = holder_, .address = address_};
}

void MemoryLease::Resign(const std::string& identity) {
  std::lock_guard<std::mutex> lock(mu_);
  if (holder_ == identity) {
    // Expired now: the next campaigner takes it (with a new token) without waiting.
    expires_at_ = clock_.Now();
  }
}

Status MemoryLease::CommitIfHolder(const std::string& identity, int64_t token,
                                   const std::function<Status()>& commit) {
  std::lock_guard<std::mutex> lock(mu_);
  if (token == 0 || holder_ != identity || token_ != token) {
    return NotLeaderError(fmt::format("{} does not hold the lease (fencing token {} is {}'s)",
                                      identity, token_, holder_.empty() ? "no one" : holder_));
  }
  if (expires_at_ <= clock_.Now()) {
    return NotLeaderError(
        fmt::format("the lease of {} (fencing token {}) has expired", identity, token));
  }
  return commit();
}

MemoryLeaderElection::MemoryLeaderElection(MemoryLease& lease, std::string identity,
                                           std::string address)
    : lease_(lease), identity_(std::move(identity)), address_(std::move(address)) {}

Result<LeaseState> MemoryLeaderElection::Campaign() {
  LeaseState state = lease_.Campaign(identity_, address_);
  std::lock_guard<std::mutex> lock(mu_);
  fence_token_ = state.leader ? state.token : 0;
  return state;
}

Status MemoryLeaderElection::Resign() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fence_token_ = 0;
  }
  lease_.Resign(identity_);
  return Status::Ok();
}

int64_t MemoryLeaderElection::fence_token() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fence_token_;
}

Status FencedStore::DoCommit(const WriteBatch& batch) {
  return election_.lease().CommitIfHolder(election_.identity(), election_.fence_token(),
                                          [&] { return inner().Commit(batch); });
}

}  // namespace gpufleet::store
