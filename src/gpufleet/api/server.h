// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gpufleet/api/auth.h"
#include "gpufleet/api/fleet_history.h"
#include "gpufleet/control/control_plane.h"
#include "gpufleet/control/reliability_controller.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/status.h"
#include "gpufleet/fabric/fabric.h"
#include "gpufleet/http/server.h"
#include "gpufleet/policy/autoscaler.h"
#include "gpufleet/policy/idle_reclaim.h"
#include "gpufleet/policy/queues.h"
#include "gpufleet/policy/workload_history.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/store/leader_election.h"
#include "gpufleet/store/state_store.h"
#include "gpufleet/wire/agent_protocol.h"
#include "gpufleet/wire/json_fields.h"
#include "gpufleet/wire/usage_cost.h"

// The REST server of `gpufleet server` (docs/api.md) and its scheduling loop. This module is the
// only place where a Status becomes an HTTP status.
namespace gpufleet::api {

using wire::Json;

// Request bodies above this are refused with 413.
inline constexpr size_t kMaxRequestBodyBytes = size_t{1} << 20;

// One HTTP request as the HTTP server hands it over (the unit tests call Handle directly).
using ApiRequest = http::Request;

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // The route template for metrics, e.g. "/v1/jobs/{name}".
  std::string route;
  // The Location header of a redirect (a follower's 307 to the leader); empty: none.
  std::string location;
  // The Retry-After header of a 503, in seconds; 0: none.
  int retry_after_s = 0;
  // Further headers: every answer of ApiServer::Handle carries BrowserHeaders().
  std::vector<std::pair<std::string, std::string>> headers;
};

// The headers of every answer the API server gives (the dashboard's files, the API's JSON and
// its errors), for the browsers that read them (docs/dashboard.md, "Security"): a
// Content-Security-Policy that lets the page load its own files only, run no inline script and
// be framed by no one; no MIME sniffing; no Referer sent (the dashboard's `#token=` link); and
// nothing kept in a cache, as answers carry a team's data.
const std::vector<std::pair<std::string, std::string>>& BrowserHeaders();

// The HTTP status of a non-OK code (the one mapping of the project) and the error body
// {"error": {"code": "INVALID_ARGUMENT", "message": "..."}}. ErrorResponse answers one
// kFailedPrecondition apart: a commit the store refused because this server no longer leads
// (store::IsNotLeaderError, fencing) is 503 UNAVAILABLE with Retry-After, as nothing was written
// and the same request succeeds at the new leader (docs/ha.md).
int HttpStatusOf(StatusCode code);
std::string ErrorBody(const Status& status);
// Every handler answers through these two: `body` as JSON with `status`, or a non-OK Status as
// its HTTP status and ErrorBody.
ApiResponse JsonResponse(int status, const Json& body);
ApiResponse ErrorResponse(const Status& status);
// The document of `result` with `status`, or its error.
ApiResponse ResultResponse(const Result<Json>& result, int status = 200);

class ApiRoutes;

