// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/scheduler/plugins/policies.h"

#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/scheduler/testing/cluster_builder.h"

namespace gpufleet::scheduler {
namespace {

using testing::MakeJob;
using testing::MakeNode;

// Node 0: 2 idle T4, 64 cores. Node 1: 8 idle T4, 96 cores. Node 2: 8 T4, GPU 0 has 300 free,
// the rest idle; it runs one share task.
class PolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Cluster cluster;
    cluster.nodes.push_back(MakeNode("two", 2, "T4", {}, {64000, 262144}));
    cluster.nodes.push_back(MakeNode("eight", 8, "T4", {}, {96000, 786432}));
    cluster.nodes.push_back(MakeNode("used", 8, "T4", {}, {96000, 786432}));
    snapshot_.emplace(ClusterSnapshot::Build(cluster, catalog_).value());
    ASSERT_OK(snapshot_->Apply({0, 0, 2, {4000, 0}, {{0, 700, 0}}}));
  }

  TaskContext Context(const Job& job) {
    TaskContext task;
    task.snapshot = &*snapshot_;
    task.job = &job;
    task.request = &job.groups[0].request;
    task.model_allowed.assign(snapshot_->ModelCount(), true);
    task.mig_profile.assign(snapshot_->ModelCount(), nullptr);
    return task;
  }

  std::vector<int64_t> Scores(ScorePlugin& policy, const Job& job) {
    const TaskContext task = Context(job);
    CycleState state(job);
    std::vector<const NodeInfo*> nodes;
    for (const NodeInfo& node : snapshot_->nodes()) {
      nodes.push_back(&node);
    }
    Random random(1);
    policy.PreScore(state, task, nodes, random);
    std::vector<int64_t> scores;
    for (const NodeInfo* node : nodes) {
      scores.push_back(policy.Score(state, task, *node, ~GpuMask{0}));
    }
    policy.NormalizeScores(scores);
    return scores;
  }

  GpuCatalog catalog_ = GpuCatalog::Default();
  std::optional<ClusterSnapshot> snapshot_;
};

TEST_F(PolicyTest, DotProdPrefersTheSmallestDotProduct) {
  DotProdPolicy policy;
  const Job job = MakeJob("j", 1, WholeGpus{1}, {8000, 0});
  // two: 1 - (0.5*0.0625 + 0.25*0.125)/2 = 0.96875; eight: 1 - (0.75*0.0625 + 1*0.125)/2.
  EXPECT_EQ(Scores(policy, job), (std::vector<int64_t>{96, 91, 92}));
  const Job too_big = MakeJob("j", 1, WholeGpus{1}, {70000, 0});
  EXPECT_EQ(Scores(policy, too_big)[0], 0);
}

TEST_F(PolicyTest, GpuPackingPrefersPartlyUsedGpusThenUsedNodesThenSmallIdleNodes) {
  GpuPackingPolicy policy;
  // Share of 200: "used" shares GPU 0 (300 free, r = 30): 100 - 3 = 97.
  EXPECT_EQ(Scores(policy, MakeJob("s", 1, FractionalGpu{200, 0})),
            (std::vector<int64_t>{31, 25, 97}));
  // Share of 500 must open an idle GPU on "used": max(50 - 1, 33) = 49.
  EXPECT_EQ(Scores(policy, MakeJob("s", 1, FractionalGpu{500, 0})),
            (std::vector<int64_t>{31, 25, 49}));
  EXPECT_EQ(Scores(policy, MakeJob("c", 1, NoGpu{})), (std::vector<int64_t>{0, 0, 0}));
}

TEST_F(PolicyTest, GpuClusteringGroupsTasksOfTheSameKind) {
  GpuClusteringPolicy policy;
  // "used" hosts only shares: base = 25 * (8000 - 7300) / 8000 = 2, + 75.
  // Idle nodes: base + 25 with base 25*6000/8000 = 18 and 0.
  EXPECT_EQ(Scores(policy, MakeJob("s", 1, FractionalGpu{200, 0})),
            (std::vector<int64_t>{43, 25, 77}));
  // Whole-GPU tasks: "used" hosts only other kinds, so only its base remains.
  EXPECT_EQ(Scores(policy, MakeJob("w", 1, WholeGpus{1})), (std::vector<int64_t>{43, 25, 2}));
}

