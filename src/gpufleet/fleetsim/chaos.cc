// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/fleetsim/chaos.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/core.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/core/random.h"
#include "gpufleet/fleetsim/planted_bugs.h"
#include "gpufleet/fleetsim/sim_fleet.h"
#include "gpufleet/sim/parallel.h"
#include "gpufleet/wire/json_fields.h"

namespace gpufleet::fleetsim {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Duration kTick = seconds(1);

// FNV-1a over the event log: the replay check of a seed.
uint64_t Digest(const std::deque<std::string>& lines, uint64_t hash = 14695981039346656037ULL) {
  for (const std::string& line : lines) {
    for (const unsigned char byte : line) {
      hash = (hash ^ byte) * 1099511628211ULL;
    }
    hash = (hash ^ '\n') * 1099511628211ULL;
  }
  return hash;
}

struct JobPlan {
  std::string name;
  MonoTime submit_at;
  int tasks = 1;
  int gpus_per_task = 1;
  int64_t duration_ms = 0;
  int64_t stop_delay_ms = 0;
  int exit_code = 0;
  int priority = 0;
  // An elastic job (`replicas: {min, max: tasks}`, issue 37 item 6); 0: `tasks` fixed.
  int min_tasks = 0;
  int64_t checkpoint_grace_seconds = 0;
};

std::string JobBody(const JobPlan& job) {
  // An elastic job may be shrunk at once (no minimum runtime), with or without a notice.
  const std::string replicas =
      job.min_tasks > 0 ? fmt::format(R"({{"min": {}, "max": {}}})", job.min_tasks, job.tasks)
                        : std::to_string(job.tasks);
  const std::string preemption =
      job.min_tasks > 0
          ? fmt::format(R"("preemption": {{"minRuntime": "0s", "checkpointGraceSeconds": {}}}, )",
                        job.checkpoint_grace_seconds)
          : "";
  return fmt::format(
      R"({{"apiVersion": "gpufleet.io/v1", "kind": "Job", "metadata": {{"name": "{}"}},
"spec": {{"priority": {}, {}"tasks": [{{"name": "main", "replicas": {}, "command": ["train"],
"env": {{"GPUFLEET_SIM_DURATION_MS": "{}", "GPUFLEET_SIM_EXIT_CODE": "{}",
"GPUFLEET_SIM_STOP_MS": "{}"}}, "resources": {{"gpus": {{"count": {}}}}}}}]}}}})",
      job.name, job.priority, preemption, replicas, job.duration_ms, job.exit_code,
      job.stop_delay_ms, job.gpus_per_task);
}

// A job of the workload: one GPU, a few GPUs in one task, or a gang of two tasks.
JobPlan DrawJob(Random& random, std::string name, MonoTime at, int max_gpus, int priority) {
  JobPlan job{.name = std::move(name), .submit_at = at, .priority = priority};
  const double shape = random.UniformDouble();
  if (shape < 0.5) {
    job.gpus_per_task = 1;
  } else if (shape < 0.7) {
    job.gpus_per_task = 2 + static_cast<int>(random.Uniform(static_cast<uint64_t>(max_gpus - 1)));
  } else {
    job.tasks = 2;
    job.gpus_per_task = 1 + static_cast<int>(random.Uniform(2));
  }
  job.gpus_per_task = std::min(job.gpus_per_task, max_gpus);
  job.duration_ms = 20'000 + static_cast<int64_t>(random.Uniform(220'000));
  // Half the jobs take a while to exit after SIGTERM (a checkpoint written), some past the grace.
  job.stop_delay_ms =
      random.UniformDouble() < 0.5 ? static_cast<int64_t>(random.Uniform(40'000)) : 0;
  job.exit_code = random.UniformDouble() < 0.1 ? 1 : 0;
  return job;
}

// An elastic job (issue 37 item 6) of 2 to 4 one-GPU tasks, at least 1 to all of them, with a
// notice of 0 or 10 s, that may be shrunk at once (no minimum runtime).
JobPlan DrawElasticJob(Random& random, std::string name, MonoTime at) {
  JobPlan job{.name = std::move(name), .submit_at = at};
  job.tasks = 2 + static_cast<int>(random.Uniform(3));
  job.min_tasks = 1 + static_cast<int>(random.Uniform(static_cast<uint64_t>(job.tasks)));
  job.checkpoint_grace_seconds = random.Uniform(2) == 0 ? 0 : 10;
  job.duration_ms = 20'000 + static_cast<int64_t>(random.Uniform(220'000));
  return job;
}

