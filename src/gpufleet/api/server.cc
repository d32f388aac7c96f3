// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/server.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/event_time_store.h"
#include "gpufleet/api/routes.h"
#include "gpufleet/api/tls.h"
#include "gpufleet/control/event_groups.h"
#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/placement_gpus.h"
#include "gpufleet/control/scheduling_view.h"
#include "gpufleet/control/tenancy.h"
#include "gpufleet/control/usage_ledger.h"
#include "gpufleet/core/json_scan.h"
#include "gpufleet/core/random.h"
#include "gpufleet/core/rfc3339.h"
#include "gpufleet/policy/never_fits.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/scheduler/snapshot.h"
#include "gpufleet/store/read_modify_write.h"
#include "gpufleet/wire/job_record.h"
#include "gpufleet/wire/job_spec.h"
#include "gpufleet/wire/json_fields.h"
#include "gpufleet/wire/node_json.h"

namespace gpufleet::api {
namespace {

// The largest `limit` of GET /v1/jobs.
constexpr size_t kMaxJobsPerPage = 10000;

Status PermissionDenied(std::string message) {
  return Status(StatusCode::kPermissionDenied, std::move(message));
}

// ---- jobs -------------------------------------------------------------------------------

Json JobOutput(const store::StoredObject& object) {
  Json j = wire::ParseDocument(object.data);
  j["version"] = object.version;
  return j;
}

// What a member may not see of a job it can see: the name of another team's job that
// preempted it (the reason and events never name it either).
void HideOtherTeamsJobs(const control::Principal& who, Json& job) {
  if (job.contains("preempted_by") && !who.Sees(wire::StrOr(job, "preempted_by_team"))) {
    job.erase("preempted_by");
  }
}

std::string Who(const control::Principal& who) {
  return who.name.empty() ? control::RoleName(who.role) : who.name;
}

Status JobNotFound(std::string_view name) {
  return NotFoundError(fmt::format("job \"{}\" not found", name));
}

// Allocated milli-GPU per (node name, position of the GPU in the node's document) of the jobs
// holding resources, their GPUs found on `nodes` by UUID.
std::map<std::string, std::map<int64_t, int64_t>> AllocationByNode(
    const std::vector<store::StoredObject>& jobs, const std::vector<store::StoredObject>& nodes) {
  std::map<std::string, Json> node_gpus;
  for (const store::StoredObject& object : nodes) {
    node_gpus[object.name] = wire::ArrayOr(wire::ParseDocument(object.data), "gpus");
  }
  std::map<std::string, std::map<int64_t, int64_t>> out;
  for (const store::StoredObject& object : jobs) {
    // A document the record cannot read (never expected) counts as holding nothing, as one of
    // an unknown state always has here.
    const Result<wire::JobRecord> job =
        wire::JobRecordFromJson(wire::ParseDocumentWithout(object.data, "spec"), nullptr);
    if (!job.ok() || !control::HoldsResources(job->state)) {
      continue;
    }
    for (const wire::PlacementRecord& p : job->placements) {
      if (control::PlacementGone(p)) {
        continue;
      }
      const auto gpus = node_gpus.find(p.node);
      if (gpus == node_gpus.end()) {
        continue;
      }
      const std::vector<control::PlacedGpu> placed = control::PlacedGpus(p);
      for (size_t i = 0; i < placed.size(); ++i) {
        if (const int position = control::PlacedGpuPosition(gpus->second, placed[i]);
            position >= 0) {
          out[gpus->first][position] += p.assignments[i].milli;
        }
      }
    }
  }
  return out;
}

std::string Gauge(double value) {
  return fmt::format("{}", value);
}

std::string EscapeLabel(std::string_view value) {
  std::string out;
  for (const char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::vector<std::string_view> SplitPath(std::string_view path) {
  std::vector<std::string_view> out;
  while (!path.empty()) {
    const size_t slash = path.find('/');
    const std::string_view segment = path.substr(0, slash);
    if (!segment.empty()) {
      out.push_back(segment);
    }
    if (slash == std::string_view::npos) {
      break;
    }
    path.remove_prefix(slash + 1);
  }
  return out;
}

}  // namespace

const std::vector<std::pair<std::string, std::string>>& BrowserHeaders() {
  // img-src allows data: for the page's empty favicon; the page's script sets styles through
  // the CSSOM (element.style), which style-src 'self' allows.
  static const auto* const kHeaders = new std::vector<std::pair<std::string, std::string>>{
      {"Content-Security-Policy",
       "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
       "frame-ancestors 'none'"},
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"},
      {"Referrer-Policy", "no-referrer"},
      {"Cache-Control", "no-store"},
  };
  return *kHeaders;
}

// ---- status mapping (the only one in the project) -----------------------------------------

ApiResponse JsonResponse(int status, const Json& body) {
  ApiResponse response;
  response.status = status;
  response.body = body.dump() + "\n";
  return response;
}

ApiResponse ErrorResponse(const Status& status) {
  ApiResponse response;
  if (store::IsNotLeaderError(status)) {
    // A deposed leader's commit, refused by the fencing check: nothing of it was written, and the
    // write belongs to the leader the message names, so the client may send it again.
    response.status = 503;
    response.retry_after_s = 1;
    response.body = ErrorBody(UnavailableError(fmt::format(
        "this server is no longer the leader and wrote nothing; retry (at the leader): {}",
        status.message())));
    return response;
  }
  response.status = HttpStatusOf(status.code());
  response.body = ErrorBody(status);
  return response;
}

ApiResponse ResultResponse(const Result<Json>& result, int status) {
  return result.ok() ? JsonResponse(status, *result) : ErrorResponse(result.status());
}

int HttpStatusOf(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kOutOfRange:
      return 400;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kPermissionDenied:
      return 403;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kAlreadyExists:
    case StatusCode::kAborted:
      return 409;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kCancelled:
      return 499;
    case StatusCode::kUnimplemented:
      return 501;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kUnknown:
    case StatusCode::kInternal:
    case StatusCode::kDataLoss:
      return 500;
  }
  return 500;
}

std::string ErrorBody(const Status& status) {
  const Json body = {
      {"error", {{"code", StatusCodeName(status.code())}, {"message", status.message()}}}};
  return body.dump() + "\n";
}

// ---- metrics ----------------------------------------------------------------------------

struct ApiServer::Metrics {
  static constexpr std::array<double, 10> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025,
                                                      0.05,  0.1,    0.25,  0.5,  1.0};
  // Image pulls take seconds to many minutes (a 20 GB image from a busy registry).
  static constexpr std::array<double, 10> kPullBuckets = {0.5, 1,  2.5, 5,   10,
                                                          30,  60, 120, 300, 900};
  // One Prometheus histogram over kBounds (bucket counts not cumulative).
  template <const std::array<double, 10>& kBounds = kBuckets>
  struct Histogram {
    std::array<uint64_t, kBounds.size()> buckets{};
    uint64_t count = 0;
    double sum = 0;

    void Observe(double seconds) {
      for (size_t i = 0; i < kBounds.size(); ++i) {
        if (seconds <= kBounds[i]) {
          ++buckets[i];
          break;
        }
      }
      ++count;
      sum += seconds;
    }
    // The _bucket, _sum and _count lines of `name`, with `labels` ("" or `a="b",`) first.
    std::string Render(std::string_view name, const std::string& labels) const {
      std::string out;
      uint64_t cumulative = 0;
      for (size_t i = 0; i < kBounds.size(); ++i) {
        cumulative += buckets[i];
        out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, labels, Gauge(kBounds[i]),
                           cumulative);
      }
      out += fmt::format("{}_bucket{{{}le=\"+Inf\"}} {}\n", name, labels, count);
      const std::string plain =
          labels.empty() ? "" : "{" + labels.substr(0, labels.size() - 1) + "}";
      out += fmt::format("{}_sum{} {}\n", name, plain, Gauge(sum));
      out += fmt::format("{}_count{} {}\n", name, plain, count);
      return out;
    }
  };

