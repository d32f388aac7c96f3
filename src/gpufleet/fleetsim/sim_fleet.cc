// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/sim_fleet.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>

#include <fmt/core.h>

#include "gpufleet/agent/diagnostics.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/http/server.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::fleetsim {
namespace {

// Simulated time starts here rather than at 0, which some readers take for "never".
constexpr MonoTime kSimulationStart{int64_t{1'000'000'000'000}};

// wire::JobStateName(JobState::kPending), as NoteCommit compares it with text it scans.
constexpr std::string_view kPendingName = "Pending";

// A node's (or, with node -1, the admin's) link to one server: every request goes through the
// fleet. A server that is down refuses the connection (unreachable: the caller tries the next).
class LinkTransport final : public http::Transport {
 public:
  LinkTransport(SimFleet& fleet, int node, int server)
      : fleet_(fleet), node_(node), server_(server) {}
  Result<http::HttpResponse> Send(std::string_view method, std::string_view path,
                                  std::string_view body, std::string_view /*content_type*/,
                                  std::string_view token) override {
    unreachable_ = !fleet_.server_up(server_);
    if (unreachable_) {
      return UnavailableError(
          fmt::format("in-process link: server {} refuses the connection (down)", server_));
    }
    return node_ < 0 ? fleet_.SendFromAdmin(server_, method, path, body, token)
                     : fleet_.SendFromNode(node_, server_, method, path, body, token);
  }
  bool unreachable() const override { return unreachable_; }

 private:
  SimFleet& fleet_;
  int node_;
  int server_;
  bool unreachable_ = false;
};

std::string ServerAddress(int index) {
  return fmt::format("http://sim-server-{}", index);
}

// What a node's runner holds, task by task: a wake-up that changes it (a task started, stopped
// or forgotten) has something to report.
std::vector<std::pair<std::string, runner::TaskState>> RunnerTasks(runner::TaskRunner& runner) {
  std::vector<std::pair<std::string, runner::TaskState>> tasks;
  for (const runner::TaskStatus& task : runner.Poll()) {
    tasks.emplace_back(task.task_id, task.state);
  }
  return tasks;
}

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

struct SimFleet::Server {
  int index = 0;
  // Each process of the server is a new campaigner.
  int incarnation = 0;
  std::unique_ptr<store::MemoryLeaderElection> election;
  std::unique_ptr<store::FencedStore> fenced_store;
  std::unique_ptr<api::ApiServer> api;  // null while down
  MonoTime next_cycle;
  MonoTime next_campaign;
  MonoTime paused_until;
};

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
  // The diagnostics the server asks for, answered by the probe's fault model within the
  // heartbeat (docs/reliability.md, "Active diagnostics").
  std::unique_ptr<agent::DiagnosticRunner> diagnostics;
  std::unique_ptr<agent::NodeAgent> agent;
  std::unique_ptr<agent::AgentLoop> loop;
  MonoTime next_wake;
  // Event-driven: when the agent loop calls the server next (its heartbeat).
  MonoTime next_call;
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
      ledger_(&events_) {}

class SimFleet::CommitWatcher final : public store::CommitObserver {
 public:
  explicit CommitWatcher(SimFleet& fleet) : fleet_(fleet) {}
  void Committed(const store::WriteBatch& batch) override { fleet_.NoteCommit(batch); }

