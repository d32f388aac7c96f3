// SPDX-License-Identifier: Apache-2.0
// Restart benchmark of `gpufleet server` (issue 4 target: serving again within 3 s with 100,000
// jobs in the store). It fills a data directory with jobs made by the server's own code, then
// starts the real binary on it several times and measures from the spawn to the first 200 of
// /readyz (which needs the store open, the HTTP listener up and one scheduling cycle done).
//
//   restart_bench --gpufleet build/apps/gpufleet/gpufleet --jobs 100000 --runs 5
//
// The jobs: submitted through ApiServer::Handle (a team, a queue and a member token as a user
// would have them), then all but --active of them cancelled (at most 2,000 cancelled this way;
// a larger store's other finished jobs are copies of those under new names, written straight
// through the store API in batches), then one scheduling cycle on
// a 64 x 8 GPU cluster places what fits and gives the rest a pending reason. The documents and
// event logs are then copied into DIR/gpufleet.db in large batches (submitting 100,000 jobs one
// fsync at a time would take minutes and measure nothing of interest).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/server.h"
#include "gpufleet/api/testing/server_process.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/core/synthetic_cluster.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/store/sqlite_store.h"

namespace gpufleet {
namespace {

using Json = nlohmann::json;

constexpr char kMemberToken[] = "restart-bench-member-token-0123456789";
constexpr size_t kCopyBatchObjects = 2000;
// Finished jobs submitted and cancelled through the server; the rest of a large store's
// finished jobs are copies of these, written straight into the store (see CloneFinished).
constexpr int kTemplateFinished = 2000;

struct Flags {
  std::string gpufleet = "build/apps/gpufleet/gpufleet";
  std::string dir;
  int jobs = 100000;
  int active = 3000;
  int runs = 5;
  bool refill = false;
};

Status Check(const api::ApiResponse& response, int want) {
  if (response.status != want) {
    return InternalError(
        fmt::format("HTTP {} (want {}): {}", response.status, want, response.body));
  }
  return Status::Ok();
}

api::ApiResponse Call(api::ApiServer& server, const std::string& method, const std::string& path,
                      const std::string& token, std::string body) {
  api::ApiRequest request;
  request.method = method;
  request.path = path;
  request.authorization = "Bearer " + token;
  request.body = std::move(body);
  return server.Handle(request);
}

std::string JobSpec(int index) {
  Json task = {{"name", "main"},
               {"replicas", 1},
               {"command", {"python", "train.py", "--seed", std::to_string(index)}}};
  task["resources"] = {{"cpu", "8"}, {"memory", "64Gi"}};
  task["resources"]["gpus"]["count"] = 1 << (index % 4);  // 1, 2, 4, 8
  Json spec = {{"apiVersion", "gpufleet.io/v1"}, {"kind", "Job"}};
  spec["metadata"] = {{"name", fmt::format("job-{:06}", index)}, {"queue", "bench/batch"}};
  spec["metadata"]["labels"]["experiment"] = fmt::format("sweep-{}", index % 97);
  spec["spec"] = {{"priority", index % 3}, {"runtimeEstimate", "2h"}};
  spec["spec"]["tasks"] = Json::array({task});
  return spec.dump();
}

// Copies every object and event log of `kinds` from `from` into `to`, in large batches.
Status CopyStore(store::StateStore& from, store::StateStore& to,
                 const std::vector<std::string>& kinds) {
  store::WriteBatch batch;
  size_t objects = 0;
  for (const std::string& kind : kinds) {
    GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> all, from.List(kind));
    for (const store::StoredObject& object : all) {
      batch.Create(kind, object.name, object.data);
      GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredEvent> events,
                                from.Events(kind, object.name));
      for (const store::StoredEvent& event : events) {
        batch.AppendEvent(kind, object.name, event.text);
      }
      if (++objects % kCopyBatchObjects == 0) {
        GPUFLEET_RETURN_IF_ERROR(to.Commit(batch));
        batch = store::WriteBatch();
      }
    }
  }
  return to.Commit(batch);
}