  std::mutex mu;
  std::map<std::pair<std::string, int>, Histogram<>> requests;  // guarded by mu
  Histogram<> cycles;                                           // guarded by mu
  Histogram<kPullBuckets> image_pulls;                          // guarded by mu
  std::map<std::string_view, double> cycle_step_seconds;        // guarded by mu

  void ObserveRequest(const std::string& route, int code, double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    requests[{route, code}].Observe(seconds);
  }
  void ObserveCycle(double seconds,
                    const std::vector<std::pair<std::string_view, Duration>>& steps) {
    std::lock_guard<std::mutex> lock(mu);
    cycles.Observe(seconds);
    for (const auto& [step, time] : steps) {
      cycle_step_seconds[step] += std::chrono::duration<double>(time).count();
    }
  }
  void ObserveImagePull(double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    image_pulls.Observe(seconds);
  }
};

// ---- construction, start, stop --------------------------------------------------------------

namespace {

// The server's own submit and cancel, as a deployment's creator: how the control plane's
// deployments step makes and removes replicas.
class ServerReplicaJobs final : public control::ReplicaJobs {
 public:
  using Call = std::function<Result<Json>(const control::Principal&, std::string_view)>;
  ServerReplicaJobs(Call submit, Call cancel)
      : submit_(std::move(submit)), cancel_(std::move(cancel)) {}
  Result<Json> Submit(const control::Principal& owner, std::string_view spec) override {
    return submit_(owner, spec);
  }
  Result<Json> Cancel(const control::Principal& owner, std::string_view key) override {
    return cancel_(owner, key);
  }

 private:
  Call submit_;
  Call cancel_;
};

// The server's bearer tokens as the control plane's node credentials.
class TokenNodeCredentials final : public control::NodeCredentials {
 public:
  explicit TokenNodeCredentials(TokenAuthenticator& tokens) : tokens_(tokens) {}
  Result<Issued> Issue(const std::string& node) override {
    GPUFLEET_ASSIGN_OR_RETURN(
        std::string token,
        tokens_.CreateToken(control::Role::kAgent, "", fmt::format("node/{}", node), node));
    std::string id = TokenId(token);
    return Issued{.token = std::move(token), .id = std::move(id)};
  }
  Status Revoke(const std::string& token) override { return tokens_.RevokeToken(token); }
  Status RevokeById(const std::string& id) override { return tokens_.RevokeTokenById(id).status(); }
  Result<bool> Exists(const std::string& node) override { return tokens_.NodeHasCredential(node); }

 private:
  TokenAuthenticator& tokens_;
};

}  // namespace

Result<std::unique_ptr<ApiServer>> ApiServer::Create(Options options) {
  auto server = std::unique_ptr<ApiServer>(new ApiServer(std::move(options)));
  const Options& o = server->options_;
  server->replica_jobs_ = std::make_unique<ServerReplicaJobs>(
      [s = server.get()](const control::Principal& owner, std::string_view spec) {
        return s->routes_->SubmitJob(owner, spec, {.check_fleet = false});
      },
      [s = server.get()](const control::Principal& owner, std::string_view key) {
        return s->routes_->CancelJob(owner, key);
      });
  server->node_credentials_ = std::make_unique<TokenNodeCredentials>(server->authenticator_);
  GPUFLEET_ASSIGN_OR_RETURN(
      server->control_,
      control::ControlPlane::Create(
          {.store = o.store,
           .catalog = o.catalog,
           .clock = o.clock,
           .wall_clock = o.wall_clock,
           .policy = o.policy,
           .workload_history = o.workload_history,
           .target_workload_refresh = o.target_workload_refresh,
           .fabric = o.fabric,
           .seed = o.seed,
           .heartbeat_interval = o.heartbeat_interval,
           .node_timeout = o.node_timeout,
           .stop_grace = o.stop_grace,
           .usage_flush_interval = o.usage_flush_interval,
           .usage_half_life = o.usage_half_life,
           .min_runtime_before_preemption = o.min_runtime_before_preemption,
           .max_checkpoint_grace = o.max_checkpoint_grace,
           .reliability = o.reliability,
           .idle_reclaim = o.idle_reclaim,
           .mig_apply_timeout = o.mig_apply_timeout,
           .gang_start_timeout = o.gang_start_timeout,
           .mig_replan_delay = o.mig_replan_delay,
           .retain_finished = o.retain_finished,
           .replica_jobs = server->replica_jobs_.get(),
           .node_credentials = server->node_credentials_.get(),
           .observe_image_pull = [metrics = server->metrics_.get()](double seconds) {
             metrics->ObserveImagePull(seconds);
           }}));
  server->routes_ =
      std::make_unique<ApiRoutes>(o, *server->control_, server->authenticator_, server->ready_);
  // With an election, the leader makes these writes when it becomes the leader (BecomeLeader):
  // a follower's would be refused.
  if (o.election == nullptr) {
    GPUFLEET_RETURN_IF_ERROR(server->control_->PrepareStore());
  }
  return server;
}

ApiServer::ApiServer(Options options)
    : options_(std::move(options)),
      authenticator_(options_.store, options_.clock),
      metrics_(std::make_unique<Metrics>()) {}

ApiServer::~ApiServer() {
  Stop();
}

Result<int> ApiServer::Start(const std::string& host, int port,
                             const std::optional<TlsFiles>& tls) {
  if (options_.election != nullptr) {
    // One campaign before serving: the first request finds a follower knowing the leader, or a
    // leader that has rebuilt its view.
    Campaign();
    (void)ReadyToLead();
  }
  std::lock_guard<std::mutex> lock(loop_mu_);
  if (started_) {
    return FailedPreconditionError("server already started");
  }
  http::ServerOptions http_options = options_.http;
  http_options.host = host;
  http_options.port = port;
  if (tls.has_value()) {
    GPUFLEET_RETURN_IF_ERROR(CheckTlsFiles(tls->cert_file, tls->key_file));
    http_options.tls_cert_file = tls->cert_file;
    http_options.tls_key_file = tls->key_file;
  }
  http_options.max_body_bytes = kMaxRequestBodyBytes;
  const auto handler = [this](const ApiRequest& request) {
    ApiResponse response = Handle(request);
    return http::Response{.status = response.status,
                          .content_type = std::move(response.content_type),
                          .body = std::move(response.body),
                          .location = std::move(response.location),
                          .retry_after_s = response.retry_after_s,
                          .headers = std::move(response.headers)};
  };
  // Probes answer on the IO threads; agents' registrations and heartbeats have workers of their
  // own, so a flood of user requests cannot make nodes NotReady.
  const auto lane_of = [](std::string_view method, std::string_view path) {
    if (method == "GET" && (path == "/healthz" || path == "/readyz")) {
      return http::Lane::kInline;
    }
    if (path.starts_with("/v1/agents/")) {
      return http::Lane::kAgent;
    }
    return http::Lane::kUser;
  };
  // Answers the HTTP server gives itself (malformed framing, a body over the limit, a full
  // connection cap), in the API's error body.
  const auto render_error = [this](int status, const std::string& message) {
    StatusCode code = StatusCode::kInvalidArgument;
    if (status == 413 || status == 431) {
      code = StatusCode::kResourceExhausted;
    } else if (status == 501) {
      code = StatusCode::kUnimplemented;
    } else if (status == 503) {
      code = StatusCode::kUnavailable;
    } else if (status >= 500) {
      code = StatusCode::kInternal;
    }
    metrics_->ObserveRequest("unmatched", status, 0);
    return http::Response{.status = status,
                          .content_type = "application/json",
                          .body = ErrorBody(Status(code, message)),
                          .headers = BrowserHeaders()};
  };
  Result<std::unique_ptr<http::Server>> server =
      http::Server::Start(std::move(http_options), handler, lane_of, render_error);
  if (!server.ok()) {
    return server.status();
  }
  http_ = std::move(server).value();
  const int bound = http_->port();
  stopping_ = false;
  started_ = true;
  loop_thread_ = std::thread([this] { LoopMain(); });
  if (options_.election != nullptr) {
    election_thread_ = std::thread([this] { ElectionMain(); });
  }
  return bound;
}

