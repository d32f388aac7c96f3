// SPDX-License-Identifier: Apache-2.0
// NodeAgent against a real ApiServer (in-process transport), a simulated probe and the simulated
// runner on one fake clock.
#include "gpufleet/agent/node_agent.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gpufleet/agent/agent_loop.h"
#include "gpufleet/agent/link_health.h"
#include "gpufleet/agent/simulated_node.h"
#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/api/server.h"
#include "gpufleet/core/testing/status_matchers.h"
#include "gpufleet/os/files.h"
#include "gpufleet/runner/process_runner.h"
#include "gpufleet/runner/simulated_runner.h"
#include "gpufleet/scheduler/plugins/filters.h"
#include "gpufleet/store/memory_store.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::agent {
namespace {

using Json = nlohmann::json;
using ::gpufleet::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

// Calls the server's request handler directly, as an HTTP round trip would.
// Calls the server in process; while `cut` is set no request gets through (a partition). While
// `protocol` is set and not empty, the "protocol" of each agent request is that instead of the
// agent's own (an agent of another protocol version).
class InProcessTransport final : public http::Transport {
 public:
  InProcessTransport(api::ApiServer& server, const bool* cut = nullptr,
                     const std::string* protocol = nullptr)
      : server_(server), cut_(cut), protocol_(protocol) {}
  Result<http::HttpResponse> Send(std::string_view method, std::string_view path,
                                  std::string_view body, std::string_view /*content_type*/,
                                  std::string_view token) override {
    if (cut_ != nullptr && *cut_) {
      return UnavailableError("in-process: cut off from the server");
    }
    std::string sent(body);
    if (protocol_ != nullptr && !protocol_->empty() && path.starts_with("/v1/agents/")) {
      GPUFLEET_ASSIGN_OR_RETURN(Json j, wire::ParseJson(body));
      j["protocol"] = *protocol_;
      sent = j.dump();
    }
    api::ApiRequest request;
    request.method = std::string(method);
    request.path = std::string(path.substr(0, path.find('?')));
    if (const size_t mark = path.find('?'); mark != std::string_view::npos) {
      // "k=v&k=v", values without escapes (what these tests send).
      std::string_view rest = path.substr(mark + 1);
      while (!rest.empty()) {
        const std::string_view pair = rest.substr(0, rest.find('&'));
        const size_t eq = pair.find('=');
        request.query.emplace(std::string(pair.substr(0, eq)),
                              eq == std::string_view::npos ? "" : std::string(pair.substr(eq + 1)));
        rest.remove_prefix(std::min(rest.size(), pair.size() + 1));
      }
    }
    request.authorization = token.empty() ? "" : fmt::format("Bearer {}", token);
    request.body = std::move(sent);
    const api::ApiResponse response = server_.Handle(request);
    return http::HttpResponse{response.status, response.body, response.content_type};
  }

 private:
  api::ApiServer& server_;
  const bool* cut_;
  const std::string* protocol_;
};

std::string JobYaml(const std::string& name, int gpus, int64_t duration_ms, int exit_code = 0) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  tasks:
    - name: main
      command: [python, train.py]
      env: {{GPUFLEET_SIM_DURATION_MS: "{}", GPUFLEET_SIM_EXIT_CODE: "{}"}}
      resources:
        gpus: {{count: {}}}
)",
                     name, duration_ms, exit_code, gpus);
}

std::string MigJobYaml(const std::string& name, const std::string& profile) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  tasks:
    - name: main
      command: [serve]
      env: {{GPUFLEET_SIM_DURATION_MS: "3600000"}}
      resources:
        gpus: {{migProfile: {}}}
)",
                     name, profile);
}

// Records every launch and hands it on to another runner.
class RecordingRunner final : public runner::TaskRunner {
 public:
  explicit RecordingRunner(runner::TaskRunner& inner) : inner_(inner) {}
  Status Start(const runner::TaskLaunch& launch) override {
    launches.push_back(launch);
    return inner_.Start(launch);
  }
  Status Stop(std::string_view task_id, Duration grace) override {
    return inner_.Stop(task_id, grace);
  }
  Status SendNotice(std::string_view task_id, std::string_view signal_name) override {
    return inner_.SendNotice(task_id, signal_name);
  }
  std::vector<runner::TaskStatus> Poll() override { return inner_.Poll(); }
  Status Forget(std::string_view task_id) override { return inner_.Forget(task_id); }
  Status RenewLease(Duration fence_in, Duration grace) override {
    return inner_.RenewLease(fence_in, grace);
  }
  std::string ContainerRuntime() const override {
    return container_runtime.value_or(inner_.ContainerRuntime());
  }
  Result<std::vector<CachedImage>> ListImages() override {
    ++image_lists;
    return images ? Result<std::vector<CachedImage>>(*images) : inner_.ListImages();
  }

  std::vector<runner::TaskLaunch> launches;
  std::optional<std::vector<CachedImage>> images;  // what ListImages answers; none: the inner's
  int image_lists = 0;
  std::optional<std::string> container_runtime;  // what ContainerRuntime answers; none: the inner's

 private:
  runner::TaskRunner& inner_;
};

class NodeAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Result<std::unique_ptr<api::ApiServer>> server = api::ApiServer::Create(
        {.store = store_, .catalog = catalog_, .clock = clock_, .policy = "best-fit"});
    ASSERT_OK(server);
    server_ = std::move(server).value();
    admin_ = *server_->authenticator().CreateToken(control::Role::kAdmin, "", "root");
    const std::string agent_token =
        *server_->authenticator().CreateToken(control::Role::kAgent, "", "agent");
    client_ = std::make_unique<http::ApiClient>(
        std::make_unique<InProcessTransport>(*server_, &partitioned_, &agent_protocol_),
        "in-process", agent_token);
    admin_client_ = std::make_unique<http::ApiClient>(
        std::make_unique<InProcessTransport>(*server_), "in-process", admin_);
    Result<std::unique_ptr<SimulatedProbe>> probe =
        SimulatedProbe::Create(clock_, catalog_, {.model = "H100-80GB", .gpu_count = 8});
    ASSERT_OK(probe);
    probe_ = std::move(probe).value();
    Result<std::unique_ptr<TelemetrySampler>> sampler = TelemetrySampler::Create(
        {.probe = *probe_, .clock = clock_, .hostname = "node-a", .job_labels = true});
    ASSERT_OK(sampler);
    sampler_ = std::move(sampler).value();
    ASSERT_OK(sampler_->SampleOnce());
    runner_ = std::make_unique<runner::SimulatedRunner>(clock_);
    agent_ = MakeAgent(*runner_);
    ASSERT_OK(server_->RunSchedulingCycle());
  }

  // `node_token`: the credential an earlier agent of the node was given (it keeps it on disk).
  std::unique_ptr<NodeAgent> MakeAgent(runner::TaskRunner& runner,
                                       const std::string& node_token = "",
                                       Duration stop_grace = std::chrono::seconds(5),
                                       MpsDaemonOptions mps = {}) {
    NodeAgentOptions options;
    options.mps = std::move(mps);
    options.node_token = node_token;
    options.node_name = "node-a";
    options.topology_levels = {"leaf"};
    options.topology_values = {"leaf-0"};
    options.capacity = {64000, 512 * 1024};
    options.log_dir = log_dir_;
    options.max_log_bytes = max_log_bytes_;
    options.checkpoint_dir = checkpoint_dir_;
    options.stop_grace = stop_grace;
    return std::make_unique<NodeAgent>(options, *sampler_, *probe_, runner, *client_, catalog_,
                                       clock_);
  }

  Json Job(const std::string& name) { return *admin_client_->Get("/v1/jobs/" + name); }
  Json Node(const std::string& name) { return *admin_client_->Get("/v1/nodes/" + name); }
  std::string Events(const std::string& kind, const std::string& name) {
    return admin_client_->Get(fmt::format("/v1/{}/{}/events", kind, name))->dump();
  }

  // A simulated node's options: its name, in leaf-1, 64 CPUs and 512 GiB.
  static SimulatedNode::Options SimNodeOptions(const std::string& name) {
    SimulatedNode::Options options;
    options.agent.node_name = name;
    options.agent.topology_levels = {"leaf"};
    options.agent.topology_values = {"leaf-1"};
    options.agent.capacity = {64000, 512 * 1024};
    return options;
  }

  // A simulated node of one H100 with MIG enabled and these instances, registered.
  std::unique_ptr<SimulatedNode> MigNode(const std::vector<std::string>& profiles) {
    SimulatedNode::Options options = SimNodeOptions("mig-0");
    options.gpu_count = 1;
    options.mig_profiles = {{0, profiles}};
    Result<std::unique_ptr<SimulatedNode>> node =
        SimulatedNode::Create(options, clock_, catalog_, *client_);
    EXPECT_OK(node);
    if (!node.ok()) {
      return nullptr;
    }
    EXPECT_OK((*node)->sampler().SampleOnce());
    EXPECT_OK((*node)->agent().Register());
    return std::move(node).value();
  }

  // One heartbeat of `node`, then its task loads (and MIG devices in use) as `gpufleet dev`
  // sets them.
  void Beat(SimulatedNode& node) {
    ASSERT_OK(node.agent().Heartbeat());
    ASSERT_OK(node.UpdateLoads());
  }

  void Submit(const std::string& yaml) {
    ASSERT_OK(admin_client_->Post("/v1/jobs", yaml, "application/yaml"));
    ASSERT_OK(server_->RunSchedulingCycle());
  }

  // The GPU UUIDs of the probe, by index.
  std::vector<std::string> GpuUuids() {
    std::vector<std::string> out;
    const Result<ProbeInventory> inventory = probe_->Inventory();
    EXPECT_OK(inventory);
    if (inventory.ok()) {
      for (const GpuStaticInfo& gpu : inventory->gpus) {
        out.push_back(gpu.uuid);
      }
    }
    return out;
  }
  const runner::TaskStatus* Task(const std::vector<runner::TaskStatus>& tasks,
                                 const std::string& id) {
    for (const runner::TaskStatus& task : tasks) {
      if (task.task_id == id) {
        return &task;
      }
    }
    return nullptr;
  }

  const GpuCatalog catalog_ = GpuCatalog::Default();
  FakeClock clock_;
  store::InMemoryStateStore store_;
  std::unique_ptr<api::ApiServer> server_;
  std::string admin_;
  bool partitioned_ = false;    // the agent's requests do not get through
  std::string agent_protocol_;  // not empty: the protocol version the agent's requests claim
  std::unique_ptr<http::ApiClient> client_;
  std::unique_ptr<http::ApiClient> admin_client_;
  std::unique_ptr<SimulatedProbe> probe_;
  std::unique_ptr<TelemetrySampler> sampler_;
  std::unique_ptr<runner::SimulatedRunner> runner_;
  std::unique_ptr<NodeAgent> agent_;
  std::string log_dir_ = "/nonexistent";  // the simulated runner writes no logs
  int64_t max_log_bytes_ = int64_t{64} * 1024 * 1024;
  std::string checkpoint_dir_;  // NodeAgentOptions::checkpoint_dir of MakeAgent's agents
};

