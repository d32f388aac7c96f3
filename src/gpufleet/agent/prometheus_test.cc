// SPDX-License-Identifier: Apache-2.0
// Debian's Prometheus scrapes a telemetry server backed by the simulated probe on loopback; the
// series it stores must be the ones the probe reported, under dcgm-exporter's names and labels.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/http/cpp_httplib.h"

extern char** environ;

namespace gpufleet::agent {
namespace {

using Json = nlohmann::json;

// The first executable `name` on PATH, or "".
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path != nullptr ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

// A loopback port nobody listens on right now.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    port = ntohs(address.sin_port);
  }
  close(fd);
  return port;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A Prometheus server in its own temporary directory, stopped (SIGTERM, then SIGKILL) and
// removed when destroyed.
class PrometheusProcess {
 public:
  PrometheusProcess(const std::string& binary, int target_port) {
    char pattern[] = "/tmp/gpufleet-prometheus-XXXXXX";
    dir_ = mkdtemp(pattern);
    port_ = FreePort();
    std::ofstream(dir_ / "prometheus.yml") << fmt::format(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  evaluation_interval: 1s\n"
        "scrape_configs:\n"
        "  - job_name: gpufleet-agent\n"
        "    static_configs:\n"
        "      - targets: ['127.0.0.1:{}']\n",
        target_port);
    const std::string log = (dir_ / "prometheus.log").string();
    std::vector<std::string> args = {
        binary,
        "--config.file=" + (dir_ / "prometheus.yml").string(),
        "--storage.tsdb.path=" + (dir_ / "data").string(),
        fmt::format("--web.listen-address=127.0.0.1:{}", port_),
        "--log.level=warn",
    };
    std::vector<char*> argv;
    for (std::string& arg : args) {
      argv.push_back(arg.data());
    }
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    if (posix_spawn(&pid_, binary.c_str(), &actions, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
    }
    posix_spawn_file_actions_destroy(&actions);
  }

  ~PrometheusProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (waitpid(pid_, nullptr, WNOHANG) == 0) {
        if (std::chrono::steady_clock::now() > deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, nullptr, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  bool running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  int port() const { return port_; }
  std::string log() const { return ReadFile(dir_ / "prometheus.log"); }

 private:
  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// The instant-query result of `query`, or an empty array while Prometheus is not ready.
Json Query(httplib::Client& client, const std::string& query) {
  httplib::Result response = client.Get(("/api/v1/query?query=" + query).c_str());
  if (!response || response->status != 200) {
    return Json::array();
  }
  const Json body = Json::parse(response->body, nullptr, false);
  if (body.is_discarded() || body.value("status", "") != "success") {
    return Json::array();
  }
  return body["data"]["result"];
}

TEST(PrometheusIntegrationTest, StoresTheSeriesTheProbeReported) {
  const std::string prometheus = FindOnPath("prometheus");
  if (prometheus.empty()) {
    GTEST_SKIP() << "prometheus is not on PATH: install Debian's `prometheus` package "
                    "(scripts/setup does) to run this test";
  }
  // A clock that does not move keeps the simulated readings constant between scrapes.
  FakeClock clock(MonoTime{3'000'000'000});
  const GpuCatalog catalog = GpuCatalog::Default();
  Result<std::unique_ptr<SimulatedProbe>> probe =
      SimulatedProbe::Create(clock, catalog, {.gpu_count = 4, .seed = 11});
  ASSERT_OK(probe);
  for (int gpu = 0; gpu < 4; ++gpu) {
    ASSERT_OK((*probe)->SetLoad(gpu, {.utilization_percent = 15 + 25 * gpu}));
  }
  Result<std::unique_ptr<TelemetrySampler>> sampler = TelemetrySampler::Create(
      {.probe = **probe, .clock = clock, .interval = std::chrono::hours(1), .hostname = "node-7"});
  ASSERT_OK(sampler);
  ASSERT_OK((*sampler)->SampleOnce());
  Result<int> agent_port = (*sampler)->Start("127.0.0.1", 0);
  ASSERT_OK(agent_port);

  // A port picked by FreePort may be taken before Prometheus binds it: try a few.
  std::unique_ptr<PrometheusProcess> server;
  Json result = Json::array();
  for (int attempt = 0; attempt < 3 && result.size() < 4; ++attempt) {
    server = std::make_unique<PrometheusProcess>(prometheus, *agent_port);
    httplib::Client client("127.0.0.1", server->port());
    client.set_connection_timeout(std::chrono::seconds(2));
    client.set_read_timeout(std::chrono::seconds(5));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && server->running()) {
      result = Query(client, "DCGM_FI_DEV_GPU_UTIL");
      if (result.size() >= 4) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_EQ(result.size(), 4U) << "Prometheus log:\n" << server->log();

  const auto snapshot = (*sampler)->LatestSnapshot();
  std::map<int, int64_t> scraped;
  for (const Json& series : result) {
    const Json& labels = series["metric"];
    const int gpu = std::stoi(labels["gpu"].get<std::string>());
    ASSERT_GE(gpu, 0);
    ASSERT_LT(gpu, 4);
    const GpuStaticInfo& info = snapshot->gpus[static_cast<size_t>(gpu)].reading.info;
    EXPECT_EQ(labels["UUID"], info.uuid);
    EXPECT_EQ(labels["pci_bus_id"], info.pci_bus_id);
    EXPECT_EQ(labels["device"], fmt::format("nvidia{}", gpu));
    EXPECT_EQ(labels["modelName"], "NVIDIA H100 80GB HBM3");
    EXPECT_EQ(labels["Hostname"], "node-7");
    EXPECT_EQ(labels["DCGM_FI_DRIVER_VERSION"], "550.54.15");
    EXPECT_EQ(labels["job"], "gpufleet-agent");
    scraped[gpu] = std::stoll(series["value"][1].get<std::string>());
  }
  for (const GpuTelemetry& gpu : snapshot->gpus) {
    EXPECT_EQ(scraped[gpu.reading.info.index], gpu.reading.sample.gpu_util_percent)
        << "GPU " << gpu.reading.info.index;
  }

  // A DOUBLE field survives the round trip too.
  httplib::Client client("127.0.0.1", server->port());
  const Json power = Query(client, "DCGM_FI_DEV_POWER_USAGE%7Bgpu%3D%222%22%7D");
  ASSERT_EQ(power.size(), 1U);
  EXPECT_DOUBLE_EQ(
      std::stod(power[0]["value"][1].get<std::string>()),
      static_cast<double>(*snapshot->gpus[2].reading.sample.power_milliwatts) / 1000.0);
  (*sampler)->Stop();
}

}  // namespace
}  // namespace gpufleet::agent
