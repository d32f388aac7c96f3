// SPDX-License-Identifier: Apache-2.0
// `gpufleet dev`: a whole simulated fleet on one machine. The real server (SQLite store, REST
// API, scheduling loop) with simulated agents (probe, runner, telemetry, heartbeats over HTTP),
// one dcgm-exporter-style /metrics for the fleet, and a time-compressed sample of the bundled
// openb trace submitted through the API, so that there is something to watch.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/simulated_node.h"
#include "gpufleet/api/event_time_store.h"
#include "gpufleet/api/server.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/http/client.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/runner/simulated_runner.h"
#include "gpufleet/sim/openb.h"
#include "gpufleet/sim/trace_loaders.h"
#include "gpufleet/store/directory_lock.h"
#include "gpufleet/store/sqlite_store.h"
#include "gpufleet/wire/job_spec.h"

#include "flags.h"
#include "subcommands.h"

namespace gpufleet::app {
namespace {

struct DevFlags {
  std::string data_dir;  // empty: a new temporary directory
  std::string prices;    // a price table per GPU model; empty: no cost on the Usage page
  std::string listen = "127.0.0.1:8080";
  std::string metrics_listen = "127.0.0.1:9400";
  int nodes = 32;
  // Nodes with MIG on every GPU, spread over the leaves (racks); -1: one per leaf when the GPU
  // model has MIG and leaves have 2 nodes or more, none otherwise.
  int mig_nodes = -1;
  int faulty_gpus = 1;  // bad GPUs that fail the jobs they run (agent::FaultyGpu)
  int gpus_per_node = 8;
  std::string gpu_model = "H100-80GB";
  int leaves = 4;
  int spines = 2;
  std::string trace_dir = GPUFLEET_DEFAULT_DATA_DIR;
  double playback_minutes = 10;
  double target_load = 0.75;
  std::string policy = "gpufleet";  // as `gpufleet server`
  int64_t heartbeat_ms = 2000;
  int64_t run_seconds = 0;  // 0: until SIGINT or SIGTERM
  bool quiet = false;
  bool no_trace = false;
};

constexpr std::chrono::milliseconds kTick{250};

int FailDev(const Status& status) {
  fmt::print(stderr, "gpufleet dev: {}\n", status.ToString());
  return 1;
}

// The layouts a MIG node's GPUs start with: GPU 0 cut into as many of the model's smallest
// profile as fit, ready for small inference replicas (examples/inference.yaml spreads four over
// the racks: a replica per rack needs a free instance on a node of each, which the server's
// repartitioning, one GPU per request, does not plan for), and the others one instance of its
// largest profile, the whole GPU, so that a job asking for any other profile fits no current
// layout and the server repartitions.
struct MigLayoutChoice {
  std::string whole;     // e.g. "7g.80gb"
  std::string smallest;  // e.g. "1g.10gb"
  int smallest_count = 0;
};

// kInvalidArgument naming the flag for a model without MIG.
Result<MigLayoutChoice> ChooseMigLayout(const DevFlags& flags, const GpuCatalog& catalog) {
  GPUFLEET_ASSIGN_OR_RETURN(const GpuModelInfo* model, catalog.Find(flags.gpu_model));
  const auto size = [](const MigProfile& profile) {
    return std::make_pair(profile.compute_slices, profile.memory_mib);
  };
  const MigProfile* largest = nullptr;
  const MigProfile* smallest = nullptr;
  for (const MigProfile& profile : model->mig_profiles) {
    if (profile.media_extensions) {
      continue;
    }
    if (largest == nullptr || size(profile) > size(*largest)) {
      largest = &profile;
    }
    if (smallest == nullptr || size(profile) < size(*smallest)) {
      smallest = &profile;
    }
  }
  if (largest == nullptr) {
    return InvalidArgumentError(fmt::format("--simulated-mig-nodes {}: --gpu-model {} has no MIG",
                                            flags.mig_nodes, model->name));
  }
  return MigLayoutChoice{largest->name, smallest->name, smallest->max_instances};
}

// Which nodes have MIG: the k-th MIG node is the (k / leaves)-th node of leaf k % leaves, so that
// they spread over the racks (examples/inference.yaml spreads its replicas over racks).
std::vector<bool> MigNodes(int mig_nodes, int nodes, int leaves) {
  std::vector<bool> mig(static_cast<size_t>(nodes), false);
  const int per_leaf = nodes / leaves;
  for (int k = 0; k < mig_nodes; ++k) {
    mig[static_cast<size_t>((k % leaves) * per_leaf + k / leaves)] = true;
  }
  return mig;
}

// The nodes of the bad GPUs: the first nodes without MIG, one GPU each (the middle one), where
// the placement policy packs work first, so that they fail jobs from the first seconds on. Empty
// when there are fewer such nodes than `faulty_gpus`.
std::vector<int> FaultyGpuNodes(int faulty_gpus, const std::vector<bool>& mig) {
  std::vector<int> out;
  for (int i = 0; i < static_cast<int>(mig.size()) && static_cast<int>(out.size()) < faulty_gpus;
       ++i) {
    if (!mig[static_cast<size_t>(i)]) {
      out.push_back(i);
    }
  }
  return static_cast<int>(out.size()) == faulty_gpus ? out : std::vector<int>();
}

// The teams and queues that examples/*.yaml name, so that every example submits on the demo:
// research (half the fleet's GPUs) over research/nlp (3/8) and research/cv (the rest of
// research's), prod over prod/serving (a quarter), interactive (a sixteenth). Guarantees are of
// any model and add up within each parent and within the fleet. A data directory from an earlier
// run has them already: those are kept as they are.
Status CreateExampleQueues(http::ApiClient& admin, int64_t fleet_gpus) {
  const int64_t research = fleet_gpus / 2;
  const int64_t nlp = fleet_gpus * 3 / 8;
  const int64_t prod = fleet_gpus / 4;
  std::vector<std::pair<std::string, std::string>> calls;
  for (const char* team : {"nlp", "cv", "serving"}) {
    calls.emplace_back("/v1/teams", nlohmann::json{{"name", team}}.dump());
  }
  const auto queue = [&](const std::string& name, int64_t gpus, const std::string& team) {
    nlohmann::json body = {{"name", name}, {"guarantee", {{"*", gpus}}}};
    if (!team.empty()) {
      body["team"] = team;
    }
    calls.emplace_back("/v1/queues", body.dump());
  };
  queue("research", research, "");
  queue("research/nlp", nlp, "nlp");
  queue("research/cv", research - nlp, "cv");
  queue("prod", prod, "");
  queue("prod/serving", prod, "serving");
  queue("interactive", fleet_gpus / 16, "");
  for (const auto& [path, body] : calls) {
    if (Result<nlohmann::json> made = admin.Post(path, body, "application/json");
        !made.ok() && made.status().code() != StatusCode::kAlreadyExists) {
      return Status(made.status().code(),
                    fmt::format("creating the examples' queues: POST {} {}: {}", path, body,
                                made.status().message()));
    }
  }
  return Status::Ok();
}

// The trace sample to play: every k-th GPU pod of the openb default list, k chosen so that the
// sample asks about as much of the dev fleet as the whole trace asks of the openb cluster. Most
// openb pods arrive in the trace's last 20%, so the playback window starts at the sample's 10th
// percentile of submit times: pods still running then are submitted at once (with the time they
// had left), earlier ones that had ended are skipped, and the window is compressed into
// `playback_minutes`. The sample alone would keep only a few GPUs busy (openb's pods are short
// next to the gaps between them), so durations are stretched by `duration_scale`, chosen so that
// the sample asks for `target_load` of the fleet's GPUs on average: a denser trace, the same mix.
struct Playback {
  std::vector<sim::TraceJob> jobs;  // submit_seconds relative to the window's start
  double speedup = 1;
  double duration_scale = 1;
};

Result<Playback> LoadPlayback(const DevFlags& flags, int fleet_gpus) {
  GpuCatalog trace_catalog = GpuCatalog::Default();
  GPUFLEET_ASSIGN_OR_RETURN(
      const Cluster openb,
      sim::LoadOpenbNodes(flags.trace_dir + "/openb/openb_node_list_gpu_node.csv", trace_catalog));
  GPUFLEET_ASSIGN_OR_RETURN(sim::Trace trace,
                            sim::LoadTrace(flags.trace_dir + "/openb/openb_pod_list_default.csv",
                                           "openb", trace_catalog));
  int64_t trace_gpus = 0;
  for (const Node& node : openb.nodes) {
    trace_gpus += static_cast<int64_t>(node.gpus.size());
  }
  const size_t every =
      static_cast<size_t>(std::max<int64_t>(1, trace_gpus / std::max(1, fleet_gpus)));
  std::vector<sim::TraceJob> sample;
  for (size_t i = 0; i < trace.jobs.size(); i += every) {
    if (trace.jobs[i].job.RequestedGpuMilliTotal() > 0) {  // CPU-only pods show nothing on GPUs
      sample.push_back(std::move(trace.jobs[i]));
    }
  }
  if (sample.empty()) {
    return InvalidArgumentError("the openb trace sample has no GPU pods");
  }
  const int64_t window_start = sample[sample.size() / 10].submit_seconds;
  const int64_t window_end = sample.back().submit_seconds;
  const double window = static_cast<double>(std::max<int64_t>(1, window_end - window_start));
  Playback playback;
  playback.speedup = std::max(1.0, window / (flags.playback_minutes * 60));
  double gpu_seconds = 0;  // within the window
  for (sim::TraceJob& job : sample) {
    const int64_t end = job.submit_seconds + job.duration_seconds;
    if (end <= window_start) {
      continue;
    }
    if (job.submit_seconds < window_start) {
      job.duration_seconds = end - window_start;
      job.submit_seconds = window_start;
    }
    job.submit_seconds -= window_start;
    gpu_seconds += static_cast<double>(job.job.RequestedGpuMilliTotal()) / 1000 *
                   static_cast<double>(std::min(end, window_end) - window_start -
                                       std::min(job.submit_seconds, window_end - window_start));
    playback.jobs.push_back(std::move(job));
  }
  const double offered_gpus = gpu_seconds / window;
  playback.duration_scale =
      offered_gpus <= 0 ? 1 : std::clamp(flags.target_load * fleet_gpus / offered_gpus, 1.0, 1e4);
  return playback;
}

// How long the simulated runner runs a trace pod, in wall milliseconds.
int64_t PlaybackDurationMs(const sim::TraceJob& job, const Playback& playback) {
  return std::max<int64_t>(1000, std::llround(static_cast<double>(job.duration_seconds) * 1000 *
                                              playback.duration_scale / playback.speedup));
}

// The job spec the submitter sends for one trace pod: the pod's resources on any GPU model,
// with a command (what a real agent would run) and the simulated runner's duration. Its
// runtimeEstimate is that duration, as played (the trace's own estimate is in trace seconds,
// scaled neither by `duration_scale` nor by `speedup`), so that explain's ETAs hold on the demo.
std::string PlaybackSpec(sim::TraceJob job, const Playback& playback) {
  const int64_t duration_ms = PlaybackDurationMs(job, playback);
  job.job.allowed_gpu_models.clear();
  job.job.runtime_estimate = std::chrono::seconds((duration_ms + 999) / 1000);
  for (TaskGroup& group : job.job.groups) {
    group.command = {"sleep", fmt::format("{}", job.duration_seconds)};
    group.env[std::string(runner::kSimDurationEnv)] = fmt::format("{}", duration_ms);
  }
  return wire::JobSpecToYaml(job.job);
}

// A one-line view of the fleet, from the store.
std::string StatusLine(store::StateStore& store,
                       std::vector<std::unique_ptr<agent::SimulatedNode>>& fleet, int submitted,
                       size_t total, std::chrono::seconds elapsed) {
  std::map<std::string, int> states;
  int64_t allocated_milli = 0;
  if (Result<std::vector<store::StoredObject>> jobs = store.List(control::kJobsKind); jobs.ok()) {
    for (const store::StoredObject& object : *jobs) {
      const nlohmann::json job = wire::ParseDocument(object.data);
      const std::string state = wire::StrOr(job, "state");
      ++states[state];
      for (const nlohmann::json& placement : wire::ArrayOr(job, "placements")) {
        for (const nlohmann::json& assignment : wire::ArrayOr(placement, "assignments")) {
          allocated_milli += wire::IntOr(assignment, "milli", 0);
        }
      }
    }
  }
  int ready = 0;
  if (Result<std::vector<store::StoredObject>> nodes = store.List(control::kNodesKind);
      nodes.ok()) {
    for (const store::StoredObject& object : *nodes) {
      ready += wire::StrOr(wire::ParseDocument(object.data), "state") == "Ready" ? 1 : 0;
    }
  }
  int64_t util_sum = 0;
  int gpus = 0;
  for (const auto& node : fleet) {
    for (const agent::GpuTelemetry& gpu : node->sampler().LatestSnapshot()->gpus) {
      util_sum += gpu.reading.sample.gpu_util_percent.value_or(0);
      ++gpus;
    }
  }
  return fmt::format(
      "[{:02}:{:02}] nodes {}/{} Ready | jobs {} submitted (a sample of {}, repeated): {} pending, "
      "{} scheduled, {} "
      "running, {} succeeded, {} failed | GPUs {:.1f}/{} allocated, mean utilization {}%",
      elapsed.count() / 60, elapsed.count() % 60, ready, fleet.size(), submitted, total,
      states["Pending"], states["Scheduled"], states["Running"], states["Succeeded"],
      states["Failed"], static_cast<double>(allocated_milli) / 1000, gpus,
      gpus == 0 ? 0 : util_sum / gpus);
}

int RunDev(DevFlags flags) {
  Result<std::pair<std::string, int>> listen = ParseHostPort(flags.listen, "--listen");
  if (!listen.ok()) {
    return FailDev(listen.status());
  }
  Result<std::pair<std::string, int>> metrics_listen =
      ParseHostPort(flags.metrics_listen, "--metrics-listen");
  if (!metrics_listen.ok()) {
    return FailDev(metrics_listen.status());
  }
  if (flags.nodes % flags.leaves != 0) {
    return FailDev(InvalidArgumentError(
        fmt::format("--nodes {} is not a multiple of --leaves {}", flags.nodes, flags.leaves)));
  }
  const GpuCatalog catalog = GpuCatalog::Default();
  if (!catalog.Contains(flags.gpu_model)) {
    return FailDev(InvalidArgumentError(
        fmt::format("--gpu-model: \"{}\" is not in the GPU catalog", flags.gpu_model)));
  }
  if (flags.mig_nodes == -1) {
    // One per leaf, where leaves have other nodes for the trace.
    flags.mig_nodes =
        ChooseMigLayout(flags, catalog).ok() && flags.nodes / flags.leaves >= 2 ? flags.leaves : 0;
  }
  if (flags.mig_nodes < 0 || flags.mig_nodes > flags.nodes) {
    return FailDev(InvalidArgumentError(fmt::format(
        "--simulated-mig-nodes {} is outside [0, --nodes {}]", flags.mig_nodes, flags.nodes)));
  }
  MigLayoutChoice mig_layout;
  if (flags.mig_nodes > 0) {
    Result<MigLayoutChoice> choice = ChooseMigLayout(flags, catalog);
    if (!choice.ok()) {
      return FailDev(choice.status());
    }
    mig_layout = *choice;
  }
  const std::vector<bool> mig_nodes = MigNodes(flags.mig_nodes, flags.nodes, flags.leaves);
  const std::vector<int> faulty_nodes = FaultyGpuNodes(flags.faulty_gpus, mig_nodes);
  if (static_cast<int>(faulty_nodes.size()) != flags.faulty_gpus) {
    return FailDev(InvalidArgumentError(
        fmt::format("--simulated-faulty-gpus {}: there are {} nodes without MIG to hold them",
                    flags.faulty_gpus, flags.nodes - flags.mig_nodes)));
  }
  // The trace's pods ask for whole GPUs and shares, which MIG-enabled GPUs do not take: its load
  // is measured against the other GPUs.
  const int trace_gpus = (flags.nodes - flags.mig_nodes) * flags.gpus_per_node;
  Result<Playback> playback =
      flags.no_trace ? Result<Playback>(Playback{}) : LoadPlayback(flags, trace_gpus);
  if (!playback.ok()) {
    return FailDev(playback.status());
  }
  if (flags.data_dir.empty()) {
    std::string pattern = (std::filesystem::temp_directory_path() / "gpufleet-dev-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      return FailDev(UnavailableError("cannot create a temporary data directory"));
    }
    flags.data_dir = pattern;
  }
  std::error_code error;
  std::filesystem::create_directories(flags.data_dir, error);
  Result<store::DirectoryLock> lock = store::DirectoryLock::Acquire(flags.data_dir);
  if (!lock.ok()) {
    return FailDev(lock.status());
  }
  const std::string db_path = (std::filesystem::path(flags.data_dir) / "gpufleet.db").string();
  Result<std::unique_ptr<store::SqliteStateStore>> store = store::SqliteStateStore::Open(db_path);
  if (!store.ok()) {
    return FailDev(store.status());
  }
  const Result<std::optional<wire::PriceTable>> prices = LoadPricesFlag(flags.prices);
  if (!prices.ok()) {
    return FailDev(prices.status());
  }
  SystemClock clock;
  api::EventTimeStore timed_store(**store, clock);  // each event with its time
  // One thread heartbeats every node in turn, so a loaded machine can hold a node's heartbeat
  // back for seconds, and an agent fences its tasks half a lease after its last one: at 4
  // heartbeats (8 s) a quarter of the demo's running tasks were killed so. The nodes live in this
  // process, so a long lease hides no dead node.
  const auto node_timeout = std::max<std::chrono::milliseconds>(
      std::chrono::milliseconds(flags.heartbeat_ms * 4), std::chrono::seconds(60));
  // The attribution runs every 30 s rather than 5 minutes: the bad GPU is flagged, diagnosed and
  // quarantined within the first minutes.
  control::ReliabilityOptions reliability;
  reliability.interval = std::chrono::seconds(30);
  Result<std::unique_ptr<api::ApiServer>> server =
      api::ApiServer::Create({.store = timed_store,
                              .catalog = catalog,
                              .clock = clock,
                              .wall_clock = &clock,
                              .policy = flags.policy,
                              .cycle_interval = std::chrono::milliseconds(500),
                              .heartbeat_interval = std::chrono::milliseconds(flags.heartbeat_ms),
                              .node_timeout = node_timeout,
                              .reliability = reliability,
                              // The load keeper finishes several jobs a second: keep the
                              // last 5 minutes' (a few thousand), not hours' worth.
                              .retain_finished = std::chrono::minutes(5),
                              // The dashboard's charts fill in seconds, not minutes.
                              .history_interval = std::chrono::seconds(5),
                              .usage_prices = *prices});
  if (!server.ok()) {
    return FailDev(server.status());
  }
  Result<std::optional<std::string>> admin = (*server)->authenticator().Bootstrap(std::nullopt);
  if (!admin.ok()) {
    return FailDev(admin.status());
  }
  if (!admin->has_value()) {
    // A data directory from an earlier run: its admin token was shown then; make one for now.
    Result<std::string> token =
        (*server)->authenticator().CreateToken(control::Role::kAdmin, "", "gpufleet-dev");
    if (!token.ok()) {
      return FailDev(token.status());
    }
    *admin = *token;
  }
  Result<std::string> agent_token =
      (*server)->authenticator().CreateToken(control::Role::kAgent, "", "gpufleet-dev-agents");
  if (!agent_token.ok()) {
    return FailDev(agent_token.status());
  }

  BlockStopSignals();
  Result<int> port = (*server)->Start(listen->first, listen->second);
  if (!port.ok()) {
    return FailDev(port.status());
  }
  const std::string address = fmt::format("http://{}:{}", listen->first, *port);
  http::ApiClient agent_client(address, *agent_token);
  http::ApiClient admin_client(address, **admin);

  if (const Status made = CreateExampleQueues(
          admin_client, static_cast<int64_t>(flags.nodes) * flags.gpus_per_node);
      !made.ok()) {
    (*server)->Stop();
    return FailDev(made);
  }

  // The fleet: leaf l holds nodes l*per_leaf .. ; every leaf is cabled to every spine (a
  // 2-tier Clos), so the leaf is the scheduler's one topology level.
  std::vector<std::unique_ptr<agent::SimulatedNode>> fleet;
  const int per_leaf = flags.nodes / flags.leaves;
  std::vector<std::string> mig_names;
  std::vector<std::string> faulty_names;
  for (int i = 0; i < flags.nodes; ++i) {
    agent::SimulatedNode::Options options;
    options.agent.node_name = fmt::format("dev-node-{:03}", i);
    options.agent.topology_levels = {"leaf"};
    options.agent.topology_values = {fmt::format("leaf-{}", i / per_leaf)};
    options.agent.fault_domains = {{"rack", fmt::format("rack-{}", i / per_leaf)}};
    // Even leaves in zone east, odd ones in west (examples/notebook.yaml selects zone=east).
    options.agent.labels = {{"zone", (i / per_leaf) % 2 == 0 ? "east" : "west"}};
    options.agent.capacity = {192000, 2048 * 1024};
    options.agent.stop_grace = std::chrono::seconds(5);
    // The simulated tasks write their lines here and `gpufleet logs` shows them; shipped every
    // 2 s rather than 30 s, since the demo's tasks run for seconds.
    options.agent.log_dir =
        (std::filesystem::path(flags.data_dir) / "logs" / options.agent.node_name).string();
    options.agent.log_ship_interval = std::chrono::seconds(2);
    std::filesystem::create_directories(options.agent.log_dir, error);
    if (error) {
      return FailDev(UnavailableError(fmt::format("cannot create the task log directory {}: {}",
                                                  options.agent.log_dir, error.message())));
    }
    options.gpu_model = flags.gpu_model;
    options.gpu_count = flags.gpus_per_node;
    options.seed = static_cast<uint64_t>(i + 1);
    for (int gpu = 0; mig_nodes[static_cast<size_t>(i)] && gpu < flags.gpus_per_node; ++gpu) {
      options.mig_profiles[gpu] =
          gpu == 0 ? std::vector<std::string>(static_cast<size_t>(mig_layout.smallest_count),
                                              mig_layout.smallest)
                   : std::vector<std::string>{mig_layout.whole};
    }
    if (mig_nodes[static_cast<size_t>(i)]) {
      mig_names.push_back(options.agent.node_name);
    }
    if (std::find(faulty_nodes.begin(), faulty_nodes.end(), i) != faulty_nodes.end()) {
      // Reset once its XID has surely reached the server: a sample and a heartbeat later.
      options.faulty_gpu = agent::FaultyGpu{
          .index = flags.gpus_per_node / 2,
          .recover_after = std::max<std::chrono::milliseconds>(
              std::chrono::seconds(5), std::chrono::milliseconds(3 * flags.heartbeat_ms))};
      faulty_names.push_back(
          fmt::format("{} GPU {}", options.agent.node_name, options.faulty_gpu->index));
    }
    Result<std::unique_ptr<agent::SimulatedNode>> node =
        agent::SimulatedNode::Create(options, clock, catalog, agent_client);
    if (!node.ok()) {
      return FailDev(node.status());
    }
    fleet.push_back(std::move(node).value());
  }

  // One /metrics for the whole fleet, as if Prometheus scraped every node's dcgm-exporter.
  // TelemetrySampler is thread-safe: sampled on this thread, rendered on the HTTP threads.
  httplib::Server metrics_http;
  metrics_http.set_tcp_nodelay(true);
  metrics_http.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    std::vector<std::string> texts;
    for (const auto& node : fleet) {
      texts.push_back(node->sampler().RenderMetrics());
    }
    res.set_content(agent::MergeMetricTexts(texts), "text/plain; version=0.0.4");
  });
  const int metrics_port =
      metrics_listen->second == 0
          ? metrics_http.bind_to_any_port(metrics_listen->first)
          : (metrics_http.bind_to_port(metrics_listen->first, metrics_listen->second)
                 ? metrics_listen->second
                 : -1);
  if (metrics_port < 0) {
    (*server)->Stop();
    return FailDev(
        UnavailableError(fmt::format("--metrics-listen: cannot bind {}", flags.metrics_listen)));
  }
  std::thread metrics_thread([&] { metrics_http.listen_after_bind(); });