TEST_F(NodeAgentTest, RegistersTheProbeInventory) {
  ASSERT_OK(agent_->Register());
  const Json node = *admin_client_->Get("/v1/nodes/node-a");
  EXPECT_EQ(node["state"], "Ready");
  ASSERT_EQ(node["gpus"].size(), 8u);
  EXPECT_EQ(node["gpus"][0]["model"], "H100-80GB");
  EXPECT_THAT(node["gpus"][0]["uuid"].get<std::string>(), HasSubstr("GPU-"));
  EXPECT_EQ(node["labels"][std::string(kDriverVersionLabel)], "550.54.15");
  EXPECT_EQ(node["labels"][std::string(kCudaVersionLabel)], "12.4");
  EXPECT_EQ(node["topology"]["leaf"], "leaf-0");
  EXPECT_EQ(agent_->gpu_index_by_uuid().size(), 8u);
}

// Issue 36: a link the agent finds down reaches the server with the heartbeat and labels the node.
TEST_F(NodeAgentTest, ALinkProblemLabelsTheNodeThroughTheHeartbeat) {
  LinkMonitor links(
      {.clock = clock_, .sysfs_root = std::string(GPUFLEET_TEST_DATA_DIR) + "/sysfs/port_down"});
  Result<std::unique_ptr<TelemetrySampler>> sampler = TelemetrySampler::Create(
      {.probe = *probe_, .clock = clock_, .hostname = "node-a", .links = &links});
  ASSERT_OK(sampler);
  agent_.reset();  // it holds the fixture's sampler
  sampler_ = std::move(sampler).value();
  ASSERT_OK(sampler_->SampleOnce());
  agent_ = MakeAgent(*runner_);
  ASSERT_OK(agent_->Register());
  EXPECT_EQ(Node("node-a")["labels"].count(std::string(kLinkDegradedLabel)), 0u);
  ASSERT_OK(agent_->Heartbeat());
  const Json node = Node("node-a");
  EXPECT_EQ(node["labels"][std::string(kLinkDegradedLabel)], "true");
  EXPECT_EQ(node["link_problems"],
            Json::array({"mlx5_1/1: port DOWN (Disabled), not ACTIVE and LinkUp"}));
  agent_.reset();
  sampler_.reset();  // before `links`, which it reads
}

// Issue 33: the node says whether its agent runs containers, so that the server places container
// tasks only there.
TEST_F(NodeAgentTest, RegistersWhetherItsRunnerRunsContainers) {
  ASSERT_OK(agent_->Register());
  EXPECT_EQ(Node("node-a")["labels"][std::string(kContainerRuntimeLabel)], "simulated");
  RecordingRunner process_only(*runner_);
  process_only.container_runtime = "";  // as the process runner
  agent_ = MakeAgent(process_only, agent_->node_token());
  ASSERT_OK(agent_->Register());
  EXPECT_EQ(Node("node-a")["labels"].count(std::string(kContainerRuntimeLabel)), 0u);
}

TEST_F(NodeAgentTest, RecordsTheProvenanceOfEachRunItStartsWithEnvNamesButNoValues) {
  ASSERT_OK(agent_->Register());
  EXPECT_EQ(Node("node-a")["labels"][std::string(wire::kNvmlVersionLabel)], "12.550.54.15");
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: prov, labels: {project: bert}}
spec:
  provenance: {git.commit: 3f2c1e0}
  tasks:
    - name: main
      command: [python, train.py]
      env: {GPUFLEET_SIM_DURATION_MS: "60000", HF_TOKEN: hunter2}
      resources:
        gpus: {count: 2}
)");
  ASSERT_OK(agent_->Heartbeat());  // starts the task and records it
  EXPECT_TRUE(agent_->pending_provenance().empty());
  EXPECT_EQ(agent_->provenance_refused(), "");
  const Json listed = *admin_client_->Get("/v1/provenance?job=prov");
  ASSERT_EQ(listed["items"].size(), 1u) << listed.dump();
  const Json& record = listed["items"][0];
  EXPECT_EQ(record["task_id"], "prov/main-0/1");
  EXPECT_EQ(record["node"], "node-a");
  EXPECT_EQ(record["driver_version"], "550.54.15");
  EXPECT_EQ(record["cuda_version"], "12.4");
  EXPECT_EQ(record["nvml_version"], "12.550.54.15");
  ASSERT_EQ(record["gpus"].size(), 2u);
  EXPECT_THAT(record["gpus"][0]["uuid"].get<std::string>(), HasSubstr("GPU-"));
  EXPECT_EQ(record["gpus"][0]["serial"].get<std::string>().size(), 13u);
  EXPECT_EQ(record["gpus"][0]["vbios_version"], "96.00.89.00.01");
  EXPECT_EQ(record["command"], Json::array({"python", "train.py"}));
  EXPECT_EQ(record["provenance"]["git.commit"], "3f2c1e0");
  EXPECT_EQ(record["labels"]["project"], "bert");
  const std::string names = record["env_names"].dump();
  for (const char* name : {"HF_TOKEN", "CUDA_VISIBLE_DEVICES", "GPUFLEET_TASK_ID", "PATH"}) {
    EXPECT_THAT(names, HasSubstr(name));
  }
  EXPECT_THAT(listed.dump(), Not(HasSubstr("hunter2")));
  ASSERT_OK(agent_->Heartbeat());  // a running task is not recorded again
  EXPECT_TRUE(agent_->pending_provenance().empty());
}

