// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/reliability/attribution.h"

#include <functional>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/reliability/testing/test_fleet.h"

namespace gpufleet::reliability {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using testing::FailedWithXid;
using testing::Gpu;
using ::testing::HasSubstr;
using testing::Hours;
using testing::MakeFleet;
using testing::MakeRun;
using ::testing::Pair;

AttributionOptions KeepEverything() {
  AttributionOptions options;
  options.window = Duration(0);
  return options;
}

std::vector<std::string> Ids(const std::vector<DeviceEvidence>& devices) {
  std::vector<std::string> ids;
  for (const DeviceEvidence& evidence : devices) {
    ids.push_back(evidence.device.ToString());
  }
  return ids;
}

const DeviceEvidence* FindListed(const AttributionReport& report, const Device& device) {
  for (const auto* list : {&report.suspects, &report.runners_up}) {
    for (const DeviceEvidence& evidence : *list) {
      if (evidence.device == device) {
        return &evidence;
      }
    }
  }
  return nullptr;
}

// 40 GPUs on 10 nodes. GPU A (n0-g0) ran 200 runs of 500 h and 12 of them failed with XID 48;
// GPU B (n0-g1) ran 4 runs of 2 h and all failed with XID 79; the 38 others ran 10 runs of
// 500 h each and 19 of them had one failure: about 1.2e-4 failures per GPU-hour everywhere but
// on B.
class ExposureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto engine = AttributionEngine::Create(fleet_, clock_, KeepEverything());
    ASSERT_OK(engine);
    engine_.emplace(std::move(engine).value());
    for (int i = 0; i < 200; ++i) {
      const std::string job = fmt::format("a{}", i);
      ASSERT_OK(
          engine_->AddOutcome(i < 12 ? FailedWithXid(job, {kA}, i * 500.0, 500, 48)
                                     : MakeRun(job, {kA}, i * 500.0, 500, ExitReason::kSucceeded)));
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_OK(engine_->AddOutcome(FailedWithXid(fmt::format("b{}", i), {kB}, i * 2.0, 2, 79)));
    }
    int others = 0;
    for (int node = 0; node < 10; ++node) {
      for (int gpu = 0; gpu < 4; ++gpu) {
        if (node == 0 && gpu < 2) {
          continue;
        }
        for (int i = 0; i < 10; ++i) {
          const std::string job = fmt::format("o{}-{}-{}", node, gpu, i);
          ASSERT_OK(engine_->AddOutcome(
              i == 0 && others < 19
                  ? FailedWithXid(job, {Gpu(node, gpu)}, 0, 500, 48)
                  : MakeRun(job, {Gpu(node, gpu)}, i * 500.0, 500, ExitReason::kSucceeded)));
        }
        ++others;
      }
    }
  }

  const GpuUuid kA = Gpu(0, 0);
  const GpuUuid kB = Gpu(0, 1);
  FleetInventory fleet_ = MakeFleet(10, 4, 10);
  FakeClock clock_{Hours(200000)};
  std::optional<AttributionEngine> engine_;
};

