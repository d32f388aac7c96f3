// SPDX-License-Identifier: Apache-2.0
// Load benchmark of the control plane (issue 4 target: 2,000 nodes / 16,000 GPUs heartbeating
// every 10 s plus 100 job submissions per second: API p99 <= 50 ms and scheduling-cycle p99 <=
// 100 ms on 2 cores). The real ApiServer on a SQLite store in a temporary directory (or the
// PostgreSQL database --store names, whose gpufleet schema must be empty), serving
// HTTP on loopback; 2,000 nodes registered through the agent protocol, --register-threads (64)
// at once, timed; then, for --seconds,
// heartbeat and submit threads at fixed rates over keep-alive connections, and a scheduling
// cycle every --cycle-ms timed around RunSchedulingCycle (the function the server's loop runs).
// The load generator shares the machine's cores with the server, so the figures are an upper
// bound. Prints a table.
//
//   control_plane_load --nodes 2000 --seconds 60
//   control_plane_load --nodes 10000 --seconds 60 --pending 10000   (issue 15's cycle target)
//   control_plane_load --nodes 10000 --register-only   (issue 15: 10,000 agents at once)
//   control_plane_load --nodes 2000 --seconds 60 --submit-rate 1000 --task-seconds 2
//       --heartbeat-s 2   (issue 15: 1,000 submissions/s placed as they arrive, jobs ending)
//   control_plane_load --nodes 2000 --seconds 60 --submit-rate 1000 --small-jobs
//       (issue 15: the same with jobs that fit and stay, as kube-scheduler's benchmark's pods)
//   control_plane_load --nodes 2000 --seconds 60 --store postgresql://gf@127.0.0.1:25432/load
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/core.h>

#include "gpufleet/api/server.h"
#include "gpufleet/core/clock.h"
#include "gpufleet/core/gpu_catalog.h"
#include "gpufleet/http/cpp_httplib.h"
#include "gpufleet/store/postgres_store.h"
#include "gpufleet/store/sqlite_store.h"
#include "gpufleet/wire/agent_protocol.h"

namespace gpufleet {
namespace {

using Clock = std::chrono::steady_clock;

struct Latencies {
  std::mutex mu;
  std::vector<double> ms;
  int errors = 0;

  void Add(double value, bool ok) {
    std::lock_guard<std::mutex> lock(mu);
    ms.push_back(value);
    errors += ok ? 0 : 1;
  }
};

// CPU time of the calling thread, in ms.
double ThreadCpuMs() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) {
    return 0;
  }
  std::sort(values.begin(), values.end());
  const size_t index = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[index];
}

wire::RegisterRequest NodeInventory(int i, int nodes_per_leaf) {
  wire::RegisterRequest request;
  request.topology_levels = {"block", "leaf"};
  request.node.id = NodeId(fmt::format("node-{:05}", i));
  request.node.capacity = {192000, 2048 * 1024};
  request.node.labels = {{std::string(kDriverVersionLabel), "550.54.15"}};
  request.node.topology = {fmt::format("block-{}", i / (nodes_per_leaf * 16)),
                           fmt::format("leaf-{}", i / nodes_per_leaf)};
  for (int g = 0; g < 8; ++g) {
    Gpu gpu;
    gpu.index = g;
    gpu.uuid = GpuUuid(fmt::format("GPU-{:05}-{}", i, g));
    gpu.model = "H100-80GB";
    gpu.memory_mib = 81559;
    request.node.gpus.push_back(gpu);
  }
  return request;
}

// A job no node can hold (more GPUs per task than a node has): it stays pending, as the issue's
// 10,000 pending jobs do. Four shapes, so that the cycle's "larger than one that failed" skip
// does not reduce them to one.
std::string PendingJobYaml(int64_t n) {
  static constexpr int kGpus[] = {9, 10, 12, 16};
  return fmt::format(
      "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {{name: pending-{}}}\nspec:\n  tasks:\n"
      "    - name: main\n      command: [python, train.py]\n"
      "      resources: {{cpu: \"4\", memory: 16Gi, gpus: {{count: {}}}}}\n",
      n, kGpus[n % 4]);
}

