// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/planted_bugs.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "gpufleet/control/store_keys.h"

namespace gpufleet::fleetsim {
namespace {

// kEarlyRelease, kSkippedFence and kShortFenceGrace: a runner that lies to its agent or cuts
// what it was given.
class FaultyRunner final : public runner::TaskRunner {
 public:
  FaultyRunner(runner::TaskRunner& inner, PlantedBug bug) : inner_(inner), bug_(bug) {}

  Status Start(const runner::TaskLaunch& launch) override {
    reported_gone_.erase(launch.task_id);
    return inner_.Start(launch);
  }
  Status Stop(std::string_view task_id, Duration grace) override {
    if (bug_ == PlantedBug::kEarlyRelease) {
      reported_gone_.insert(std::string(task_id));
    }
    return inner_.Stop(task_id, grace);
  }
  Status SendNotice(std::string_view task_id, std::string_view signal_name) override {
    return inner_.SendNotice(task_id, signal_name);
  }
  std::vector<runner::TaskStatus> Poll() override {
    std::vector<runner::TaskStatus> statuses = inner_.Poll();
    for (runner::TaskStatus& status : statuses) {
      if (status.state == runner::TaskState::kRunning && reported_gone_.count(status.task_id)) {
        status.state = runner::TaskState::kKilled;
        status.signal = 15;
        status.end_time = status.start_time;
      }
    }
    return statuses;
  }
  Status Forget(std::string_view task_id) override {
    // The agent forgets what it was told is gone; the task itself runs on in the inner runner
    // until its stop delay ends, and is forgotten there then.
    if (reported_gone_.count(std::string(task_id))) {
      return Status::Ok();
    }
    return inner_.Forget(task_id);
  }
  Status RenewLease(Duration fence_in, Duration grace) override {
    if (bug_ == PlantedBug::kSkippedFence) {
      return Status::Ok();
    }
    if (bug_ == PlantedBug::kShortFenceGrace) {
      constexpr Duration kFenceMargin = std::chrono::seconds(16);
      return inner_.RenewLease(fence_in, grace - std::min(grace, kFenceMargin));
    }
    return inner_.RenewLease(fence_in, grace);
  }
  std::string ContainerRuntime() const override { return inner_.ContainerRuntime(); }

 private:
  runner::TaskRunner& inner_;
  PlantedBug bug_;
  std::set<std::string> reported_gone_;
};

// kLostWrite: the second commit that creates a job is acknowledged and not kept.
class LosingStore final : public store::ForwardingStateStore {
 public:
  explicit LosingStore(store::StateStore& inner) : ForwardingStateStore(inner) {}

 protected:
  Status DoCommit(const store::WriteBatch& batch) override {
    for (const store::WriteOp& op : batch.ops()) {
      if (op.type == store::WriteOpType::kCreate && op.kind == control::kJobsKind &&
          ++job_creations_ == 2) {
        return Status::Ok();
      }
    }
    return inner().Commit(batch);
  }

 private:
  int job_creations_ = 0;
};

}  // namespace

void PlantBug(PlantedBug bug, FleetOptions& options) {
  switch (bug) {
    case PlantedBug::kNone:
      return;
    case PlantedBug::kEarlyRelease:
    case PlantedBug::kSkippedFence:
    case PlantedBug::kShortFenceGrace:
      options.runner_wrapper = [bug](runner::TaskRunner& inner) {
        return std::make_unique<FaultyRunner>(inner, bug);
      };
      return;
    case PlantedBug::kLostWrite:
      options.store_wrapper = [](store::StateStore& inner) {
        return std::make_unique<LosingStore>(inner);
      };
      return;
    case PlantedBug::kUnfencedCommits:
      options.fence_commits = false;
      return;
  }
}

}  // namespace gpufleet::fleetsim
