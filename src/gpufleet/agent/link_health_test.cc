// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/link_health.h"

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/core/clock.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/os/files.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Fixture trees in the kernel's layout: three RDMA ports (two InfiniBand NDR, one RoCE HDR) and
// three interfaces (eth0 up, eno1 down, the loopback); mlx5_1 differs from tree to tree.
std::string SysfsFixture(const std::string& name) {
  return std::string(GPUFLEET_TEST_DATA_DIR) + "/sysfs/" + name;
}

// A writable copy of a fixture tree, for counters that grow between samples.
class LinkCountersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "/gpufleet_links_XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
    root_ = pattern;
    std::filesystem::copy(SysfsFixture("healthy"), root_, std::filesystem::copy_options::recursive);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void SetCounter(const std::string& relative_path, uint64_t value) {
    ASSERT_OK(os::WriteFileAtomically(root_ + "/" + relative_path, std::to_string(value) + "\n"));
  }

  std::string root_;
};

TEST(IbPortStateTest, ParsesTheKernelsFormat) {
  auto state_result = ParseIbPortState("state", "4: ACTIVE\n");
  ASSERT_OK(state_result.status());
  auto state = std::move(state_result).value();
  EXPECT_EQ(state.first, 4);
  EXPECT_EQ(state.second, "ACTIVE");
  auto phys_result = ParseIbPortState("phys_state", "5: LinkUp");
  ASSERT_OK(phys_result.status());
  auto phys = std::move(phys_result).value();
  EXPECT_EQ(phys.first, 5);
  EXPECT_EQ(phys.second, "LinkUp");
  EXPECT_THAT(ParseIbPortState("state", "ACTIVE"),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("state: \"ACTIVE\"")));
}

TEST(IbRateTest, ParsesTheKernelsFormat) {
  auto rate_result = ParseIbRate("400 Gb/sec (4X NDR)\n");
  ASSERT_OK(rate_result.status());
  auto rate = std::move(rate_result).value();
  EXPECT_EQ(rate.first, 400);
  EXPECT_EQ(rate.second, "4X NDR");
  auto sdr_result = ParseIbRate("2.5 Gb/sec (1X SDR)");
  ASSERT_OK(sdr_result.status());
  auto sdr = std::move(sdr_result).value();
  EXPECT_EQ(sdr.first, 2.5);
  EXPECT_EQ(sdr.second, "1X SDR");
  EXPECT_THAT(ParseIbRate("fast"), StatusIs(StatusCode::kInvalidArgument, HasSubstr("\"fast\"")));
}

TEST(ReadLinksTest, ReadsAHealthyTree) {
  auto readings_result = ReadLinks(SysfsFixture("healthy"));
  ASSERT_OK(readings_result.status());
  LinkReadings readings = std::move(readings_result).value();
  ASSERT_EQ(readings.ports.size(), 3u);
  const IbPortReading& port = readings.ports[0];
  EXPECT_EQ(port.device, "mlx5_0");
  EXPECT_EQ(port.port, 1);
  EXPECT_EQ(port.state_id, 4);
  EXPECT_EQ(port.state, "ACTIVE");
  EXPECT_EQ(port.phys_state_id, 5);
  EXPECT_EQ(port.phys_state, "LinkUp");
  EXPECT_EQ(port.rate_gbps, 400);
  EXPECT_EQ(port.rate_detail, "4X NDR");
  EXPECT_EQ(port.link_layer, "InfiniBand");
  EXPECT_EQ(port.counters.at("link_error_recovery"), 2u);
  EXPECT_EQ(readings.ports[2].link_layer, "Ethernet");
  // The loopback and the bonding_masters file are not interfaces.
  ASSERT_EQ(readings.interfaces.size(), 2u);
  EXPECT_EQ(readings.interfaces[0].name, "eno1");
  EXPECT_EQ(readings.interfaces[0].operstate, "down");
  EXPECT_FALSE(readings.interfaces[0].speed_mbps.has_value());
  EXPECT_EQ(readings.interfaces[1].name, "eth0");
  EXPECT_EQ(readings.interfaces[1].speed_mbps, 200000);
  EXPECT_EQ(readings.interfaces[1].statistics.at("rx_dropped"), 1u);
  EXPECT_THAT(EvaluateLinkState(readings), IsEmpty());
}

TEST(ReadLinksTest, ANodeWithoutRdmaHasNoPorts) {
  auto readings_result = ReadLinks(::testing::TempDir() + "/no-such-sysfs");
  ASSERT_OK(readings_result.status());
  LinkReadings readings = std::move(readings_result).value();
  EXPECT_THAT(readings.ports, IsEmpty());
  EXPECT_THAT(readings.interfaces, IsEmpty());
}