TEST_F(ExposureTest, ManyFailuresOverHugeExposureAreNotFlaggedFewRunsAllFailedAre) {
  const AttributionReport report = engine_->Analyze();
  EXPECT_EQ(report.runs, 200 + 4 + 380);
  EXPECT_EQ(report.failed_runs, 12 + 4 + 19);
  EXPECT_EQ(report.gpus_tested, 40);
  EXPECT_EQ(report.nodes_tested, 10);
  ASSERT_THAT(Ids(report.suspects), ElementsAre("gpu n0-g1"));
  const DeviceEvidence& b = report.suspects[0];
  EXPECT_EQ(b.runs, 4);
  EXPECT_EQ(b.failures, 4);
  EXPECT_EQ(b.attributed_failures, 4);
  EXPECT_DOUBLE_EQ(b.gpu_hours, 8.0);
  EXPECT_LT(b.expected, 0.002);
  EXPECT_LT(b.p_value, 1e-10);
  EXPECT_LT(b.q_value, 1e-8);
  EXPECT_THAT(b.xids, ElementsAre(Pair(79, 4)));
  EXPECT_TRUE(b.HasDrainNowXid());
  EXPECT_EQ(b.leaf, "leaf0");

  // A failed three times as often as B, but over 100,000 GPU-hours: about what the fleet's rate
  // predicts.
  const DeviceEvidence* a = FindListed(report, Device::OfGpu(kA));
  ASSERT_NE(a, nullptr);
  EXPECT_FALSE(a->flagged);
  EXPECT_EQ(a->failures, 12);
  EXPECT_DOUBLE_EQ(a->gpu_hours, 100000.0);
  EXPECT_GT(a->expected, 9.0);
  EXPECT_LT(a->expected, 14.0);
  EXPECT_GT(a->p_value, 0.1);
  EXPECT_LT(a->RateRatio(), 1.5);
  // The second pass estimates the rate without B.
  EXPECT_EQ(report.passes, 2);
  EXPECT_EQ(report.rates.gpu_blamed_failures, 12 + 19);
  EXPECT_NEAR(report.rates.gpu_rate, 32.0 / 300000, 1e-12);
}

TEST_F(ExposureTest, ConcentrationCountsInvolvedFailuresAndWhatTheyCostAboveTheRate) {
  const AttributionReport report = engine_->Analyze();
  const FailureConcentration b = engine_->Concentration({Device::OfGpu(kB)}, report.rates);
  EXPECT_EQ(b.devices, 1);
  EXPECT_EQ(b.gpus, 1);
  EXPECT_DOUBLE_EQ(b.fleet_share, 1.0 / 40);
  EXPECT_EQ(b.failed_runs, 35);
  EXPECT_EQ(b.failed_runs_involving, 4);
  EXPECT_DOUBLE_EQ(b.failed_share, 4.0 / 35);
  EXPECT_LT(b.expected_involving, 0.01);
  EXPECT_NEAR(b.avoidable, 4.0, 0.01);
  // The node holds A, B and two GPUs with one failure each: 18 failures, of which about 11
  // expected over A's exposure.
  const FailureConcentration node = engine_->Concentration(
      {Device::OfNode(NodeId("n0")), Device::OfGpu(GpuUuid("nope"))}, report.rates);
  EXPECT_EQ(node.devices, 1);
  EXPECT_EQ(node.gpus, 4);
  EXPECT_EQ(node.failed_runs_involving, 18);
  EXPECT_GT(node.avoidable, 2.0);
  EXPECT_LT(node.avoidable, 8.0);
}

TEST_F(ExposureTest, FailuresByDeviceRanksTheMostInvolvedFirst) {
  const std::vector<DeviceFailures> gpus = engine_->FailuresByDevice(DeviceKind::kGpu);
  ASSERT_EQ(gpus.size(), 21u);
  EXPECT_EQ(gpus[0].device, Device::OfGpu(kA));
  EXPECT_EQ(gpus[0].failed_runs, 12);
  EXPECT_EQ(gpus[1].device, Device::OfGpu(kB));
  EXPECT_EQ(gpus[1].failed_runs, 4);
  EXPECT_EQ(gpus[20].failed_runs, 1);
  const std::vector<DeviceFailures> nodes = engine_->FailuresByDevice(DeviceKind::kNode);
  ASSERT_FALSE(nodes.empty());
  EXPECT_EQ(nodes[0].device, Device::OfNode(NodeId("n0")));
  EXPECT_EQ(nodes[0].failed_runs, 18);
}