// Issue 37: the line a task appends to its checkpoint file reaches its job through the
// heartbeat. (The simulated runner makes no file: the test writes it as the task would.)
TEST_F(NodeAgentTest, ATasksCheckpointReachesItsJob) {
  std::string pattern = ::testing::TempDir() + "/gpufleet_agent_checkpoints_XXXXXX";
  ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
  checkpoint_dir_ = pattern;
  RecordingRunner recording(*runner_);
  std::unique_ptr<NodeAgent> agent = MakeAgent(recording);
  clock_.Advance(std::chrono::seconds(1000));
  ASSERT_OK(agent->Register());
  Submit(JobYaml("train", 2, 3600000));
  ASSERT_OK(agent->Heartbeat());  // starts the task
  ASSERT_EQ(recording.launches.size(), 1u);
  const std::string path = recording.launches[0].checkpoint_path;
  EXPECT_EQ(path, checkpoint_dir_ + "/train_main-0_1.checkpoint");
  ASSERT_OK(agent->Heartbeat());  // reports it running
  EXPECT_FALSE(Job("train").contains("last_checkpoint_ns"));

  const auto append = [&](const std::string& line) { std::ofstream(path, std::ios::app) << line; };
  append("990 step=10\n");
  clock_.Advance(std::chrono::seconds(10));
  ASSERT_OK(agent->Heartbeat());
  EXPECT_EQ(Job("train")["last_checkpoint_ns"], int64_t{990} * 1'000'000'000);

  // A malformed line is counted once and leaves the last good time.
  append("saved!\n");
  for (int beat = 0; beat < 2; ++beat) {
    clock_.Advance(std::chrono::seconds(10));
    ASSERT_OK(agent->Heartbeat());
  }
  EXPECT_EQ(Job("train")["last_checkpoint_ns"], int64_t{990} * 1'000'000'000);
  EXPECT_EQ(agent->checkpoint_rejections(), (std::map<std::string, int64_t>{{"not a number", 1}}));

  // A time past the server's clock is taken as the server's now.
  append("5000\n");
  clock_.Advance(std::chrono::seconds(10));
  ASSERT_OK(agent->Heartbeat());
  EXPECT_EQ(Job("train")["last_checkpoint_ns"], clock_.Now().nanos);
  EXPECT_THAT(Events("jobs", "train"), Not(HasSubstr("checkpoint")));

  // Once the server has the task's end, its file goes.
  ASSERT_OK(admin_client_->Post("/v1/jobs/train/cancel", "", ""));
  for (int beat = 0; beat < 4 && std::filesystem::exists(path); ++beat) {
    clock_.Advance(std::chrono::seconds(10));
    ASSERT_OK(agent->Heartbeat());
    ASSERT_OK(server_->RunSchedulingCycle());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  std::filesystem::remove_all(checkpoint_dir_);
}

// A job of the whole node that asks for a notice before its preemption (issue 37 item 4), with
// no minimum runtime; `command` and `env` as YAML flow sequences and maps.
std::string NoticedJobYaml(const std::string& name, int priority, const std::string& command,
                           const std::string& env) {
  return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  priority: {}
  preemption: {{checkpointGraceSeconds: 30, minRuntime: 0s}}
  tasks:
    - name: main
      command: {}
      env: {}
      resources:
        gpus: {{count: 8}}
)",
                     name, priority, command, env);
}

// Waits (real time, up to 10 s) until `done` holds.
bool WaitFor(const std::function<bool()>& done) {
  for (int i = 0; i < 200 && !done(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return done();
}

std::string FileText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Issue 37 item 4, end to end: a real process under the process runner catches its preemption
// notice (SIGUSR1), reads the notice file, saves a checkpoint and reports it; the server then
// stops it with the agent's whole stop grace (it exits on its SIGTERM), and only once it is gone
// does the preemptor, which waited with its GPUs reserved, get them.
TEST_F(NodeAgentTest, ARealTaskCatchesItsNoticeSavesACheckpointAndIsStoppedAfterIt) {
  std::string base = ::testing::TempDir() + "/gpufleet_agent_notice_XXXXXX";
  ASSERT_NE(mkdtemp(base.data()), nullptr) << base;
  checkpoint_dir_ = base + "/checkpoints";
  log_dir_ = base + "/logs";
  ASSERT_TRUE(std::filesystem::create_directory(checkpoint_dir_));
  ASSERT_TRUE(std::filesystem::create_directory(log_dir_));
  Result<std::unique_ptr<runner::ProcessRunner>> processes =
      runner::ProcessRunner::Open(base + "/runner", clock_);
  ASSERT_OK(processes);
  std::unique_ptr<NodeAgent> agent = MakeAgent(**processes);
  ASSERT_OK(agent->Register());
  const std::string script =
      "trap 'echo \"notice: $(cat \"$GPUFLEET_PREEMPTION_NOTICE_FILE\")\"; "
      "echo \"$(date +%s) step=7\" >> \"$GPUFLEET_CHECKPOINT_FILE\"' USR1; "
      "trap 'echo stopping; exit 0' TERM; echo running; while true; do sleep 0.05; done";
  // The command as a JSON flow sequence, which YAML reads with JSON's escapes.
  Submit(NoticedJobYaml("victim", 0, Json({"/bin/bash", "-c", script}).dump(), "{}"));
  ASSERT_OK(agent->Heartbeat());  // starts the task
  const std::string log = log_dir_ + "/victim_main-0_1.log";
  ASSERT_TRUE(WaitFor([&] { return FileText(log).find("running") != std::string::npos; }));
  ASSERT_OK(agent->Heartbeat());
  ASSERT_EQ(Job("victim")["state"], "Running");

  Submit(NoticedJobYaml("urgent", 10, "[/bin/true]", "{}"));
  const Json noticed = Job("victim");
  EXPECT_EQ(noticed["state"], "Running") << "a notice first, no stop yet";
  ASSERT_TRUE(noticed.contains("notice")) << noticed.dump();
  EXPECT_EQ(noticed["notice"]["signal"], "SIGUSR1");
  const int64_t deadline_ns = noticed["notice"]["deadline_ns"].get<int64_t>();
  EXPECT_EQ(deadline_ns - noticed["notice"]["since_ns"].get<int64_t>(), 30'000'000'000);
  EXPECT_THAT(Events("jobs", "victim"), HasSubstr("preemption notice (SIGUSR1)"));
  EXPECT_EQ(Job("urgent")["state"], "Pending");

  ASSERT_OK(agent->Heartbeat());  // the notice: its file, then SIGUSR1
  const std::string checkpoint = checkpoint_dir_ + "/victim_main-0_1.checkpoint";
  ASSERT_TRUE(WaitFor([&] { return FileText(checkpoint).find("step=7") != std::string::npos; }));
  EXPECT_THAT(FileText(log), HasSubstr(fmt::format("notice: {} SIGUSR1",
                                                   (deadline_ns + 999'999'999) / 1'000'000'000)));
  EXPECT_EQ(agent->notice_error(), "");
  clock_.Advance(std::chrono::seconds(2));
  ASSERT_OK(agent->Heartbeat());  // reports the checkpoint
  EXPECT_TRUE(Job("victim").contains("last_checkpoint_ns"));
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(Job("victim")["state"], "Stopping") << "stopped long before its notice's deadline";
  EXPECT_THAT(Events("jobs", "victim"), HasSubstr("a checkpoint was reported after its notice"));
  EXPECT_EQ(Job("urgent")["state"], "Pending") << "the victim's task still holds the GPUs";

  ASSERT_OK(agent->Heartbeat());  // SIGTERM
  ASSERT_TRUE(WaitFor([&] {
    const std::vector<runner::TaskStatus> tasks = (*processes)->Poll();
    return tasks.size() == 1 && runner::IsFinal(tasks[0].state);
  }));
  const runner::TaskStatus ended = (*processes)->Poll()[0];
  EXPECT_EQ(ended.state, runner::TaskState::kExited) << "it ended on its SIGTERM, not killed";
  EXPECT_EQ(ended.notices, std::vector<std::string>{"SIGUSR1"}) << "one notice, once";
  EXPECT_THAT(FileText(log), HasSubstr("stopping"));
  for (int step = 0; step < 3; ++step) {
    ASSERT_OK(agent->Heartbeat());
    ASSERT_OK(server_->RunSchedulingCycle());
  }
  EXPECT_EQ(Job("victim")["state"], "Pending");
  EXPECT_NE(Job("urgent")["state"], "Pending") << "placed once the victim's task was gone";
  EXPECT_FALSE(std::filesystem::exists(checkpoint_dir_ + "/victim_main-0_1.notice"));
  ASSERT_OK(agent->Heartbeat());  // starts the preemptor's /bin/true
  ASSERT_TRUE(WaitFor([&] {
    const std::vector<runner::TaskStatus> tasks = (*processes)->Poll();
    return std::all_of(tasks.begin(), tasks.end(),
                       [](const runner::TaskStatus& task) { return runner::IsFinal(task.state); });
  }));
  std::filesystem::remove_all(base);
}

// A task that saves nothing is stopped at its notice's deadline; an agent of protocol 1.1, which
// does not know notices, is sent none and its task gets the plain stop at the same deadline.
TEST_F(NodeAgentTest, WithoutACheckpointTheStopComesAtTheNoticesDeadline) {
  std::string node_token;  // the node's credential, from its first registration on
  for (const std::string protocol : {"", "1.1"}) {
    SCOPED_TRACE(protocol.empty() ? "this build's agent" : "an agent of protocol " + protocol);
    agent_protocol_ = protocol;
    runner::SimulatedRunner runner(clock_);
    std::unique_ptr<NodeAgent> agent = MakeAgent(runner, node_token);
    ASSERT_OK(agent->Register());
    node_token = agent->node_token();
    const std::string victim = "victim" + std::string(protocol.empty() ? "" : "-old");
    const std::string urgent = "urgent" + std::string(protocol.empty() ? "" : "-old");
    Submit(NoticedJobYaml(victim, 0, "[train]", "{GPUFLEET_SIM_DURATION_MS: \"3600000\"}"));
    ASSERT_OK(agent->Heartbeat());
    ASSERT_OK(agent->Heartbeat());
    ASSERT_EQ(Job(victim)["state"], "Running");
    Submit(NoticedJobYaml(urgent, 10, "[train]", "{GPUFLEET_SIM_DURATION_MS: \"3600000\"}"));
    ASSERT_TRUE(Job(victim).contains("notice"));
    ASSERT_OK(agent->Heartbeat());
    const std::vector<std::string> want_notices =
        protocol.empty() ? std::vector<std::string>{"SIGUSR1"} : std::vector<std::string>{};
    ASSERT_EQ(runner.Poll().size(), 1u);
    EXPECT_EQ(runner.Poll()[0].notices, want_notices);
    for (int seconds = 10; seconds < 30; seconds += 10) {
      clock_.Advance(std::chrono::seconds(10));
      ASSERT_OK(agent->Heartbeat());
      ASSERT_OK(server_->RunSchedulingCycle());
      EXPECT_EQ(Job(victim)["state"], "Running") << seconds << " s into its 30 s notice";
      EXPECT_EQ(Job(urgent)["state"], "Pending");
    }
    clock_.Advance(std::chrono::seconds(10));
    ASSERT_OK(server_->RunSchedulingCycle());
    EXPECT_EQ(Job(victim)["state"], "Stopping");
    EXPECT_THAT(Events("jobs", victim), HasSubstr("its notice's checkpoint grace ran out"));
    ASSERT_OK(agent->Heartbeat());  // the stop
    ASSERT_OK(agent->Heartbeat());  // its end reported
    ASSERT_OK(server_->RunSchedulingCycle());
    ASSERT_OK(server_->RunSchedulingCycle());
    EXPECT_NE(Job(urgent)["state"], "Pending");
    // The fleet is one node: the preemptor makes room for the next round.
    ASSERT_OK(admin_client_->Post("/v1/jobs/" + urgent + "/cancel", "", ""));
    ASSERT_OK(admin_client_->Post("/v1/jobs/" + victim + "/cancel", "", ""));
    for (int step = 0; step < 3; ++step) {
      ASSERT_OK(agent->Heartbeat());
      ASSERT_OK(server_->RunSchedulingCycle());
    }
  }
}

TEST_F(NodeAgentTest, RunsATaskToSuccessWithItsGpus) {
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("train", 2, 60000));
  ASSERT_OK(agent_->Heartbeat());  // starts the task
  std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_EQ(tasks[0].task_id, "train/main-0/1");
  EXPECT_EQ(tasks[0].gpu_uuids.size(), 2u);
  ASSERT_OK(agent_->Heartbeat());  // reports it running
  EXPECT_EQ(Job("train")["state"], "Running");

  for (int beat = 0; beat < 6; ++beat) {  // heartbeats renew the lease while it runs
    clock_.Advance(std::chrono::seconds(10));
    ASSERT_OK(agent_->Heartbeat());
  }
  clock_.Advance(std::chrono::seconds(1));
  ASSERT_OK(agent_->Heartbeat());  // reports the exit
  EXPECT_EQ(Job("train")["state"], "Succeeded");
  EXPECT_TRUE(runner_->Poll().empty()) << "forgotten once reported";
}

// The agent ships the tail of each task's log after a heartbeat when it grew, at most every
// log_ship_interval (30 s) while it runs and once when it ends; the server keeps the tail for
// GET /v1/jobs/NAME/logs. A log past max_log_bytes is cut. (The simulated runner writes no log:
// the test writes it as the task would.)
TEST_F(NodeAgentTest, ShipsTheTailOfEachTasksLogAndCutsOneThatGrowsTooLarge) {
  std::string pattern = ::testing::TempDir() + "/gpufleet_task_logs_XXXXXX";
  ASSERT_NE(mkdtemp(pattern.data()), nullptr) << pattern;
  log_dir_ = pattern;
  max_log_bytes_ = 64 * 1024;
  agent_ = MakeAgent(*runner_);
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("logged", 1, 200000));
  ASSERT_OK(agent_->Heartbeat());  // starts the task and records its run; no log yet
  const std::string log = log_dir_ + "/logged_main-0_1.log";
  const auto write = [&](const std::string& text) { std::ofstream(log, std::ios::app) << text; };
  const auto shipped = [&] {
    const Json logs = *admin_client_->Get("/v1/jobs/logged/logs");
    return logs["items"].empty() ? Json() : logs["items"][0];
  };
  // 30 s of heartbeats every 10 s (the lease wants them that often).
  const auto thirty_seconds = [&] {
    for (int beat = 0; beat < 3; ++beat) {
      clock_.Advance(std::chrono::seconds(10));
      ASSERT_OK(agent_->Heartbeat());
    }
  };
  EXPECT_TRUE(shipped()["text"].is_null());
  write("epoch 1\n");
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_EQ(shipped()["text"], "epoch 1\n");
  write("epoch 2\n");
  ASSERT_OK(agent_->Heartbeat());  // grew, but shipped less than 30 s ago
  EXPECT_EQ(shipped()["text"], "epoch 1\n");
  thirty_seconds();
  EXPECT_EQ(shipped()["text"], "epoch 1\nepoch 2\n");
  // Only the last 16 KiB travel; the size says how much came before.
  write(std::string(20 * 1024, 'x'));
  thirty_seconds();
  EXPECT_EQ(shipped()["text"].get<std::string>().size(), wire::kMaxTaskLogTailBytes);
  EXPECT_EQ(shipped()["size"], 16 + 20 * 1024);
  EXPECT_EQ(shipped()["final"], false);
  // Past 64 KiB the log is cut back to a line that says so.
  write(std::string(50 * 1024, 'y'));
  thirty_seconds();
  EXPECT_LT(std::filesystem::file_size(log), 200u);
  EXPECT_THAT(shipped()["text"].get<std::string>(), HasSubstr("was cut here"));
  // The task ends (at 200 s): its final tail is shipped with the report of its end.
  write("done\n");
  for (int beat = 0; beat < 12; ++beat) {  // heartbeats renew the lease while it runs
    clock_.Advance(std::chrono::seconds(10));
    ASSERT_OK(agent_->Heartbeat());
  }
  EXPECT_EQ(Job("logged")["state"], "Succeeded");
  EXPECT_EQ(shipped()["final"], true);
  EXPECT_THAT(shipped()["text"].get<std::string>(), HasSubstr("done\n"));
  std::filesystem::remove_all(log_dir_);
}

// As dcgm-exporter's hpc_job and pod labels: a GPU's series name the job on it, from the
// server's assignment to the agent, and lose the labels once the job has gone (the sampler is
// made with job_labels; telemetry_test checks that they are off by default).
TEST_F(NodeAgentTest, TheGpuSeriesNameTheJobTeamAndQueueOnThem) {
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("train", 2, 60000));
  ASSERT_OK(agent_->Heartbeat());
  const std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_EQ(tasks.size(), 1u);
  const std::string metrics = sampler_->RenderMetrics();
  // The admin's job has no team: hpc_job is then the job's name alone.
  const Json job = Job("train");
  ASSERT_EQ(job.value("team", ""), "");
  const std::string labels = fmt::format(
      "hpc_job=\"train\",queue=\"{}\",task=\"main-0\",team=\"\"}}", job.value("queue", ""));
  for (const std::string& uuid : tasks[0].gpu_uuids) {
    EXPECT_THAT(metrics, HasSubstr(fmt::format("UUID=\"{}\"", uuid)));
  }
  // Two GPUs of eight carry the job's labels, on every DCGM series.
  const size_t temperature_series = [&] {
    size_t count = 0;
    for (size_t at = metrics.find("DCGM_FI_DEV_GPU_TEMP{"); at != std::string::npos;
         at = metrics.find("DCGM_FI_DEV_GPU_TEMP{", at + 1)) {
      const std::string line = metrics.substr(at, metrics.find('\n', at) - at);
      count += line.find(labels) != std::string::npos ? 1 : 0;
    }
    return count;
  }();
  EXPECT_EQ(temperature_series, 2u) << metrics;

  ASSERT_OK(admin_client_->Post("/v1/jobs/train/cancel", "", ""));
  ASSERT_OK(server_->RunSchedulingCycle());
  for (int beat = 0; beat < 3; ++beat) {
    ASSERT_OK(agent_->Heartbeat());
  }
  EXPECT_THAT(sampler_->RenderMetrics(), Not(HasSubstr("hpc_job=")));
}

TEST_F(NodeAgentTest, AFailingTaskFailsTheJob) {
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("bad", 1, 1000, 7));
  ASSERT_OK(agent_->Heartbeat());
  clock_.Advance(std::chrono::seconds(2));
  ASSERT_OK(agent_->Heartbeat());
  const Json job = Job("bad");
  EXPECT_EQ(job["state"], "Failed");
  EXPECT_THAT(job["reason"].get<std::string>(), HasSubstr("exited with code 7"));
}

TEST_F(NodeAgentTest, CancelStopsTheTask) {
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("long", 1, 3600 * 1000));
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_OK(admin_client_->Post("/v1/jobs/long/cancel", "", ""));
  ASSERT_OK(agent_->Heartbeat());
  const std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_TRUE(tasks[0].stop_requested);
  EXPECT_EQ(tasks[0].state, runner::TaskState::kKilled);
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_TRUE(runner_->Poll().empty());
  EXPECT_EQ(Job("long")["state"], "Cancelled");
}

TEST_F(NodeAgentTest, ANewTaskWaitsUntilTheStoppingTaskOnItsGpusHasExited) {
  ASSERT_OK(agent_->Register());
  // A task of an earlier run, left from before an agent restart, still holds every GPU; it takes
  // 4 s to exit after SIGTERM.
  ASSERT_OK(runner_->Start({.task_id = "old/main-0/1",
                            .argv = {"x"},
                            .env = {{std::string(runner::kSimStopDelayEnv), "4000"}},
                            .gpu_uuids = GpuUuids()}));
  Submit(JobYaml("train", 8, 3600 * 1000));
  ASSERT_OK(agent_->Heartbeat());  // stops the old task first; the new one must wait
  std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_NE(Task(tasks, "old/main-0/1"), nullptr);
  EXPECT_TRUE(Task(tasks, "old/main-0/1")->stop_requested);
  EXPECT_EQ(Task(tasks, "train/main-0/1"), nullptr) << "started beside a live task";
  ASSERT_OK(agent_->Heartbeat());  // reports it waiting, not failed
  EXPECT_EQ(Job("train")["state"], "Scheduled");
  EXPECT_THAT(Events("jobs", "train"), HasSubstr("is still held by task old/main-0/1"));

  clock_.Advance(std::chrono::seconds(4));
  ASSERT_OK(agent_->Heartbeat());  // the old task has exited: now it starts
  tasks = runner_->Poll();
  const runner::TaskStatus* train = Task(tasks, "train/main-0/1");
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->start_time, clock_.Now());
  EXPECT_EQ(train->gpu_uuids.size(), 8u);
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_EQ(Job("train")["state"], "Running");
}

TEST_F(NodeAgentTest, AStoppedJobsGpusAreReusedOnlyAfterItsTaskHasExited) {
  ASSERT_OK(agent_->Register());
  // A 1-GPU job that takes 15 s to exit after SIGTERM (it writes a checkpoint).
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: ckpt}
spec:
  tasks:
    - name: main
      command: [python, train.py]
      env: {GPUFLEET_SIM_STOP_MS: "15000"}
      resources:
        gpus: {count: 8}
)");
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_EQ(Job("ckpt")["state"], "Running");
  ASSERT_OK(admin_client_->Post("/v1/jobs/ckpt/cancel", "", ""));
  Submit(JobYaml("next", 8, 3600 * 1000));
  for (int second = 0; second < 20; ++second) {
    ASSERT_OK(agent_->Heartbeat());
    ASSERT_OK(server_->RunSchedulingCycle());
    clock_.Advance(std::chrono::seconds(1));
  }
  // The physical record: the next task started after the first ended, never beside it.
  const std::vector<runner::TaskStatus> tasks = runner_->Poll();
  const runner::TaskStatus* next = Task(tasks, "next/main-0/1");
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(Job("ckpt")["state"], "Cancelled");
  const std::string events = Events("jobs", "ckpt");
  EXPECT_THAT(events, HasSubstr("Stopping, then Cancelled"));
  // Stopped at about 00:00 (+ the first beat), exited 15 s later (SIGKILL would be at the 5 s
  // grace of this agent, so the stop delay is cut there).
  EXPECT_GE(next->start_time - MonoTime{0}, std::chrono::seconds(5));
}

