// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/never_fits.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using scheduler::ClusterSnapshot;
using scheduler::testing::MakeJob;
using scheduler::testing::MakeNode;

// node-0 and node-1: 8 H100-80GB each, 96 CPUs, 1 TiB, labelled zone=a tier=gold and zone=b
// tier=silver. WithMig: node-1's first GPU in MIG mode.
Cluster Fleet() {
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("node-0", 8));
  cluster.nodes.push_back(MakeNode("node-1", 8));
  cluster.nodes[0].labels["zone"] = "a";
  cluster.nodes[1].labels["zone"] = "b";
  cluster.nodes[0].labels["tier"] = "gold";
  cluster.nodes[1].labels["tier"] = "silver";
  return cluster;
}

Cluster WithMig() {
  Cluster cluster = Fleet();
  cluster.nodes[1].gpus[0].mig_enabled = true;
  return cluster;
}

std::optional<NeverFits> Check(const Job& job, Cluster cluster) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<ClusterSnapshot> snapshot = ClusterSnapshot::Build(std::move(cluster), catalog);
  EXPECT_OK(snapshot);
  return snapshot.ok() ? CheckNeverFits(job, *snapshot) : std::nullopt;
}

struct NeverFitsRow {
  std::string name;
  std::function<void(Job&)> change;
  std::function<Cluster()> fleet;
  std::string want;  // "" when some node could hold it
  std::string field;
};

std::vector<NeverFitsRow> NeverFitsRows() {
  return {
      {"fits an empty node", [](Job&) {}, Fleet, "", ""},
      {"the whole fleet, all of it", [](Job& job) { job.groups[0].replicas = 2; }, Fleet, "", ""},
      {"more GPUs per task than any node",
       [](Job& job) { job.groups[0].request.gpus = WholeGpus{16}; }, Fleet,
       "task workers: 16 GPUs per task: the largest node it may use, node-0, has 8 H100-80GB",
       "spec.tasks[0].resources.gpus"},
      {"more GPUs in all than the fleet", [](Job& job) { job.groups[0].replicas = 3; }, Fleet,
       "24 GPUs in all: the nodes it may use have 16 GPUs together", "spec.tasks"},
      {"the whole fleet, but for a GPU in MIG mode", [](Job& job) { job.groups[0].replicas = 2; },
       WithMig,
       "16 GPUs in all: the nodes it may use have 15 GPUs together (and 1 in MIG mode, which "
       "whole GPUs do not use)",
       "spec.tasks"},
      {"more GPUs per task than a node has outside MIG mode",
       [](Job& job) {
         job.node_selector = {{"zone", "b"}};
       },
       WithMig,
       "task workers: 8 GPUs per task: the largest node it may use, node-1, has 7 H100-80GB, 1 "
       "in MIG mode",
       "spec.tasks[0].resources.gpus"},
      {"a model the fleet lacks", [](Job& job) { job.allowed_gpu_models = {"A100-80GB"}; }, Fleet,
       "GPU model A100-80GB: the fleet has none (it has H100-80GB)", "spec.gpuModels"},
      {"one model of two the fleet has",
       [](Job& job) {
         job.allowed_gpu_models = {"A100-80GB", "H100-80GB"};
       },
       Fleet, "", ""},
      {"more GPU memory than any GPU", [](Job& job) { job.min_gpu_memory_mib = 141 * 1024; }, Fleet,
       "minGpuMemory 141Gi: the largest GPU it may use has 80Gi", "spec.minGpuMemory"},
      {"a selector value no node has",
       [](Job& job) {
         job.node_selector = {{"zone", "c"}};
       },
       Fleet, "nodeSelector zone=c: no node has that label (nodes have zone=a|b)",
       "spec.nodeSelector"},
      {"a selector key no node has",
       [](Job& job) {
         job.node_selector = {{"rack", "r1"}};
       },
       Fleet, "nodeSelector rack=r1: no node has that label (no node has the key rack)",
       "spec.nodeSelector"},
      {"labels no node has together",
       [](Job& job) {
         job.node_selector = {{"zone", "a"}, {"tier", "silver"}};
       },
       Fleet, "nodeSelector tier=silver, zone=a: no node has all of these labels",
       "spec.nodeSelector"},
      {"a selector that leaves too few GPUs for the gang",
       [](Job& job) {
         job.node_selector = {{"zone", "a"}};
         job.groups[0].replicas = 2;
       },
       Fleet, "16 GPUs in all: the nodes it may use have 8 GPUs together", "spec.tasks"},
      {"a selector that matches",
       [](Job& job) {
         job.node_selector = {{"zone", "b"}};
       },
       Fleet, "", ""},
      {"a MIG profile with no GPU in MIG mode",
       [](Job& job) {
         job.groups[0].request.gpus = MigGpus{"1g.10gb", 1};
       },
       Fleet, "task workers: MIG profile 1g.10gb: no GPU it may use is in MIG mode",
       "spec.tasks[0].resources.gpus"},
      {"a MIG profile on a GPU in MIG mode",
       [](Job& job) {
         job.groups[0].request.gpus = MigGpus{"1g.10gb", 1};
       },
       WithMig, "", ""},
      {"a MIG profile no model has",
       [](Job& job) {
         job.groups[0].request.gpus = MigGpus{"9g.999gb", 1};
       },
       WithMig, "task workers: MIG profile 9g.999gb: no GPU model of the fleet it may use has it",
       "spec.tasks[0].resources.gpus"},
      {"a MIG GPU the selector excludes",
       [](Job& job) {
         job.groups[0].request.gpus = MigGpus{"1g.10gb", 1};
         job.node_selector = {{"zone", "a"}};
       },
       WithMig, "MIG profile 1g.10gb: no GPU it may use is in MIG mode",
       "spec.tasks[0].resources.gpus"},
      {"more CPU per task than any node",
       [](Job& job) { job.groups[0].request.host.cpu_milli = 128000; }, Fleet,
       "task workers: cpu 128 per task: the largest node it may use, node-0, has 96",
       "spec.tasks[0].resources.cpu"},
      {"a fractional share",
       [](Job& job) {
         job.groups[0].request.gpus = FractionalGpu{500, 1024};
       },
       Fleet, "", ""},
      {"a share with more memory than any GPU",
       [](Job& job) {
         job.groups[0].request.gpus = FractionalGpu{500, 200 * 1024};
       },
       Fleet, "task workers: gpu memory 200Gi per share", "spec.tasks[0].resources.gpus"},
      {"a CPU-only task", [](Job& job) { job.groups[0].request.gpus = NoGpu{}; }, Fleet, "", ""},
      {"no nodes yet", [](Job&) {}, [] { return Cluster{}; }, "the fleet has no nodes yet",
       "spec.tasks"},
  };
}