// A fleet of `nodes` x `gpus_per_node` GPUs where every GPU ran 10 runs of 100 h and five of
// them had one failure with XID 48.
void AddQuietBackground(AttributionEngine& engine, int nodes, int gpus_per_node) {
  int failed = 0;
  for (int node = 0; node < nodes; ++node) {
    for (int gpu = 0; gpu < gpus_per_node; ++gpu) {
      for (int i = 0; i < 10; ++i) {
        const std::string job = fmt::format("bg{}-{}-{}", node, gpu, i);
        const bool fails = i == 0 && (node * gpus_per_node + gpu) % 7 == 3 && failed < 5;
        failed += fails;
        ASSERT_OK(engine.AddOutcome(
            fails ? FailedWithXid(job, {Gpu(node, gpu)}, 0, 100, 48)
                  : MakeRun(job, {Gpu(node, gpu)}, i * 100.0, 100, ExitReason::kSucceeded)));
      }
    }
  }
}

TEST(AttributionEngine, FewRunsAllFailedAreFlaggedOnceTheEvidenceSuffices) {
  const FleetInventory fleet = MakeFleet(11, 4, 11);
  FakeClock clock(Hours(5000));
  auto engine = AttributionEngine::Create(fleet, clock, KeepEverything());
  ASSERT_OK(engine);
  AddQuietBackground(*engine, 10, 4);
  const GpuUuid c = Gpu(10, 2);  // new: no runs before
  double previous_p = 1.0;
  for (int failures = 1; failures <= 4; ++failures) {
    SCOPED_TRACE(failures);
    ASSERT_OK(engine->AddOutcome(
        FailedWithXid(fmt::format("c{}", failures), {c}, 1000.0 + failures, 1, 79)));
    const AttributionReport report = engine->Analyze();
    const DeviceEvidence* evidence = FindListed(report, Device::OfGpu(c));
    ASSERT_NE(evidence, nullptr);
    EXPECT_EQ(evidence->failures, failures);
    EXPECT_LT(evidence->p_value, previous_p);
    previous_p = evidence->p_value;
    // min_failures is 3: one or two failures, however unlikely, are not enough.
    EXPECT_EQ(evidence->flagged, failures >= 3);
    EXPECT_EQ(report.suspects.size(), failures >= 3 ? 1u : 0u);
  }
}

TEST(AttributionEngine, UnattributedFailuresOfLargeOrRepeatingJobsBlameNoGpu) {
  const FleetInventory fleet = MakeFleet(12, 8, 12);
  FakeClock clock(Hours(5000));
  auto engine = AttributionEngine::Create(fleet, clock, KeepEverything());
  ASSERT_OK(engine);
  AddQuietBackground(*engine, 10, 8);
  // A 64-GPU job on nodes 0-7 hangs three times: too large to say anything about one GPU.
  std::vector<GpuUuid> big;
  for (int node = 0; node < 8; ++node) {
    for (int gpu = 0; gpu < 8; ++gpu) {
      big.push_back(Gpu(node, gpu));
    }
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    OutcomeRecord run = MakeRun("big", big, 1000.0 + attempt, 1, ExitReason::kHang);
    run.attempt = attempt;
    ASSERT_OK(engine->AddOutcome(run));
  }
  // An 8-GPU job on node 8 fails three times naming nothing: it counts once against each GPU.
  std::vector<GpuUuid> eight;
  for (int gpu = 0; gpu < 8; ++gpu) {
    eight.push_back(Gpu(8, gpu));
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    OutcomeRecord run = MakeRun("eight", eight, 1000.0 + attempt, 1, ExitReason::kInfraError);
    run.attempt = attempt;
    ASSERT_OK(engine->AddOutcome(run));
  }
  // Three different 8-GPU jobs hang on n11, a new node: every GPU of it shares the evidence,
  // which says nothing about which one is bad.
  std::vector<GpuUuid> whole_node;
  for (int gpu = 0; gpu < 8; ++gpu) {
    whole_node.push_back(Gpu(11, gpu));
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(engine->AddOutcome(
        MakeRun(fmt::format("node{}", i), whole_node, 1000.0 + i, 1, ExitReason::kHang)));
  }
  // Three different one-GPU jobs fail on n10-g0, a new GPU, naming nothing: that is evidence.
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(engine->AddOutcome(
        MakeRun(fmt::format("small{}", i), {Gpu(10, 0)}, 1000.0 + i, 1, ExitReason::kInfraError)));
  }
  const AttributionReport report = engine->Analyze();
  EXPECT_EQ(report.unattributed_failed_runs, 12);
  EXPECT_THAT(Ids(report.suspects), ElementsAre("gpu n10-g0"));
  const DeviceEvidence* mate = FindListed(report, Device::OfGpu(Gpu(8, 3)));
  ASSERT_NE(mate, nullptr);
  EXPECT_EQ(mate->failures, 1);
  // n10's failures are explained by its flagged GPU: no run is left to test the node on.
  EXPECT_EQ(FindListed(report, Device::OfNode(NodeId("n10"))), nullptr);
  EXPECT_EQ(report.nodes_tested, 11);
  const DeviceEvidence* shared = FindListed(report, Device::OfGpu(Gpu(11, 0)));
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->failures, 3);
  EXPECT_EQ(shared->singling_failures, 0);
  EXPECT_LT(shared->q_value, 0.05);  // significant, but not about this GPU
  // Sizes have their own rates: 3 hangs in 64 GPU-hours make large runs look worse.
  ASSERT_GE(report.rates.unattributed_by_size.size(), 3u);
  EXPECT_EQ(report.rates.unattributed_by_size.back().min_gpus, 33);
  EXPECT_EQ(report.rates.unattributed_by_size.back().max_gpus, 64);
  EXPECT_EQ(report.rates.unattributed_by_size.back().failures, 3);
}