// Replaces every occurrence of `from` in `text` by `to`.
std::string ReplaceAll(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// Writes `count` more finished jobs into `to`, each a copy of one of the first `templates`
// (cancelled) jobs of `from` under the name job-NNNNNNN (seven digits, from `first`), with its
// event log, in batches of kCopyBatchObjects: a million jobs in minutes rather than the hours
// that submitting and cancelling each through the API would take.
Status CloneFinished(store::StateStore& from, store::StateStore& to, int templates, int first,
                     int count) {
  struct Template {
    std::string name;  // the store key, e.g. bench/job-000042
    std::string short_name;
    std::string data;
    std::vector<std::string> events;
  };
  std::vector<Template> sources;
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> jobs, from.List("jobs"));
  for (const store::StoredObject& job : jobs) {
    if (static_cast<int>(sources.size()) == templates) {
      break;
    }
    if (TopLevelString(job.data, "state") != std::optional<std::string>("Cancelled")) {
      continue;
    }
    Template source;
    source.name = job.name;
    source.short_name = job.name.substr(job.name.rfind('/') + 1);
    source.data = job.data;
    GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredEvent> events,
                              from.Events("jobs", job.name));
    for (const store::StoredEvent& event : events) {
      source.events.push_back(event.text);
    }
    sources.push_back(std::move(source));
  }
  if (sources.empty()) {
    return FailedPreconditionError("no cancelled job to copy");
  }
  store::WriteBatch batch;
  for (int i = 0; i < count; ++i) {
    const Template& source = sources[static_cast<size_t>(i) % sources.size()];
    const std::string short_name = fmt::format("job-{:07}", first + i);
    const std::string name = ReplaceAll(source.name, source.short_name, short_name);
    batch.Create("jobs", name, ReplaceAll(source.data, source.short_name, short_name));
    for (const std::string& event : source.events) {
      batch.AppendEvent("jobs", name, ReplaceAll(event, source.short_name, short_name));
    }
    if ((i + 1) % static_cast<int>(kCopyBatchObjects) == 0) {
      GPUFLEET_RETURN_IF_ERROR(to.Commit(batch));
      batch = store::WriteBatch();
    }
  }
  return to.Commit(batch);
}

Status Fill(const Flags& flags, const std::string& db_path) {
  const GpuCatalog catalog = GpuCatalog::Default();
  const SystemClock clock;
  store::InMemoryStateStore memory;
  GPUFLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<api::ApiServer> server,
      api::ApiServer::Create(
          {.store = memory, .catalog = catalog, .clock = clock, .wall_clock = &clock}));
  // 64 nodes of 8 H100s in leaves of four, as `gpufleet server --simulated-nodes 64x8` makes.
  SyntheticClusterSpec spec;
  spec.blocks = 1;
  spec.leaves_per_block = 16;
  spec.nodes_per_leaf = 4;
  spec.gpus_per_node = 8;
  spec.gpu_model = "H100-80GB";
  spec.total_nodes = 64;
  GPUFLEET_ASSIGN_OR_RETURN(const Cluster cluster, MakeSyntheticCluster(spec, catalog));
  GPUFLEET_RETURN_IF_ERROR(server->RegisterNodes(cluster).status());
  GPUFLEET_ASSIGN_OR_RETURN(const std::string admin, server->authenticator().CreateToken(
                                                         control::Role::kAdmin, "", "admin"));
  GPUFLEET_RETURN_IF_ERROR(
      Check(Call(*server, "POST", "/v1/teams", admin, R"({"name": "bench"})"), 201));
  GPUFLEET_RETURN_IF_ERROR(Check(
      Call(*server, "POST", "/v1/queues", admin, R"({"name": "bench/batch", "team": "bench"})"),
      201));
  GPUFLEET_RETURN_IF_ERROR(
      server->authenticator().InstallToken(kMemberToken, control::Role::kMember, "bench", "bench"));
  // Up to kTemplateFinished finished jobs go through the server; the others are copies of those.
  const int submitted = std::min(flags.jobs, flags.active + kTemplateFinished);
  for (int i = 0; i < submitted; ++i) {
    GPUFLEET_RETURN_IF_ERROR(
        Check(Call(*server, "POST", "/v1/jobs", kMemberToken, JobSpec(i)), 201));
    if (i < submitted - flags.active) {
      GPUFLEET_RETURN_IF_ERROR(Check(
          Call(*server, "POST", fmt::format("/v1/jobs/job-{:06}/cancel", i), kMemberToken, ""),
          200));
    }
  }
  GPUFLEET_ASSIGN_OR_RETURN(const int placed, server->RunSchedulingCycle());
  fmt::print("filled: {} jobs ({} active, {} placed by one cycle on 512 GPUs)\n", flags.jobs,
             flags.active, placed);
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<store::SqliteStateStore> sqlite,
                            store::SqliteStateStore::Open(db_path));
  GPUFLEET_RETURN_IF_ERROR(
      CopyStore(memory, *sqlite, {"cluster", "nodes", "teams", "queues", "tokens", "jobs"}));
  return CloneFinished(memory, *sqlite, submitted - flags.active, submitted,
                       flags.jobs - submitted);
}