std::string JobYaml(int64_t n) {
  static constexpr int kGpus[] = {1, 1, 1, 2, 4, 8};
  return fmt::format(
      "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {{name: load-{}}}\nspec:\n  tasks:\n"
      "    - name: main\n      command: [python, train.py]\n"
      "      resources: {{cpu: \"4\", memory: 16Gi, gpus: {{count: {}}}}}\n",
      n, kGpus[n % 6]);
}

// --small-jobs: jobs that fit by the thousand, as the pods of kube-scheduler's and YuniKorn's
// throughput benchmarks do: every other job asks for a quarter of one GPU, the others for CPU
// only. 60,000 of them fill 7,500 of 2,000 nodes' 16,000 GPUs.
std::string SmallJobYaml(int64_t n) {
  return fmt::format(
      "apiVersion: gpufleet.io/v1\nkind: Job\nmetadata: {{name: load-{}}}\nspec:\n  tasks:\n"
      "    - name: main\n      command: [python, serve.py]\n"
      "      resources: {{cpu: \"2\", memory: 8Gi{}}}\n",
      n, n % 2 == 0 ? ", gpus: {milli: 250}" : "");
}

struct LoadRequest {
  std::string path;
  std::string body;
  const std::string* token;  // the bearer token
};

// Sends `rate` requests per second from one thread until `stop`; `next` makes each request and
// `answered`, if set, takes each successful answer's body.
void RunAtRate(int port, double rate, std::atomic<bool>& stop, Latencies& latencies,
               const std::function<LoadRequest(int64_t)>& next,
               const std::function<void(int64_t, const std::string&)>& answered = {}) {
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  client.set_tcp_nodelay(true);  // else Nagle and delayed ACKs add 40 ms to a POST
  const auto period = std::chrono::duration<double>(1.0 / rate);
  auto due = Clock::now();
  for (int64_t n = 0; !stop.load(); ++n) {
    due += std::chrono::duration_cast<Clock::duration>(period);
    std::this_thread::sleep_until(due);
    const LoadRequest request = next(n);
    const httplib::Headers headers = {{"Authorization", "Bearer " + *request.token}};
    const auto start = Clock::now();
    const httplib::Result result =
        client.Post(request.path, headers, request.body, "application/yaml");
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    latencies.Add(ms, result && result->status < 300);
    if (answered && result && result->status < 300) {
      answered(n, result->body);
    }
  }
}

// One simulated node's tasks (--task-seconds): each task the server wants is reported Running
// from the heartbeat after it first appears, and Succeeded once it has run for the task time, so
// that jobs end and free their GPUs as real agents make them.
class NodeTasks {
 public:
  // The next heartbeat's body.
  std::string Heartbeat(Clock::time_point now, Clock::duration task_time) {
    std::lock_guard<std::mutex> lock(mu_);
    wire::HeartbeatRequest request;
    for (const auto& [id, started] : started_) {
      wire::TaskReport report;
      report.id = id;
      report.phase =
          now - started >= task_time ? wire::TaskPhase::kSucceeded : wire::TaskPhase::kRunning;
      request.tasks.push_back(std::move(report));
    }
    return wire::HeartbeatRequestToJson(request);
  }