void ApiServer::Stop() {
  StopThreads();
  if (control_ == nullptr) {
    return;  // Create failed
  }
  std::lock_guard<std::mutex> lock(control_->cycle_mutex());
  // A follower's or a deposed leader's commits are refused: the leader keeps the usage.
  if (!leading()) {
    return;
  }
  control_->SaveQueueUsage();
  if (options_.election != nullptr) {
    // Handing the lease over now spares the followers the wait for it to expire.
    leading_.store(false);
    if (const Status resigned = options_.election->Resign(); !resigned.ok()) {
      fmt::print(stderr, "gpufleet server: giving up the leader lease: {}\n", resigned.ToString());
    }
  }
}

void ApiServer::StopThreads() {
  {
    std::lock_guard<std::mutex> lock(loop_mu_);
    if (!started_) {
      return;
    }
    stopping_ = true;
    started_ = false;
  }
  loop_cv_.notify_all();
  http_->Stop();
  if (loop_thread_.joinable()) {
    loop_thread_.join();
  }
  if (election_thread_.joinable()) {
    election_thread_.join();
  }
  http_.reset();
}

void ApiServer::LoopMain() {
  std::unique_lock<std::mutex> lock(loop_mu_);
  while (!stopping_) {
    wake_ = false;
    lock.unlock();
    if (const Result<int> result = RunLoopStep(); !result.ok()) {
      fmt::print(stderr, "gpufleet server: scheduling cycle failed: {}\n",
                 result.status().ToString());
    }
    lock.lock();
    loop_cv_.wait_for(lock, options_.cycle_interval, [this] { return stopping_ || wake_; });
  }
}

Result<int> ApiServer::RunLoopStep() {
  if (!ReadyToLead()) {
    return 0;
  }
  return RunSchedulingCycle();
}

// ---- nodes and the cluster ------------------------------------------------------------------

Result<int> ApiServer::RegisterNodes(const Cluster& cluster) {
  return control_->RegisterNodes(cluster);
}

// ---- the scheduling cycle -------------------------------------------------------------------

Result<int> ApiServer::RunSchedulingCycle() {
  control::CycleReport cycle = control_->RunCycle();
  metrics_->ObserveCycle(std::chrono::duration<double>(cycle.elapsed).count(), cycle.steps);
  if (!cycle.steps.empty() && cycle.steps.back().first == "publish") {
    RecordHistoryIfDue();
  }
  if (cycle.scheduled.ok()) {
    ready_.store(true);
    store_unavailable_.store(false);
  } else if (cycle.scheduled.status().code() == StatusCode::kUnavailable) {
    store_unavailable_.store(true);  // until a cycle reads and writes the store again
  }
  return cycle.scheduled;
}

std::vector<std::pair<std::string_view, Duration>> ApiServer::LastCycleSteps() {
  return control_->LastCycleSteps();
}

// ---- routing ------------------------------------------------------------------------------

namespace {

// The route labels of gpufleet_http_requests_total: the routes Route serves (docs/api.md). A
// label is built from the request's path before the request is authenticated, so a label that
// is not in this table counts as "unmatched": made-up paths must not grow /metrics (20,000
// unauthenticated requests took it from 37 KB to 29 MB).
const std::set<std::string, std::less<>>& RouteLabels() {
  static const std::set<std::string, std::less<>> kLabels = [] {
    std::set<std::string, std::less<>> labels = {"unmatched",
                                                 "redirect",
                                                 "/healthz",
                                                 "/readyz",
                                                 "/metrics",
                                                 "/",
                                                 "/assets",
                                                 "/v1/queues",
                                                 "/v1/queues/{name}",
                                                 "/v1/queues/{name}/events",
                                                 "/v1/agents/register",
                                                 "/v1/agents/{name}/heartbeat",
                                                 "/v1/agents/{name}/provenance",
                                                 "/v1/agents/{name}/logs",
                                                 "/v1/nodes",
                                                 "/v1/nodes/{name}",
                                                 "/v1/provenance",
                                                 "/v1/history",
                                                 "/v1/utilization",
                                                 "/v1/whoami",
                                                 "/v1/outcomes",
                                                 "/v1/reports/{name}",
                                                 "/v1/usage",
                                                 "/v1/teams",
                                                 "/v1/teams/{name}",
                                                 "/v1/tokens",
                                                 "/v1/tokens/{name}",
                                                 "/v1/tokens/{name}/revoke"};
    for (const std::string_view scoped : {"jobs", "deployments"}) {
      labels.insert(fmt::format("/v1/{}", scoped));
      labels.insert(fmt::format("/v1/{}/{{name}}", scoped));
      for (const std::string_view action : {"cancel", "resume", "explain", "events", "logs"}) {
        labels.insert(fmt::format("/v1/{}/{{name}}/{}", scoped, action));
      }
    }
    for (const std::string_view action :
         {"events", "cordon", "uncordon", "drain", "quarantine", "release"}) {
      labels.insert(fmt::format("/v1/nodes/{{name}}/{}", action));
    }
    return labels;
  }();
  return kLabels;
}

}  // namespace

ApiResponse ApiServer::Handle(const ApiRequest& request) {
  const MonoTime start = options_.clock.Now();
  ApiResponse response;
  const auto invalid_utf8 = [&]() -> std::optional<std::string> {
    if (const size_t bad = wire::InvalidUtf8Offset(request.path); bad != std::string_view::npos) {
      return fmt::format("path: not valid UTF-8 at byte {}", bad);
    }
    for (const auto& [key, value] : request.query) {
      if (wire::InvalidUtf8Offset(key) != std::string_view::npos ||
          wire::InvalidUtf8Offset(value) != std::string_view::npos) {
        return fmt::format("query parameter: not valid UTF-8");
      }
    }
    return std::nullopt;
  };
  if (request.body.size() > kMaxRequestBodyBytes) {
    response =
        ErrorResponse(Status(StatusCode::kResourceExhausted,
                             fmt::format("request body over {} bytes", kMaxRequestBodyBytes)));
    response.status = 413;
    response.route = "unmatched";
  } else if (const std::optional<std::string> bad = invalid_utf8()) {
    response = ErrorResponse(InvalidArgumentError(*bad));
    response.route = "unmatched";
  } else {
    response = Route(request);
  }
  if (RouteLabels().count(response.route) == 0) {
    response.route = "unmatched";
  }
  metrics_->ObserveRequest(response.route, response.status,
                           std::chrono::duration<double>(options_.clock.Now() - start).count());
  response.headers = BrowserHeaders();
  return response;
}