// CPU seconds (user + system, all threads) that process `pid` has used, from /proc: a figure
// that other load on the machine does not inflate the way it does wall time.
double CpuSeconds(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the ")" that closes the command name: state is field 3, utime 14, stime 15.
  std::istringstream fields(text.substr(text.rfind(')') + 2));
  std::vector<std::string> values((std::istream_iterator<std::string>(fields)),
                                  std::istream_iterator<std::string>());
  if (values.size() < 13) {
    return 0;
  }
  const double ticks = std::stod(values[11]) + std::stod(values[12]);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

struct Restart {
  double wall_seconds = 0;
  double cpu_seconds = 0;
};

// From the spawn of `gpufleet server` to the first 200 of /readyz: wall and server CPU seconds.
Result<Restart> TimeToReady(const Flags& flags) {
  const SystemClock clock;
  const MonoTime start = clock.Now();
  GPUFLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<api_testing::ServerProcess> server,
      api_testing::ServerProcess::Start(flags.gpufleet,
                                        {"--data-dir", flags.dir, "--listen", "127.0.0.1:0"},
                                        std::chrono::seconds(120)));
  httplib::Client client("127.0.0.1", server->port());
  client.set_read_timeout(std::chrono::seconds(60));
  while (true) {
    httplib::Result answer = client.Get("/readyz");
    if (answer && answer->status == 200) {
      break;
    }
    if (clock.Now() - start > std::chrono::seconds(120)) {
      return UnavailableError("not ready within 120 s: " + server->output());
    }
    // Polling, not measuring: a short pause keeps this process off the server's CPUs.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  Restart restart;
  restart.wall_seconds = std::chrono::duration<double>(clock.Now() - start).count();
  restart.cpu_seconds = CpuSeconds(server->pid());
  server->KillAndWait(SIGTERM);
  return restart;
}

int Run(const Flags& flags) {
  const std::string db_path = (std::filesystem::path(flags.dir) / "gpufleet.db").string();
  if (flags.refill || !std::filesystem::exists(db_path)) {
    std::error_code error;
    std::filesystem::remove_all(flags.dir, error);
    std::filesystem::create_directories(flags.dir);
    const SystemClock clock;
    const MonoTime start = clock.Now();
    if (Status status = Fill(flags, db_path); !status.ok()) {
      fmt::print(stderr, "restart_bench: filling {}: {}\n", flags.dir, status.ToString());
      return 1;
    }
    fmt::print("fill took {:.1f} s; {} is {:.0f} MiB\n",
               std::chrono::duration<double>(clock.Now() - start).count(), db_path,
               static_cast<double>(std::filesystem::file_size(db_path)) / (1 << 20));
  }
  std::vector<double> wall;
  std::vector<double> cpu;
  for (int run = 0; run < flags.runs; ++run) {
    Result<Restart> ready = TimeToReady(flags);
    if (!ready.ok()) {
      fmt::print(stderr, "restart_bench: run {}: {}\n", run, ready.status().ToString());
      return 1;
    }
    fmt::print("run {}: ready after {:.3f} s (server CPU {:.2f} s)\n", run, ready->wall_seconds,
               ready->cpu_seconds);
    wall.push_back(ready->wall_seconds);
    cpu.push_back(ready->cpu_seconds);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  fmt::print(
      "restart with {} jobs: /readyz 200 after min {:.3f} s, median {:.3f} s, max {:.3f} s; "
      "server CPU to ready median {:.2f} s ({} runs; target <= 3 s)\n",
      flags.jobs, wall.front(), wall[wall.size() / 2], wall.back(), cpu[cpu.size() / 2],
      wall.size());
  return 0;
}

}  // namespace
}  // namespace gpufleet

int main(int argc, char** argv) {
  gpufleet::Flags flags;
  CLI::App app{"restart benchmark of gpufleet server", "restart_bench"};
  app.add_option("--gpufleet", flags.gpufleet, "the gpufleet binary")->capture_default_str();
  app.add_option("--dir", flags.dir, "data directory (filled unless it holds gpufleet.db)")
      ->required();
  app.add_option("--jobs", flags.jobs, "jobs in the store")->capture_default_str();
  app.add_option("--active", flags.active, "jobs left Pending or Scheduled; the rest Cancelled")
      ->capture_default_str();
  app.add_option("--runs", flags.runs, "restarts to time")->capture_default_str();
  app.add_flag("--refill", flags.refill, "fill the directory again even if it holds a store");
  CLI11_PARSE(app, argc, argv);
  if (flags.active > flags.jobs || flags.runs < 1) {
    fmt::print(stderr, "restart_bench: --active must be <= --jobs and --runs >= 1\n");
    return 1;
  }
  return gpufleet::Run(flags);
}
