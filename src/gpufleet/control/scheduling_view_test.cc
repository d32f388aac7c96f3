// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/scheduling_view.h"

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/random.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/store/testing/fault_injecting_store.h"
#include "gpufleet/wire/node_json.h"

namespace gpufleet::control {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Node MakeNode(const std::string& name) {
  Node node;
  node.id = NodeId(name);
  node.capacity = {32000, 262144};
  for (int i = 0; i < 4; ++i) {
    Gpu gpu;
    gpu.index = i;
    gpu.model = "H100-80GB";
    gpu.memory_mib = 81920;
    gpu.uuid = GpuUuid(name + "-gpu" + std::to_string(i));
    node.gpus.push_back(gpu);
  }
  return node;
}

// A job document holding whole GPUs of `node`, named by UUID as the server writes them.
std::string JobDoc(const std::string& name, const std::string& state, const std::string& node,
                   const std::vector<int>& indices) {
  Json assignments = Json::array();
  Json uuids = Json::array();
  for (const int index : indices) {
    assignments.push_back({{"milli", 1000}, {"memory_mib", 0}});
    uuids.push_back(node + "-gpu" + std::to_string(index));
  }
  Json placements = Json::array();
  if (!node.empty()) {
    placements.push_back({{"task", "main-0"},
                          {"node", node},
                          {"gpus", indices},
                          {"gpu_uuids", uuids},
                          {"group", 0},
                          {"replica", 0},
                          {"cpu_milli", 1000},
                          {"memory_mib", 1024},
                          {"assignments", assignments}});
  }
  return Json{{"name", name}, {"state", state}, {"priority", 0}, {"placements", placements}}.dump();
}

// A job document holding `gpus` whole GPUs of `node` (GPU indices 0..gpus-1).
std::string JobDoc(const std::string& name, const std::string& state, const std::string& node,
                   int gpus) {
  std::vector<int> indices;
  for (int i = 0; i < gpus; ++i) {
    indices.push_back(i);
  }
  return JobDoc(name, state, node, indices);
}

class SchedulingViewTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store::WriteBatch batch;
    for (const std::string name : {"node-a", "node-b"}) {
      batch.Create(std::string(kNodesKind), name, wire::NodeToJson(MakeNode(name), {}).dump());
    }
    batch.Create(std::string(kJobsKind), "running", JobDoc("running", "Running", "node-a", 3));
    batch.Create(std::string(kJobsKind), "done", JobDoc("done", "Succeeded", "node-b", 4));
    batch.Create(std::string(kJobsKind), "waiting", JobDoc("waiting", "Pending", "", 0));
    ASSERT_TRUE(store_.Commit(batch).ok());
  }

  void Update(const std::string& kind, const std::string& name, const std::string& data) {
    const Result<store::StoredObject> object = store_.Get(kind, name);
    ASSERT_TRUE(object.ok());
    store::WriteBatch batch;
    batch.Update(kind, name, data, object->version);
    ASSERT_TRUE(store_.Commit(batch).ok());
  }

  // The UUIDs of the GPUs of `node` that the view holds taken.
  std::set<std::string> TakenGpus(const std::string& node) {
    std::set<std::string> out;
    const scheduler::NodeInfo& info = view_.snapshot().nodes()[view_.NodeIndex(node)];
    for (size_t i = 0; i < info.gpus.size(); ++i) {
      if (info.gpus[i].free_milli < kMilliPerUnit) {
        out.insert(info.node->gpus[i].uuid.value());
      }
    }
    return out;
  }

  int64_t FreeMilli() {
    return view_.snapshot().TotalGpuMilli() - view_.snapshot().AllocatedGpuMilli();
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  store::InMemoryStateStore store_;
  SchedulingView view_{store_, catalog_};
};

TEST_F(SchedulingViewTest, LoadsNodesAndActiveJobsWithTheirPlacementsApplied) {
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(view_.nodes().size(), 2u);
  EXPECT_EQ(view_.jobs().size(), 2u);  // finished jobs are left out
  EXPECT_EQ(view_.jobs().at("waiting").state, JobState::kPending);
  EXPECT_TRUE(view_.jobs().at("running").applied);
  EXPECT_EQ(FreeMilli(), 5000);
  EXPECT_EQ(view_.ActiveJobsByNode().at("node-a").count("running"), 1u);
}