// One seed's run: the fleet, its schedule, and what it has seen.
class ChaosRun {
 public:
  ChaosRun(uint64_t seed, const ChaosOptions& options)
      : seed_(seed),
        options_(options),
        random_(seed * 0x9E3779B97F4A7C15ULL + 0x632BE59BD9B4E019ULL),
        elastic_random_(seed * 0xD1B54A32D192ED03ULL + 0x8CB92BA72F3D8DD7ULL) {}

  Result<SeedOutcome> Run();

 private:
  Status Submit(const JobPlan& job);
  Status CancelSome();
  Status SendOversized();
  Status InjectFault(MonoTime now);
  Status Heal();
  // Every acknowledged job is stored, known and (at the end) finished without placements.
  void CheckJobs(bool at_end, std::vector<std::string>& violations);
  // After each step: a finished job stays finished, attempts only grow, no stored job vanishes
  // (retention is off). Reads only the jobs whose version changed.
  void ObserveJobs();

  uint64_t seed_;
  ChaosOptions options_;
  Random random_;
  Random elastic_random_;  // DrawElasticJob's
  std::unique_ptr<SimFleet> fleet_;
  FleetOptions fleet_options_;
  std::vector<JobPlan> plan_;
  size_t next_job_ = 0;
  std::set<std::string> acknowledged_;
  std::map<std::string, int> gang_size_;
  std::map<std::string, int> faults_;
  // Restarts due: agents by node, servers by index.
  std::map<int, MonoTime> agent_restart_at_;
  std::map<int, MonoTime> server_restart_at_;
  std::set<int> lost_gpu_on_;
  int storm_jobs_ = 0;
  std::vector<std::string> harness_errors_;
  struct ObservedJob {
    int64_t version = 0;
    control::JobState state = control::JobState::kPending;
    int64_t attempt = 0;
  };
  std::map<std::string, ObservedJob> observed_;
  std::vector<std::string> step_violations_;
};

void ChaosRun::ObserveJobs() {
  Result<std::vector<store::StoredObject>> stored = fleet_->store().List(control::kJobsKind);
  if (!stored.ok()) {
    return;  // CheckJobs reports a store that cannot list
  }
  std::set<std::string> present;
  for (const store::StoredObject& object : *stored) {
    present.insert(object.name);
    auto seen = observed_.find(object.name);
    if (seen != observed_.end() && seen->second.version == object.version) {
      continue;
    }
    const wire::Json job = wire::ParseDocument(object.data);
    const std::optional<control::JobState> state = control::StoredJobState(job);
    if (!state.has_value()) {
      continue;  // CheckJobs reports it
    }
    const ObservedJob now{object.version, *state, wire::IntOr(job, "attempt", 0)};
    if (seen != observed_.end()) {
      const ObservedJob& before = seen->second;
      if (control::IsFinished(before.state) && before.state != now.state) {
        step_violations_.push_back(fmt::format("job {} went from {} to {}", object.name,
                                               control::JobStateName(before.state),
                                               control::JobStateName(now.state)));
      }
      if (now.attempt < before.attempt) {
        step_violations_.push_back(fmt::format("job {}: attempt went back from {} to {}",
                                               object.name, before.attempt, now.attempt));
      }
    }
    observed_[object.name] = now;
  }
  for (auto it = observed_.begin(); it != observed_.end();) {
    if (!present.count(it->first)) {
      step_violations_.push_back(fmt::format("job {} vanished from the store", it->first));
      it = observed_.erase(it);
    } else {
      ++it;
    }
  }
}

Status ChaosRun::Submit(const JobPlan& job) {
  Result<api::ApiResponse> answer = fleet_->AdminRequest("POST", "/v1/jobs", JobBody(job));
  if (!answer.ok()) {
    fleet_->events().Add(fmt::format("submit {}: {}", job.name, answer.status().ToString()));
    return Status::Ok();
  }
  fleet_->events().Add(fmt::format("submit {} ({}{} x {} GPUs, priority {}): {}", job.name,
                                   job.min_tasks > 0 ? fmt::format("{}..", job.min_tasks) : "",
                                   job.tasks, job.gpus_per_task, job.priority, answer->status));
  if (answer->status / 100 == 2) {
    acknowledged_.insert(job.name);
    // An elastic job's run may be smaller than its maximum: whole means at least its minimum.
    gang_size_[job.name] = job.min_tasks > 0 ? job.min_tasks : job.tasks;
  }
  return Status::Ok();
}