// A simulated runner that keeps the environment each task was started with.
class LaunchRecordingRunner final : public runner::TaskRunner {
 public:
  explicit LaunchRecordingRunner(runner::TaskRunner& runner) : runner_(runner) {}
  Status Start(const runner::TaskLaunch& launch) override {
    env_[launch.task_id] = launch.env;
    return runner_.Start(launch);
  }
  Status Stop(std::string_view task_id, Duration grace) override {
    return runner_.Stop(task_id, grace);
  }
  std::vector<runner::TaskStatus> Poll() override { return runner_.Poll(); }
  Status SendNotice(std::string_view task_id, std::string_view signal_name) override {
    return runner_.SendNotice(task_id, signal_name);
  }
  Status Forget(std::string_view task_id) override { return runner_.Forget(task_id); }
  Status RenewLease(Duration fence_in, Duration grace) override {
    return runner_.RenewLease(fence_in, grace);
  }
  const std::map<std::string, std::string>& EnvOf(const std::string& task_id) {
    return env_[task_id];
  }

 private:
  runner::TaskRunner& runner_;
  std::map<std::string, std::map<std::string, std::string>> env_;
};

// Issue 37 item 6, the server with a simulated agent: an elastic job (min 2, max 8 one-GPU
// tasks) runs at 8 on the empty 8-GPU node; a 4-GPU job of a higher priority makes it shrink to 4
// (its ranks 4..7 get the notice, 0..3 run on) and starts within one cycle plus that notice's
// grace, never on a GPU a released rank may still use; once it ends the elastic job grows back.
TEST_F(NodeAgentTest, AnElasticJobShrinksForAHigherPriorityJobAndGrowsBackOnceItEnds) {
  runner::SimulatedRunner simulated(clock_);
  LaunchRecordingRunner runner(simulated);
  std::unique_ptr<NodeAgent> agent = MakeAgent(runner);
  ASSERT_OK(agent->Register());
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: elastic}
spec:
  preemption: {checkpointGraceSeconds: 10, minRuntime: 0s}
  tasks:
    - name: worker
      replicas: {min: 2, max: 8}
      command: [torchrun]
      resources:
        gpus: {count: 1}
)");
  ASSERT_OK(agent->Heartbeat());
  ASSERT_OK(agent->Heartbeat());
  Json elastic = Job("elastic");
  ASSERT_EQ(elastic["state"], "Running") << Events("jobs", "elastic");
  EXPECT_EQ(elastic["world_size"], 8);
  ASSERT_EQ(simulated.Poll().size(), 8u);
  const std::map<std::string, std::string> rank5 = runner.EnvOf("elastic/worker-5/1");
  EXPECT_EQ(rank5.at("GPUFLEET_WORLD_SIZE"), "8");
  EXPECT_EQ(rank5.at("GPUFLEET_RANK"), "5");
  EXPECT_THAT(rank5.at("GPUFLEET_RENDEZVOUS"), ::testing::StartsWith("node-a:"));
  EXPECT_EQ(runner.EnvOf("elastic/worker-0/1").at("GPUFLEET_RENDEZVOUS"),
            rank5.at("GPUFLEET_RENDEZVOUS"));

  const MonoTime submitted = clock_.Now();
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: urgent}
spec:
  priority: 10
  tasks:
    - name: main
      command: [train]
      env: {GPUFLEET_SIM_DURATION_MS: "20000"}
      resources:
        gpus: {count: 4}
)");
  elastic = Job("elastic");
  EXPECT_EQ(elastic["state"], "Running") << "a shrink, not a stop";
  EXPECT_EQ(elastic["world_size"], 4);
  EXPECT_THAT(Events("jobs", "elastic"), HasSubstr("shrinking from 8 to 4 tasks"));
  EXPECT_EQ(Job("urgent")["state"], "Pending");

  std::optional<MonoTime> urgent_placed;
  for (int second = 0; second < 30 && !urgent_placed; ++second) {
    clock_.Advance(std::chrono::seconds(1));
    ASSERT_OK(agent->Heartbeat());
    ASSERT_OK(server_->RunSchedulingCycle());
    if (Job("urgent")["state"] != "Pending") {
      urgent_placed = clock_.Now();
      for (const runner::TaskStatus& task : simulated.Poll()) {
        if (task.task_id.starts_with("elastic/")) {
          const bool released = task.task_id >= "elastic/worker-4";
          EXPECT_EQ(runner::IsFinal(task.state), released)
              << task.task_id << ": the urgent job is placed once the released ranks are gone";
        }
      }
    }
  }
  ASSERT_TRUE(urgent_placed.has_value()) << Events("jobs", "urgent");
  EXPECT_LE(*urgent_placed - submitted, std::chrono::seconds(10 + 3))
      << "the notice's grace, the stop and one cycle";
  for (const runner::TaskStatus& task : simulated.Poll()) {
    if (task.task_id.starts_with("elastic/")) {
      const bool released = task.task_id >= "elastic/worker-4";
      EXPECT_EQ(task.notices,
                released ? std::vector<std::string>{"SIGUSR1"} : std::vector<std::string>{})
          << task.task_id;
    }
  }
  elastic = Job("elastic");
  EXPECT_EQ(elastic["state"], "Running");
  EXPECT_EQ(elastic["placements"].size(), 4u);

  // The urgent job runs 20 s; then the elastic job restarts at 8 after its notice.
  for (int second = 0; second < 60 && Job("elastic")["world_size"] != 8; ++second) {
    clock_.Advance(std::chrono::seconds(1));
    ASSERT_OK(agent->Heartbeat());
    ASSERT_OK(server_->RunSchedulingCycle());
  }
  elastic = Job("elastic");
  EXPECT_EQ(elastic["world_size"], 8) << Events("jobs", "elastic");
  EXPECT_EQ(elastic["attempt"], 2);
  EXPECT_EQ(Job("urgent")["state"], "Succeeded");
  EXPECT_THAT(Events("jobs", "elastic"), HasSubstr("growing from 4 to 8 tasks"));
}

// Issue 37 item 3: each stop the server decides gives the task the agent's whole stop grace. A
// task that needs 29 s of its 30 s after SIGTERM (it writes a checkpoint) ends by itself 29 s
// after its SIGTERM, never killed sooner, whether it was cancelled, preempted (at once or after
// its notice ran out) or stopped because one of its GPUs must drain now. (Lease expiry on a
// partition: ATaskFencedOnAPartitionGetsItsWholeStopGrace.)
TEST_F(NodeAgentTest, EveryStopPathGivesTheTaskItsWholeStopGrace) {
  const auto job_yaml = [](const std::string& name, const std::string& preemption) {
    return fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: {}}}