TEST_F(PolicyTest, BestFitPrefersTheLeastLeftoverAndNormalises) {
  BestFitPolicy policy;
  const std::vector<int64_t> scores = Scores(policy, MakeJob("w", 1, WholeGpus{1}, {8000, 0}));
  EXPECT_EQ(scores[0], 100);  // the 2-GPU node is left with the least
  EXPECT_EQ(scores[1], 0);
  EXPECT_GT(scores[2], scores[1]);
}

TEST_F(PolicyTest, RandomScoresOneFeasibleNode) {
  RandomPolicy policy;
  const std::vector<int64_t> scores = Scores(policy, MakeJob("w", 1, WholeGpus{1}));
  EXPECT_EQ(std::count(scores.begin(), scores.end(), kMaxNodeScore), 1);
  EXPECT_EQ(std::count(scores.begin(), scores.end(), 0), 2);
}

TEST(FgdScore, IsTheTruncatedSigmoidOfTheNegativeIncrease) {
  EXPECT_EQ(FgdScore(0), 50);
  EXPECT_EQ(FgdScore(-1000), 73);
  EXPECT_EQ(FgdScore(1000), 26);
}

TEST(FgdScoring, LinearScaleGroupsIncreasesByQuantum) {
  const FgdScoring fgd;
  EXPECT_EQ(fgd.Score(0), 50);
  FgdScoring linear;
  linear.quantum_milli = 120;
  EXPECT_EQ(linear.Score(0), 0);
  EXPECT_EQ(linear.Score(-119), 0);
  EXPECT_EQ(linear.Score(-120), 1);
  EXPECT_EQ(linear.Score(1), -1);
  EXPECT_GT(linear.Score(-500), linear.Score(-100));
}

TEST_F(PolicyTest, GpufleetPrefersClosingAShareRemainder) {
  // The workload runs 400-shares. On "used", GPU 0 has 300 free, useless to them: a 300 share
  // there removes that fragment (-300). On an idle GPU it turns a remainder of 200 (two shares)
  // into 300 (one share): +100.
  const TargetWorkload workload = TargetWorkload::FromShapes({{1000, 400, 1, {}}}, 1.0);
  PluginArgs args;
  args.target_workload = workload;
  auto plugin = PluginRegistry::Default().Create("gpufleet", args);
  ASSERT_OK(plugin);
  auto* policy = dynamic_cast<ScorePlugin*>(plugin->get());
  ASSERT_NE(policy, nullptr);
  EXPECT_EQ(policy->Name(), "gpufleet");
  const Job job = MakeJob("s", 1, FractionalGpu{300, 0});
  const std::vector<int64_t> scores = Scores(*policy, job);
  EXPECT_GT(scores[2], scores[0]);
  EXPECT_GT(scores[2], scores[1]);
  Random random(1);
  auto picked = policy->PickGpus(Context(job), snapshot_->nodes()[2], ~GpuMask{0}, random);
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 0);
}

TEST(GpufleetScoreQuantum, IsFineForOneGpuClassesOfAnyModelOnly) {
  EXPECT_EQ(GpufleetScoreQuantum(
                TargetWorkload::FromShapes({{1000, 400, 1, {}}, {2000, 1000, 1, {}}, {500}}, 1.0)),
            kGpufleetFineQuantumMilli);
  EXPECT_EQ(GpufleetScoreQuantum(
                TargetWorkload::FromShapes({{1000, 400, 1, {}}, {8000, 1000, 8, {}}}, 1.0)),
            kGpufleetCoarseQuantumMilli);
  EXPECT_EQ(GpufleetScoreQuantum(
                TargetWorkload::FromShapes({{1000, 400, 1, {}}, {1000, 1000, 1, {"T4"}}}, 1.0)),
            kGpufleetCoarseQuantumMilli);
}