// The API server. Thread-safe: HTTP handlers run on the HTTP library's thread pool, the
// scheduling loop on its own thread, and every public method may be called from any thread.
// Authorization: members see and cancel only their own team's jobs; another team's job is
// answered 404, as Kubernetes answers for objects RBAC hides, so names do not leak. Node POST
// routes, creating teams, queues and tokens, and listing or revoking tokens need an admin (403
// for members).
class ApiServer {
 public:
  struct Options {
    // Must outlive the server.
    store::StateStore& store;
    const GpuCatalog& catalog;
    const Clock& clock;
    // Stamps `created_at` on jobs (RFC 3339, UTC); null: jobs carry no creation time.
    const WallClock* wall_clock = nullptr;
    // The placement policy (scheduler::PlacementPolicyNames). fgd and gpufleet score against a
    // target workload: the task shapes of the jobs this server starts, weighted by the GPUs they
    // ask for and decayed (policy::WorkloadHistory); before the first start, the shapes of the
    // pending jobs; with neither, best-fit (docs/policies.md, "In production").
    std::string policy = "gpufleet";
    policy::WorkloadHistoryOptions workload_history;
    // How often the target workload is rebuilt from the history (the scheduler is remade then,
    // dropping its memoised scores).
    Duration target_workload_refresh = std::chrono::minutes(1);
    // The network fabric (docs/fabric.md): set, the collective-cost score steers multi-node jobs
    // away from oversubscribed tiers, as `gpufleet sim replay --topology-aware` does. Nodes the
    // fabric does not name count as crossing every tier.
    std::shared_ptr<const fabric::Fabric> fabric;
    std::chrono::milliseconds cycle_interval{1000};
    // Cycle n uses Random(seed + n).
    uint64_t seed = 42;
    // Agents are told to heartbeat this often; a node registered by an agent that has not sent
    // one for node_timeout becomes NotReady and its jobs are requeued or failed (docs/agent.md).
    std::chrono::milliseconds heartbeat_interval{10000};
    // A node's lease: heartbeats renew it. A node not heard from for node_timeout becomes
    // NotReady and its runs start Stopping; its agent, unable to renew, stops its tasks itself
    // (SIGTERM, then SIGKILL after stop_grace), so after node_timeout + stop_grace they are
    // surely gone and their GPUs are free (docs/agent.md, "Leases and fencing").
    std::chrono::milliseconds node_timeout{40000};
    // How often the busy time counted from heartbeats is written into running jobs' documents
    // (docs/usage.md): what a server that stops can lose of it.
    Duration usage_flush_interval = std::chrono::minutes(5);
    std::chrono::milliseconds stop_grace{30000};
    // Fair share: a queue's recorded GPU use loses half its weight every half-life.
    std::chrono::seconds usage_half_life{std::chrono::hours(24 * 7)};
    // A job that has held its GPUs for less than this is not preempted.
    std::chrono::seconds min_runtime_before_preemption{60};
    // The most checkpoint grace a preemption notice gives (docs/job-spec.md, "Preemption
    // notices"); a job that asks for more gets this; 0: no notices, victims stop at once.
    std::chrono::seconds max_checkpoint_grace{300};
    // Outcome records, attribution and quarantine (docs/reliability.md, "The server").
    control::ReliabilityOptions reliability;
    // Idle reclaim of running interactive jobs (docs/utilization.md, "Idle reclaim in the
    // server"); nullopt: off.
    std::optional<policy::IdleReclaimOptions> idle_reclaim;
    // A job placed on MIG instances its node's agent has not reported for this long goes back to
    // Pending, the GPU's planned layout falls back to the devices the agent reports, and the
    // planner leaves the node alone for mig_replan_delay or until its devices change
    // (docs/agent.md, "MIG layouts").
    std::chrono::seconds mig_apply_timeout{120};
    // A gang (a job of several tasks) started on some of its nodes but not on others for this
    // long (an agent holds a task Waiting for a GPU a stopping task still has, or has not
    // answered) goes back to Pending, its started tasks stopped: a gang runs whole or not at
    // all (docs/api.md, "Job lifecycle").
    std::chrono::seconds gang_start_timeout{300};
    std::chrono::seconds mig_replan_delay{600};
    // Finished jobs (Succeeded, Failed, Cancelled) finished longer ago than this leave the store
    // with their event logs, a bounded batch per cycle (control/retention_controller.h); zero
    // keeps them forever. `gpufleet server --retain-finished` (default 30d) sets it.
    Duration retain_finished{0};
    // Connection caps, deadlines and worker pools of the HTTP server (its host, port and TLS
    // files come from Start).
    http::ServerOptions http;
    // Several servers on one store (docs/ha.md): the election this server campaigns in, every
    // election_interval on a thread of its own. Only the leader runs the scheduling loop and the
    // controllers; a follower serves GET requests from the store and answers every other
    // request with a 307 to the leader (503 while none is known). A leader that loses the
    // lease never leads again (deposed()): its owner ends it and a new process rejoins as a
    // follower. Null: this server leads alone (SQLite, memory). Must outlive the server.
    store::LeaderElection* election = nullptr;
    std::chrono::milliseconds election_interval{1000};
    // The fleet's history for the dashboard (GET /v1/history, docs/dashboard.md): the leader's
    // loop takes a sample every history_interval (needs a wall_clock) and keeps the last
    // history_capacity in the store (a day at one a minute); 0: none. Before them it keeps hourly
    // means and peaks (FleetHistory's coarse rows) back as far as retain_finished keeps jobs
    // (kMaxHistoryRetention when it keeps them forever).
    std::chrono::milliseconds history_interval{60000};
    size_t history_capacity = 1440;
    // Prices per GPU-hour by GPU model (`gpufleet server --prices FILE`): GET /v1/usage answers
    // each row's cost with them (docs/usage.md); nullopt: no cost.
    std::optional<wire::PriceTable> usage_prices;
  };

