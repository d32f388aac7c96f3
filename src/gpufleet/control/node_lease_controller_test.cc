// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/node_lease_controller.h"

#include <chrono>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/node_json.h"

namespace gpufleet::control {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Key;

class NodeLeaseControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& [name, agent] : {std::pair{"a", true}, {"b", true}, {"fixed", false}}) {
      AddNode(name, agent);
    }
    ASSERT_OK(view_.Refresh());
  }

  void AddNode(const std::string& name, bool agent) {
    Node node;
    node.id = NodeId(name);
    node.capacity = {8000, 1 << 30};
    Gpu gpu;
    gpu.uuid = GpuUuid("GPU-" + name);
    gpu.model = "H100-80GB";
    node.gpus.push_back(gpu);
    Json doc = wire::NodeToJson(node, {});
    doc["agent"] = agent;
    store::WriteBatch batch;
    batch.Create(std::string(kNodesKind), name, doc.dump());
    ASSERT_OK(store_.Commit(batch));
  }

  std::string StateOf(const std::string& node) {
    const Result<store::StoredObject> stored = store_.Get(kNodesKind, node);
    EXPECT_OK(stored);
    return wire::StrOr(wire::ParseDocument(stored->data), "state");
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  SchedulingView view_{store_, catalog_};
  NodeLeaseController leases_{{.store = store_,
                               .clock = clock_,
                               .started_at = clock_.Now(),
                               .lease = std::chrono::seconds(40),
                               .stop_grace = std::chrono::seconds(30)}};
};

TEST_F(NodeLeaseControllerTest, AReportDeliveredLateRenewsNothing) {
  EXPECT_TRUE(leases_.Renew("a", 5, false));
  const MonoTime renewed = clock_.Now();
  clock_.Advance(std::chrono::seconds(10));
  EXPECT_FALSE(leases_.Renew("a", 5, false)) << "the same report twice";
  EXPECT_FALSE(leases_.Renew("a", 4, false)) << "an older one";
  EXPECT_EQ(leases_.HeartbeatTimes({"a"}).at("a"), renewed);
  EXPECT_TRUE(leases_.Renew("a", 0, false)) << "unnumbered";
  EXPECT_TRUE(leases_.Renew("a", 3, true)) << "a registration starts the numbers again";
  EXPECT_TRUE(leases_.Renew("a", 4, false));
  EXPECT_EQ(leases_.HeartbeatTimes({"a"}).at("a"), clock_.Now());
}

TEST_F(NodeLeaseControllerTest, OnlyAgentNodesSilentPastTheLeaseBecomeNotReady) {
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_TRUE(leases_.Renew("a", 1, false));
  clock_.Advance(std::chrono::seconds(10));
  Result<bool> wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_FALSE(*wrote) << "b has been silent for exactly the lease, since the server started";

  clock_.Advance(std::chrono::seconds(1));
  wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(StateOf("b"), "NotReady");
  EXPECT_EQ(StateOf("a"), "Ready") << "renewed 11 s ago";
  EXPECT_EQ(StateOf("fixed"), "Ready") << "no agent, no lease";
  const Result<std::vector<store::StoredEvent>> events = store_.Events(kNodesKind, "b");
  ASSERT_OK(events);
  ASSERT_FALSE(events->empty());
  EXPECT_THAT(events->back().text,
              HasSubstr("no heartbeat for 41s; its lease expired, so its agent stops its tasks; "
                        "their GPUs are free after another 30s"));
}

TEST_F(NodeLeaseControllerTest, SilentNodesAreFoundAmongHeartbeatsOfNodesTheViewDoesNotHold) {
  // Agent and fixed nodes interleaved by name, heartbeats of names the view does not hold (a node
  // deleted, one not yet read) before, between and after them, and nodes never heard from.
  std::set<std::string> expected_silent;
  for (int i = 0; i < 40; ++i) {
    const std::string name = fmt::format("n{:02}", i);
    AddNode(name, /*agent=*/i % 5 != 4);
    if (i % 5 != 4 && i % 3 != 0) {
      expected_silent.insert(name);  // renewed early below, then silent past the lease
    }
  }
  expected_silent.insert("b");
  ASSERT_OK(view_.Refresh());
  for (const char* stranger : {"0-gone", "m-gone", "n05x", "n17-gone", "zz-gone"}) {
    ASSERT_TRUE(leases_.Renew(stranger, 0, false));
  }
  for (int i = 1; i < 40; i += 3) {
    ASSERT_TRUE(leases_.Renew(fmt::format("n{:02}", i), 0, false));
  }
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_TRUE(leases_.Renew("a", 0, false));
  for (int i = 0; i < 40; i += 3) {
    ASSERT_TRUE(leases_.Renew(fmt::format("n{:02}", i), 0, false));
  }
  clock_.Advance(std::chrono::seconds(11));
  Result<bool> wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_TRUE(*wrote);
  std::set<std::string> not_ready;
  for (const char* node : {"a", "b", "fixed"}) {
    if (StateOf(node) == "NotReady") {
      not_ready.insert(node);
    }
  }
  for (int i = 0; i < 40; ++i) {
    const std::string name = fmt::format("n{:02}", i);
    if (StateOf(name) == "NotReady") {
      not_ready.insert(name);
    }
  }
  EXPECT_EQ(not_ready, expected_silent);
}

