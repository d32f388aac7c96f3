// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpufleet/agent/agent_loop.h"
#include "gpufleet/agent/node_agent.h"
#include "gpufleet/agent/simulated_probe.h"
#include "gpufleet/agent/telemetry.h"
#include "gpufleet/api/server.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/resources.h"
#include "gpufleet/fleetsim/task_ledger.h"
#include "gpufleet/http/client.h"
#include "gpufleet/runner/simulated_runner.h"
#include "gpufleet/store/memory_election.h"
#include "gpufleet/store/memory_store.h"

// A whole fleet in one process on simulated time (docs/simulation.md): the production server
// (api::ApiServer on an in-memory store, its cycle run by the fleet; with several, the servers of
// docs/ha.md electing a leader on the shared store, with fencing), and per node the production
// agent (NodeAgent on AgentLoop's schedule) with the simulated probe and task runner, all on one
// FakeClock, exchanging the agent protocol's messages through an in-process link that can lose,
// delay, duplicate and reorder them, following the leader as the real agent does
// (http::NewLeaderFollowingTransport). One thread; the same seed gives the same run.
namespace gpufleet::fleetsim {

// What the link between the agents and the server does to a message, as probabilities per
// request. A delayed request is answered as timed out and reaches the server later, after the
// requests sent meanwhile (reordering).
struct LinkFaults {
  double lose_request = 0;
  double lose_reply = 0;
  double duplicate = 0;
  double delay = 0;
  Duration max_delay = std::chrono::seconds(20);
};

// A decorator the fleet puts between a node's agent and its runner (the planted bugs of the
// chaos tests); null: none.
using RunnerWrapper = std::function<std::unique_ptr<runner::TaskRunner>(runner::TaskRunner& inner)>;
// A decorator of the fleet's store as the server sees it; null: none.
using StoreWrapper = std::function<std::unique_ptr<store::StateStore>(store::StateStore& inner)>;

struct FleetOptions {
  int nodes = 4;
  int gpus_per_node = 4;
  std::string gpu_model = "H100-80GB";
  // What each node's agent offers besides its GPUs.
  HostResources node_capacity{.cpu_milli = 64'000, .memory_mib = 512 * 1024};
  uint64_t seed = 1;
  // The server's settings that matter under faults (api::ApiServer::Options).
  std::chrono::milliseconds cycle_interval{1000};
  std::chrono::milliseconds heartbeat_interval{10000};
  std::chrono::milliseconds node_timeout{40000};
  std::chrono::milliseconds stop_grace{30000};
  std::chrono::seconds gang_start_timeout{120};
  // The server's placement policy (scheduler::PlacementPolicyNames); empty: the server's default.
  std::string placement_policy;
  // Event-driven time (docs/simulator.md): Advance runs only what is due instead of every agent
  // each second. An agent wakes at its heartbeat, when one of its tasks ends (it reports the end
  // at once) and when a job write names its node (it fetches its new desired tasks at once, as
  // if the server pushed them); the server cycles when something outside its cycle was committed
  // (a submission, an agent's report) and every cycle_interval otherwise, for its deadlines.
  // NextDue says when the next of these comes. For fault-free runs over long simulated spans
  // (`gpufleet sim replay --engine control-plane`): one server, no clock drift, and no link
  // faults, since an agent checks its lease only when it wakes.
  bool event_driven = false;
  // Servers on the one store. With more than one they campaign for a leader lease
  // (store::MemoryLease, `gpufleet server`'s --leader-lease-ms and --leader-renew-ms defaults)
  // and only the leader's commits land.
  int servers = 1;
  std::chrono::milliseconds leader_lease{5000};
  std::chrono::milliseconds leader_renew{1000};
  // Whether the store refuses the commits of a server without the lease (false: a planted bug).
  bool fence_commits = true;
  // The agents' stop grace (NodeAgentOptions::stop_grace); their fence margin is the default.
  Duration agent_stop_grace = std::chrono::seconds(30);
  // Each node's clock runs at a rate drawn from [1 - max_drift, 1 + max_drift].
  double max_drift = 0;
  // Nodes sit in leaves of this many nodes, leaves in blocks of 8 (topology levels block and
  // leaf); 0: no topology.
  int nodes_per_leaf = 0;
  // Times the server's cycles and its answers to agent requests on this clock (request_seconds());
  // null: not timed. A real clock (SystemClock) for `gpufleet sim fleet`; never the simulated one.
  const Clock* request_timer = nullptr;
  RunnerWrapper runner_wrapper;
  StoreWrapper store_wrapper;
};

class SimFleet {
 public:
  // kInvalidArgument for a bad option; the server's or a node's error if one cannot be made.
  static Result<std::unique_ptr<SimFleet>> Create(FleetOptions options);
  ~SimFleet();
  SimFleet(const SimFleet&) = delete;
  SimFleet& operator=(const SimFleet&) = delete;

  // Advances the clock by `step` and runs what is due at the new time, in a fixed order: delayed
  // messages, each live agent's loop (node order), each running server's loop step and campaign
  // (server order). A server deposed by another is ended and started again, as its service
  // manager would.
  Status Advance(Duration step);
  // With event_driven: the earliest time at which Advance has something to run (now when a node
  // or the server has news); otherwise now plus one second, the per-second step.
  MonoTime NextDue() const;

  // An admin's request, as the CLI sends it to every server listed (no link faults), the leader
  // followed: its answer, or kUnavailable when no server answers.
  Result<api::ApiResponse> AdminRequest(std::string_view method, std::string_view path,
                                        std::string_view body);

