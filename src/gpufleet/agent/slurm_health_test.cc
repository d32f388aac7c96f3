// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/slurm_health.h"

#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Two GPUs; `xids` queued on GPU 1 for the next sample.
class TwoGpuProbe final : public GpuProbe {
 public:
  explicit TwoGpuProbe(std::vector<int> xids = {}) : xids_(std::move(xids)) {}
  Result<ProbeInventory> Inventory() override {
    ProbeInventory inventory;
    for (int g = 0; g < 2; ++g) {
      inventory.gpus.push_back({.index = g, .uuid = "GPU-" + std::to_string(g)});
    }
    return inventory;
  }
  Result<std::vector<GpuSample>> Sample() override {
    std::vector<GpuSample> samples(2);
    samples[1].index = 1;
    for (int code : xids_) {
      samples[1].xids.push_back({.code = code});
    }
    return samples;
  }

 private:
  std::vector<int> xids_;
};

// slurmctld's view of one node; records the updates.
class FakeSlurm final : public SlurmControl {
 public:
  explicit FakeSlurm(SlurmNodeState state) : state_(std::move(state)) {}
  Result<SlurmNodeState> ShowNode(const std::string& node) override {
    if (node != "node1") {
      return NotFoundError("Invalid node name specified");
    }
    return state_;
  }
  Status Drain(const std::string& node, const std::string& reason) override {
    calls.push_back("drain " + node + " " + reason);
    state_ = {.state = "IDLE+DRAIN", .drain = true, .reason = reason};
    return Status::Ok();
  }
  Status Resume(const std::string& node) override {
    calls.push_back("resume " + node);
    state_ = {.state = "IDLE"};
    if (resumed_first_by_another_check) {
      // What slurmctld answers when another check resumed the node in between.
      return UnavailableError(
          "scontrol update nodename=node1 state=resume: slurm_update error: Invalid node state "
          "specified");
    }
    return Status::Ok();
  }
  std::vector<std::string> calls;
  bool resumed_first_by_another_check = false;

 private:
  SlurmNodeState state_;
};

TEST(SlurmHealth, DrainsOnXid79ThenResumesWhenClean) {
  FakeSlurm slurm({.state = "IDLE"});
  TwoGpuProbe broken({79});
  auto outcome = RunSlurmHealthCheck(&broken, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kDrained);
  EXPECT_EQ(outcome->reason, "gpufleet: XID 79 on GPU 1");
  // Again while still broken: the drain stands, nothing is sent.
  outcome = RunSlurmHealthCheck(&broken, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kStillDrained);
  TwoGpuProbe clean;
  outcome = RunSlurmHealthCheck(&clean, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kResumed);
  outcome = RunSlurmHealthCheck(&clean, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kNone);
  EXPECT_THAT(slurm.calls, ElementsAre("drain node1 gpufleet: XID 79 on GPU 1", "resume node1"));
}

// slurmd runs the check as its HealthCheckProgram while an operator (or the agent) runs it too:
// when the other one resumed the node between this one's look and its resume, Slurm refuses the
// resume, and the node is as this check wants it. A fresh-clone CI run failed on this.
TEST(SlurmHealth, ANodeAnotherCheckResumedFirstIsNoError) {
  FakeSlurm slurm({.state = "IDLE+DRAIN", .drain = true, .reason = "gpufleet: XID 79 on GPU 1"});
  slurm.resumed_first_by_another_check = true;
  TwoGpuProbe clean;
  auto outcome = RunSlurmHealthCheck(&clean, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kNone);
}

// A resume Slurm refuses while the node stays drained is an error the caller sees.
TEST(SlurmHealth, ARefusedResumeOfANodeStillDrainedFails) {
  class RefusingSlurm final : public SlurmControl {
   public:
    Result<SlurmNodeState> ShowNode(const std::string&) override {
      return SlurmNodeState{.state = "DOWN+DRAIN", .drain = true, .reason = "gpufleet: XID 79"};
    }
    Status Drain(const std::string&, const std::string&) override { return Status::Ok(); }
    Status Resume(const std::string&) override { return UnavailableError("slurmctld is down"); }
  } slurm;
  TwoGpuProbe clean;
  EXPECT_THAT(RunSlurmHealthCheck(&clean, Status::Ok(), slurm, "node1"),
              StatusIs(StatusCode::kUnavailable));
}

TEST(SlurmHealth, LeavesAnAdminsDrainAlone) {
  FakeSlurm slurm({.state = "IDLE+DRAIN", .drain = true, .reason = "bad fan"});
  TwoGpuProbe clean;
  auto outcome = RunSlurmHealthCheck(&clean, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kLeftDrained);
  TwoGpuProbe broken({79});
  outcome = RunSlurmHealthCheck(&broken, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kLeftDrained);
  EXPECT_THAT(slurm.calls, IsEmpty());
}

TEST(SlurmHealth, ApplicationXidsDoNotDrainButUnreadableGpusDo) {
  FakeSlurm slurm({.state = "MIXED"});
  TwoGpuProbe app_error({13});  // graphics engine exception: the job's fault
  auto outcome = RunSlurmHealthCheck(&app_error, Status::Ok(), slurm, "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kNone);
  outcome = RunSlurmHealthCheck(nullptr, UnavailableError("libnvidia-ml.so.1: cannot open"), slurm,
                                "node1");
  ASSERT_OK(outcome);
  EXPECT_EQ(outcome->action, SlurmHealthAction::kDrained);
  EXPECT_EQ(outcome->reason, "gpufleet: NVML: libnvidia-ml.so.1: cannot open");
  EXPECT_THAT(RunSlurmHealthCheck(&app_error, Status::Ok(), slurm, "node9"),
              StatusIs(StatusCode::kNotFound));
}

TEST(SlurmHealth, ParsesScontrolShowNode) {
  auto node = ParseScontrolNode(
      "NodeName=node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE+DRAIN ThreadsPerCore=1 "
      "Partitions=gpu CurrentWatts=0 AveWatts=0 Reason=gpufleet: XID 79 on GPU 3 "
      "[root@2026-12-03T02:30:00]");
  ASSERT_OK(node);
  EXPECT_EQ(node->state, "IDLE+DRAIN");
  EXPECT_TRUE(node->drain);
  EXPECT_EQ(node->reason, "gpufleet: XID 79 on GPU 3");
  node = ParseScontrolNode("NodeName=node2 State=MIXED Partitions=gpu");
  ASSERT_OK(node);
  EXPECT_FALSE(node->drain);
  EXPECT_THAT(node->reason, IsEmpty());
  EXPECT_THAT(ParseScontrolNode("Node node3 not found"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no State=")));
}

TEST(SlurmHealth, ReasonListsEveryUnhealthyGpuAndStaysShort) {
  std::vector<GpuHealthReport> gpus;
  for (int g = 0; g < 40; ++g) {
    gpus.push_back(EvaluateGpuHealth({.index = g}, {.index = g}, {{79, 1}, {48, 2}}));
  }
  const std::string reason = SlurmDrainReason(gpus);
  EXPECT_THAT(reason, ::testing::StartsWith("gpufleet: XID 48 (x2) on GPU 0; XID 79 on GPU 0; "));
  EXPECT_LE(reason.size(), 200u);
  EXPECT_THAT(SlurmDrainReason({EvaluateGpuHealth({.index = 0}, {.index = 0}, {})}), IsEmpty());
}

}  // namespace
}  // namespace gpufleet::agent