  // The dashboard first: what a newcomer opens. The link carries the admin token after `#`,
  // which the browser never sends; the page keeps it in the tab's sessionStorage.
  fmt::print(
      "gpufleet dev: open the dashboard: {}/#token={}\n"
      "gpufleet dev: {} simulated nodes x {} {} ({} leaves of {} nodes under {} spines), "
      "policy {}\n"
      "  API       {}   (GPUFLEET_ADDR)\n"
      "  admin     {}   (GPUFLEET_TOKEN)\n"
      "  metrics   http://{}:{}/metrics (dcgm-exporter format, every node), server metrics "
      "{}/metrics\n"
      "  store     {}\n"
      "  trace     {} openb pods in {} min ({:.0f}x faster than real time, durations x{:.0f}), "
      "played ahead to keep {:.0f}% of the GPUs without MIG asked for\n"
      "{}"
      "{}"
      "try: GPUFLEET_ADDR={} GPUFLEET_TOKEN={} gpufleet get jobs\n",
      address, **admin, flags.nodes, flags.gpus_per_node, flags.gpu_model, flags.leaves, per_leaf,
      flags.spines, flags.policy, address, **admin, metrics_listen->first, metrics_port, address,
      db_path, playback->jobs.size(), flags.playback_minutes, playback->speedup,
      playback->duration_scale, flags.target_load * 100,
      mig_names.empty()
          ? ""
          : fmt::format("  MIG       {}: every GPU MIG-enabled, GPU 0 as {} {}, the others one {} "
                        "each (a job asking another profile makes the server repartition one)\n",
                        fmt::join(mig_names, ", "), mig_layout.smallest_count, mig_layout.smallest,
                        mig_layout.whole),
      faulty_names.empty()
          ? ""
          : fmt::format("  faults    {}: a bad GPU, XID {} under every job it runs (`gpufleet "
                        "report failures` finds it)\n",
                        fmt::join(faulty_names, ", "), agent::FaultyGpu{}.xid),
      address, **admin);
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  auto last_sample = start - std::chrono::hours(1);
  auto last_heartbeat = last_sample;
  auto last_status = last_sample;
  size_t next_job = 0;
  int submitted = 0;
  // The load keeper: the trace sample plays in its own time, and whenever the jobs submitted
  // and not yet ended (by their simulated durations; pending ones count too) ask for less than
  // --target-load of the fleet's GPUs, the playback skips ahead to the next job, a bounded batch
  // per tick. So the fleet is busy within seconds of the start and stays so: the sample alone
  // stays far below its target (most pods are short next to the few long ones). When the sample
  // is played out it starts over, its pods renamed openb-pod-NNNN-r1, -r2, ...
  constexpr int kTopUpJobsPerTick = 12;
  const int64_t target_milli = std::llround(flags.target_load * trace_gpus * 1000);
  std::multimap<std::chrono::steady_clock::time_point, int64_t> running_until;  // end -> milli
  int64_t offered_milli = 0;
  double trace_skip = 0;  // trace seconds skipped to keep the load
  int round = 0;
  double round_offset = 0;  // trace seconds of the rounds played before this one
  const double round_seconds =
      playback->jobs.empty() ? 0 : static_cast<double>(playback->jobs.back().submit_seconds) + 1;
  std::vector<bool> registered(fleet.size(), false);
  while (true) {
    if (const std::optional<int> signal = WaitForStopSignal(kTick)) {
      fmt::print("\ngpufleet dev: signal {}, stopping\n", *signal);
      break;
    }
    const auto now = std::chrono::steady_clock::now();
    const auto elapsed = std::chrono::duration_cast<std::chrono::seconds>(now - start);
    if (flags.run_seconds > 0 && elapsed.count() >= flags.run_seconds) {
      break;
    }
    if (now - last_sample >= std::chrono::seconds(1)) {
      last_sample = now;
      for (const auto& node : fleet) {
        Status status = node->UpdateLoads();
        if (status.ok()) {
          status = node->sampler().SampleOnce();
        }
        if (!status.ok()) {
          fmt::print(stderr, "\ngpufleet dev: telemetry: {}\n", status.ToString());
        }
      }
    }
    if (now - last_heartbeat >= std::chrono::milliseconds(flags.heartbeat_ms)) {
      last_heartbeat = now;
      for (size_t i = 0; i < fleet.size(); ++i) {
        agent::NodeAgent& node = fleet[i]->agent();
        const Status status = registered[i] ? node.Heartbeat() : node.Register();
        // 503 while the server's first cycle has not run: the next tick retries.
        if (!status.ok() && status.code() != StatusCode::kUnavailable) {
          fmt::print(stderr, "\ngpufleet dev: agent: {}\n", status.ToString());
        }
        registered[i] = registered[i] || status.ok();
      }
    }
    while (!running_until.empty() && running_until.begin()->first <= now) {
      offered_milli -= running_until.begin()->second;
      running_until.erase(running_until.begin());
    }
    double trace_now =
        std::chrono::duration<double>(now - start).count() * playback->speedup + trace_skip;
    int top_up = 0;
    while (registered.back() && !playback->jobs.empty()) {
      if (next_job == playback->jobs.size()) {
        next_job = 0;
        ++round;
        round_offset += round_seconds;
      }
      const double due =
          round_offset + static_cast<double>(playback->jobs[next_job].submit_seconds);
      if (due > trace_now) {
        if (offered_milli >= target_milli || top_up >= kTopUpJobsPerTick) {
          break;
        }
        ++top_up;
        trace_skip += due - trace_now;
        trace_now = due;
      }
      sim::TraceJob job = playback->jobs[next_job++];
      if (round > 0) {
        job.job.id = JobId(fmt::format("{}-r{}", job.job.id.value(), round));
      }
      Result<nlohmann::json> answer =
          admin_client.Post("/v1/jobs", PlaybackSpec(job, *playback), "application/yaml");
      if (answer.ok()) {
        ++submitted;
        const int64_t milli = job.job.RequestedGpuMilliTotal();
        offered_milli += milli;
        running_until.emplace(now + std::chrono::milliseconds(PlaybackDurationMs(job, *playback)),
                              milli);
      } else if (answer.status().code() != StatusCode::kAlreadyExists) {
        fmt::print(stderr, "\ngpufleet dev: submit {}: {}\n", job.job.id.value(),
                   answer.status().ToString());
      }
    }
    if (!flags.quiet && now - last_status >= std::chrono::seconds(1)) {
      last_status = now;
      fmt::print("\r{}", StatusLine(**store, fleet, submitted, playback->jobs.size(), elapsed));
      std::fflush(stdout);
    }
  }
  fmt::print("\n{}\n", StatusLine(**store, fleet, submitted, playback->jobs.size(),
                                  std::chrono::duration_cast<std::chrono::seconds>(
                                      std::chrono::steady_clock::now() - start)));
  metrics_http.stop();
  metrics_thread.join();
  (*server)->Stop();
  fmt::print("gpufleet dev: state kept in {}\n", flags.data_dir);
  return 0;
}

}  // namespace