  // Creates the queue "default" in the store if it is missing. kNotFound / kInvalidArgument for
  // an unknown policy; the store's error if it cannot be written.
  static Result<std::unique_ptr<ApiServer>> Create(Options options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  TokenAuthenticator& authenticator() { return authenticator_; }
  control::ReliabilityController& reliability() { return control_->reliability(); }
  // The control plane this server serves: the cycle, the controllers and the job writer.
  control::ControlPlane& control_plane() { return *control_; }

  // Adds the nodes of `cluster` that the store does not hold yet (by name) and records the
  // cluster's topology levels on first use. kInvalidArgument if the cluster does not validate or
  // its levels differ from the recorded ones. Returns how many nodes were added.
  Result<int> RegisterNodes(const Cluster& cluster);

  // Serving HTTPS: PEM files of the certificate (chain) and of its private key.
  struct TlsFiles {
    std::string cert_file;
    std::string key_file;
  };

  // Binds host:port (port 0: an ephemeral port) and starts the HTTP threads and the scheduling
  // loop thread; with `tls`, serves HTTPS only. Returns the bound port. kUnavailable when binding
  // fails; kInvalidArgument naming the file when the certificate or key cannot be read or do not
  // match; kFailedPrecondition if already started.
  Result<int> Start(const std::string& host, int port,
                    const std::optional<TlsFiles>& tls = std::nullopt);
  // Stops the HTTP server and the loop and joins their threads, then saves the queue usage (also
  // when only RunSchedulingCycle ran). Idempotent. Start and Stop are meant for the owning thread
  // (they may not race each other); every other method is free.
  void Stop();

  // One scheduling cycle (what the loop thread runs every cycle_interval): places Pending jobs
  // in (priority desc, submit order) and commits each placement with a compare-and-set update.
  // Returns the number of jobs scheduled. Cycles never overlap.
  Result<int> RunSchedulingCycle();
  // What the loop thread runs every cycle_interval: a server granted the lease first becomes the
  // leader, then, while it leads, one scheduling cycle (RunSchedulingCycle's count; 0 when not
  // leading). With Campaign, what an owner calls that drives the server without Start (the
  // simulator, on simulated time).
  Result<int> RunLoopStep();
  // What the election thread runs every election_interval (with an election only): one
  // campaign, which records the lease, lets the next loop step lead when this server was granted
  // it, and deposes this server when it lost it (or could not renew it for the lease's duration).
  void Campaign();
  // The wall time of each step of the last scheduling cycle, in order (the steps it reached:
  // "read", "node-leases", "run-ends", "queues", ...). Their totals since the start are exported
  // as gpufleet_scheduling_cycle_step_seconds_total.
  std::vector<std::pair<std::string_view, Duration>> LastCycleSteps();

  // Serves one request (routing, authentication, the handlers, metrics): the health, metrics
  // and dashboard paths, then a follower's redirect, authentication and the route table of the
  // /v1 collections, whose handlers are ApiRoutes'.
  ApiResponse Handle(const ApiRequest& request);

  // Whether this server leads now: runs the scheduling loop and accepts writes (always, without
  // an election).
  bool leading() const { return options_.election == nullptr || leading_.load(); }
  // Whether this server led and another server has taken the lease over since: it runs no more
  // cycles and forwards every write, and its owner should end it. (A leader that merely could not
  // renew in time, the store being unreachable, stops leading until it renews the lease with the
  // same token, which it can while no other server has taken it.)
  bool deposed() const { return deposed_.load(); }

 private:
  explicit ApiServer(Options options);

  struct Metrics;

  ApiResponse Route(const ApiRequest& request);
  // The fleet's history (server_dashboard.cc, docs/dashboard.md): GET /v1/history, and the
  // loop's sample of the fleet every history_interval, taken after each cycle that reached its
  // publish step.
  ApiResponse GetHistory(const ApiRequest& request);
  void RecordHistoryIfDue();
  void LoopMain();

  // Leadership (server_leadership.cc, docs/ha.md).
  // The election thread: campaigns every election_interval until Stop.
  void ElectionMain();
  void Depose(const std::string& why);
  // On the loop thread, before each cycle: whether to run it. A server granted the lease first
  // becomes the leader (BecomeLeader), then leads.
  bool ReadyToLead();
  // Rebuilds what the leader keeps in memory from the store (the view, the node leases from now,
  // the GPU owners) and makes the writes a single server makes at Create (the default queue,
  // team-scoped names). REQUIRES: the control plane's cycle mutex held.
  Status BecomeLeader();
  // A follower's answer to a request other than GET: 307 to the leader's address with the same
  // target, or 503 when no leader is known.
  ApiResponse RedirectToLeader(const ApiRequest& request) const;
  // The gpufleet_server_leader and gpufleet_leader_* lines of /metrics.
  std::string RenderLeadership() const;

  void StopThreads();  // Stop without the queue usage save: ends the HTTP server and the loop
  std::string RenderMetrics();

  Options options_;
  TokenAuthenticator authenticator_;
  // The cycle, the controllers, the agent sessions and the job writer; replica_jobs_ and
  // node_credentials_ are its ways to this server's submit and cancel and to its bearer tokens.
  std::unique_ptr<control::ReplicaJobs> replica_jobs_;
  std::unique_ptr<control::NodeCredentials> node_credentials_;
  std::unique_ptr<control::ControlPlane> control_;
  // The handlers the route table calls (routes.h).
  std::unique_ptr<ApiRoutes> routes_;

  std::unique_ptr<Metrics> metrics_;  // internally synchronised
  FleetHistoryState history_;         // internally synchronised
  std::atomic<bool> ready_{false};
  // The last cycle failed because the store could not be reached (kUnavailable): /readyz is 503.
  std::atomic<bool> store_unavailable_{false};

  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stopping_ = false;  // guarded by loop_mu_
  bool started_ = false;   // guarded by loop_mu_
  bool wake_ = false;      // the election granted the lease: the loop is to lead; loop_mu_
  std::unique_ptr<http::Server> http_;
  std::thread loop_thread_;

  // Leadership (with an election only).
  mutable std::mutex lease_mu_;
  store::LeaseState lease_;  // the last campaign's answer; guarded by lease_mu_
  // The token of this server's term once granted; guarded by lease_mu_.
  std::optional<int64_t> granted_token_;
  // When the last campaign that renewed this server's lease began; guarded by lease_mu_.
  MonoTime renewed_at_;
  // The lease could not be renewed for its duration (a store outage): not leading until a
  // campaign renews it with the same token; guarded by lease_mu_.
  bool lapsed_ = false;
  std::atomic<bool> leading_{false};  // BecomeLeader done, not deposed
  std::atomic<bool> deposed_{false};
  std::thread election_thread_;
};

}  // namespace gpufleet::api