ApiResponse ApiServer::Route(const ApiRequest& request) {
  const std::vector<std::string_view> segments = SplitPath(request.path);
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  const size_t n = segments.size();
  auto routed = [](ApiResponse response, std::string route) {
    response.route = std::move(route);
    return response;
  };
  auto no_route = [&] {
    return routed(
        ErrorResponse(NotFoundError(fmt::format("no route {} {}", request.method, request.path))),
        "unmatched");
  };
  if (n == 1 && get && segments[0] == "healthz") {
    ApiResponse response;
    response.content_type = "text/plain";
    response.body = "ok\n";
    return routed(std::move(response), "/healthz");
  }
  if (n == 1 && get && segments[0] == "readyz") {
    // The store first: a server that started and lost its store before a first cycle succeeded
    // says why it is not ready.
    if (store_unavailable_.load()) {
      return routed(ErrorResponse(UnavailableError(
                        "the state store is unreachable; the scheduling loop retries every cycle")),
                    "/readyz");
    }
    if (!ready_.load()) {
      return routed(ErrorResponse(UnavailableError("the scheduling loop has not run yet")),
                    "/readyz");
    }
    ApiResponse response;
    response.content_type = "text/plain";
    response.body = "ok\n";
    return routed(std::move(response), "/readyz");
  }
  if (n == 1 && get && segments[0] == "metrics") {
    // Fleet figures are for the fleet's users and operators (a Prometheus with a member or
    // admin token), not for anyone who can reach the port, nor for a node's agent.
    const Result<control::Principal> who = authenticator_.Authenticate(request.authorization);
    if (!who.ok()) {
      return routed(ErrorResponse(who.status()), "/metrics");
    }
    if (who->role == control::Role::kAgent) {
      return routed(ErrorResponse(PermissionDenied("an agent token may not read /metrics")),
                    "/metrics");
    }
    ApiResponse response;
    response.content_type = "text/plain; version=0.0.4";
    response.body = RenderMetrics();
    return routed(std::move(response), "/metrics");
  }
  if (std::optional<ApiResponse> page = routes_->ServeDashboard(request)) {
    return *page;
  }
  if (n < 2 || segments[0] != "v1" ||
      (!get && !post && request.method != "PATCH" && request.method != "DELETE")) {
    return no_route();
  }
  if (!get && !leading()) {
    return routed(RedirectToLeader(request), "redirect");
  }
  const Result<control::Principal> who = authenticator_.Authenticate(request.authorization);
  const std::string_view collection = segments[1];
  std::string route = fmt::format("/v1/{}", collection);
  if (n >= 3) {
    route += "/{name}";
  }
  // Jobs and deployments are named NAME or TEAM/NAME (docs/api.md, "Names").
  std::optional<control::ScopedPath> scoped;
  if (collection == "jobs" || collection == "deployments") {
    scoped = control::ParseScopedPath(segments, request.method);
    if (scoped && !scoped->action.empty()) {
      route += fmt::format("/{}", scoped->action);
    }
  } else if (collection == "queues") {
    // A queue's name is a path ("research/nlp"): only a trailing "events" is a sub-route.
    if (n >= 4 && segments[n - 1] == "events") {
      route += "/events";
    }
  } else if (n == 4) {
    route += fmt::format("/{}", segments[3]);
  }
  if (!who.ok()) {
    return routed(ErrorResponse(who.status()), route);
  }
  if (who->role == control::Role::kAgent && collection != "agents") {
    return routed(ErrorResponse(PermissionDenied(
                      "an agent token may only register and send heartbeats, provenance records "
                      "and task logs")),
                  route);
  }
  if (collection == "history") {
    return n == 2 && get ? routed(GetHistory(request), route) : no_route();
  }
  // The route table of the /v1 collections: each handler answers a request under its
  // collection, or nullopt when it has no route for the method and path.
  using Handler = std::optional<ApiResponse> (ApiRoutes::*)(
      const control::Principal&, const ApiRequest&, const std::vector<std::string_view>&);
  static const auto* const kRoutes = new std::map<std::string_view, Handler>{
      {"jobs", &ApiRoutes::RouteJobs},
      {"agents", &ApiRoutes::RouteAgents},
      {"nodes", &ApiRoutes::RouteNodes},
      {"provenance", &ApiRoutes::RouteProvenance},
      {"utilization", &ApiRoutes::RouteDashboard},
      {"whoami", &ApiRoutes::RouteDashboard},
      {"deployments", &ApiRoutes::RouteDeployments},
      {"outcomes", &ApiRoutes::RouteReliability},
      {"reports", &ApiRoutes::RouteReliability},
      {"usage", &ApiRoutes::RouteUsage},
      {"teams", &ApiRoutes::RouteTenancy},
      {"tokens", &ApiRoutes::RouteTenancy},
      {"queues", &ApiRoutes::RouteTenancy},
  };
  if (const auto handler = kRoutes->find(collection); handler != kRoutes->end()) {
    if (std::optional<ApiResponse> served =
            (routes_.get()->*handler->second)(*who, request, segments)) {
      // A handler may name a route of its own (POST /v1/agents/register).
      std::string label = served->route.empty() ? route : served->route;
      return routed(std::move(*served), std::move(label));
    }
  }
  return no_route();
}

// ---- the routes of jobs, nodes and agents -----------------------------------------------------

std::optional<ApiResponse> ApiRoutes::RouteJobs(const control::Principal& who,
                                                const ApiRequest& request,
                                                const std::vector<std::string_view>& segments) {
  const size_t n = segments.size();
  const bool get = request.method == "GET";
  if (n == 2 && request.method == "POST") {
    bool strict = false;
    if (const auto it = request.query.find("strict"); it != request.query.end()) {
      if (it->second != "true" && it->second != "false") {
        return ErrorResponse(
            InvalidArgumentError(fmt::format("strict: \"{}\" is not true or false", it->second)));
      }
      strict = it->second == "true";
    }
    return ResultResponse(SubmitJob(who, request.body, {.strict = strict}), 201);
  }
  if (n == 2 && get) {
    return ListJobs(who, request);
  }
  // Jobs are named NAME or TEAM/NAME (docs/api.md, "Names").
  const std::optional<control::ScopedPath> scoped =
      control::ParseScopedPath(segments, request.method);
  const bool get_job = get && scoped && scoped->action.empty();
  if (!get_job && !(scoped && !scoped->action.empty())) {
    return std::nullopt;
  }
  const Result<std::string> key = ResolveName(who, control::kJobsKind, "job", scoped->name);
  if (!key.ok()) {
    return ErrorResponse(key.status());
  }
  if (get_job) {
    return GetJob(who, *key);
  }
  if (scoped->action == "cancel") {
    return ResultResponse(CancelJob(who, *key));
  }
  if (scoped->action == "resume") {
    return ResumeJob(who, *key);
  }
  if (scoped->action == "explain") {
    return ExplainJob(who, *key);
  }
  if (scoped->action == "logs") {
    return JobLogs(who, *key, request);
  }
  return JobEvents(who, *key);
}

