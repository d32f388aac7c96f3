// SPDX-License-Identifier: Apache-2.0
#include "gpufleet/control/mig_layout_controller.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <variant>

#include <fmt/format.h>

#include "gpufleet/control/job_lifecycle.h"
#include "gpufleet/control/mig_node_docs.h"
#include "gpufleet/control/placement_gpus.h"
#include "gpufleet/control/store_keys.h"
#include "gpufleet/policy/mig_planner.h"
#include "gpufleet/scheduler/devices.h"
#include "gpufleet/store/read_modify_write.h"

namespace gpufleet::control {
namespace {

bool AsksForMig(const Job& job) {
  return std::any_of(job.groups.begin(), job.groups.end(), [](const TaskGroup& group) {
    return std::holds_alternative<MigGpus>(group.request.gpus);
  });
}

// The new layout of `plan.gpu` written into its node document, with an event on the node and on
// each job it serves. False when the node changed under the plan (a GPU gone, an instance to
// destroy no longer there): the next capacity epoch plans again.
Result<bool> WriteMigGpuPlan(store::StateStore& store, const GpuCatalog& catalog,
                             const policy::MigGpuPlan& plan, const std::set<std::string>& jobs) {
  GPUFLEET_ASSIGN_OR_RETURN(const GpuModelInfo* model, catalog.Find(plan.model));
  const std::string node = plan.node.value();
  bool written = false;
  const Status committed = store::CommitWithRetries(
      store, kCasAttempts, fmt::format("node \"{}\" kept changing", node),
      [&]() -> store::AttemptResult {
        GPUFLEET_ASSIGN_OR_RETURN(const store::StoredObject stored, store.Get(kNodesKind, node));
        Json doc = wire::ParseDocument(stored.data);
        if (!doc.contains("gpus") || !doc["gpus"].is_array()) {
          return store::NoWrite();
        }
        Json* gpu = nullptr;
        for (Json& candidate : doc["gpus"]) {
          if (wire::IntOr(candidate, "index", -1) == plan.gpu &&
              wire::BoolOr(candidate, "mig_enabled", false)) {
            gpu = &candidate;
          }
        }
        if (gpu == nullptr) {
          return store::NoWrite();
        }
        // The stored layout, not the planner's: the instances placements created stay theirs.
        Result<std::vector<MigInstance>> layout = policy::ApplyMigGpuPlan(
            *model, MigInstancesFromJson(wire::ArrayOr(*gpu, "mig_instances")), plan);
        if (!layout.ok()) {
          return store::NoWrite();
        }
        (*gpu)["mig_instances"] = MigInstancesToJsonList(*layout);
        const std::string change =
            fmt::format("destroy {}; create {}", wire::DescribeMigInstances(plan.destroy),
                        wire::DescribeMigInstances(plan.create));
        store::WriteBatch batch;
        batch.Update(std::string(kNodesKind), node, doc.dump(), stored.version);
        batch.AppendEvent(std::string(kNodesKind), node,
                          fmt::format("gpu {}: new MIG layout for job {}: {}", plan.gpu,
                                      fmt::join(jobs, ", "), change));
        for (const std::string& job : jobs) {
          batch.AppendEvent(
              std::string(kJobsKind), job,
              fmt::format("MIG layout of {} gpu {} changed for it: {}", node, plan.gpu, change));
        }
        written = true;
        return store::Write(std::move(batch));
      });
  // A node that kept changing is planned again at the next capacity epoch, as a stale plan is.
  if (!committed.ok() && committed.code() != StatusCode::kAborted) {
    return committed;
  }
  return committed.ok() && written;
}

// The MIG devices every GPU of a node document reports, as one comparable text.
std::string ReportedMigDevices(const Json& node_doc) {
  Json devices = Json::array();
  for (const Json& gpu : wire::ArrayOr(node_doc, "gpus")) {
    devices.push_back(wire::ArrayOr(gpu, "mig_devices"));
  }
  return devices.dump();
}

Json* FindGpu(Json& node_doc, int index) {
  if (!node_doc.contains("gpus") || !node_doc["gpus"].is_array()) {
    return nullptr;
  }
  for (Json& gpu : node_doc["gpus"]) {
    if (wire::IntOr(gpu, "index", -1) == index) {
      return &gpu;
    }
  }
  return nullptr;
}

// `instances` less one of each of `taken` (by profile and start).
std::vector<MigInstance> WithoutInstances(std::vector<MigInstance> instances,
                                          const std::vector<MigInstance>& taken) {
  for (const MigInstance& instance : taken) {
    const auto it =
        std::find_if(instances.begin(), instances.end(), [&](const MigInstance& candidate) {
          return candidate.profile == instance.profile && candidate.start == instance.start;
        });
    if (it != instances.end()) {
      instances.erase(it);
    }
  }
  return instances;
}

}  // namespace

Result<bool> MigLayoutController::PlanForPendingJobs(SchedulingView& view) {
  // A held node is planned again once its hold ends or its agent reports other devices.
  for (auto it = holds_.begin(); it != holds_.end();) {
    bool release = options_.clock.Now() >= it->second.until;
    if (!release) {
      const Result<store::StoredObject> stored = options_.store.Get(kNodesKind, it->first);
      release = !stored.ok() ||
                ReportedMigDevices(wire::ParseDocument(stored->data)) != it->second.devices;
    }
    if (release) {
      planned_epoch_ = 0;  // its GPUs are new to the planner
      it = holds_.erase(it);
    } else {
      ++it;
    }
  }
  const uint64_t epoch = view.capacity_epoch();
  // Pending jobs with MIG tasks that did not fit the layouts as they are now.
  std::vector<policy::MigRequest> requests;
  std::map<std::string, std::string> job_of_request;
  std::set<std::string> jobs;
  for (const auto& [name, job] : view.jobs()) {
    // The reason, long for jobs that wait, is searched last.
    if (job.state != JobState::kPending || job.unschedulable_epoch != epoch || !job.spec ||
        !job.spec->ok() || !AsksForMig(**job.spec) ||
        job.reason.find(scheduler::kNoMigSlotReason) == std::string::npos) {
      continue;
    }
    for (policy::MigRequest& request : policy::MigRequestsOf(**job.spec)) {
      // The spec's name is unique within its team only: the request is named by the job's key.
      request.id = fmt::format("{} {}", name, request.id);
      job_of_request[request.id] = name;
      requests.push_back(std::move(request));
      jobs.insert(name);
    }
  }
  // The planner sees the same GPUs and requests until the epoch moves or a job is new to it.
  if (requests.empty() ||
      (epoch == planned_epoch_ &&
       std::includes(planned_jobs_.begin(), planned_jobs_.end(), jobs.begin(), jobs.end()))) {
    return false;
  }
  planned_epoch_ = epoch;
  planned_jobs_ = jobs;
  // Only GPUs whose agent can apply a layout, on Ready nodes, in service.
  std::vector<policy::MigGpu> gpus;
  for (policy::MigGpu& gpu : policy::MigGpusOf(view.snapshot())) {
    const auto node = view.nodes().find(gpu.node.value());
    if (node == view.nodes().end() || !node->second.agent ||
        node->second.node.state != NodeState::kReady || holds_.count(node->first) > 0) {
      continue;
    }
    const auto label = node->second.node.labels.find(std::string(wire::kMigLayoutsLabel));
    const bool in_service = std::any_of(
        node->second.node.gpus.begin(), node->second.node.gpus.end(), [&](const Gpu& g) {
          return g.index == gpu.gpu &&
                 (g.health == GpuHealth::kHealthy || g.health == GpuHealth::kDegraded);
        });
    if (label != node->second.node.labels.end() && label->second == "true" && in_service) {
      gpus.push_back(std::move(gpu));
    }
  }
  if (gpus.empty()) {
    return false;
  }
  const Result<policy::MigPlan> plan = policy::PlanMigLayouts(options_.catalog, gpus, requests);
  if (!plan.ok()) {
    // A request the planner refuses (a model it does not know, say) must not stop the cycle;
    // the job keeps its reason.
    fmt::print(stderr, "gpufleet server: MIG planning: {}\n", plan.status().ToString());
    return false;
  }
  bool wrote = false;
  for (const policy::MigGpuPlan& gpu_plan : plan->gpus) {
    std::set<std::string> served;
    for (const std::string& request : gpu_plan.serves) {
      served.insert(job_of_request[request]);
    }
    GPUFLEET_ASSIGN_OR_RETURN(const bool written,
                              WriteMigGpuPlan(options_.store, options_.catalog, gpu_plan, served));
    wrote = wrote || written;
  }
  return wrote;
}

Result<std::optional<MigRequeue>> MigLayoutController::PlanRequeue(const SchedulingView& view,
                                                                   const std::string& now_text) {
  dropping_.clear();
  const MonoTime now = options_.clock.Now();
  const std::set<std::string>& mig_nodes = view.mig_enabled_nodes();
  if (mig_nodes.empty()) {
    // No MIG-enabled GPU in the fleet (most cycles of most fleets): no job waits for an instance.
    waits_.clear();
    return std::optional<MigRequeue>();
  }
  const auto is_mig_node = [&](const std::string& name) { return mig_nodes.contains(name); };
  // The Scheduled jobs with a task not started on a MIG instance its agent has not reported,
  // by GPU, and what each GPU misses. Node documents are read once, only for such jobs.
  std::map<std::string, store::StoredObject> node_docs;
  std::map<GpuKey, std::set<std::string>> waiting_jobs;
  std::map<GpuKey, std::vector<MigInstance>> missing;
  std::map<std::string, std::set<GpuKey>> gpus_of_job;
  for (const auto& [name, job] : view.jobs()) {
    if (job.state != JobState::kScheduled ||
        std::none_of(job.nodes.begin(), job.nodes.end(), is_mig_node)) {
      continue;
    }
    const Json doc = wire::ParseDocument(job.data);
    for (const Json& placement : wire::ArrayOr(doc, "placements")) {
      const std::string node = wire::StrOr(placement, "node");
      if (!wire::StrOr(placement, "phase").empty() || !is_mig_node(node)) {
        continue;  // a task that started had its instances
      }
      auto stored = node_docs.find(node);
      if (stored == node_docs.end()) {
        Result<store::StoredObject> object = options_.store.Get(kNodesKind, node);
        if (!object.ok()) {
          if (object.status().code() == StatusCode::kNotFound) {
            continue;
          }
          return object.status();
        }
        stored = node_docs.emplace(node, std::move(object).value()).first;
      }
      Json node_doc = wire::ParseDocument(stored->second.data);
      const Json& assignments = wire::ArrayOr(placement, "assignments");
      const std::vector<PlacedGpu> placed = PlacedGpus(placement);
      for (size_t i = 0; i < placed.size(); ++i) {
        const std::string profile = wire::StrOr(assignments[i], "mig_profile");
        if (profile.empty()) {
          continue;
        }
        const int start = static_cast<int>(wire::IntOr(assignments[i], "mig_start", -1));
        const Json* gpu = FindPlacedGpu(wire::ArrayOr(node_doc, "gpus"), placed[i]);
        if (gpu != nullptr && FindMigDevice(*gpu, profile, start) != nullptr) {
          continue;
        }
        // Keyed by the GPU's index now; a GPU gone keeps the one it had.
        const int index =
            static_cast<int>(gpu != nullptr ? wire::IntOr(*gpu, "index", -1) : placed[i].index);
        const GpuKey key{node, index};
        waiting_jobs[key].insert(name);
        missing[key].push_back({profile, start});
        gpus_of_job[name].insert(key);
      }
    }
  }
  // Each GPU's wait starts in the first cycle that sees it and ends when nothing waits there.
  for (auto it = waits_.begin(); it != waits_.end();) {
    it = waiting_jobs.count(it->first) > 0 ? std::next(it) : waits_.erase(it);
  }
  std::set<GpuKey> timed_out;
  for (const auto& [key, jobs] : waiting_jobs) {
    const MonoTime since = waits_.emplace(key, now).first->second;
    if (now - since >= options_.apply_timeout) {
      timed_out.insert(key);
    }
  }
  if (timed_out.empty()) {
    return std::optional<MigRequeue>();
  }
  // The jobs of a timed-out GPU go back to Pending; every GPU such a job waits on loses its
  // unapplied layout, and so the jobs waiting there go too.
  std::set<GpuKey> dropped;
  std::set<std::string> requeued;
  std::vector<GpuKey> to_visit(timed_out.begin(), timed_out.end());
  while (!to_visit.empty()) {
    const GpuKey key = to_visit.back();
    to_visit.pop_back();
    if (!dropped.insert(key).second) {
      continue;
    }
    for (const std::string& job : waiting_jobs[key]) {
      if (requeued.insert(job).second) {
        to_visit.insert(to_visit.end(), gpus_of_job[job].begin(), gpus_of_job[job].end());
      }
    }
  }
  MigRequeue requeue;
  store::WriteBatch& batch = requeue.node_writes;
  // The instances the jobs that stay created: the agent reports them, but they are the
  // placements', not the layout's.
  std::map<std::string, std::map<int, std::vector<MigInstance>>> created;
  for (const auto& [name, job] : view.jobs()) {
    if (requeued.count(name) == 0 && HoldsResources(job.state)) {
      const Result<wire::JobRecord> record =
          wire::JobRecordFromJson(wire::ParseDocumentWithout(job.data, "spec"), nullptr);
      if (!record.ok()) {
        // Never expected: its instances are then taken for the layout's, so none is removed.
        continue;
      }
      for (const std::string& node : job.nodes) {
        if (const auto stored = node_docs.find(node); stored != node_docs.end()) {
          AddCreatedMigInstances(*record, node, wire::ParseDocument(stored->second.data),
                                 created[node]);
        }
      }
    }
  }
  // Why, per GPU, with the agent's error when it gave one.
  std::map<GpuKey, std::string> why;
  for (const GpuKey& key : dropped) {
    Json doc = wire::ParseDocument(node_docs[key.first].data);
    const Json* gpu = FindGpu(doc, key.second);
    const std::string error = gpu == nullptr ? "" : wire::StrOr(*gpu, "mig_error");
    why[key] = fmt::format("MIG instances {} on {} gpu {} not reported by its agent within {}s{}",
                           wire::DescribeMigInstances(missing[key]), key.first, key.second,
                           options_.apply_timeout.count(),
                           error.empty() ? "" : fmt::format(": {}", error));
  }
  for (auto& [node, stored] : node_docs) {
    Json doc = wire::ParseDocument(stored.data);
    bool changed = false;
    for (const GpuKey& key : dropped) {
      Json* gpu = key.first == node ? FindGpu(doc, key.second) : nullptr;
      if (gpu == nullptr) {
        continue;
      }
      const std::vector<MigInstance> layout = WithoutInstances(
          MigInstancesFromJson(wire::ArrayOr(*gpu, "mig_devices")), created[node][key.second]);
      (*gpu)["mig_instances"] = MigInstancesToJsonList(layout);
      batch.AppendEvent(
          std::string(kNodesKind), node,
          fmt::format("{}; layout back to {}, jobs {} requeued, no new layout "
                      "planned here for {}s or until its MIG devices change",
                      why[key], wire::DescribeMigInstances(layout),
                      fmt::join(waiting_jobs[key], ", "), options_.replan_delay.count()));
      changed = true;
    }
    if (changed) {
      batch.Update(std::string(kNodesKind), node, doc.dump(), stored.version);
      stored.data = doc.dump();
    }
  }
  for (const std::string& name : requeued) {
    const ViewJob& job = view.jobs().at(name);
    const Json before = wire::ParseDocument(job.data);
    Json after = before;
    // Every requeued job waits on a dropped GPU (that is how it came to be requeued).
    const auto first = std::find_if(gpus_of_job[name].begin(), gpus_of_job[name].end(),
                                    [&](const GpuKey& key) { return dropped.count(key) > 0; });
    // Its tasks on instances never reported were never sent to the agent: nothing to stop.
    // (AddDesiredTasks sends a task only once each of its own instances is reported.)
    for (Json& placement : after["placements"]) {
      const auto stored = node_docs.find(wire::StrOr(placement, "node"));
      if (!wire::StrOr(placement, "phase").empty() || stored == node_docs.end()) {
        continue;
      }
      Json node_doc = wire::ParseDocument(stored->second.data);
      const Json& assignments = wire::ArrayOr(placement, "assignments");
      const std::vector<PlacedGpu> placed = PlacedGpus(placement);
      bool waits = false;
      for (size_t i = 0; i < placed.size(); ++i) {
        const std::string profile = wire::StrOr(assignments[i], "mig_profile");
        const Json* gpu = FindPlacedGpu(wire::ArrayOr(node_doc, "gpus"), placed[i]);
        waits = waits ||
                (!profile.empty() &&
                 (gpu == nullptr ||
                  FindMigDevice(*gpu, profile,
                                static_cast<int>(wire::IntOr(assignments[i], "mig_start", -1))) ==
                      nullptr));
      }
      if (waits) {
        MarkPlacementGone(placement, "never started: its MIG instances were not reported");
      }
    }
    Result<std::string> event =
        EndRun(after, JobState::kPending, fmt::format("requeued: {}", why[*first]), now_text);
    if (!event.ok()) {
      continue;
    }
    requeue.job_writes.push_back({.name = name,
                                  .version = job.version,
                                  .before = before,
                                  .after = std::move(after),
                                  .events = {std::move(*event)}});
  }
  for (const GpuKey& key : dropped) {
    dropping_[key] = ReportedMigDevices(wire::ParseDocument(node_docs[key.first].data));
  }
  return std::optional<MigRequeue>(std::move(requeue));
}

void MigLayoutController::Requeued() {
  const MonoTime now = options_.clock.Now();
  for (const auto& [key, devices] : dropping_) {
    waits_.erase(key);
    holds_[key.first] = {now + options_.replan_delay, devices};
  }
  dropping_.clear();
}

}  // namespace gpufleet::control