TEST(CheckNeverFits, EachThingAFleetCanLack) {
  for (const NeverFitsRow& row : NeverFitsRows()) {
    SCOPED_TRACE(row.name);
    Job job = MakeJob("j", 1, WholeGpus{8});
    row.change(job);
    const std::optional<NeverFits> never = Check(job, row.fleet());
    if (row.want.empty()) {
      EXPECT_FALSE(never.has_value()) << never->message;
      continue;
    }
    ASSERT_TRUE(never.has_value());
    EXPECT_THAT(never->message, ::testing::HasSubstr(row.want));
    EXPECT_EQ(never->field, row.field);
  }
}

// The answer is for the fleet as it is: a node that joins with what was missing clears it.
TEST(CheckNeverFits, ANodeThatJoinsClearsIt) {
  Job job = MakeJob("j", 1, WholeGpus{8});
  job.allowed_gpu_models = {"H200-141GB"};
  ASSERT_TRUE(Check(job, Fleet()).has_value());
  Cluster grown = Fleet();
  grown.nodes.push_back(MakeNode("node-2", 8, "H200-141GB"));
  EXPECT_FALSE(Check(job, grown).has_value());
}

// Remembering the shapes that fit never hides a job that cannot: every row, asked in turn of one
// check (twice over, so that each fitting shape is remembered), gets the full check's answer.
TEST(NeverFitsCheck, AnswersAsTheFullCheckDoes) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const std::vector<std::function<Cluster()>> fleets = {Fleet, WithMig, [] { return Cluster{}; }};
  std::vector<ClusterSnapshot> snapshots;
  for (const std::function<Cluster()>& fleet : fleets) {
    Result<ClusterSnapshot> snapshot = ClusterSnapshot::Build(fleet(), catalog);
    ASSERT_OK(snapshot);
    snapshots.push_back(std::move(*snapshot));
  }
  const std::vector<NeverFitsRow> rows = NeverFitsRows();
  for (size_t f = 0; f < fleets.size(); ++f) {
    NeverFitsCheck check;
    for (int round = 0; round < 2; ++round) {
      for (const NeverFitsRow& row : rows) {
        SCOPED_TRACE(fmt::format("{} on fleet {}, round {}", row.name, f, round));
        Job job = MakeJob(fmt::format("j{}", round), 1, WholeGpus{8});
        row.change(job);
        const std::optional<NeverFits> want = CheckNeverFits(job, snapshots[f]);
        const std::optional<NeverFits> got = check.Check(job, snapshots[f], f);
        ASSERT_EQ(got.has_value(), want.has_value());
        if (want.has_value()) {
          EXPECT_EQ(got->message, want->message);
        }
      }
    }
  }
}