// The load reads the store's state index, which cannot read a state written with an escape
// sequence: such a job is still loaded (as not finished), so its GPUs stay taken.
TEST_F(SchedulingViewTest, AJobWhoseStateTheIndexCannotReadIsStillLoaded) {
  std::string doc = JobDoc("escaped", "Running", "node-b", 2);
  const size_t at = doc.find("\"Running\"");
  ASSERT_NE(at, std::string::npos);
  doc.replace(at, 9, R"("Runn\u0069ng")");
  ASSERT_EQ(store::IndexedState(doc), "");
  ASSERT_TRUE(
      store_.Commit(store::WriteBatch().Create(std::string(kJobsKind), "escaped", doc)).ok());
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(view_.jobs().size(), 3u);
  EXPECT_EQ(view_.jobs().at("escaped").state, JobState::kRunning);
  EXPECT_EQ(TakenGpus("node-b"), (std::set<std::string>{"node-b-gpu0", "node-b-gpu1"}));
}

// The view reads job documents as wire::JobRecord: one it cannot read (a member of the wrong
// type) leaves the job as last read, its GPUs still taken, and one never read is not taken in.
TEST_F(SchedulingViewTest, AJobDocumentTheRecordCannotReadKeepsTheJobAsLastRead) {
  ASSERT_TRUE(view_.Refresh().ok());
  Json unreadable = wire::ParseDocument(JobDoc("running", "Stopping", "node-a", 3));
  unreadable["placements"] = "none";
  Update(std::string(kJobsKind), "running", unreadable.dump());
  Json fresh = wire::ParseDocument(JobDoc("fresh", "Running", "node-b", 1));
  fresh["attempt"] = "first";
  ASSERT_TRUE(
      store_.Commit(store::WriteBatch().Create(std::string(kJobsKind), "fresh", fresh.dump()))
          .ok());
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(view_.jobs().at("running").state, JobState::kRunning);
  EXPECT_EQ(TakenGpus("node-a"),
            (std::set<std::string>{"node-a-gpu0", "node-a-gpu1", "node-a-gpu2"}));
  EXPECT_EQ(view_.jobs().count("fresh"), 0u);
  EXPECT_TRUE(TakenGpus("node-b").empty());
}

TEST_F(SchedulingViewTest, AJobThatEndsGivesItsGpusBackAndMovesTheCapacityEpoch) {
  ASSERT_TRUE(view_.Refresh().ok());
  const uint64_t epoch = view_.capacity_epoch();
  Update(std::string(kJobsKind), "running", JobDoc("running", "Cancelled", "node-a", 3));
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(view_.jobs().count("running"), 0u);
  EXPECT_EQ(FreeMilli(), 8000);
  EXPECT_GT(view_.capacity_epoch(), epoch);
}

TEST_F(SchedulingViewTest, APlacementWrittenByAnotherWriterIsAppliedAndKeptOnNodeChanges) {
  ASSERT_TRUE(view_.Refresh().ok());
  Update(std::string(kJobsKind), "waiting", JobDoc("waiting", "Scheduled", "node-b", 2));
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(FreeMilli(), 3000);
  // A node change rebuilds the snapshot; the active jobs' placements come back with it.
  Node cordoned = MakeNode("node-b");
  cordoned.state = NodeState::kCordoned;
  Update(std::string(kNodesKind), "node-b", wire::NodeToJson(cordoned, {}).dump());
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(FreeMilli(), 3000);
  EXPECT_EQ(view_.snapshot().nodes()[view_.NodeIndex("node-b")].node->state, NodeState::kCordoned);
}

TEST_F(SchedulingViewTest, NothingChangedMeansNothingMoves) {
  ASSERT_TRUE(view_.Refresh().ok());
  const uint64_t epoch = view_.capacity_epoch();
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(view_.capacity_epoch(), epoch);
  EXPECT_EQ(FreeMilli(), 5000);
}

