// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/agent/telemetry.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/cpp_httplib.h"

namespace gpufleet::agent {
namespace {

using ::gpufleet::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

// Forwards to a probe and fails Sample() while `fail` is set: a fault-injection wrapper.
class FailingProbe final : public GpuProbe {
 public:
  explicit FailingProbe(GpuProbe& probe) : probe_(probe) {}
  Result<ProbeInventory> Inventory() override {
    ++inventory_calls;
    return probe_.Inventory();
  }
  Result<std::vector<GpuSample>> Sample() override {
    if (fail) {
      return UnavailableError("probe failed on purpose");
    }
    Result<std::vector<GpuSample>> samples = probe_.Sample();
    if (samples.ok() && drop_last) {
      samples->pop_back();
    }
    return samples;
  }

  bool fail = false;
  bool drop_last = false;
  int inventory_calls = 0;

 private:
  GpuProbe& probe_;
};

class TelemetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<SimulatedProbe>> probe =
        SimulatedProbe::Create(clock_, catalog_, {.gpu_count = 4});
    ASSERT_OK(probe);
    probe_ = std::move(probe).value();
    failing_ = std::make_unique<FailingProbe>(*probe_);
    Result<std::unique_ptr<TelemetrySampler>> sampler =
        TelemetrySampler::Create({.probe = *failing_, .clock = clock_, .hostname = "node-7"});
    ASSERT_OK(sampler);
    sampler_ = std::move(sampler).value();
  }

  FakeClock clock_{MonoTime{5'000'000'000}};
  GpuCatalog catalog_ = GpuCatalog::Default();
  std::unique_ptr<SimulatedProbe> probe_;
  std::unique_ptr<FailingProbe> failing_;
  std::unique_ptr<TelemetrySampler> sampler_;
};

TEST_F(TelemetryTest, BeforeTheFirstSampleTheSnapshotHasTheInventoryOnly) {
  const auto snapshot = sampler_->LatestSnapshot();
  EXPECT_EQ(snapshot->sample_count, 0);
  EXPECT_EQ(snapshot->driver_version, "550.54.15");
  ASSERT_EQ(snapshot->gpus.size(), 4U);
  EXPECT_EQ(snapshot->gpus[2].reading.info.index, 2);
  EXPECT_FALSE(snapshot->gpus[2].reading.sample.temperature_c.has_value());
  const std::string metrics = sampler_->RenderMetrics();
  EXPECT_THAT(metrics, Not(HasSubstr("DCGM_FI_")));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_agent_samples_total 0\n"));
}

TEST_F(TelemetryTest, SampleOncePublishesReadingsStampedByTheClock) {
  ASSERT_OK(probe_->SetLoad(1, {.utilization_percent = 70}));
  ASSERT_OK(sampler_->SampleOnce());
  clock_.Advance(std::chrono::seconds(1));
  ASSERT_OK(sampler_->SampleOnce());
  const auto snapshot = sampler_->LatestSnapshot();
  EXPECT_EQ(snapshot->sample_count, 2);
  EXPECT_EQ(snapshot->sampled_at, MonoTime{6'000'000'000});
  EXPECT_GE(*snapshot->gpus[1].reading.sample.gpu_util_percent, 68);
  EXPECT_EQ(snapshot->gpus[1].reading.last_xid, 0);
  EXPECT_EQ(snapshot->gpus[1].health.health, GpuHealth::kHealthy);
  const std::string metrics = sampler_->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("DCGM_FI_DEV_GPU_UTIL{gpu=\"1\","));
  EXPECT_THAT(metrics, HasSubstr(",Hostname=\"node-7\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"}"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_agent_samples_total 2\n"));
}

TEST_F(TelemetryTest, AnXidsVerdictHoldsUntilTheHistoryIsCleared) {
  ASSERT_OK(probe_->InjectXid(2, 79));
  ASSERT_OK(sampler_->SampleOnce());
  auto snapshot = sampler_->LatestSnapshot();
  EXPECT_EQ(snapshot->gpus[2].reading.last_xid, 79);
  EXPECT_EQ(snapshot->gpus[2].health.health, GpuHealth::kUnhealthy);
  EXPECT_EQ(snapshot->gpus[2].health.drain, DrainAction::kNow);
  EXPECT_EQ(snapshot->gpus[0].health.health, GpuHealth::kHealthy);

  // The next sample has no XID, but the GPU still needs its reset.
  ASSERT_OK(sampler_->SampleOnce());
  snapshot = sampler_->LatestSnapshot();
  EXPECT_EQ(snapshot->gpus[2].health.health, GpuHealth::kUnhealthy);
  EXPECT_THAT(snapshot->gpus[2].xids_since_reset, ElementsAre(Pair(79, 1)));

  ASSERT_OK(sampler_->ClearXidHistory(2));
  snapshot = sampler_->LatestSnapshot();
  EXPECT_EQ(snapshot->gpus[2].health.health, GpuHealth::kHealthy);
  EXPECT_TRUE(snapshot->gpus[2].xids_since_reset.empty());
  // The counter and the last-value gauge keep the history, as dcgm-exporter's gauge does.
  EXPECT_THAT(snapshot->gpus[2].xid_totals, ElementsAre(Pair(79, 1)));
  EXPECT_EQ(snapshot->gpus[2].reading.last_xid, 79);
  const std::string metrics = sampler_->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("gpufleet_gpu_xid_errors_total{gpu=\"2\","));
  EXPECT_THAT(metrics, HasSubstr("Hostname=\"node-7\",xid=\"79\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("err_code=\"79\",err_msg=\"GPU has fallen off the bus\"} 79\n"));
}

TEST_F(TelemetryTest, HealthAndLossAreExported) {
  ASSERT_OK(probe_->InjectGpuLost(3));
  ASSERT_OK(probe_->InjectPowerBrake(1));
  ASSERT_OK(sampler_->SampleOnce());
  const std::string metrics = sampler_->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("# TYPE gpufleet_gpu_health gauge\n"));
  EXPECT_THAT(metrics, HasSubstr("device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\","
                                 "Hostname=\"node-7\"} 0\n"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_gpu_lost{gpu=\"3\","));
  const auto snapshot = sampler_->LatestSnapshot();
  EXPECT_EQ(snapshot->gpus[1].health.health, GpuHealth::kDegraded);
  EXPECT_EQ(snapshot->gpus[3].health.health, GpuHealth::kUnhealthy);
  EXPECT_THAT(snapshot->gpus[3].health.Summary(), HasSubstr("GPU lost"));
  // The lost GPU has no DCGM series.
  EXPECT_THAT(metrics, Not(HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"3\"")));
}

