// SPDX-License-Identifier: Apache-2.0
// Leadership among several servers on one store (docs/ha.md): the election thread, becoming the
// leader, and a follower's answer to writes.
#include <string>

#include <fmt/core.h>

#include "gpufleet/api/server.h"
#include "gpufleet/control/scheduling_view.h"

namespace gpufleet::api {

void ApiServer::ElectionMain() {
  std::unique_lock<std::mutex> lock(loop_mu_);
  while (!stopping_) {
    lock.unlock();
    Campaign();
    lock.lock();
    loop_cv_.wait_for(lock, options_.election_interval, [this] { return stopping_; });
  }
}

void ApiServer::Campaign() {
  const MonoTime start = options_.clock.Now();
  const Result<store::LeaseState> lease = options_.election->Campaign();
  std::unique_lock<std::mutex> lock(lease_mu_);
  if (!lease.ok()) {
    fmt::print(stderr, "gpufleet server: campaigning for the leader lease: {}\n",
               lease.status().ToString());
    if (!leading()) {
      store_unavailable_.store(lease.status().code() == StatusCode::kUnavailable);
    }
    // The lease in the store may have expired by now: stop leading before another server can
    // lead (its commits would be refused anyway). If no other server takes the lease meanwhile,
    // this one renews it with the same token once the store is back and leads again.
    if (granted_token_.has_value() && !lapsed_ && !deposed_.load() &&
        options_.clock.Now() - renewed_at_ >= options_.election->lease_duration()) {
      lapsed_ = true;
      leading_.store(false);
      fmt::print(stderr,
                 "gpufleet server: the leader lease of fencing token {} could not be renewed in "
                 "time; not leading until it is\n",
                 *granted_token_);
    }
    return;
  }
  lease_ = *lease;
  if (!leading()) {
    // A follower is ready once it can read the store: it serves reads and knows the leader.
    store_unavailable_.store(false);
    ready_.store(true);
  }
  if (lease->leader && !granted_token_.has_value() && !deposed_.load()) {
    granted_token_ = lease->token;
    renewed_at_ = start;
    lock.unlock();
    fmt::print(stderr, "gpufleet server: {} was granted the leader lease (fencing token {})\n",
               options_.election->identity(), lease->token);
    {
      std::lock_guard<std::mutex> loop_lock(loop_mu_);
      wake_ = true;
    }
    loop_cv_.notify_all();
    return;
  }
  if (!granted_token_.has_value()) {
    return;
  }
  if (lease->leader && lease->token == *granted_token_) {
    renewed_at_ = start;
    if (lapsed_) {
      // No other server led meanwhile (the token is the same): lead again.
      lapsed_ = false;
      lock.unlock();
      fmt::print(stderr, "gpufleet server: renewed the leader lease of fencing token {}\n",
                 lease->token);
      {
        std::lock_guard<std::mutex> loop_lock(loop_mu_);
        wake_ = true;
      }
      loop_cv_.notify_all();
    }
    return;
  }
  const std::string why = lease->leader
                              ? fmt::format("the lease moved from fencing token {} to {}",
                                            *granted_token_, lease->token)
                              : fmt::format("the lease is held by {} at {} with fencing token {}",
                                            lease->holder, lease->address, lease->token);
  lock.unlock();
  if (!deposed_.load()) {
    Depose(why);
  }
}

void ApiServer::Depose(const std::string& why) {
  leading_.store(false);
  deposed_.store(true);
  fmt::print(stderr, "gpufleet server: no longer the leader: {}\n", why);
}

bool ApiServer::ReadyToLead() {
  if (options_.election == nullptr || leading_.load()) {
    return true;
  }
  if (deposed_.load()) {
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    if (!granted_token_.has_value() || lapsed_) {
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(control_->cycle_mutex());
  const MonoTime start = options_.clock.Now();
  if (const Status status = BecomeLeader(); !status.ok()) {
    fmt::print(stderr, "gpufleet server: becoming the leader: {}\n", status.ToString());
    return false;
  }
  // Deposed meanwhile: the writes above were refused or are the last of this term.
  if (deposed_.load()) {
    return false;
  }
  leading_.store(true);
  fmt::print(
      stderr, "gpufleet server: {} leads; rebuilt its view from the store in {} ms\n",
      options_.election->identity(),
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.clock.Now() - start).count());
  return true;
}

Status ApiServer::BecomeLeader() {
  // Until now the heartbeats went to the previous leader: every node gets a full lease from now,
  // and the view, the GPU owners and the active-job index are read from the store afresh.
  GPUFLEET_RETURN_IF_ERROR(control_->Restart());
  return control_->PrepareStore();
}

ApiResponse ApiServer::RedirectToLeader(const ApiRequest& request) const {
  store::LeaseState lease;
  {
    std::lock_guard<std::mutex> lock(lease_mu_);
    lease = lease_;
  }
  const std::string& me = options_.election->identity();
  if (lease.address.empty() || lease.holder == me) {
    ApiResponse response = ErrorResponse(UnavailableError(
        lease.holder == me ? "this server is becoming the leader (or renewing its lease); retry"
                           : "this server is a follower and no leader is known (an election is "
                             "under way); retry"));
    response.retry_after_s = 1;
    return response;
  }
  std::string base = lease.address;
  if (base.ends_with('/')) {
    base.pop_back();
  }
  ApiResponse response = ErrorResponse(UnavailableError(
      fmt::format("this server is a follower: the leader is {} at {}", lease.holder, base)));
  response.status = 307;
  response.location = base + (request.target.empty() ? request.path : request.target);
  return response;
}

}  // namespace gpufleet::api