TEST_F(SchedulingViewTest, AJobDeletedAndSubmittedAgainIsReadAsTheNewJob) {
  ASSERT_TRUE(view_.Refresh().ok());
  // The cycle parsed the old job's spec and found it did not fit.
  view_.jobs().at("waiting").spec = Result<Job>(Job{});
  view_.jobs().at("waiting").unschedulable_epoch = view_.capacity_epoch();
  // Deleted and submitted again between two refreshes: version 1 once more, another document.
  store::WriteBatch remove;
  remove.Delete(std::string(kJobsKind), "waiting");
  ASSERT_TRUE(store_.Commit(remove).ok());
  Json again = Json::parse(JobDoc("waiting", "Pending", "", 0));
  again["priority"] = 5;
  store::WriteBatch create;
  create.Create(std::string(kJobsKind), "waiting", again.dump());
  ASSERT_TRUE(store_.Commit(create).ok());
  ASSERT_EQ(store_.Get(std::string(kJobsKind), "waiting")->version,
            view_.jobs().at("waiting").version);
  ASSERT_TRUE(view_.Refresh().ok());
  const ViewJob& job = view_.jobs().at("waiting");
  EXPECT_EQ(job.priority, 5);
  EXPECT_FALSE(job.spec.has_value());  // parsed again from the new document
  EXPECT_FALSE(job.unschedulable_epoch.has_value());
}

TEST_F(SchedulingViewTest, AJobOnAnUnknownNodeHoldsNothing) {
  ASSERT_TRUE(view_.Refresh().ok());
  Update(std::string(kJobsKind), "waiting", JobDoc("waiting", "Running", "node-gone", 2));
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_FALSE(view_.jobs().at("waiting").applied);
  EXPECT_EQ(FreeMilli(), 5000);
}

TEST_F(SchedulingViewTest, APlacementKeepsItsGpusByUuidWhenTheNodeListsThemInAnotherOrder) {
  ASSERT_TRUE(view_.Refresh().ok());
  ASSERT_THAT(TakenGpus("node-a"), ElementsAre("node-a-gpu0", "node-a-gpu1", "node-a-gpu2"));
  // The node registers again with its GPUs reversed: each now has another index and position.
  Node reordered = MakeNode("node-a");
  std::reverse(reordered.gpus.begin(), reordered.gpus.end());
  for (size_t i = 0; i < reordered.gpus.size(); ++i) {
    reordered.gpus[i].index = static_cast<int>(i);
  }
  Update(std::string(kNodesKind), "node-a", wire::NodeToJson(reordered, {}).dump());
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_THAT(TakenGpus("node-a"), ElementsAre("node-a-gpu0", "node-a-gpu1", "node-a-gpu2"));
  EXPECT_EQ(FreeMilli(), 5000);
}

TEST_F(SchedulingViewTest, AGpuItsNodeNoLongerHasIsNeverTakenForAnother) {
  ASSERT_TRUE(view_.Refresh().ok());
  Node fewer = MakeNode("node-a");
  fewer.gpus.erase(fewer.gpus.begin() + 1);  // gpu1 goes; gpu2 and gpu3 move up the list
  Update(std::string(kNodesKind), "node-a", wire::NodeToJson(fewer, {}).dump());
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_THAT(TakenGpus("node-a"), ElementsAre("node-a-gpu0", "node-a-gpu2"));
}

TEST_F(SchedulingViewTest, AJobStoredBeforePlacementsNamedUuidsHoldsTheGpusOfItsIndices) {
  ASSERT_TRUE(view_.Refresh().ok());
  // As the server wrote placements before: NVML indices and positions, no UUIDs.
  Json doc = Json::parse(JobDoc("waiting", "Running", "node-b", std::vector<int>{1, 3}));
  Json& placement = doc["placements"][0];
  placement.erase("gpu_uuids");
  placement["assignments"][0]["gpu"] = 1;
  placement["assignments"][1]["gpu"] = 3;
  Update(std::string(kJobsKind), "waiting", doc.dump());
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_TRUE(view_.jobs().at("waiting").applied);
  EXPECT_THAT(TakenGpus("node-b"), ElementsAre("node-b-gpu1", "node-b-gpu3"));
}