spec:
  preemption: {{minRuntime: 0s{}}}
  tasks:
    - name: main
      command: [python, train.py]
      env: {{GPUFLEET_SIM_STOP_MS: "29000"}}
      resources:
        gpus: {{count: 8}}
)",
                       name, preemption);
  };
  const auto preempt = [&](const std::string& job) {
    Submit(NoticedJobYaml(job + "-urgent", 10, "[train]", "{}"));
  };
  struct StopPath {
    std::string name;
    std::string preemption;  // more of the victim's spec.preemption
    std::function<void(const std::string& job)> stop;
  };
  const std::vector<StopPath> paths = {
      {"cancel", "",
       [&](const std::string& job) {
         ASSERT_OK(admin_client_->Post("/v1/jobs/" + job + "/cancel", "", ""));
       }},
      {"preemption", "", preempt},
      {"preemption-notice", ", checkpointGraceSeconds: 10", preempt},
      {"drain-now", "",
       [&](const std::string&) {
         ASSERT_OK(probe_->InjectGpuLost(0));
         ASSERT_OK(sampler_->SampleOnce());
       }},
  };
  std::string node_token;  // the node's credential, from its first registration on
  for (const StopPath& path : paths) {
    SCOPED_TRACE(path.name);
    runner::SimulatedRunner runner(clock_);
    std::unique_ptr<NodeAgent> agent = MakeAgent(runner, node_token, std::chrono::seconds(30));
    ASSERT_OK(agent->Register());
    node_token = agent->node_token();
    Submit(job_yaml(path.name, path.preemption));
    ASSERT_OK(agent->Heartbeat());
    ASSERT_OK(agent->Heartbeat());
    ASSERT_EQ(Job(path.name)["state"], "Running");
    ASSERT_EQ(runner.Poll().size(), 1u) << Events("jobs", path.name);
    ASSERT_EQ(runner.Poll()[0].state, runner::TaskState::kRunning);
    path.stop(path.name);
    const std::string task_id = path.name + "/main-0/1";
    std::optional<MonoTime> sigterm_at;
    std::optional<runner::TaskStatus> ended;
    for (int second = 0; second < 90; ++second) {
      // Before the heartbeat, which reports a task's end and then forgets it.
      const std::vector<runner::TaskStatus> before = runner.Poll();
      if (const runner::TaskStatus* task = Task(before, task_id);
          task != nullptr && runner::IsFinal(task->state)) {
        ended = *task;
        break;
      }
      ASSERT_OK(agent->Heartbeat());
      const std::vector<runner::TaskStatus> after = runner.Poll();
      if (const runner::TaskStatus* task = Task(after, task_id);
          task != nullptr && task->stop_requested && !sigterm_at) {
        sigterm_at = clock_.Now();  // Stop was called at this heartbeat
      }
      ASSERT_OK(server_->RunSchedulingCycle());
      clock_.Advance(std::chrono::seconds(1));
    }
    ASSERT_TRUE(ended.has_value());
    ASSERT_TRUE(sigterm_at.has_value());
    EXPECT_EQ(ended->signal, 15) << "ended by its SIGTERM, not killed";
    EXPECT_EQ(*ended->end_time - *sigterm_at, std::chrono::seconds(29));
    // The fleet is one node: what this path placed leaves before the next.
    for (const std::string& job : {path.name, path.name + "-urgent"}) {
      static_cast<void>(admin_client_->Post("/v1/jobs/" + job + "/cancel", "", ""));
    }
    for (int beat = 0; beat < 3; ++beat) {
      ASSERT_OK(agent->Heartbeat());
      ASSERT_OK(server_->RunSchedulingCycle());
      clock_.Advance(std::chrono::seconds(31));
    }
  }
}

TEST_F(NodeAgentTest, AnAgentCutOffFromTheServerStopsItsTasksBeforeTheLeaseRunsOut) {
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("long", 8, 3600 * 1000));
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_EQ(Job("long")["state"], "Running");
  EXPECT_EQ(agent_->FenceIfLeaseExpired(), 0);

  partitioned_ = true;
  // The server's lease is 40 s from the last heartbeat it answered; with the 16 s margin the
  // agent fences at 24 s, and its task is gone (5 s grace here) well before the server frees the
  // GPUs at 40 s + its own stop grace.
  clock_.Advance(std::chrono::seconds(20));
  EXPECT_FALSE(agent_->Heartbeat().ok());
  EXPECT_FALSE(runner_->Poll()[0].stop_requested);
  clock_.Advance(std::chrono::seconds(5));
  EXPECT_EQ(agent_->FenceIfLeaseExpired(), 1);
  const std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_TRUE(tasks[0].stop_requested);
  EXPECT_TRUE(runner::IsFinal(tasks[0].state));
  EXPECT_EQ(agent_->FenceIfLeaseExpired(), 0) << "stopped once";

  // Back: it says what it did, and the server (which by now has the node NotReady and the run
  // Stopping) takes the task's end.
  partitioned_ = false;
  clock_.Advance(std::chrono::seconds(30));
  ASSERT_OK(server_->RunSchedulingCycle());
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_THAT(Events("nodes", "node-a"),
              HasSubstr("agent fenced itself: lease of 40s not renewed for 25s: stopped 1 task"));
  EXPECT_NE(Job("long")["state"], "Running");
}

TEST_F(NodeAgentTest, ADeadAgentsTasksStopAtTheLeaseItLastRenewed) {
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("orphan", 8, 3600 * 1000));
  ASSERT_OK(agent_->Heartbeat());
  const MonoTime last_renewal = clock_.Now();
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_EQ(Job("orphan")["state"], "Running");

  agent_.reset();  // killed: nothing fences from the agent's side any more
  clock_.Advance(std::chrono::seconds(23));
  ASSERT_EQ(runner_->Poll().size(), 1u);
  EXPECT_FALSE(runner_->Poll()[0].stop_requested);
  clock_.Advance(std::chrono::seconds(2));
  // The runner holds the lease the last heartbeat renewed (40 s less the 16 s margin, from when
  // it was sent): the task is stopped there, long before the server frees its GPUs (lease plus
  // its stop grace, 70 s).
  const std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_EQ(tasks.size(), 1u);
  EXPECT_TRUE(tasks[0].stop_requested);
  ASSERT_TRUE(runner::IsFinal(tasks[0].state));
  EXPECT_EQ(tasks[0].end_time, last_renewal + std::chrono::seconds(24));
}

// Issue 37: a task cut off from the server gets SIGTERM at the fence deadline and the agent's
// whole stop grace after it (30 s, no more than the server's), not the grace less the margin
// again: its SIGKILL still comes 16 s before the server frees its GPUs.
TEST_F(NodeAgentTest, ATaskFencedOnAPartitionGetsItsWholeStopGrace) {
  agent_ = MakeAgent(*runner_, "", std::chrono::seconds(30));
  ASSERT_OK(agent_->Register());
  Submit(fmt::format(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {{name: checkpointing}}
spec:
  tasks:
    - name: main
      command: [python, train.py]
      env: {{GPUFLEET_SIM_DURATION_MS: "3600000", GPUFLEET_SIM_STOP_MS: "{}"}}
      resources:
        gpus: {{count: 8}}
)",
                     29'000));
  ASSERT_OK(agent_->Heartbeat());
  const MonoTime last_renewal = clock_.Now();
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_EQ(Job("checkpointing")["state"], "Running");

  partitioned_ = true;
  clock_.Advance(std::chrono::seconds(24));
  agent_->FenceIfLeaseExpired();
  clock_.Advance(std::chrono::seconds(29));
  const std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_EQ(tasks.size(), 1u);
  ASSERT_TRUE(runner::IsFinal(tasks[0].state));
  // SIGTERM at 24 s (the 40 s lease less the 16 s margin); the task needed 29 s and got them.
  EXPECT_EQ(tasks[0].signal, 15) << "ended by its SIGTERM, not killed";
  EXPECT_EQ(tasks[0].end_time, last_renewal + std::chrono::seconds(24 + 29));
  // Before the server's deadline: the lease (40 s) plus its stop grace (30 s).
  EXPECT_LT(*tasks[0].end_time, last_renewal + std::chrono::seconds(40 + 30));
}

TEST_F(NodeAgentTest, ARestartedAgentAdoptsTheTasksTheServerStillWants) {
  ASSERT_OK(agent_->Register());
  Submit(JobYaml("keep", 1, 3600 * 1000));
  ASSERT_OK(agent_->Heartbeat());
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_EQ(Job("keep")["state"], "Running");
  // The runner outlives the agent (the process runner re-reads its state directory).
  ASSERT_OK(runner_->Start({.task_id = "gone/main-0/1", .argv = {"x"}}));
  const std::string credential = agent_->node_token();
  ASSERT_FALSE(credential.empty());
  // Without its credential the new agent cannot act for the node.
  agent_ = MakeAgent(*runner_);
  EXPECT_THAT(agent_->Register(), StatusIs(StatusCode::kPermissionDenied));
  agent_ = MakeAgent(*runner_, credential);
  ASSERT_OK(agent_->Register());
  const std::vector<runner::TaskStatus> tasks = runner_->Poll();
  ASSERT_EQ(tasks.size(), 2u);
  EXPECT_EQ(tasks[0].task_id, "gone/main-0/1");
  EXPECT_TRUE(tasks[0].stop_requested) << "not wanted by the server";
  EXPECT_EQ(tasks[1].task_id, "keep/main-0/1");
  EXPECT_FALSE(tasks[1].stop_requested);
  EXPECT_EQ(Job("keep")["state"], "Running");
}

TEST_F(NodeAgentTest, ABadLaunchIsReportedAsAFailure) {
  ASSERT_OK(agent_->Register());
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: no-command}
spec:
  tasks:
    - {name: main, command: [python, train.py], env: {GPUFLEET_SIM_DURATION_MS: "soon"},
       resources: {gpus: {count: 1}}}
)");
  ASSERT_OK(agent_->Heartbeat());  // the runner refuses a malformed duration
  ASSERT_OK(agent_->Heartbeat());  // the refusal is reported
  const Json job = Job("no-command");
  EXPECT_EQ(job["state"], "Failed");
  EXPECT_THAT(job["reason"].get<std::string>(), HasSubstr("not started"));
}

