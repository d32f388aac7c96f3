// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/core/clock.h"
#include "gpufleet/store/leader_election.h"
#include "gpufleet/store/state_store.h"

// Leader election among servers that share one in-memory store, with the fencing PostgreSQL's
// election gives (store/postgres_store.h): what the simulator runs when it gives a fleet a second
// server (docs/simulator.md). The lease is timed by an injected clock.
namespace gpufleet::store {

// The lease itself, shared by the campaigners: holder, token, address and expiry, with the same
// rules as the PostgreSQL lease row (taken when free or expired, renewed by its holder, the token
// bumped whenever the holder changes). Thread-safe.
class MemoryLease {
 public:
  MemoryLease(const Clock& clock, Duration duration) : clock_(clock), duration_(duration) {}
  MemoryLease(const MemoryLease&) = delete;
  MemoryLease& operator=(const MemoryLease&) = delete;

  Duration duration() const { return duration_; }
  LeaseState Campaign(const std::string& identity, const std::string& address);
  // Ends `identity`'s hold at once (nothing if it does not hold the lease).
  void Resign(const std::string& identity);
  // Runs `commit` while `identity` holds the unexpired lease with `token`, the lease unchanged
  // until it returns; else NotLeaderError and `commit` is not run.
  Status CommitIfHolder(const std::string& identity, int64_t token,
                        const std::function<Status()>& commit);

 private:
  const Clock& clock_;
  const Duration duration_;
  std::mutex mu_;
  std::string holder_;   // guarded by mu_
  std::string address_;  // guarded by mu_
  int64_t token_ = 0;    // guarded by mu_
  MonoTime expires_at_;  // guarded by mu_
};

// One campaigner of a MemoryLease. Thread-safe.
class MemoryLeaderElection final : public LeaderElection {
 public:
  // `lease` must outlive the election.
  MemoryLeaderElection(MemoryLease& lease, std::string identity, std::string address);

  const std::string& identity() const override { return identity_; }
  Duration lease_duration() const override { return lease_.duration(); }
  Result<LeaseState> Campaign() override;
  Status Resign() override;

  // The token this campaigner's commits must find in the lease (0: none held, all refused).
  int64_t fence_token() const;
  MemoryLease& lease() { return lease_; }

 private:
  MemoryLease& lease_;
  const std::string identity_;
  const std::string address_;
  mutable std::mutex mu_;
  int64_t fence_token_ = 0;  // guarded by mu_
};

// One server's view of a shared store: reads go straight through; a commit lands only while the
// server's election holds the lease with the token it was granted (fencing), so a deposed
// leader's late writes are refused. Observers see this view's commits only, as a server sees its
// own connection's. Thread-safe.
class FencedStore final : public ForwardingStateStore {
 public:
  // `inner` and `election` must outlive the view.
  FencedStore(StateStore& inner, MemoryLeaderElection& election)
      : ForwardingStateStore(inner), election_(election) {}

 protected:
  Status DoCommit(const WriteBatch& batch) override;

 private:
  MemoryLeaderElection& election_;
};

}  // namespace gpufleet::store