  // Takes the server's answer: tasks new to the node start now; tasks no longer wanted are gone.
  void Answered(const std::string& body, Clock::time_point now) {
    const Result<wire::AgentReply> reply = wire::ParseAgentReply(body);
    if (!reply.ok()) {
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, Clock::time_point> wanted;
    for (const wire::DesiredTask& task : reply->tasks) {
      const auto known = started_.find(task.id);
      wanted.emplace(task.id, known == started_.end() ? now : known->second);
    }
    started_ = std::move(wanted);
  }

 private:
  std::mutex mu_;
  std::map<std::string, Clock::time_point> started_;
};

// The store the run uses: SQLite in `dir`, or the PostgreSQL database `uri` names.
Result<std::unique_ptr<store::StateStore>> OpenStore(const std::filesystem::path& dir,
                                                     const std::string& uri) {
  if (!uri.empty()) {
    GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<store::PostgresStateStore> store,
                              store::PostgresStateStore::Open(uri));
    return std::unique_ptr<store::StateStore>(std::move(store));
  }
  GPUFLEET_ASSIGN_OR_RETURN(std::unique_ptr<store::SqliteStateStore> store,
                            store::SqliteStateStore::Open((dir / "gpufleet.db").string()));
  return std::unique_ptr<store::StateStore>(std::move(store));
}