 private:
  SimFleet& fleet_;
};

SimFleet::~SimFleet() {
  if (commit_watcher_ != nullptr) {
    store_.RemoveObserver(commit_watcher_.get());
  }
  // The agents hold clients into this fleet; they go before the servers.
  nodes_.clear();
  admin_transport_.reset();
  servers_.clear();
}

Result<std::unique_ptr<SimFleet>> SimFleet::Create(FleetOptions options) {
  if (options.nodes < 1 || options.gpus_per_node < 1 || options.servers < 1) {
    return InvalidArgumentError(
        fmt::format("nodes {}, gpus_per_node {} and servers {}: each must be >= 1", options.nodes,
                    options.gpus_per_node, options.servers));
  }
  if (options.servers > 1 && options.leader_renew * 2 > options.leader_lease) {
    return InvalidArgumentError(
        fmt::format("leader_renew {} ms must be at most half of leader_lease {} ms",
                    options.leader_renew.count(), options.leader_lease.count()));
  }
  if (options.max_drift < 0 || options.max_drift >= 0.5) {
    return InvalidArgumentError(
        fmt::format("max_drift: {} (must be in [0, 0.5))", options.max_drift));
  }
  if (options.event_driven && (options.servers != 1 || options.max_drift != 0)) {
    return InvalidArgumentError(
        fmt::format("event_driven: needs one server and no drift (servers {}, max_drift {})",
                    options.servers, options.max_drift));
  }
  std::unique_ptr<SimFleet> fleet(new SimFleet(std::move(options)));
  if (fleet->options_.store_wrapper) {
    fleet->wrapped_store_ = fleet->options_.store_wrapper(fleet->store_);
    fleet->served_store_ = fleet->wrapped_store_.get();
  }
  const FleetOptions& opts = fleet->options_;
  if (opts.event_driven) {
    fleet->commit_watcher_ = std::make_unique<CommitWatcher>(*fleet);
    fleet->store_.AddObserver(fleet->commit_watcher_.get());
  }
  if (opts.servers > 1) {
    fleet->lease_ = std::make_unique<store::MemoryLease>(fleet->clock_, opts.leader_lease);
  }
  for (int i = 0; i < opts.servers; ++i) {
    fleet->servers_.push_back(std::make_unique<Server>());
    fleet->servers_.back()->index = i;
    GPUFLEET_RETURN_IF_ERROR(fleet->StartServer(i));
  }
  // The first server campaigned first: it leads.
  api::ApiServer& first = *fleet->servers_.front()->api;
  GPUFLEET_ASSIGN_OR_RETURN(fleet->admin_token_, first.authenticator().CreateToken(
                                                     control::Role::kAdmin, "", "chaos-admin"));
  GPUFLEET_ASSIGN_OR_RETURN(fleet->join_token_, first.authenticator().CreateToken(
                                                    control::Role::kAgent, "", "chaos-agents"));
  fleet->admin_transport_ = fleet->ServerTransports(-1);
  if (opts.event_driven) {
    // The server's first cycle makes it ready before the agents first register, so that they
    // are not told to come back in five seconds.
    GPUFLEET_RETURN_IF_ERROR(fleet->RunServer(0, fleet->clock_.Now()));
  }
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
    node->next_call = fleet->clock_.Now();
    fleet->node_index_.emplace(node->name, i);
    node->cut_until = fleet->clock_.Now();
    GPUFLEET_RETURN_IF_ERROR(fleet->StartAgent(*node));
    fleet->nodes_.push_back(std::move(node));
  }
  return fleet;
}

std::unique_ptr<http::Transport> SimFleet::ServerTransports(int node) {
  std::vector<http::ServerTransport> servers;
  for (int i = 0; i < server_count(); ++i) {
    servers.push_back({ServerAddress(i), std::make_unique<LinkTransport>(*this, node, i)});
  }
  return http::NewLeaderFollowingTransport(std::move(servers));
}

Status SimFleet::StartServer(int index) {
  Server& server = *servers_.at(index);
  store::StateStore* store = served_store_;
  if (lease_ != nullptr) {
    server.election = std::make_unique<store::MemoryLeaderElection>(
        *lease_, fmt::format("{}/{}", ServerAddress(index), ++server.incarnation),
        ServerAddress(index));
    if (options_.fence_commits) {
      server.fenced_store = std::make_unique<store::FencedStore>(*served_store_, *server.election);
      store = server.fenced_store.get();
    }
  }
  api::ApiServer::Options server_options{
      .store = *store, .catalog = catalog_, .clock = clock_, .wall_clock = &clock_};
  server_options.cycle_interval = options_.cycle_interval;
  server_options.seed = options_.seed;
  server_options.heartbeat_interval = options_.heartbeat_interval;
  server_options.node_timeout = options_.node_timeout;
  server_options.stop_grace = options_.stop_grace;
  server_options.gang_start_timeout = options_.gang_start_timeout;
  // The dashboard history at the production interval: a sample every cycle made its stored
  // document, rewritten whole each time, 41 % of `sim chaos` (`perf record`).
  server_options.history_interval = std::chrono::minutes(1);
  if (options_.event_driven) {
    // No dashboard history: a long replay's server would store a sample a minute for months.
    server_options.history_capacity = 0;
  }
  if (!options_.placement_policy.empty()) {
    server_options.policy = options_.placement_policy;
  }
  server_options.election = server.election.get();
  GPUFLEET_ASSIGN_OR_RETURN(server.api, api::ApiServer::Create(std::move(server_options)));
  if (server.election != nullptr) {
    // As Start does: one campaign before serving, and the leader rebuilds its view at once.
    server.api->Campaign();
    GPUFLEET_RETURN_IF_ERROR(server.api->RunLoopStep().status());
    server.next_campaign = clock_.Now() + options_.leader_renew;
  }
  server.next_cycle = clock_.Now();
  server.paused_until = clock_.Now();
  return Status::Ok();
}