std::optional<ApiResponse> ApiRoutes::RouteAgents(const control::Principal& who,
                                                  const ApiRequest& request,
                                                  const std::vector<std::string_view>& segments) {
  // The agent protocol (docs/agent.md): POST /v1/agents/register, /v1/agents/NODE/heartbeat,
  // /v1/agents/NODE/provenance, /v1/agents/NODE/logs.
  const size_t n = segments.size();
  if (request.method != "POST") {
    return std::nullopt;
  }
  Result<wire::AgentReply> reply = Status(StatusCode::kNotFound, "");
  std::string route;
  if (n == 3 && segments[2] == "register") {
    route = "/v1/agents/register";
    reply = control_->RegisterAgent(who, request.body);
  } else if (n == 4 && segments[3] == "heartbeat") {
    reply = control_->AgentHeartbeat(who, segments[2], request.body);
  } else if (n == 4 && segments[3] == "logs") {
    const Status kept = control_->RecordTaskLog(who, segments[2], request.body);
    return kept.ok() ? JsonResponse(200, Json{{"kept", true}}) : ErrorResponse(kept);
  } else if (n == 4 && segments[3] == "provenance") {
    const Result<Json> recorded = control_->RecordProvenance(who, segments[2], request.body);
    return ResultResponse(recorded,
                          recorded.ok() && wire::BoolOr(*recorded, "created", false) ? 201 : 200);
  } else {
    return std::nullopt;
  }
  ApiResponse response;
  if (reply.ok()) {
    response.body = wire::AgentReplyToJson(*reply) + "\n";
  } else {
    response = ErrorResponse(reply.status());
  }
  response.route = std::move(route);
  return response;
}

std::optional<ApiResponse> ApiRoutes::RouteNodes(const control::Principal& who,
                                                 const ApiRequest& request,
                                                 const std::vector<std::string_view>& segments) {
  const size_t n = segments.size();
  const bool get = request.method == "GET";
  if (n == 2 && get) {
    return ListNodes(who);
  }
  if (n == 3 && get) {
    return GetNode(who, segments[2]);
  }
  if (n == 3 && request.method == "DELETE") {
    return DeleteNode(who, segments[2]);
  }
  if (n == 4 && get && segments[3] == "events") {
    // A node's events name the jobs of every team on it (MIG layouts, fencing): operators'
    // data, as node events are in Kubernetes.
    if (!who.is_admin()) {
      return ErrorResponse(PermissionDenied("a node's events are for admins"));
    }
    ApiResponse node = GetNode(who, segments[2]);
    return node.status == 200 ? ObjectEvents(control::kNodesKind, segments[2]) : node;
  }
  static const std::set<std::string_view> kActions = {"cordon", "uncordon", "drain", "quarantine",
                                                      "release"};
  if (n == 4 && request.method == "POST" && kActions.count(segments[3]) > 0) {
    return NodeAction(who, segments[2], segments[3], request.body);
  }
  return std::nullopt;
}

// ---- job handlers ---------------------------------------------------------------------------

void ApiRoutes::AnnotateStopping(Json& job) const {
  if (control::StoredJobState(job) != control::JobState::kStopping || !job.contains("stopping")) {
    return;
  }
  job["stopping"]["waiting_for"] = control::DescribeStopping(
      job,
      options_.wall_clock != nullptr ? std::optional<int64_t>(options_.wall_clock->UnixNanos())
                                     : std::nullopt,
      std::chrono::duration_cast<std::chrono::seconds>(options_.stop_grace));
}

Result<Json> ApiRoutes::SubmitJob(const control::Principal& who, std::string_view body,
                                  SubmitOptions options) {
  GPUFLEET_ASSIGN_OR_RETURN(const Job job, wire::ParseJobSpec(body, options_.catalog));
  GPUFLEET_RETURN_IF_ERROR(wire::CheckTasksRunnable(job));
  const std::string& name = job.id.value();
  GPUFLEET_RETURN_IF_ERROR(control::CheckScopedName("metadata.name", name));
  // Task ids (JOB/TASK/ATTEMPT, JOB the key) must stay within the agent's limit.
  const std::string key = control::TeamScopedKey(who.team, name);
  GPUFLEET_RETURN_IF_ERROR(store::ValidateKey("metadata.name", key));
  GPUFLEET_RETURN_IF_ERROR(wire::CheckTaskIdLength(key, job));
  // Submit order: the store revision before the commit. Concurrent submits may share a value;
  // the job name then breaks the tie (the loop's sort is stable over the name-ordered list).
  const Result<int64_t> revision = options_.store.Revision();
  if (!revision.ok()) {
    return revision.status();
  }
  const std::string queue = job.queue.empty() ? "default" : job.queue.value();
  GPUFLEET_RETURN_IF_ERROR(CheckSubmission(
      who, queue, std::any_of(job.groups.begin(), job.groups.end(), [](const TaskGroup& group) {
        return group.host_network;
      })));
  wire::JobRecord record{.name = name,
                         .team = who.team,
                         .queue = queue,
                         .submitted_by = Who(who),
                         .labels = job.labels,
                         .priority = job.priority,
                         .submit_seq = *revision + 1,
                         .spec = job};
  if (options_.wall_clock != nullptr) {
    record.created_at = FormatRfc3339(options_.wall_clock->UnixNanos());
  }
  // Whether any node of the fleet, empty, could hold it: on the view's snapshot, once the loop
  // has built one. A submission does not wait behind a running cycle (a cycle of 10,000 nodes
  // takes tens of milliseconds; bench/RESULTS.md measures submissions at 1,000 per second): the
  // cycle then names the job itself ("never fits: ..."). A strict submission waits, to refuse.
  std::optional<policy::NeverFits> never;
  if (options.check_fleet) {
    std::unique_lock<std::mutex> lock(control_->cycle_mutex(), std::defer_lock);
    if (options.strict) {
      lock.lock();
    } else {
      static_cast<void>(lock.try_lock());
    }
    if (lock.owns_lock() && ready_.load() && control_->view().Refresh().ok()) {
      never = control_->CheckNeverFits(job);
    }
  }
  if (never) {
    if (options.strict) {
      return FailedPreconditionError(
          fmt::format("{}: never fits: {} (submitted with strict)", never->field, never->message));
    }
    record.reason = fmt::format("never fits: {}", never->message);
  }
  Json doc = wire::JobRecordToJson(record);
  const std::string data = doc.dump();
  GPUFLEET_RETURN_IF_ERROR(wire::CheckSubmissionLimits(job, data.size(), store::kMaxDataBytes));
  store::WriteBatch batch;
  batch.Create(std::string(control::kJobsKind), key, data);
  batch.AppendEvent(std::string(control::kJobsKind), key,
                    fmt::format("submitted by {} to queue {}", Who(who), queue));
  if (Status status = options_.store.Commit(batch); !status.ok()) {
    // Names are scoped by team: the job that exists is the submitter's team's own.
    if (status.code() == StatusCode::kAlreadyExists) {
      return AlreadyExistsError(
          fmt::format("job \"{}\" already exists in team \"{}\"", name, who.team));
    }
    return status;
  }
  doc["version"] = 1;
  if (never) {
    doc["warnings"] = Json::array(
        {fmt::format("{}: never fits: {}; it waits until a node that can hold it joins (submit "
                     "with --strict to refuse such jobs)",
                     never->field, never->message)});
  }
  return doc;
}