TEST_F(SchedulingViewTest, AMalformedNodeIsLeftOutWithAReasonAndTheOthersStay) {
  ASSERT_TRUE(view_.Refresh().ok());
  const int64_t all = FreeMilli();
  Update(std::string(kNodesKind), "node-b", R"({"name": "node-b", "state": "Sleeping"})");
  // One bad document stops nothing: the view refreshes without that node and says why, once.
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_LT(FreeMilli(), all);
  ASSERT_EQ(view_.excluded_nodes().count("node-b"), 1u);
  EXPECT_THAT(view_.excluded_nodes().at("node-b"), HasSubstr("left out of scheduling"));
  EXPECT_EQ(view_.TakeNewlyExcludedNodes().count("node-b"), 1u);
  EXPECT_TRUE(view_.TakeNewlyExcludedNodes().empty());
  Update(std::string(kNodesKind), "node-b", wire::NodeToJson(MakeNode("node-b"), {}).dump());
  ASSERT_TRUE(view_.Refresh().ok());
  EXPECT_EQ(FreeMilli(), 5000);
  EXPECT_TRUE(view_.excluded_nodes().empty());
}

TEST_F(SchedulingViewTest, ANodeOverTheSchedulersLimitsIsLeftOut) {
  Node big = MakeNode("node-big");
  big.gpus.resize(65, big.gpus.empty() ? Gpu{} : big.gpus[0]);
  for (size_t i = 0; i < big.gpus.size(); ++i) {
    big.gpus[i].index = static_cast<int>(i);
  }
  store::WriteBatch batch;
  batch.Create(std::string(kNodesKind), "node-big", wire::NodeToJson(big, {}).dump());
  ASSERT_TRUE(store_.Commit(batch).ok());
  ASSERT_TRUE(view_.Refresh().ok());
  ASSERT_EQ(view_.excluded_nodes().count("node-big"), 1u);
  EXPECT_THAT(view_.excluded_nodes().at("node-big"), HasSubstr("65 GPUs, at most 64"));
  EXPECT_EQ(FreeMilli(), 5000);
}

TEST_F(SchedulingViewTest, ANodeChangeReplacesThatNodeAloneAndKeepsItsPlacements) {
  ASSERT_TRUE(view_.Refresh().ok());
  const uint64_t identity = view_.snapshot().identity();
  const uint64_t other = view_.snapshot().nodes()[view_.NodeIndex("node-b")].version;
  const uint64_t before = view_.snapshot().nodes()[view_.NodeIndex("node-a")].version;
  Node node = MakeNode("node-a");
  node.gpus[3].health = GpuHealth::kUnhealthy;
  Update(std::string(kNodesKind), "node-a", wire::NodeToJson(node, {}).dump());
  ASSERT_TRUE(view_.Refresh().ok());
  // Not rebuilt: the other node is untouched, this one moved on with the job's GPUs still taken.
  EXPECT_EQ(view_.snapshot().identity(), identity);
  EXPECT_EQ(view_.snapshot().nodes()[view_.NodeIndex("node-b")].version, other);
  const scheduler::NodeInfo& info = view_.snapshot().nodes()[view_.NodeIndex("node-a")];
  EXPECT_GT(info.version, before);
  EXPECT_EQ(info.gpus[3].health, GpuHealth::kUnhealthy);
  EXPECT_EQ(TakenGpus("node-a"),
            (std::set<std::string>{"node-a-gpu0", "node-a-gpu1", "node-a-gpu2"}));
  EXPECT_EQ(FreeMilli(), 5000);
}

