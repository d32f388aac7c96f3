// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/status.h"

namespace gpufleet::store {

// How a store refuses the commit of a server that does not hold the lease (fencing): nothing of
// the batch is applied. kFailedPrecondition for the store's callers (this server must not retry
// the write: it no longer leads); the API answers it 503 with Retry-After, since the same request
// sent again reaches the new leader (docs/ha.md, "Fencing").
inline constexpr std::string_view kNotLeaderPrefix = "not the leader: ";
inline Status NotLeaderError(std::string_view why) {
  return FailedPreconditionError(std::string(kNotLeaderPrefix) + std::string(why));
}
inline bool IsNotLeaderError(const Status& status) {
  return status.code() == StatusCode::kFailedPrecondition &&
         status.message().starts_with(kNotLeaderPrefix);
}

// The lease as one campaigner sees it after a campaign.
struct LeaseState {
  // This campaigner holds the lease, unexpired, with `token`.
  bool leader = false;
  // The lease's fencing token: bumped on every change of holder, so a holder's term is told
  // apart from any other (0: no one ever held the lease).
  int64_t token = 0;
  // Who holds the lease and the address others reach it at; both empty when no unexpired lease
  // is held.
  std::string holder;
  std::string address;

  friend bool operator==(const LeaseState&, const LeaseState&) = default;
};

// Election of one leader among the servers that share a store (docs/ha.md). The lease lives in
// the store and is timed by the store's clock; the store refuses the commits of a campaigner
// that does not hold the lease (fencing), so a deposed leader's late writes cannot land.
//
// Stores that only one server can open (SQLite, memory) have no election: that server leads.
//
// Implementations are thread-safe.
class LeaderElection {
 public:
  virtual ~LeaderElection() = default;

  // Unique to this campaigner (one server process).
  virtual const std::string& identity() const = 0;
  // How long a lease lasts from its last renewal.
  virtual Duration lease_duration() const = 0;
  // Takes the lease if no one holds it or its holder's has expired, renews it if this campaigner
  // holds it, and returns it as it now stands. kUnavailable when the store cannot be reached
  // (the lease may then expire: the caller stops leading lease_duration() after the start of its
  // last successful renewal).
  virtual Result<LeaseState> Campaign() = 0;
  // Gives up the lease if this campaigner holds it (it expires at once, so another takes over
  // without waiting); from then on this campaigner's commits are refused.
  virtual Status Resign() = 0;
};

}  // namespace gpufleet::store