TEST_F(NodeAgentTest, AContainerTaskReachesTheRunnerWithItsImageAndPullPolicy) {
  RecordingRunner recording(*runner_);
  agent_ = MakeAgent(recording);
  ASSERT_OK(agent_->Register());
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: boxed}
spec:
  provenance: {git.commit: 3f2c1e0}
  tasks:
    - {name: box, command: [sh], image: "127.0.0.1:15000/tiny:1", imagePullPolicy: Never,
       hostNetwork: true, env: {GPUFLEET_SIM_DURATION_MS: "60000"}, resources: {gpus: {count: 1}}}
    - {name: plain, command: [sh], env: {GPUFLEET_SIM_DURATION_MS: "60000"},
       resources: {gpus: {count: 1}}}
)");
  ASSERT_OK(agent_->Heartbeat());  // starts both tasks
  ASSERT_EQ(recording.launches.size(), 2u);
  const runner::TaskLaunch& box = recording.launches[0].task_id == "boxed/box-0/1"
                                      ? recording.launches[0]
                                      : recording.launches[1];
  const runner::TaskLaunch& plain =
      &box == &recording.launches[0] ? recording.launches[1] : recording.launches[0];
  EXPECT_EQ(box.task_id, "boxed/box-0/1");
  EXPECT_EQ(box.image, "127.0.0.1:15000/tiny:1");
  EXPECT_EQ(box.image_pull_policy, ImagePullPolicy::kNever);
  EXPECT_TRUE(box.host_network);
  EXPECT_EQ(plain.task_id, "boxed/plain-0/1");
  EXPECT_EQ(plain.image, "");
  EXPECT_EQ(plain.image_pull_policy, ImagePullPolicy::kIfNotPresent);
  EXPECT_FALSE(plain.host_network);
}

// MPS shares end to end, with a stand-in for nvidia-cuda-mps-control (no GPU here;
// docs/sharing.md): the server places both MPS shares on one GPU and the time-sliced one elsewhere,
// the agent runs one daemon for that GPU before its clients, gives each client its limits, and
// stops the daemon once the last client is known gone.
TEST_F(NodeAgentTest, MpsSharesAreClientsOfOneDaemonThatStopsAfterTheLastOfThem) {
  std::string dir = ::testing::TempDir() + "/gpufleet_agent_mps_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  RecordingRunner recording(*runner_);
  agent_ = MakeAgent(recording, "", std::chrono::seconds(5),
                     {.control_program = GPUFLEET_FAKE_MPS_CONTROL, .state_dir = dir + "/mps"});
  ASSERT_OK(agent_->Register());
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: shares}
spec:
  tasks:
    - {name: long, command: [sh], env: {GPUFLEET_SIM_DURATION_MS: "60000"},
       resources: {gpus: {milli: 250, memory: 8Gi, sharing: mps}}}
    - {name: short, command: [sh], env: {GPUFLEET_SIM_DURATION_MS: "20000"},
       resources: {gpus: {milli: 500, sharing: mps}}}
    - {name: sliced, command: [sh], env: {GPUFLEET_SIM_DURATION_MS: "20000"},
       resources: {gpus: {milli: 100, sharing: time-slicing}}}
)");
  // The first pass starts the daemon and the time-sliced task; the shares wait, without the pass
  // waiting, until a later pass finds the daemon's pid file.
  ASSERT_OK(agent_->Heartbeat());
  std::map<std::string, runner::TaskLaunch> launched;
  for (int pass = 0; pass < 500 && launched.size() < 3; ++pass) {
    if (pass > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ASSERT_OK(agent_->Heartbeat());
    }
    for (const runner::TaskLaunch& launch : recording.launches) {
      launched[launch.task_id] = launch;
    }
  }
  ASSERT_EQ(launched.size(), 3u);
  const runner::TaskLaunch& long_share = launched["shares/long-0/1"];
  const runner::TaskLaunch& short_share = launched["shares/short-0/1"];
  const runner::TaskLaunch& sliced = launched["shares/sliced-0/1"];
  ASSERT_EQ(long_share.gpu_uuids.size(), 1u);
  const std::string gpu = long_share.gpu_uuids[0];
  EXPECT_EQ(short_share.gpu_uuids, long_share.gpu_uuids);
  EXPECT_NE(sliced.gpu_uuids, long_share.gpu_uuids);
  const std::string pipes = dir + "/mps/" + gpu + "/pipe";
  EXPECT_EQ(long_share.mps, (runner::MpsClient{pipes, 8192, 25}));
  EXPECT_EQ(short_share.mps, (runner::MpsClient{pipes, 0, 50}));
  EXPECT_FALSE(sliced.mps.has_value());
  const auto control_log = [&] {
    const Result<std::optional<std::string>> text =
        os::ReadSmallFile(dir + "/mps/" + gpu + "/log/control.log");
    return text.ok() && text->has_value() ? **text : std::string();
  };
  // The control program writes its log as it starts, which a loaded machine can delay.
  EXPECT_TRUE(WaitFor([&] {
    return control_log().find("started CUDA_VISIBLE_DEVICES=" + gpu) != std::string::npos;
  })) << control_log();
  EXPECT_EQ(agent_->mps_daemons().daemons().size(), 1u);

  // The short share has ended, the long one still runs: the daemon stays. (Heartbeats every
  // 10 s renew the lease meanwhile.)
  for (int beat = 0; beat < 3; ++beat) {
    clock_.Advance(std::chrono::seconds(10));
    ASSERT_OK(agent_->Heartbeat());
  }
  ASSERT_OK(agent_->Heartbeat());
  agent_->TendMpsDaemons();
  EXPECT_EQ(agent_->mps_daemons().daemons().size(), 1u);
  EXPECT_THAT(control_log(), Not(HasSubstr("command quit")));
  // The last client has ended: the daemon is told to quit, and is forgotten once it has.
  // Beats until the long share has ended; then the fake clock stands still, so that the daemon,
  // which runs in real time, is not killed for its quit grace before it has read the quit.
  for (int beat = 0; beat < 4 && !runner_->Poll().empty(); ++beat) {
    clock_.Advance(std::chrono::seconds(10));
    ASSERT_OK(agent_->Heartbeat());
  }
  ASSERT_OK(agent_->Heartbeat());
  for (int i = 0; i < 1000 && !agent_->mps_daemons().daemons().empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    agent_->TendMpsDaemons();
  }
  EXPECT_TRUE(agent_->mps_daemons().daemons().empty());
  EXPECT_THAT(control_log(), HasSubstr("command quit"));
  EXPECT_EQ(Job("shares")["state"], "Succeeded");
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

TEST_F(NodeAgentTest, ImagesAreListedAtAModestRateAndSentWhenTheyChange) {
  RecordingRunner recording(*runner_);
  const CachedImage tiny{{"localhost/tiny:1"}, "sha256:" + std::string(64, 'e'), 1987655};
  recording.images = std::vector<CachedImage>{tiny};
  agent_ = MakeAgent(recording);
  ASSERT_OK(agent_->Register());
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_EQ(recording.image_lists, 1);
  EXPECT_EQ(Node("node-a")["images"][0]["references"][0], "localhost/tiny:1");
  // Not listed again before image_list_interval (5 min), nor sent again unchanged.
  const int64_t version = Node("node-a")["version"];
  clock_.Advance(std::chrono::seconds(10));
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_EQ(recording.image_lists, 1);
  EXPECT_EQ(Node("node-a")["version"], version);
  // Listed again once it is due; a change is sent.
  recording.images->push_back({{"localhost/big:2"}, "sha256:" + std::string(64, 'f'), 1 << 30});
  clock_.Advance(std::chrono::minutes(5));
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_EQ(recording.image_lists, 2);
  EXPECT_EQ(Node("node-a")["images"].size(), 2u);
  // A container start (its pull may add an image) makes the next heartbeat list them.
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: boxed}
spec:
  tasks:
    - {name: box, command: [sh], image: "localhost/tiny:1", env: {GPUFLEET_SIM_DURATION_MS: "60000"},
       resources: {gpus: {count: 1}}}
)");
  ASSERT_OK(agent_->Heartbeat());  // starts the task
  EXPECT_EQ(recording.image_lists, 2);
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_EQ(recording.image_lists, 3);
}

TEST_F(NodeAgentTest, ARunnerWithoutImagesSendsNone) {
  ASSERT_OK(agent_->Register());
  ASSERT_OK(agent_->Heartbeat());
  EXPECT_FALSE(Node("node-a").contains("images"));
}

TEST_F(NodeAgentTest, AFaultTheProbeSeesReachesTheNode) {
  ASSERT_OK(agent_->Register());
  ASSERT_OK(probe_->InjectGpuLost(5));
  clock_.Advance(std::chrono::seconds(1));
  ASSERT_OK(sampler_->SampleOnce());
  ASSERT_OK(agent_->Heartbeat());
  const Json node = *admin_client_->Get("/v1/nodes/node-a");
  EXPECT_EQ(node["gpus"][5]["health"], "Unhealthy");
  EXPECT_EQ(node["gpus"][5]["drain"], "now");
  EXPECT_THAT(node["gpus"][5]["reasons"].dump(), HasSubstr("79"));
  EXPECT_EQ(node["gpus"][4]["health"], "Healthy");
}

TEST_F(NodeAgentTest, SimulatedNodeShowsItsTasksInTelemetry) {
  Result<std::unique_ptr<SimulatedNode>> node =
      SimulatedNode::Create(SimNodeOptions("sim-0"), clock_, catalog_, *client_);
  ASSERT_OK(node);
  ASSERT_OK((*node)->sampler().SampleOnce());
  ASSERT_OK((*node)->agent().Register());
  Submit(JobYaml("busy", 3, 60000));
  ASSERT_OK((*node)->agent().Heartbeat());
  ASSERT_OK((*node)->UpdateLoads());
  clock_.Advance(std::chrono::seconds(1));
  ASSERT_OK((*node)->sampler().SampleOnce());
  int busy = 0;
  for (const GpuTelemetry& gpu : (*node)->sampler().LatestSnapshot()->gpus) {
    ASSERT_TRUE(gpu.reading.sample.gpu_util_percent.has_value());
    busy += *gpu.reading.sample.gpu_util_percent > 0 ? 1 : 0;
  }
  EXPECT_EQ(busy, 3);
  const std::vector<wire::GpuReport> reports = GpuReportsFrom(*(*node)->sampler().LatestSnapshot());
  ASSERT_EQ(reports.size(), 8u);
  EXPECT_EQ(reports[0].health, GpuHealth::kHealthy);
}

// `gpufleet dev`'s bad GPU: an XID under the task it runs, which drains it and ends the run as an
// infrastructure failure naming it; once the task is gone, a reset, and it takes work again.
TEST_F(NodeAgentTest, SimulatedFaultyGpuFailsTheRunItHoldsAndComesBackAfterAReset) {
  SimulatedNode::Options options = SimNodeOptions("bad-0");
  options.gpu_count = 1;
  options.faulty_gpu = FaultyGpu{.index = 0, .xid = 48, .recover_after = std::chrono::seconds(5)};
  Result<std::unique_ptr<SimulatedNode>> made =
      SimulatedNode::Create(options, clock_, catalog_, *client_);
  ASSERT_OK(made);
  SimulatedNode& node = **made;
  const std::string uuid = node.probe().Inventory()->gpus[0].uuid;
  ASSERT_OK(node.sampler().SampleOnce());
  ASSERT_OK(node.agent().Register());
  // Failed, not requeued: the job would only land on the same GPU again.
  Submit(R"(apiVersion: gpufleet.io/v1
kind: Job
metadata: {name: victim}
spec:
  onNodeFailure: fail
  tasks:
    - name: main
      command: [python, train.py]
      env: {GPUFLEET_SIM_DURATION_MS: "600000"}
      resources: {gpus: {count: 1}}
)");
  Beat(node);  // the task starts on the bad GPU, which reports its XID in the next sample
  clock_.Advance(std::chrono::seconds(1));
  ASSERT_OK(node.sampler().SampleOnce());
  Beat(node);
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(Node("bad-0")["gpus"][0]["health"], "Unhealthy");
  EXPECT_THAT(Node("bad-0")["gpus"][0]["reasons"].dump(), HasSubstr("48"));
  const Json outcomes = *admin_client_->Get("/v1/outcomes");
  ASSERT_EQ(outcomes["items"].size(), 1u) << outcomes.dump();
  EXPECT_EQ(outcomes["items"][0]["exit_reason"], "infra-error");
  EXPECT_EQ(outcomes["items"][0]["xids"].dump(), fmt::format(R"([{{"gpu":"{}","xid":48}}])", uuid));

  // The run stops; 5 s after the XID the GPU is reset and looks healthy again.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(std::chrono::seconds(2));
    ASSERT_OK(node.sampler().SampleOnce());
    Beat(node);
    ASSERT_OK(server_->RunSchedulingCycle());
  }
  ASSERT_OK(node.sampler().SampleOnce());
  ASSERT_OK(node.agent().Heartbeat());
  EXPECT_EQ(Node("bad-0")["gpus"][0]["health"], "Healthy");
  EXPECT_NE(Job("victim")["state"], "Running");
}

