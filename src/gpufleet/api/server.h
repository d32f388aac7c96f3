// SPDX-License-Identifier: Apache-2.0
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "gpufleet/api/auth.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/cluster.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/core/status.h"
#include "gpufleet/scheduler/scheduler.h"
#include "gpufleet/store/state_store.h"

namespace httplib {
class Server;
}  // namespace httplib

// The REST server of `gpufleet server` (docs/api.md) and its scheduling loop. This module is the
// only place where a Status becomes an HTTP status.
namespace gpufleet::api {

// Store kinds the server writes. Job and node documents are JSON; their layout is the REST
// representation (docs/api.md) plus a few internal fields the scheduling loop needs.
inline constexpr std::string_view kJobsKind = "jobs";
inline constexpr std::string_view kNodesKind = "nodes";
// One object, name "topology": {"levels": ["block", "leaf"]}, the cluster's declared levels.
inline constexpr std::string_view kClusterKind = "cluster";
// Request bodies above this are refused with 413.
inline constexpr size_t kMaxRequestBodyBytes = size_t{1} << 20;

// One HTTP request, independent of the HTTP library (the unit tests call Handle directly).
struct ApiRequest {
  std::string method;  // "GET", "POST"
  std::string path;    // without the query string
  std::multimap<std::string, std::string> query;
  std::string authorization;  // the Authorization header, empty when absent
  std::string body;
};

struct ApiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  // The route template for metrics, e.g. "/v1/jobs/{name}".
  std::string route;
};

// The HTTP status of a non-OK code (the one mapping of the project) and the error body
// {"error": {"code": "INVALID_ARGUMENT", "message": "..."}}.
int HttpStatusOf(StatusCode code);
std::string ErrorBody(const Status& status);

// The API server. Thread-safe: HTTP handlers run on the HTTP library's thread pool, the
// scheduling loop on its own thread, and every public method may be called from any thread.
// Authorization: members see and cancel only their own team's jobs; another team's job is
// answered 404, as Kubernetes answers for objects RBAC hides, so names do not leak. Node POST
// routes need an admin (403 for members).
class ApiServer {
 public:
  struct Options {
    // Must outlive the server.
    store::StateStore& store;
    const GpuCatalog& catalog;
    const Clock& clock;
    std::string policy = "best-fit";
    std::chrono::milliseconds cycle_interval{1000};
    // Cycle n uses Random(seed + n).
    uint64_t seed = 42;
  };

  // kNotFound / kInvalidArgument for an unknown policy.
  static Result<std::unique_ptr<ApiServer>> Create(Options options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  TokenAuthenticator& authenticator() { return authenticator_; }

  // Adds the nodes of `cluster` that the store does not hold yet (by name) and records the
  // cluster's topology levels on first use. kInvalidArgument if the cluster does not validate or
  // its levels differ from the recorded ones. Returns how many nodes were added.
  Result<int> RegisterNodes(const Cluster& cluster);

  // Binds host:port (port 0: an ephemeral port) and starts the HTTP threads and the scheduling
  // loop thread. Returns the bound port. kUnavailable when binding fails; kFailedPrecondition if
  // already started.
  Result<int> Start(const std::string& host, int port);
  // Stops the HTTP server and the loop and joins their threads. Idempotent. Start and Stop are
  // meant for the owning thread (they may not race each other); every other method is free.
  void Stop();

  // One scheduling cycle (what the loop thread runs every cycle_interval): places Pending jobs
  // in (priority desc, submit order) and commits each placement with a compare-and-set update.
  // Returns the number of jobs scheduled. Cycles never overlap.
  Result<int> RunSchedulingCycle();

  // Serves one request (routing, authentication, the handlers, metrics).
  ApiResponse Handle(const ApiRequest& request);

 private:
  explicit ApiServer(Options options, std::unique_ptr<scheduler::Scheduler> scheduler);

  struct Metrics;

  ApiResponse Route(const ApiRequest& request);
  void LoopMain();
  Result<int> RunCycleLocked();
  Result<Cluster> LoadCluster();
  std::string RenderMetrics();

  ApiResponse SubmitJob(const Principal& who, const ApiRequest& request);
  ApiResponse ListJobs(const Principal& who, const ApiRequest& request);
  ApiResponse GetJob(const Principal& who, std::string_view name);
  ApiResponse CancelJob(const Principal& who, std::string_view name);
  ApiResponse JobEvents(const Principal& who, std::string_view name);
  ApiResponse ListNodes();
  ApiResponse GetNode(std::string_view name);
  ApiResponse NodeAction(const Principal& who, std::string_view name, std::string_view action,
                         const std::string& body);
  ApiResponse ListQueues(const Principal& who);

  Options options_;
  TokenAuthenticator authenticator_;

  std::mutex cycle_mu_;                              // serialises scheduling cycles
  std::unique_ptr<scheduler::Scheduler> scheduler_;  // guarded by cycle_mu_
  uint64_t cycle_count_ = 0;                         // guarded by cycle_mu_

  std::unique_ptr<Metrics> metrics_;  // internally synchronised
  std::atomic<bool> ready_{false};

  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stopping_ = false;   // guarded by loop_mu_
  bool started_ = false;    // guarded by loop_mu_
  bool http_done_ = false;  // guarded by loop_mu_; the accept loop has returned
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
  std::thread loop_thread_;
};

}  // namespace gpufleet::api