TEST_F(TelemetryTest, AProbeErrorKeepsThePreviousSnapshotAndIsCounted) {
  ASSERT_OK(sampler_->SampleOnce());
  failing_->fail = true;
  EXPECT_THAT(sampler_->SampleOnce(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("probe failed on purpose")));
  EXPECT_EQ(sampler_->LatestSnapshot()->sample_count, 1);
  EXPECT_THAT(sampler_->RenderMetrics(), HasSubstr("gpufleet_agent_sample_errors_total 1\n"));
}

TEST_F(TelemetryTest, ASampleForADifferentSetOfGpusRereadsTheInventory) {
  EXPECT_EQ(failing_->inventory_calls, 1);
  failing_->drop_last = true;
  EXPECT_THAT(sampler_->SampleOnce(),
              StatusIs(StatusCode::kUnavailable, HasSubstr("3 samples for 4 GPUs")));
  failing_->drop_last = false;
  ASSERT_OK(sampler_->SampleOnce());
  EXPECT_EQ(failing_->inventory_calls, 2);
}

// /metrics has no authentication: the GPU series name the jobs on them only when the agent is
// told to (--metrics-job-labels), as dcgm-exporter maps jobs only when configured to.
TEST_F(TelemetryTest, JobLabelsAreRenderedOnlyWhenAskedFor) {
  const GpuStaticInfo& gpu0 = sampler_->LatestSnapshot()->gpus[0].reading.info;
  const std::vector<GpuTask> tasks = {{.device_uuid = gpu0.uuid,
                                       .job = "nlp/secret-run",
                                       .task = "main-0",
                                       .team = "nlp",
                                       .queue = "research"}};
  sampler_->SetGpuTasks(tasks);
  ASSERT_OK(sampler_->SampleOnce());
  const std::string hidden = sampler_->RenderMetrics();
  EXPECT_THAT(hidden, HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""));
  for (const char* leak : {"hpc_job=", "secret-run", "team=", "queue="}) {
    EXPECT_THAT(hidden, Not(HasSubstr(leak)));
  }

  Result<std::unique_ptr<TelemetrySampler>> labelled = TelemetrySampler::Create(
      {.probe = *probe_, .clock = clock_, .hostname = "node-7", .job_labels = true});
  ASSERT_OK(labelled);
  (*labelled)->SetGpuTasks(tasks);
  ASSERT_OK((*labelled)->SampleOnce());
  EXPECT_THAT((*labelled)->RenderMetrics(),
              HasSubstr("hpc_job=\"nlp/secret-run\",queue=\"research\",task=\"main-0\","
                        "team=\"nlp\"}"));
}