TEST(Gpufleet, SeparatesIncreasesThatTheOldCoarseStepTied) {
  // Shares of 400, 300 and 200 (a third each). A 100 share on the idle GPU of "idle" changes the
  // packed remainders by -100, -100 and +100: an increase of -33. On "half", whose GPU has 500
  // free, by -100, -100 and -100: -100. A step of 150 scored both 0 and the tie went to "idle",
  // the first node; the fine step (75) of a one-GPU, any-model workload scores "half" 1, "idle" 0.
  const GpuCatalog catalog = GpuCatalog::Default();
  Cluster cluster;
  cluster.nodes.push_back(MakeNode("idle", 1, "T4", {}, {64000, 262144}));
  cluster.nodes.push_back(MakeNode("half", 1, "T4", {}, {64000, 262144}));
  ClusterSnapshot snapshot = ClusterSnapshot::Build(cluster, catalog).value();
  ASSERT_OK(snapshot.Apply({0, 0, 1, {1000, 0}, {{0, 500, 0}}}));
  SchedulerOptions options;
  options.policy = "gpufleet";
  options.plugin_args.target_workload =
      TargetWorkload::FromShapes({{1000, 400, 1, {}}, {1000, 300, 1, {}}, {1000, 200, 1, {}}}, 1.0);
  auto scheduler = Scheduler::Create(options, PluginRegistry::Default());
  ASSERT_OK(scheduler);
  Random random(1);
  const ScheduleResult result =
      (*scheduler)->Schedule(MakeJob("s", 1, FractionalGpu{100, 0}, {1000, 0}), snapshot, random);
  ASSERT_TRUE(result.scheduled()) << result.reason;
  EXPECT_EQ(result.placements[0].node, 1);

  FgdScoring fine;
  fine.fragmentation = FragmentationModel::Kind::kPackedShares;
  fine.quantum_milli = kGpufleetFineQuantumMilli;
  FgdScoring coarse = fine;
  coarse.quantum_milli = kGpufleetCoarseQuantumMilli;
  EXPECT_EQ(coarse.Score(-100.0 / 3), coarse.Score(-100));
  EXPECT_GT(fine.Score(-100), fine.Score(-100.0 / 3));
}

TEST_F(PolicyTest, FgdPicksTheGpuThatGrowsFragmentationLeast) {
  // Target workload: shares of 300 milli-GPU. On "used", GPU 0 has exactly 300 free: putting a
  // 300 share there closes that fragment; any idle GPU would be left with 700 (still usable).
  const TargetWorkload workload =
      TargetWorkload::FromShapes({{1000, 300, 1, {}}, {1000, 1000, 1, {}}}, 1.0);
  FgdPolicy policy("fgd", workload);
  const Job job = MakeJob("s", 1, FractionalGpu{300, 0});
  const std::vector<int64_t> scores = Scores(policy, job);
  EXPECT_GT(scores[2], scores[0]);
  EXPECT_GT(scores[2], scores[1]);
  Random random(1);
  auto picked = policy.PickGpus(Context(job), snapshot_->nodes()[2], ~GpuMask{0}, random);
  ASSERT_TRUE(picked.has_value());
  EXPECT_EQ((*picked)[0].gpu, 0);
  EXPECT_EQ((*picked)[0].milli, 300);
}

TEST_F(PolicyTest, FgdDoesNotReuseScoresOfAnEarlierSnapshotAtTheSameAddress) {
  const TargetWorkload workload =
      TargetWorkload::FromShapes({{1000, 300, 1, {}}, {1000, 1000, 1, {}}}, 1.0);
  FgdPolicy policy("fgd", workload);
  const Job job = MakeJob("s", 1, FractionalGpu{300, 0});
  Scores(policy, job);
  // A new snapshot in the same storage, its nodes at the same versions as before, but GPU 0 of
  // "used" now has 500 free instead of 300.
  Cluster cluster = snapshot_->cluster();
  snapshot_.emplace(ClusterSnapshot::Build(std::move(cluster), catalog_).value());
  ASSERT_OK(snapshot_->Apply({0, 0, 2, {4000, 0}, {{0, 500, 0}}}));
  FgdPolicy fresh("fgd", workload);
  EXPECT_EQ(Scores(policy, job), Scores(fresh, job));
}