TEST_F(NodeLeaseControllerTest, ARenewalPutsANodeBehindTheOthersAndAForgottenNodeIsNotLookedAt) {
  ASSERT_TRUE(leases_.Renew("a", 0, false));
  clock_.Advance(std::chrono::seconds(1));
  ASSERT_TRUE(leases_.Renew("b", 0, false));
  ASSERT_TRUE(leases_.Renew("gone", 0, false));
  clock_.Advance(std::chrono::seconds(29));
  ASSERT_TRUE(leases_.Renew("a", 0, false));  // first heard, now last
  leases_.Forget("gone");
  clock_.Advance(std::chrono::seconds(12));
  Result<bool> wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(StateOf("b"), "NotReady") << "heard 41 s ago";
  EXPECT_EQ(StateOf("a"), "Ready") << "heard 12 s ago, after b";
  ASSERT_OK(view_.Refresh());
  clock_.Advance(std::chrono::seconds(30));
  wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(StateOf("a"), "NotReady") << "heard 42 s ago";
  EXPECT_TRUE(leases_.HeartbeatTimes({"gone"}).empty());
}

TEST_F(NodeLeaseControllerTest, ANodeNeverHeardFromIsFoundInTheCycleAfterTheViewReadsIt) {
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_TRUE(leases_.Renew("a", 0, false));
  clock_.Advance(std::chrono::seconds(11));  // 41 s: b was never heard from
  Result<bool> wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(StateOf("b"), "NotReady");
  ASSERT_OK(view_.Refresh());
  // Written by another server, never registered here; and b made Ready by hand (an uncordon),
  // with no heartbeat.
  AddNode("late", /*agent=*/true);
  Json doc = wire::ParseDocument(store_.Get(kNodesKind, "b")->data);
  doc["state"] = "Ready";
  store::WriteBatch batch;
  batch.Update(std::string(kNodesKind), "b", doc.dump(), store_.Get(kNodesKind, "b")->version);
  ASSERT_OK(store_.Commit(batch));
  clock_.Advance(std::chrono::seconds(1));
  ASSERT_TRUE(leases_.Renew("a", 0, false));
  wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_FALSE(*wrote) << "the view has not read them yet";
  ASSERT_OK(view_.Refresh());
  wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_TRUE(*wrote);
  EXPECT_EQ(StateOf("late"), "NotReady");
  EXPECT_EQ(StateOf("b"), "NotReady");
  EXPECT_EQ(StateOf("a"), "Ready");
}

TEST_F(NodeLeaseControllerTest, ARestartGivesEveryNodeTheFullLeaseFromThen) {
  ASSERT_TRUE(leases_.Renew("a", 7, false));
  // A follower that becomes the leader 100 s later: a and b heartbeated to the old leader.
  clock_.Advance(std::chrono::seconds(100));
  leases_.Restart(clock_.Now());
  EXPECT_TRUE(leases_.HeartbeatTimes({"a", "b"}).empty());
  clock_.Advance(std::chrono::seconds(40));
  Result<bool> wrote = leases_.MarkSilentNodesNotReady(view_);
  ASSERT_OK(wrote);
  EXPECT_FALSE(*wrote) << "silent for exactly the lease since the restart";
  EXPECT_EQ(StateOf("a"), "Ready");
  EXPECT_EQ(StateOf("b"), "Ready");
  EXPECT_TRUE(leases_.Renew("a", 1, false)) << "the sequence numbers start again";
}

TEST_F(NodeLeaseControllerTest, ANodesTasksAreSurelyGoneOnlyAfterTheLeaseAndTheGrace) {
  ASSERT_TRUE(leases_.Renew("a", 1, false));
  clock_.Advance(std::chrono::seconds(70));
  EXPECT_THAT(leases_.LostNodes(view_.nodes()), ElementsAre(Key("fixed")))
      << "70 s is not past lease + grace";
  clock_.Advance(std::chrono::seconds(1));
  const std::map<std::string, std::string> lost = leases_.LostNodes(view_.nodes());
  EXPECT_THAT(lost, ElementsAre(Key("a"), Key("b"), Key("fixed")));
  EXPECT_EQ(lost.at("a"), "node a lost: no heartbeat for 71s (lease 40s + stop grace 30s)");
  EXPECT_EQ(lost.at("fixed"), "node fixed runs no agent");
  leases_.Forget("a");
  EXPECT_TRUE(leases_.HeartbeatTimes({"a"}).empty());
}

}  // namespace
}  // namespace gpufleet::control