// The shapes that fit are remembered for one shape epoch: when it moves, a job is checked anew.
TEST(NeverFitsCheck, AMovedShapeEpochChecksAnew) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster small;
  small.nodes.push_back(MakeNode("node-0", 4));
  Result<ClusterSnapshot> before = ClusterSnapshot::Build(Fleet(), catalog);
  Result<ClusterSnapshot> after = ClusterSnapshot::Build(std::move(small), catalog);
  ASSERT_OK(before);
  ASSERT_OK(after);
  NeverFitsCheck check;
  const Job job = MakeJob("j", 1, WholeGpus{8});
  EXPECT_FALSE(check.Check(job, *before, 1).has_value());
  // The same epoch on another fleet: the caller broke the contract, and the memory answers.
  EXPECT_FALSE(check.Check(job, *after, 1).has_value());
  const std::optional<NeverFits> never = check.Check(job, *after, 2);
  ASSERT_TRUE(never.has_value());
  EXPECT_THAT(never->message, ::testing::HasSubstr("8 GPUs per task"));
}

// A job that never fits is remembered with its task names: another of its shape is told its own.
TEST(NeverFitsCheck, TheMessageNamesEachJobsOwnTask) {
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<ClusterSnapshot> fleet = ClusterSnapshot::Build(Fleet(), catalog);
  ASSERT_OK(fleet);
  NeverFitsCheck check;
  Job first = MakeJob("first", 1, WholeGpus{16});
  Job second = first;
  second.groups[0].name = "trainer";
  for (int round = 0; round < 2; ++round) {
    const std::optional<NeverFits> a = check.Check(first, *fleet, 7);
    const std::optional<NeverFits> b = check.Check(second, *fleet, 7);
    ASSERT_TRUE(a.has_value() && b.has_value());
    EXPECT_THAT(a->message, ::testing::StartsWith("task workers: 16 GPUs per task"));
    EXPECT_THAT(b->message, ::testing::StartsWith("task trainer: 16 GPUs per task"));
  }
}

// What a node reports besides its shape leaves it the same; each field the check reads does not.
TEST(SameShapeForNeverFits, OnlyWhatTheCheckReadsCounts) {
  const Node node = Fleet().nodes[0];
  Node busy = node;
  busy.state = NodeState::kNotReady;
  busy.gpus[3].health = GpuHealth::kUnhealthy;
  busy.gpus[2].thermal_headroom_c = 5;
  busy.cached_images.push_back({.references = {"pytorch:24.05"}, .digest = "sha256:1"});
  EXPECT_TRUE(SameShapeForNeverFits(node, busy));

  const std::vector<std::pair<std::string, std::function<void(Node&)>>> changes = {
      {"cpu", [](Node& n) { n.capacity.cpu_milli += 1000; }},
      {"memory", [](Node& n) { n.capacity.memory_mib -= 1024; }},
      {"a label", [](Node& n) { n.labels["zone"] = "c"; }},
      {"a GPU fewer", [](Node& n) { n.gpus.pop_back(); }},
      {"a model", [](Node& n) { n.gpus[0].model = "A100-80GB"; }},
      {"GPU memory", [](Node& n) { n.gpus[0].memory_mib = 40 * 1024; }},
      {"MIG mode", [](Node& n) { n.gpus[0].mig_enabled = true; }},
      {"the name", [](Node& n) { n.id = NodeId("node-9"); }},
  };
  for (const auto& [what, change] : changes) {
    SCOPED_TRACE(what);
    Node changed = node;
    change(changed);
    EXPECT_FALSE(SameShapeForNeverFits(node, changed));
  }
}

}  // namespace
}  // namespace gpufleet::policy