TEST_F(PolicyTest, FgdScoresMemoisedAcrossDecisionsAreThoseOfAFreshPolicy) {
  // One policy scores tasks of different shapes on the same node states, one after another; each
  // must get what a policy that never saw the others gives it.
  const TargetWorkload workload = TargetWorkload::FromShapes(
      {{1000, 300, 1, {}}, {1000, 1000, 1, {}}, {2000, 500, 1, {}}}, 1.0);
  FgdPolicy reused("gpufleet", workload, {FragmentationModel::Kind::kPackedShares, 75});
  const std::vector<Job> jobs = {
      MakeJob("s", 1, FractionalGpu{300, 0}), MakeJob("s", 1, FractionalGpu{300, 0}, {2000, 0}),
      MakeJob("s", 1, FractionalGpu{500, 0}), MakeJob("w", 1, WholeGpus{1}),
      MakeJob("w", 1, WholeGpus{2}),          MakeJob("c", 1, NoGpu{}),
      MakeJob("s", 1, FractionalGpu{300, 0})};
  for (const Job& job : jobs) {
    FgdPolicy fresh("gpufleet", workload, {FragmentationModel::Kind::kPackedShares, 75});
    EXPECT_EQ(Scores(reused, job), Scores(fresh, job)) << job.groups[0].request.host.cpu_milli;
  }
}

TEST_F(PolicyTest, FgdMemoisedAndDirectScoresAgree) {
  const TargetWorkload workload = TargetWorkload::FromShapes(
      {{1000, 300, 1, {}}, {1000, 1000, 2, {}}, {2000, 500, 1, {}}}, 1.0);
  FgdPolicy policy("fgd", workload);
  // A share with GPU memory is scored without the state memo; 1 MiB changes no fit here.
  const Job memoised_job = MakeJob("s", 1, FractionalGpu{500, 0});
  const Job direct_job = MakeJob("s", 1, FractionalGpu{500, 1});
  const TaskContext memoised_task = Context(memoised_job);
  const TaskContext direct_task = Context(direct_job);
  CycleState state(memoised_job);
  Random random(1);
  policy.PreScore(state, memoised_task, {}, random);
  for (const NodeInfo& node : snapshot_->nodes()) {
    EXPECT_EQ(policy.Score(state, memoised_task, node, ~GpuMask{0}),
              policy.Score(state, direct_task, node, ~GpuMask{0}))
        << node.node->id;
  }
}

TEST_F(PolicyTest, FgdThroughTheSchedulerIsDeterministicPerSeed) {
  SchedulerOptions options;
  options.policy = "fgd";
  options.plugin_args.target_workload =
      TargetWorkload::FromShapes({{1000, 300, 1, {}}, {1000, 1000, 1, {}}}, 1.0);
  std::vector<std::vector<TaskPlacement>> runs;
  for (int run = 0; run < 2; ++run) {
    SetUp();
    auto scheduler = Scheduler::Create(options, PluginRegistry::Default());
    ASSERT_OK(scheduler);
    Random random(7);
    std::vector<TaskPlacement> placements;
    for (int i = 0; i < 12; ++i) {
      const ScheduleResult result =
          (*scheduler)
              ->Schedule(MakeJob("j", 1, FractionalGpu{100 + 50 * (i % 5), 0}), *snapshot_, random);
      ASSERT_TRUE(result.scheduled()) << result.reason;
      placements.push_back(result.placements[0]);
    }
    runs.push_back(placements);
  }
  EXPECT_EQ(runs[0], runs[1]);
}

}  // namespace
}  // namespace gpufleet::scheduler