TEST(AttributionEngine, AFlaggedGpuExplainsTheFailuresItSharedWithItsNeighbours) {
  const FleetInventory fleet = MakeFleet(11, 8, 11);
  FakeClock clock(Hours(5000));
  AttributionOptions options = KeepEverything();
  options.report_top = 100;  // list every device
  auto engine = AttributionEngine::Create(fleet, clock, options);
  ASSERT_OK(engine);
  AddQuietBackground(*engine, 10, 8);
  // n10-g0 fails three one-GPU jobs with XID 79, and four different 8-GPU jobs on its node hang
  // naming nothing. Each of its seven neighbours shares those four hangs.
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(
        engine->AddOutcome(FailedWithXid(fmt::format("one{}", i), {Gpu(10, 0)}, 1000 + i, 1, 79)));
  }
  std::vector<GpuUuid> node;
  for (int gpu = 0; gpu < 8; ++gpu) {
    node.push_back(Gpu(10, gpu));
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(engine->AddOutcome(
        MakeRun(fmt::format("eight{}", i), node, 1010 + i, 1, ExitReason::kHang)));
  }
  ASSERT_OK(engine->AddOutcome(MakeRun("fine", node, 1020, 1, ExitReason::kSucceeded)));
  const AttributionReport report = engine->Analyze();
  EXPECT_THAT(Ids(report.suspects), ElementsAre("gpu n10-g0"));
  EXPECT_EQ(report.suspects[0].failures, 7);
  EXPECT_GE(report.passes, 2);
  const DeviceEvidence* neighbour = FindListed(report, Device::OfGpu(Gpu(10, 5)));
  ASSERT_NE(neighbour, nullptr);
  EXPECT_EQ(neighbour->runs, 1);  // the hangs are n10-g0's
  EXPECT_EQ(neighbour->failures, 0);
}