Status ChaosRun::CancelSome() {
  std::vector<std::string> names(acknowledged_.begin(), acknowledged_.end());
  random_.Shuffle(names);
  names.resize(names.size() / 2);
  for (const std::string& name : names) {
    Result<api::ApiResponse> answer =
        fleet_->AdminRequest("POST", fmt::format("/v1/jobs/{}/cancel", name), "");
    if (answer.ok()) {
      fleet_->events().Add(fmt::format("cancel {}: {}", name, answer->status));
    }
  }
  return Status::Ok();
}

Status ChaosRun::SendOversized() {
  // A body past the server's limit, and one nested past the parser's depth limit: each is refused
  // alone, with a 4xx.
  const bool deep = random_.UniformDouble() < 0.5;
  const std::string body = deep ? std::string(100'000, '[') + std::string(100'000, ']')
                                : std::string(api::kMaxRequestBodyBytes + 1, ' ');
  Result<api::ApiResponse> answer = fleet_->AdminRequest("POST", "/v1/jobs", body);
  if (answer.ok()) {
    fleet_->events().Add(fmt::format("{} body: {}", deep ? "deep" : "oversized", answer->status));
    // While no server leads (an election under way), every write is 503 before it is read.
    const bool electing = answer->status == 503 && !fleet_->Leader().has_value();
    if (answer->status / 100 != 4 && !electing) {
      harness_errors_.push_back(fmt::format("a {} body was answered {}, not 4xx",
                                            deep ? "deeply nested" : "oversized", answer->status));
    }
  }
  return Status::Ok();
}

Status ChaosRun::InjectFault(MonoTime now) {
  const int nodes = fleet_->node_count();
  const int node = static_cast<int>(random_.Uniform(static_cast<uint64_t>(nodes)));
  const auto within = [&](int low_s, int high_s) {
    return seconds(low_s +
                   static_cast<int>(random_.Uniform(static_cast<uint64_t>(high_s - low_s))));
  };
  switch (random_.Uniform(8)) {
    case 0:
      if (fleet_->agent_up(node)) {
        ++faults_["agent_crash"];
        fleet_->CrashAgent(node);
        agent_restart_at_[node] = now + within(5, 120);
      }
      break;
    case 1:
      ++faults_["partition"];
      fleet_->CutOff(node, now + within(10, 150));
      break;
    case 2: {
      // The leader if there is one (with two servers the other takes over), else any server up.
      const std::optional<int> leader = fleet_->Leader();
      const int server = leader.value_or(static_cast<int>(random_.Uniform(fleet_->server_count())));
      if (fleet_->server_up(server)) {
        ++faults_["server_crash"];
        fleet_->CrashServer(server);
        server_restart_at_[server] = now + within(2, 60);
      }
      break;
    }
    case 3:
      if (fleet_->agent_up(node) && !lost_gpu_on_.count(node)) {
        ++faults_["gpu_lost"];
        lost_gpu_on_.insert(node);
        GPUFLEET_RETURN_IF_ERROR(fleet_->RestartAgent(node, options_.gpus_per_node - 1));
      }
      break;
    case 4:
      ++faults_["cancel_storm"];
      GPUFLEET_RETURN_IF_ERROR(CancelSome());
      break;
    case 5: {
      ++faults_["preemption_storm"];
      const int count = 2 + static_cast<int>(random_.Uniform(3));
      for (int i = 0; i < count; ++i) {
        GPUFLEET_RETURN_IF_ERROR(Submit(DrawJob(random_, fmt::format("urgent-{}", storm_jobs_++),
                                                now, options_.gpus_per_node - 1, 100)));
      }
      break;
    }
    case 6:
      // The leader stops (a long pause) past its lease: another server takes over, and what the
      // old leader does on waking must be fenced off.
      if (const std::optional<int> leader = fleet_->Leader(); leader.has_value()) {
        ++faults_["server_pause"];
        fleet_->PauseServer(*leader, now + within(3, 30));
      }
      break;
    default:
      ++faults_["oversized_input"];
      GPUFLEET_RETURN_IF_ERROR(SendOversized());
      break;
  }
  return Status::Ok();
}

Status ChaosRun::Heal() {
  fleet_->SetLinkFaults({});
  for (int server = 0; server < fleet_->server_count(); ++server) {
    if (!fleet_->server_up(server)) {
      GPUFLEET_RETURN_IF_ERROR(fleet_->RestartServer(server));
    }
  }
  server_restart_at_.clear();
  for (int node = 0; node < fleet_->node_count(); ++node) {
    fleet_->CutOff(node, fleet_->Now());
    if (!fleet_->agent_up(node)) {
      GPUFLEET_RETURN_IF_ERROR(fleet_->RestartAgent(node));
    }
  }
  agent_restart_at_.clear();
  fleet_->events().Add("healed: every fault ends");
  return Status::Ok();
}

void ChaosRun::CheckJobs(bool at_end, std::vector<std::string>& violations) {
  Result<std::vector<store::StoredObject>> stored = fleet_->store().List(control::kJobsKind);
  if (!stored.ok()) {
    violations.push_back(fmt::format("the store cannot list jobs: {}", stored.status().ToString()));
    return;
  }
  std::set<std::string> present;
  for (const store::StoredObject& object : *stored) {
    present.insert(object.name);
    const wire::Json job = wire::ParseDocument(object.data);
    const std::optional<control::JobState> state = control::StoredJobState(job);
    if (!state.has_value()) {
      violations.push_back(fmt::format("job {} has no known state", object.name));
      continue;
    }
    if (!at_end) {
      continue;
    }
    if (!control::IsFinished(*state)) {
      violations.push_back(fmt::format("job {} is still {} ({}) after the fleet healed",
                                       object.name, control::JobStateName(*state),
                                       job.value("reason", std::string())));
    } else if (const auto placements = job.find("placements");
               placements != job.end() && placements->is_array() && !placements->empty()) {
      violations.push_back(fmt::format("job {} is {} but holds placements", object.name,
                                       control::JobStateName(*state)));
    }
  }
  for (const std::string& name : acknowledged_) {
    if (!present.count(name)) {
      violations.push_back(fmt::format("acknowledged job {} is lost", name));
    }
  }
}

Result<SeedOutcome> ChaosRun::Run() {
  // Swarm testing: each seed draws its own fleet and fault rates, some faults off.
  const auto maybe = [&](double high) {
    return random_.UniformDouble() < 0.5 ? random_.UniformDouble() * high : 0.0;
  };
  fleet_options_.seed = seed_;
  fleet_options_.nodes =
      options_.min_nodes + static_cast<int>(random_.Uniform(
                               static_cast<uint64_t>(options_.max_nodes - options_.min_nodes + 1)));
  fleet_options_.gpus_per_node = options_.gpus_per_node;
  fleet_options_.max_drift = maybe(0.01);
  fleet_options_.servers = random_.UniformDouble() < 0.5 ? 2 : 1;
  PlantBug(options_.planted, fleet_options_);
  const LinkFaults link{.lose_request = maybe(0.1),
                        .lose_reply = maybe(0.1),
                        .duplicate = maybe(0.1),
                        .delay = maybe(0.1)};
  const double fault_rate_per_s = 0.01 + random_.UniformDouble() * 0.05;
  GPUFLEET_ASSIGN_OR_RETURN(fleet_, SimFleet::Create(fleet_options_));
  fleet_->SetLinkFaults(link);
  fleet_->events().Add(fmt::format(
      "seed {}: {} servers, {} nodes x {} GPUs, drift {:.4f}, link loss {:.3f}/{:.3f} dup {:.3f} "
      "delay {:.3f}, {:.3f} faults/s, planted {}",
      seed_, fleet_options_.servers, fleet_options_.nodes, fleet_options_.gpus_per_node,
      fleet_options_.max_drift, link.lose_request, link.lose_reply, link.duplicate, link.delay,
      fault_rate_per_s, PlantedBugName(options_.planted)));

  const MonoTime start = fleet_->Now();
  const int job_count = options_.min_jobs + static_cast<int>(random_.Uniform(static_cast<uint64_t>(
                                                options_.max_jobs - options_.min_jobs + 1)));
  for (int i = 0; i < job_count; ++i) {
    const auto at =
        start + Duration(static_cast<int64_t>(random_.UniformDouble() *
                                              static_cast<double>(options_.fault_phase.count())));
    plan_.push_back(DrawJob(random_, fmt::format("job-{}", i), at, options_.gpus_per_node - 1, 0));
  }
  // Elastic jobs among them, drawn from their own stream so that the rest of a seed's workload
  // and faults stay what they were before elastic jobs came.
  const int elastic_jobs = 1 + static_cast<int>(elastic_random_.Uniform(3));
  for (int i = 0; i < elastic_jobs; ++i) {
    const auto at =
        start + Duration(static_cast<int64_t>(elastic_random_.UniformDouble() *
                                              static_cast<double>(options_.fault_phase.count())));
    plan_.push_back(DrawElasticJob(elastic_random_, fmt::format("elastic-{}", i), at));
  }
  std::sort(plan_.begin(), plan_.end(), [](const JobPlan& a, const JobPlan& b) {
    return std::tie(a.submit_at.nanos, a.name) < std::tie(b.submit_at.nanos, b.name);
  });

  const MonoTime fault_end = start + options_.fault_phase;
  while (fleet_->Now() < fault_end) {
    GPUFLEET_RETURN_IF_ERROR(fleet_->Advance(kTick));
    ObserveJobs();
    const MonoTime now = fleet_->Now();
    for (auto it = server_restart_at_.begin(); it != server_restart_at_.end();) {
      if (it->second <= now) {
        GPUFLEET_RETURN_IF_ERROR(fleet_->RestartServer(it->first));
        it = server_restart_at_.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = agent_restart_at_.begin(); it != agent_restart_at_.end();) {
      if (it->second <= now) {
        GPUFLEET_RETURN_IF_ERROR(fleet_->RestartAgent(it->first));
        it = agent_restart_at_.erase(it);
      } else {
        ++it;
      }
    }
    while (next_job_ < plan_.size() && plan_[next_job_].submit_at <= now) {
      GPUFLEET_RETURN_IF_ERROR(Submit(plan_[next_job_++]));
    }
    if (random_.UniformDouble() < fault_rate_per_s) {
      GPUFLEET_RETURN_IF_ERROR(InjectFault(now));
    }
  }
  for (; next_job_ < plan_.size(); ++next_job_) {
    GPUFLEET_RETURN_IF_ERROR(Submit(plan_[next_job_]));
  }

  // Liveness: healed, the fleet must finish every job and end every task.
  GPUFLEET_RETURN_IF_ERROR(Heal());
  const MonoTime settle_end = fleet_->Now() + options_.settle_limit;
  std::vector<std::string> violations;
  while (fleet_->Now() < settle_end) {
    GPUFLEET_RETURN_IF_ERROR(fleet_->Advance(kTick));
    ObserveJobs();
    if ((fleet_->Now() - start) % seconds(30) == Duration(0)) {
      std::vector<std::string> unfinished;
      CheckJobs(true, unfinished);
      if (unfinished.empty() && fleet_->LiveTasks() == 0) {
        break;
      }
    }
  }
  fleet_->events().Add("end of run");

  violations = std::move(step_violations_);
  CheckJobs(true, violations);
  const MonoTime now = fleet_->Now();
  std::vector<std::string> physical = CheckExclusiveUse(fleet_->ledger().spans(), now);
  violations.insert(violations.end(), physical.begin(), physical.end());
  const Duration gang_window = fleet_options_.gang_start_timeout + fleet_options_.node_timeout +
                               fleet_options_.stop_grace + 2 * fleet_options_.heartbeat_interval;
  std::vector<std::string> gangs =
      CheckGangsWhole(fleet_->ledger().spans(), gang_size_, gang_window, now);
  violations.insert(violations.end(), gangs.begin(), gangs.end());
  std::vector<std::string> graces =
      CheckGraces(fleet_->ledger().graces(),
                  std::min<Duration>(fleet_options_.agent_stop_grace, fleet_options_.stop_grace));
  violations.insert(violations.end(), graces.begin(), graces.end());
  if (fleet_->LiveTasks() > 0) {
    violations.push_back(
        fmt::format("{} tasks still run after the fleet healed and drained", fleet_->LiveTasks()));
  }
  violations.insert(violations.end(), harness_errors_.begin(), harness_errors_.end());

  SeedOutcome outcome;
  outcome.seed = seed_;
  outcome.violations = std::move(violations);
  outcome.faults = faults_;
  for (const auto& [kind, count] : fleet_->link_counts()) {
    if (kind != "delivered") {
      outcome.faults[kind] += count;
    }
  }
  outcome.jobs = static_cast<int>(acknowledged_.size());
  outcome.task_runs = fleet_->task_runs();
  outcome.digest = Digest(fleet_->events().lines());
  outcome.replay = ReplayCommand(seed_, options_);
  if (options_.keep_events) {
    outcome.events = fleet_->events().Tail(fleet_->events().lines().size());
  } else if (!outcome.violations.empty()) {
    outcome.events = fleet_->events().Tail(80);
  }
  return outcome;
}

}  // namespace

std::string_view PlantedBugName(PlantedBug bug) {
  switch (bug) {
    case PlantedBug::kNone:
      return "none";
    case PlantedBug::kEarlyRelease:
      return "early-release";
    case PlantedBug::kSkippedFence:
      return "skipped-fence";
    case PlantedBug::kLostWrite:
      return "lost-write";
    case PlantedBug::kUnfencedCommits:
      return "unfenced-commits";
    case PlantedBug::kShortFenceGrace:
      return "short-fence-grace";
  }
  return "none";
}

Result<PlantedBug> ParsePlantedBug(std::string_view name) {
  for (const PlantedBug bug :
       {PlantedBug::kNone, PlantedBug::kEarlyRelease, PlantedBug::kSkippedFence,
        PlantedBug::kLostWrite, PlantedBug::kUnfencedCommits, PlantedBug::kShortFenceGrace}) {
    if (PlantedBugName(bug) == name) {
      return bug;
    }
  }
  return InvalidArgumentError(
      fmt::format("planted bug: \"{}\" (valid: none, early-release, skipped-fence, lost-write, "
                  "unfenced-commits, short-fence-grace)",
                  name));
}

Result<SeedOutcome> RunChaosSeed(uint64_t seed, const ChaosOptions& options) {
  ChaosRun run(seed, options);
  return run.Run();
}

Result<ChaosReport> RunChaos(uint64_t first, uint64_t last, const ChaosOptions& options,
                             int threads) {
  if (last < first) {
    return InvalidArgumentError(
        fmt::format("seeds: {}-{} (the last is below the first)", first, last));
  }
  const size_t count = static_cast<size_t>(last - first + 1);
  GPUFLEET_ASSIGN_OR_RETURN(
      std::vector<SeedOutcome> outcomes,
      sim::ParallelMap<SeedOutcome>(
          count, threads, [&](size_t i) { return RunChaosSeed(first + i, options); }, {}));
  ChaosReport report{.first_seed = first, .last_seed = last};
  for (SeedOutcome& outcome : outcomes) {
    for (const auto& [kind, times] : outcome.faults) {
      report.faults[kind] += times;
    }
    report.jobs += outcome.jobs;
    report.task_runs += static_cast<int64_t>(outcome.task_runs);
    report.violations += static_cast<int64_t>(outcome.violations.size());
    if (!outcome.violations.empty()) {
      report.failing.push_back(std::move(outcome));
    }
  }
  return report;
}

std::string ReplayCommand(uint64_t seed, const ChaosOptions& options) {
  std::string command = fmt::format("gpufleet sim chaos --seeds {}-{} --events", seed, seed);
  if (options.planted != PlantedBug::kNone) {
    command += fmt::format(" --plant {}", PlantedBugName(options.planted));
  }
  return command;
}

nlohmann::json ChaosReportJson(const ChaosReport& report) {
  nlohmann::json failing = nlohmann::json::array();
  for (const SeedOutcome& outcome : report.failing) {
    failing.push_back({{"seed", outcome.seed},
                       {"violations", outcome.violations},
                       {"replay", outcome.replay},
                       {"events", outcome.events}});
  }
  return {{"seeds", report.last_seed - report.first_seed + 1},
          {"first_seed", report.first_seed},
          {"violations", report.violations},
          {"faults", report.faults},
          {"jobs", report.jobs},
          {"task_runs", report.task_runs},
          {"failing", failing}};
}

}  // namespace gpufleet::fleetsim