Status SimFleet::StartAgent(Node& node) {
  GPUFLEET_ASSIGN_OR_RETURN(node.sampler,
                            agent::TelemetrySampler::Create({.probe = *node.probe,
                                                             .clock = *node.clock,
                                                             .interval = std::chrono::seconds(1),
                                                             .hostname = node.name}));
  GPUFLEET_RETURN_IF_ERROR(node.sampler->SampleOnce());
  node.client =
      std::make_unique<http::ApiClient>(ServerTransports(node.index), "in-process", join_token_);
  agent::NodeAgentOptions agent_options;
  agent_options.node_name = node.name;
  if (options_.nodes_per_leaf > 0) {
    constexpr int kLeavesPerBlock = 8;
    const int leaf = node.index / options_.nodes_per_leaf;
    agent_options.topology_levels = {"block", "leaf"};
    agent_options.topology_values = {fmt::format("block-{}", leaf / kLeavesPerBlock),
                                     fmt::format("leaf-{}", leaf)};
  }
  agent_options.capacity = options_.node_capacity;
  agent_options.stop_grace = options_.agent_stop_grace;
  agent_options.node_token = node.node_token;
  node.diagnostics = std::make_unique<agent::DiagnosticRunner>(
      agent::DiagnosticOptions{}, *node.sampler, node.probe.get(), *node.clock);
  agent_options.diagnostics = node.diagnostics.get();
  agent_options.diagnostics_inline = true;
  node.agent =
      std::make_unique<agent::NodeAgent>(std::move(agent_options), *node.sampler, *node.probe,
                                         node.agent_runner(), *node.client, catalog_, *node.clock);
  node.loop = std::make_unique<agent::AgentLoop>(*node.agent, *node.clock);
  node.next_wake = clock_.Now();
  node.next_call = clock_.Now();
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

bool SimFleet::server_up(int index) const {
  return servers_.at(index)->api != nullptr;
}

bool SimFleet::server_paused(int index) const {
  return server_up(index) && servers_.at(index)->paused_until > clock_.Now();
}

std::optional<int> SimFleet::Leader() const {
  for (const auto& server : servers_) {
    if (server->api != nullptr && server->paused_until <= clock_.Now() && server->api->leading()) {
      return server->index;
    }
  }
  return std::nullopt;
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
    events_.Add(fmt::format("{}: delayed {} {} arrives at server {}", nodes_[late.node]->name,
                            late.request.method, late.request.path, late.server));
    if (server_up(late.server) && !server_paused(late.server)) {
      (void)Deliver(late.server, late.request);
    }
    ++due;
  }
  delayed_.erase(delayed_.begin(), delayed_.begin() + static_cast<std::ptrdiff_t>(due));

  for (auto& node : nodes_) {
    if (options_.event_driven) {
      GPUFLEET_RETURN_IF_ERROR(WakeNodeOnEvent(*node, now));
      continue;
    }
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

  for (int i = 0; i < server_count(); ++i) {
    GPUFLEET_RETURN_IF_ERROR(RunServer(i, now));
  }
  return Status::Ok();
}

Status SimFleet::RunServer(int index, MonoTime now) {
  Server& server = *servers_[index];
  if (server.api == nullptr || server.paused_until > now) {
    return Status::Ok();
  }
  const std::string name = server_count() > 1 ? fmt::format("server {}", index) : "server";
  // The loop step before the campaign: a server waking from a pause acts on the lease it last
  // saw, and fencing must refuse what it writes.
  if (now >= server.next_cycle || server_has_news_) {
    server.next_cycle = now + options_.cycle_interval;
    const bool led = server.api->leading();
    const MonoTime started = TimerNow();
    server_has_news_ = false;
    in_cycle_ = true;
    Result<int> scheduled = server.api->RunLoopStep();
    in_cycle_ = false;
    RecordTime("cycle", started);
    if (!led && server.api->leading()) {
      events_.Add(fmt::format("{}: leads", name));
    }
    if (!scheduled.ok()) {
      events_.Add(fmt::format("{}: cycle failed: {}", name, scheduled.status().ToString()));
    } else if (*scheduled > 0) {
      events_.Add(fmt::format("{}: cycle scheduled {} jobs", name, *scheduled));
    }
  }
  if (server.election != nullptr && now >= server.next_campaign) {
    server.next_campaign = now + options_.leader_renew;
    server.api->Campaign();
    if (server.api->deposed()) {
      // Its owner ends a deposed server; the service manager starts it again as a follower.
      events_.Add(fmt::format("{}: deposed; started again", name));
      server.api.reset();
      return StartServer(index);
    }
  }
  return Status::Ok();
}

Status SimFleet::WakeNodeOnEvent(Node& node, MonoTime now) {
  // News for an agent that is down is lost with it; its next process registers afresh.
  const bool job_news = nodes_with_news_.erase(node.index) > 0;
  if (node.agent == nullptr) {
    return Status::Ok();
  }
  const std::optional<MonoTime> task_end = node.runner->NextEndTime();
  const bool loop_due = node.next_call <= now;
  const bool news = job_news || (task_end.has_value() && *task_end <= now);
  if (!loop_due && !(news && node.loop->registered())) {
    return Status::Ok();
  }
  const auto tasks_before = RunnerTasks(node.agent_runner());
  calling_node_ = node.index;
  GPUFLEET_RETURN_IF_ERROR(node.sampler->SampleOnce());
  Status call;
  if (loop_due) {
    const agent::AgentLoop::Step result = node.loop->RunOnce();
    call = result.called_server ? result.call : Status::Ok();
    if (result.fenced > 0) {
      events_.Add(fmt::format("{}: lease expired, {} tasks fenced", node.name, result.fenced));
    }
    if (result.registered_now) {
      node.node_token =
          node.agent->node_token().empty() ? node.node_token : node.agent->node_token();
      events_.Add(fmt::format("{}: registered", node.name));
    }
    // The loop's own schedule: its next call after this one.
    node.next_call =
        now + (result.call.ok() ? Duration(node.agent->heartbeat_interval()) : result.retry_in);
  } else {
    // Out of the loop's schedule: the report of a task end, or the fetch of new desired tasks.
    call = node.agent->Heartbeat();
  }
  calling_node_ = -1;
  if (!call.ok()) {
    events_.Add(fmt::format("{}: {}", node.name, call.ToString()));
  }
  // What the call made the agent start or stop is reported at once, not at the next heartbeat.
  if (call.ok() && RunnerTasks(node.agent_runner()) != tasks_before) {
    nodes_with_news_.insert(node.index);
  }
  return Status::Ok();
}

void SimFleet::NoteCommit(const store::WriteBatch& batch) {
  if (!in_cycle_) {
    server_has_news_ = true;
  }
  for (const store::WriteOp& op : batch.ops()) {
    if (op.kind != control::kJobsKind ||
        (op.type != store::WriteOpType::kCreate && op.type != store::WriteOpType::kUpdate)) {
      continue;
    }
    // A waiting job's reason, rewritten as capacity moves, is most writes with a long backlog:
    // read without parsing the document, it is no news to any agent.
    const auto seen_before = agents_view_of_jobs_.find(op.name);
    if (seen_before != agents_view_of_jobs_.end() && seen_before->second == kPendingName &&
        TopLevelString(op.data, "state") == kPendingName &&
        op.data.find("\"placements\"") == std::string::npos) {
      continue;
    }
    const Result<wire::JobRecord> job =
        wire::JobRecordFromJson(wire::ParseDocument(op.data), nullptr);
    if (!job.ok()) {
      continue;
    }
    // What an agent acts on: the state and where each task runs and how it goes. A write that
    // leaves it as it was (a usage stamp) is no news to any agent.
    std::string what_agents_see = wire::JobStateName(job->state);
    for (const wire::PlacementRecord& placement : job->placements) {
      what_agents_see += fmt::format("|{}:{}:{}", placement.node, placement.phase, placement.gone);
    }
    std::string& seen = agents_view_of_jobs_[op.name];
    if (seen == what_agents_see) {
      continue;
    }
    seen = std::move(what_agents_see);
    // The calling agent has its answer in the reply; the others learn of it now.
    for (const wire::PlacementRecord& placement : job->placements) {
      const auto node = node_index_.find(placement.node);
      if (node != node_index_.end() && node->second != calling_node_) {
        nodes_with_news_.insert(node->second);
      }
    }
  }
}

MonoTime SimFleet::NextDue() const {
  const MonoTime now = clock_.Now();
  if (!options_.event_driven) {
    return now + std::chrono::seconds(1);
  }
  if (server_has_news_ || !nodes_with_news_.empty()) {
    return now;
  }
  MonoTime due = now + std::chrono::hours(24 * 365);
  for (const DelayedRequest& late : delayed_) {
    due = std::min(due, late.due);
  }
  for (const auto& node : nodes_) {
    if (node->agent == nullptr) {
      continue;
    }
    due = std::min(due, node->next_call);
    if (const std::optional<MonoTime> end = node->runner->NextEndTime(); end.has_value()) {
      due = std::min(due, *end);
    }
  }
  for (const auto& server : servers_) {
    if (server->api != nullptr) {
      due = std::min(due, std::max(server->next_cycle, server->paused_until));
    }
  }
  return std::max(due, now);
}

Result<http::HttpResponse> SimFleet::Deliver(int index, const api::ApiRequest& request) {
  api::ApiServer* server = servers_.at(index)->api.get();
  if (server == nullptr) {
    return UnavailableError("in-process link: the server is down");
  }
  const MonoTime started = TimerNow();
  const api::ApiResponse response = server->Handle(request);
  const std::string_view path = request.path;
  RecordTime(path.substr(path.rfind('/') + 1), started);
  return http::HttpResponse{.status = response.status,
                            .body = response.body,
                            .content_type = response.content_type,
                            .location = response.location};
}

Result<api::ApiResponse> SimFleet::AdminRequest(std::string_view method, std::string_view path,
                                                std::string_view body) {
  GPUFLEET_ASSIGN_OR_RETURN(
      const http::HttpResponse answer,
      admin_transport_->Send(method, path, body, "application/json", admin_token_));
  return api::ApiResponse{
      .status = answer.status, .content_type = answer.content_type, .body = answer.body};
}

Result<http::HttpResponse> SimFleet::SendFromAdmin(int server, std::string_view method,
                                                   std::string_view path, std::string_view body,
                                                   std::string_view token) {
  if (server_paused(server)) {
    return UnavailableError("in-process link: timed out (the server is paused)");
  }
  GPUFLEET_ASSIGN_OR_RETURN(const api::ApiRequest request,
                            MakeApiRequest(method, path, body, token));
  return Deliver(server, request);
}

Result<http::HttpResponse> SimFleet::SendFromNode(int index, int server, std::string_view method,
                                                  std::string_view path, std::string_view body,
                                                  std::string_view token) {
  Node& node = *nodes_.at(index);
  const MonoTime now = clock_.Now();
  if (server_paused(server)) {
    ++link_counts_["server_paused"];
    return UnavailableError("in-process link: timed out (the server is paused)");
  }
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
                        .server = server,
                        .request = std::move(request)});
    return UnavailableError("in-process link: timed out");
  }
  threshold += link_faults_.duplicate;
  if (fate < threshold) {
    ++link_counts_["duplicated"];
    events_.Add(fmt::format("{}: {} {} duplicated", node.name, method, path));
    (void)Deliver(server, request);
    return Deliver(server, request);
  }
  threshold += link_faults_.lose_reply;
  if (fate < threshold) {
    ++link_counts_["lost_reply"];
    events_.Add(fmt::format("{}: reply to {} {} lost", node.name, method, path));
    (void)Deliver(server, request);
    return UnavailableError("in-process link: reply lost");
  }
  ++link_counts_["delivered"];
  return Deliver(server, request);
}

void SimFleet::CrashAgent(int index) {
  Node& node = *nodes_.at(index);
  events_.Add(fmt::format("{}: agent crashed", node.name));
  node.loop.reset();
  node.agent.reset();
  node.diagnostics.reset();
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

void SimFleet::CrashServer(int index) {
  events_.Add(server_count() > 1 ? fmt::format("server {}: crashed", index) : "server: crashed");
  servers_.at(index)->api.reset();
}

Status SimFleet::RestartServer(int index) {
  events_.Add(server_count() > 1 ? fmt::format("server {}: restarted on the store", index)
                                 : "server: restarted on the store");
  servers_.at(index)->api.reset();
  return StartServer(index);
}

void SimFleet::PauseServer(int index, MonoTime until) {
  Server& server = *servers_.at(index);
  server.paused_until = std::max(server.paused_until, until);
  events_.Add(fmt::format("server {}: paused for {:.0f} s", index,
                          std::chrono::duration<double>(until - clock_.Now()).count()));
}

}  // namespace gpufleet::fleetsim