TEST(AttributionEngine, NodeChecksBlameTheNodeNotItsGpus) {
  const FleetInventory fleet = MakeFleet(11, 4, 11);
  FakeClock clock(Hours(5000));
  auto engine = AttributionEngine::Create(fleet, clock, KeepEverything());
  ASSERT_OK(engine);
  AddQuietBackground(*engine, 10, 4);
  for (int gpu = 0; gpu < 4; ++gpu) {
    OutcomeRecord run =
        MakeRun(fmt::format("ib{}", gpu), {Gpu(10, gpu)}, 1000.0 + gpu, 2, ExitReason::kInfraError);
    run.health_events.push_back(HealthEvent{NodeId("n10"), GpuUuid(), "ib-link-down"});
    ASSERT_OK(engine->AddOutcome(run));
  }
  const AttributionReport report = engine->Analyze();
  ASSERT_THAT(Ids(report.suspects), ElementsAre("node n10"));
  EXPECT_EQ(report.suspects[0].attributed_failures, 4);
  EXPECT_THAT(report.suspects[0].health_checks, ElementsAre(Pair("ib-link-down", 4)));
  EXPECT_EQ(report.rates.node_blamed_failures, 0);  // n10 left out of the rate in pass 2
}

TEST(AttributionEngine, UnattributedFailuresFlagANodeOnlyWhenSpreadOverItsGpus) {
  const FleetInventory fleet = MakeFleet(12, 4, 12);
  FakeClock clock(Hours(5000));
  auto engine = AttributionEngine::Create(fleet, clock, KeepEverything());
  ASSERT_OK(engine);
  AddQuietBackground(*engine, 10, 4);
  // n10: four hangs of one-GPU jobs on two of its GPUs (two bad GPUs, not yet flagged).
  // n11: four hangs spread over all its GPUs (a bad NIC, say).
  for (int i = 0; i < 4; ++i) {
    ASSERT_OK(engine->AddOutcome(
        MakeRun(fmt::format("a{}", i), {Gpu(10, i % 2)}, 1000 + i, 1, ExitReason::kHang)));
    ASSERT_OK(engine->AddOutcome(
        MakeRun(fmt::format("b{}", i), {Gpu(11, i)}, 1000 + i, 1, ExitReason::kHang)));
  }
  const AttributionReport report = engine->Analyze();
  ASSERT_THAT(Ids(report.suspects), ElementsAre("node n11"));
  EXPECT_EQ(report.suspects[0].gpus_involved, 4);
  EXPECT_EQ(report.suspects[0].attributed_failures, 0);
  const DeviceEvidence* n10 = FindListed(report, Device::OfNode(NodeId("n10")));
  ASSERT_NE(n10, nullptr);
  EXPECT_EQ(n10->failures, 4);
  EXPECT_EQ(n10->gpus_involved, 2);
  EXPECT_LT(n10->q_value, 0.01);  // significant, yet it points at two GPUs
}

TEST(AttributionEngine, WithoutKnownGpusTheNodeIsFlaggedNotAGpuSlot) {
  const FleetInventory fleet = MakeFleet(11, 8, 11);
  FakeClock clock(Hours(5000));
  // The runs of the test above as Slurm accounting gives them: GPU slots, not the GPUs held.
  for (const bool flag_gpus : {true, false}) {
    SCOPED_TRACE(flag_gpus);
    AttributionOptions options = KeepEverything();
    options.flag_gpus = flag_gpus;
    options.min_node_spread_gpus = flag_gpus ? 3 : 1;
    auto engine = AttributionEngine::Create(fleet, clock, options);
    ASSERT_OK(engine);
    AddQuietBackground(*engine, 10, 8);
    for (int i = 0; i < 6; ++i) {
      ASSERT_OK(engine->AddOutcome(
          MakeRun(fmt::format("one{}", i), {Gpu(10, 0)}, 1000 + i, 1, ExitReason::kInfraError)));
    }
    const AttributionReport report = engine->Analyze();
    EXPECT_THAT(Ids(report.suspects), ElementsAre(flag_gpus ? "gpu n10-g0" : "node n10"));
  }
}