TEST_F(LinkCountersTest, AnUnparsablePortFileNamesItsPath) {
  ASSERT_OK(os::WriteFileAtomically(root_ + "/class/infiniband/mlx5_0/ports/1/state", "bogus\n"));
  EXPECT_THAT(ReadLinks(root_),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("mlx5_0/ports/1/state: \"bogus\"")));
}

TEST(LinkStateTest, APortDownIsAFinding) {
  auto readings_result = ReadLinks(SysfsFixture("port_down"));
  ASSERT_OK(readings_result.status());
  LinkReadings readings = std::move(readings_result).value();
  EXPECT_THAT(EvaluateLinkState(readings),
              ElementsAre(LinkFinding{"mlx5_1/1", "port_down",
                                      "mlx5_1/1: port DOWN (Disabled), not ACTIVE and LinkUp"}));
}

TEST(LinkStateTest, ARateBelowTheNodesBestIsAFinding) {
  auto readings_result = ReadLinks(SysfsFixture("degraded_rate"));
  ASSERT_OK(readings_result.status());
  LinkReadings readings = std::move(readings_result).value();
  // The RoCE port at 200 Gb/sec is judged against the Ethernet ports, not the InfiniBand ones.
  EXPECT_THAT(EvaluateLinkState(readings),
              ElementsAre(LinkFinding{"mlx5_1/1", "rate",
                                      "mlx5_1/1: rate 200 Gb/sec (2X NDR) below 400 Gb/sec"}));
}

TEST(LinkStateTest, AnExpectedRateJudgesEveryPort) {
  auto readings_result = ReadLinks(SysfsFixture("healthy"));
  ASSERT_OK(readings_result.status());
  LinkReadings readings = std::move(readings_result).value();
  EXPECT_THAT(EvaluateLinkState(readings, {.expected_rate_gbps = 400}),
              ElementsAre(Field(&LinkFinding::link, "mlx5_2/1")));
}

TEST_F(LinkCountersTest, GrowingErrorsBeyondTheirBoundAreFindings) {
  auto before_result = ReadLinks(root_);
  ASSERT_OK(before_result.status());
  LinkReadings before = std::move(before_result).value();
  SetCounter("class/infiniband/mlx5_0/ports/1/counters/link_downed", 1);
  SetCounter("class/infiniband/mlx5_1/ports/1/counters/symbol_error", 3 + 11);
  SetCounter("class/infiniband/mlx5_2/ports/1/counters/symbol_error", 10);  // at the bound
  SetCounter("class/infiniband/mlx5_2/ports/1/counters/port_rcv_errors", 50);
  SetCounter("class/net/eth0/statistics/rx_errors", 11);
  SetCounter("class/net/eno1/statistics/tx_errors", 500);  // down: not judged
  auto after_result = ReadLinks(root_);
  ASSERT_OK(after_result.status());
  LinkReadings after = std::move(after_result).value();
  EXPECT_THAT(
      EvaluateLinkCounters(before, after),
      ElementsAre(
          LinkFinding{"mlx5_0/1", "link_downed", "mlx5_0/1: link_downed grew by 1 (more than 0)"},
          LinkFinding{"mlx5_1/1", "symbol_error",
                      "mlx5_1/1: symbol_error grew by 11 (more than 10)"},
          LinkFinding{"mlx5_2/1", "receive_errors",
                      "mlx5_2/1: port_rcv_errors grew by 50 (more than 10)"},
          LinkFinding{"eth0", "netdev_errors", "eth0: rx_errors grew by 11 (more than 10)"}));
  // A counter that went backwards (a driver reload) starts again.
  EXPECT_THAT(EvaluateLinkCounters(after, before), IsEmpty());
}

TEST_F(LinkCountersTest, TheMonitorJudgesCountersOncePerWindowAndHoldsTheFindings) {
  FakeClock clock;
  LinkMonitor monitor(
      {.clock = clock, .sysfs_root = root_, .health = {.window = std::chrono::seconds(60)}});
  ASSERT_OK(monitor.SampleOnce());
  EXPECT_THAT(monitor.Findings(), IsEmpty());
  SetCounter("class/infiniband/mlx5_0/ports/1/counters/link_downed", 2);
  clock.Advance(std::chrono::seconds(30));
  ASSERT_OK(monitor.SampleOnce());
  EXPECT_THAT(monitor.Findings(), IsEmpty()) << "the window is not over";
  clock.Advance(std::chrono::seconds(30));
  ASSERT_OK(monitor.SampleOnce());
  EXPECT_THAT(monitor.Findings(), ElementsAre(Field(&LinkFinding::rule, "link_downed")));
  clock.Advance(std::chrono::seconds(30));
  ASSERT_OK(monitor.SampleOnce());
  EXPECT_THAT(monitor.Findings(), ElementsAre(Field(&LinkFinding::rule, "link_downed")))
      << "held until the next window ends";
  clock.Advance(std::chrono::seconds(30));
  ASSERT_OK(monitor.SampleOnce());
  EXPECT_THAT(monitor.Findings(), IsEmpty()) << "no growth in the second window";
  EXPECT_THAT(monitor.RenderMetrics(), HasSubstr("gpufleet_node_link_health 0\n"));
}