Action AddDevCommand(CLI::App& app) {
  auto flags = std::make_shared<DevFlags>();
  CLI::App* dev = app.add_subcommand(
      "dev", "a simulated fleet on this machine: server, agents, metrics and a trace to watch");
  dev->add_option("--data-dir", flags->data_dir, "store directory (default: a new temporary one)");
  dev->add_option("--prices", flags->prices,
                  "a price per GPU-hour of each GPU model (as `server --prices`): the Usage page "
                  "shows the cost");
  dev->add_option("--listen", flags->listen, "API HOST:PORT (port 0: any free port)")
      ->capture_default_str();
  dev->add_option("--metrics-listen", flags->metrics_listen,
                  "fleet /metrics HOST:PORT (dcgm-exporter format)")
      ->capture_default_str();
  dev->add_option("--nodes", flags->nodes, "simulated nodes")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  dev->add_option(
      "--simulated-mig-nodes", flags->mig_nodes,
      "N nodes, spread over the leaves (racks), have MIG on every GPU: GPU 0 cut into the "
      "smallest profile (7 x 1g.10gb on H100-80GB), the others one whole-GPU instance (7g.80gb) "
      "that the server repartitions for MIG jobs (default: one per leaf when --gpu-model has "
      "MIG and a leaf has 2 nodes or more, else none)");
  dev->add_option("--simulated-faulty-gpus", flags->faulty_gpus,
                  "bad GPUs (one on each of the first nodes without MIG) that report an XID under "
                  "every job they run, for the failure attribution to find")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  dev->add_option("--gpus-per-node", flags->gpus_per_node, "GPUs per node")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  dev->add_option("--gpu-model", flags->gpu_model, "GPU model (catalog name)")
      ->capture_default_str();
  dev->add_option("--leaves", flags->leaves, "leaf switches (nodes are split evenly)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  dev->add_option("--spines", flags->spines, "spine switches above the leaves")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  dev->add_option("--trace-dir", flags->trace_dir, "directory of the bundled traces")
      ->capture_default_str();
  dev->add_option("--playback-minutes", flags->playback_minutes,
                  "minutes in which the trace sample plays")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 10000.0));
  dev->add_option("--target-load", flags->target_load,
                  "share of the GPUs the submitted, unfinished trace jobs ask for (the playback "
                  "runs ahead to keep it)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 10.0));
  dev->add_option("--policy", flags->policy, "placement policy")->capture_default_str();
  dev->add_option("--heartbeat-ms", flags->heartbeat_ms, "agent heartbeat interval")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{100}, int64_t{60000}));
  dev->add_option("--run-seconds", flags->run_seconds, "stop after this long (0: on Ctrl-C)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  dev->add_flag("--quiet", flags->quiet, "no live status line");
  dev->add_flag("--no-trace", flags->no_trace, "submit no trace jobs (an idle fleet)");
  return [flags] { return RunDev(*flags); };
}

}  // namespace gpufleet::app