TEST(AttributionEngine, WindowAndResetForgetOldEvidence) {
  const FleetInventory fleet = MakeFleet(10, 4, 10);
  FakeClock clock(Hours(1010));
  AttributionOptions options;
  options.window = std::chrono::hours(24 * 7);
  auto engine = AttributionEngine::Create(fleet, clock, options);
  ASSERT_OK(engine);
  AddQuietBackground(*engine, 10, 4);
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(
        engine->AddOutcome(FailedWithXid(fmt::format("d{}", i), {Gpu(1, 1)}, 1000 + i, 1, 74)));
  }
  EXPECT_THAT(Ids(engine->Analyze().suspects), ElementsAre("gpu n1-g1"));

  ASSERT_OK(engine->ResetDevice(Device::OfGpu(Gpu(1, 1))));
  EXPECT_TRUE(engine->Analyze().suspects.empty());
  EXPECT_THAT(engine->ResetDevice(Device::OfGpu(GpuUuid("n1-g9"))),
              StatusIs(StatusCode::kNotFound, HasSubstr("gpu n1-g9")));

  // Evidence after the reset counts again; the window then forgets it.
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK(
        engine->AddOutcome(FailedWithXid(fmt::format("e{}", i), {Gpu(1, 1)}, 1010 + i, 1, 74)));
  }
  clock.Set(Hours(1020));
  EXPECT_THAT(Ids(engine->Analyze().suspects), ElementsAre("gpu n1-g1"));
  clock.Set(Hours(1020 + 24 * 8));
  EXPECT_TRUE(engine->Analyze().suspects.empty());
  EXPECT_EQ(engine->Analyze().runs, 0);
  ASSERT_OK(engine->AddOutcome(
      MakeRun("late", {Gpu(2, 2)}, 1020 + 24 * 8 - 1, 1, ExitReason::kSucceeded)));
  EXPECT_EQ(engine->stored_runs(), 1);
}

TEST(AttributionEngine, JobStartAndEndBuildTheOutcomeRecord) {
  const FleetInventory fleet = MakeFleet(4, 4, 2);
  FakeClock clock(Hours(10));
  auto engine = AttributionEngine::Create(fleet, clock, AttributionOptions());
  ASSERT_OK(engine);
  ASSERT_OK(engine->JobStarted(JobId("train"), 2, {Gpu(1, 0), Gpu(0, 3), Gpu(1, 1)}));
  EXPECT_THAT(engine->JobStarted(JobId("train"), 3, {Gpu(2, 0)}),
              StatusIs(StatusCode::kAlreadyExists, HasSubstr("\"train\"")));
  clock.Advance(std::chrono::hours(2));

  // Bad input changes nothing.
  EXPECT_THAT(engine->JobEnded(JobEnd{JobId("ghost"), ExitReason::kInfraError, {}, {}}),
              StatusIs(StatusCode::kNotFound, HasSubstr("unknown job \"ghost\"")));
  EXPECT_THAT(
      engine->JobEnded(JobEnd{JobId("train"), ExitReason::kInfraError, {{Gpu(3, 3), 79}}, {}}),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("xids[0].gpu: \"n3-g3\"")));
  EXPECT_EQ(engine->running_jobs(), 1);
  EXPECT_EQ(engine->stored_runs(), 0);

  auto record =
      engine->JobEnded(JobEnd{JobId("train"), ExitReason::kInfraError, {{Gpu(0, 3), 79}}, {}});
  ASSERT_OK(record);
  EXPECT_EQ(record->attempt, 2);
  EXPECT_EQ(record->start, Hours(10));
  EXPECT_EQ(record->end, Hours(12));
  EXPECT_EQ(record->size(), 3);
  EXPECT_THAT(record->nodes, ElementsAre(NodeId("n1"), NodeId("n0")));
  EXPECT_EQ(engine->running_jobs(), 0);
  EXPECT_EQ(engine->stored_runs(), 1);
  EXPECT_THAT(engine->JobEnded(JobEnd{JobId("train"), ExitReason::kSucceeded, {}, {}}),
              StatusIs(StatusCode::kNotFound));
  EXPECT_EQ(engine->Analyze().failed_runs, 1);
}