// Everything the scheduler reads of a snapshot, and what the view holds of each job, as text.
std::string Describe(SchedulingView& view) {
  std::string out;
  const scheduler::ClusterSnapshot& snapshot = view.snapshot();
  out += fmt::format("total {} allocated {} gpus {}\n", snapshot.TotalGpuMilli(),
                     snapshot.AllocatedGpuMilli(), snapshot.TotalGpus());
  // By name: a rebuilt snapshot may number the models in another order.
  std::map<std::string, int> gpus_by_model;
  for (int id = 0; id < snapshot.ModelCount(); ++id) {
    if (snapshot.GpuCount(id) > 0) {
      gpus_by_model[snapshot.Model(id).name] = snapshot.GpuCount(id);
    }
  }
  for (const auto& [model, count] : gpus_by_model) {
    out += fmt::format("model {} gpus {}\n", model, count);
  }
  for (const scheduler::NodeInfo& node : snapshot.nodes()) {
    out += fmt::format("{} {} state {} free {}/{} kinds", node.index, node.node->id.value(),
                       NodeStateName(node.node->state), node.free.cpu_milli, node.free.memory_mib);
    // The kinds' order follows the history of the node, which no decision reads.
    std::vector<std::pair<int, int>> kinds = node.gpu_task_kinds;
    std::sort(kinds.begin(), kinds.end());
    for (const auto& [kind, count] : kinds) {
      out += fmt::format(" {}:{}", kind, count);
    }
    for (const scheduler::GpuSlot& gpu : node.gpus) {
      out += fmt::format(" [{} {} {} {} {} mig {}]", gpu.index, snapshot.Model(gpu.model_id).name,
                         gpu.free_milli, gpu.free_memory_mib, GpuHealthName(gpu.health),
                         gpu.mig_instances.size());
    }
    out += "\n";
  }
  out += fmt::format("mig enabled {}\n", fmt::join(view.mig_enabled_nodes(), ","));
  out += fmt::format("not ready {}\n", fmt::join(view.not_ready_nodes(), ","));
  for (const auto& [node, jobs] : view.ActiveJobsByNode()) {
    out += fmt::format("active on {}: {}\n", node, fmt::join(jobs, ","));
  }
  for (const JobState state : kJobStates) {
    out += fmt::format("{} {}\n", JobStateName(state), view.JobsInState(state));
  }
  for (const auto& [name, job] : view.jobs()) {
    out += fmt::format("job {} {} applied {}", name, JobStateName(job.state), job.applied);
    for (const scheduler::TaskPlacement& placement : job.placements) {
      out += fmt::format(" {}/{}@{}:", placement.group, placement.replica, placement.node);
      for (const scheduler::GpuAssignment& gpu : placement.gpus) {
        out += fmt::format("{},", gpu.gpu);
      }
    }
    out += "\n";
  }
  return out;
}

TEST(SchedulingViewOwnWrites, TheCyclesOwnWriteIsNotReadAgainButAnotherWritersIs) {
  const GpuCatalog catalog = GpuCatalog::Default();
  store::InMemoryStateStore backing;
  store::testing::FaultInjectingStateStore store(backing);  // counts the objects read
  store::WriteBatch setup;
  setup.Create(std::string(kNodesKind), "node-a", wire::NodeToJson(MakeNode("node-a"), {}).dump());
  setup.Create(std::string(kJobsKind), "waiting", JobDoc("waiting", "Pending", "", 0));
  ASSERT_TRUE(store.Commit(setup).ok());
  SchedulingView view(store, catalog);
  ASSERT_TRUE(view.Refresh().ok());

  // The cycle writes a new reason and records it, as ApiServer::CommitCycleWrites does.
  Json doc = Json::parse(JobDoc("waiting", "Pending", "", 0));
  doc["reason"] = "no room";
  store::WriteBatch own;
  own.Update(std::string(kJobsKind), "waiting", doc.dump(), 1);
  ASSERT_TRUE(store.Commit(own).ok());
  view.MarkReasonWritten("waiting", 2, doc.dump());
  const int64_t gets = store.get_count();
  ASSERT_TRUE(view.Refresh().ok());
  EXPECT_EQ(store.get_count(), gets);
  EXPECT_EQ(view.jobs().at("waiting").version, 2);

  // Another writer's update after it is read, whatever order the two were reported in.
  doc["priority"] = 7;
  store::WriteBatch other;
  other.Update(std::string(kJobsKind), "waiting", doc.dump(), 2);
  ASSERT_TRUE(store.Commit(other).ok());
  ASSERT_TRUE(view.Refresh().ok());
  EXPECT_EQ(store.get_count(), gets + 1);
  EXPECT_EQ(view.jobs().at("waiting").priority, 7);

  // A commit whose outcome the cycle does not know is read again.
  view.ReadJobAgain("waiting");
  ASSERT_TRUE(view.Refresh().ok());
  EXPECT_EQ(store.get_count(), gets + 2);
}