TEST_F(TelemetryTest, EachSampleReadsTheLinksAndMetricsServeThem) {
  LinkMonitor links(
      {.clock = clock_, .sysfs_root = std::string(GPUFLEET_TEST_DATA_DIR) + "/sysfs/port_down"});
  Result<std::unique_ptr<TelemetrySampler>> sampler =
      TelemetrySampler::Create({.probe = *probe_, .clock = clock_, .links = &links});
  ASSERT_OK(sampler);
  EXPECT_THAT((*sampler)->RenderMetrics(), Not(HasSubstr("node_infiniband_state_id")));
  ASSERT_OK((*sampler)->SampleOnce());
  EXPECT_THAT((*sampler)->LatestSnapshot()->link_findings,
              ElementsAre(Field(&LinkFinding::link, "mlx5_1/1")));
  const std::string metrics = (*sampler)->RenderMetrics();
  EXPECT_THAT(metrics, HasSubstr("DCGM_FI_DEV_GPU_TEMP{gpu=\"0\""));
  EXPECT_THAT(metrics, HasSubstr("node_infiniband_state_id{device=\"mlx5_1\",port=\"1\"} 1\n"));
  EXPECT_THAT(metrics, HasSubstr("gpufleet_node_link_health 1\n"));
}

TEST_F(TelemetryTest, BadArgumentsAreRejected) {
  EXPECT_THAT(TelemetrySampler::Create(
                  {.probe = *probe_, .clock = clock_, .interval = std::chrono::milliseconds(0)}),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("interval 0 ms")));
  EXPECT_THAT(sampler_->ClearXidHistory(4),
              StatusIs(StatusCode::kInvalidArgument, HasSubstr("gpu index 4")));
}

// Polls until `done` holds or ten seconds pass.
template <typename Predicate>
bool WaitFor(Predicate done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) {
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return done();
}

class TelemetryServerIntegrationTest : public TelemetryTest {};

TEST_F(TelemetryServerIntegrationTest, ServesMetricsOnLoopback) {
  Result<int> port = sampler_->Start("127.0.0.1", 0);
  ASSERT_OK(port);
  EXPECT_THAT(sampler_->Start("127.0.0.1", 0), StatusIs(StatusCode::kFailedPrecondition));
  ASSERT_TRUE(WaitFor([&] { return sampler_->LatestSnapshot()->sample_count >= 1; }));

  httplib::Client client("127.0.0.1", *port);
  httplib::Result response = client.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  for (int gpu = 0; gpu < 4; ++gpu) {
    EXPECT_THAT(response->body, HasSubstr("DCGM_FI_DEV_GPU_UTIL{gpu=\"" + std::to_string(gpu)));
  }
  httplib::Result missing = client.Get("/other");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);

  sampler_->Stop();
  sampler_->Stop();
  EXPECT_FALSE(client.Get("/metrics"));
}

TEST_F(TelemetryServerIntegrationTest, SamplesOnItsOwnThreadAtTheInterval) {
  SystemClock clock;
  Result<std::unique_ptr<TelemetrySampler>> sampler = TelemetrySampler::Create(
      {.probe = *probe_, .clock = clock, .interval = std::chrono::milliseconds(20)});
  ASSERT_OK(sampler);
  ASSERT_OK((*sampler)->Start("127.0.0.1", 0));
  EXPECT_TRUE(WaitFor([&] { return (*sampler)->LatestSnapshot()->sample_count >= 3; }));
  (*sampler)->Stop();
  const int64_t count = (*sampler)->LatestSnapshot()->sample_count;
  EXPECT_EQ((*sampler)->LatestSnapshot()->sample_count, count);
}

TEST_F(TelemetryServerIntegrationTest, ABusyPortIsUnavailable) {
  // A plain listening socket (no SO_REUSEPORT) holds the port.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const int port = ntohs(address.sin_port);
  EXPECT_THAT(sampler_->Start("127.0.0.1", port),
              StatusIs(StatusCode::kUnavailable,
                       HasSubstr(fmt::format("cannot listen on 127.0.0.1:{}", port))));
  close(fd);
}

}  // namespace
}  // namespace gpufleet::agent
