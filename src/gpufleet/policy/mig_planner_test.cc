// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/policy/mig_planner.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/random.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::policy {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

MigInstance Used(const std::string& profile, int start) {
  return {profile, start, true};
}
MigInstance Free(const std::string& profile, int start) {
  return {profile, start, false};
}

MigGpu H100(const std::string& node, int gpu, std::vector<MigInstance> instances) {
  return {NodeId(node), gpu, "H100-80GB", std::move(instances)};
}

MigRequest Request(const std::string& id, const std::string& profile, int count = 1) {
  return {id, profile, count, {}};
}

class MigPlannerTest : public ::testing::Test {
 protected:
  MigPlan Plan(const std::vector<MigGpu>& gpus, const std::vector<MigRequest>& requests,
               MigPlannerOptions options = {}) {
    Result<MigPlan> plan = PlanMigLayouts(catalog_, gpus, requests, options);
    EXPECT_OK(plan);
    if (!plan.ok()) {
      return {};
    }
    ExpectValid(*plan, gpus);
    EXPECT_EQ(plan->served.size() + plan->unserved.size(), requests.size());
    return *plan;
  }

  // Every planned layout is valid, reachable by destroying free instances only, keeps every
  // instance in use as it was, and is what ApplyMigGpuPlan makes of the GPU.
  void ExpectValid(const MigPlan& plan, const std::vector<MigGpu>& gpus) {
    for (const MigGpuPlan& gpu_plan : plan.gpus) {
      SCOPED_TRACE(fmt::format("node {} gpu {}", gpu_plan.node.value(), gpu_plan.gpu));
      auto input = std::find_if(gpus.begin(), gpus.end(), [&](const MigGpu& gpu) {
        return gpu.node == gpu_plan.node && gpu.gpu == gpu_plan.gpu;
      });
      ASSERT_NE(input, gpus.end());
      const GpuModelInfo& model = *catalog_.Find(input->model).value();
      EXPECT_OK(MigLayout::FromInstances(model, gpu_plan.layout));
      EXPECT_FALSE(gpu_plan.destroy.empty() && gpu_plan.create.empty());
      for (const MigInstance& instance : gpu_plan.destroy) {
        EXPECT_FALSE(instance.in_use);
        EXPECT_NE(std::find(input->instances.begin(), input->instances.end(), instance),
                  input->instances.end());
      }
      for (const MigInstance& instance : input->instances) {
        if (instance.in_use) {
          EXPECT_NE(std::find(gpu_plan.layout.begin(), gpu_plan.layout.end(), instance),
                    gpu_plan.layout.end())
              << "in-use " << instance.profile << " at " << instance.start << " was touched";
        }
      }
      Result<std::vector<MigInstance>> applied = ApplyMigGpuPlan(model, input->instances, gpu_plan);
      ASSERT_OK(applied);
      EXPECT_EQ(*applied, gpu_plan.layout);
    }
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
};

TEST_F(MigPlannerTest, DestroysFreeInstancesAroundOnesInUse) {
  const std::vector<MigGpu> gpus = {H100(
      "n1", 0, {Used("3g.40gb", 0), Free("1g.10gb", 4), Free("1g.10gb", 5), Free("1g.10gb", 6)})};
  const MigPlan plan = Plan(gpus, {Request("r1", "3g.40gb")});
  EXPECT_THAT(plan.served, ElementsAre("r1"));
  EXPECT_THAT(plan.unserved, IsEmpty());
  EXPECT_EQ(plan.compute_slices_served, 3);
  EXPECT_TRUE(plan.optimal);
  ASSERT_EQ(plan.gpus.size(), 1U);
  const MigGpuPlan& gpu = plan.gpus[0];
  EXPECT_EQ(gpu.model, "H100-80GB");
  EXPECT_THAT(gpu.destroy,
              UnorderedElementsAre(Free("1g.10gb", 4), Free("1g.10gb", 5), Free("1g.10gb", 6)));
  EXPECT_THAT(gpu.create, ElementsAre(Free("3g.40gb", 4)));
  EXPECT_THAT(gpu.layout, ElementsAre(Used("3g.40gb", 0), Free("3g.40gb", 4)));
  EXPECT_THAT(gpu.serves, ElementsAre("r1"));
}

TEST_F(MigPlannerTest, DestroysOnlyWhatBlocksTheNewInstance) {
  // 2g.20gb fits at 0, 2 or 4; slots 2-3 hold one free 1g, so only that one has to go.
  const std::vector<MigGpu> gpus = {H100(
      "n1", 0, {Used("1g.10gb", 0), Used("1g.10gb", 1), Free("1g.10gb", 2), Used("3g.40gb", 4)})};
  const MigPlan plan = Plan(gpus, {Request("r1", "2g.20gb")});
  ASSERT_EQ(plan.gpus.size(), 1U);
  EXPECT_THAT(plan.gpus[0].destroy, ElementsAre(Free("1g.10gb", 2)));
  EXPECT_THAT(plan.gpus[0].create, ElementsAre(Free("2g.20gb", 2)));
}

TEST_F(MigPlannerTest, SevenGNeedsAWholeFreeGpu) {
  const std::vector<MigGpu> gpus = {
      H100("n1", 0, {Free("3g.40gb", 0), Used("1g.10gb", 6)}),
      H100("n1", 1, {Free("3g.40gb", 0), Free("3g.40gb", 4)}),
      H100("n2", 0, {Used("1g.10gb", 0)}),
  };
  const MigPlan plan = Plan(gpus, {Request("big", "7g.80gb")});
  EXPECT_THAT(plan.served, ElementsAre("big"));
  ASSERT_EQ(plan.gpus.size(), 1U);
  EXPECT_EQ(plan.gpus[0].node, NodeId("n1"));
  EXPECT_EQ(plan.gpus[0].gpu, 1);
  EXPECT_THAT(plan.gpus[0].destroy, UnorderedElementsAre(Free("3g.40gb", 0), Free("3g.40gb", 4)));
  EXPECT_THAT(plan.gpus[0].layout, ElementsAre(Free("7g.80gb", 0)));
}

TEST_F(MigPlannerTest, SevenGIsUnservedWhileEveryGpuHasAnInstanceInUse) {
  const std::vector<MigGpu> gpus = {
      H100("n1", 0, {Free("3g.40gb", 0), Used("1g.10gb", 6)}),
      H100("n2", 0, {Used("1g.10gb", 0)}),
  };
  const MigPlan plan = Plan(gpus, {Request("big", "7g.80gb")});
  EXPECT_THAT(plan.gpus, IsEmpty());
  EXPECT_THAT(plan.served, IsEmpty());
  ASSERT_EQ(plan.unserved.size(), 1U);
  EXPECT_EQ(plan.unserved[0].request, "big");
  EXPECT_THAT(plan.unserved[0].reason, HasSubstr("instances in use leave no room for 1 x 7g.80gb"));
}

TEST_F(MigPlannerTest, ExplainsRequestsNoLayoutCanServe) {
  const std::vector<MigGpu> gpus = {H100("n1", 0, {}), H100("n1", 1, {})};
  const MigPlan plan = Plan(gpus, {Request("two-4g", "4g.40gb", 2), Request("a100", "3g.20gb"),
                                   Request("ok", "4g.40gb")});
  EXPECT_THAT(plan.served, ElementsAre("ok"));
  ASSERT_EQ(plan.unserved.size(), 2U);
  EXPECT_EQ(plan.unserved[0].request, "two-4g");
  EXPECT_EQ(plan.unserved[0].reason, "needs 2 x 4g.40gb on one GPU; one GPU holds at most 1");
  EXPECT_EQ(plan.unserved[1].request, "a100");
  EXPECT_EQ(plan.unserved[1].reason, "no MIG-enabled GPU of any model with profile 3g.20gb");
}

TEST_F(MigPlannerTest, SaysWhenOtherRequestsTookTheRoom) {
  const std::vector<MigGpu> gpus = {H100("n1", 0, {Free("1g.10gb", 0)})};
  // Seven 1g requests beat one 7g one: more requests served.
  std::vector<MigRequest> requests = {Request("big", "7g.80gb")};
  for (int i = 0; i < 7; ++i) {
    requests.push_back(Request(fmt::format("small{}", i), "1g.10gb"));
  }
  const MigPlan plan = Plan(gpus, requests);
  EXPECT_EQ(plan.served.size(), 7U);
  ASSERT_EQ(plan.unserved.size(), 1U);
  EXPECT_EQ(plan.unserved[0].request, "big");
  EXPECT_THAT(plan.unserved[0].reason, HasSubstr("serve other requests"));
  ASSERT_EQ(plan.gpus.size(), 1U);
  EXPECT_THAT(plan.gpus[0].destroy, IsEmpty());  // the free 1g at 0 is kept and used
  EXPECT_EQ(plan.gpus[0].create.size(), 6U);
}

TEST_F(MigPlannerTest, ReconfiguresTheFewestGpus) {
  const std::vector<MigGpu> gpus = {
      H100("n1", 0, {Free("1g.10gb", 0), Free("1g.10gb", 4), Used("1g.10gb", 6)}),
      H100("n1", 1, {Free("1g.10gb", 0), Free("1g.10gb", 4)}),
      H100("n2", 0, {Free("2g.20gb", 0), Free("2g.20gb", 4)}),
  };
  // Two 3g instances fit on the second or third GPU alone; the first keeps a 1g in use at 6.
  const MigPlan plan = Plan(gpus, {Request("a", "3g.40gb"), Request("b", "3g.40gb")});
  EXPECT_THAT(plan.served, ElementsAre("a", "b"));
  ASSERT_EQ(plan.gpus.size(), 1U);
  EXPECT_EQ(plan.gpus[0].create.size(), 2U);
  EXPECT_NE(std::pair(plan.gpus[0].node, plan.gpus[0].gpu), std::pair(NodeId("n1"), 0));
}

TEST_F(MigPlannerTest, AFreeInstanceOfTheProfileNeedsNoChange) {
  const std::vector<MigGpu> gpus = {H100("n1", 0, {Free("3g.40gb", 0), Used("3g.40gb", 4)})};
  const MigPlan plan = Plan(gpus, {Request("r1", "3g.40gb")});
  EXPECT_THAT(plan.served, ElementsAre("r1"));
  EXPECT_THAT(plan.gpus, IsEmpty());
}

TEST_F(MigPlannerTest, KeepsRequestsOnTheirModels) {
  const std::vector<MigGpu> gpus = {
      H100("h", 0, {Free("1g.10gb", 0)}),
      {NodeId("a"), 0, "A100-40GB", {Free("1g.5gb", 0)}},
  };
  MigRequest a100 = Request("a100-3g", "3g.20gb");
  MigRequest h100_only = Request("h100-3g", "3g.40gb");
  h100_only.models = {"H100"};  // an alias
  const MigPlan plan = Plan(gpus, {a100, h100_only});
  EXPECT_THAT(plan.served, ElementsAre("a100-3g", "h100-3g"));
  ASSERT_EQ(plan.gpus.size(), 2U);
  EXPECT_EQ(plan.gpus[0].node, NodeId("h"));
  EXPECT_THAT(plan.gpus[0].serves, ElementsAre("h100-3g"));
  EXPECT_EQ(plan.gpus[1].model, "A100-40GB");
  EXPECT_THAT(plan.gpus[1].serves, ElementsAre("a100-3g"));
}

TEST_F(MigPlannerTest, ARequestOfSeveralInstancesTakesThemFromOneGpu) {
  const std::vector<MigGpu> gpus = {
      H100("n1", 0, {Used("3g.40gb", 0), Free("3g.40gb", 4)}),
      H100("n1", 1, {Free("1g.10gb", 3)}),
  };
  const MigPlan plan = Plan(gpus, {Request("pair", "3g.40gb", 2)});
  EXPECT_THAT(plan.served, ElementsAre("pair"));
  EXPECT_EQ(plan.compute_slices_served, 6);
  ASSERT_EQ(plan.gpus.size(), 1U);
  EXPECT_EQ(plan.gpus[0].gpu, 1);
  EXPECT_THAT(plan.gpus[0].layout, ElementsAre(Free("3g.40gb", 0), Free("3g.40gb", 4)));
}

TEST_F(MigPlannerTest, SameInputSamePlan) {
  std::vector<MigGpu> gpus;
  for (int g = 0; g < 6; ++g) {
    gpus.push_back(H100("n", g, {Free("2g.20gb", 0), Used("1g.10gb", 2 + g % 2)}));
  }
  std::vector<MigRequest> requests;
  const char* profiles[] = {"1g.10gb", "2g.20gb", "3g.40gb", "1g.20gb"};
  for (int i = 0; i < 12; ++i) {
    requests.push_back(Request(fmt::format("r{}", i), profiles[i % 4]));
  }
  const MigPlan first = Plan(gpus, requests);
  const MigPlan second = Plan(gpus, requests);
  EXPECT_EQ(first.served, second.served);
  ASSERT_EQ(first.gpus.size(), second.gpus.size());
  for (size_t i = 0; i < first.gpus.size(); ++i) {
    EXPECT_EQ(first.gpus[i].layout, second.gpus[i].layout);
    EXPECT_EQ(first.gpus[i].serves, second.gpus[i].serves);
  }
}

TEST_F(MigPlannerTest, AZeroBudgetReturnsTheGreedyPlan) {
  std::vector<MigGpu> gpus;
  for (int g = 0; g < 4; ++g) {
    gpus.push_back(H100("n", g, {Free("1g.10gb", 0), Free("1g.10gb", 4)}));
  }
  const MigPlan plan = Plan(gpus, {Request("a", "3g.40gb"), Request("b", "4g.40gb")},
                            MigPlannerOptions{.search_budget = 0});
  EXPECT_FALSE(plan.optimal);
  EXPECT_THAT(plan.served, ElementsAre("a", "b"));
  EXPECT_EQ(plan.gpus.size(), 1U);  // a 4g at 0 and a 3g at 4 share one GPU
}

TEST_F(MigPlannerTest, RejectsBadGpus) {
  const std::vector<MigRequest> requests = {Request("r", "1g.10gb")};
  EXPECT_THAT(
      PlanMigLayouts(catalog_, {{NodeId("n"), 0, "B300", {}}}, requests),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpus[0].model: unknown GPU model")));
  EXPECT_THAT(PlanMigLayouts(catalog_, {{NodeId("n"), 0, "L40S", {}}}, requests),
              StatusIs(StatusCode::kInvalidArgument, "gpus[0].model: L40S has no MIG"));
  EXPECT_THAT(
      PlanMigLayouts(catalog_, {H100("n", 0, {Free("3g.40gb", 0), Free("2g.20gb", 2)})}, requests),
      StatusIs(
          StatusCode::kInvalidArgument,
          HasSubstr("gpus[0] (node \"n\" gpu 0).mig_instances[1]: 2g.20gb at slot 2 overlaps")));
  EXPECT_THAT(PlanMigLayouts(catalog_, {H100("n", 0, {}), H100("n", 0, {})}, requests),
              StatusIs(StatusCode::kInvalidArgument, "gpus[1]: node \"n\" gpu 0 is listed twice"));
}

TEST_F(MigPlannerTest, RejectsBadRequests) {
  const std::vector<MigGpu> gpus = {H100("n", 0, {})};
  auto error = [&](std::vector<MigRequest> requests) {
    return PlanMigLayouts(catalog_, gpus, requests).status();
  };
  EXPECT_THAT(error({Request("", "1g.10gb")}),
              StatusIs(StatusCode::kInvalidArgument, "requests[0].id: empty"));
  EXPECT_THAT(error({Request("a", "1g.10gb"), Request("a", "2g.20gb")}),
              StatusIs(StatusCode::kInvalidArgument, "requests[1].id: duplicate \"a\""));
  EXPECT_THAT(error({Request("a", "1g.10gb", 0)}),
              StatusIs(StatusCode::kInvalidArgument, "requests[0].count: 0 (must be at least 1)"));
  MigRequest unknown_model = Request("a", "1g.10gb");
  unknown_model.models = {"H100", "X9000"};
  EXPECT_THAT(error({unknown_model}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("requests[0].models[1]: unknown GPU model \"X9000\"")));
  MigRequest wrong_profile = Request("a", "3g.20gb");
  wrong_profile.models = {"H100-80GB"};
  EXPECT_THAT(error({wrong_profile}),
              StatusIs(StatusCode::kInvalidArgument,
                       HasSubstr("requests[0].profile: unknown profile \"3g.20gb\" for the "
                                 "request's models (H100-80GB: 1g.10gb, ")));
  EXPECT_THAT(PlanMigLayouts(catalog_, gpus, {}, MigPlannerOptions{.search_budget = -1}),
              StatusIs(StatusCode::kInvalidArgument, "search_budget: -1 (must be at least 0)"));
}

TEST_F(MigPlannerTest, ApplyRefusesInstancesInUseAndInvalidLayouts) {
  const GpuModelInfo& h100 = *catalog_.Find("H100-80GB").value();
  const std::vector<MigInstance> instances = {Used("3g.40gb", 0), Free("3g.40gb", 4)};
  MigGpuPlan plan;
  plan.node = NodeId("n");
  plan.destroy = {Free("3g.40gb", 0)};
  EXPECT_THAT(ApplyMigGpuPlan(h100, instances, plan),
              StatusIs(StatusCode::kFailedPrecondition,
                       "node \"n\" gpu 0: the 3g.40gb instance at slot 0 is in use"));
  plan.destroy = {Free("2g.20gb", 4)};
  EXPECT_THAT(ApplyMigGpuPlan(h100, instances, plan),
              StatusIs(StatusCode::kFailedPrecondition,
                       "node \"n\" gpu 0: no 2g.20gb instance at slot 4 to destroy"));
  plan.destroy = {};
  plan.create = {Free("1g.10gb", 5)};
  EXPECT_THAT(ApplyMigGpuPlan(h100, instances, plan),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("overlaps another instance")));
  plan.destroy = {Free("3g.40gb", 4)};
  plan.create = {Free("2g.20gb", 4), Free("1g.10gb", 6)};
  Result<std::vector<MigInstance>> applied = ApplyMigGpuPlan(h100, instances, plan);
  ASSERT_OK(applied);
  EXPECT_THAT(*applied, ElementsAre(Used("3g.40gb", 0), Free("2g.20gb", 4), Free("1g.10gb", 6)));
}

TEST_F(MigPlannerTest, ReadsGpusFromASnapshotAndRequestsFromJobs) {
  Cluster cluster;
  cluster.nodes.push_back(scheduler::testing::MakeNode("n1", 2));
  cluster.nodes[0].gpus[1].mig_enabled = true;
  cluster.nodes[0].gpus[1].mig_instances = {Used("3g.40gb", 0), Free("1g.10gb", 4)};
  Result<scheduler::ClusterSnapshot> snapshot =
      scheduler::ClusterSnapshot::Build(cluster, catalog_);
  ASSERT_OK(snapshot);
  const std::vector<MigGpu> gpus = MigGpusOf(*snapshot);
  ASSERT_EQ(gpus.size(), 1U);
  EXPECT_EQ(gpus[0].node, NodeId("n1"));
  EXPECT_EQ(gpus[0].gpu, 1);
  EXPECT_EQ(gpus[0].model, "H100-80GB");
  EXPECT_EQ(gpus[0].instances, cluster.nodes[0].gpus[1].mig_instances);

  Job job = scheduler::testing::MakeJob("j", 2, MigGpus{"2g.20gb", 1});
  job.allowed_gpu_models = {"H100-80GB"};
  job.groups.push_back({"cpu", 1, {{1000, 1024}, NoGpu{}}});
  const std::vector<MigRequest> requests = MigRequestsOf(job);
  ASSERT_EQ(requests.size(), 2U);
  EXPECT_EQ(requests[1].id, "j/workers/1");
  EXPECT_EQ(requests[1].profile, "2g.20gb");
  EXPECT_THAT(requests[1].models, ElementsAre("H100-80GB"));
}

// The brute force: every layout of every GPU that keeps its instances in use (any subset of its
// free instances kept, any set of new instances of the requested profiles), every combination.
struct Best {
  int served = -1;
  int64_t slices = 0;
  int gpus = 0;
};

void LayoutsOf(const GpuModelInfo& model, const std::vector<MigInstance>& original,
               const std::vector<MigInstance>& candidates, size_t next, MigLayout& layout,
               std::vector<MigInstance>& chosen, const std::vector<std::string>& profiles,
               std::set<std::pair<std::vector<int>, bool>>& out) {
  if (next == candidates.size()) {
    std::vector<int> supply(profiles.size(), 0);
    for (const MigInstance& instance : chosen) {
      for (size_t p = 0; p < profiles.size(); ++p) {
        supply[p] += (!instance.in_use && instance.profile == profiles[p]) ? 1 : 0;
      }
    }
    std::multiset<std::pair<std::string, int>> before;
    std::multiset<std::pair<std::string, int>> after;
    for (const MigInstance& instance : original) {
      before.emplace(instance.profile, instance.start);
    }
    for (const MigInstance& instance : chosen) {
      after.emplace(instance.profile, instance.start);
    }
    out.emplace(supply, before != after);
    return;
  }
  LayoutsOf(model, original, candidates, next + 1, layout, chosen, profiles, out);
  const MigInstance& candidate = candidates[next];
  const MigProfile& profile = *model.FindMigProfile(candidate.profile);
  if (layout.CanAddAt(profile, candidate.start)) {
    layout.Add(profile, candidate.start);
    chosen.push_back(candidate);
    LayoutsOf(model, original, candidates, next + 1, layout, chosen, profiles, out);
    chosen.pop_back();
    layout.Remove(profile, candidate.start);
  }
}

Best BruteForce(const GpuModelInfo& model, const std::vector<MigGpu>& gpus,
                const std::vector<std::string>& profiles, const std::vector<int>& demand) {
  std::vector<std::vector<std::pair<std::vector<int>, bool>>> options;
  for (const MigGpu& gpu : gpus) {
    std::vector<MigInstance> in_use;
    std::vector<MigInstance> candidates;
    for (const MigInstance& instance : gpu.instances) {
      (instance.in_use ? in_use : candidates).push_back(instance);
    }
    for (const std::string& name : profiles) {
      for (int start : model.FindMigProfile(name)->starts) {
        candidates.push_back({name, start, false});
      }
    }
    MigLayout layout = MigLayout::FromInstances(model, in_use).value();
    std::vector<MigInstance> chosen = in_use;
    std::set<std::pair<std::vector<int>, bool>> found;
    LayoutsOf(model, gpu.instances, candidates, 0, layout, chosen, profiles, found);
    options.emplace_back(found.begin(), found.end());
  }
  Best best;
  std::vector<size_t> pick(gpus.size(), 0);
  while (true) {
    std::vector<int> supply(profiles.size(), 0);
    int changed = 0;
    for (size_t g = 0; g < gpus.size(); ++g) {
      const auto& [gpu_supply, gpu_changed] = options[g][pick[g]];
      for (size_t p = 0; p < profiles.size(); ++p) {
        supply[p] += gpu_supply[p];
      }
      changed += gpu_changed ? 1 : 0;
    }
    int served = 0;
    int64_t slices = 0;
    for (size_t p = 0; p < profiles.size(); ++p) {
      const int n = std::min(supply[p], demand[p]);
      served += n;
      slices += int64_t{n} * model.FindMigProfile(profiles[p])->compute_slices;
    }
    if (std::tuple(served, slices, -changed) > std::tuple(best.served, best.slices, -best.gpus)) {
      best = {served, slices, changed};
    }
    size_t g = 0;
    while (g < gpus.size() && ++pick[g] == options[g].size()) {
      pick[g++] = 0;
    }
    if (g == gpus.size()) {
      return best;
    }
  }
}

TEST_F(MigPlannerTest, MatchesBruteForceOnSmallCases) {
  const GpuModelInfo& h100 = *catalog_.Find("H100-80GB").value();
  const std::vector<std::string> all = {"1g.10gb", "1g.20gb", "2g.20gb",
                                        "3g.40gb", "4g.40gb", "7g.80gb"};
  Random random(7);
  for (int round = 0; round < 150; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    std::vector<MigGpu> gpus;
    const int gpu_count = 1 + static_cast<int>(random.Uniform(3));
    for (int g = 0; g < gpu_count; ++g) {
      MigLayout layout;
      std::vector<MigInstance> instances;
      const int tries = static_cast<int>(random.Uniform(6));
      for (int t = 0; t < tries; ++t) {
        const MigProfile& profile = *h100.FindMigProfile(all[random.Uniform(all.size())]);
        if (auto start = layout.FindStart(profile)) {
          layout.Add(profile, *start);
          instances.push_back({profile.name, *start, random.Uniform(2) == 0});
        }
      }
      gpus.push_back(H100("n", g, instances));
    }
    std::vector<std::string> profiles = all;
    random.Shuffle(profiles);
    profiles.resize(1 + random.Uniform(4));
    std::vector<int> demand(profiles.size(), 0);
    std::vector<MigRequest> requests;
    const int request_count = 1 + static_cast<int>(random.Uniform(9));
    for (int r = 0; r < request_count; ++r) {
      const size_t p = random.Uniform(profiles.size());
      ++demand[p];
      requests.push_back(Request(fmt::format("r{}", r), profiles[p]));
    }
    const Best best = BruteForce(h100, gpus, profiles, demand);
    const MigPlan plan = Plan(gpus, requests);
    EXPECT_TRUE(plan.optimal);
    EXPECT_EQ(static_cast<int>(plan.served.size()), best.served);
    EXPECT_EQ(plan.compute_slices_served, best.slices);
    EXPECT_EQ(static_cast<int>(plan.gpus.size()), best.gpus);
  }
}

}  // namespace
}  // namespace gpufleet::policy