// A bad GPU the node does not have is refused, naming the option.
TEST_F(NodeAgentTest, SimulatedFaultyGpuOutsideTheNodeIsRefused) {
  SimulatedNode::Options options = SimNodeOptions("bad-1");
  options.gpu_count = 2;
  options.faulty_gpu = FaultyGpu{.index = 2};
  EXPECT_THAT(
      SimulatedNode::Create(options, clock_, catalog_, *client_),
      StatusIs(StatusCode::kInvalidArgument, HasSubstr("faulty_gpu.index: 2 is outside [0, 2)")));
}

TEST_F(NodeAgentTest, RegistersTheMigInstancesOfItsGpus) {
  std::unique_ptr<SimulatedNode> node = MigNode({"3g.40gb", "3g.40gb"});
  ASSERT_NE(node, nullptr);
  const Json doc = Node("mig-0");
  EXPECT_EQ(doc["labels"][std::string(wire::kMigLayoutsLabel)], "true");
  const Json& gpu = doc["gpus"][0];
  EXPECT_TRUE(gpu["mig_enabled"].get<bool>());
  EXPECT_EQ(gpu["mig_instances"].dump(),
            R"([{"profile":"3g.40gb","start":0},{"profile":"3g.40gb","start":4}])");
  ASSERT_EQ(gpu["mig_devices"].size(), 2u);
  EXPECT_EQ(gpu["mig_devices"][1]["uuid"], node->agent().mig_devices().at(0)[1].uuid);
  EXPECT_EQ(gpu["mig_devices"][1]["start"], 4);
}

TEST_F(NodeAgentTest, PendingMigJobGetsANewLayoutAppliedByTheAgentAndRunsOnItsMigDevice) {
  // The GPU is one free 7g.80gb instance: a 3g.40gb task fits no current layout.
  std::unique_ptr<SimulatedNode> node = MigNode({"7g.80gb"});
  ASSERT_NE(node, nullptr);
  Submit(MigJobYaml("infer", "3g.40gb"));
  EXPECT_EQ(Job("infer")["state"], "Pending");
  EXPECT_THAT(Job("infer")["reason"].get<std::string>(), HasSubstr("MIG"));

  // The next cycle plans a new layout for the GPU and places the job on it.
  ASSERT_OK(server_->RunSchedulingCycle());
  EXPECT_EQ(Job("infer")["state"], "Scheduled");
  const Json planned = Node("mig-0")["gpus"][0];
  EXPECT_THAT(planned["mig_instances"].dump(), HasSubstr("3g.40gb"));
  EXPECT_THAT(planned["mig_instances"].dump(), Not(HasSubstr("7g.80gb")));
  EXPECT_THAT(Events("nodes", "mig-0"), HasSubstr("gpu 0: new MIG layout for job infer"));
  EXPECT_THAT(Events("jobs", "infer"), HasSubstr("MIG layout of mig-0 gpu 0 changed for it"));

  Beat(*node);  // the agent applies the layout; the task waits for its report
  EXPECT_TRUE(node->runner().Poll().empty());
  ASSERT_EQ(node->agent().mig_devices().at(0).size(), planned["mig_instances"].size());
  EXPECT_EQ(node->probe().Inventory()->gpus[0].mig_devices, node->agent().mig_devices().at(0));

  Beat(*node);  // reports the instances; the task comes with its MIG device
  const std::vector<runner::TaskStatus> tasks = node->runner().Poll();
  ASSERT_EQ(tasks.size(), 1u);
  ASSERT_EQ(tasks[0].gpu_uuids.size(), 1u);
  EXPECT_TRUE(tasks[0].gpu_uuids[0].starts_with("MIG-")) << tasks[0].gpu_uuids[0];
  const Json assignment = Job("infer")["placements"][0]["assignments"][0];
  const auto& devices = node->agent().mig_devices().at(0);
  const auto device = std::find_if(devices.begin(), devices.end(), [&](const MigDeviceInfo& d) {
    return d.profile == "3g.40gb" && d.placement_start == assignment["mig_start"].get<int>();
  });
  ASSERT_NE(device, devices.end());
  EXPECT_EQ(tasks[0].gpu_uuids[0], device->uuid);
  ASSERT_EQ(node->agent().desired_tasks().size(), 1u);
  ASSERT_EQ(node->agent().desired_tasks()[0].mig_instances.size(), 1u);
  EXPECT_EQ(node->agent().desired_tasks()[0].mig_instances[0].uuid, device->uuid);

  Beat(*node);
  EXPECT_EQ(Job("infer")["state"], "Running");
  EXPECT_FALSE(Node("mig-0")["gpus"][0].contains("mig_error"));
}

TEST_F(NodeAgentTest, AStoppingJobKeepsItsInstanceUntilItsTaskHasEnded) {
  // MIG on, no instances: the scheduler creates the job's instance in a free slot.
  std::unique_ptr<SimulatedNode> node = MigNode({});
  ASSERT_NE(node, nullptr);
  Submit(MigJobYaml("infer", "3g.40gb"));
  EXPECT_EQ(Job("infer")["state"], "Scheduled");
  EXPECT_EQ(Job("infer")["placements"][0]["assignments"][0]["mig_created"], true);
  Beat(*node);  // creates the instance
  ASSERT_EQ(node->agent().mig_devices().at(0).size(), 1u);
  Beat(*node);  // starts the task on it
  Beat(*node);
  EXPECT_EQ(Job("infer")["state"], "Running");
  const std::string uuid = node->agent().mig_devices().at(0)[0].uuid;

  // Cancelled: the job stops, and while its task may still run the server keeps its instance in
  // the wanted layout, so the agent is never asked to destroy a device in use.
  ASSERT_OK(admin_client_->Post("/v1/jobs/infer/cancel", "", ""));
  EXPECT_EQ(Job("infer")["state"], "Stopping");
  Beat(*node);  // the task is told to stop
  ASSERT_EQ(node->probe().Inventory()->gpus[0].mig_devices.size(), 1u);
  EXPECT_EQ(node->probe().Inventory()->gpus[0].mig_devices[0].uuid, uuid);
  Beat(*node);  // reports it ended: the job is Cancelled and the instance no longer wanted
  EXPECT_EQ(Job("infer")["state"], "Cancelled");
  EXPECT_FALSE(Node("mig-0")["gpus"][0].contains("mig_error"));
  Beat(*node);
  EXPECT_TRUE(node->probe().Inventory()->gpus[0].mig_devices.empty()) << "free now: destroyed";
  Beat(*node);
  const Json gpu = Node("mig-0")["gpus"][0];
  EXPECT_FALSE(gpu.contains("mig_error"));
  EXPECT_TRUE(gpu["mig_devices"].empty());
  EXPECT_THAT(Events("nodes", "mig-0"), HasSubstr("gpu 0: MIG instances now none"));
  EXPECT_THAT(Events("nodes", "mig-0"), Not(HasSubstr("in use by a task")));
}

TEST_F(NodeAgentTest, HeartbeatBeforeRegisterIsAnError) {
  EXPECT_THAT(agent_->Heartbeat(), StatusIs(StatusCode::kFailedPrecondition));
}

// ---- version skew (docs/operations.md, "Upgrade") ----

// The body an agent of protocol 1.1 sent, as captured (test/data/agent-protocol-1.1).
std::string ProtocolFixture(const std::string& name) {
  std::ifstream in(std::string(GPUFLEET_AGENT_PROTOCOL_FIXTURES) + "/" + name);
  EXPECT_TRUE(in.good()) << name;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The previous release's agent against this server: the exact bodies an agent of protocol 1.1
// sent (captured from `gpufleet agent` at commit 1490365), replayed in order. The server
// registers it, places a job on its GPUs and sends it the task in a heartbeat's answer, keeps
// the node Ready, and counts the agent under protocol 1.1 in /metrics.
TEST_F(NodeAgentTest, AnAgentOfTheLastReleaseIsServed) {
  Result<Json> registered =
      client_->Post("/v1/agents/register", ProtocolFixture("register.json"), "application/json");
  ASSERT_OK(registered);
  ASSERT_OK(wire::ParseAgentReply(registered->dump()));
  Submit(JobYaml("skew", 1, 3600000));
  EXPECT_EQ(wire::StrOr(Job("skew"), "state"), "Scheduled");

  std::vector<std::string> sent_tasks;
  for (const char* heartbeat : {"heartbeat-1.json", "heartbeat-2.json", "heartbeat-3.json"}) {
    SCOPED_TRACE(heartbeat);
    Result<Json> answer = client_->Post("/v1/agents/old-agent-0/heartbeat",
                                        ProtocolFixture(heartbeat), "application/json");
    ASSERT_OK(answer);
    const Result<wire::AgentReply> reply = wire::ParseAgentReply(answer->dump());
    ASSERT_OK(reply);
    ASSERT_EQ(reply->tasks.size(), 1u);
    sent_tasks.push_back(reply->tasks[0].id);
    ASSERT_EQ(reply->tasks[0].gpu_uuids.size(), 1u);
    EXPECT_THAT(ProtocolFixture("register.json"), HasSubstr(reply->tasks[0].gpu_uuids[0]));
  }
  EXPECT_EQ(sent_tasks, std::vector<std::string>(3, "skew/main-0/1"));
  EXPECT_EQ(wire::StrOr(Node("old-agent-0"), "state"), "Ready");

  api::ApiRequest metrics;
  metrics.method = "GET";
  metrics.path = "/metrics";
  metrics.authorization = "Bearer " + admin_;
  EXPECT_THAT(server_->Handle(metrics).body, HasSubstr("gpufleet_agents{protocol=\"1.1\"} 1\n"));
}

// An agent newer than the server (the agents upgraded first), or older than the one minor the
// server still serves, is refused before anything is written, with both versions named.
TEST_F(NodeAgentTest, AnAgentOutsideTheSkewPolicyIsRefusedNamingBothVersions) {
  Result<Json> registration = wire::ParseJson(ProtocolFixture("register.json"));
  ASSERT_OK(registration);
  (*registration)["protocol"] = "1.3";
  (*registration)["agent_version"] = "0.3.0 (commit 0123abc)";
  EXPECT_THAT(client_->Post("/v1/agents/register", registration->dump(), "application/json"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 1.3 (agent 0.3.0 (commit 0123abc)) is newer than "
                                 "this server's 1.2: upgrade the servers before the agents")));
  // A field this server does not know, as a newer agent may add: still the version's refusal.
  (*registration)["node_class"] = "gpu";
  EXPECT_THAT(client_->Post("/v1/agents/register", registration->dump(), "application/json"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 1.3 (agent 0.3.0 (commit 0123abc)) is newer")));
  registration->erase("node_class");
  (*registration)["protocol"] = "0.9";
  EXPECT_THAT(client_->Post("/v1/agents/register", registration->dump(), "application/json"),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 0.9 (agent 0.3.0 (commit 0123abc)) is too old for "
                                 "this server's 1.2 (it serves 1.1 to 1.2): upgrade the agent")));
  EXPECT_THAT(admin_client_->Get("/v1/nodes/old-agent-0"), StatusIs(StatusCode::kNotFound));

  // This build's agent registers; then its heartbeats claiming 1.3 are refused too.
  EXPECT_OK(agent_->Register());
  agent_protocol_ = "1.3";
  EXPECT_THAT(agent_->Heartbeat(),
              StatusIs(StatusCode::kFailedPrecondition,
                       HasSubstr("agent protocol 1.3 is newer than this server's 1.2")));
}