TEST(AttributionEngine, RejectsBadStartsAndRecords) {
  const FleetInventory fleet = MakeFleet(2, 2, 2);
  FakeClock clock;
  auto engine = AttributionEngine::Create(fleet, clock, AttributionOptions());
  ASSERT_OK(engine);
  EXPECT_THAT(engine->JobStarted(JobId(""), 0, {Gpu(0, 0)}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("job: empty id")));
  EXPECT_THAT(engine->JobStarted(JobId("j"), -1, {Gpu(0, 0)}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("attempt: -1")));
  EXPECT_THAT(engine->JobStarted(JobId("j"), 0, {}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("holds no GPU")));
  EXPECT_THAT(engine->JobStarted(JobId("j"), 0, {Gpu(0, 0), GpuUuid("x")}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpus[1]: unknown GPU \"x\"")));
  EXPECT_THAT(engine->JobStarted(JobId("j"), 0, {Gpu(0, 0), Gpu(0, 0)}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("listed twice")));
  EXPECT_THAT(engine->AddOutcome(MakeRun("j", {GpuUuid("x")}, 0, 1, ExitReason::kSucceeded)),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("unknown GPU")));
  EXPECT_EQ(engine->running_jobs(), 0);
  EXPECT_EQ(engine->stored_runs(), 0);
}

TEST(AttributionOptions, ValidateNamesTheField) {
  const struct {
    const char* field;
    std::function<void(AttributionOptions&)> spoil;
  } cases[] = {
      {"alpha: 0", [](AttributionOptions& o) { o.alpha = 0; }},
      {"alpha: 1", [](AttributionOptions& o) { o.alpha = 1; }},
      {"min_failures: 0", [](AttributionOptions& o) { o.min_failures = 0; }},
      {"min_rate_ratio: -1", [](AttributionOptions& o) { o.min_rate_ratio = -1; }},
      {"max_shared_gpus: 0", [](AttributionOptions& o) { o.max_shared_gpus = 0; }},
      {"window: -1 ns", [](AttributionOptions& o) { o.window = Duration(-1); }},
      {"max_passes: 0", [](AttributionOptions& o) { o.max_passes = 0; }},
      {"min_node_spread_gpus: 0", [](AttributionOptions& o) { o.min_node_spread_gpus = 0; }},
      {"prior_rate_per_gpu_hour: 0", [](AttributionOptions& o) { o.prior_rate_per_gpu_hour = 0; }},
      {"prior_failures: -0.5", [](AttributionOptions& o) { o.prior_failures = -0.5; }},
      {"report_top: -1", [](AttributionOptions& o) { o.report_top = -1; }},
  };
  const FleetInventory fleet = MakeFleet(1, 1, 1);
  FakeClock clock;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    AttributionOptions options;
    c.spoil(options);
    EXPECT_THAT(options.Validate(), StatusIs(StatusCode::kInvalidArgument, HasSubstr(c.field)));
    EXPECT_THAT(AttributionEngine::Create(fleet, clock, options),
                StatusIs(StatusCode::kInvalidArgument));
  }
  EXPECT_OK(AttributionOptions().Validate());
}

TEST(SizeBucket, GroupsSizesByPowersOfTwo) {
  EXPECT_EQ(SizeBucket(1), 0);
  EXPECT_EQ(SizeBucket(2), 1);
  EXPECT_EQ(SizeBucket(3), 2);
  EXPECT_EQ(SizeBucket(4), 2);
  EXPECT_EQ(SizeBucket(8), 3);
  EXPECT_EQ(SizeBucket(9), 4);
  EXPECT_EQ(SizeBucket(1024), 10);
}

}  // namespace
}  // namespace gpufleet::reliability
