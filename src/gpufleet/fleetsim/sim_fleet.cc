// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/sim_fleet.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include <fmt/core.h>

#include "gpufleet/http/server.h"

namespace gpufleet::fleetsim {
namespace {

// Simulated time starts here rather than at 0, which some readers take for "never".
constexpr MonoTime kSimulationStart{int64_t{1'000'000'000'000}};

// One node's end of the link: every request goes through the fleet.
class NodeTransport final : public http::Transport {
 public:
  NodeTransport(SimFleet& fleet, int node) : fleet_(fleet), node_(node) {}
  Result<http::HttpResponse> Send(std::string_view method, std::string_view path,
                                  std::string_view body, std::string_view /*content_type*/,
                                  std::string_view token) override {
    return fleet_.SendFromNode(node_, method, path, body, token);
  }

 private:
  SimFleet& fleet_;
  int node_;
};

}  // namespace

Result<api::ApiRequest> MakeApiRequest(std::string_view method, std::string_view target,
                                       std::string_view body, std::string_view token) {
  GPUFLEET_ASSIGN_OR_RETURN(api::ApiRequest request, http::ParseTarget(target));
  request.method = std::string(method);
  request.target = std::string(target);
  if (!token.empty()) {
    request.authorization = fmt::format("Bearer {}", token);
    request.headers.emplace_back("authorization", request.authorization);
  }
  request.body = std::string(body);
  return request;
}

struct SimFleet::Node {
  int index = 0;
  std::string name;
  int gpus = 0;
  std::unique_ptr<DriftingClock> clock;
  // The machine: its GPUs and its processes, which outlive any agent process.
  std::unique_ptr<agent::SimulatedProbe> probe;
  std::unique_ptr<runner::SimulatedRunner> runner;
  std::unique_ptr<LedgerRunner> ledger_runner;
  std::unique_ptr<runner::TaskRunner> wrapped_runner;
  // The agent process.
  std::unique_ptr<agent::TelemetrySampler> sampler;
  std::unique_ptr<http::ApiClient> client;
  std::unique_ptr<agent::NodeAgent> agent;
  std::unique_ptr<agent::AgentLoop> loop;
  MonoTime next_wake;
  MonoTime cut_until;
  // What the agent keeps in its state directory across restarts.
  std::string node_token;