TEST_F(LinkCountersTest, TheMonitorKeepsItsLastReadingsOnAReadError) {
  FakeClock clock;
  LinkMonitor monitor({.clock = clock, .sysfs_root = root_});
  ASSERT_OK(os::WriteFileAtomically(root_ + "/class/infiniband/mlx5_1/ports/1/state", "1: DOWN\n"));
  ASSERT_OK(monitor.SampleOnce());
  ASSERT_OK(os::WriteFileAtomically(root_ + "/class/infiniband/mlx5_1/ports/1/state", "?\n"));
  EXPECT_THAT(monitor.SampleOnce(), StatusIs(StatusCode::kInvalidArgument));
  EXPECT_THAT(monitor.Findings(), ElementsAre(Field(&LinkFinding::rule, "port_down")));
  const std::string metrics = monitor.RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("node_infiniband_state_id{device=\"mlx5_1\",port=\"1\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_node_link_health 1\n"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_agent_link_sample_errors_total 1\n"));
}

TEST(LinkMetricsTest, RendersNodeExportersNamesAndLabels) {
  auto readings_result = ReadLinks(SysfsFixture("degraded_rate"));
  ASSERT_OK(readings_result.status());
  LinkReadings readings = std::move(readings_result).value();
  const std::string metrics = RenderLinkMetrics(readings);
  EXPECT_THAT(metrics, HasSubstr("# TYPE node_infiniband_state_id gauge\n"
                                 "node_infiniband_state_id{device=\"mlx5_0\",port=\"1\"} 4\n"));
  EXPECT_THAT(metrics,
              HasSubstr("node_infiniband_physical_state_id{device=\"mlx5_1\",port=\"1\"} 5\n"));
  // 400 and 200 Gb/sec in bytes per second.
  EXPECT_THAT(metrics, HasSubstr("node_infiniband_rate_bytes_per_second{device=\"mlx5_0\","
                                 "port=\"1\"} 50000000000\n"));
  EXPECT_THAT(metrics, HasSubstr("node_infiniband_rate_bytes_per_second{device=\"mlx5_1\","
                                 "port=\"1\"} 25000000000\n"));
  EXPECT_THAT(metrics, HasSubstr("# TYPE node_infiniband_symbol_error_total counter\n"
                                 "node_infiniband_symbol_error_total{device=\"mlx5_0\",port="
                                 "\"1\"} 0\n"
                                 "node_infiniband_symbol_error_total{device=\"mlx5_1\",port="
                                 "\"1\"} 3\n"));
  EXPECT_THAT(metrics,
              HasSubstr("node_infiniband_link_downed_total{device=\"mlx5_2\",port=\"1\"} 0\n"));
  // port_rcv_data counts 4-octet words.
  EXPECT_THAT(metrics, HasSubstr("node_infiniband_port_data_received_bytes_total{device="
                                 "\"mlx5_0\",port=\"1\"} 4000\n"));
  EXPECT_THAT(metrics, HasSubstr("node_infiniband_vl15_dropped_total{"));
  EXPECT_THAT(metrics, HasSubstr("# TYPE node_network_receive_errs_total counter\n"
                                 "node_network_receive_errs_total{device=\"eno1\"} 0\n"
                                 "node_network_receive_errs_total{device=\"eth0\"} 0\n"));
  EXPECT_THAT(metrics, HasSubstr("node_network_receive_drop_total{device=\"eth0\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("node_network_up{device=\"eno1\"} 0\n"
                                 "node_network_up{device=\"eth0\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("node_network_speed_bytes{device=\"eth0\"} 25000000000\n"));
  EXPECT_THAT(metrics, Not(HasSubstr("device=\"lo\"")));
  EXPECT_THAT(metrics, Not(HasSubstr("speed_bytes{device=\"eno1\"}")));
}

}  // namespace
}  // namespace gpufleet::agent