// A commit that failed may have been written (an answer lost after the COMMIT): the view reads
// its objects again at the next refresh, with no full reload, and so sees what was written.
TEST(SchedulingViewFailedCommits, AWriteReportedFailedIsReadAgain) {
  const GpuCatalog catalog = GpuCatalog::Default();
  store::InMemoryStateStore backing;
  store::testing::FaultInjectingStateStore store(backing);
  store::WriteBatch setup;
  setup.Create(std::string(kNodesKind), "node-a", wire::NodeToJson(MakeNode("node-a"), {}).dump());
  setup.Create(std::string(kJobsKind), "waiting", JobDoc("waiting", "Pending", "", 0));
  ASSERT_TRUE(store.Commit(setup).ok());
  SchedulingView view(store, catalog);
  ASSERT_TRUE(view.Refresh().ok());
  const uint64_t epoch = view.capacity_epoch();

  store.FailNthCommit(1, store::testing::FaultInjectingStateStore::FaultMode::kAfterCommit);
  store::WriteBatch placed;
  placed.Update(std::string(kJobsKind), "waiting", JobDoc("waiting", "Scheduled", "node-a", 2), 1);
  ASSERT_FALSE(store.Commit(placed).ok());
  const int64_t gets = store.get_count();
  ASSERT_TRUE(view.Refresh().ok());
  EXPECT_EQ(store.get_count(), gets + 1);
  EXPECT_EQ(view.jobs().at("waiting").state, JobState::kScheduled);
  EXPECT_EQ(view.jobs().at("waiting").version, 2);
  EXPECT_TRUE(view.jobs().at("waiting").applied);
  EXPECT_EQ(view.snapshot().AllocatedGpuMilli(), 2000);

  // One that was not written leaves the job as stored, read once more.
  store.FailNthCommit(1, store::testing::FaultInjectingStateStore::FaultMode::kBeforeCommit);
  store::WriteBatch ended;
  ended.Update(std::string(kJobsKind), "waiting", JobDoc("waiting", "Cancelled", "node-a", 2), 2);
  ASSERT_FALSE(store.Commit(ended).ok());
  ASSERT_TRUE(view.Refresh().ok());
  EXPECT_EQ(store.get_count(), gets + 2);
  EXPECT_EQ(view.jobs().at("waiting").state, JobState::kScheduled);
  EXPECT_EQ(view.snapshot().AllocatedGpuMilli(), 2000);
  EXPECT_EQ(view.capacity_epoch(), epoch);
}