// A refused agent backs off, doubling its wait up to five minutes, instead of asking every five
// seconds; once served, a later failure waits the usual five seconds again.
TEST_F(NodeAgentTest, ARefusedAgentBacksOff) {
  agent_protocol_ = "1.3";
  AgentLoop loop(*agent_, clock_);
  std::vector<int64_t> waits;
  for (int call = 0; call < 8; ++call) {
    AgentLoop::Step step = loop.RunOnce();
    while (!step.called_server) {
      clock_.Advance(step.wait);
      step = loop.RunOnce();
    }
    ASSERT_TRUE(wire::IsAgentProtocolRefusal(step.call)) << step.call.ToString();
    waits.push_back(std::chrono::duration_cast<std::chrono::seconds>(step.retry_in).count());
    clock_.Advance(step.wait);
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{5, 10, 20, 40, 80, 160, 300, 300}));

  agent_protocol_.clear();
  clock_.Advance(AgentLoop::kMaxRetryAfterRefusal);
  AgentLoop::Step served = loop.RunOnce();
  ASSERT_OK(served.call);
  EXPECT_TRUE(served.registered_now);
  partitioned_ = true;
  clock_.Advance(agent_->heartbeat_interval());
  AgentLoop::Step cut = loop.RunOnce();
  ASSERT_TRUE(cut.called_server);
  EXPECT_THAT(cut.call, StatusIs(StatusCode::kUnavailable));
  EXPECT_EQ(cut.retry_in, AgentLoop::kRetryAfterFailure);
}

// Hands requests to `inner` and adds `wanted` to each heartbeat's answer, as a server that asks
// for diagnostics does; keeps the "diagnostics" of every heartbeat sent.
class DiagnosticsAskingTransport final : public http::Transport {
 public:
  DiagnosticsAskingTransport(std::unique_ptr<http::Transport> inner, const Json& wanted,
                             std::vector<Json>& reported)
      : inner_(std::move(inner)), wanted_(wanted), reported_(reported) {}
  Result<http::HttpResponse> Send(std::string_view method, std::string_view path,
                                  std::string_view body, std::string_view content_type,
                                  std::string_view token) override {
    GPUFLEET_ASSIGN_OR_RETURN(http::HttpResponse response,
                              inner_->Send(method, path, body, content_type, token));
    if (path.ends_with("/heartbeat") && response.status == 200) {
      GPUFLEET_ASSIGN_OR_RETURN(const Json sent, wire::ParseJson(body));
      reported_.push_back(sent.value("diagnostics", Json::array()));
      GPUFLEET_ASSIGN_OR_RETURN(Json reply, wire::ParseJson(response.body));
      if (!wanted_.empty()) {
        reply["diagnostics"] = wanted_;
      }
      response.body = reply.dump();
    }
    return response;
  }

 private:
  std::unique_ptr<http::Transport> inner_;
  const Json& wanted_;
  std::vector<Json>& reported_;
};

// Issue 36: the agent's side of active diagnostics, on two simulated GPUs whose fault model's
// diagnostic always finds a fault and never invents one.
class NodeAgentDiagnosticsTest : public NodeAgentTest {
 protected:
  void SetUp() override {
    NodeAgentTest::SetUp();
    Result<std::unique_ptr<SimulatedProbe>> probe = SimulatedProbe::Create(
        clock_, catalog_,
        {.gpu_count = 2, .diagnostic_sensitivity = 1.0, .diagnostic_false_positive_rate = 0.0});
    ASSERT_OK(probe);
    diag_probe_ = std::move(probe).value();
    Result<std::unique_ptr<TelemetrySampler>> sampler =
        TelemetrySampler::Create({.probe = *diag_probe_, .clock = clock_});
    ASSERT_OK(sampler);
    diag_sampler_ = std::move(sampler).value();
    ASSERT_OK(diag_sampler_->SampleOnce());
    const std::string token =
        *server_->authenticator().CreateToken(control::Role::kAgent, "", "agent");
    diag_client_ = std::make_unique<http::ApiClient>(
        std::make_unique<DiagnosticsAskingTransport>(std::make_unique<InProcessTransport>(*server_),
                                                     wanted_, reported_),
        "in-process", token);
  }

  // The agent of node-a over the two GPUs, running diagnostics with `diagnostics`.
  std::unique_ptr<NodeAgent> DiagnosingAgent(DiagnosticRunner& diagnostics) {
    NodeAgentOptions options;
    options.node_name = "node-a";
    options.topology_levels = {"leaf"};
    options.topology_values = {"leaf-0"};
    options.capacity = {64000, 512 * 1024};
    options.log_dir = log_dir_;
    options.diagnostics = &diagnostics;
    return std::make_unique<NodeAgent>(options, *diag_sampler_, *diag_probe_, *runner_,
                                       *diag_client_, catalog_, clock_);
  }

  Json Wanted(const std::string& id, int index, const std::string& uuid,
              const std::string& kind = "builtin") {
    return Json{{"id", id}, {"gpu_index", index}, {"gpu_uuid", uuid}, {"kind", kind}};
  }
  std::string Uuid(int index) {
    return diag_sampler_->LatestSnapshot()->gpus[index].reading.info.uuid;
  }

  // Heartbeats (real time passing between them: diagnostics run on threads of their own) until
  // the last one reported no diagnostic Running; that report.
  Json BeatUntilDiagnosticsEnd(NodeAgent& agent) {
    for (int beat = 0; beat < 500; ++beat) {
      EXPECT_OK(agent.Heartbeat());
      const bool running = std::any_of(reported_.back().begin(), reported_.back().end(),
                                       [](const Json& d) { return d["phase"] == "Running"; });
      if (!running && beat > 0) {
        return reported_.back();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "diagnostics still running";
    return reported_.back();
  }

  std::unique_ptr<SimulatedProbe> diag_probe_;
  std::unique_ptr<TelemetrySampler> diag_sampler_;
  std::unique_ptr<http::ApiClient> diag_client_;
  Json wanted_ = Json::array();
  std::vector<Json> reported_;
};

TEST_F(NodeAgentDiagnosticsTest, RunsWhatTheServerAsksAndReportsEachVerdictUntilItIsTaken) {
  ASSERT_OK(diag_probe_->SetLatentFault(1, true));
  DiagnosticRunner diagnostics({}, *diag_sampler_, diag_probe_.get(), clock_);
  std::unique_ptr<NodeAgent> agent = DiagnosingAgent(diagnostics);
  ASSERT_OK(agent->Register());
  EXPECT_EQ(Node("node-a")["labels"][std::string(wire::kDiagnosticsLabel)], "true");

  wanted_ = {Wanted("d-0", 0, Uuid(0)), Wanted("d-1", 1, Uuid(1)),
             Wanted("d-x", 1, "GPU-elsewhere")};
  const Json report = BeatUntilDiagnosticsEnd(*agent);
  ASSERT_EQ(report.size(), 3u) << report.dump();
  EXPECT_EQ(report[0]["id"], "d-0");
  EXPECT_EQ(report[0]["phase"], "Passed") << report.dump();
  EXPECT_EQ(report[1]["phase"], "Failed");
  EXPECT_THAT(report[1]["summary"].get<std::string>(), HasSubstr("simulated.exercise"));
  EXPECT_EQ(report[2]["phase"], "Unavailable");
  EXPECT_THAT(report[2]["summary"].get<std::string>(),
              HasSubstr("no GPU GPU-elsewhere at index 1"));

  // Each id runs once: still asked, it is reported, not run again.
  ASSERT_OK(agent->Heartbeat());
  EXPECT_EQ(reported_.back(), report);
  // No longer asked: the server has the verdicts, the agent forgets them.
  wanted_ = Json::array();
  ASSERT_OK(agent->Heartbeat());
  ASSERT_OK(agent->Heartbeat());
  EXPECT_EQ(reported_.back(), Json::array());
}

TEST_F(NodeAgentDiagnosticsTest, ADiagnosticAndATaskNeverShareAGpu) {
  SystemClock command_clock;  // the site command runs in real time
  DiagnosticRunner diagnostics({.command = {"/bin/sh", "-c", "sleep 1; echo 'all tests pass'"}},
                               *diag_sampler_, diag_probe_.get(), command_clock);
  std::unique_ptr<NodeAgent> agent = DiagnosingAgent(diagnostics);
  ASSERT_OK(agent->Register());
  ASSERT_OK(server_->RunSchedulingCycle());

  // A task holds both GPUs: the diagnostic waits for it.
  Submit(JobYaml("train", 2, 2000));
  ASSERT_OK(agent->Heartbeat());
  wanted_ = {Wanted("d-0", 0, Uuid(0), "command")};
  ASSERT_OK(agent->Heartbeat());
  ASSERT_OK(agent->Heartbeat());
  ASSERT_EQ(reported_.back().size(), 1u);
  EXPECT_EQ(reported_.back()[0]["phase"], "Waiting");
  EXPECT_THAT(reported_.back()[0]["summary"].get<std::string>(),
              HasSubstr("is held by task train/main-0/1"));

  // The task ends; the diagnostic starts, and a new task on its GPU waits for it.
  clock_.Advance(std::chrono::seconds(3));
  ASSERT_OK(agent->Heartbeat());
  ASSERT_OK(agent->Heartbeat());
  EXPECT_EQ(Job("train")["state"], "Succeeded");
  ASSERT_EQ(reported_.back()[0]["phase"], "Running");
  Submit(JobYaml("next", 2, 3600 * 1000));
  ASSERT_OK(agent->Heartbeat());
  EXPECT_EQ(Task(runner_->Poll(), "next/main-0/1"), nullptr) << "started beside a diagnostic";
  ASSERT_OK(agent->Heartbeat());
  EXPECT_THAT(Events("jobs", "next"), HasSubstr(" is under diagnostic d-0"));

  const Json report = BeatUntilDiagnosticsEnd(*agent);
  EXPECT_EQ(report[0]["phase"], "Passed") << report.dump();
  EXPECT_EQ(report[0]["output"], "all tests pass\n");
  EXPECT_EQ(report[0]["exit_code"], 0);
  ASSERT_OK(agent->Heartbeat());
  EXPECT_NE(Task(runner_->Poll(), "next/main-0/1"), nullptr);
}

}  // namespace
}  // namespace gpufleet::agent