  // Faults.
  // The agent process of `node` ends; its tasks keep running (they hold their lease themselves).
  void CrashAgent(int node);
  // A new agent process on `node` (with the node credential the last one saved), on its probe of
  // `gpus` GPUs (fewer than before: a GPU fell off the bus; its task, if any, dies with it).
  Status RestartAgent(int node, std::optional<int> gpus = std::nullopt);
  // No message between `node` and the server gets through until `until`.
  void CutOff(int node, MonoTime until);
  // Server `index`'s process ends (without saving anything beyond what the store holds); while
  // it is down its address refuses connections.
  void CrashServer(int index);
  // A new process of server `index` on the same store (a new campaigner: its old term is over).
  Status RestartServer(int index);
  // Server `index`'s process stops until `until` (SIGSTOP, a long pause): it campaigns, cycles
  // and answers nothing meanwhile (requests to it time out), and on waking runs its loop step
  // before its next campaign, as a thread that slept through the loss of its lease would.
  void PauseServer(int index, MonoTime until);
  void SetLinkFaults(LinkFaults faults) { link_faults_ = faults; }

  const Clock& clock() const { return clock_; }
  MonoTime Now() const { return clock_.Now(); }
  int server_count() const { return static_cast<int>(servers_.size()); }
  bool server_up(int index) const;
  bool server_paused(int index) const;
  // The server that leads now, if any.
  std::optional<int> Leader() const;
  // The store as it is (no server's fencing).
  store::StateStore& store() { return *served_store_; }
  const TaskLedger& ledger() const { return ledger_; }
  EventLog& events() { return events_; }
  int node_count() const { return static_cast<int>(nodes_.size()); }
  bool agent_up(int node) const;
  // Requests the link lost, delayed or duplicated, by kind, and requests delivered.
  const std::map<std::string, int>& link_counts() const { return link_counts_; }
  // With a request_timer: the real time of each scheduling cycle ("cycle") and of the server's
  // answer to each agent request, by kind ("register", "heartbeat", "provenance"), in seconds.
  const std::map<std::string, std::vector<double>>& request_seconds() const {
    return request_seconds_;
  }
  void ClearRequestTimes() { request_seconds_.clear(); }
  // The number of times a node's runner started a task.
  size_t task_runs() const { return ledger_.spans().size(); }
  // The tasks still running on any node.
  int LiveTasks();

  // Sends one agent request over the link to server `server` (what each node's transport calls).
  Result<http::HttpResponse> SendFromNode(int node, int server, std::string_view method,
                                          std::string_view path, std::string_view body,
                                          std::string_view token);
  // An admin's request to server `server`, straight.
  Result<http::HttpResponse> SendFromAdmin(int server, std::string_view method,
                                           std::string_view path, std::string_view body,
                                           std::string_view token);

 private:
  struct Node;
  struct Server;
  struct DelayedRequest {
    MonoTime due;
    uint64_t order;
    int node;
    int server;
    api::ApiRequest request;
  };

  explicit SimFleet(FleetOptions options);
  Status StartServer(int index);
  Status StartAgent(Node& node);
  // The agents' and the admin's way to the servers: one in-process transport per server, the
  // leader followed.
  std::unique_ptr<http::Transport> ServerTransports(int node);
  Status RunServer(int index, MonoTime now);
  // Event-driven: one node's wake-up, if anything is due for it at `now`.
  Status WakeNodeOnEvent(Node& node, MonoTime now);
  // Event-driven: what a commit means for the agents and the server (CommitObserver).
  class CommitWatcher;
  void NoteCommit(const store::WriteBatch& batch);
  Result<http::HttpResponse> Deliver(int server, const api::ApiRequest& request);
  // The request timer's reading (MonoTime{} without one), and the time since `started` added to
  // request_seconds_[kind] when there is a timer.
  MonoTime TimerNow() const;
  void RecordTime(std::string_view kind, MonoTime started);

  FleetOptions options_;
  FakeClock clock_;
  Random random_;
  GpuCatalog catalog_;
  EventLog events_;
  store::InMemoryStateStore store_;
  std::unique_ptr<store::StateStore> wrapped_store_;
  store::StateStore* served_store_ = &store_;
  std::unique_ptr<store::MemoryLease> lease_;  // with several servers
  std::vector<std::unique_ptr<Server>> servers_;
  std::unique_ptr<http::Transport> admin_transport_;
  std::string admin_token_;
  std::string join_token_;
  TaskLedger ledger_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::map<std::string, int, std::less<>> node_index_;
  // Event-driven: the watcher of the store's commits, the nodes a job write named since their
  // last wake-up, whether something was committed outside a cycle since the last one, and what
  // runs now (the cycle, or the node whose agent is calling).
  std::unique_ptr<CommitWatcher> commit_watcher_;
  std::set<int> nodes_with_news_;
  std::map<std::string, std::string> agents_view_of_jobs_;  // by job key, see NoteCommit
  bool server_has_news_ = false;
  bool in_cycle_ = false;
  int calling_node_ = -1;
  LinkFaults link_faults_;
  std::vector<DelayedRequest> delayed_;
  uint64_t delayed_order_ = 0;
  std::map<std::string, int> link_counts_;
  std::map<std::string, std::vector<double>> request_seconds_;
};

// An api::ApiRequest for "METHOD PATH?QUERY" with a bearer `token` and `body`, as the HTTP server
// hands it over (http::ParseTarget: kInvalidArgument for a target it refuses).
Result<api::ApiRequest> MakeApiRequest(std::string_view method, std::string_view target,
                                       std::string_view body, std::string_view token);

}  // namespace gpufleet::fleetsim