// The view kept up to date commit by commit (nodes replaced in place, jobs re-read) equals a view
// loaded from scratch after every step of a random sequence of node and job writes.
TEST(SchedulingViewEquivalence, IncrementalRefreshEqualsAFullLoadAfterRandomWrites) {
  const GpuCatalog catalog = GpuCatalog::Default();
  store::InMemoryStateStore store;
  SchedulingView view(store, catalog);
  std::map<std::string, Node> nodes;
  // Which job holds each GPU (node, index), so that jobs never claim a taken GPU.
  std::map<std::pair<std::string, int>, std::string> owner;
  std::map<std::string, std::vector<std::pair<std::string, int>>> running;
  std::set<std::string> pending;
  Random pick(11);
  auto put = [&](const std::string& kind, const std::string& name, const std::string& data,
                 bool remove = false) {
    store::WriteBatch batch;
    const Result<store::StoredObject> old = store.Get(kind, name);
    if (remove) {
      batch.Delete(kind, name, old->version);
    } else if (old.ok()) {
      batch.Update(kind, name, data, old->version);
    } else {
      batch.Create(kind, name, data);
    }
    ASSERT_TRUE(store.Commit(batch).ok());
  };
  for (int i = 0; i < 6; ++i) {
    const std::string name = fmt::format("node-{}", i);
    nodes[name] = MakeNode(name);
    put(std::string(kNodesKind), name, wire::NodeToJson(nodes[name], {}).dump());
  }
  ASSERT_TRUE(view.Refresh().ok());
  int job_count = 0;
  for (int step = 0; step < 300; ++step) {
    const int writes = 1 + static_cast<int>(pick.Uniform(3));
    for (int w = 0; w < writes; ++w) {
      const uint64_t what = pick.Uniform(12);
      auto node_it =
          std::next(nodes.begin(), static_cast<std::ptrdiff_t>(pick.Uniform(nodes.size())));
      Node& node = node_it->second;
      if (what < 3) {
        // A heartbeat's news: a GPU's health or MIG mode, or the node's state.
        if (const uint64_t news = pick.Uniform(3); news == 0) {
          Gpu& gpu = node.gpus[pick.Uniform(node.gpus.size())];
          gpu.health =
              gpu.health == GpuHealth::kHealthy ? GpuHealth::kUnhealthy : GpuHealth::kHealthy;
        } else if (news == 1) {
          // Only on a GPU no job holds whole (and no job is placed on one MIG-enabled).
          const int index = static_cast<int>(pick.Uniform(node.gpus.size()));
          if (owner.count({node_it->first, index}) == 0) {
            node.gpus[index].mig_enabled = !node.gpus[index].mig_enabled;
          }
        } else {
          // Ready -> Cordoned -> NotReady -> Ready.
          node.state = node.state == NodeState::kReady      ? NodeState::kCordoned
                       : node.state == NodeState::kCordoned ? NodeState::kNotReady
                                                            : NodeState::kReady;
        }
        put(std::string(kNodesKind), node_it->first, wire::NodeToJson(node, {}).dump());
      } else if (what == 3) {
        // A model new to the snapshot (rebuilds it), or back.
        node.gpus[0].model = node.gpus[0].model == "H100-80GB" ? "A100-80GB" : "H100-80GB";
        node.gpus[0].memory_mib = 81920;
        put(std::string(kNodesKind), node_it->first, wire::NodeToJson(node, {}).dump());
      } else if (what < 7) {
        // A job placed on free GPUs of one or two nodes.
        const std::string job = fmt::format("job-{:03}", job_count++);
        std::vector<std::pair<std::string, int>> gpus;
        Json placements = Json::array();
        for (int part = 0; part < 1 + static_cast<int>(pick.Uniform(2)); ++part) {
          auto on =
              std::next(nodes.begin(), static_cast<std::ptrdiff_t>(pick.Uniform(nodes.size())));
          std::vector<int> indices;
          for (int g = 0; g < 4 && indices.size() < 2; ++g) {
            if (owner.count({on->first, g}) == 0 && !on->second.gpus[g].mig_enabled &&
                pick.Uniform(2) == 0) {
              indices.push_back(g);
            }
          }
          if (indices.empty()) {
            continue;
          }
          Json one =
              wire::ParseDocument(JobDoc(job, "Running", on->first, indices))["placements"][0];
          one["replica"] = part;
          placements.push_back(one);
          for (const int g : indices) {
            owner[{on->first, g}] = job;
            gpus.emplace_back(on->first, g);
          }
        }
        if (placements.empty()) {
          continue;
        }
        running[job] = gpus;
        put(std::string(kJobsKind), job,
            Json{{"name", job}, {"state", "Running"}, {"priority", 0}, {"placements", placements}}
                .dump());
      } else if (what == 10) {
        // A job waits in one of three queues, or moves to another.
        std::string job;
        Json doc;
        if (pending.empty() || pick.Uniform(2) == 0) {
          job = fmt::format("job-{:03}", job_count++);
          pending.insert(job);
          doc = Json{{"name", job}, {"state", "Pending"}, {"priority", 0}};
        } else {
          job = *std::next(pending.begin(),
                           static_cast<std::ptrdiff_t>(pick.Uniform(pending.size())));
          doc = wire::ParseDocument(store.Get(std::string(kJobsKind), job)->data);
        }
        doc["queue"] = fmt::format("q{}", pick.Uniform(3));
        put(std::string(kJobsKind), job, doc.dump());
      } else if (what == 11 && !pending.empty()) {
        // A waiting job is cancelled, or deleted.
        const auto job =
            std::next(pending.begin(), static_cast<std::ptrdiff_t>(pick.Uniform(pending.size())));
        if (pick.Uniform(2) == 0) {
          put(std::string(kJobsKind), *job, "", /*remove=*/true);
        } else {
          Json doc = wire::ParseDocument(store.Get(std::string(kJobsKind), *job)->data);
          doc["state"] = "Cancelled";
          put(std::string(kJobsKind), *job, doc.dump());
        }
        pending.erase(job);
      } else if (what < 10 && !running.empty()) {
        // A job starts stopping (it keeps its GPUs), or ends (finished, or deleted).
        auto job =
            std::next(running.begin(), static_cast<std::ptrdiff_t>(pick.Uniform(running.size())));
        Json doc = wire::ParseDocument(store.Get(std::string(kJobsKind), job->first)->data);
        if (what == 7 && doc["state"] == "Running") {
          doc["state"] = "Stopping";
          put(std::string(kJobsKind), job->first, doc.dump());
          continue;
        }
        for (const auto& gpu : job->second) {
          owner.erase(gpu);
        }
        if (what == 9) {
          put(std::string(kJobsKind), job->first, "", /*remove=*/true);
        } else {
          doc["state"] = "Succeeded";
          put(std::string(kJobsKind), job->first, doc.dump());
        }
        running.erase(job);
      }
    }
    ASSERT_TRUE(view.Refresh().ok());
    SchedulingView fresh(store, catalog);
    ASSERT_TRUE(fresh.Refresh().ok());
    ASSERT_EQ(Describe(view), Describe(fresh)) << "step " << step;
    // What the view keeps as jobs and nodes change, counted afresh from what it holds.
    std::map<std::string, std::set<std::string>> active;
    std::map<JobState, std::vector<std::string>> in_state;
    std::map<std::string, size_t> pending_by_queue;
    for (const auto& [name, job] : view.jobs()) {
      in_state[job.state].push_back(name);
      if (job.state == JobState::kPending) {
        ++pending_by_queue[job.queue];
      }
      if (HoldsResources(job.state)) {
        for (const std::string& node : job.nodes) {
          active[node].insert(name);
        }
      }
    }
    ASSERT_EQ(view.ActiveJobsByNode(), active) << "step " << step;
    for (const JobState state : kJobStates) {
      std::vector<std::string> indexed;
      for (const ViewJobEntry* entry : view.JobsIn(state)) {
        indexed.push_back(entry->first);
        ASSERT_EQ(entry, &*view.jobs().find(entry->first)) << "step " << step;
      }
      ASSERT_EQ(indexed, in_state[state]) << "step " << step << " " << JobStateName(state);
      ASSERT_EQ(view.JobsInState(state), in_state[state].size()) << "step " << step;
    }
    ASSERT_EQ(view.PendingByQueue(), pending_by_queue) << "step " << step;
    std::set<std::string> mig_enabled;
    for (const auto& [name, node] : view.nodes()) {
      if (std::any_of(node.node.gpus.begin(), node.node.gpus.end(),
                      [](const Gpu& gpu) { return gpu.mig_enabled; })) {
        mig_enabled.insert(name);
      }
    }
    ASSERT_EQ(view.mig_enabled_nodes(), mig_enabled) << "step " << step;
    std::set<std::string> not_ready;
    for (const auto& [name, node] : view.nodes()) {
      if (node.node.state == NodeState::kNotReady) {
        not_ready.insert(name);
      }
    }
    ASSERT_EQ(view.not_ready_nodes(), not_ready) << "step " << step;
  }
  EXPECT_GT(job_count, 50);
  EXPECT_FALSE(pending.empty());
}

}  // namespace
}  // namespace gpufleet::control