ApiResponse ApiRoutes::ListJobs(const control::Principal& who, const ApiRequest& request) {
  // The state filter is served by the store's state index, and so is the paging: a page costs
  // O(limit), not O(the jobs stored).
  store::ListFilter filter{.exclude_states = true};
  std::optional<std::string> queue;
  if (const auto it = request.query.find("state"); it != request.query.end()) {
    if (!control::ParseJobState(it->second)) {
      return ErrorResponse(InvalidArgumentError(
          fmt::format("state: unknown \"{}\" (valid: {})", it->second, control::JobStateNames())));
    }
    filter = {.states = {it->second}};
  }
  if (const auto it = request.query.find("queue"); it != request.query.end()) {
    queue = it->second;
  }
  size_t limit = 0;
  if (const auto it = request.query.find("limit"); it != request.query.end()) {
    const auto [end, error] =
        std::from_chars(it->second.data(), it->second.data() + it->second.size(), limit);
    if (error != std::errc() || end != it->second.data() + it->second.size() || limit < 1 ||
        limit > kMaxJobsPerPage) {
      return ErrorResponse(InvalidArgumentError(fmt::format(
          "limit: \"{}\" is not an integer from 1 to {}", it->second, kMaxJobsPerPage)));
    }
    // One more than a page: whether another page follows.
    filter.limit = limit + 1;
  }
  if (const auto it = request.query.find("continue"); it != request.query.end()) {
    if (limit == 0 || !store::ValidateKey("continue", it->second).ok()) {
      return ErrorResponse(InvalidArgumentError(
          limit == 0 ? "continue: only with limit (the token of the page before)"
                     : "continue: not a token this server gave out"));
    }
    filter.start_after = it->second;
  }
  if (!who.is_admin()) {
    // A member's jobs are keyed TEAM/NAME (docs/api.md, "Names").
    filter.name_prefix = control::TeamScopedKey(who.team, "");
  }
  Result<std::vector<store::StoredObject>> jobs =
      options_.store.ListWhere(control::kJobsKind, filter);
  if (!jobs.ok()) {
    return ErrorResponse(jobs.status());
  }
  std::optional<std::string> next;
  if (limit > 0 && jobs->size() > limit) {
    jobs->resize(limit);
    next = jobs->back().name;
  }
  Json items = Json::array();
  for (const store::StoredObject& object : *jobs) {
    Json job = JobOutput(object);
    if (!who.Sees(wire::StrOr(job, "team")) ||
        (!filter.exclude_states && wire::StrOr(job, "state") != filter.states[0]) ||
        (queue && wire::StrOr(job, "queue") != *queue)) {
      continue;
    }
    AnnotateStopping(job);
    HideOtherTeamsJobs(who, job);
    items.push_back(std::move(job));
  }
  Json body = {{"items", std::move(items)}};
  if (next) {
    body["continue"] = *next;
  }
  return JsonResponse(200, body);
}

ApiResponse ApiRoutes::GetJob(const control::Principal& who, std::string_view name) {
  const Result<store::StoredObject> object =
      ReadVisible(who, control::kJobsKind, name, JobNotFound(name));
  if (!object.ok()) {
    return ErrorResponse(object.status());
  }
  Json job = JobOutput(*object);
  AnnotateStopping(job);
  HideOtherTeamsJobs(who, job);
  AddRunGoing(job);
  return JsonResponse(200, job);
}

void ApiRoutes::AddRunGoing(Json& job) {
  const std::optional<control::StampedRun> stamped = control::StampedRunOf(job);
  if (!stamped) {
    return;
  }
  const int64_t now = control_->UsageNowNanos();
  const std::optional<control::RunUsage> run =
      control::RunUsageOfJob(job, now, control_->RunBusy(stamped->name, stamped->busy));
  if (!run) {
    return;
  }
  const int64_t elapsed_ms = std::max<int64_t>(0, (now - run->start_ns) / 1'000'000);
  Json going = {{"elapsed_s", elapsed_ms / 1000}};
  // Busy as the agents measured it (share units x ms) over what the run held for as long.
  if (run->units() > 0 && elapsed_ms > 0) {
    going["busy_pct"] = 100.0 * static_cast<double>(run->busy_unit_ms) /
                        (static_cast<double>(run->units()) * static_cast<double>(elapsed_ms));
  }
  job["progress"] = std::move(going);
}

Result<Json> ApiRoutes::CancelJob(const control::Principal& who, std::string_view name) {
  Result<Json> response = Json();
  const Status committed = store::CommitWithRetries(
      options_.store, control::kCasAttempts,
      fmt::format("job \"{}\" kept changing; retry the cancel", name),
      [&]() -> store::AttemptResult {
        const Result<store::StoredObject> object =
            ReadVisible(who, control::kJobsKind, name, JobNotFound(name));
        if (!object.ok()) {
          response = object.status();
          return store::NoWrite();
        }
        Json doc = wire::ParseDocument(object->data);
        const std::string state = wire::StrOr(doc, "state");
        const std::optional<control::JobState> typed = control::StoredJobState(doc);
        if (typed == control::JobState::kCancelled ||
            (typed == control::JobState::kStopping &&
             wire::StrOr(doc["stopping"], "then") ==
                 control::JobStateName(control::JobState::kCancelled))) {
          response = JobOutput(*object);
          return store::NoWrite();
        }
        const std::string why = fmt::format("cancelled by {}", Who(who));
        // A running job keeps its GPUs until its tasks are gone (Stopping); a waiting one is
        // cancelled at once. A job already stopping for another reason ends Cancelled instead.
        Result<std::string> event = std::string();
        if (typed && control::HoldsResources(*typed)) {
          event = control::EndRun(doc, control::JobState::kCancelled, why, control_->NowText());
        } else {
          event = control::TransitionJob(doc, control::JobState::kCancelled, why,
                                         fmt::format("cancelled by {} (was {})", Who(who), state));
        }
        if (!event.ok()) {
          response = FailedPreconditionError(
              fmt::format("job \"{}\" is {} and cannot be cancelled", name, state));
          return store::NoWrite();
        }
        store::WriteBatch batch;
        control_->AddJobWrite(wire::ParseDocument(object->data), doc, object->version, *event,
                              batch);
        doc["version"] = object->version + 1;
        response = doc;
        return store::Write(std::move(batch));
      });
  if (!committed.ok()) {
    return committed;
  }
  return response;
}

ApiResponse ApiRoutes::JobEvents(const control::Principal& who, std::string_view name) {
  ApiResponse visible = GetJob(who, name);
  if (visible.status != 200) {
    return visible;
  }
  // Repeats of an event count in the job's document (control/event_groups.h).
  const Result<store::StoredObject> job = options_.store.Get(control::kJobsKind, name);
  if (!job.ok() && job.status().code() != StatusCode::kNotFound) {
    return ErrorResponse(job.status());
  }
  Result<Json> items = EventItems(control::kJobsKind, name);
  if (!items.ok()) {
    return ErrorResponse(items.status());
  }
  return JsonResponse(
      200, {{"items",
             control::GroupEventItems(
                 *std::move(items), job.ok() ? wire::ParseDocument(job->data) : Json::object())}});
}

Result<Json> ApiRoutes::EventItems(std::string_view kind, std::string_view name) {
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredEvent> events,
                            options_.store.Events(kind, name));
  Json items = Json::array();
  for (const store::StoredEvent& event : events) {
    const EventText text = ParseEventText(event.text);
    Json item = {{"revision", event.revision}, {"message", std::string(text.message)}};
    if (text.at) {
      item["at"] = *text.at;
    }
    items.push_back(std::move(item));
  }
  return items;
}

ApiResponse ApiRoutes::ObjectEvents(std::string_view kind, std::string_view name) {
  Result<Json> items = EventItems(kind, name);
  if (!items.ok()) {
    return ErrorResponse(items.status());
  }
  return JsonResponse(200, {{"items", *std::move(items)}});
}

// ---- node handlers --------------------------------------------------------------------------