int Run(int nodes, int seconds, double heartbeat_s, double submit_rate, int cycle_ms,
        bool print_cycles, const std::string& store_uri, int register_threads, bool register_only,
        int pending, double task_seconds, bool small_jobs, const std::string& policy) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("gpufleet-load-{}", getpid());
  std::filesystem::create_directories(dir);
  auto store = OpenStore(dir, store_uri);
  if (!store.ok()) {
    fmt::print(stderr, "{}\n", store.status().ToString());
    return 1;
  }
  const GpuCatalog catalog = GpuCatalog::Default();
  SystemClock clock;
  auto server = api::ApiServer::Create(
      {.store = **store,
       .catalog = catalog,
       .clock = clock,
       .wall_clock = &clock,
       .policy = policy,
       .cycle_interval = std::chrono::hours(1),
       .heartbeat_interval = std::chrono::milliseconds(static_cast<int64_t>(heartbeat_s * 1000)),
       .node_timeout = std::chrono::hours(1)});
  if (!server.ok()) {
    fmt::print(stderr, "{}\n", server.status().ToString());
    return 1;
  }
  const std::string admin =
      *(*server)->authenticator().CreateToken(control::Role::kAdmin, "", "load");
  const std::string agent = *(*server)->authenticator().CreateToken(control::Role::kAgent, "", "a");
  const Result<int> port = (*server)->Start("127.0.0.1", 0);
  if (!port.ok()) {
    fmt::print(stderr, "{}\n", port.status().ToString());
    return 1;
  }
  // The loop ran its first cycle at Start; registration needs it.
  while (!(*server)->RunSchedulingCycle().ok()) {
  }
  // Each node exchanges the join token for its own credential at registration and heartbeats
  // with that one, as real agents do. --register-threads agents register at once, each thread
  // taking the next node, as a fleet does when the server comes up.
  std::vector<std::string> node_tokens(static_cast<size_t>(nodes));
  Latencies registrations;
  const auto register_start = Clock::now();
  {
    std::atomic<int> next_node{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> registering;
    for (int t = 0; t < register_threads; ++t) {
      registering.emplace_back([&] {
        httplib::Client client("127.0.0.1", *port);
        client.set_keep_alive(true);
        client.set_tcp_nodelay(true);
        const httplib::Headers headers = {{"Authorization", "Bearer " + agent}};
        for (int i = next_node.fetch_add(1); i < nodes && !failed.load();
             i = next_node.fetch_add(1)) {
          const auto start = Clock::now();
          const auto result =
              client.Post("/v1/agents/register", headers,
                          wire::RegisterRequestToJson(NodeInventory(i, 16)), "application/json");
          registrations.Add(std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
                            result && result->status == 200);
          if (!result || result->status != 200) {
            fmt::print(stderr, "register node {}: {}\n", i,
                       result ? result->body : httplib::to_string(result.error()));
            failed.store(true);
            return;
          }
          const Result<wire::AgentReply> reply = wire::ParseAgentReply(result->body);
          if (!reply.ok() || reply->node_token.empty()) {
            fmt::print(stderr, "register node {}: no node credential in {}\n", i, result->body);
            failed.store(true);
            return;
          }
          node_tokens[static_cast<size_t>(i)] = reply->node_token;
        }
      });
    }
    for (std::thread& thread : registering) {
      thread.join();
    }
    if (failed.load()) {
      return 1;
    }
  }
  const double register_s = std::chrono::duration<double>(Clock::now() - register_start).count();
  fmt::print("registration: {} nodes by {} agents at once in {:.2f} s ({:.0f}/s)\n", nodes,
             register_threads, register_s, nodes / register_s);
  fflush(stdout);
  if (register_only) {
    (*server)->Stop();
    std::filesystem::remove_all(dir);
    fmt::print("{:<22} {:>8} {:>7} {:>9} {:>9} {:>9}\n", "what", "count", "errors", "p50 ms",
               "p99 ms", "max ms");
    fmt::print("{:<22} {:>8} {:>7} {:>9.2f} {:>9.2f} {:>9.2f}\n", "POST register",
               registrations.ms.size(), registrations.errors, Percentile(registrations.ms, 0.5),
               Percentile(registrations.ms, 0.99), Percentile(registrations.ms, 1.0));
    return 0;
  }

  if (pending > 0) {
    // Submitted by 8 clients at once, then one cycle tries (and records why not) each of them.
    const auto start = Clock::now();
    std::atomic<int> next{0};
    std::atomic<int> failures{0};
    std::vector<std::thread> submitting;
    for (int t = 0; t < 8; ++t) {
      submitting.emplace_back([&] {
        httplib::Client client("127.0.0.1", *port);
        client.set_keep_alive(true);
        client.set_tcp_nodelay(true);
        const httplib::Headers headers = {{"Authorization", "Bearer " + admin}};
        for (int i = next.fetch_add(1); i < pending; i = next.fetch_add(1)) {
          const auto result =
              client.Post("/v1/jobs", headers, PendingJobYaml(i), "application/yaml");
          failures += result && result->status < 300 ? 0 : 1;
        }
      });
    }
    for (std::thread& thread : submitting) {
      thread.join();
    }
    fmt::print("pending: {} jobs no node can hold submitted in {:.2f} s ({} failed)\n", pending,
               std::chrono::duration<double>(Clock::now() - start).count(), failures.load());
  }
  // The first cycle after the storm reads every node registered since the last one and (with
  // --pending) records why each pending job waits: timed apart from the steady state below.
  {
    const auto start = Clock::now();
    const Result<int> placed = (*server)->RunSchedulingCycle();
    fmt::print("first cycle after registration: {:.1f} ms ({})\n",
               std::chrono::duration<double, std::milli>(Clock::now() - start).count(),
               placed.ok() ? "ok" : placed.status().ToString());
    fflush(stdout);
  }

  std::atomic<bool> stop{false};
  Latencies heartbeats;
  Latencies submissions;
  std::vector<double> cycles;
  std::vector<double> cycle_cpu;  // the cycle thread's CPU time: what the cycle costs when the
                                  // load generator and other work take the cores from it
  int64_t scheduled = 0;
  const std::string heartbeat_body = wire::HeartbeatRequestToJson({});
  std::vector<NodeTasks> node_tasks(task_seconds > 0 ? static_cast<size_t>(nodes) : 0);
  const auto task_time =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(task_seconds));
  const double heartbeat_rate = nodes / heartbeat_s;
  static constexpr int kHeartbeatThreads = 4;
  // Each client waits for its answer: one per 100 submissions/s keeps the rate when answers slow.
  const int submit_threads = std::max(2, static_cast<int>(std::ceil(submit_rate / 100)));
  std::vector<std::thread> threads;
  for (int t = 0; t < kHeartbeatThreads; ++t) {
    threads.emplace_back([&, t] {
      const auto node_of = [&, t](int64_t n) {
        return static_cast<size_t>((n * kHeartbeatThreads + t) % nodes);
      };
      RunAtRate(
          *port, heartbeat_rate / kHeartbeatThreads, stop, heartbeats,
          [&](int64_t n) {
            const size_t node = node_of(n);
            return LoadRequest{fmt::format("/v1/agents/node-{:05}/heartbeat", node),
                               node_tasks.empty()
                                   ? heartbeat_body
                                   : node_tasks[node].Heartbeat(Clock::now(), task_time),
                               &node_tokens[node]};
          },
          [&](int64_t n, const std::string& body) {
            if (!node_tasks.empty()) {
              node_tasks[node_of(n)].Answered(body, Clock::now());
            }
          });
    });
  }
  for (int t = 0; t < submit_threads; ++t) {
    threads.emplace_back([&, t] {
      RunAtRate(*port, submit_rate / submit_threads, stop, submissions, [&, t](int64_t n) {
        const int64_t job = n * submit_threads + t;
        return LoadRequest{"/v1/jobs", small_jobs ? SmallJobYaml(job) : JobYaml(job), &admin};
      });
    });
  }
  // Jobs accepted but not yet placed, after each cycle: with jobs that end (--task-seconds),
  // a backlog that stays within a cycle's submissions means jobs are placed as they arrive.
  std::vector<double> backlog;
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  auto due = Clock::now();
  while (Clock::now() < end) {
    due += std::chrono::milliseconds(cycle_ms);
    std::this_thread::sleep_until(due);
    const auto start = Clock::now();
    const double cpu_start = ThreadCpuMs();
    const Result<int> placed = (*server)->RunSchedulingCycle();
    cycles.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    cycle_cpu.push_back(ThreadCpuMs() - cpu_start);
    scheduled += placed.ok() ? *placed : 0;
    {
      std::lock_guard<std::mutex> lock(submissions.mu);
      backlog.push_back(static_cast<double>(static_cast<int64_t>(submissions.ms.size()) -
                                            submissions.errors - scheduled));
    }
    if (print_cycles) {
      std::string steps;
      for (const auto& [step, time] : (*server)->LastCycleSteps()) {
        steps += fmt::format(" {} {:.1f}", step,
                             std::chrono::duration<double, std::milli>(time).count());
      }
      fmt::print("cycle {}: {:.1f} ms ({:.1f} ms CPU), {} jobs placed; ms by step:{}\n",
                 cycles.size(), cycles.back(), cycle_cpu.back(), placed.ok() ? *placed : -1, steps);
      fflush(stdout);
    }
  }
  stop.store(true);
  for (std::thread& thread : threads) {
    thread.join();
  }
  (*server)->Stop();
  std::filesystem::remove_all(dir);

  fmt::print(
      "control plane load: {} nodes ({} GPUs), heartbeat every {} s, {} submissions/s, "
      "{} s, {} hardware threads, policy {}\n",
      nodes, nodes * 8, heartbeat_s, submit_rate, seconds, std::thread::hardware_concurrency(),
      policy);
  fmt::print("{:<22} {:>8} {:>7} {:>9} {:>9} {:>9}\n", "what", "count", "errors", "p50 ms",
             "p99 ms", "max ms");
  for (const auto& [name, latencies] :
       {std::pair<const char*, Latencies*>{"POST register", &registrations},
        {"POST heartbeat", &heartbeats},
        {"POST /v1/jobs", &submissions}}) {
    fmt::print("{:<22} {:>8} {:>7} {:>9.2f} {:>9.2f} {:>9.2f}\n", name, latencies->ms.size(),
               latencies->errors, Percentile(latencies->ms, 0.5), Percentile(latencies->ms, 0.99),
               Percentile(latencies->ms, 1.0));
  }
  // Every request of the steady state, heartbeats and submissions together: the API's p99.
  Latencies steady;
  steady.ms = heartbeats.ms;
  steady.ms.insert(steady.ms.end(), submissions.ms.begin(), submissions.ms.end());
  fmt::print("{:<22} {:>8} {:>7} {:>9.2f} {:>9.2f} {:>9.2f}\n", "all steady requests",
             steady.ms.size(), heartbeats.errors + submissions.errors, Percentile(steady.ms, 0.5),
             Percentile(steady.ms, 0.99), Percentile(steady.ms, 1.0));
  fmt::print("{:<22} {:>8} {:>7} {:>9.2f} {:>9.2f} {:>9.2f}\n", "scheduling cycle", cycles.size(),
             0, Percentile(cycles, 0.5), Percentile(cycles, 0.99), Percentile(cycles, 1.0));
  fmt::print("{:<22} {:>8} {:>7} {:>9.2f} {:>9.2f} {:>9.2f}\n", "cycle CPU time", cycle_cpu.size(),
             0, Percentile(cycle_cpu, 0.5), Percentile(cycle_cpu, 0.99),
             Percentile(cycle_cpu, 1.0));
  fmt::print("jobs scheduled: {}\n", scheduled);
  if (!backlog.empty()) {
    fmt::print("accepted, not yet placed, after a cycle: p50 {:.0f}, p99 {:.0f}, last {:.0f}\n",
               Percentile(backlog, 0.5), Percentile(backlog, 0.99), backlog.back());
  }
  if (pending > 0) {
    fmt::print("jobs pending that no node can hold: {}\n", pending);
  }
  return heartbeats.errors + submissions.errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gpufleet

