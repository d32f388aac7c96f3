// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/api/server.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "gpufleet/api/http.h"
#include "gpufleet/api/job_spec.h"
#include "gpufleet/api/json_fields.h"
#include "gpufleet/api/json_scan.h"
#include "gpufleet/api/node_json.h"
#include "gpufleet/api/tls.h"
#include "gpufleet/core/random.h"
#include "gpufleet/scheduler/registry.h"
#include "gpufleet/scheduler/snapshot.h"

namespace gpufleet::api {
namespace {

constexpr std::string_view kTopologyName = "topology";

constexpr std::array<std::string_view, 7> kJobStates = {
    "Pending", "Scheduled", "Running", "Succeeded", "Failed", "Cancelled", "Preempted"};

// ---- responses --------------------------------------------------------------------------

ApiResponse JsonResponse(int status, const Json& body) {
  ApiResponse response;
  response.status = status;
  response.body = body.dump() + "\n";
  return response;
}

ApiResponse ErrorResponse(const Status& status) {
  ApiResponse response;
  response.status = HttpStatusOf(status.code());
  response.body = ErrorBody(status);
  return response;
}

Status PermissionDenied(std::string message) {
  return Status(StatusCode::kPermissionDenied, std::move(message));
}

// ---- jobs -------------------------------------------------------------------------------

Json PlacementsToJson(const std::vector<scheduler::TaskPlacement>& placements, const Job& job,
                      const scheduler::ClusterSnapshot& snapshot) {
  Json out = Json::array();
  for (const scheduler::TaskPlacement& placement : placements) {
    const scheduler::NodeInfo& info = snapshot.nodes()[placement.node];
    const std::string group_name =
        placement.group >= 0 && placement.group < static_cast<int>(job.groups.size())
            ? job.groups[placement.group].name
            : fmt::format("group{}", placement.group);
    Json gpus = Json::array();
    Json assignments = Json::array();
    for (const scheduler::GpuAssignment& a : placement.gpus) {
      gpus.push_back(info.node->gpus[a.gpu].index);
      assignments.push_back({{"gpu", a.gpu},
                             {"milli", a.milli},
                             {"memory_mib", a.memory_mib},
                             {"mig_profile", a.mig_profile},
                             {"mig_start", a.mig_start},
                             {"mig_created", a.mig_created}});
    }
    out.push_back({{"task", fmt::format("{}-{}", group_name, placement.replica)},
                   {"node", info.node->id.value()},
                   {"gpus", std::move(gpus)},
                   {"group", placement.group},
                   {"replica", placement.replica},
                   {"cpu_milli", placement.host.cpu_milli},
                   {"memory_mib", placement.host.memory_mib},
                   {"assignments", std::move(assignments)}});
  }
  return out;
}

// The placements of a stored job against `snapshot`; nullopt if a node is gone.
std::optional<std::vector<scheduler::TaskPlacement>> PlacementsFromJson(
    const Json& placements, const std::map<std::string, int>& node_index) {
  std::vector<scheduler::TaskPlacement> out;
  if (!placements.is_array()) {
    return out;
  }
  for (const Json& p : placements) {
    const auto it = node_index.find(StrOr(p, "node"));
    if (it == node_index.end()) {
      return std::nullopt;
    }
    scheduler::TaskPlacement placement;
    placement.group = static_cast<int>(IntOr(p, "group", 0));
    placement.replica = static_cast<int>(IntOr(p, "replica", 0));
    placement.node = it->second;
    placement.host.cpu_milli = IntOr(p, "cpu_milli", 0);
    placement.host.memory_mib = IntOr(p, "memory_mib", 0);
    for (const Json& a : ArrayOr(p, "assignments")) {
      scheduler::GpuAssignment assignment;
      assignment.gpu = static_cast<int>(IntOr(a, "gpu", 0));
      assignment.milli = IntOr(a, "milli", 0);
      assignment.memory_mib = IntOr(a, "memory_mib", 0);
      assignment.mig_profile = StrOr(a, "mig_profile");
      assignment.mig_start = static_cast<int>(IntOr(a, "mig_start", -1));
      if (const auto created = a.find("mig_created"); created != a.end() && created->is_boolean()) {
        assignment.mig_created = created->get<bool>();
      }
      placement.gpus.push_back(std::move(assignment));
    }
    out.push_back(std::move(placement));
  }
  return out;
}

bool HoldsResources(std::string_view state) {
  return state == "Scheduled" || state == "Running";
}

// Members see their own team's jobs only.
bool CanSee(const Principal& who, const Json& job) {
  return who.is_admin() || StrOr(job, "team") == who.team;
}

Json JobOutput(const store::StoredObject& object) {
  Json j = ParseDocument(object.data);
  j["version"] = object.version;
  return j;
}

std::string Who(const Principal& who) {
  return who.name.empty() ? RoleName(who.role) : who.name;
}

// Unix nanoseconds as RFC 3339 in UTC to the second, e.g. "2026-11-29T20:39:00Z".
std::string FormatRfc3339(int64_t unix_nanos) {
  const auto time = std::chrono::floor<std::chrono::seconds>(
      std::chrono::sys_time<std::chrono::nanoseconds>(std::chrono::nanoseconds(unix_nanos)));
  const auto day = std::chrono::floor<std::chrono::days>(time);
  const std::chrono::year_month_day date(day);
  const std::chrono::hh_mm_ss clock_time(time - day);
  return fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z", static_cast<int>(date.year()),
                     static_cast<unsigned>(date.month()), static_cast<unsigned>(date.day()),
                     clock_time.hours().count(), clock_time.minutes().count(),
                     clock_time.seconds().count());
}

Status JobNotFound(std::string_view name) {
  return NotFoundError(fmt::format("job \"{}\" not found", name));
}

// Allocated milli-GPU per (node name, GPU position) of the jobs holding resources.
std::map<std::string, std::map<int64_t, int64_t>> AllocationByNode(
    const std::vector<store::StoredObject>& jobs) {
  std::map<std::string, std::map<int64_t, int64_t>> out;
  for (const store::StoredObject& object : jobs) {
    const Json job = ParseDocument(object.data);
    if (!HoldsResources(StrOr(job, "state"))) {
      continue;
    }
    for (const Json& p : ArrayOr(job, "placements")) {
      for (const Json& a : ArrayOr(p, "assignments")) {
        out[StrOr(p, "node")][IntOr(a, "gpu", 0)] += IntOr(a, "milli", 0);
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

// ---- status mapping (the only one in the project) -----------------------------------------

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
  // One Prometheus histogram over kBuckets (bucket counts not cumulative).
  struct Histogram {
    std::array<uint64_t, kBuckets.size()> buckets{};
    uint64_t count = 0;
    double sum = 0;

    void Observe(double seconds) {
      for (size_t i = 0; i < kBuckets.size(); ++i) {
        if (seconds <= kBuckets[i]) {
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
      for (size_t i = 0; i < kBuckets.size(); ++i) {
        cumulative += buckets[i];
        out += fmt::format("{}_bucket{{{}le=\"{}\"}} {}\n", name, labels, Gauge(kBuckets[i]),
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
  std::map<std::pair<std::string, int>, Histogram> requests;  // guarded by mu
  Histogram cycles;                                           // guarded by mu

  void ObserveRequest(const std::string& route, int code, double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    requests[{route, code}].Observe(seconds);
  }
  void ObserveCycle(double seconds) {
    std::lock_guard<std::mutex> lock(mu);
    cycles.Observe(seconds);
  }
};

// ---- construction, start, stop --------------------------------------------------------------

Result<std::unique_ptr<ApiServer>> ApiServer::Create(Options options) {
  scheduler::SchedulerOptions scheduler_options;
  scheduler_options.policy = options.policy;
  GPUFLEET_ASSIGN_OR_RETURN(
      std::unique_ptr<scheduler::Scheduler> sched,
      scheduler::Scheduler::Create(scheduler_options, scheduler::PluginRegistry::Default()));
  auto server = std::unique_ptr<ApiServer>(new ApiServer(std::move(options), std::move(sched)));
  GPUFLEET_RETURN_IF_ERROR(server->EnsureDefaultQueue());
  return server;
}

ApiServer::ApiServer(Options options, std::unique_ptr<scheduler::Scheduler> sched)
    : options_(std::move(options)),
      authenticator_(options_.store),
      started_at_(options_.clock.Now()),
      scheduler_(std::move(sched)),
      metrics_(std::make_unique<Metrics>()) {}

ApiServer::~ApiServer() {
  Stop();
}

Result<int> ApiServer::Start(const std::string& host, int port,
                             const std::optional<TlsFiles>& tls) {
  std::lock_guard<std::mutex> lock(loop_mu_);
  if (started_) {
    return FailedPreconditionError("server already started");
  }
  std::unique_ptr<httplib::Server> http;
  if (tls.has_value()) {
    GPUFLEET_RETURN_IF_ERROR(CheckTlsFiles(tls->cert_file, tls->key_file));
    auto https =
        std::make_unique<httplib::SSLServer>(tls->cert_file.c_str(), tls->key_file.c_str());
    if (!https->is_valid()) {
      return InvalidArgumentError(fmt::format("TLS certificate \"{}\" or key \"{}\" not usable",
                                              tls->cert_file, tls->key_file));
    }
    http = std::move(https);
  } else {
    http = std::make_unique<httplib::Server>();
  }
  http->set_payload_max_length(kMaxRequestBodyBytes);
  // Answers go out as headers then body: without this, Nagle's algorithm holds the body until
  // the client's delayed ACK, about 40 ms per request on a kept-alive connection.
  http->set_tcp_nodelay(true);
  const auto handler = [this](const httplib::Request& req, httplib::Response& res) {
    ApiRequest request;
    request.method = req.method;
    request.path = req.path;
    for (const auto& [key, value] : req.params) {
      request.query.emplace(key, value);
    }
    request.authorization = req.get_header_value("Authorization");
    request.body = req.body;
    const ApiResponse response = Handle(request);
    res.status = response.status;
    res.set_content(response.body, response.content_type.c_str());
  };
  http->Get(".*", handler);
  http->Post(".*", handler);
  // Answers the library produced itself (413 for a large body, 404 for another method).
  http->set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) {
      return;
    }
    Status status;
    if (res.status == 413) {
      status = Status(StatusCode::kResourceExhausted,
                      fmt::format("request body over {} bytes", kMaxRequestBodyBytes));
    } else if (res.status == 404 || res.status == 405) {
      status = NotFoundError(fmt::format("no route {} {}", req.method, req.path));
    } else if (res.status < 500) {
      status = InvalidArgumentError(fmt::format(
          "malformed HTTP request (HTTP {}; a POST needs a Content-Length)", res.status));
    } else {
      status = InternalError(fmt::format("HTTP {}", res.status));
    }
    res.set_content(ErrorBody(status), "application/json");
    metrics_->ObserveRequest("unmatched", res.status, 0);
  });
  int bound = port;
  if (port == 0) {
    bound = http->bind_to_any_port(host);
  } else if (!http->bind_to_port(host, port)) {
    bound = -1;
  }
  if (bound < 0) {
    return UnavailableError(fmt::format("cannot listen on {}:{}", host, port));
  }
  http_ = std::move(http);
  stopping_ = false;
  started_ = true;
  http_done_ = false;
  http_thread_ = std::thread([this] {
    http_->listen_after_bind();
    {
      std::lock_guard<std::mutex> done_lock(loop_mu_);
      http_done_ = true;
    }
    loop_cv_.notify_all();
  });
  loop_thread_ = std::thread([this] { LoopMain(); });
  return bound;
}

void ApiServer::Stop() {
  {
    std::lock_guard<std::mutex> lock(loop_mu_);
    if (!started_) {
      return;
    }
    stopping_ = true;
    started_ = false;
  }
  loop_cv_.notify_all();
  {
    // httplib drops a stop() that comes before its accept loop has started, so ask again until
    // the loop has returned; each wait ends as soon as it does.
    std::unique_lock<std::mutex> lock(loop_mu_);
    while (!http_done_) {
      lock.unlock();
      http_->stop();
      lock.lock();
      loop_cv_.wait_for(lock, std::chrono::milliseconds(10), [this] { return http_done_; });
    }
  }
  if (http_thread_.joinable()) {
    http_thread_.join();
  }
  if (loop_thread_.joinable()) {
    loop_thread_.join();
  }
  http_.reset();
}

void ApiServer::LoopMain() {
  std::unique_lock<std::mutex> lock(loop_mu_);
  while (!stopping_) {
    lock.unlock();
    const Result<int> result = RunSchedulingCycle();
    if (!result.ok()) {
      fmt::print(stderr, "gpufleet server: scheduling cycle failed: {}\n",
                 result.status().ToString());
    }
    lock.lock();
    loop_cv_.wait_for(lock, options_.cycle_interval, [this] { return stopping_; });
  }
}

// ---- nodes and the cluster ------------------------------------------------------------------

Result<int> ApiServer::RegisterNodes(const Cluster& cluster) {
  GPUFLEET_RETURN_IF_ERROR(cluster.Validate(options_.catalog));
  const std::vector<std::string>& levels = cluster.topology.levels();
  store::WriteBatch batch;
  Result<store::StoredObject> topology = options_.store.Get(kClusterKind, kTopologyName);
  if (topology.ok()) {
    const Json recorded = ParseDocument(topology->data);
    std::vector<std::string> recorded_levels;
    for (const Json& level : ArrayOr(recorded, "levels")) {
      recorded_levels.push_back(level.is_string() ? level.get<std::string>() : "");
    }
    if (recorded_levels != levels) {
      return InvalidArgumentError(fmt::format("topology levels [{}] differ from the recorded [{}]",
                                              fmt::join(levels, ", "),
                                              fmt::join(recorded_levels, ", ")));
    }
  } else if (topology.status().code() == StatusCode::kNotFound) {
    batch.Create(std::string(kClusterKind), std::string(kTopologyName),
                 Json{{"levels", levels}}.dump());
  } else {
    return topology.status();
  }
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> existing,
                            options_.store.List(kNodesKind));
  std::set<std::string> names;
  for (const store::StoredObject& object : existing) {
    names.insert(object.name);
  }
  int added = 0;
  for (const Node& node : cluster.nodes) {
    if (names.count(node.id.value()) > 0) {
      continue;
    }
    batch.Create(std::string(kNodesKind), node.id.value(), NodeToJson(node, levels).dump());
    batch.AppendEvent(std::string(kNodesKind), node.id.value(), "registered");
    ++added;
  }
  GPUFLEET_RETURN_IF_ERROR(options_.store.Commit(batch));
  return added;
}

Result<Cluster> ApiServer::LoadCluster() {
  Cluster cluster;
  Result<store::StoredObject> topology = options_.store.Get(kClusterKind, kTopologyName);
  if (topology.ok()) {
    std::vector<std::string> levels;
    const Json recorded = ParseDocument(topology->data);
    for (const Json& level : ArrayOr(recorded, "levels")) {
      if (level.is_string()) {
        levels.push_back(level.get<std::string>());
      }
    }
    cluster.topology = Topology(std::move(levels));
  } else if (topology.status().code() != StatusCode::kNotFound) {
    return topology.status();
  }
  GPUFLEET_ASSIGN_OR_RETURN(const std::vector<store::StoredObject> nodes,
                            options_.store.List(kNodesKind));
  for (const store::StoredObject& object : nodes) {
    GPUFLEET_ASSIGN_OR_RETURN(Node node,
                              NodeFromJson(ParseDocument(object.data), cluster.topology.levels()));
    cluster.nodes.push_back(std::move(node));
  }
  return cluster;
}

// ---- the scheduling cycle -------------------------------------------------------------------

Result<int> ApiServer::RunSchedulingCycle() {
  std::lock_guard<std::mutex> lock(cycle_mu_);
  const MonoTime start = options_.clock.Now();
  Result<int> result = RunCycleLocked();
  const Duration elapsed = options_.clock.Now() - start;
  metrics_->ObserveCycle(std::chrono::duration<double>(elapsed).count());
  ++cycle_count_;
  if (result.ok()) {
    ready_.store(true);
  }
  return result;
}

Result<int> ApiServer::RunCycleLocked() {
  GPUFLEET_RETURN_IF_ERROR(MarkSilentNodesNotReady());
  GPUFLEET_ASSIGN_OR_RETURN(Cluster cluster, LoadCluster());
  std::set<std::string> not_ready;
  for (const Node& node : cluster.nodes) {
    if (node.state == NodeState::kNotReady) {
      not_ready.insert(node.id.value());
    }
  }
  GPUFLEET_ASSIGN_OR_RETURN(
      scheduler::ClusterSnapshot snapshot,
      scheduler::ClusterSnapshot::Build(std::move(cluster), options_.catalog));
  std::map<std::string, int> node_index;
  for (const scheduler::NodeInfo& info : snapshot.nodes()) {
    node_index[info.node->id.value()] = info.index;
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::vector<store::StoredObject> jobs, options_.store.List(kJobsKind));
  // Finished jobs are most of the store and matter to no cycle: drop them before any parsing.
  std::erase_if(jobs, [](const store::StoredObject& object) {
    const std::optional<std::string> state = TopLevelString(object.data, "state");
    return state == "Succeeded" || state == "Failed" || state == "Cancelled";
  });
  IndexActiveJobs(jobs);

  struct PendingJob {
    const store::StoredObject* object;
    Json doc;
    int priority;
    int64_t seq;
  };
  std::vector<PendingJob> pending;
  for (const store::StoredObject& object : jobs) {
    Json doc = ParseDocument(object.data);
    const std::string state = StrOr(doc, "state");
    if (HoldsResources(state) && !not_ready.empty()) {
      if (const std::optional<std::string> event = EndRunOnNotReadyNodes(doc, not_ready)) {
        // Its GPUs are free from now on; a requeued job is placed from the next cycle.
        store::WriteBatch batch;
        batch.Update(std::string(kJobsKind), object.name, doc.dump(), object.version);
        batch.AppendEvent(std::string(kJobsKind), object.name, *event);
        if (Status status = options_.store.Commit(batch);
            !status.ok() && status.code() != StatusCode::kAborted) {
          return status;
        }
        continue;
      }
    }
    if (HoldsResources(state)) {
      const std::optional<std::vector<scheduler::TaskPlacement>> placements =
          PlacementsFromJson(doc["placements"], node_index);
      if (!placements) {
        fmt::print(stderr, "gpufleet server: jobs/{}: a node of its placements is gone\n",
                   object.name);
        continue;
      }
      for (const scheduler::TaskPlacement& placement : *placements) {
        // A placement that no longer fits (never expected: commits are compare-and-set) is
        // reported and left out rather than oversubscribing a GPU.
        if (Status status = snapshot.Apply(placement); !status.ok()) {
          fmt::print(stderr, "gpufleet server: jobs/{}: {}\n", object.name, status.ToString());
        }
      }
    } else if (state == "Pending") {
      const int priority = static_cast<int>(IntOr(doc, "priority", 0));
      const int64_t seq = IntOr(doc, "submit_seq", 0);
      pending.push_back({&object, std::move(doc), priority, seq});
    }
  }
  std::stable_sort(pending.begin(), pending.end(), [](const PendingJob& a, const PendingJob& b) {
    return std::tie(b.priority, a.seq) < std::tie(a.priority, b.seq);
  });

  Random random(options_.seed + cycle_count_);
  int scheduled = 0;
  for (PendingJob& entry : pending) {
    const store::StoredObject& object = *entry.object;
    Json& doc = entry.doc;
    Result<Job> job = ParseJobSpec(doc["spec"].dump(), options_.catalog);
    std::string reason;
    store::WriteBatch batch;
    std::vector<scheduler::TaskPlacement> placed;
    std::set<std::string> node_names;
    if (!job.ok()) {
      reason = fmt::format("stored spec is invalid: {}", job.status().message());
    } else {
      scheduler::ScheduleResult result = scheduler_->Schedule(*job, snapshot, random);
      if (result.scheduled()) {
        placed = std::move(result.placements);
        doc["state"] = "Scheduled";
        doc["attempt"] = IntOr(doc, "attempt", 0) + 1;
        doc["reason"] = "";
        doc["placements"] = PlacementsToJson(placed, *job, snapshot);
        for (const scheduler::TaskPlacement& placement : placed) {
          node_names.insert(snapshot.nodes()[placement.node].node->id.value());
        }
        batch.Update(std::string(kJobsKind), object.name, doc.dump(), object.version);
        batch.AppendEvent(std::string(kJobsKind), object.name,
                          fmt::format("scheduled on {}", fmt::join(node_names, ", ")));
      } else {
        reason = result.outcome == scheduler::ScheduleOutcome::kError ? result.error.message()
                                                                      : result.reason;
      }
    }
    if (placed.empty()) {
      if (reason == StrOr(doc, "reason")) {
        continue;
      }
      doc["reason"] = reason;
      batch.Update(std::string(kJobsKind), object.name, doc.dump(), object.version);
      batch.AppendEvent(std::string(kJobsKind), object.name,
                        fmt::format("unschedulable: {}", reason));
    }
    const Status status = options_.store.Commit(batch);
    if (!status.ok()) {
      // The job changed under us (cancelled, say): give the resources back; the next cycle
      // sees its new state. Other errors fail the cycle.
      for (auto it = placed.rbegin(); it != placed.rend(); ++it) {
        snapshot.Revert(*it);
      }
      if (status.code() == StatusCode::kAborted || status.code() == StatusCode::kNotFound) {
        continue;
      }
      return status;
    }
    if (!placed.empty()) {
      IndexScheduledJob(object.name, node_names);
      ++scheduled;
    }
  }
  return scheduled;
}

// ---- routing ------------------------------------------------------------------------------

ApiResponse ApiServer::Handle(const ApiRequest& request) {
  const MonoTime start = options_.clock.Now();
  ApiResponse response;
  if (request.body.size() > kMaxRequestBodyBytes) {
    response =
        ErrorResponse(Status(StatusCode::kResourceExhausted,
                             fmt::format("request body over {} bytes", kMaxRequestBodyBytes)));
    response.status = 413;
    response.route = "unmatched";
  } else {
    response = Route(request);
  }
  metrics_->ObserveRequest(response.route, response.status,
                           std::chrono::duration<double>(options_.clock.Now() - start).count());
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
    ApiResponse response;
    response.content_type = "text/plain; version=0.0.4";
    response.body = RenderMetrics();
    return routed(std::move(response), "/metrics");
  }
  if (n < 2 || segments[0] != "v1" || (!get && !post)) {
    return no_route();
  }
  const Result<Principal> who = authenticator_.Authenticate(request.authorization);
  const std::string_view collection = segments[1];
  std::string route = fmt::format("/v1/{}", collection);
  if (n >= 3) {
    route += "/{name}";
  }
  if (n == 4) {
    route += fmt::format("/{}", segments[3]);
  }
  if (!who.ok()) {
    return routed(ErrorResponse(who.status()), route);
  }
  if (who->role == Role::kAgent && collection != "agents") {
    return routed(
        ErrorResponse(PermissionDenied("an agent token may only register and send heartbeats")),
        route);
  }
  if (collection == "jobs") {
    if (n == 2 && post) {
      return routed(SubmitJob(*who, request), route);
    }
    if (n == 2 && get) {
      return routed(ListJobs(*who, request), route);
    }
    if (n == 3 && get) {
      return routed(GetJob(*who, segments[2]), route);
    }
    if (n == 4 && post && segments[3] == "cancel") {
      return routed(CancelJob(*who, segments[2]), route);
    }
    if (n == 4 && get && segments[3] == "events") {
      return routed(JobEvents(*who, segments[2]), route);
    }
  } else if (collection == "agents") {
    // The agent protocol (docs/agent.md): POST /v1/agents/register, /v1/agents/NODE/heartbeat.
    Result<AgentReply> reply = Status(StatusCode::kNotFound, "");
    if (n == 3 && post && segments[2] == "register") {
      route = "/v1/agents/register";
      reply = RegisterAgent(*who, request.body);
    } else if (n == 4 && post && segments[3] == "heartbeat") {
      reply = AgentHeartbeat(*who, segments[2], request.body);
    } else {
      return no_route();
    }
    if (!reply.ok()) {
      return routed(ErrorResponse(reply.status()), route);
    }
    ApiResponse response;
    response.body = AgentReplyToJson(*reply) + "\n";
    return routed(std::move(response), route);
  } else if (collection == "nodes") {
    if (n == 2 && get) {
      return routed(ListNodes(), route);
    }
    if (n == 3 && get) {
      return routed(GetNode(segments[2]), route);
    }
    if (n == 4 && get && segments[3] == "events") {
      ApiResponse node = GetNode(segments[2]);
      return routed(node.status == 200 ? ObjectEvents(kNodesKind, segments[2]) : node, route);
    }
    static const std::set<std::string_view> kActions = {"cordon", "uncordon", "drain", "quarantine",
                                                        "release"};
    if (n == 4 && post && kActions.count(segments[3]) > 0) {
      return routed(NodeAction(*who, segments[2], segments[3], request.body), route);
    }
  } else if (std::optional<ApiResponse> response = RouteTenancy(*who, request, segments)) {
    return routed(std::move(*response), route);
  }
  return no_route();
}

// ---- job handlers ---------------------------------------------------------------------------

ApiResponse ApiServer::SubmitJob(const Principal& who, const ApiRequest& request) {
  Result<Job> job = ParseJobSpec(request.body, options_.catalog);
  if (!job.ok()) {
    return ErrorResponse(job.status());
  }
  const std::string& name = job->id.value();
  if (Status status = store::ValidateKey("metadata.name", name); !status.ok()) {
    return ErrorResponse(status);
  }
  // Submit order: the store revision before the commit. Concurrent submits may share a value;
  // the job name then breaks the tie (the loop's sort is stable over the name-ordered list).
  const Result<int64_t> revision = options_.store.Revision();
  if (!revision.ok()) {
    return ErrorResponse(revision.status());
  }
  const std::string queue = job->queue.empty() ? "default" : job->queue.value();
  if (Status status = CheckSubmission(who, queue); !status.ok()) {
    return ErrorResponse(status);
  }
  Json doc = {{"name", name},
              {"team", who.team},
              {"queue", queue},
              {"labels", job->labels},
              {"state", "Pending"},
              {"reason", ""},
              {"spec", JobSpecToJson(*job)},
              {"placements", Json::array()},
              {"priority", job->priority},
              {"submit_seq", *revision + 1},
              {"submitted_by", Who(who)}};
  if (options_.wall_clock != nullptr) {
    doc["created_at"] = FormatRfc3339(options_.wall_clock->UnixNanos());
  }
  store::WriteBatch batch;
  batch.Create(std::string(kJobsKind), name, doc.dump());
  batch.AppendEvent(std::string(kJobsKind), name,
                    fmt::format("submitted by {} to queue {}", Who(who), queue));
  if (Status status = options_.store.Commit(batch); !status.ok()) {
    if (status.code() == StatusCode::kAlreadyExists) {
      return ErrorResponse(AlreadyExistsError(fmt::format("job \"{}\" already exists", name)));
    }
    return ErrorResponse(status);
  }
  doc["version"] = 1;
  return JsonResponse(201, doc);
}

ApiResponse ApiServer::ListJobs(const Principal& who, const ApiRequest& request) {
  std::optional<std::string> state;
  std::optional<std::string> queue;
  if (const auto it = request.query.find("state"); it != request.query.end()) {
    if (std::find(kJobStates.begin(), kJobStates.end(), it->second) == kJobStates.end()) {
      return ErrorResponse(InvalidArgumentError(fmt::format(
          "state: unknown \"{}\" (valid: {})", it->second, fmt::join(kJobStates, ", "))));
    }
    state = it->second;
  }
  if (const auto it = request.query.find("queue"); it != request.query.end()) {
    queue = it->second;
  }
  const Result<std::vector<store::StoredObject>> jobs = options_.store.List(kJobsKind);
  if (!jobs.ok()) {
    return ErrorResponse(jobs.status());
  }
  Json items = Json::array();
  for (const store::StoredObject& object : *jobs) {
    Json job = JobOutput(object);
    if (!CanSee(who, job) || (state && StrOr(job, "state") != *state) ||
        (queue && StrOr(job, "queue") != *queue)) {
      continue;
    }
    items.push_back(std::move(job));
  }
  return JsonResponse(200, {{"items", std::move(items)}});
}

ApiResponse ApiServer::GetJob(const Principal& who, std::string_view name) {
  const Result<store::StoredObject> object = options_.store.Get(kJobsKind, name);
  if (!object.ok()) {
    return ErrorResponse(object.status().code() == StatusCode::kNotFound ||
                                 object.status().code() == StatusCode::kInvalidArgument
                             ? JobNotFound(name)
                             : object.status());
  }
  Json job = JobOutput(*object);
  if (!CanSee(who, job)) {
    return ErrorResponse(JobNotFound(name));
  }
  return JsonResponse(200, job);
}

ApiResponse ApiServer::CancelJob(const Principal& who, std::string_view name) {
  for (int attempt = 0; attempt < kCasAttempts; ++attempt) {
    const Result<store::StoredObject> object = options_.store.Get(kJobsKind, name);
    if (!object.ok()) {
      return ErrorResponse(object.status().code() == StatusCode::kNotFound ||
                                   object.status().code() == StatusCode::kInvalidArgument
                               ? JobNotFound(name)
                               : object.status());
    }
    Json doc = ParseDocument(object->data);
    if (!CanSee(who, doc)) {
      return ErrorResponse(JobNotFound(name));
    }
    const std::string state = StrOr(doc, "state");
    if (state == "Cancelled") {
      return JsonResponse(200, JobOutput(*object));
    }
    if (state != "Pending" && !HoldsResources(state)) {
      return ErrorResponse(FailedPreconditionError(
          fmt::format("job \"{}\" is {} and cannot be cancelled", name, state)));
    }
    doc["state"] = "Cancelled";
    doc["reason"] = fmt::format("cancelled by {}", Who(who));
    // The placements are dropped: the GPUs are free for the next cycle.
    doc["placements"] = Json::array();
    store::WriteBatch batch;
    batch.Update(std::string(kJobsKind), std::string(name), doc.dump(), object->version);
    batch.AppendEvent(std::string(kJobsKind), std::string(name),
                      fmt::format("cancelled by {} (was {})", Who(who), state));
    const Status status = options_.store.Commit(batch);
    if (status.ok()) {
      doc["version"] = object->version + 1;
      return JsonResponse(200, doc);
    }
    if (status.code() != StatusCode::kAborted) {
      return ErrorResponse(status);
    }
  }
  return ErrorResponse(Status(StatusCode::kAborted,
                              fmt::format("job \"{}\" kept changing; retry the cancel", name)));
}

ApiResponse ApiServer::JobEvents(const Principal& who, std::string_view name) {
  ApiResponse visible = GetJob(who, name);
  if (visible.status != 200) {
    return visible;
  }
  return ObjectEvents(kJobsKind, name);
}

ApiResponse ApiServer::ObjectEvents(std::string_view kind, std::string_view name) {
  const Result<std::vector<store::StoredEvent>> events = options_.store.Events(kind, name);
  if (!events.ok()) {
    return ErrorResponse(events.status());
  }
  Json items = Json::array();
  for (const store::StoredEvent& event : *events) {
    items.push_back({{"revision", event.revision}, {"message", event.text}});
  }
  return JsonResponse(200, {{"items", std::move(items)}});
}

// ---- node handlers --------------------------------------------------------------------------

namespace {

// The node document as served: adds the version and each GPU's allocated milli-GPU.
Json NodeOutput(const store::StoredObject& object,
                const std::map<std::string, std::map<int64_t, int64_t>>& allocation) {
  Json node = ParseDocument(object.data);
  node["version"] = object.version;
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

ApiResponse ApiServer::ListNodes() {
  const Result<std::vector<store::StoredObject>> nodes = options_.store.List(kNodesKind);
  const Result<std::vector<store::StoredObject>> jobs = options_.store.List(kJobsKind);
  if (!nodes.ok() || !jobs.ok()) {
    return ErrorResponse(!nodes.ok() ? nodes.status() : jobs.status());
  }
  const auto allocation = AllocationByNode(*jobs);
  Json items = Json::array();
  for (const store::StoredObject& object : *nodes) {
    items.push_back(NodeOutput(object, allocation));
  }
  return JsonResponse(200, {{"items", std::move(items)}});
}

ApiResponse ApiServer::GetNode(std::string_view name) {
  const Result<store::StoredObject> object = options_.store.Get(kNodesKind, name);
  if (!object.ok()) {
    return ErrorResponse(object.status().code() == StatusCode::kNotFound ||
                                 object.status().code() == StatusCode::kInvalidArgument
                             ? NodeNotFound(name)
                             : object.status());
  }
  const Result<std::vector<store::StoredObject>> jobs = options_.store.List(kJobsKind);
  if (!jobs.ok()) {
    return ErrorResponse(jobs.status());
  }
  return JsonResponse(200, NodeOutput(*object, AllocationByNode(*jobs)));
}

ApiResponse ApiServer::NodeAction(const Principal& who, std::string_view name,
                                  std::string_view action, const std::string& body) {
  if (!who.is_admin()) {
    return ErrorResponse(
        PermissionDenied(fmt::format("{} of a node needs an admin token", action)));
  }
  const bool gpu_action = action == "quarantine" || action == "release";
  std::optional<int64_t> gpu;
  if (gpu_action && body.find_first_not_of(" \t\r\n") != std::string::npos) {
    const Json j = Json::parse(body, nullptr, false);
    if (!j.is_object()) {
      return ErrorResponse(InvalidArgumentError("body: must be a JSON object like {\"gpu\": 3}"));
    }
    if (const auto it = j.find("gpu"); it != j.end()) {
      if (!it->is_number_integer()) {
        return ErrorResponse(
            InvalidArgumentError(fmt::format("gpu: {} (must be an integer)", it->dump())));
      }
      gpu = it->get<int64_t>();
    }
  }
  for (int attempt = 0; attempt < kCasAttempts; ++attempt) {
    const Result<store::StoredObject> object = options_.store.Get(kNodesKind, name);
    if (!object.ok()) {
      return ErrorResponse(object.status().code() == StatusCode::kNotFound ||
                                   object.status().code() == StatusCode::kInvalidArgument
                               ? NodeNotFound(name)
                               : object.status());
    }
    Json doc = ParseDocument(object->data);
    std::string event;
    if (gpu_action) {
      const char* health = action == "quarantine" ? GpuHealthName(GpuHealth::kQuarantined)
                                                  : GpuHealthName(GpuHealth::kHealthy);
      bool found = false;
      if (doc.contains("gpus") && doc["gpus"].is_array()) {
        for (Json& g : doc["gpus"]) {
          if (!gpu || IntOr(g, "index", -1) == *gpu) {
            g["health"] = health;
            found = true;
          }
        }
      }
      if (gpu && !found) {
        return ErrorResponse(
            InvalidArgumentError(fmt::format("gpu: no GPU {} on node \"{}\"", *gpu, name)));
      }
      event = gpu ? fmt::format("gpu {} {}d by {}", *gpu, action, Who(who))
                  : fmt::format("every gpu {}d by {}", action, Who(who));
    } else {
      const NodeState state = action == "cordon"  ? NodeState::kCordoned
                              : action == "drain" ? NodeState::kDraining
                                                  : NodeState::kReady;
      doc["state"] = NodeStateName(state);
      event = fmt::format("{} by {}", action == "drain" ? "drained" : fmt::format("{}ed", action),
                          Who(who));
    }
    store::WriteBatch batch;
    batch.Update(std::string(kNodesKind), std::string(name), doc.dump(), object->version);
    batch.AppendEvent(std::string(kNodesKind), std::string(name), event);
    const Status status = options_.store.Commit(batch);
    if (status.ok()) {
      return GetNode(name);
    }
    if (status.code() != StatusCode::kAborted) {
      return ErrorResponse(status);
    }
  }
  return ErrorResponse(
      Status(StatusCode::kAborted, fmt::format("node \"{}\" kept changing; retry", name)));
}

// ---- metrics --------------------------------------------------------------------------------

std::string ApiServer::RenderMetrics() {
  std::string out;
  std::map<std::string, int64_t> pending;
  std::map<std::string, int64_t> allocated_milli;
  std::map<std::string, int64_t> total;
  const Result<std::vector<store::StoredObject>> nodes = options_.store.List(kNodesKind);
  const Result<std::vector<store::StoredObject>> jobs = options_.store.List(kJobsKind);
  if (nodes.ok() && jobs.ok()) {
    std::map<std::string, std::vector<std::string>> models_by_node;
    for (const store::StoredObject& object : *nodes) {
      const Json node = ParseDocument(object.data);
      for (const Json& g : ArrayOr(node, "gpus")) {
        const std::string model = StrOr(g, "model");
        ++total[model];
        allocated_milli.emplace(model, 0);
        models_by_node[object.name].push_back(model);
      }
    }
    for (const store::StoredObject& object : *jobs) {
      const Json job = ParseDocument(object.data);
      if (StrOr(job, "state") == "Pending") {
        ++pending[StrOr(job, "queue", "default")];
      }
    }
    for (const auto& [node, by_gpu] : AllocationByNode(*jobs)) {
      const auto models = models_by_node.find(node);
      for (const auto& [gpu, milli] : by_gpu) {
        if (models != models_by_node.end() && gpu >= 0 &&
            gpu < static_cast<int64_t>(models->second.size())) {
          allocated_milli[models->second[gpu]] += milli;
        }
      }
    }
  }
  out += "# HELP gpufleet_jobs_pending Jobs waiting to be scheduled, by queue.\n";
  out += "# TYPE gpufleet_jobs_pending gauge\n";
  for (const auto& [queue, count] : pending) {
    out += fmt::format("gpufleet_jobs_pending{{queue=\"{}\"}} {}\n", EscapeLabel(queue), count);
  }
  out += "# HELP gpufleet_gpus_allocated GPUs held by scheduled and running jobs, by model.\n";
  out += "# TYPE gpufleet_gpus_allocated gauge\n";
  for (const auto& [model, milli] : allocated_milli) {
    out += fmt::format("gpufleet_gpus_allocated{{model=\"{}\"}} {}\n", EscapeLabel(model),
                       Gauge(static_cast<double>(milli) / static_cast<double>(kMilliPerUnit)));
  }
  out += "# HELP gpufleet_gpus_total GPUs of the registered nodes, by model.\n";
  out += "# TYPE gpufleet_gpus_total gauge\n";
  for (const auto& [model, count] : total) {
    out += fmt::format("gpufleet_gpus_total{{model=\"{}\"}} {}\n", EscapeLabel(model), count);
  }
  std::lock_guard<std::mutex> lock(metrics_->mu);
  out += "# HELP gpufleet_scheduling_cycle_seconds Duration of one scheduling cycle.\n";
  out += "# TYPE gpufleet_scheduling_cycle_seconds histogram\n";
  out += metrics_->cycles.Render("gpufleet_scheduling_cycle_seconds", "");
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

}  // namespace gpufleet::api