namespace {

// The node document as served: adds the version and each GPU's allocated milli-GPU. The id of
// the node's credential is for admins (who revoke it), not for members.
Json NodeOutput(const control::Principal& who, const store::StoredObject& object,
                const std::map<std::string, std::map<int64_t, int64_t>>& allocation,
                const std::map<std::string, std::string>& excluded) {
  Json node = wire::ParseDocument(object.data);
  node["version"] = object.version;
  if (!who.is_admin()) {
    node.erase("credential");
  }
  if (const auto it = excluded.find(object.name); it != excluded.end()) {
    node["excluded"] = it->second;
  }
  const auto by_gpu = allocation.find(object.name);
  if (node.contains("gpus") && node["gpus"].is_array()) {
    Json& gpus = node["gpus"];
    for (size_t i = 0; i < gpus.size(); ++i) {
      int64_t milli = 0;
      if (by_gpu != allocation.end()) {
        const auto it = by_gpu->second.find(static_cast<int64_t>(i));
        milli = it == by_gpu->second.end() ? 0 : it->second;
      }
      if (gpus[i].is_object()) {
        gpus[i]["allocated_milli"] = milli;
      }
    }
  }
  return node;
}

Status NodeNotFound(std::string_view name) {
  return NotFoundError(fmt::format("node \"{}\" not found", name));
}

}  // namespace

ApiResponse ApiRoutes::ListNodes(const control::Principal& who) {
  const Result<std::vector<store::StoredObject>> nodes = options_.store.List(control::kNodesKind);
  const Result<std::vector<store::StoredObject>> jobs =
      options_.store.ListWhere(control::kJobsKind, control::UnfinishedJobs());
  if (!nodes.ok() || !jobs.ok()) {
    return ErrorResponse(!nodes.ok() ? nodes.status() : jobs.status());
  }
  const auto allocation = AllocationByNode(*jobs, *nodes);
  const std::map<std::string, std::string> excluded = control_->ExcludedNodes();
  Json items = Json::array();
  for (const store::StoredObject& object : *nodes) {
    items.push_back(NodeOutput(who, object, allocation, excluded));
  }
  return JsonResponse(200, {{"items", std::move(items)}});
}

Result<store::StoredObject> ApiRoutes::StoredNode(std::string_view name) {
  return ReadObject(control::kNodesKind, name, NodeNotFound(name));
}

Result<store::StoredObject> ApiRoutes::ReadObject(std::string_view kind, std::string_view name,
                                                  const Status& absent) {
  Result<store::StoredObject> object = options_.store.Get(kind, name);
  if (!object.ok()) {
    const StatusCode code = object.status().code();
    return code == StatusCode::kNotFound || code == StatusCode::kInvalidArgument ? absent
                                                                                 : object.status();
  }
  return object;
}

Result<store::StoredObject> ApiRoutes::ReadVisible(const control::Principal& who,
                                                   std::string_view kind, std::string_view name,
                                                   const Status& absent) {
  Result<store::StoredObject> object = ReadObject(kind, name, absent);
  if (object.ok() && !who.Sees(wire::StrOr(wire::ParseDocument(object->data), "team"))) {
    return absent;
  }
  return object;
}

ApiResponse ApiRoutes::GetNode(const control::Principal& who, std::string_view name) {
  const Result<store::StoredObject> object = StoredNode(name);
  if (!object.ok()) {
    return ErrorResponse(object.status());
  }
  const Result<std::vector<store::StoredObject>> jobs =
      options_.store.ListWhere(control::kJobsKind, control::UnfinishedJobs());
  if (!jobs.ok()) {
    return ErrorResponse(jobs.status());
  }
  return JsonResponse(
      200, NodeOutput(who, *object, AllocationByNode(*jobs, {*object}), control_->ExcludedNodes()));
}

ApiResponse ApiRoutes::DeleteNode(const control::Principal& who, std::string_view name) {
  if (!who.is_admin()) {
    return ErrorResponse(PermissionDenied("deleting a node needs an admin token"));
  }
  const Result<store::StoredObject> object = StoredNode(name);
  if (!object.ok()) {
    return ErrorResponse(object.status());
  }
  const Result<std::vector<store::StoredObject>> jobs =
      options_.store.ListWhere(control::kJobsKind, control::UnfinishedJobs());
  if (!jobs.ok()) {
    return ErrorResponse(jobs.status());
  }
  std::vector<std::string> holders;
  for (const store::StoredObject& job : *jobs) {
    const Json doc = wire::ParseDocument(job.data);
    const std::optional<control::JobState> state = control::StoredJobState(doc);
    const Json& placements = wire::ArrayOr(doc, "placements");
    if (state && control::HoldsResources(*state) &&
        std::any_of(placements.begin(), placements.end(), [&](const Json& placement) {
          return wire::StrOr(placement, "node") == name && !control::PlacementGone(placement);
        })) {
      holders.push_back(job.name);
    }
  }
  if (!holders.empty()) {
    return ErrorResponse(FailedPreconditionError(fmt::format(
        "node \"{}\" holds runs of {} job(s) ({}); drain it and wait for them to end first", name,
        holders.size(), fmt::join(holders, ", "))));
  }
  store::WriteBatch batch;
  batch.Delete(std::string(control::kNodesKind), std::string(name), object->version);
  batch.AppendEvent(std::string(control::kNodesKind), std::string(name),
                    fmt::format("deleted by {}", Who(who)));
  if (Status status = options_.store.Commit(batch); !status.ok()) {
    return ErrorResponse(status);
  }
  control_->ForgetNode(std::string(name));
  return JsonResponse(200, {{"name", name}, {"deleted", true}});
}

ApiResponse ApiRoutes::NodeAction(const control::Principal& who, std::string_view name,
                                  std::string_view action, const std::string& body) {
  if (!who.is_admin()) {
    return ErrorResponse(
        PermissionDenied(fmt::format("{} of a node needs an admin token", action)));
  }
  const bool gpu_action = action == "quarantine" || action == "release";
  std::optional<int64_t> gpu;
  std::string reason;
  if (gpu_action && body.find_first_not_of(" \t\r\n") != std::string::npos) {
    const Result<Json> parsed = wire::ParseJson(body);
    if (!parsed.ok() || !parsed->is_object()) {
      return ErrorResponse(InvalidArgumentError(
          fmt::format("body: must be a JSON object like {{\"gpu\": 3}}{}",
                      parsed.ok() ? "" : fmt::format(" ({})", parsed.status().message()))));
    }
    const Json& j = *parsed;
    if (const auto it = j.find("gpu"); it != j.end()) {
      if (!it->is_number_integer()) {
        return ErrorResponse(
            InvalidArgumentError(fmt::format("gpu: {} (must be an integer)", it->dump())));
      }
      gpu = it->get<int64_t>();
    }
    if (const auto it = j.find("reason"); it != j.end()) {
      if (!it->is_string() || action != "quarantine") {
        return ErrorResponse(InvalidArgumentError(fmt::format(
            "reason: {} ({})", it->dump(),
            action == "quarantine" ? "must be a string" : "only a quarantine has one")));
      }
      reason = it->get<std::string>();
    }
  }
  if (reason.empty()) {
    reason = "quarantined by an operator";
  }
  ApiResponse response;
  bool wrote = false;
  const Status committed = store::CommitWithRetries(
      options_.store, control::kCasAttempts, fmt::format("node \"{}\" kept changing; retry", name),
      [&]() -> store::AttemptResult {
        const Result<store::StoredObject> object = StoredNode(name);
        if (!object.ok()) {
          response = ErrorResponse(object.status());
          return store::NoWrite();
        }
        Json doc = wire::ParseDocument(object->data);
        std::string event;
        store::WriteBatch batch;
        if (gpu_action) {
          if (const Status added = control_->reliability().AddOperatorQuarantine(
                  doc, name, gpu, action == "release", Who(who), reason, batch);
              !added.ok()) {
            response = ErrorResponse(added);
            return store::NoWrite();
          }
          event = gpu ? fmt::format("gpu {} {}d by {}", *gpu, action, Who(who))
                      : fmt::format("every gpu {}d by {}", action, Who(who));
          if (action == "quarantine") {
            event += ": " + reason;
          }
        } else {
          const NodeState state = action == "cordon"  ? NodeState::kCordoned
                                  : action == "drain" ? NodeState::kDraining
                                                      : NodeState::kReady;
          doc["state"] = NodeStateName(state);
          event = fmt::format(
              "{} by {}", action == "drain" ? "drained" : fmt::format("{}ed", action), Who(who));
        }
        batch.Update(std::string(control::kNodesKind), std::string(name), doc.dump(),
                     object->version);
        batch.AppendEvent(std::string(control::kNodesKind), std::string(name), event);
        wrote = true;
        return store::Write(std::move(batch));
      });
  if (!committed.ok()) {
    return ErrorResponse(committed);
  }
  return wrote ? GetNode(who, name) : response;
}