int main(int argc, char** argv) {
  CLI::App app{"load benchmark of the gpufleet control plane"};
  int nodes = 2000;
  int seconds = 60;
  double heartbeat_s = 10;
  double submit_rate = 100;
  int cycle_ms = 1000;
  app.add_option("--nodes", nodes)->check(CLI::Range(1, 100000));
  app.add_option("--seconds", seconds)->check(CLI::Range(1, 3600));
  app.add_option("--heartbeat-s", heartbeat_s)->check(CLI::Range(0.1, 600.0));
  app.add_option("--submit-rate", submit_rate)->check(CLI::Range(0.1, 10000.0));
  app.add_option("--cycle-ms", cycle_ms)->check(CLI::Range(10, 60000));
  bool print_cycles = false;
  app.add_flag("--print-cycles", print_cycles, "print each cycle's time and placements");
  std::string store_uri;
  app.add_option("--store", store_uri,
                 "a PostgreSQL URI; default: SQLite in a temporary directory");
  int register_threads = 64;
  app.add_option("--register-threads", register_threads,
                 "agents registering at once before the load starts")
      ->check(CLI::Range(1, 1024));
  bool register_only = false;
  app.add_flag("--register-only", register_only,
               "register the nodes, print the registration time and stop");
  int pending = 0;
  app.add_option("--pending", pending,
                 "jobs no node can hold, submitted after registration so that they stay pending")
      ->check(CLI::Range(0, 1000000));
  double task_seconds = 0;
  app.add_option("--task-seconds", task_seconds,
                 "every task ends this long after its node first hears of it (0: tasks never end)")
      ->check(CLI::Range(0.0, 3600.0));
  bool small_jobs = false;
  app.add_flag("--small-jobs", small_jobs,
               "submit jobs of a quarter GPU or CPU only (default: 1 to 8 whole GPUs)");
  std::string policy = "gpufleet";  // the server's default
  app.add_option("--policy", policy, "the server's placement policy (gpufleet server --policy)");
  CLI11_PARSE(app, argc, argv);
  return gpufleet::Run(nodes, seconds, heartbeat_s, submit_rate, cycle_ms, print_cycles, store_uri,
                       register_threads, register_only, pending, task_seconds, small_jobs, policy);
}