  runner::TaskRunner& agent_runner() {
    return wrapped_runner != nullptr ? *wrapped_runner : *ledger_runner;
  }
};

SimFleet::SimFleet(FleetOptions options)
    : options_(std::move(options)),
      clock_(kSimulationStart),
      random_(options_.seed),
      catalog_(GpuCatalog::Default()),
      events_(clock_),
      next_cycle_(clock_.Now()),
      ledger_(&events_) {}

SimFleet::~SimFleet() {
  // The agents hold clients into this fleet; they go before the server.
  nodes_.clear();
  server_.reset();
}

Result<std::unique_ptr<SimFleet>> SimFleet::Create(FleetOptions options) {
  if (options.nodes < 1 || options.gpus_per_node < 1) {
    return InvalidArgumentError(fmt::format("nodes {} and gpus_per_node {}: both must be >= 1",
                                            options.nodes, options.gpus_per_node));
  }
  if (options.max_drift < 0 || options.max_drift >= 0.5) {
    return InvalidArgumentError(
        fmt::format("max_drift: {} (must be in [0, 0.5))", options.max_drift));
  }
  std::unique_ptr<SimFleet> fleet(new SimFleet(std::move(options)));
  if (fleet->options_.store_wrapper) {
    fleet->wrapped_store_ = fleet->options_.store_wrapper(fleet->store_);
    fleet->served_store_ = fleet->wrapped_store_.get();
  }
  GPUFLEET_RETURN_IF_ERROR(fleet->MakeServer());
  GPUFLEET_ASSIGN_OR_RETURN(fleet->admin_token_, fleet->server_->authenticator().CreateToken(
                                                     control::Role::kAdmin, "", "chaos-admin"));
  GPUFLEET_ASSIGN_OR_RETURN(fleet->join_token_, fleet->server_->authenticator().CreateToken(
                                                    control::Role::kAgent, "", "chaos-agents"));
  const FleetOptions& opts = fleet->options_;
  for (int i = 0; i < opts.nodes; ++i) {
    auto node = std::make_unique<Node>();
    node->index = i;
    node->name = fmt::format("node-{}", i);
    node->gpus = opts.gpus_per_node;
    const double drift = opts.max_drift * (2 * fleet->random_.UniformDouble() - 1);
    node->clock = std::make_unique<DriftingClock>(fleet->clock_, 1 + drift);
    GPUFLEET_ASSIGN_OR_RETURN(
        node->probe,
        agent::SimulatedProbe::Create(
            *node->clock, fleet->catalog_,
            {.model = opts.gpu_model, .gpu_count = node->gpus, .seed = opts.seed * 1000 + i}));
    node->runner = std::make_unique<runner::SimulatedRunner>(*node->clock);
    node->ledger_runner =
        std::make_unique<LedgerRunner>(*node->runner, fleet->ledger_, node->name, *node->clock);
    if (opts.runner_wrapper) {
      node->wrapped_runner = opts.runner_wrapper(*node->ledger_runner);
    }
    node->next_wake = fleet->clock_.Now();
    node->cut_until = fleet->clock_.Now();
    GPUFLEET_RETURN_IF_ERROR(fleet->StartAgent(*node));
    fleet->nodes_.push_back(std::move(node));
  }
  return fleet;
}

Status SimFleet::MakeServer() {
  api::ApiServer::Options server_options{
      .store = *served_store_, .catalog = catalog_, .clock = clock_, .wall_clock = &clock_};
  server_options.cycle_interval = options_.cycle_interval;
  server_options.seed = options_.seed;
  server_options.heartbeat_interval = options_.heartbeat_interval;
  server_options.node_timeout = options_.node_timeout;
  server_options.stop_grace = options_.stop_grace;
  server_options.gang_start_timeout = options_.gang_start_timeout;
  server_options.history_interval = std::chrono::milliseconds(0);
  GPUFLEET_ASSIGN_OR_RETURN(server_, api::ApiServer::Create(std::move(server_options)));
  next_cycle_ = clock_.Now();
  return Status::Ok();
}

Status SimFleet::StartAgent(Node& node) {
  GPUFLEET_ASSIGN_OR_RETURN(node.sampler,
                            agent::TelemetrySampler::Create({.probe = *node.probe,
                                                             .clock = *node.clock,
                                                             .interval = std::chrono::seconds(1),
                                                             .hostname = node.name}));
  GPUFLEET_RETURN_IF_ERROR(node.sampler->SampleOnce());
  node.client = std::make_unique<http::ApiClient>(
      std::make_unique<NodeTransport>(*this, node.index), "in-process", join_token_);
  agent::NodeAgentOptions agent_options;
  agent_options.node_name = node.name;
  if (options_.nodes_per_leaf > 0) {
    constexpr int kLeavesPerBlock = 8;
    const int leaf = node.index / options_.nodes_per_leaf;
    agent_options.topology_levels = {"block", "leaf"};
    agent_options.topology_values = {fmt::format("block-{}", leaf / kLeavesPerBlock),
                                     fmt::format("leaf-{}", leaf)};
  }
  agent_options.capacity = {.cpu_milli = 64'000, .memory_mib = 512 * 1024};
  agent_options.stop_grace = options_.agent_stop_grace;
  agent_options.node_token = node.node_token;
  node.agent =
      std::make_unique<agent::NodeAgent>(std::move(agent_options), *node.sampler, *node.probe,
                                         node.agent_runner(), *node.client, catalog_, *node.clock);
  node.loop = std::make_unique<agent::AgentLoop>(*node.agent, *node.clock);
  node.next_wake = clock_.Now();
  return Status::Ok();
}

MonoTime SimFleet::TimerNow() const {
  return options_.request_timer != nullptr ? options_.request_timer->Now() : MonoTime{};
}

void SimFleet::RecordTime(std::string_view kind, MonoTime started) {
  if (options_.request_timer != nullptr) {
    request_seconds_[std::string(kind)].push_back(
        std::chrono::duration<double>(options_.request_timer->Now() - started).count());
  }
}

bool SimFleet::agent_up(int node) const {
  return nodes_.at(node)->agent != nullptr;
}

int SimFleet::LiveTasks() {
  for (auto& node : nodes_) {
    node->ledger_runner->Poll();
  }
  return static_cast<int>(ledger_.live());
}

Status SimFleet::Advance(Duration step) {
  clock_.Advance(step);
  const MonoTime now = clock_.Now();
  // Delayed requests that are due, in the order they were sent.
  std::sort(delayed_.begin(), delayed_.end(), [](const DelayedRequest& a, const DelayedRequest& b) {
    return std::tie(a.due.nanos, a.order) < std::tie(b.due.nanos, b.order);
  });
  size_t due = 0;
  while (due < delayed_.size() && delayed_[due].due <= now) {
    const DelayedRequest& late = delayed_[due];
    events_.Add(fmt::format("{}: delayed {} {} arrives", nodes_[late.node]->name,
                            late.request.method, late.request.path));
    (void)Deliver(late.request);
    ++due;
  }
  delayed_.erase(delayed_.begin(), delayed_.begin() + static_cast<std::ptrdiff_t>(due));

  for (auto& node : nodes_) {
    if (node->agent == nullptr || node->next_wake > now) {
      continue;
    }
    GPUFLEET_RETURN_IF_ERROR(node->sampler->SampleOnce());
    const agent::AgentLoop::Step result = node->loop->RunOnce();
    if (result.fenced > 0) {
      events_.Add(fmt::format("{}: lease expired, {} tasks fenced", node->name, result.fenced));
    }
    if (result.registered_now) {
      node->node_token =
          node->agent->node_token().empty() ? node->node_token : node->agent->node_token();
      events_.Add(fmt::format("{}: registered", node->name));
    }
    if (result.called_server && !result.call.ok()) {
      events_.Add(fmt::format("{}: {}", node->name, result.call.ToString()));
    }
    node->next_wake = now + std::max<Duration>(result.wait, std::chrono::milliseconds(1));
  }

  if (server_ != nullptr && now >= next_cycle_) {
    next_cycle_ = now + options_.cycle_interval;
    const MonoTime started = TimerNow();
    Result<int> scheduled = server_->RunSchedulingCycle();
    RecordTime("cycle", started);
    if (!scheduled.ok()) {
      events_.Add(fmt::format("server: cycle failed: {}", scheduled.status().ToString()));
    } else if (*scheduled > 0) {
      events_.Add(fmt::format("server: cycle scheduled {} jobs", *scheduled));
    }
  }
  return Status::Ok();
}

Result<http::HttpResponse> SimFleet::Deliver(const api::ApiRequest& request) {
  if (server_ == nullptr) {
    return UnavailableError("in-process link: the server is down");
  }
  const MonoTime started = TimerNow();
  const api::ApiResponse response = server_->Handle(request);
  const std::string_view path = request.path;
  RecordTime(path.substr(path.rfind('/') + 1), started);
  return http::HttpResponse{.status = response.status,
                            .body = response.body,
                            .content_type = response.content_type,
                            .location = response.location};
}

Result<api::ApiResponse> SimFleet::AdminRequest(std::string_view method, std::string_view path,
                                                std::string_view body) {
  if (server_ == nullptr) {
    return UnavailableError("in-process link: the server is down");
  }
  GPUFLEET_ASSIGN_OR_RETURN(const api::ApiRequest request,
                            MakeApiRequest(method, path, body, admin_token_));
  return server_->Handle(request);
}

Result<http::HttpResponse> SimFleet::SendFromNode(int index, std::string_view method,
                                                  std::string_view path, std::string_view body,
                                                  std::string_view token) {
  Node& node = *nodes_.at(index);
  const MonoTime now = clock_.Now();
  if (now < node.cut_until) {
    ++link_counts_["cut_off"];
    return UnavailableError("in-process link: cut off from the server");
  }
  GPUFLEET_ASSIGN_OR_RETURN(api::ApiRequest request, MakeApiRequest(method, path, body, token));
  // One draw per request, whatever the faults, so that a seed's draws do not shift with them.
  const double fate = random_.UniformDouble();
  const double delay_draw = random_.UniformDouble();
  double threshold = link_faults_.lose_request;
  if (fate < threshold) {
    ++link_counts_["lost_request"];
    events_.Add(fmt::format("{}: {} {} lost", node.name, method, path));
    return UnavailableError("in-process link: request lost");
  }
  threshold += link_faults_.delay;
  if (fate < threshold) {
    ++link_counts_["delayed"];
    const auto delay = Duration(
        static_cast<int64_t>(delay_draw * static_cast<double>(link_faults_.max_delay.count())));
    events_.Add(fmt::format("{}: {} {} delayed {:.1f} s", node.name, method, path,
                            std::chrono::duration<double>(delay).count()));
    delayed_.push_back({.due = now + delay,
                        .order = delayed_order_++,
                        .node = index,
                        .request = std::move(request)});
    return UnavailableError("in-process link: timed out");
  }
  threshold += link_faults_.duplicate;
  if (fate < threshold) {
    ++link_counts_["duplicated"];
    events_.Add(fmt::format("{}: {} {} duplicated", node.name, method, path));
    (void)Deliver(request);
    return Deliver(request);
  }
  threshold += link_faults_.lose_reply;
  if (fate < threshold) {
    ++link_counts_["lost_reply"];
    events_.Add(fmt::format("{}: reply to {} {} lost", node.name, method, path));
    (void)Deliver(request);
    return UnavailableError("in-process link: reply lost");
  }
  ++link_counts_["delivered"];
  return Deliver(request);
}

void SimFleet::CrashAgent(int index) {
  Node& node = *nodes_.at(index);
  events_.Add(fmt::format("{}: agent crashed", node.name));
  node.loop.reset();
  node.agent.reset();
  node.client.reset();
  node.sampler.reset();
}

Status SimFleet::RestartAgent(int index, std::optional<int> gpus) {
  Node& node = *nodes_.at(index);
  if (node.agent != nullptr) {
    CrashAgent(index);
  }
  if (gpus.has_value() && *gpus != node.gpus) {
    GPUFLEET_ASSIGN_OR_RETURN(
        std::unique_ptr<agent::SimulatedProbe> probe,
        agent::SimulatedProbe::Create(*node.clock, catalog_,
                                      {.model = options_.gpu_model,
                                       .gpu_count = *gpus,
                                       .seed = options_.seed * 1000 + node.index}));
    GPUFLEET_ASSIGN_OR_RETURN(const agent::ProbeInventory inventory, probe->Inventory());
    std::set<std::string> present;
    for (const auto& gpu : inventory.gpus) {
      present.insert(gpu.uuid);
    }
    // A task on a GPU that fell off the bus dies with it.
    for (const runner::TaskStatus& task : node.ledger_runner->Poll()) {
      const bool lost_gpu =
          std::any_of(task.gpu_uuids.begin(), task.gpu_uuids.end(),
                      [&](const std::string& uuid) { return !present.count(uuid); });
      if (task.state == runner::TaskState::kRunning && lost_gpu) {
        GPUFLEET_RETURN_IF_ERROR(node.runner->Stop(task.task_id, Duration(0)));
      }
    }
    node.ledger_runner->Poll();
    node.probe = std::move(probe);
    node.gpus = *gpus;
  }
  events_.Add(fmt::format("{}: agent restarted with {} GPUs", node.name, node.gpus));
  return StartAgent(node);
}

void SimFleet::CutOff(int index, MonoTime until) {
  Node& node = *nodes_.at(index);
  node.cut_until = std::max(node.cut_until, until);
  events_.Add(fmt::format("{}: cut off from the server for {:.0f} s", node.name,
                          std::chrono::duration<double>(until - clock_.Now()).count()));
}

void SimFleet::CrashServer() {
  events_.Add("server: crashed");
  server_.reset();
}

Status SimFleet::RestartServer() {
  events_.Add("server: restarted on the store");
  return MakeServer();
}

}  // namespace gpufleet::fleetsim