// ---- metrics --------------------------------------------------------------------------------

std::string ApiServer::RenderMetrics() {
  std::string out;
  // The fleet gauges come from the leader's cycles. A server that does not lead exports none of
  // their series (not zeros, nor the store's figures): across the servers each fleet figure is
  // then one series, from the leader, which sum() and alerts read without counting it twice
  // (docs/ha.md, "Roles"). A leader whose lease lapsed keeps its last figures but omits them too.
  control::FleetGauges gauges;
  std::map<std::string, int64_t> agents_by_protocol;
  if (leading()) {
    gauges = control_->Gauges();
    agents_by_protocol = control_->AgentsByProtocol();
  }
  out += "# HELP gpufleet_jobs_pending Jobs waiting to be scheduled, by queue.\n";
  out += "# TYPE gpufleet_jobs_pending gauge\n";
  for (const auto& [queue, count] : gauges.pending_by_queue) {
    out += fmt::format("gpufleet_jobs_pending{{queue=\"{}\"}} {}\n", EscapeLabel(queue), count);
  }
  out += "# HELP gpufleet_gpus_allocated GPUs held by scheduled and running jobs, by model.\n";
  out += "# TYPE gpufleet_gpus_allocated gauge\n";
  for (const auto& [model, milli] : gauges.allocated_milli_by_model) {
    out += fmt::format("gpufleet_gpus_allocated{{model=\"{}\"}} {}\n", EscapeLabel(model),
                       Gauge(static_cast<double>(milli) / static_cast<double>(kMilliPerUnit)));
  }
  out += "# HELP gpufleet_gpus_total GPUs of the registered nodes, by model.\n";
  out += "# TYPE gpufleet_gpus_total gauge\n";
  for (const auto& [model, count] : gauges.gpus_by_model) {
    out += fmt::format("gpufleet_gpus_total{{model=\"{}\"}} {}\n", EscapeLabel(model), count);
  }
  if (!gauges.target_source.empty()) {
    out +=
        "# HELP gpufleet_target_workload_shapes Task shapes in the placement policy's target "
        "workload, by policy and by where they came from: history (the jobs this server "
        "started), pending (the jobs waiting, before any started) or none (best-fit meanwhile).\n";
    out += "# TYPE gpufleet_target_workload_shapes gauge\n";
    out += fmt::format("gpufleet_target_workload_shapes{{policy=\"{}\",source=\"{}\"}} {}\n",
                       EscapeLabel(options_.policy), gauges.target_source, gauges.target_shapes);
  }
  out +=
      "# HELP gpufleet_agents Agents by the protocol version of their last registration or "
      "heartbeat (a rolling upgrade is done when one version remains).\n";
  out += "# TYPE gpufleet_agents gauge\n";
  for (const auto& [protocol, count] : agents_by_protocol) {
    out += fmt::format("gpufleet_agents{{protocol=\"{}\"}} {}\n", EscapeLabel(protocol), count);
  }
  if (leading()) {
    out +=
        "# HELP gpufleet_reliability_breaker_open 1 while the reliability loop's circuit breaker "
        "holds off automatic drains and quarantines (docs/reliability.md, \"The loop\").\n";
    out += "# TYPE gpufleet_reliability_breaker_open gauge\n";
    out += fmt::format("gpufleet_reliability_breaker_open {}\n",
                       control_->reliability().breaker_open() ? 1 : 0);
  }
  out += RenderLeadership();
  std::lock_guard<std::mutex> lock(metrics_->mu);
  out += "# HELP gpufleet_scheduling_cycle_seconds Duration of one scheduling cycle.\n";
  out += "# TYPE gpufleet_scheduling_cycle_seconds histogram\n";
  out += metrics_->cycles.Render("gpufleet_scheduling_cycle_seconds", "");
  out +=
      "# HELP gpufleet_scheduling_cycle_step_seconds_total Wall time the scheduling cycles spent "
      "in each step.\n";
  out += "# TYPE gpufleet_scheduling_cycle_step_seconds_total counter\n";
  for (const auto& [step, seconds] : metrics_->cycle_step_seconds) {
    out += fmt::format("gpufleet_scheduling_cycle_step_seconds_total{{step=\"{}\"}} {}\n", step,
                       Gauge(seconds));
  }
  out +=
      "# HELP gpufleet_image_pull_seconds Time an agent took to pull a task's image before its "
      "start.\n";
  out += "# TYPE gpufleet_image_pull_seconds histogram\n";
  out += metrics_->image_pulls.Render("gpufleet_image_pull_seconds", "");
  out += "# HELP gpufleet_api_requests_total API requests served, by route and HTTP status.\n";
  out += "# TYPE gpufleet_api_requests_total counter\n";
  for (const auto& [key, histogram] : metrics_->requests) {
    out += fmt::format("gpufleet_api_requests_total{{route=\"{}\",code=\"{}\"}} {}\n",
                       EscapeLabel(key.first), key.second, histogram.count);
  }
  out +=
      "# HELP gpufleet_api_request_seconds Time to serve an API request, by route and HTTP "
      "status.\n";
  out += "# TYPE gpufleet_api_request_seconds histogram\n";
  for (const auto& [key, histogram] : metrics_->requests) {
    out += histogram.Render(
        "gpufleet_api_request_seconds",
        fmt::format("route=\"{}\",code=\"{}\",", EscapeLabel(key.first), key.second));
  }
  return out;
}

std::string ApiServer::RenderLeadership() const {
  std::string out;
  out +=
      "# HELP gpufleet_server_leader Whether this server leads (runs the scheduling loop and the "
      "controllers, accepts writes): 1, or 0 for a follower.\n";
  out += "# TYPE gpufleet_server_leader gauge\n";
  if (options_.election == nullptr) {
    out += "gpufleet_server_leader{server=\"local\"} 1\n";
    return out;
  }
  out += fmt::format("gpufleet_server_leader{{server=\"{}\"}} {}\n",
                     EscapeLabel(options_.election->identity()), leading() ? 1 : 0);
  std::lock_guard<std::mutex> lock(lease_mu_);
  out +=
      "# HELP gpufleet_leader_info The leader this server last saw holding the lease, by identity "
      "and address (empty while none holds it).\n";
  out += "# TYPE gpufleet_leader_info gauge\n";
  out += fmt::format("gpufleet_leader_info{{leader=\"{}\",address=\"{}\"}} 1\n",
                     EscapeLabel(lease_.holder), EscapeLabel(lease_.address));
  out += "# HELP gpufleet_leader_fencing_token The fencing token of the lease last seen.\n";
  out += "# TYPE gpufleet_leader_fencing_token gauge\n";
  out += fmt::format("gpufleet_leader_fencing_token {}\n", lease_.token);
  return out;
}

}  // namespace gpufleet::api
