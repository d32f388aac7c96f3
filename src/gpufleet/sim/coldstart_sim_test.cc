// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/sim/coldstart_sim.h"

#include <sstream>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/sim/testing/charts.h"

namespace gpufleet::sim {
namespace {

using ::gpufleet::sim::testing::ChartsIn;
using ::gpufleet::sim::testing::ChartsWithSeries;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;

constexpr int64_t kChunk = int64_t{64} << 20;

// Slot length: one 64 MiB chunk over a 100 Gb/s link.
constexpr double kSlotSeconds = static_cast<double>(kChunk) * 8 / 100e9;

// One gang of `nodes` nodes on a fleet of `fleet` nodes, one image of four chunks, a registry
// as fast as a node's link.
ColdStartOptions Small(int gangs, int nodes, int fleet) {
  ColdStartOptions options;
  options.fleet_nodes = fleet;
  options.gangs = gangs;
  options.gang_nodes = nodes;
  options.images = {ColdStartImage{"tiny", {4 * kChunk}, 1}};
  options.registry_gbps = 100;
  options.node_gbps = 100;
  return options;
}

// The result, or an empty one after a test failure.
ColdStartResult MustRun(ColdStartOptions options) {
  Result<ColdStartResult> result = RunColdStartSim(std::move(options));
  EXPECT_OK(result);
  return result.ok() ? std::move(result).value() : ColdStartResult{};
}

const ColdStartStrategyResult& Of(const ColdStartResult& result, ColdStartStrategy strategy) {
  for (const ColdStartStrategyResult& s : result.strategies) {
    if (s.strategy == strategy) {
      return s;
    }
  }
  ADD_FAILURE() << "no result for " << ColdStartStrategyName(strategy);
  static const ColdStartStrategyResult* const kNone = new ColdStartStrategyResult();
  return *kNone;
}

TEST(ColdStartSimTest, RegistryOnlySendsEveryChunkToEveryNodeAtTheRegistrysRate) {
  const ColdStartResult result = MustRun(Small(1, 4, 4));
  const ColdStartStrategyResult& registry = Of(result, ColdStartStrategy::kRegistry);
  // 16 chunk transfers, one per slot: the registry sends one chunk's worth per slot.
  EXPECT_DOUBLE_EQ(registry.gangs[0].start_seconds, 16 * kSlotSeconds);
  EXPECT_EQ(registry.registry_bytes, 4 * 4 * kChunk);
  EXPECT_EQ(registry.image_bytes_needed, 4 * kChunk);
}

TEST(ColdStartSimTest, PeersFetchEachChunkFromTheRegistryOnceAndStartSooner) {
  const ColdStartResult result = MustRun(Small(1, 4, 4));
  const ColdStartStrategyResult& p2p = Of(result, ColdStartStrategy::kPeerToPeer);
  EXPECT_EQ(p2p.registry_bytes, 4 * kChunk) << "each chunk once";
  // Chunk k leaves the registry in slot k and spreads to the others while the next comes in.
  EXPECT_LT(p2p.gangs[0].start_seconds, 8 * kSlotSeconds);
  EXPECT_GE(p2p.gangs[0].start_seconds, 4 * kSlotSeconds) << "no faster than one node's link";
}

TEST(ColdStartSimTest, LocalityPlacesTheNextGangWhereTheImageIs) {
  const ColdStartResult result = MustRun(Small(2, 4, 16));
  for (const ColdStartStrategy strategy :
       {ColdStartStrategy::kRegistryLocality, ColdStartStrategy::kPeerToPeerLocality}) {
    const ColdStartStrategyResult& local = Of(result, strategy);
    ASSERT_EQ(local.gangs.size(), 2u);
    EXPECT_EQ(local.gangs[1].nodes_already_holding, 4) << ColdStartStrategyName(strategy);
    EXPECT_EQ(local.gangs[1].start_seconds, 0);
    EXPECT_EQ(local.gangs[1].registry_bytes, 0);
  }
}

TEST(ColdStartSimTest, PeersOutsideTheGangServeWhatTheyHold) {
  // Two gangs of 2 on 4 nodes: without locality the second gang may land on other nodes, but
  // the first gang's nodes serve the image, so the registry sends it once in all.
  const ColdStartResult result = MustRun(Small(2, 2, 4));
  EXPECT_EQ(Of(result, ColdStartStrategy::kPeerToPeer).registry_bytes, 4 * kChunk);
}

TEST(ColdStartSimTest, ABigGangBehindASlowRegistryStartsFarSoonerWithPeersAndLocality) {
  ColdStartOptions options;
  options.fleet_nodes = 64;
  options.gangs = 6;
  options.gang_nodes = 32;
  options.images = {LayeredImage("big", int64_t{4} * 1000 * 1000 * 1000)};
  options.registry_gbps = 25;
  const ColdStartResult result = MustRun(options);
  const double registry = Of(result, ColdStartStrategy::kRegistry).start_seconds.p50;
  const double local_p2p = Of(result, ColdStartStrategy::kPeerToPeerLocality).start_seconds.p50;
  EXPECT_GT(registry, 5 * local_p2p);
  // 32 copies of 4 GB through 25 Gb/s: about 41 s for the first gang.
  EXPECT_NEAR(Of(result, ColdStartStrategy::kRegistry).gangs[0].start_seconds, 41, 2);
}

TEST(ColdStartSimTest, TheSameSeedGivesTheSameResult) {
  ColdStartOptions options;
  options.fleet_nodes = 64;
  options.gangs = 8;
  options.seed = 5;
  const ColdStartResult first = MustRun(options);
  const ColdStartResult second = MustRun(options);
  std::ostringstream a;
  std::ostringstream b;
  WriteColdStartJson(first, a);
  WriteColdStartJson(second, b);
  EXPECT_EQ(a.str(), b.str());
  EXPECT_THAT(a.str(), HasSubstr("\"strategy\": \"p2p+locality\""));
}

TEST(ColdStartSimTest, TheReportChartsEveryStrategysStartTimesAndRegistryBytes) {
  // Two gangs of 4 on 4 nodes: the second finds the image on every node (cached), so the registry
  // serves it 4 times for 2 gangs registry-only (x image 2.00) and once with peers (0.50).
  const ColdStartResult result = MustRun(Small(2, 4, 4));
  std::ostringstream out;
  ASSERT_OK(WriteColdStartReport(result, out));
  const std::string report = out.str();
  EXPECT_THAT(report, HasSubstr("<title>gpufleet sim coldstart</title>"));
  const std::vector<nlohmann::json> charts = ChartsIn(report);
  EXPECT_EQ(charts.size(), 2U);
  for (const ColdStartStrategy strategy : kColdStartStrategies) {
    // One CDF and one cumulative series per strategy.
    EXPECT_EQ(ChartsWithSeries(charts, ColdStartStrategyName(strategy)), 2)
        << ColdStartStrategyName(strategy);
  }
  EXPECT_THAT(report, HasSubstr("<td>registry</td>"));
  EXPECT_THAT(report, HasSubstr("<td class=\"num\">2.00</td></tr>"));
  EXPECT_THAT(report, HasSubstr("<td class=\"num\">0.50</td></tr>"));
  EXPECT_THAT(report, HasSubstr("new uPlot("));

  std::ostringstream again;
  ASSERT_OK(WriteColdStartReport(MustRun(Small(2, 4, 4)), again));
  EXPECT_EQ(report, again.str());
  std::ostringstream broken;
  broken.setstate(std::ios::badbit);
  EXPECT_THAT(WriteColdStartReport(result, broken), StatusIs(StatusCode::kUnavailable));
}

TEST(ColdStartSimTest, BadOptionsNameTheField) {
  ColdStartOptions options = Small(1, 8, 4);
  EXPECT_THAT(RunColdStartSim(options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gang_nodes: 8")));
  options = Small(1, 2, 4);
  options.registry_gbps = 0;
  EXPECT_THAT(RunColdStartSim(options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("registry_gbps 0")));
  options = Small(1, 2, 4);
  options.cache_bytes = kChunk;
  EXPECT_THAT(RunColdStartSim(options),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("no node could hold it")));
}

}  // namespace
}  // namespace gpufleet::sim
